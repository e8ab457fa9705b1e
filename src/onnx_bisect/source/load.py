"""Load stage: the PyTorch model from a Python file and its inputs from disk."""
from __future__ import annotations

import importlib.util
import inspect
import math
import pickle
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import InputError, ModelLoadError
from ..records import LoadedModel, ModelInputs
from ..records.nest import canonical, flatten_outputs, node_children
from .caches import cache_from_arrays, is_cache, register_caches


def load_model(spec: str) -> tuple[LoadedModel, Any]:
    """Load ``model.py`` or ``model.py:NAME``; return the model and the file's module.

    The file may define ``get_model()``, a module-level ``nn.Module`` named
    ``model``, or exactly one ``nn.Module`` subclass constructible without
    arguments.
    """
    path_text, _, name = spec.rpartition(":") if (":" in spec and not Path(spec).exists()) else (spec, "", "")
    path = Path(path_text)
    if not path.is_file():
        raise ModelLoadError(
            f"Model file '{path}' does not exist. Pass a Python file that defines "
            "get_model(), a module-level nn.Module named 'model', or one nn.Module "
            "subclass (optionally as FILE.py:NAME)."
        )
    module = _import_file(path)
    obj, chosen = _pick_model(module, path, name or None)
    if not isinstance(obj, torch.nn.Module):
        raise ModelLoadError(
            f"'{path}:{chosen}' returned {type(obj).__name__}, not a torch.nn.Module. "
            "Make it return the model instance."
        )
    params = forward_params(obj)
    register_caches(obj)  # before any run: a cache argument is then copied, never grown in place, by each run
    loaded = LoadedModel(
        module=obj,
        name=f"{path.name}:{chosen}",
        source=str(path),
        was_training=bool(obj.training),
        forward_params=params,
    )
    return loaded, module


def _import_file(path: Path):
    mod_name = f"_onnx_bisect_user_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"'{path}' cannot be imported as Python. Pass a .py file.")
    module = importlib.util.module_from_spec(spec)
    # Registered like any imported module: torch.export and pickling look classes up
    # through sys.modules by their __module__.
    sys.modules[mod_name] = module
    sys.path.insert(0, str(path.parent.resolve()))
    # Importing would write __pycache__ next to the user's file: never touch their folder.
    saved_flag, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:  # argparse or sys.exit() in script code at module level
        sys.modules.pop(mod_name, None)
        raise ModelLoadError(
            f"Importing '{path}' called sys.exit({exc.code!r}): the file runs script code, such as "
            "argparse, when it is imported. Move that code under `if __name__ == \"__main__\":`, "
            "or build the model in get_model()."
        ) from exc
    except Exception as exc:  # the user's code may raise anything
        sys.modules.pop(mod_name, None)
        raise ModelLoadError(
            f"Importing '{path}' failed: {type(exc).__name__}: {exc}. "
            "Fix the error in the model file (run it with python to see the traceback), "
            "or use --debug."
        ) from exc
    finally:
        sys.dont_write_bytecode = saved_flag
        sys.path.remove(str(path.parent.resolve()))
    return module


def _pick_model(module, path: Path, name: str | None) -> tuple[Any, str]:
    if name:
        if not hasattr(module, name):
            choices = ", ".join(_candidates(module)) or "none"
            raise ModelLoadError(
                f"'{path}' has no attribute '{name}'. Candidates found in the file: {choices}."
            )
        return _instantiate(getattr(module, name), path, name), name
    if callable(getattr(module, "get_model", None)):
        return _instantiate(module.get_model, path, "get_model"), "get_model"
    if isinstance(getattr(module, "model", None), torch.nn.Module):
        return module.model, "model"
    classes = [
        obj for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module)
        and obj.__module__ == module.__name__
    ]
    instances = [n for n, o in vars(module).items() if isinstance(o, torch.nn.Module)]
    if len(classes) == 1:
        return _instantiate(classes[0], path, classes[0].__name__), classes[0].__name__
    if not classes:
        found = f" (it has module instances: {', '.join(instances)})" if instances else ""
        raise ModelLoadError(
            f"'{path}' defines no model{found}. Add get_model() returning an nn.Module, "
            "or a module-level nn.Module named 'model', or pick one with FILE.py:NAME."
        )
    raise ModelLoadError(
        f"'{path}' defines several nn.Module classes ({', '.join(c.__name__ for c in classes)}) "
        f"and no get_model(). Pick one explicitly, e.g. '{path}:{classes[-1].__name__}'."
    )


