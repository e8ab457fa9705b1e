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

Where no one value clears the output (two faults in the segment), the first
wrong tensor after which PyTorch's values come back — fed its counterpart, the
segment's next tensors hold ops computed from it — is where an error enters.
A refinement that cannot be confirmed either way is not reported; the
module-level segment stands.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx

from ..align import inside
from ..capture import dispatch
from ..diagnose import FixedSegment
from ..diagnose.support import segment as extract
from ..measure import compare as compare_module
from ..records import Activation, ErrorOrigin, LayerResult, MatchMethod, ModelInputs, Status, TensorPair
from ..records.graph import HALF_TYPES, sorted_upstream
from ..records.rows import row_width, rows_reordered
from ..records.weights import Weights
from ..report.progress import Progress
from ..source import graph
from .prepare import Prepared
from .runner import Runner

#: a segment this small is already as narrow as the report needs
SMALL_SEGMENT = 3
#: a refined region this small is taken as found; a larger one is compared with what the suspects give
SMALL_REGION = 6
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
           progress: Progress, twin_of: Callable[[tuple[Activation, ...]], FixedSegment | None] | None = None,
           ) -> tuple[Refinement | None, tuple[Activation, ...]]:
    """Narrow ``layer`` (whose segment introduces the error) to the op where the error enters (None when it
    cannot), with PyTorch's ops captured around the segment (() when none were: the diagnosis reads them too).

    ``twin_of(ops)``: a quantized segment's float twin (its Q/DQ pairs undone; PyTorch's ``ops`` give the float
    values of quantized constants no parameter holds), searched in place of the file: its
    tensors pair with PyTorch's ops at float noise where the quantized ones differ by the quantization step;
    the region found there is named by the file's own nodes (the twin keeps every node's name)."""
    if len(layer.segment) <= SMALL_SEGMENT or p.loaded.module is None or layer.pair.tensor not in p.index.producer:
        return None, ()
    with progress.step("refine", f"narrowing a {len(layer.segment)}-node segment to the op that diverges"):
        ops = _capture(p, layer, references, cuts, inputs)
        if not ops:
            return None, ()
        twin = twin_of(ops) if twin_of is not None else None
        if twin is not None:
            found = _search(_twin_of(p, twin), runner, layer, references, model_feeds, ops, compare)
            if found is not None:
                return _named_by(found, p.index), ops
        return _search(p, runner, layer, references, model_feeds, ops, compare), ops


#: ops that move their input's values (not only reshape them): an output of theirs may be meant to hold the input's
#: value as it is
HANDING_ON = frozenset({"Transpose"})


def _with_input_as_is(candidates: list[inside.Candidate], matched: dict[str, inside.Match], index,
               values) -> list[inside.Candidate]:
    """Each wrong output of a layout op (a Transpose) whose input holds an op's value also tried fed that value
    as it is: a Transpose where none belongs (scores transposed before their mask) should have handed its input
    on, and PyTorch's op after it (the mask added) is no counterpart of it — fed there, the segment would add the
    mask twice and still clear."""
    out, done = [], set()
    for c in candidates:
        t = c.tensor
        if t not in done:
            done.add(t)
            node = index.node_of(t)
            source = matched.get(node.inputs[0]) if node is not None and node.op_type in HANDING_ON and node.inputs \
                else None
            if source is not None and source.perm is None and source.rows is None and t in values \
                    and source.op.value.size == values[t].size and source.op.value.shape == values[t].shape \
                    and not np.array_equal(source.op.value, values[t]):
                out.append(inside.Candidate(t, source.op, 0.0))
        out.append(c)
    return out


def _in_rows(candidates: list[inside.Candidate], matched: dict[str, inside.Match], index,
             values) -> list[inside.Candidate]:
    """Candidates of tensors computed after a sort that holds PyTorch's rows in another order, fed in that order:
    the order of the nearest tensor upstream holding an op's rows reordered, with as many rows (a wrong value
    says nothing of its order, but a row-by-row op keeps its input's)."""
    if not any(m.rows is not None for m in matched.values()):
        return candidates
    out, within = [], set(values)  # the segment's tensors
    for c in candidates:
        rows = None
        if c.perm is None and not c.own_shape and c.tensor in values and c.op.value.shape == values[c.tensor].shape:
            rows = _upstream_rows(c.tensor, matched, index, c.op.value, within)
        if rows is not None:
            out.append(dataclasses.replace(c, rows=rows))
        out.append(c)
    return out


