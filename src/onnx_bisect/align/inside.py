"""Name-free alignment inside a divergent segment: PyTorch's ops paired with the segment's ONNX tensors by value.

The segment is run with every tensor it computes exposed, fed the exact
PyTorch values at its inputs.  Upstream of a fault its tensors then equal the
outputs of PyTorch's ops within float noise; downstream of it, nothing does.
So, without a single name or scope:

* **good** tensors hold an op's value (a *strong* match when the shapes agree
  too; a tensor that only holds the right numbers in another shape is *weak* —
  a wrong Reshape target produces exactly that);
* **bad** tensors hold no op's value and feed no good tensor (a decomposition's
  intermediate, an erf-GELU's ``x/√2``, has no counterpart but feeds a good
  tensor, so it is not bad);
* each bad tensor gets the op outputs that could be its counterpart: same
  number of elements, nearest in value or direction, not matched elsewhere.

Which candidate is right is then decided by running the segment (see
:mod:`onnx_bisect.pipeline.refine`): feeding PyTorch's value at the right one
removes the error downstream of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..records import Activation
from ..records.graph import CARRIER_OPS, INTEGER_TYPES, PRODUCT_OPS, SORTING_OPS, GraphIndex
from ..records.rows import in_order, row_order, row_width
from ..records.nest import informative
from .similarity import float_noise, kind, laid_out, nearness, perms

#: counterparts tried per bad tensor
CANDIDATES_PER_TENSOR = 3


@dataclass(frozen=True)
class Match:
    """An ONNX tensor holding an op's value: ``strong`` when its shape is the op output's too.  ``equal`` are all
    the ops holding that value (a view and its source, say), ``op`` first among them."""

    tensor: str
    op: Activation
    strong: bool
    perm: tuple[int, ...] | None = None  # the tensor holds the op's value transposed (an exporter's layout)
    equal: tuple[Activation, ...] = ()
    rows: tuple[int, ...] | None = None  # the tensor holds the op's rows in another order (records.rows.row_order)


@dataclass(frozen=True)
class Candidate:
    """A bad tensor and an op output that may be its counterpart, with how near their values are."""

    tensor: str
    op: Activation
    nearness: float
    perm: tuple[int, ...] | None = None
    own_shape: bool = False  # fed in the op's shape, not the tensor's (the tensor's shape is what is wrong)
    rows: tuple[int, ...] | None = None  # fed with the op's rows in this order (the file's, after a sort)


def match_values(ops: tuple[Activation, ...], values: dict[str, np.ndarray], tensors: list[str]) -> dict[str, Match]:
    """Each of ``tensors`` (floating point, in graph order) that holds an op's value within float noise.

    A tensor of the op output's shape must hold it as is; a tensor of another
    shape may hold it reshaped, or transposed (an exporter's layout) — a weak match.
    """
    by_size: dict[int, list[Activation]] = {}
    for a in ops:
        if kind(a.value) == "f" and a.value.size:
            by_size.setdefault(a.value.size, []).append(a)
    found: dict[str, Match] = {}
    for t in tensors:
        v = values.get(t)
        if v is None or kind(v) != "f" or not v.size:
            continue
        match = _exact(v, t, by_size.get(v.size, ()))
        if match is not None:
            found[t] = match
    return found


def reordered_matches(ops: tuple[Activation, ...], values: dict[str, np.ndarray], tensors: list[str],
                      matched: dict[str, Match], graph: GraphIndex) -> dict[str, Match]:
    """Tensors no op's value is held by as is, computed after a sort (an exported sort is a TopK), that hold an op's rows
    in another order within float noise — the order the file's sort gives equal keys (tokens sorted by expert),
    carried on by what is computed from it.  Each with the order of its rows.

    An order must come from the sort: taken by a gather reading the sort's indices, or handed on — kept by an op
    computing row by row, cut into chunks by a Split or a Slice (each chunk's rows in their own order), joined by a
    Concat.  Rows put in another order
    later (a Gather rolling them) are no sort's, and stay unmatched."""
    found: dict[str, Match] = {}
    after = _after_sort(graph)
    for t in tensors:
        v = values.get(t)
        if t in matched or v is None or kind(v) != "f" or v.size < 2 or t not in after:
            continue
        known = {**matched, **found}
        orders = _handed_on_orders(t, v, graph, known, values)
        chunk = _chunk_of_reordered(t, v, graph, known, values)
        own = chunk or _reads_sort(graph, t)
        sums = np.sort(np.asarray(v, np.float64).reshape(-1, row_width(v)).sum(1))
        for a in ops:
            if kind(a.value) != "f" or a.value.shape != v.shape or not informative(a.value):
                continue
            rows = next((o for o in orders if len(o) * row_width(v) == v.size
                         and close(v, in_order(a.value, o), float_noise(v))), None)
            if rows is None and own and np.allclose(
                    sums, np.sort(np.asarray(a.value, np.float64).reshape(-1, row_width(v)).sum(1)),
                    rtol=1e-3, atol=1e-5 * (1 + float(np.abs(sums).max(initial=0)))):
                order = row_order(v, a.value, any_order=chunk)
                rows = tuple(int(i) for i in order) if order is not None and close(
                    v, in_order(a.value, order), float_noise(v)) else None
            if rows is not None:
                found[t] = Match(t, a, True, None, (a,), rows)
                break
    return found


def _after_sort(graph: GraphIndex) -> set[str]:
    """Every tensor computed from a sorting op's output (empty in a graph without one): one walk down the graph."""
    frontier = [o for n in graph.nodes if n.op_type in SORTING_OPS for o in n.outputs if o]
    seen = set(frontier)
    while frontier:
        for i in graph.consumers.get(frontier.pop(), ()):
            for o in graph.nodes[i].outputs:
                if o and o not in seen:
                    seen.add(o)
                    frontier.append(o)
    return seen


def _handed_on_orders(tensor: str, v: np.ndarray, graph: GraphIndex, matched: dict[str, Match],
                      values: dict[str, np.ndarray]) -> list[tuple[int, ...]]:
    """The row orders ``tensor``'s node may have kept from its inputs' reordered rows: an input's own (an op
    computing row by row), the inputs' joined (a Concat of them)."""
    node = graph.node_of(tensor)
    if node is None:
        return []
    inputs = [(i, matched[i]) for i in node.inputs if i in matched]
    orders = [m.rows for _, m in inputs if m.rows is not None]
    width, count = row_width(v), v.size // row_width(v)
    if node.op_type == "Concat" and inputs and len(inputs) == len([i for i in node.inputs if i]):
        joined, offset = [], 0
        for i, m in inputs:
            n = values[i].size // width if i in values else 0
            part = m.rows if m.rows is not None else tuple(range(n))
            if len(part) != n:
                joined = []
                break
            joined += [offset + r for r in part]
            offset += n
        if joined and len(joined) == count:
            orders.append(tuple(joined))
    return orders


#: nodes walked up from a gather's indices to the sort they come from (a floor division written out in floats)
SORT_HOPS = 12


def _chunk_of_reordered(tensor: str, v: np.ndarray, graph: GraphIndex, matched: dict[str, Match],
                        values: dict[str, np.ndarray]) -> bool:
    """Whether ``tensor`` is cut by a Split or a Slice from a tensor holding reordered rows: one expert's chunk of
    the sorted tokens, in the order the sort left them — read from the chunk itself (equal rows, a token routed to
    two experts, make the parent's order say nothing of which copy went where), and in any order (two tokens of
    one expert exchanged are a reversal)."""
    node = graph.node_of(tensor)
    if node is None or node.op_type not in ("Split", "Slice") or not node.inputs:
        return False
    m, parent = matched.get(node.inputs[0]), values.get(node.inputs[0])
    return m is not None and m.rows is not None and parent is not None and row_width(parent) == row_width(v)


def _reads_sort(graph: GraphIndex, tensor: str) -> bool:
    """Whether ``tensor``'s node reads indices computed from a sort's output (a gather by the sorted indices, or by
    the tokens they index, divided out), a few nodes up."""
    node = graph.node_of(tensor)
    if node is None:
        return False
    frontier = [i for i in node.inputs if i and graph.elem_types.get(i) in INTEGER_TYPES]
    seen: set[str] = set()
    while frontier and len(seen) < SORT_HOPS:
        t = frontier.pop(0)
        if t in seen:
            continue
        seen.add(t)
        producer = graph.node_of(t)
        if producer is None:
            continue
        if producer.op_type in SORTING_OPS:
            return True
        frontier += [i for i in producer.inputs if i]
    return False


def file_value(match: "Match | Candidate") -> np.ndarray:
    """The op's value laid out as the file holds it: transposed by the match's permutation, its rows in the
    file's order."""
    value = match.op.value if match.perm is None else match.op.value.transpose(match.perm)
    return value if match.rows is None else in_order(value, match.rows)


def _exact(v: np.ndarray, tensor: str, ops) -> Match | None:
    """The ops whose value ``v`` holds within float noise: of the same shape first, then reshaped or transposed."""
    rtol = float_noise(v)
    strong, weak = [], []
    for a in ops:
        ref = a.value
        if ref.shape == v.shape:
            if close(v, ref, rtol):
                strong.append((a, None))
            continue
        # only the same elements in the same order: inside a block of square matrices a transposed copy of
        # one value is often another value PyTorch also has (k^T for k), which says nothing
        if close(v.reshape(ref.shape), ref, rtol):
            weak.append((a, None))
    found = strong + weak
    if not found:
        return None
    (first, perm), equal = found[0], tuple(a for a, _ in found)
    return Match(tensor, first, bool(strong), perm, equal)


def consistent(matched: dict[str, Match], tensors: list[str], ops: tuple[Activation, ...],
               graph: GraphIndex) -> dict[str, Match]:
    """The matches that respect the order of computation.

    When a tensor's match is not computed (in PyTorch) from the match of a
    tensor it is computed from (in ONNX), one of them only holds a value PyTorch
    has elsewhere — a Transpose that produced ``k^T`` where ``k`` was due, whose
    consumer then turns it back into a ``k`` PyTorch also has: both are dropped,
    and so is every match computed from a dropped one.
    """
    lineage = {a.index: ancestors(a, ops) for a in ops}
    within = set(tensors)
    # an Identity's output holding its input's match is a second name for one value: the input stands for it, so
    # the node stays inside the segment after it (where it should have computed something, a dropped op shows)
    aliases = {t for t in matched if _alias(t, matched, graph)}
    matched = {t: m for t, m in matched.items() if t not in aliases and not _handed_on(t, aliases, matched, graph)}
    twins = _twins(matched, graph)
    matched = {t: m for t, m in matched.items() if t not in twins}
    good = dict(matched)
    # a value that is one number repeated (zeros for an initial state, a mask of ones) matches every op holding
    # it: which one it stands for is a guess, and a guess must not drop the matches computed from it
    vague = {t for t, m in matched.items() if not _informative(m.op.value)}
    upstream = {t: _matched_ancestors(t, matched, graph, within) - vague
                for t in tensors if t in matched}  # fixed
    nothing = {t for t in list(good) if t not in vague and _did_nothing(t, upstream[t], good, graph, lineage)}
    for t in nothing:
        del good[t]
    # a node that computed nothing hands its input's value on: what is computed from it is computed from that
    # input (a softmax's NaN guard, a Where that kept every entry), and stays matched when it holds PyTorch's
    for t in upstream:
        if upstream[t] & nothing:
            upstream[t] = (upstream[t] - nothing) | {i for n in upstream[t] & nothing for i in upstream[n]}
    changed = True
    while changed:
        changed = False
        for t in tensors:
            if t not in good or t in vague:
                continue
            ins = upstream[t]
            if any(i not in good for i in ins):
                del good[t]
                changed = True
                continue
            for i in ins:
                if not _ordered(good[i], good[t], lineage):
                    for s in _same_value_chain(i, good, graph, within):
                        good.pop(s, None)
                    del good[t]
                    changed = True
                    break
    return good


#: ops that hand their input's numbers on (laid out, selected, cast): their output holding them is no sign
LAYOUT_OPS = frozenset({"Identity", "Reshape", "Transpose", "Cast", "Squeeze", "Unsqueeze", "Flatten", "Expand",
                        "Dropout", "Slice", "Concat", "Split", "Gather", "Tile", "Pad", "DequantizeLinear",
                        "QuantizeLinear", "CastLike", "Relu", "Clip", "Abs", "Max", "Min"})


#: PyTorch ops that hand a value on unchanged (views, copies): holding it later computes nothing
TORCH_VIEWS = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.squeeze",
                         "aten.unsqueeze", "aten.permute", "aten.transpose", "aten.t", "aten.clone", "aten.alias",
                         "aten.contiguous", "aten.detach", "aten.flatten", "aten.unflatten", "aten.slice",
                         "aten.select", "aten.split", "aten.chunk", "aten.split_with_sizes", "aten.unbind",
                         "aten._to_copy", "aten.lift_fresh", "aten.dropout"})


