"""Op-level capture for any model: every ATen op's tensor output during a PyTorch forward, with its module.

A ``TorchDispatchMode`` sees each ATen op as PyTorch runs it (after autograd
and after the composite decompositions, so ``nn.Linear`` shows as ``aten.t`` +
``aten.addmm``); forward hooks keep the stack of modules running at the time, so
each op belongs to its innermost module.  No export is involved: it works
whatever file is being debugged and whichever exporter made it.

Memory stays bounded: only the ops run inside one chosen module call are kept
(the call whose segment diverges), in a second, targeted forward.
"""
from __future__ import annotations

import contextlib
import weakref

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from ..records import Activation, ModelInputs
from ..records.nest import to_numpy
from .modules import unique_modules

#: ops whose outputs are not values of the computation (allocation, bookkeeping)
SKIPPED = frozenset({"aten.empty", "aten.empty_like", "aten.zeros", "aten.ones", "aten.full", "aten.scalar_tensor",
                     "aten.set_", "aten.new_empty", "aten.new_zeros", "aten.new_ones", "aten.arange", "aten.sym_size",
                     "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset", "aten.is_same_size",
                     "aten._local_scalar_dense"})
#: ops that hand on their input's value (a copy, a cast): the data flow goes through them, nothing is recorded
PASSTHROUGH = frozenset({"aten.detach", "aten.alias", "aten.lift_fresh", "aten.clone", "aten._to_copy",
                         "aten.contiguous", "aten.copy_"})


@dataclass(frozen=True)
class OpCall:
    """One ATen op as PyTorch ran it inside the watched module call."""

    op: str  # e.g. "aten._softmax"
    overload: str  # e.g. "default"
    module: str  # the innermost module running at the time
    args: tuple[tuple[str, Any], ...]  # the non-tensor arguments, by position or name (dims, scalars, shapes)
    params: tuple[str, ...] = ()  # the model's parameters (or views of them: a transposed weight) it read


class _ModuleStack:
    """The qualified names of the modules running now, kept by forward hooks; each module's call count; and a
    recording window that opens when one module call returns and closes when another returns."""

    def __init__(self, model: torch.nn.Module, start: tuple[str, int] | None, end: tuple[str, int]):
        self.names: list[str] = []
        self.calls: dict[str, int] = defaultdict(int)
        self._running: list[int] = []
        self.start, self.end = start, end
        self.open = start is None
        self.done = False
        self._handles = []
        for name, m in unique_modules(model):
            self._handles.append(m.register_forward_pre_hook(self._enter(name)))
            self._handles.append(m.register_forward_hook(self._leave(name)))

    def _enter(self, name: str):
        def hook(mod, args):
            self.names.append(name)
            self._running.append(self.calls[name])
            self.calls[name] += 1
        return hook

    def _leave(self, name: str):
        def hook(mod, args, output):
            if not self.names or self.names[-1] != name:
                return
            self.names.pop()
            call = self._running.pop()
            if (name, call) == self.start:
                self.open = True
            if (name, call) == self.end:
                self.open, self.done = False, True
        return hook

    @property
    def recording(self) -> bool:
        """Whether the window is open."""
        return self.open and not self.done

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


