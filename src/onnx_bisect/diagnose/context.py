"""What a diagnosis rule sees and what it returns.

A rule is a small class with a ``cause`` slug and one ``match(ctx)`` method
returning a :class:`Finding` or None.  The runner in ``__init__`` evaluates all
rules on the first divergence, confirms the best finding by re-running the
segment with the rule's counterfactual applied, and turns it into the report's
``Divergence``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..records import (Activation, Capture, Cause, LayerResult, LoadedModel, ModelInputs, RuntimeSettings, TensorDiff,
                       Tolerance)
from ..records.graph import GraphIndex, NodeInfo, sorted_upstream
from ..records.rows import rows_reordered
from ..records.nest import to_numpy
from ..records.weights import Weights
from .support import segment as _segment

#: run an ONNX model once: ``(model, feeds, outputs, weights, optimize) -> values``, each value marked with the
#: resolution it was computed at (the run stage's contract, as the pipeline's runner provides it)
Execute = Callable[..., Mapping[str, np.ndarray]]

#: float32 rounding steps an error must exceed before a rule may call it a fault:
#: below that, any re-ordering of the arithmetic (a fused kernel, a different
#: summation order) explains it.
NOISE_ULPS = 64


#: segments this small are searched from the node computing the divergent tensor outwards
SMALL_SEGMENT = 12


#: how many of PyTorch's ops feeding the divergent op are read per node of its segment (views, expands and copies
#: have no ONNX node of their own)
OPS_PER_NODE = 4


@dataclass(frozen=True)
class OnnxModel:
    """The ONNX model the divergence is in."""

    graph: GraphIndex
    skeleton: onnx.ModelProto  # the ONNX graph, shape-inferred, large weights split off
    weights: Weights  # the split-off weights


@dataclass(frozen=True)
class Baseline:
    """What the ONNX model is compared with: the PyTorch model, its capture and inputs — or, with
    ``--reference``, another ONNX model, whose initializers stand in for the parameters."""

    loaded: LoadedModel  # loaded.module is the PyTorch model (None with --reference)
    capture: Capture
    inputs: ModelInputs | None = None  # the PyTorch inputs as given, before any cast for ONNX Runtime
    weights: Mapping[str, np.ndarray] | None = None  # --reference: its float initializers by name


@dataclass(frozen=True)
class CutRun:
    """How the divergent segment is re-run: the values fed at the cut tensors and graph inputs, and the run
    stage's executor with the runtime settings it runs under."""

    references: Mapping[str, np.ndarray]  # PyTorch value of every cut tensor, in the ONNX dtype
    feeds: Mapping[str, np.ndarray]  # the graph inputs
    execute: Execute
    runtime: RuntimeSettings


#: PyTorch ops whose output is a parameter's numbers laid out (not a product computed from one)
PARAMETER_VIEWS = frozenset({"aten.select", "aten.t", "aten.transpose", "aten.permute", "aten.view", "aten.slice",
                             "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.unsqueeze", "aten.squeeze"})


def _selected(a: Activation, by_index: dict) -> str:
    """The index a select of a parameter took, on the way from the parameter to the view ``a``: ``"[2]"`` for
    ``weight[2]`` (a select along the first axis), else ``""``."""
    seen = set()
    while a is not None and a.index not in seen:
        seen.add(a.index)
        if a.module_type.startswith("aten.select"):
            args = dict(a.args)
            if args.get("1") == 0 and isinstance(args.get("2"), int):
                return f"[{args['2']}]" if args["2"] >= 0 else f"[{args['2']}] (counted from the end)"
        a = next((by_index[i] for i in a.inputs if i in by_index and by_index[i].params), None)
    return ""