#: ops that hand a tensor on as it is (a cast to the type it has): an output of theirs holding what their input holds
#: is an alias
ALIASING = frozenset({"Identity", "Cast", "CastLike"})


def _twins(matched: dict[str, Match], graph: GraphIndex) -> set[str]:
    """Tensors two or more nodes compute alike (one op type on the same inputs) and that hold one op's value: a
    file computing the same thing twice where PyTorch computes two things (a rotary table's ``sin`` made a second
    ``cos``) — which of PyTorch's values each stands for is a guess, so neither is a match."""
    groups: dict[tuple, list[str]] = {}
    for t, m in matched.items():
        node = graph.node_of(t)
        if node is not None and node.op_type not in LAYOUT_OPS and node.inputs:
            key = (node.op_type, node.domain, tuple(node.inputs), repr(node.attributes), m.op.index)
            groups.setdefault(key, []).append(t)
    found = set()
    for ts in groups.values():
        computed = [a for a in matched[ts[0]].equal or (matched[ts[0]].op,) if base_op(a.module_type) not in TORCH_VIEWS]
        # PyTorch computing the value as often as the file does (an exporter keeping a repeated cos) is no twin
        if len({graph.producer.get(t) for t in ts}) > 1 and len(computed) < len(ts):
            found.update(ts)
    return found