def _upstream_rows(tensor: str, matched: dict[str, inside.Match], index, value: np.ndarray, within: set[str]):
    """The row order of the nearest tensor upstream of ``tensor`` (inside the segment: ``within``) matched with
    reordered rows, when it has as many rows as ``value``; None otherwise."""
    count = value.size // row_width(value)
    frontier, seen = [tensor], {tensor}
    while frontier:
        node = index.node_of(frontier.pop(0))
        if node is None:
            continue
        for t in node.inputs:
            if not t or t in seen:
                continue
            seen.add(t)
            m = matched.get(t)
            if m is not None:
                if m.rows is not None:
                    return m.rows if len(m.rows) == count else None
                continue  # PyTorch's own order from here up (the rows scattered back)
            if t in within:
                frontier.append(t)
    return None


def _entering_values(seg: "_Segment", ops: tuple[Activation, ...], within: set[str]) -> dict[str, inside.Match]:
    """The segment's inputs (PyTorch's values fed there) matched to the ops holding them: what the data flow of a
    bad tensor starts from."""
    names = set(seg.layer.segment)
    entering = {t for n in seg.p.index.nodes if n.name in names for t in n.inputs
                if t and t not in within and t in seg.references}
    return inside.match_values(ops, {t: seg.references[t] for t in entering}, sorted(entering))


def _twin_of(p: Prepared, twin: FixedSegment) -> Prepared:
    """``p`` with the twin's graph and weights (its index re-read, the sample's pinned shapes kept)."""
    index = graph.index_graph(twin.model)
    index = dataclasses.replace(index, shapes={**index.shapes, **p.index.shapes},
                                elem_types={**index.elem_types, **p.index.elem_types})
    return dataclasses.replace(p, skeleton=twin.model, weights=twin.weights, index=index)


def _named_by(found: Refinement, index) -> Refinement:
    """A refinement found in the float twin, its segment's op types read from the file (a DequantizeLinear is no
    Identity there)."""
    ops = {n.name: n.op_type for n in index.nodes}
    layer = dataclasses.replace(found.layer, segment_ops=tuple(ops.get(n, o) for n, o in
                                                                zip(found.layer.segment, found.layer.segment_ops)))
    return dataclasses.replace(found, layer=layer)


def _search(p: Prepared, runner: Runner, layer: LayerResult, references, model_feeds,
            ops: tuple[Activation, ...], compare) -> Refinement | None:
    """The refinement of ``layer`` in ``p``'s graph against PyTorch's ``ops``, or None."""
    seg = _Segment(p, runner, layer, references, model_feeds)
    produced = seg.produced()
    values = seg.values(produced)
    raw = inside.match_values(ops, values, produced)
    raw.update(inside.reordered_matches(ops, values, produced, raw, p.index))
    matched = inside.consistent(raw, produced, ops, p.index)
    within = set(produced)
    constant = _constant(p.index, produced)
    bad = [t for t in inside.bad_tensors(produced, matched, p.index, within, values) if t not in constant]
    entering = _entering_values(seg, ops, within)
    found = _confirm(seg, layer, _in_rows(_with_input_as_is(inside.candidates(bad, ops, values, matched, p.index,
                                                                       entering=entering), matched, p.index, values),
                                          matched, p.index, values), compare, values)
    refined = _refinement(p, layer, found, matched, values, references, compare, ops) if found else None
    if refined is not None and len(refined.layer.segment) <= SMALL_REGION and not _reshaped(found[0], values):
        return refined
    # a tensor may hold a value PyTorch has only reshaped (a weak match) because the layout op that was due
    # did nothing (a wrong shape constant, a permutation of equal axes): those are suspects too, and one of
    # them may hold the error that the bad tensors only confirmed far downstream (where its paths merge);
    # at equal size the suspect's region is preferred (its counterpart fits the tensor's own shape)
    strong = {t: m for t, m in matched.items() if m.strong}
    suspects = [t for t in inside.bad_tensors(produced, strong, p.index, within, values)
                if t not in bad and t not in constant]
    found = _confirm(seg, layer, _in_rows(inside.candidates(suspects, ops, values, strong, p.index, matched, entering),
                                          matched, p.index, values), compare, values) if suspects else None
    other = _refinement(p, layer, found, matched, values, references, compare, ops) if found else None
    if other is not None and (refined is None or len(other.layer.segment) <= len(refined.layer.segment)):
        return other
    if refined is None or len(refined.layer.segment) > SMALL_REGION:
        # no one value fed clears the output, or only one where two paths meet: more than one fault in the
        # segment, perhaps (two weights exchanged) — where PyTorch's values come back after the first of them
        found = _entering(seg, inside.candidates(bad, ops, values, matched, p.index, entering=entering), ops, values,
                          matched)
        first = _refinement(p, layer, found, matched, values, references, compare, ops) if found else None
        if first is not None and (refined is None or len(first.layer.segment) <= SMALL_REGION):
            refined = first
    return refined or _closed_region(seg, layer, bad, strong, values, compare, ops)


