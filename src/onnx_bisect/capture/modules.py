"""Capture stage: record every module's outputs with forward hooks, in call order."""
from __future__ import annotations

import copy
import weakref
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import torch
from torch.utils._pytree import tree_map_only

from ..records import Activation, Capture, ModelInputs, ModuleKind, module_kind
from ..records.nest import flatten_outputs, to_numpy
from ..records.store import ArrayStore


def capture_activations(model: torch.nn.Module, inputs: ModelInputs, store: ArrayStore | None = None,
                        on_call: Callable[[int, int], None] | None = None) -> Capture:
    """Run ``model`` once in eval mode under ``no_grad`` and record all module outputs.

    Hooks are removed afterwards, whatever happens.  Each recorded value is the
    module's output as it was when the module returned: outputs are kept without
    a copy, and if one was later changed in place (``ReLU(inplace=True)`` after a
    BatchNorm), the forward runs again copying exactly those at return time.  The
    model runs on copies of the inputs, so a forward that modifies its arguments
    in place leaves the caller's tensors (which later become the ONNX feeds) as
    they were.

    With a ``store`` (low-memory runs) each value is copied into the store the
    moment its module returns, and only the store's view of it is kept: no
    activation holds the forward's memory, and one forward is enough.
    ``on_call(calls, modules)`` is told of each module call (for progress).
    """
    if store is not None:
        recorder = _record(model, inputs, copy=None, store=store, on_call=on_call)
        flat = list(flatten_outputs(recorder.output))
        return Capture(activations=tuple(recorder.activations),
                       outputs=tuple(recorder.stored(t) for _, t in flat),
                       output_names=tuple(path for path, _ in flat), aliases=module_aliases(model))
    recorder = _record(model, inputs, copy=frozenset(), on_call=on_call)
    changed = recorder.changed()
    if changed:
        recorder = _record(model, inputs, copy=changed)
        if recorder.changed() - changed:  # the forward took another path: copy everything
            recorder = _record(model, inputs, copy=None)
    flat = list(flatten_outputs(recorder.output))
    return Capture(
        activations=tuple(recorder.activations),
        outputs=tuple(to_numpy(t) for _, t in flat),
        output_names=tuple(path for path, _ in flat),
        aliases=module_aliases(model),
    )


