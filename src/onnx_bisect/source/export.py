"""Export stage: the one module that calls the exporters — dynamo (``torch.export`` + translation) and
TorchScript — for the main job and for the coverage triage."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
import re
import sys
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import torch
from torch.utils._pytree import tree_map_only

from ..errors import ExportError
from ..records import Exporter, ExportedModel, LoadedModel, ModelInputs
from .caches import register_caches
from .export_progress import OPTIMIZING, WRITING, OnProgress, counting_module_calls, counting_translation, phase
from .onnx_file import opset_of
from .weights import split_weights_from_file

#: the opset of a TorchScript export when none is asked for
DEFAULT_TORCHSCRIPT_OPSET = 17


def export_model(
    loaded: LoadedModel, inputs: ModelInputs, exporter: Exporter | None = None, opset: int | None = None,
    dynamic_axes: dict[str, dict[int, str]] | None = None, folder: str | os.PathLike | None = None,
    on_progress: OnProgress | None = None,
) -> ExportedModel:
    """Export with the dynamo exporter, falling back to TorchScript when it fails.

    ``exporter`` forces one path (no fallback).  The model is exported in eval mode.
    ``dynamic_axes`` (``{input name: {axis: dimension name}}``) leaves those
    dimensions free: dynamic shapes for the dynamo exporter, ``dynamic_axes``
    for the TorchScript one.  Export from example sizes of at least 2 there
    (``torch.export`` specializes sizes 0 and 1).  When every exporter fails,
    the :class:`ExportError` carries ``failures``: ``[(Exporter, exception)]``.

    With ``folder`` (a private folder the caller removes), the model is written
    there, its weights as external data (:data:`EXPORT_NAME` and its ``.data``
    file), and comes back as a skeleton with its weights memory-mapped: no
    ModelProto ever holds them, so exporting costs no second copy of the weights.

    ``on_progress(phase, done, total)`` hears what the export is doing (:mod:`.export_progress`).
    """
    model = loaded.module
    model.eval()
    registered = register_caches(model)
    # The TorchScript tracer runs the model on the inputs it is given; a forward
    # that modifies its arguments in place would change the tensors that later
    # become the ONNX feeds.
    inputs = ModelInputs(*cloned(inputs), inputs.names)
    order = [exporter] if exporter else [Exporter.DYNAMO, Exporter.TORCHSCRIPT]
    failures: list[tuple[Exporter, BaseException]] = []
    for which in order:
        try:
            written = _export_with(which, model, inputs, opset, dynamic_axes, folder, on_progress)
        except Exception as exc:  # exporters raise a zoo of types
            failures.append((which, exc))
            continue
        notes = tuple(
            f"The {w.value} exporter failed ({summarise(e)}); fell back to the {which.value} exporter."
            for w, e in failures
        ) + cache_notes(written.program, registered)
        return dataclasses.replace(written, exporter=which, notes=notes)
    raise ExportError(failure_message(failures), failures) from failures[-1][1]


#: the name of onnx-bisect's own export in its private folder (its weights in ``model.onnx.data``)
EXPORT_NAME = "model.onnx"


def _export_with(which: Exporter, model, inputs: ModelInputs, opset, dynamic_axes, folder,
                 on_progress: OnProgress | None = None) -> ExportedModel:
    """One exporter's model: in memory, or written to ``folder`` and read back with its weights mapped."""
    path = None if folder is None else os.path.join(folder, EXPORT_NAME)
    if path is not None and os.path.exists(path):
        raise ExportError(f"'{path}' exists already: onnx-bisect writes one export per private folder.")
    if which is Exporter.DYNAMO:
        model_ir, program = export_dynamo(model, inputs, opset, dynamic_axes, on_progress)
        if path is None:
            proto = ir.serde.serialize_model(model_ir)
            return ExportedModel(proto=proto, exporter=which, opset=opset_of(proto), program=program)
        phase(on_progress, WRITING)
        ir.save(model_ir, path, external_data=EXPORT_NAME + ".data", **_aligned())
        let_go(model_ir)
    else:
        program = None
        proto = export_torchscript(model, inputs, opset, dynamic_axes, path=path, on_progress=on_progress)
        if path is None:
            return ExportedModel(proto=proto, exporter=which, opset=opset_of(proto))
    skeleton, store = split_weights_from_file(path)
    return ExportedModel(proto=skeleton, exporter=which, opset=opset_of(skeleton), program=program, weights=store,
                         file=path)