def _alias(tensor: str, matched: dict[str, Match], graph: GraphIndex) -> bool:
    """Whether ``tensor`` comes out of Identity / Cast nodes holding the same PyTorch values as the matched tensor
    they hand on (the nearest one up their chain) — or handing on a tensor no match here names (computed before the
    segment, a constant): a second name for a value computed elsewhere, never where the segment starts."""
    node, source = graph.node_of(tensor), tensor
    for _ in range(4):
        if node is None or node.op_type not in ALIASING or not node.inputs:
            break
        if node.op_type != "Identity" and graph.elem_types.get(node.inputs[0]) != graph.elem_types.get(node.outputs[0]):
            return False  # a cast that changes the precision computes something (float16 files)
        source = node.inputs[0]
        if source in matched:
            break
        node = graph.node_of(source)
    if source == tensor:
        return False  # no Identity / Cast computes it
    if source not in matched:
        return True
    mine, theirs = matched[tensor], matched[source]
    return {a.index for a in mine.equal or (mine.op,)} <= {a.index for a in theirs.equal or (theirs.op,)}


def _handed_on(tensor: str, aliases: set[str], matched: dict[str, Match], graph: GraphIndex) -> bool:
    """Whether ``tensor`` holds the same PyTorch value as an alias it is computed from through nodes that only hand
    a value on (:data:`HANDING_ON`) (an Identity's output reshaped and concatenated with nothing, a key cache left empty): one more
    name for that value."""
    node, seen = graph.node_of(tensor), 0
    while node is not None and seen < 6 and node.op_type in HANDING_ON:
        source = next((i for i in node.inputs if i in matched or i in aliases), None)
        if source is None:
            return False
        if source in aliases:
            return {a.index for a in matched[tensor].equal or (matched[tensor].op,)} \
                <= {a.index for a in matched[source].equal or (matched[source].op,)}
        node, seen = graph.node_of(source), seen + 1
    return False


