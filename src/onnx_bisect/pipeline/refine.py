"""The refine step of one case: a divergent segment of many nodes narrowed to the op that introduces the error.

Module-level cut points leave whole blocks as one segment (an attention
block's own ops are 15 to 165 ONNX nodes between its children's outputs).  This
step, for any file and any exporter:

1. records PyTorch's ATen ops in the window between the segment's inputs and
   its output (one more, targeted forward; see :mod:`..capture.dispatch`);
2. runs the segment alone with every tensor it computes exposed, fed the exact
   PyTorch values at its inputs;
3. pairs op outputs with those tensors by value (:mod:`..align.inside`), which
   separates the tensors that are right from those that are not;
4. tries the counterparts of the wrong tensors nearest the right ones first:
   feeding PyTorch's value there and re-running the segment, the first that
   removes the error at the segment's output is where the error enters — the
   refined segment is what computes it from the right tensors.

A refinement that cannot be confirmed this way is not reported; the
module-level segment stands.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx

from ..align import inside
from ..capture import dispatch
from ..diagnose.support import segment as extract
from ..records import Activation, ErrorOrigin, LayerResult, MatchMethod, ModelInputs, Status, TensorPair
from ..records.graph import HALF_TYPES
from ..records.weights import Weights
from ..report.progress import Progress
from .prepare import Prepared
from .runner import Runner

#: a segment this small is already as narrow as the report needs
SMALL_SEGMENT = 3
#: segment runs spent confirming counterparts, at most
MAX_TRIALS = 40
#: bytes of op outputs the targeted forward may keep
OP_BUDGET = 1 << 30


@dataclass(frozen=True)
class Refinement:
    """The op-level layer that holds the fault, the values to cut its segment at, and the layer it refines."""

    layer: LayerResult
    references: dict[str, np.ndarray]  # the PyTorch values at the refined segment's inputs (and every cut)
    within: LayerResult
    ops: tuple[Activation, ...] = ()  # PyTorch's ops in the window around the segment


def refine(p: Prepared, runner: Runner, layer: LayerResult, references: dict[str, np.ndarray],
           model_feeds: dict[str, np.ndarray], cuts: dict[str, TensorPair], inputs: ModelInputs, compare,
           progress: Progress) -> Refinement | None:
    """Narrow ``layer`` (whose segment introduces the error) to the op where the error enters, or None."""
    if len(layer.segment) <= SMALL_SEGMENT or p.loaded.module is None or layer.pair.tensor not in p.index.producer:
        return None
    with progress.step("refine", f"narrowing a {len(layer.segment)}-node segment to the op that diverges"):
        ops = _capture(p, layer, references, cuts, inputs)
        if not ops:
            return None
        seg = _Segment(p, runner, layer, references, model_feeds)
        produced = seg.produced()
        values = seg.values(produced)
        matched = inside.consistent(inside.match_values(ops, values, produced), produced, ops, p.index)
        within = set(produced)
        bad = inside.bad_tensors(produced, matched, p.index, within, values)
        found = _confirm(seg, layer, inside.candidates(bad, ops, values, matched, p.index), compare, values)
        if found is None:
            return None
        return _refinement(p, layer, found, matched, values, references, compare, ops)


def _capture(p: Prepared, layer: LayerResult, references, cuts: dict[str, TensorPair],
             inputs: ModelInputs) -> tuple[Activation, ...]:
    """PyTorch's ops between the segment's inputs and its output: the window opens when the earliest input
    activation's module call returns (at the start when the segment reads graph inputs) and closes when the
    output's module call returns."""
    stops = frozenset(references)
    seg = set(layer.segment)
    boundary = {i for n in p.index.nodes if n.name in seg for i in n.inputs if i in stops}
    feeding = [cuts[t].activation for t in boundary if t in cuts and cuts[t].activation.module]
    first = min(feeding, key=lambda a: a.index, default=None)
    out = layer.pair.activation
    if out.op or not out.module:
        return ()
    start = (first.module, first.call) if first is not None and first.index < out.index else None
    try:
        return dispatch.capture_window(p.loaded.module, inputs, start, (out.module, out.call), first_index=10 ** 9,
                                       budget=OP_BUDGET)
    except Exception:  # noqa: BLE001 - a model that will not run under a dispatch mode keeps its module-level answer
        return ()