def _candidates(module) -> list[str]:
    return sorted(
        n for n, o in vars(module).items()
        if isinstance(o, torch.nn.Module)
        or (inspect.isclass(o) and issubclass(o, torch.nn.Module) and o.__module__ == module.__name__)
        or n in ("get_model", "get_inputs")
    )


def _instantiate(obj, path: Path, name: str):
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise ModelLoadError(f"'{path}:{name}' is a {type(obj).__name__}, not a model or factory.")
    try:
        return obj()
    except (Exception, SystemExit) as exc:
        advice = (
            "The model must be constructible without arguments; wrap it in get_model()."
            if inspect.isclass(obj) else
            f"Fix {name}() (call it in Python to see the traceback), or use --debug."
        )
        raise ModelLoadError(f"Calling '{path}:{name}()' failed: {type(exc).__name__}: {exc}. {advice}") from exc


def forward_params(model, required: bool = False) -> tuple[str, ...]:
    """The names of ``model.forward``'s parameters that can take a tensor (``required``: the positional ones
    without a default)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return ()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) + (
        () if required else (inspect.Parameter.KEYWORD_ONLY,))
    return tuple(p.name for p in sig.parameters.values()
                 if p.kind in kinds and (not required or p.default is p.empty))


def load_inputs(paths: Sequence[str], loaded: LoadedModel, file_module=None) -> ModelInputs:
    """Read ``--input`` files (.npy, .npz, .pt), or call the file's ``get_inputs()``."""
    if not paths:
        getter = getattr(file_module, "get_inputs", None)
        if not callable(getter):
            raise InputError(
                f"No --input given and '{loaded.source}' has no get_inputs(). Pass one "
                "--input FILE (.npy/.npz/.pt) per forward argument, in order"
                + (f" ({', '.join(loaded.forward_params)})." if loaded.forward_params else ".")
            )
        try:
            value = getter()
        except Exception as exc:
            raise InputError(f"get_inputs() in '{loaded.source}' failed: {type(exc).__name__}: {exc}.") from exc
        return to_model_inputs(value, loaded)
    args, kwargs = read_inputs(paths, loaded)
    return _check_arity(args, kwargs, loaded)