def let_go(model_ir) -> None:
    """Drop the IR model's references to its weights (the module's own tensors, lazily transposed copies):
    the exporter's rewrite rules are module-level objects that keep the last graph they matched, so the
    graph may outlive this export, and with it every parameter of the module."""
    for value in list(model_ir.graph.initializers.values()) + model_ir.meta.pop(INITIAL_VALUES, []):
        value.const_value = None
    model_ir.graph.initializers.clear()


#: offsets of large tensors in the export's data file are aligned to this, so that ONNX Runtime maps them
#: from the file instead of reading them into memory
ALIGNMENT = 65536


def cache_notes(program, registered: str | None) -> tuple[str, ...]:
    """Say how a key/value cache in the model's outputs or inputs was exported."""
    if program is None or registered is None:
        return ()
    spec = program.call_spec
    sides = {side: sorted({t.__name__ for t in _spec_types(tree) if t.__name__.endswith("Cache")})
             for side, tree in (("returns", spec.out_spec), ("takes", spec.in_spec))}
    said = [f"{side} a key/value cache ({' and '.join(names)})" for side, names in sides.items() if names]
    if not said:
        return ()
    two_part = any("EncoderDecoder" in n for names in sides.values() for n in names)
    return (f"The model {' and '.join(said)} (use_cache=True). It was exported with its cache, as decoders ship "
            f"(optimum, onnxruntime-genai): transformers' cache classes registered as pytree nodes for torch.export "
            f"({registered}), so the cache's key/value tensors are graph "
            + ("inputs (past key/values) and " if sides["takes"] else "") + "outputs (present key/values), layer "
            "by layer, key before value"
            + (" (the self-attention layers, then the cross-attention layers)" if two_part else "") + ".",)


def _spec_types(spec) -> list[type]:
    """Every container type in a pytree spec."""
    found, stack = [], [spec]
    while stack:
        s = stack.pop()
        if getattr(s, "type", None) is not None:
            found.append(s.type)
        stack.extend(getattr(s, "children_specs", ()) or ())
    return found


def export_dynamo(model, inputs: ModelInputs, opset: int | None = None, dynamic_axes=None,
                  on_progress: OnProgress | None = None):
    """``(ONNX IR model, torch.export ExportedProgram)`` from the dynamo exporter, optimized as
    ``torch.onnx.export`` optimizes it — except that the transposes of large weights it folds are left to be
    computed one at a time when the model is written (:func:`defer_transposes`): the folded copies of every
    Linear weight are never all in memory beside the module's own."""
    shapes = None
    if dynamic_axes:
        # keyed by forward parameter name, as torch.export matches them to the signature;
        # every argument given needs an entry (None: static)
        given = list(inputs.names) + list(inputs.kwargs)
        shapes = {name: ({axis: torch.export.Dim.DYNAMIC for axis in dynamic_axes[name]} if name in dynamic_axes
                         else None) for name in given}
    with quiet(), counting_module_calls(model, on_progress), counting_translation(on_progress):
        program = torch.onnx.export(
            model, positional(inputs.args, inputs.kwargs), kwargs=dict(inputs.kwargs) or None, dynamo=True,
            opset_version=opset, verbose=False, report=False, dynamic_shapes=shapes, optimize=False,
        )
    with quiet():
        # every initializer, also those the optimizer replaces: see let_go
        program.model.meta[INITIAL_VALUES] = list(program.model.graph.initializers.values())
        defer_transposes(program.model.graph)
        phase(on_progress, OPTIMIZING)
        program.optimize()
    return program.model, program.exported_program


def _aligned() -> dict:
    """``ir.save``'s alignment of large tensors in the data file (memory-mapped reads), where the installed
    onnx-ir has it (1.1 and later; 1.0 takes no ``alignment`` and the export failed over to TorchScript)."""
    import inspect

    return {"alignment": ALIGNMENT} if "alignment" in inspect.signature(ir.save).parameters else {}


#: where the IR model keeps the initializers the exporter made (see :func:`let_go`)
INITIAL_VALUES = "onnx_bisect.initial_values"


#: the exporter's optimizer folds a Transpose of an initializer of more elements than this whatever its size
LARGE_FOLD = 8192
#: where the optimizer records what a folded initializer was computed from
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"