#: how many tensors computed from a fed candidate are read to see whether PyTorch's values come back after it
AFTER_TENSORS = 4


def _entering(seg: _Segment, candidates: list[inside.Candidate], ops, values, matched):
    """Where no single value fed clears the segment's output (a second fault further on: two layers' weights
    exchanged, with no module paired between them), the first candidate (nearest the right tensors) after which
    the tensors computed from it, wrong before, hold PyTorch's ops' values again: an error enters there.
    ``(candidate, value fed)`` or None."""
    index = seg.p.index
    for trial, c in enumerate(candidates):
        if trial >= MAX_TRIALS:
            return None
        after = [t for t in _computed_from(index, c.tensor, values) if t not in matched]
        if not after:
            continue
        fed = _in_layout(c, index, values[c.tensor].shape if c.tensor in values else None)
        try:
            now = seg.values(after, {c.tensor: fed})
        except Exception:  # noqa: BLE001 - a value ONNX Runtime will not take there is not the counterpart
            continue
        # PyTorch's values computed from the fed one (a tensor merely handing the fed value on proves nothing)
        back = {t: m for t, m in inside.match_values(ops, now, after).items()
                if m.op.index != c.op.index and c.op.index in inside.ancestors(m.op, ops)}
        if any(m.strong for m in back.values()) and len(back) * 2 >= len(after):
            return c, fed
    return None


def _computed_from(index, tensor: str, values) -> list[str]:
    """The first few floating-point tensors (graph order) the segment computes from ``tensor``."""
    out, frontier = [], [tensor]
    while frontier and len(out) < AFTER_TENSORS:
        t = frontier.pop(0)
        for c in index.consumers.get(t, ()):
            for o in index.nodes[c].outputs:
                if o in values and o not in out and values[o].dtype.kind == "f":
                    out.append(o)
                    frontier.append(o)
    return sorted(out[:AFTER_TENSORS], key=index.order_of)


def _closed_region(seg: _Segment, layer: LayerResult, bad: list[str], strong: dict[str, inside.Match], values,
                   compare, ops) -> Refinement | None:
    """Where no counterpart can be fed (the only op holding the wrong value is the segment's output itself: a
    projection PyTorch computes as one ``addmm`` while the file has a MatMul and an Add): the nodes computing
    the wrong tensors, when every tensor they read is right (an op's value, a constant or a fed input) and, fed
    those right values, they still compute the wrong output — the error enters there."""
    index = seg.p.index
    if not bad or layer.pair.tensor not in bad or any(index.elem_types.get(t) in HALF_TYPES for t in values):
        return None  # a half-precision segment's rounding is the precision rule's to trace, through its Casts
    nodes = sorted({index.producer[t] for t in bad if t in index.producer})
    known = set(bad) | set(strong) | set(seg.references) | set(index.graph_inputs)
    # an integer or boolean tensor holds no op's value to pair with: the node computing it from right tensors
    # belongs to the region (a float truncated through an int32 Cast and back, an index computed wrongly)
    inside_segment = set(layer.segment)
    while len(nodes) <= SMALL_REGION:
        more = {index.producer[i] for n in nodes for i in index.nodes[n].inputs
                if i and i not in known and not index.is_constant(i) and i in index.producer
                and index.nodes[index.producer[i]].name in inside_segment and not _floating(index, i, values)}
        if not more - set(nodes):
            break
        nodes = sorted(set(nodes) | more)
    reads = [i for n in nodes for i in index.nodes[n].inputs if i and i not in
             {o for m in nodes for o in index.nodes[m].outputs}]
    if len(nodes) > SMALL_REGION or len(nodes) >= len(layer.segment) or not all(
            i in known or index.is_constant(i) for i in reads):
        return None
    fed = {t: inside.file_value(m).astype(values[t].dtype, copy=False).reshape(values[t].shape)
           for t, m in strong.items() if m.perm is None and t in reads}
    out = seg.values([], fed)[layer.pair.tensor]
    local = compare(out, layer.pair.reference())
    if local.ok:
        return None
    refined = dataclasses.replace(layer, local=local, segment=tuple(index.nodes[n].name for n in nodes),
                                  segment_ops=tuple(index.nodes[n].op_type for n in nodes))
    return Refinement(refined, {**seg.references, **fed}, layer, ops)