class _Recorder(TorchDispatchMode):
    """Keeps the floating-point outputs of the ops run while the window is open."""

    def __init__(self, stack: _ModuleStack, budget: int, params: dict[int, str] | None = None):
        super().__init__()
        self.stack = stack
        self.params = params or {}  # storage address -> parameter name
        self.budget = budget  # bytes of op outputs it may keep
        self.kept: list[tuple[OpCall, np.ndarray, tuple[int, ...]]] = []
        self.made_by: dict[int, int] = {}  # id(tensor) -> index in kept
        # id(integer tensor) -> the kept ops it is computed from: an ArgMax's index, a one-hot, a TopK's indices
        # hold no float value, but what is computed from them (a cast one-hot, a gather) is computed from those ops
        self.derived: dict[int, frozenset[int]] = {}
        self.alive: list[torch.Tensor] = []  # keeps recorded tensors alive so their ids stay unique
        self.full = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.full and self.stack.recording:
            self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out) -> None:
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        name = name if name.startswith("aten.") else f"aten.{name}"
        if name in SKIPPED:
            return
        if name in PASSTHROUGH:
            self._pass_through(args, out)
            self._base_written(name, func, args, kwargs)
            return
        self._keep(name, func, args, kwargs, out)
        self._base_written(name, func, args, kwargs)

    def _base_written(self, name: str, func, args, kwargs) -> None:
        """After an in-place op on a view (``buffer[:, t] = h``: a ``copy_`` into a select of a buffer), the whole
        buffer as it now is: the file computes it as one tensor (a ScatterND, a slice_scatter), and no op's value
        would hold it otherwise (the buffer was allocated, not computed)."""
        target = args[0] if name.endswith("_") and args and isinstance(args[0], torch.Tensor) else None
        base = target._base if target is not None else None
        if base is None or not base.is_floating_point():
            return
        self._keep(f"{name}.base", func, (*args, base), kwargs, base)  # computed from the buffer before it too

    def _keep(self, name: str, func, args, kwargs, out) -> None:
        """Record the op's floating-point output(s) (a list op's every tensor); of integer outputs, only which kept
        ops they are computed from."""
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        floats = [t for t in tensors if t.is_floating_point() or t.dtype == torch.bool]
        inputs = tuple(sorted(self._sources(args, kwargs)))
        if not floats:
            self._derive(tensors, inputs)
            return
        call = OpCall(name, getattr(func, "_overloadname", ""), self._innermost(), _plain_args(args, kwargs),
                      self._params_read(args, kwargs))
        # the first output is the op's value (max_pool's indices, layer_norm's mean, etc. are not), except for
        # an op returning a list (Tensor[]: split, unbind, chunk), each of whose tensors is one of its values
        for t in floats if isinstance(out, list) else floats[:1]:
            size = t.numel() * t.element_size()
            if size > self.budget:
                self.full = True
                return
            self.budget -= size
            self.made_by[id(t)] = len(self.kept)
            self.alive.append(t)
            self.kept.append((call, to_numpy(t, copy=True), inputs))
        # a TopK's or a sort's indices beside its values: computed from what the values are
        self._derive([t for t in tensors if not (t.is_floating_point() or t.dtype == torch.bool)],
                     tuple(sorted(set(inputs) | {len(self.kept) - 1})))

    def _params_read(self, args, kwargs) -> tuple[str, ...]:
        """The parameters among the op's tensor arguments, by storage (a view of a weight shares it): what a
        functional op (``F.linear`` with another module's weight, an attention's packed ``in_proj_weight``) read."""
        if not self.params:
            return ()
        found = []
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.numel():  # (every empty tensor's storage is at address 0)
                try:
                    name = self.params.get(t.untyped_storage().data_ptr())
                except (RuntimeError, NotImplementedError):  # a tensor without storage (a fake or sparse one)
                    name = None
                if name is not None and name not in found:
                    found.append(name)
        return tuple(found)

    def _sources(self, args, kwargs) -> set[int]:
        """The kept ops the tensors among ``args`` hold or are computed from."""
        found: set[int] = set()
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                if id(t) in self.made_by:
                    found.add(self.made_by[id(t)])
                else:
                    found |= self.derived.get(id(t), frozenset())
        return found

    def _derive(self, tensors: list[torch.Tensor], inputs: tuple[int, ...]) -> None:
        """Note that integer ``tensors`` are computed from the kept ops ``inputs`` — for as long as they live (they
        are not kept alive: their memory is no budget's, and an id freed is forgotten before it is reused)."""
        if inputs:
            for t in tensors:
                if id(t) not in self.derived:
                    weakref.finalize(t, self.derived.pop, id(t), None)
                self.derived[id(t)] = frozenset(inputs)

    def _pass_through(self, args, out) -> None:
        """The output of a copy or cast carries its input's record on; a cast of integers to floats (a one-hot made
        float) is a value of its own, computed from what the integers were."""
        tensors = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
        source = next((t for t in tensors if id(t) in self.made_by), None)
        target = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
        if target is None:
            return
        if source is not None:
            self.made_by[id(target)] = self.made_by[id(source)]
            self.alive.append(target)
            return
        derived = next((t for t in tensors if id(t) in self.derived), None)
        if derived is None:
            return
        if target.is_floating_point():
            self._keep("aten._to_copy", torch.ops.aten._to_copy.default, (derived,), {}, target)
        else:
            self._derive([target], tuple(sorted(self.derived[id(derived)])))

    def _innermost(self) -> str:
        return self.stack.names[-1] if self.stack.names else ""