@dataclass(frozen=True)
class DiagnosisContext:
    """Everything known about the first divergence: where it is, the ONNX model, what it is compared with,
    how to re-run its segment, and how to judge the result."""

    layer: LayerResult
    introduced: bool
    layers: tuple[LayerResult, ...]
    onnx: OnnxModel
    baseline: Baseline
    cut: CutRun
    tolerance: Tolerance
    compare: Callable[[np.ndarray, np.ndarray], TensorDiff]
    ops: tuple[Activation, ...] = ()  # PyTorch's ATen ops around the divergence, when it was narrowed to one
    #: nodes where the error was seen to enter (an op-level segment no cause explained): a search over this wider
    #: segment tries the nodes nearest them first
    focus: tuple[str, ...] = ()

    # ------------------------------------------------------------ the divergent tensor

    @property
    def tensor(self) -> str:
        """The ONNX tensor of the divergent layer."""
        return self.layer.pair.tensor

    @property
    def reference(self) -> np.ndarray:
        """The PyTorch value of the divergent tensor, in the ONNX tensor's layout (float64 kept)."""
        ref = self.layer.pair.reference()
        shape = self.onnx.graph.shapes.get(self.tensor)
        if shape and None not in shape and int(np.prod(shape)) == ref.size:
            ref = ref.reshape(shape)
        return ref

    @property
    def segment_nodes(self) -> list[NodeInfo]:
        """The ONNX nodes of the divergent segment, in graph order."""
        names = set(self.layer.segment)
        return [n for n in self.onnx.graph.nodes if n.name in names]

    @cached_property
    def _protos(self) -> dict[str, onnx.NodeProto]:
        return {n.name: n for n in self.onnx.skeleton.graph.node if n.name}

    def node(self, name: str) -> onnx.NodeProto | None:
        """The skeleton's NodeProto called ``name`` (read it, never modify it)."""
        return self._protos.get(name)

    @property
    def segment_protos(self) -> list[onnx.NodeProto]:
        """The NodeProtos of the segment, in graph order (read-only)."""
        return [p for p in (self.node(n.name) for n in self.segment_nodes) if p is not None]

    def protos_by_focus(self) -> list[onnx.NodeProto]:
        """The segment's NodeProtos, those nearest the ``focus`` nodes first (hops through the graph, upstream
        before downstream at equal distance); without a focus, nearest the node computing the divergent tensor
        (of two edits that reproduce PyTorch — a Div of an inverse for a Mul — the one there, not an input's) when
        the segment is small, else in graph order."""
        protos = self.segment_protos
        graph, inside = self.onnx.graph, {p.name for p in protos}
        producer = graph.node_of(self.tensor)
        # the producer as focus only in a small segment (where the order only decides between equal fixes): in a
        # long one an early node's fix must not wait behind the whole segment (a search has a budget)
        focus = self.focus or ((producer.name,) if producer is not None and len(protos) <= SMALL_SEGMENT else ())
        if not focus:
            return protos
        by_name = {n.name: n for n in graph.nodes}
        distance: dict[str, tuple[int, int]] = {n: (0, 0) for n in focus if n in inside}
        frontier = list(distance)
        while frontier:
            nxt = []
            for name in frontier:
                node, (d, _) = by_name[name], distance[name]
                ups = [graph.node_of(t) for t in node.inputs if t]
                downs = [graph.nodes[c] for t in node.outputs for c in graph.consumers.get(t, ())]
                for other, side in [(u, 0) for u in ups if u is not None] + [(w, 1) for w in downs]:
                    if other.name in inside and other.name not in distance:
                        distance[other.name] = (d + 1, side)
                        nxt.append(other.name)
            frontier = nxt
        order = {p.name: i for i, p in enumerate(protos)}
        return sorted(protos, key=lambda p: (*distance.get(p.name, (len(protos), 1)), order[p.name]))

    def initializer(self, name: str) -> np.ndarray | None:
        """An initializer's value, wherever it is stored (None if it is not one)."""
        if name in self.onnx.weights.arrays:
            return self.onnx.weights.arrays[name]
        for init in self.onnx.skeleton.graph.initializer:
            if init.name == name and init.data_location != onnx.TensorProto.EXTERNAL:
                return numpy_helper.to_array(init)
        return None

    def constant(self, tensor: str) -> np.ndarray | None:
        """The value of ``tensor`` when it is an initializer or a Constant node's output."""
        if not tensor:
            return None
        value = self.initializer(tensor)
        if value is not None:
            return value
        info = self.onnx.graph.node_of(tensor)
        if info is None or info.op_type != "Constant":
            return None
        return constant_value(self.node(info.name))

    # ------------------------------------------------------------ the PyTorch side

    def torch_module(self, qualname: str | None = None):
        """The PyTorch module of the divergent layer (or of ``qualname``)."""
        name = self.layer.pair.activation.module if qualname is None else qualname
        return self._modules.get(name)

    def owns(self, qualname: str, tensor_name: str) -> bool:
        """Whether the parameter or buffer (or a fold of one) named ``tensor_name`` belongs to module ``qualname``:
        by its name, or by identity — a weight tied between modules (Zamba2's shared block at two depths, a decoder
        tied to its embedding) is named after its first owner only (``named_parameters`` lists it once)."""
        return tensor_name.startswith(qualname + ".") or tensor_name in self._own_tensor_names(qualname)

    def _own_tensor_names(self, qualname: str) -> frozenset[str]:
        module = self._modules.get(qualname)
        if module is None:
            return frozenset()
        first = self._tensor_names_by_id
        return frozenset(first[id(t)] for t in (*module.parameters(), *module.buffers()) if id(t) in first)

    @cached_property
    def _tensor_names_by_id(self) -> dict[int, str]:
        module = self.baseline.loaded.module
        return {} if module is None else {id(t): n for n, t in [*module.named_parameters(), *module.named_buffers()]}

    @cached_property
    def parameter_names(self) -> frozenset[str]:
        """The PyTorch model's parameter and buffer names (the reference file's initializers' with --reference):
        an initializer so named is a weight."""
        module = self.baseline.loaded.module
        if module is None:
            return frozenset(self.baseline.weights or ())
        return frozenset(n for n, _ in [*module.named_parameters(), *module.named_buffers()])

    @cached_property
    def _modules(self) -> dict[str, Any]:
        # No PyTorch model when the reference is another ONNX model: rules that read modules find none.
        return {} if self.baseline.loaded.module is None else dict(
            self.baseline.loaded.module.named_modules(remove_duplicate=False))  # a shared module under each name

    @cached_property
    def opset(self) -> int:
        """The file's ONNX-domain opset (0 when it names none)."""
        return next((o.version for o in self.onnx.skeleton.opset_import if o.domain in ("", "ai.onnx")), 0)

    def torch_modules(self) -> list[tuple[str, Any]]:
        """Every module of the PyTorch model, ``(qualname, module)`` (none with an ONNX reference)."""
        return list(self._modules.items())

    def module_of(self, node: NodeInfo) -> tuple[str, Any] | tuple[None, None]:
        """``(qualname, module)`` of the PyTorch module that emitted ``node``, if its scope is known."""
        if node.scope is None:
            return None, None
        for start in range(len(node.scope) + 1):  # tolerate wrapper prefixes such as ``model/``
            for end in range(len(node.scope), start - 1, -1):
                name = ".".join(node.scope[start:end])
                if name in self._modules and (name or end == start):
                    name = self.baseline.capture.aliases.get(name, name)  # a shared block's first name
                    return name, self._modules[name]
        return None, None

    @cached_property
    def op_params(self) -> tuple[str, ...]:
        """The model parameters PyTorch's op read, when the divergent layer is one, and those read by the ops
        feeding it — a few ops back per node of the segment (PyTorch's views and expands have no node; the products
        a segment of a functional attention computes, ``F.linear`` with its children's weights): () for a module's
        output."""
        act = self.layer.pair.activation
        if not act.op:
            return ()
        by_index = {a.index: a for a in self.ops}
        found, frontier, seen = list(act.params), list(act.inputs), {act.index}
        while frontier and len(seen) <= OPS_PER_NODE * max(1, len(self.segment_nodes)):
            i = frontier.pop(0)
            if i in seen or i not in by_index:
                continue
            seen.add(i)
            found += by_index[i].params
            if not by_index[i].params:  # a product's inputs are another layer's: the walk stops at it
                frontier += by_index[i].inputs
        return tuple(dict.fromkeys(found))

    @cached_property
    def op_param_views(self) -> tuple[tuple[str, np.ndarray], ...]:
        """The parameters PyTorch's op read as the values it read them in (a view of a stacked parameter: one
        expert's ``weight[2]``, transposed), nearest first: ``(name, value)``, the name with the index a select
        took (``experts.weight[2]``).  () for a module's output."""
        act = self.layer.pair.activation
        if not act.op:
            return ()
        by_index = {a.index: a for a in self.ops}
        found, frontier, seen = [], list(act.inputs), {act.index}
        while frontier and len(seen) <= OPS_PER_NODE * max(1, len(self.segment_nodes)):
            i = frontier.pop(0)
            if i in seen or i not in by_index:
                continue
            seen.add(i)
            a = by_index[i]
            if a.params and ".".join(a.module_type.split(".")[:2]) in PARAMETER_VIEWS \
                    and a.value is not None and a.value.dtype.kind == "f":
                found.append((a.params[0] + _selected(a, by_index), np.asarray(a.value, np.float64)))
            if not a.params:
                frontier += a.inputs
        return tuple(found)

    def modules_near(self) -> list[tuple[str, Any]]:
        """The divergent module, its ancestors and the modules of the segment's nodes (qualname, module)."""
        names: list[str] = []
        act = self.layer.pair.activation.module
        parts = act.split(".") if act else []
        names += [".".join(parts[:k]) for k in range(len(parts), -1, -1)]
        for n in self.segment_nodes:
            name, _ = self.module_of(n)
            if name is not None:
                names.append(name)
        return [(n, self._modules[n]) for n in dict.fromkeys(names) if n in self._modules]

    def activation_of(self, qualname: str):
        """The first captured activation of module ``qualname`` (None if not captured)."""
        qualname = self.baseline.capture.aliases.get(qualname, qualname)  # recorded under a shared block's first name
        return next((a for a in self.baseline.capture.activations if a.module == qualname and a.call == 0), None)

    # ------------------------------------------------------------ numbers

    def noise_floor(self, reference: np.ndarray | None = None) -> float:
        """The largest error float32 re-ordering could explain at the scale of ``reference``."""
        ref = self.reference if reference is None else reference
        scale = float(np.max(np.abs(ref))) if ref.size and np.isfinite(ref).all() else 1.0
        return NOISE_ULPS * float(np.finfo(np.float32).eps) * (1.0 + scale)

    def significant(self, diff: TensorDiff | None) -> bool:
        """Whether ``diff`` fails the tolerance by more than rounding noise."""
        return diff is not None and not diff.ok and (diff.nonfinite > 0 or diff.max_abs > self.noise_floor())

    # ------------------------------------------------------------ re-running the segment

    def segment_feeds(self, model: onnx.ModelProto | None = None, from_inputs: bool = False) -> dict[str, np.ndarray]:
        """The values the segment reads from outside: PyTorch references at cut tensors, else graph inputs."""
        model = self.onnx.skeleton if model is None else model
        _, boundary, _ = _segment.extract(model, [self.tensor], set() if from_inputs else set(self.cut.references))
        return {t: self._boundary_value(t) for t in boundary}

    @cached_property
    def upstream(self) -> list[str]:
        """Names of every node the divergent tensor depends on, back to the graph inputs."""
        sub, _, _ = _segment.extract(self.onnx.skeleton, [self.tensor], set())
        return [n.name for n in sub.graph.node]

    def shape_of(self, tensor: str) -> tuple[int, ...] | None:
        """``tensor``'s shape: as shape inference gives it, else as the segment computes it."""
        shape = self.onnx.graph.shapes.get(tensor)
        if shape and None not in shape:
            return tuple(shape)
        value = self._segment_values.get(tensor)
        return None if value is None else tuple(value.shape)

    def value_shapes(self, *tensors: str) -> list[tuple[int, ...] | None]:
        """The tensors' shapes (:meth:`shape_of`), else as the file computes them (one run for them all): tensors
        outside the segment whose shape inference could not follow (a Slice of computed bounds, a fused op's
        output)."""
        shapes = [self.shape_of(t) for t in tensors]
        missing = [t for t, s in zip(tensors, shapes) if s is None]
        values = self.computed(missing) if missing else {}
        return [s if s is not None else (tuple(np.asarray(values[t]).shape) if t in values else None)
                for t, s in zip(tensors, shapes)]

    def is_scalar(self, tensor: str) -> bool:
        """Whether ``tensor`` is a constant holding one number."""
        value = self.constant(tensor)
        return value is not None and value.size == 1

    def computed(self, tensors: list[str]) -> dict[str, np.ndarray]:
        """``tensors`` as fed at the cut (PyTorch's values) or as the segment computes them from exact inputs (one
        cached run for the segment's own tensors, one more for any others; what the segment's nodes compute is
        always read from the run); those it cannot compute are left out."""
        own = {o for p in self.segment_protos for o in p.output}  # the segment's output is a cut too: computed here
        found = {t: np.asarray(self.cut.references[t]) for t in tensors if t in self.cut.references and t not in own}
        found.update({t: np.asarray(self._segment_values[t]) for t in tensors
                      if t not in found and t in self._segment_values})
        rest = [t for t in tensors if t not in found]
        if rest:
            try:
                found.update({t: np.asarray(v) for t, v in self.run_segment(outputs=rest).items() if t in rest})
            except Exception:  # noqa: BLE001 - a tensor the segment cannot compute alone holds nothing known
                pass
        return found

    @cached_property
    def _segment_values(self) -> dict[str, np.ndarray]:
        """Every tensor the segment's nodes read or compute, as the segment computes them from exact inputs."""
        wanted = [t for p in self.segment_protos for t in list(p.input) + list(p.output)
                  if t and t not in self.onnx.graph.initializers]
        try:
            return self.run_segment(outputs=list(dict.fromkeys(wanted)))
        except Exception:  # noqa: BLE001 - shapes then come from shape inference alone
            return {}

    @property
    def error(self) -> TensorDiff | None:
        """The divergent layer's own error when it introduces it, else the accumulated one."""
        return self.layer.local if self.introduced else self.layer.diff

    def torch_value(self, tensor: str) -> np.ndarray | None:
        """The PyTorch value of cut tensor ``tensor`` before any cast to the ONNX dtype (None if not a cut)."""
        ref = self.cut.references.get(tensor)
        for layer in self.layers:
            if layer.pair.tensor == tensor and ref is not None:
                value = layer.pair.reference()
                return value.reshape(ref.shape) if value.size == ref.size else value
        return None

    def torch_input(self, name: str) -> np.ndarray | None:
        """The PyTorch input behind graph input ``name``, as given (by name, else by position)."""
        if self.baseline.inputs is None or name not in self.onnx.graph.graph_inputs:
            return None
        by_name = dict(zip(self.baseline.inputs.names, self.baseline.inputs.args)) | dict(self.baseline.inputs.kwargs)
        value = by_name.get(name)
        if value is None:
            position = self.onnx.graph.graph_inputs.index(name)
            value = self.baseline.inputs.args[position] if position < len(self.baseline.inputs.args) else None
        if value is None or not hasattr(value, "detach"):
            return None
        return to_numpy(value)

    def _boundary_value(self, tensor: str) -> np.ndarray:
        if tensor in self.cut.references:
            return self.cut.references[tensor]
        if tensor in self.cut.feeds:
            return self.cut.feeds[tensor]
        raise KeyError(f"segment input {tensor!r} is neither a cut tensor nor a graph input")

    def run_segment(
        self,
        model: onnx.ModelProto | None = None,
        weights: Weights | None = None,
        outputs: Iterable[str] = (),
        feeds: Mapping[str, np.ndarray] | None = None,
        optimize: bool = True,
        from_inputs: bool = False,
        through: Iterable[str] = (),
    ) -> dict[str, np.ndarray]:
        """Run only the nodes computing the divergent tensor (and ``outputs``) from the cut tensors.

        Inputs are the same PyTorch references the local run feeds, unless
        ``feeds`` overrides some; ``model``/``weights`` default to the user's.
        Cheap whatever the model size: the session holds just the segment.
        ``from_inputs`` runs everything upstream from the graph inputs instead
        (for errors that build up over many segments); the cut tensors in ``through`` are computed, not fed
        (a cut tensor asked for as an output is otherwise handed back as fed).
        """
        key = (tuple(outputs), optimize, from_inputs, tuple(through))
        if model is None and weights is None and feeds is None and key in self._runs:
            return self._runs[key]
        wanted = list(dict.fromkeys([self.tensor, *outputs]))
        sub, values, store = self.segment_model(model, weights, wanted, feeds, from_inputs, through)
        run_outputs = [t for t in wanted if t not in values]
        result = dict(self.cut.execute(sub, values, run_outputs, store, optimize=optimize))
        result.update({t: values[t] for t in wanted if t in values})
        if (model is None or model is self.onnx.skeleton) and (weights is None or weights is self.onnx.weights) \
                and feeds is None:
            self._runs[key] = result
        return result

    def segment_model(
        self,
        model: onnx.ModelProto | None = None,
        weights: Weights | None = None,
        outputs: Iterable[str] = (),
        feeds: Mapping[str, np.ndarray] | None = None,
        from_inputs: bool = False,
        through: Iterable[str] = (),
    ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], Weights]:
        """``(submodel, input values, large weights)``: the nodes computing ``outputs`` (the divergent tensor
        by default) from the cut tensors (or, ``from_inputs``, from the graph inputs) as a model of their own,
        its inputs typed by the values fed there (``feeds`` overriding the PyTorch references)."""
        model = self.onnx.skeleton if model is None else model
        weights = self.onnx.weights if weights is None else weights
        wanted = list(dict.fromkeys(outputs or [self.tensor]))
        stops = set() if from_inputs else set(self.cut.references) - set(through)
        sub, boundary, inits = _segment.extract(model, wanted, stops)
        values = {t: (feeds or {}).get(t) if (feeds or {}).get(t) is not None else self._boundary_value(t)
                  for t in boundary}
        store = Weights({n: weights.arrays[n] for n in inits if n in weights.arrays})
        return _segment.with_inputs(sub, values), values, store

    def reproduces(self, fixed: "FixedSegment") -> bool:
        """Whether the segment re-run with ``fixed``'s graph, weights and feeds computes PyTorch's value (a graph
        the runtime rejects does not)."""
        try:
            values = self.run_segment(fixed.model, fixed.weights, feeds=fixed.feeds)
        except Exception:  # noqa: BLE001 - a fix the runtime rejects fixes nothing
            return False
        return self.tensor in values and self.agrees(values[self.tensor], self.reference)

    def agrees(self, value: np.ndarray, reference: np.ndarray) -> bool:
        """Whether ``value`` is PyTorch's ``reference`` within the tolerance, its rows perhaps in another order
        (:meth:`reordered_diff`)."""
        if self.compare(value, reference).ok:
            return True
        diff = self.reordered_diff(value, reference)
        return diff is not None and bool(diff.ok)

    def reordered_diff(self, value: np.ndarray, reference: np.ndarray) -> TensorDiff | None:
        """For a divergent tensor computed from a sort (a TopK, which breaks ties among equal keys another way than
        PyTorch's sort), the difference of ``value``'s rows put in the order of ``reference``'s nearest rows; None
        where nothing sorts before it, for a graph output, or where the rows are not a reordering."""
        if self.tensor in self.onnx.graph.graph_outputs or not self._sorted_upstream:
            return None
        moved = rows_reordered(np.asarray(value), np.asarray(reference))
        return None if moved is None else self.compare(moved, reference)

    @cached_property
    def _sorted_upstream(self) -> bool:
        return sorted_upstream(self.onnx.graph, self.tensor)

    @cached_property
    def _runs(self) -> dict:
        return {}

    @property
    def local_value(self) -> np.ndarray:
        """What the ONNX segment computes for the divergent tensor from exact inputs."""
        return self.run_segment()[self.tensor]