def _floating(index, tensor: str, values) -> bool:
    """Whether ``tensor`` holds floating-point numbers (as the run computed it, else as the graph declares)."""
    if tensor in values:
        return values[tensor].dtype.kind == "f"
    elem = index.elem_types.get(tensor)
    if not elem:  # unknown (0 or absent): not known to hold integers
        return True
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).kind == "f"
    except (KeyError, TypeError, ValueError):  # a type numpy has no dtype for (a string, an 8-bit float)
        return elem in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2)


def _reshaped(c: inside.Candidate, values) -> bool:
    """Whether a confirmed counterpart took another shape than its tensor's: PyTorch's value fitted there only
    reshaped, and a suspect may name the layout op that went wrong more exactly (a Reshape to a wrong shape
    followed by a Transpose of axes of size 1)."""
    return tuple(c.op.value.shape) != tuple(values[c.tensor].shape)


def ops_around(p: Prepared, layer: LayerResult, references, cuts: dict[str, TensorPair],
               inputs: ModelInputs) -> tuple[Activation, ...]:
    """PyTorch's ops around ``layer``'s segment (one targeted forward), for a segment too small to narrow whose
    diagnosis needs an op's arguments (a functional clamp's bounds no module holds); () when none."""
    if p.loaded.module is None:
        return ()
    return _capture(p, layer, references, cuts, inputs)


def _capture(p: Prepared, layer: LayerResult, references, cuts: dict[str, TensorPair],
             inputs: ModelInputs) -> tuple[Activation, ...]:
    """PyTorch's ops between the segment's inputs and its output: the window opens when the earliest input
    activation's module call returns (at the start when the segment reads graph inputs) and closes when the
    output's module call returns (the forward itself, module '', for a model output)."""
    stops = frozenset(references)
    seg = set(layer.segment)
    boundary = {i for n in p.index.nodes if n.name in seg for i in n.inputs if i in stops}
    feeding = [cuts[t].activation for t in boundary if t in cuts and cuts[t].activation.module]
    first = min(feeding, key=lambda a: a.index, default=None)
    out = layer.pair.activation
    if out.op:
        return ()
    start = (first.module, first.call) if first is not None and first.index < out.index else None
    try:
        return dispatch.capture_window(p.loaded.module, inputs, start, (out.module, out.call), first_index=10 ** 9,
                                       budget=OP_BUDGET)
    except Exception:  # noqa: BLE001 - a model that will not run under a dispatch mode keeps its module-level answer
        return ()


def _constant(index, tensors: list[str]) -> set[str]:
    """The ``tensors`` (graph order) computed from initializers alone (a weight dequantized, transposed or
    cast): their error is a weight's, judged where an activation reads them, not by itself.  Values computed
    from Constant nodes only (position buckets, masks) stay activations: PyTorch computes them at run time."""
    out: set[str] = set()
    for t in tensors:
        node = index.node_of(t)
        if node is None or not node.inputs:
            continue
        sources = [i for i in node.inputs if i]
        weights = [i for i in sources if i in index.initializers or i in out]
        if weights and all(i in out or index.is_constant(i) for i in sources):
            out.add(t)
    return out


class _Segment:
    """The divergent segment cut out of the model, run on its own from the exact values at its inputs."""

    def __init__(self, p: Prepared, runner: Runner, layer: LayerResult, references, model_feeds):
        self.p, self.runner, self.layer = p, runner, layer
        self.references, self.model_feeds = references, model_feeds

    def produced(self) -> list[str]:
        """The tensors the segment's nodes compute, in graph order (not those held in a runtime's blocked layout:
        neither read against PyTorch's values nor fed them)."""
        names = set(self.layer.segment)
        return [t for n in self.p.index.nodes if n.name in names for t in n.outputs
                if t and not self.p.index.blocked_layout(t)]

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
        # an ONNX sequence comes back as a list: it holds no activation to pair, and is left out
        values = {t: v for t, v in self.runner.run_cut(sub, feeds, wanted, store).items() if isinstance(v, np.ndarray)}
        values.update({t: feeds[t] for t in tensors if t in feeds})
        return values

    def _boundary(self, t: str) -> np.ndarray:
        return self.references[t] if t in self.references else self.model_feeds[t]