def read_inputs(paths: Sequence[str | Path], loaded: LoadedModel) -> tuple[list[Any], dict[str, Any]]:
    """``(positional, keyword)`` tensors from ``--input`` files: a tensor or tuple adds positionals, a dict
    (an ``.npz``, a ``.pt`` of a dict) keywords."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in paths:
        value = _read_file(Path(p), loaded)
        if isinstance(value, dict):
            kwargs.update(value)
        elif isinstance(value, tuple):
            args.extend(value)
        else:
            args.append(value)
    return args, kwargs


def to_model_inputs(value: Any, loaded: LoadedModel) -> ModelInputs:
    """Normalise a tensor, array, tuple/list or dict into forward arguments."""
    if isinstance(value, ModelInputs):
        return value
    if isinstance(value, dict):
        return _check_arity([], {k: as_nest(v, k) for k, v in value.items()}, loaded)
    if isinstance(value, (tuple, list)):
        return _check_arity([as_nest(v, str(i)) for i, v in enumerate(value)], {}, loaded)
    return _check_arity([as_nest(value, "input")], {}, loaded)


def read_input(path: str | Path, loaded: LoadedModel):
    """One input file as a tensor, a tuple of tensors (positional) or a dict (by parameter name)."""
    return _read_file(Path(path), loaded)


def _read_file(path: Path, loaded: LoadedModel):
    if not path.is_file():
        raise InputError(f"Input file '{path}' does not exist. Check the --input path.")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            return _as_tensor(read_npy(path), str(path))
        if suffix == ".npz":
            return _match_npz(read_npz(path), path, loaded)
        if suffix == ".pt":
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(obj, dict):
                return {k: as_nest(v, f"{path}[{k}]") for k, v in obj.items()}
            if isinstance(obj, (tuple, list)):
                return tuple(as_nest(v, f"{path}[{i}]") for i, v in enumerate(obj))
            return as_nest(obj, str(path))
    except InputError:
        raise
    except pickle.UnpicklingError as exc:
        raise InputError(
            f"Input file '{path}' holds Python objects other than tensors, which onnx-bisect does not unpickle "
            "(torch.load with weights_only=True: a .pt file can run code). Save plain tensors, a tuple or a dict "
            "of them with torch.save, or arrays with numpy.save."
        ) from exc
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise InputError(
            f"Could not read input file '{path}': {type(exc).__name__}: {first}. "
            "Save arrays with numpy.save / numpy.savez or tensors with torch.save."
        ) from exc
    raise InputError(f"Input file '{path}' has an unsupported extension; use .npy, .npz or .pt.")


def read_npy(path: Path) -> np.ndarray:
    """An .npy array; its header's shape is checked against the file's size before anything is allocated (a
    memory map reads the header and fails on a file shorter than it claims)."""
    mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    return np.array(mapped)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz, each member's header checked against its size before it is read."""
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            _refuse_bomb(path, info)
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, _, dtype = header(member)
                need = math.prod(shape) * dtype.itemsize
                if need > info.file_size - member.tell():
                    raise InputError(f"'{path}' member '{info.filename}' declares shape {list(shape)} of {dtype} "
                                     f"({need} bytes) but holds {info.file_size - member.tell()} bytes. The file is "
                                     "truncated or corrupt: save it again with numpy.savez.")
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


#: an .npz member larger than this, compressed more than RATIO times, is refused as a decompression bomb
BOMB_BYTES = 1 << 30
BOMB_RATIO = 50


def _refuse_bomb(path: Path, info: zipfile.ZipInfo) -> None:
    if info.file_size > BOMB_BYTES and info.file_size > BOMB_RATIO * max(info.compress_size, 1):
        raise InputError(f"'{path}' member '{info.filename}' decompresses {info.compress_size} bytes into "
                         f"{info.file_size}: onnx-bisect refuses archives that expand more than {BOMB_RATIO} times "
                         f"beyond {BOMB_BYTES >> 30} GiB. Save the inputs with numpy.savez (uncompressed).")


def _match_npz(arrays: dict, path: Path, loaded: LoadedModel) -> dict:
    """Arrays named after forward parameters; names that continue a parameter's name with a path (the ONNX
    input names of a nested argument: ``past_key_values.0.key``, ``images.1``) become that argument's nest."""
    params = loaded.forward_params
    direct = {k: v for k, v in arrays.items() if not params or k in params}
    nests: dict[str, dict] = {}
    unknown = []
    for k, v in arrays.items():
        if k in direct:
            continue
        parts = canonical(k)
        if len(parts) > 1 and parts[0] in params and parts[0] not in direct:
            _insert(nests.setdefault(parts[0], {}), parts[1:], v, f"'{path}' member '{k}'")
        else:
            unknown.append(k)
    if unknown:
        raise InputError(
            f"'{path}' holds arrays {sorted(arrays)} but the forward parameters are "
            f"{list(params)}; {unknown} match none. Name the arrays after the parameters "
            f"(numpy.savez(path, {', '.join(f'{n}=...' for n in params)})), or after the ONNX inputs a nested "
            "argument became (past_key_values.0.key, ...)."
        )
    out = {k: _as_tensor(v, f"{path}[{k}]") for k, v in direct.items()}
    for name, tree in nests.items():
        out[name] = _from_tree(name, tree, loaded, f"'{path}'")
    return out