#: nodes that hand a value on unchanged: in another layout, broadcast, or concatenated with nothing
HANDING_ON = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Concat"})


def _did_nothing(tensor: str, inputs: set[str], good: dict[str, Match], graph: GraphIndex,
                 lineage: dict[int, set[int]]) -> bool:
    """Whether ``tensor``, computed by an arithmetic node from a matched input, holds that input's very value
    while no PyTorch op computed after the input's holds it: the node computed nothing where PyTorch's
    counterpart did something (a Pow's exponent 2 made 1) — its match is PyTorch's value of the input, and
    the tensor is where the divergence starts."""
    node = graph.node_of(tensor)
    if node is None or node.op_type in LAYOUT_OPS or len(inputs) != 1:
        return False
    (i,) = inputs
    if i not in good or i not in (node.inputs or ()):
        return False
    mine, theirs = good[tensor], good[i]
    # a later op holding the value that computes something (a zero bias added in PyTorch too), not a view of it
    later = [a for a in mine.equal or (mine.op,) if base_op(a.module_type) not in TORCH_VIEWS
             and any(b.index in lineage[a.index] for b in theirs.equal or (theirs.op,))]
    same = {a.index for a in mine.equal or (mine.op,)} <= {b.index for b in theirs.equal or (theirs.op,)}
    return same and not later