def _confirm(seg: _Segment, layer: LayerResult, candidates: list[inside.Candidate], compare, values):
    """The first candidate (graph order, nearest first) whose PyTorch value, fed in place of the ONNX tensor,
    makes the segment's output agree: ``(candidate, value fed)``; None when none does within the budget."""
    reference = layer.pair.reference()
    sorted_before = sorted_upstream(seg.p.index, layer.pair.tensor)  # the output's rows may come in another order
    for trial, c in enumerate(_finite_first(candidates, values)):
        if trial >= MAX_TRIALS:
            return None
        fed = _in_layout(c, seg.p.index, values[c.tensor].shape if c.tensor in values else None)
        try:
            out = seg.values([], {c.tensor: fed})[layer.pair.tensor]
        except Exception:  # noqa: BLE001 - a value ONNX Runtime will not take there is not the counterpart
            continue
        if compare(out, reference).ok or sorted_before and _reordered_ok(out, reference, compare):
            return c, fed
    return None


def _finite_first(candidates: list[inside.Candidate], values) -> list[inside.Candidate]:
    """Each tensor's candidates with those holding infinities (or a mask's float minimum) where the tensor holds
    ordinary numbers last (stable): a mask
    PyTorch adds after the op the tensor stands for (attention scores, then their causal mask) makes a value that,
    fed there, also clears the output — the segment adds the mask again — but is not the tensor's counterpart."""
    ordinary: dict[str, np.ndarray | None] = {}

    def masked_where_finite(c: inside.Candidate) -> bool:
        mine = ordinary[c.tensor]
        if mine is None or c.op.value.size != mine.size or c.op.value.dtype.kind != "f":
            return False
        with np.errstate(invalid="ignore"):
            return bool(np.any(~(np.abs(c.op.value.reshape(-1)) < inside.EXTREME) & mine))
    out: list[inside.Candidate] = []
    i = 0
    while i < len(candidates) and len(out) < MAX_TRIALS:
        j = i
        while j < len(candidates) and candidates[j].tensor == candidates[i].tensor:
            j += 1
        v = values.get(candidates[i].tensor)
        with np.errstate(invalid="ignore"):
            ordinary[candidates[i].tensor] = None if v is None else np.abs(np.asarray(v).reshape(-1)) < inside.EXTREME
        out += sorted(candidates[i:j], key=masked_where_finite)
        i = j
    return out + candidates[i:]


def _reordered_ok(out: np.ndarray, reference: np.ndarray, compare) -> bool:
    """Whether the segment's output, computed after a sort, holds PyTorch's rows in the order the file's sort
    gives equal keys (see ``records.rows``)."""
    moved = rows_reordered(np.asarray(out), np.asarray(reference))
    return moved is not None and compare(moved, reference).ok


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
    value = inside.file_value(c)
    shape = None if c.own_shape else shape or index.shapes.get(c.tensor)
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
                      f"{op.module_type} of {op.module or '<model>'}, confirmed by re-running the segment", candidate.perm,
                      rows=candidate.rows)
    value = values[candidate.tensor]
    if any(p.index.elem_types.get(t) in HALF_TYPES for i in nodes for t in p.index.nodes[i].outputs):
        # the region computes in half precision itself: its rounding is the error it introduces, judged at
        # float32 like the float32 value PyTorch computes, not excused as float16's resolution
        value = np.asarray(value)
    # a tensor holding the op's elements in another shape (a Reshape to a wrong shape constant): the shape is the
    # error, as far apart as tensors of different sizes
    local = compare_module.shape_mismatch(value, op.value) if candidate.own_shape else compare(value, pair.reference())
    if local.ok and layer.local is not None and not layer.local.ok:
        # a region computing its op within the tolerance introduces no error the segment's own exceeds it by:
        # the value fed there cleared the output by making up for a fault downstream (float16 sums rounded)
        return None
    moved = None if candidate.own_shape or not sorted_upstream(p.index, candidate.tensor) else rows_reordered(
        np.asarray(value), pair.reference())
    if moved is not None and compare(moved, pair.reference()).ok:
        return None  # PyTorch's rows in the order the file's sort gives them (ties): no error of the region's
    refined = LayerResult(pair=pair, diff=None, local=local, status=Status.DIVERGED, origin=ErrorOrigin.INTRODUCED,
                          segment=tuple(p.index.nodes[i].name for i in nodes),
                          segment_ops=tuple(p.index.nodes[i].op_type for i in nodes),
                          order=float(p.index.order_of(candidate.tensor)))
    cut = dict(references)
    inside_region = {t for i in nodes for t in p.index.nodes[i].outputs}
    for t, m in strong.items():
        if t in inside_region:
            continue  # a value the region computes (a Transpose it reaches back past) is not fed
        value = inside.file_value(m)  # in the tensor's layout (transposed, its rows in the file's order)
        cut[t] = np.ascontiguousarray(value.astype(values[t].dtype, copy=False).reshape(values[t].shape))
    return Refinement(refined, cut, layer, ops)