class _Segment:
    """The divergent segment cut out of the model, run on its own from the exact values at its inputs."""

    def __init__(self, p: Prepared, runner: Runner, layer: LayerResult, references, model_feeds):
        self.p, self.runner, self.layer = p, runner, layer
        self.references, self.model_feeds = references, model_feeds

    def produced(self) -> list[str]:
        """The tensors the segment's nodes compute, in graph order."""
        names = set(self.layer.segment)
        return [t for n in self.p.index.nodes if n.name in names for t in n.outputs if t]

    def values(self, tensors: list[str], fed: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """``tensors`` as the segment computes them from the exact values at its inputs (and ``fed`` values cut
        in at those tensors)."""
        fed = fed or {}
        stops = set(self.references) | set(fed)
        target = self.layer.pair.tensor
        sub, boundary, inits = extract.extract(self.p.skeleton, [target, *[t for t in tensors if t != target]], stops)
        feeds = {t: fed[t] if t in fed else self._boundary(t) for t in boundary}
        sub = extract.with_inputs(sub, feeds)
        store = Weights({n: self.p.weights.arrays[n] for n in inits if n in self.p.weights.arrays})
        wanted = [t for t in dict.fromkeys([target, *tensors]) if t not in feeds]
        values = dict(self.runner.run_cut(sub, feeds, wanted, store))
        values.update({t: feeds[t] for t in tensors if t in feeds})
        return values

    def _boundary(self, t: str) -> np.ndarray:
        return self.references[t] if t in self.references else self.model_feeds[t]


def _confirm(seg: _Segment, layer: LayerResult, candidates: list[inside.Candidate], compare, values):
    """The first candidate (graph order, nearest first) whose PyTorch value, fed in place of the ONNX tensor,
    makes the segment's output agree: ``(candidate, value fed)``; None when none does within the budget."""
    reference = layer.pair.reference()
    for trial, c in enumerate(candidates):
        if trial >= MAX_TRIALS:
            return None
        fed = _in_layout(c, seg.p.index, values[c.tensor].shape if c.tensor in values else None)
        try:
            out = seg.values([], {c.tensor: fed})[layer.pair.tensor]
        except Exception:  # noqa: BLE001 - a value ONNX Runtime will not take there is not the counterpart
            continue
        if compare(out, reference).ok:
            return c, fed
    return None


def _region(p: Prepared, candidate: inside.Candidate, strong: dict[str, inside.Match], references,
            ops: tuple[Activation, ...]) -> tuple[int, ...]:
    """The nodes computing the confirmed tensor from the right tensors upstream.

    A right tensor is a boundary only if the op PyTorch fed there is the one
    the counterpart op reads (up to a reshape): a tensor holding an *earlier*
    value of the same chain (a Transpose that kept ``k`` where ``k^T`` was due)
    is where the error starts, so the region reaches back past it.
    """
    read = inside.read_values(candidate.op, ops)
    ancestors = inside.ancestors(candidate.op, ops)
    stops = set(references) | set(strong) | set(p.index.graph_inputs)
    for _ in range(4):
        nodes = p.index.segment(candidate.tensor, frozenset(stops))
        inputs = {i for n in nodes for i in p.index.nodes[n].inputs if i in strong and i not in references}
        stale = {s for s in inputs if strong[s].op.index not in read and strong[s].op.index in ancestors
                 and p.index.node_of(candidate.tensor).inputs.count(s)}
        # a Transpose that feeds the region holds a value PyTorch has, but perhaps not the one due there (k for
        # k^T: a wrong permutation of two equal axes): it belongs to the region
        stale |= {s for s in inputs if (n := p.index.node_of(s)) is not None and n.op_type == "Transpose"}
        # a float16 tensor holding a float32 op's value agrees only to float16's rounding: that rounding is
        # error entering the region (a node converted to float16), so its producer belongs to the region too
        stale |= {s for s in inputs if _rounded(p.index, s, strong[s].op)}
        if not stale:
            return nodes
        stops -= stale
    return nodes


def _rounded(index, tensor: str, op: Activation) -> bool:
    """Whether ``tensor`` holds ``op``'s float32 (or float64) value in half precision."""
    return index.elem_types.get(tensor) in HALF_TYPES and op.value is not None and op.value.dtype in (np.float32, np.float64)


def _in_layout(c: inside.Candidate, index, shape: tuple[int, ...] | None) -> np.ndarray:
    """The op's value in the ONNX tensor's layout (``shape``: as this run computes it) and dtype, ready to feed."""
    value = c.op.value if c.perm is None else c.op.value.transpose(c.perm)
    shape = shape or index.shapes.get(c.tensor)
    dtype = _dtype(index, c.tensor, value)
    with np.errstate(over="ignore"):
        out = value.astype(dtype, copy=False)
    fits = shape and None not in shape and int(np.prod(shape)) == out.size
    return np.ascontiguousarray(out.reshape(shape) if fits else out)


def _dtype(index, tensor: str, value: np.ndarray):

    elem = index.elem_types.get(tensor)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else value.dtype


def _refinement(p: Prepared, layer: LayerResult, found, matched: dict[str, inside.Match], values, references,
                compare, ops) -> Refinement | None:
    """The op-level layer: the nodes computing the confirmed tensor from the right ones, its local error."""
    candidate, _ = found
    strong = {t: m for t, m in matched.items() if m.strong}
    nodes = _region(p, candidate, strong, references, ops)
    if not nodes or len(nodes) >= len(layer.segment):
        return None
    op = candidate.op
    node = p.index.node_of(candidate.tensor)
    pair = TensorPair(dataclasses.replace(op, call=layer.pair.activation.call), candidate.tensor, node.name,
                      node.op_type, MatchMethod.OP_VALUE, 0.9,
                      f"{op.module_type} of {op.module or '<model>'}, confirmed by re-running the segment", candidate.perm)
    value = values[candidate.tensor]
    if any(p.index.elem_types.get(t) in HALF_TYPES for i in nodes for t in p.index.nodes[i].outputs):
        # the region computes in half precision itself: its rounding is the error it introduces, judged at
        # float32 like the float32 value PyTorch computes, not excused as float16's resolution
        value = np.asarray(value)
    local = compare(value, pair.reference())
    refined = LayerResult(pair=pair, diff=None, local=local, status=Status.DIVERGED, origin=ErrorOrigin.INTRODUCED,
                          segment=tuple(p.index.nodes[i].name for i in nodes),
                          segment_ops=tuple(p.index.nodes[i].op_type for i in nodes),
                          order=float(p.index.order_of(candidate.tensor)))
    cut = dict(references)
    inside_region = {t for i in nodes for t in p.index.nodes[i].outputs}
    for t, m in strong.items():
        if t in inside_region:
            continue  # a value the region computes (a Transpose it reaches back past) is not fed
        value = m.op.value if m.perm is None else m.op.value.transpose(m.perm)  # in the tensor's layout
        cut[t] = np.ascontiguousarray(value.astype(values[t].dtype, copy=False).reshape(values[t].shape))
    return Refinement(refined, cut, layer, ops)