def _same_value_chain(tensor: str, good: dict[str, Match], graph: GraphIndex, within: set[str]) -> set[str]:
    """``tensor`` and the matched tensors it is a copy or reshape of (they hold one of the same ops' values):
    where a wrong value was made, not only where it was found out of order."""
    ops = {a.index for a in good[tensor].equal}
    chain, stack = {tensor}, [tensor]
    while stack:
        for i in _matched_ancestors(stack.pop(), good, graph, within):
            if i not in chain and ops & {a.index for a in good[i].equal}:
                chain.add(i)
                stack.append(i)
    return chain


#: ops whose output is a property of their input's shape, not of its values: a value computed through them
#: (a causal mask sized by the query) is not computed from that input in PyTorch's sense
SHAPE_ONLY = frozenset({"Shape", "Size"})


def _matched_ancestors(tensor: str, matched: dict[str, Match], graph: GraphIndex, within: set[str]) -> set[str]:
    """The nearest matched tensors ``tensor`` is computed from inside the segment (through unmatched ones, not
    through the input of a Shape: its values are not read; nor through integers — sizes, indices —, which PyTorch
    may carry as Python numbers, out of its ops' data flow: a split's sizes summed from a one-hot by
    ``.tolist()``)."""
    found, seen = set(), set()
    stack = [tensor]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in matched and t != tensor:
            found.add(t)
            continue
        if t != tensor and graph.elem_types.get(t) in INTEGER_TYPES:
            continue
        producer = graph.node_of(t)
        if producer is not None and producer.op_type not in SHAPE_ONLY:
            stack.extend(i for i in producer.inputs if i in within)
    return found