def _insert(tree: dict, parts: tuple[str, ...], value, where: str) -> None:
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
        if not isinstance(tree, dict):
            raise InputError(f"{where} nests inside an array given under a shorter name; name each array once.")
    if parts[-1] in tree:
        raise InputError(f"{where} is given twice (under two spellings of one ONNX input name).")
    tree[parts[-1]] = value


def _from_tree(name: str, tree: dict, loaded: LoadedModel, where: str):
    """A nested argument from arrays keyed by path: ``past_key_values`` becomes the model's cache, numbered
    keys a list, named keys a dict."""
    if name == "past_key_values":
        return cache_from_arrays(loaded.module, _map_tree(tree, _as_tensor, f"{where} past_key_values"), where)
    return _map_tree(tree, _as_tensor, f"{where} {name}", lists=True)


def _map_tree(tree, fn, where: str, lists: bool = False):
    if not isinstance(tree, dict):
        return fn(tree, where)
    mapped = {k: _map_tree(v, fn, f"{where}.{k}", lists) for k, v in tree.items()}
    if lists and all(k.isdigit() for k in mapped) and sorted(map(int, mapped)) == list(range(len(mapped))):
        return [mapped[str(i)] for i in range(len(mapped))]
    return mapped


def as_nest(value, where: str):
    """An argument as the forward takes it: a tensor (from an array or a number), or a list, tuple or dict of
    them at any depth (``None`` kept), or a key/value cache; anything else is refused in one line."""
    if isinstance(value, (list, tuple)):
        items = [as_nest(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: as_nest(v, f"{where}[{k}]") for k, v in value.items()}
    if value is None:
        return None
    if is_cache(value) or node_children(value) is not None:
        for path, tensor in flatten_outputs(value):
            _as_tensor(tensor, f"{where}{path}")
        return value
    return _as_tensor(value, where)


def _as_tensor(value, where: str):
    if isinstance(value, torch.Tensor):
        if value.is_quantized or value.layout != torch.strided or value.is_meta:
            kind = "quantized" if value.is_quantized else "meta" if value.is_meta else str(value.layout)
            raise InputError(f"Input {where} is a {kind} tensor; onnx-bisect feeds dense tensors. Save the dense "
                             "values (tensor.dequantize() / tensor.to_dense()).")
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise InputError(f"Input {where} holds Python objects; save a numeric array.")
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (int, float, bool)):
        return torch.tensor(value)
    raise InputError(f"Input {where} is a {type(value).__name__}; expected a tensor, an array, or a list, tuple or "
                     "dict of them (a key/value cache included).")


def _check_arity(args: list, kwargs: dict, loaded: LoadedModel) -> ModelInputs:
    params = loaded.forward_params
    required = forward_params(loaded.module, required=True)
    if params and len(args) > len(params):
        raise InputError(
            f"{len(args)} inputs given but forward() takes {len(params)} "
            f"({', '.join(params)}). Pass one --input per forward argument, in order."
        )
    names = tuple(params[: len(args)]) if params else tuple(f"input_{i}" for i in range(len(args)))
    clash = [n for n in names if n in kwargs]
    if clash:
        raise InputError(f"Forward argument(s) {clash} were given twice (positionally and by name).")
    missing = [p for p in required if p not in names and p not in kwargs]
    if missing:
        raise InputError(
            f"forward() needs {', '.join(required)} but no value was given for "
            f"{', '.join(missing)}. Add --input files for them, in order."
        )
    return ModelInputs(args=tuple(args), kwargs=dict(kwargs), names=names)