def constant_value(node: onnx.NodeProto | None) -> np.ndarray | None:
    """The value of a Constant node."""
    if node is None or node.op_type != "Constant":
        return None
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
            return np.array(helper.get_attribute_value(attr))
    return None


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (strings decoded), else ``default``."""
    for attr in node.attribute:
        if attr.name == name:
            value = helper.get_attribute_value(attr)
            return value.decode() if isinstance(value, bytes) else value
    return default


@dataclass(frozen=True)
class FixedSegment:
    """A counterfactual's repaired model: the skeleton and weights with the fix applied, and the input values
    the fixed segment must read instead of the usual ones (float64 values, say), if any."""

    model: onnx.ModelProto
    weights: Weights
    feeds: Mapping[str, np.ndarray] | None = None


#: the fix a finding proposes, applied to a copy of the context's model
Counterfactual = Callable[[DiagnosisContext], FixedSegment]


@dataclass(frozen=True)
class Finding:
    """A rule's claim about the cause, with the numbers behind it."""

    cause: Cause
    confidence: float  # 0..1; >= 0.5 only on evidence of a real fault
    summary: str  # one or two sentences in plain words
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    #: the ONNX nodes the fix edits, keeps in float32 or restores the weights of, when it names a few: once the
    #: fix is confirmed by re-running, that is where the fault is (``pipeline.explain.pinned_by_fix``)
    changes: tuple[str, ...] = ()
    counterfactual: Counterfactual | None = field(default=None, compare=False, repr=False)
    optimize: bool = True  # whether the confirming re-run keeps the backend's graph optimizations
    from_inputs: bool = False  # the confirming re-run computes from the graph inputs, not from the cut tensors
    #: the PyTorch value the fixed segment must reproduce, when it is not the divergent layer's own
    #: (a Conv aligned with the conv module that in fact computes conv + folded BatchNorm)
    reference: Callable[[DiagnosisContext], np.ndarray] | None = field(default=None, compare=False, repr=False)


class Rule:
    """Base class of a diagnosis rule: one known cause per subclass."""

    cause: Cause = Cause.UNKNOWN
    #: expensive rules (a PyTorch re-run) only run when no cheap rule found a confident cause
    expensive: bool = False

    def match(self, ctx: DiagnosisContext) -> Finding | None:  # pragma: no cover - interface
        """Return a finding when this cause explains the divergence, else None."""
        raise NotImplementedError