def _ordered(before: Match, after: Match, lineage: dict[int, set[int]]) -> bool:
    """Whether some op holding ``before``'s value is (or precedes) some op holding ``after``'s."""
    return any(b.index == a.index or b.index in lineage[a.index] for b in before.equal or (before.op,)
               for a in after.equal or (after.op,))


#: magnitudes beyond this are masks (``finfo.min`` added before a softmax), not values: equal on both sides,
#: they would swamp any norm
EXTREME = 1e30


def close(v: np.ndarray, ref: np.ndarray, rtol: float) -> bool:
    """Element by element within float noise: ``|v − ref| ≤ rtol·(|ref| + typical |ref|)``.

    Judged elementwise, not by a norm: a scores tensor whose masked entries hold
    −3.4e38 on both sides would otherwise hide a wrong scale on every other entry.
    """
    with np.errstate(all="ignore"):
        a, b = np.asarray(v, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if same.all():
            return True
        ordinary = np.isfinite(b) & (np.abs(b) < EXTREME)
        typical = float(np.median(np.abs(b[ordinary]))) if ordinary.any() else 0.0
        err = np.abs(a - b)
        return bool(np.all(same | (err <= rtol * (np.abs(b) + typical + 1e-30))))


def bad_tensors(tensors: list[str], matched: dict[str, Match], graph: GraphIndex, within: set[str],
                values: dict[str, np.ndarray]) -> list[str]:
    """The floating-point ``tensors`` (graph order) that hold no op's value and feed no tensor that does,
    inside the tensors ``within`` (the segment's) — through their values: a Shape reads none (a causal mask built
    from a wrong tensor's shape holds PyTorch's mask).  A match whose value is one number repeated (a Softmax
    over an axis of size 1, a mask of ones) says nothing of the values it was computed from: it is no bad
    tensor itself, but it vouches for none of its producers."""
    feeds_good: set[str] = set()
    for t in reversed(tensors):  # reverse graph order: consumers before producers
        if (t in matched and _informative(values.get(t))) or any(
                o in feeds_good for i in graph.consumers.get(t, ()) if graph.nodes[i].op_type not in SHAPE_ONLY
                for o in graph.nodes[i].outputs if o in within):
            feeds_good.add(t)
    return [t for t in tensors if t not in feeds_good and t not in matched and t in values and kind(values[t]) == "f"]


def _informative(value: np.ndarray | None) -> bool:
    """Whether a value holds more than one distinct number (an unknown value counts as informative)."""
    return value is None or informative(value)


def candidates(bad: list[str], ops: tuple[Activation, ...], values: dict[str, np.ndarray],
               matched: dict[str, Match], graph: GraphIndex,
               held: dict[str, Match] | None = None, entering: dict[str, Match] | None = None) -> list[Candidate]:
    """For each bad tensor (in graph order), the op outputs that may be its counterpart: as many elements, not
    the value of a good tensor; first those reading most of the values its node reads (the same data flow),
    then those holding the same elements in another order (what a wrong permutation or shape makes of the
    right value), then the nearest (in value or in direction: a wrong scale keeps the direction, a wrong
    axis keeps neither).  ``held``: a weak match of a bad tensor, whose ops (the value it holds) are no
    counterpart of it.  ``entering``: the segment's inputs that hold an op's value (PyTorch's own, fed there),
    read as matches are for the data flow."""
    taken = {id(m.op) for m in matched.values()}
    known = {**(entering or {}), **matched}
    lineage = {a.index: ancestors(a, ops) for a in ops}
    direct = {a.index: read_values(a, ops) for a in ops}
    elements: dict[int, np.ndarray] = {}  # op index -> its sorted elements, sorted once
    out: list[Candidate] = []
    proposed: dict[str, Activation] = {}  # product node -> the op the data flow proposed for it
    for t in bad:
        v = values[t]
        node = graph.node_of(t)
        read = _read_ops(node, graph, known)
        mine = _sorted_elements(v)
        scored = []
        same = {id(a) for a in held[t].equal} if held and t in held else set()
        if same:
            # the right elements in the right order, perhaps in the wrong shape (a Reshape to a wrong shape
            # constant): the ops' values in their own shapes (latest first) are the first counterparts to try
            shapes = {}
            for a in sorted(held[t].equal, key=lambda a: -a.index):
                shapes.setdefault(tuple(a.value.shape), a)
            out += [Candidate(t, a, 0.0, None, own_shape=True) for shape, a in shapes.items() if shape != v.shape]
        handed = _carried_op(t, graph, matched)
        if handed is not None and handed.value.size == v.size and kind(handed.value) == "f":
            # a node handing its input on (a Q/DQ pair, a Cast) computes nothing of its own: its counterpart is
            # the op its input holds, though that op is taken — another op's value that also clears the output
            # (a row-scaled sum fed to a scale-blind norm) is no counterpart of it
            out.append(Candidate(t, handed, _nearness(v.reshape(handed.value.shape), handed.value), None))
        for a in ops:
            if id(a) in taken or id(a) in same or a.value.size != v.size or kind(a.value) != "f" or a is handed:
                continue
            near, perm = _nearest_layout(v, a)
            scored.append((-len(read & direct[a.index]), -len(read & lineage[a.index]),
                           not _same_elements(mine, elements, a), near, perm, a))
        scored.sort(key=lambda c: c[:4])
        product = _product_counterpart(v, node, graph, ops, taken, proposed) if not read else None
        if product is not None:  # a product computing from a value none of the segment's matches names (its
            # input is the segment's own): PyTorch's first product of that size no tensor holds, whatever its value
            scored = [c for c in scored if c[-1] is not product]
            near, perm = _nearest_layout(v, product)
            scored.insert(0, (0, 0, True, near, perm, product))
        for _, _, _, near, perm, a in scored[:CANDIDATES_PER_TENSOR]:
            # a wrong value says little about its layout: the elements in order first, the nearest layout next
            if perm is not None:
                out.append(Candidate(t, a, _nearness(v.reshape(a.value.shape), a.value), None))
            out.append(Candidate(t, a, near, perm))
    return out


def _carried_op(tensor: str, graph: GraphIndex, matched: dict[str, Match]) -> Activation | None:
    """The op whose value ``tensor`` holds in PyTorch when the nodes computing it only hand on a tensor matched
    with it (strongly): through a DequantizeLinear of a QuantizeLinear, Casts, Identities."""
    source = graph.carried_from(tensor, through=CARRIER_OPS)  # a quantizer's pair rounds, a Cast retypes
    m = matched.get(source) if source != tensor else None
    return m.op if m is not None and m.strong else None


#: how many nodes with a constant operand (a weight, a bias, a scale) are walked up to find the values a bad
#: tensor's computation reads: a bias Add reads a product's output, which reads the layer's input
READ_HOPS = 3


def _read_ops(node, graph: GraphIndex, known: dict[str, Match]) -> set[int]:
    """The ops whose values ``node`` computes from: those its inputs hold, and where an input holds none (another
    bad tensor), those read by the node computing it when that node's other operands are constants (a bias Add
    after a product, the product after its input), a few such nodes up."""
    read: set[int] = set()
    for _ in range(READ_HOPS):
        if node is None:
            break
        computed = [i for i in node.inputs if i and not graph.is_constant(i)]
        read |= {known[i].op.index for i in computed if i in known}
        if read or len(computed) != 1:
            break
        node = graph.node_of(computed[0])
    return read


def _product_counterpart(v: np.ndarray, node, graph: GraphIndex, ops, taken: set[int],
                         proposed: dict[str, Activation]) -> Activation | None:
    """For a product node with a constant weight (or the bias Add after it) whose inputs no match names, PyTorch's
    first op of its output's size that read a parameter, no tensor holds and no other product was given (one op
    per product node, in order): a weight holding other numbers (another layer's) leaves a value near nothing, so
    nearness cannot find its counterpart — the data flow can.  ``proposed`` is filled as products are given."""
    if node is not None and node.op_type == "Add" and any(graph.is_constant(i) for i in node.inputs):
        node = next((graph.node_of(i) for i in node.inputs if not graph.is_constant(i)), None)  # a bias added after
    if node is None or node.op_type not in PRODUCT_OPS or not any(graph.is_constant(i) for i in node.inputs[1:2]):
        return None
    if node.name in proposed:
        return proposed[node.name] if proposed[node.name].value.size == v.size else None
    given = {id(a) for a in proposed.values()}
    found = next((a for a in ops if a.params and id(a) not in taken and id(a) not in given and a.value.size == v.size
                  and kind(a.value) == "f"), None)
    if found is not None:
        proposed[node.name] = found
    return found


def _sorted_elements(v: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(v, np.float64).ravel())


def _same_elements(mine: np.ndarray, elements: dict[int, np.ndarray], a: Activation) -> bool:
    """Whether op ``a`` holds the (sorted) elements ``mine`` in some order, within float noise (``elements``:
    the ops' sorted elements, filled as they are needed)."""
    if a.index not in elements:
        elements[a.index] = _sorted_elements(a.value)
    other = elements[a.index]
    return bool(np.all(mine == other)) or close(mine, other, float_noise(a.value))


def _nearest_layout(v: np.ndarray, a: Activation) -> tuple[float, tuple[int, ...] | None]:
    """``(nearness, perm)``: the op value as is when the shapes agree, else its nearest layout."""
    ref = a.value
    if ref.shape == v.shape:
        return _nearness(v, ref), None
    best = (float("inf"), None)
    for perm in perms(ref, v):
        r = laid_out(ref, perm)
        near = _nearness(v.reshape(r.shape), r)
        if near < best[0]:
            best = (near, perm)
    return best


def _nearness(v: np.ndarray, ref: np.ndarray) -> float:
    """:func:`~.similarity.nearness` over the ordinary entries (masks left out)."""
    keep = np.isfinite(ref) & (np.abs(ref) < EXTREME) & np.isfinite(v)
    if not keep.any():
        return float("inf")
    with np.errstate(all="ignore"):
        near = nearness(np.asarray(v)[keep], np.asarray(ref)[keep]) if not keep.all() else nearness(v, ref)
    return near if np.isfinite(near) else float("inf")


#: ATen ops that hand their input's elements on in the same order (a view, an expansion, a copy)
REORDER_FREE = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten._reshape_alias", "aten.expand",
                          "aten.unsqueeze", "aten.squeeze", "aten.alias", "aten.contiguous", "aten.clone",
                          "aten.flatten", "aten.unflatten", "aten.detach", "aten._to_copy"})


def base_op(name: str) -> str:
    """``aten._softmax`` for ``aten._softmax.default``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else name


def read_values(op: Activation, ops: tuple[Activation, ...]) -> set[int]:
    """The op activations whose value ``op`` reads: its inputs, and what they are views or copies of."""
    return _walk_inputs(op, ops, lambda a: base_op(a.module_type) in REORDER_FREE)


def ancestors(op: Activation, ops: tuple[Activation, ...]) -> set[int]:
    """Every op activation ``op`` is computed from."""
    return _walk_inputs(op, ops, lambda a: True)


def _walk_inputs(op: Activation, ops: tuple[Activation, ...], through) -> set[int]:
    """The op activations reached from ``op``'s inputs, walking on past those for which ``through`` holds."""
    by_index = {a.index: a for a in ops}
    seen: set[int] = set()
    stack = list(op.inputs)
    while stack:
        i = stack.pop()
        if i in seen or i not in by_index:
            continue
        seen.add(i)
        if through(by_index[i]):
            stack.extend(by_index[i].inputs)
    return seen