def unique_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Each module once, under the first name it is registered by.  A block shared by several steps (TabNet's
    shared GLU layers, ALBERT's one layer) is one module: each of its calls is recorded once, under that name,
    whichever name the forward reached it through."""
    return list(model.named_modules())


def module_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Every other name by which a module (or a module inside it) is reachable -> its first name."""
    first = {id(m): name for name, m in model.named_modules()}
    return {name: first[id(m)] for name, m in model.named_modules(remove_duplicate=False) if first[id(m)] != name}


def capture_outputs(model: torch.nn.Module, inputs: ModelInputs) -> Capture:
    """Run ``model`` once in eval mode under ``no_grad`` without hooks: its outputs only, no activations
    (enough to tell whether a configuration agrees; :func:`capture_activations` when it does not)."""
    model.eval()
    args, kwargs = _copy_inputs(inputs)
    with torch.no_grad():
        output = model(*args, **kwargs)
    flat = list(flatten_outputs(output))
    return Capture(activations=(), outputs=tuple(to_numpy(t) for _, t in flat),
                   output_names=tuple(path for path, _ in flat))


def capture_float64(model: torch.nn.Module, inputs: ModelInputs) -> Capture | None:
    """Every module's outputs and the model's as a float64 run computes them: a copy of ``model`` in float64 on
    the inputs' float32 tensors in float64 (the model itself is not touched).  The truth PyTorch's float32 and
    ONNX Runtime are both measured against, to tell float32 rounding a model amplifies from a fault.  None when
    the model will not run in float64 (an op without a float64 kernel, code that insists on float32)."""
    return capture_in(model, inputs, torch.float64)


def capture_float16(model: torch.nn.Module, inputs: ModelInputs) -> Capture | None:
    """Every module's outputs as a float16 copy of ``model`` computes them on the inputs rounded to float16: how
    far float16 rounding alone takes this model from its float32 values, the yardstick a float16 ONNX file is
    measured against.  None when the model will not run in float16 on this machine."""
    return capture_in(model, inputs, torch.float16)


def capture_in(model: torch.nn.Module, inputs: ModelInputs, dtype: torch.dtype) -> Capture | None:
    """The capture of a copy of ``model`` whose floating-point parameters, buffers and float32 inputs are in
    ``dtype`` (None when it will not run so)."""
    def converted(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.dtype == torch.float32 else t

    try:
        twin = copy.deepcopy(model).to(dtype).eval()
        wide = ModelInputs(*tree_map_only(torch.Tensor, converted, (tuple(inputs.args), dict(inputs.kwargs))),
                           inputs.names)
        return capture_activations(twin, wide)
    except Exception:  # noqa: BLE001 - without that run, nothing is judged against it
        return None


def _record(model: torch.nn.Module, inputs: ModelInputs, copy: frozenset[int] | None,
            store: ArrayStore | None = None, on_call: Callable[[int, int], None] | None = None) -> "_Recorder":
    """One hooked forward; ``copy`` names the activation indices to copy at return time (None: all), into
    ``store`` when there is one."""
    recorder = _Recorder(model, copy, store)
    recorder.on_call = on_call
    model.eval()
    handles = []
    for name, m in unique_modules(model):
        handles.append(m.register_forward_pre_hook(recorder.pre_hook(name), with_kwargs=True))
        handles.append(m.register_forward_hook(recorder.hook(name, m), with_kwargs=True))
    args, kwargs = _copy_inputs(inputs)
    try:
        with torch.no_grad():
            recorder.output = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return recorder


class _Recorder:
    def __init__(self, model: torch.nn.Module, copy: frozenset[int] | None, store: ArrayStore | None = None):
        self.activations: list[Activation] = []
        self.output = None
        self._copy = copy
        self._store = store
        self.on_call: Callable[[int, int], None] | None = None
        self._live: dict[int, weakref.ref] = {}  # with a store: id -> the tensor recorded under it
        self._versions: dict[int, list[int]] = {}  # with a store: id -> the versions recorded under it
        self._calls: dict[str, int] = defaultdict(int)
        self._total_calls = 0  # sum of _calls, kept as it grows (the progress line reads it on every call)
        self._made_by: dict[int, int] = {}  # id(tensor) -> activation index
        self._values: dict[tuple[int, int], np.ndarray] = {}  # (id, version) -> recorded value
        self._kept: list[tuple[int, torch.Tensor, int]] = []  # (activation index, tensor, version when recorded)
        self._leaf = {name: not any(True for _ in m.children()) for name, m in unique_modules(model)}
        # (id, version) of each running call's inputs, taken before the call: an
        # in-place module (ReLU(inplace=True)) returns its input object with a
        # new version, and must not count as returning its input unchanged.
        self._entered: dict[str, list[set[tuple[int, int]]]] = defaultdict(list)

    def stored(self, tensor: torch.Tensor) -> np.ndarray:
        """``tensor``'s value in the store: the copy its module's record made (the root module returns the
        model's outputs, so they are there already), else a new one."""
        kept = self._values.get((id(tensor), tensor._version))
        return kept if kept is not None else self._store.put(to_numpy(tensor))

    def pre_hook(self, name: str):
        def _pre_hook(mod, args, kwargs):
            self._entered[name].append({(id(t), t._version) for _, t in flatten_outputs((args, kwargs))})
        return _pre_hook

    def hook(self, name: str, module: torch.nn.Module):
        def _hook(mod, args, kwargs, output):
            self.record(name, type(mod).__name__, args, kwargs, output, module_kind(mod), _bias(mod))
        return _hook

    def record(self, name: str, type_name: str, args, kwargs, output, kind: ModuleKind = ModuleKind.OTHER,
               bias: np.ndarray | None = None) -> None:
        call = self._calls[name]
        self._calls[name] += 1
        self._total_calls += 1
        if self.on_call is not None:
            self.on_call(self._total_calls, len(self._leaf))
        in_tensors = [t for _, t in flatten_outputs((args, kwargs))]
        consumed = tuple(sorted({self._made_by[id(t)] for t in in_tensors
                                 if id(t) in self._made_by and self._same_object(t)}))
        stack = self._entered[name]
        in_ids = stack.pop() if stack else set()
        for path, tensor in flatten_outputs(output):
            key = (id(tensor), tensor._version)
            index = len(self.activations)
            if not self._same_object(tensor):
                self._forget(tensor)
            if key not in self._values:
                self._values[key] = self._keep(index, tensor)
            self.activations.append(Activation(
                index=index, module=name, module_type=type_name, call=call, path=path,
                value=self._values[key], is_leaf=self._leaf.get(name, True),
                inputs=consumed, passthrough=key in in_ids, kind=kind, bias=bias,
            ))
            self._made_by[id(tensor)] = index

    def _same_object(self, tensor: torch.Tensor) -> bool:
        """Whether what was recorded under ``id(tensor)`` is this tensor.  Without a store every recorded tensor
        is kept alive, so ids are never reused; with one, a freed tensor's id may come back on a new tensor."""
        if self._store is None:
            return True
        ref = self._live.get(id(tensor))
        return ref is not None and ref() is tensor

    def _forget(self, tensor: torch.Tensor) -> None:
        """Drop what was recorded under a reused id, and remember that it is now ``tensor``'s."""
        for version in self._versions.pop(id(tensor), ()):
            self._values.pop((id(tensor), version), None)
        self._made_by.pop(id(tensor), None)
        self._live[id(tensor)] = weakref.ref(tensor)

    def _keep(self, index: int, tensor: torch.Tensor) -> np.ndarray:
        """The value recorded for ``tensor``: copied into the store, copied, or a view kept with its version."""
        if self._store is not None:
            self._versions.setdefault(id(tensor), []).append(tensor._version)
            return self._store.put(to_numpy(tensor))
        copy = self._copy is None or index in self._copy
        self._kept.append((index, tensor, tensor._version))
        return to_numpy(tensor, copy=copy)

    def changed(self) -> frozenset[int]:
        """Activations kept without a copy whose tensor was modified in place after it was recorded."""
        return frozenset(i for i, t, version in self._kept
                         if t._version != version and not (self._copy is None or i in self._copy))


def _copy_inputs(inputs: ModelInputs) -> tuple[tuple, dict]:
    """Clone every tensor argument, keeping the nesting of tuples, lists and dicts."""
    with torch.no_grad():
        return tree_map_only(torch.Tensor, torch.Tensor.clone, (tuple(inputs.args), dict(inputs.kwargs)))






def unused_outputs(model: torch.nn.Module, inputs: ModelInputs,
                   wanted: frozenset[tuple[str, int, str]]) -> frozenset[tuple[str, int, str]]:
    """Which of the ``wanted`` activations, as ``(module, call, path)``, the model's outputs do not depend on.

    An LSTM returns its final states, a model may discard them, and exporters
    then prune what computes them: such an activation has no ONNX tensor, and
    is no alignment failure.  One forward with autograd recording tells: an
    output is used when the autograd graph of the model's outputs reaches it
    (its ``grad_fn`` and output number are among the edges walked back from
    the outputs).  Values autograd does not track (integer tensors, no
    parameter or float input requiring grad) are never reported unused.
    """
    if not wanted:
        return frozenset()
    seen: dict[tuple[str, int, str], tuple[Any, int]] = {}
    calls: dict[str, int] = defaultdict(int)
    modules = {name for name, _, _ in wanted}

    def hook(name):
        def _hook(mod, args, output):
            call = calls[name]
            calls[name] += 1
            for path, tensor in flatten_outputs(output):
                if (name, call, path) in wanted and tensor.grad_fn is not None:
                    seen[(name, call, path)] = (tensor.grad_fn, tensor.output_nr)
        return _hook

    handles = [m.register_forward_hook(hook(name)) for name, m in unique_modules(model) if name in modules]
    args, kwargs = _copy_inputs(inputs)
    args, kwargs = tree_map_only(torch.Tensor, lambda t: t.requires_grad_(True) if t.is_floating_point() else t,
                                 (args, kwargs))
    try:
        with torch.enable_grad():
            output = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    used: set[tuple[int, int]] = set()
    stack = []
    for _, t in flatten_outputs(output):
        if t.grad_fn is not None:
            used.add((id(t.grad_fn), t.output_nr))
            stack.append(t.grad_fn)
    visited: set[int] = set()
    alive = list(stack)  # each autograd node keeps one Python object while referenced: ids stay unique
    while stack:
        fn = stack.pop()
        if id(fn) in visited:
            continue
        visited.add(id(fn))
        alive.append(fn)
        for nxt, nr in fn.next_functions:
            if nxt is not None:
                used.add((id(nxt), nr))
                stack.append(nxt)
    return frozenset(key for key, (fn, nr) in seen.items() if (id(fn), nr) not in used)


def _bias(mod) -> np.ndarray | None:
    """A Linear's or a Conv's bias parameter (a runtime may add it inside the op after the layer: alignment
    recognises it there), or None."""
    bias = getattr(mod, "bias", None)
    if module_kind(mod) not in (ModuleKind.LINEAR, ModuleKind.CONV) or not isinstance(bias, torch.Tensor) \
            or bias.ndim != 1 or not bias.is_floating_point() or bias.is_meta:
        return None
    return bias.detach().float().cpu().numpy().copy()