def defer_transposes(graph) -> int:
    """Replace each ``Transpose`` of a large initializer used by that node only (the ONNX form of every
    Linear weight) by an initializer computed when it is read: what the exporter's optimizer folds it into
    (same name, same values, same record of what it was folded from), without computing it now.  Returns how
    many were deferred."""
    deferred = 0
    for node in list(graph):
        source = node.inputs[0] if node.op_type == "Transpose" and node.domain == "" and node.inputs else None
        if source is None or not source.is_initializer() or source.const_value is None \
                or source.const_value.size <= LARGE_FOLD or len(source.uses()) != 1 or source.is_graph_output():
            continue
        perm = node.attributes.get_ints("perm", None) or list(range(len(source.shape)))[::-1]
        out = node.outputs[0]
        tensor = source.const_value
        lazy = ir.LazyTensor(functools.partial(_transposed, tensor, tuple(perm), out.name), dtype=tensor.dtype,
                             shape=ir.Shape([tensor.shape[p] for p in perm]), name=out.name)
        value = ir.Value(name=out.name, type=ir.TensorType(tensor.dtype), shape=lazy.shape, const_value=lazy)
        folded_from = set(source.meta.get(FOLDED_FROM, set())) | {source.name}
        value.meta[FOLDED_FROM] = folded_from
        value.metadata_props[FOLDED_FROM] = repr(sorted(folded_from))
        ir.convenience.replace_nodes_and_values(graph, node, [node], [], node.outputs, [value])
        graph.register_initializer(value)
        graph.initializers.pop(source.name)
        source.const_value = None  # the lazy tensor holds it
        deferred += 1
    return deferred


def _transposed(tensor, perm: tuple[int, ...], name: str):
    return ir.Tensor(np.ascontiguousarray(tensor.numpy().transpose(perm)), name=name)


def positional(args, kwargs) -> tuple:
    """Positional arguments as ``torch.onnx.export`` reads them: it takes a trailing dict for the keyword
    arguments when none are given apart, so a dict argument in last position is followed by an empty one."""
    args = tuple(args)
    return args + ({},) if args and isinstance(args[-1], dict) and not kwargs else args


def capture_program(model, inputs: ModelInputs):
    """``(ExportedProgram or None, first exception)``: ``torch.export`` as the dynamo exporter tries it,
    non-strict first, then strict."""
    args, kwargs = cloned(inputs)
    first = None
    for strict in (False, True):
        try:
            with quiet():
                return torch.export.export(model, tuple(args), kwargs=kwargs or None, strict=strict), None
        except Exception as exc:  # capture failures come in many types
            first = first or exc
    return None, first


def translate_program(program) -> onnx.ModelProto:
    """The ONNX model the dynamo exporter translates an ExportedProgram into (its default opset)."""
    with quiet():
        return torch.onnx.export(program, (), dynamo=True, report=False, verbose=False).model_proto


class KeywordAdapter(torch.nn.Module):
    """Calls the wrapped model with keyword arguments.

    The TorchScript tracer passes positional arguments only, which some models
    (transformers' decorated forwards) reject; exporting through this adapter
    prefixes every scope name with ``model/``, which alignment tolerates.
    """

    def __init__(self, model, names):
        super().__init__()
        self.model = model
        self._names = tuple(names)

    def forward(self, *args):
        return self.model(**dict(zip(self._names, args)))


def export_torchscript(model, inputs: ModelInputs, opset: int | None = None, dynamic_axes=None,
                       silence_warnings: bool = True, path: str | None = None,
                       on_progress: OnProgress | None = None) -> onnx.ModelProto | None:
    """The TorchScript exporter's ONNX model (through :class:`KeywordAdapter` when the forward refuses
    positional arguments).  ``silence_warnings=False`` lets the tracer's warnings reach the caller.  With
    ``path`` the model is written there instead (external data beside it when it needs some)."""
    args, kwargs = cloned(inputs)
    args = positional(args, kwargs) + ((kwargs,) if kwargs else ())
    naming = {}
    if dynamic_axes:
        if inputs.kwargs or not all(isinstance(a, torch.Tensor) for a in inputs.args):
            raise ExportError("The TorchScript exporter can mark dynamic axes only for plain positional tensor "
                              "inputs; pass the inputs positionally or use the dynamo exporter.")
        # graph inputs named after the forward parameters, so dynamic_axes can name them
        naming = {"input_names": list(inputs.names), "dynamic_axes": {n: dict(a) for n, a in dynamic_axes.items()}}
    with counting_module_calls(model, on_progress):
        try:
            return _trace(model, args, opset, silence_warnings, path, **naming)
        except TypeError:
            if kwargs:
                raise
            return _trace(KeywordAdapter(model, inputs.names), args, opset, silence_warnings, path, **naming)