def _plain_args(args, kwargs) -> tuple[tuple[str, Any], ...]:
    """The arguments that are not tensors (dims, scalars, shapes, dtypes), by position or keyword."""
    def plain(v):
        if isinstance(v, torch.Tensor):
            return None
        if isinstance(v, (list, tuple)):
            inner = [plain(x) for x in v]
            return None if any(x is None for x in inner) and any(isinstance(x, torch.Tensor) for x in v) \
                else tuple(inner)
        if isinstance(v, (bool, int, float, str)) or v is None:
            return v
        return str(v)

    out = [(str(i), plain(a)) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
    out += [(k, plain(v)) for k, v in kwargs.items() if not isinstance(v, torch.Tensor)]
    return tuple(out)


def capture_window(model: torch.nn.Module, inputs: ModelInputs, start: tuple[str, int] | None,
                   end: tuple[str, int], first_index: int, budget: int = 1 << 30) -> tuple[Activation, ...]:
    """Run ``model`` once and record the ATen ops run after call ``start`` = (module, call number) returns (from
    the beginning when None) until call ``end`` returns, in execution order, as activations numbered from
    ``first_index``.

    Each activation's ``module`` is the innermost module running the op,
    ``module_type`` the op (``aten._softmax``), ``op`` a stable name
    (``aten._softmax#3``), ``inputs`` the op activations it read, and ``args``
    its non-tensor arguments.  At most ``budget`` bytes of outputs are kept;
    past that the capture stops (the ops kept so far stay valid).
    """
    model.eval()
    stack = _ModuleStack(model, start, end)
    recorder = _Recorder(stack, budget, _parameter_storages(model))
    args, kwargs = tree_map_only(torch.Tensor, torch.Tensor.clone, (tuple(inputs.args), dict(inputs.kwargs)))
    try:
        with torch.no_grad(), _unfused_attention(), recorder:
            model(*args, **kwargs)
    finally:
        stack.remove()
    return _activations(recorder.kept, first_index)


def _parameter_storages(model: torch.nn.Module) -> dict[int, str]:
    """Each parameter's storage address and qualified name (the first name of a shared one)."""
    out: dict[int, str] = {}
    for name, p in model.named_parameters():
        try:
            out.setdefault(p.untyped_storage().data_ptr(), name)
        except (RuntimeError, NotImplementedError):  # a meta or fake parameter
            continue
    return out


@contextlib.contextmanager
def _unfused_attention():
    """Scaled dot-product attention computed by its math definition (matmul, scale, softmax, matmul), which the
    dispatch mode sees op by op, instead of one fused kernel; and nn.MultiheadAttention / nn.TransformerEncoderLayer
    off their inference fast path (one ``_native_multi_head_attention`` op in eval mode) onto the ops an exporter
    traces.  The values agree within float noise."""
    with contextlib.ExitStack() as stack:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        except Exception:  # noqa: BLE001 - an older torch: attention stays one op
            pass
        mha = getattr(torch.backends, "mha", None)
        fast = mha.get_fastpath_enabled() if mha is not None and hasattr(mha, "get_fastpath_enabled") else None
        if fast:
            mha.set_fastpath_enabled(False)
            stack.callback(mha.set_fastpath_enabled, True)
        yield


def _activations(kept, first_index: int) -> tuple[Activation, ...]:
    counts: dict[str, int] = defaultdict(int)
    out = []
    for i, (call, value, inputs) in enumerate(kept):
        counts[call.op] += 1
        out.append(Activation(
            index=first_index + i, module=call.module,
            module_type=f"{call.op}.{call.overload}" if call.overload else call.op, call=0,
            path=f"::{call.op}#{counts[call.op]}", value=value, is_leaf=True,
            inputs=tuple(first_index + j for j in inputs), op=f"{call.op}#{counts[call.op]}", args=call.args,
            params=call.params))
    return tuple(out)