def _trace(model, args, opset, silence_warnings: bool, path: str | None = None, **naming) -> onnx.ModelProto | None:
    target = io.BytesIO() if path is None else path
    with quiet(silence_warnings):
        torch.onnx.export(model, args, target, dynamo=False, opset_version=opset or DEFAULT_TORCHSCRIPT_OPSET,
                          **naming)
    return onnx.load_from_string(target.getvalue()) if path is None else None


def trace_graph(model, inputs: ModelInputs):
    """The inlined TorchScript trace (to find where an operator came from); None when tracing fails."""
    try:
        args, kwargs = cloned(inputs)
        with quiet():
            graph, _ = torch.jit._get_trace_graph(model, tuple(args), kwargs or None)
        return graph
    except Exception:  # noqa: BLE001 - the trace only explains; without it the message stands alone
        return None


def cloned(inputs: ModelInputs) -> tuple[tuple, dict]:
    """Copies of the positional and keyword arguments (nested tuples, lists and dicts kept)."""
    args, kwargs = tree_map_only(torch.Tensor, torch.Tensor.clone, (tuple(inputs.args), dict(inputs.kwargs)))
    return tuple(args), kwargs


@contextlib.contextmanager
def importable(module):
    """Make ``module`` importable by its name for the duration (Dynamo looks modules up in sys.modules)."""
    name = getattr(module, "__name__", None)
    if not name or name in sys.modules:
        yield
        return
    sys.modules[name] = module
    try:
        yield
    finally:
        sys.modules.pop(name, None)


_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def quiet(silence_warnings: bool = True):
    """Silence the exporters' prints, logs, native stderr (and Python warnings, unless the caller records
    them); errors still raise."""
    loggers = [logging.getLogger(n) for n in _LOGGERS]
    levels = [lg.level for lg in loggers]
    with contextlib.ExitStack() as stack:
        if silence_warnings:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        stack.enter_context(_native_stderr_silenced())
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


@contextlib.contextmanager
def _native_stderr_silenced():
    """Point file descriptor 2 at /dev/null for the duration.

    torch 2.x's TorchScript exporter leaves its C++ ONNX log switched on
    (``setup_onnx_logging`` tests the function ``_jit_is_onnx_log_enabled``
    instead of calling it) and, when an operator fails to convert, dumps the
    whole TorchScript graph to the buffered C++ ``std::cout``, which reaches our
    stdout at exit.  Route that log to the unbuffered C++ stderr and silence it
    here; Python-level redirection cannot catch either stream.
    """
    route_log = getattr(torch._C, "_jit_set_onnx_log_output_stream", None)
    if route_log is not None:
        route_log("stderr")
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (some embedded interpreters)
        yield
        return
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OPERATOR = re.compile(r"(aten::\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?|torch\.ops\.[\w.]+)")


def summarise(exc: BaseException) -> str:
    """One line: the innermost cause (the exporters wrap it in generic "next steps" text) and the operator."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    root = chain[-1]
    text = _ANSI.sub("", str(root)).strip() or type(root).__name__
    first = text.splitlines()[0][:300]
    op = _OPERATOR.search(" ".join(_ANSI.sub("", str(e)) for e in chain))
    return f"{type(root).__name__}: {first}" + (f" [operator {op.group(1)}]" if op and op.group(1) not in first else "")


def failure_message(failures) -> str:
    """What failed in each exporter and the next steps."""
    parts = "; ".join(f"{w.value}: {summarise(e)}" for w, e in failures)
    if any("Cache" in str(e) and "pytree" in str(e) for _, e in failures):
        return (f"Exporting the model to ONNX failed ({parts}). The model returns or takes a key/value cache that "
                "torch.export cannot flatten: build it with use_cache=False (config.use_cache = False) to export "
                "without the cache, or register the cache class with torch.utils._pytree.register_pytree_node "
                "(transformers 5 does this for its own caches).")
    return (
        f"Exporting the model to ONNX failed ({parts}). Rewrite the failing operator with "
        "exportable PyTorch ops, register a custom symbolic/translation for it, or export "
        "the model yourself and pass the file with --onnx."
    )
