"""Structural matching for the align stage: the same numbers, wherever the graph computes them.

A PyTorch activation without a scope pair takes the ONNX tensor holding its
elements (up to a reshape or an axis permutation) after the tensors of its
inputs in graph order, confirmed by value.  In a graph without scope
information whose outputs diverge, values downstream of a fault equal nothing,
so :func:`pair_loosely` pairs by nearness instead (see its docstring).
"""
from __future__ import annotations

import bisect

import numpy as np

from ..records import Activation, Capture, MatchMethod, ModuleKind, TensorPair
from ..records.graph import GraphIndex
from .similarity import PLAIN_FACTOR, STRUCTURE_MAX_REL, distance, kind, laid_out, nearness, perms
from .state import AlignInputs, AlignmentState, Claim, shared_pair

#: a candidate farther than this on a sample of its elements is not compared in full
SCREEN_MAX_REL = 1e-2
SCREEN_SAMPLE = 256
#: loose pairs (outputs diverging, no scopes): within this distance, and this many times nearer than the next
LOOSE_MAX_REL = 0.5
LOOSE_MARGIN = 2.0
LOOSE_CANDIDATES = 12  # distinct values of same-sized tensors after an activation's inputs a loose pair may take
LOOSE_REACH = 3 * LOOSE_CANDIDATES  # same-sized tensors after its inputs that hold them, at most
LOOSE_FINALISTS = 3  # of them, those nearest on a sample, measured in full
#: graph outputs this far (relative L2) from the model's: beyond float32 noise, so a fault lies somewhere
LOOSE_GATE_REL = 1e-5
LOOSE_CONFIDENCE = 0.9  # enough to cut there: the segment after a fault is then measured on its own


def reaches(acts, graph: GraphIndex, pairs) -> dict[int, int]:
    """The latest graph position among the tensors of each activation and of the
    activations it consumed, directly or not (``pairs``: anything with ``get``)."""
    reach: dict[int, int] = {}
    for a in acts:
        p = pairs.get(a.index)
        own = graph.order_of(p.tensor) if p is not None and p.tensor in graph.producer else -1
        reach[a.index] = max([own] + [reach.get(i, -1) for i in a.inputs])
    return reach


def lower_bound(a: Activation, reach: dict[int, int]) -> int:
    """Graph position a tensor holding ``a`` must come after: where its inputs were computed."""
    return max((reach.get(i, -1) for i in a.inputs), default=-1)


def leaf_tensors(pairs) -> set[str]:
    """Tensors already holding a leaf module's value (a container's claim does not block a leaf); ``pairs``
    is anything with ``values()`` (a state's pairs, a draft)."""
    return {p.tensor for p in pairs.values() if p.tensor and p.activation.is_leaf and p.activation.module}


def signatures_of(graph: GraphIndex, values) -> dict[str, tuple[int, float, float] | None]:
    """The permutation-invariant signature (size, sum, sum of squares) of every computed tensor."""
    return {t: _signature(v) for t, v in values.items() if t in graph.producer}


def pair_by_structure(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Same elements (up to a reshape or transpose), after the tensors of earlier
    activations in graph order, confirmed by value.

    The signatures (:func:`signatures_of`) filter the candidates, so only
    tensors that can hold the same numbers are compared.
    """
    acts, graph, values, signatures = x.acts, x.graph, x.values, x.signatures
    draft = state.draft()
    taken = leaf_tensors(draft)
    buckets = _buckets(graph, values, signatures)
    by_value = {id(p.activation.value): p for p in draft.values() if p.tensor is not None}
    # ``reach[i]``: the latest graph position among the tensors of activation i and of
    # the activations it consumed, directly or not.  A structural match must come
    # after what its own inputs came from, not after unrelated branches that the
    # ONNX graph happens to schedule later.
    reach: dict[int, int] = {}
    for a in acts:
        if a.index not in draft and id(a.value) in by_value:
            draft.claim(shared_pair(a, by_value[id(a.value)]))  # a container returning its child's tensor
        elif a.index not in draft and a.value.size:
            lo = lower_bound(a, reach)
            sig = _signature(a.value)
            leaf = a.is_leaf and bool(a.module)
            candidates = [t for t in _same_numbers(buckets, a.value.size, sig, lo)
                          if (a.passthrough or not leaf or t not in taken) and kind(values[t]) == kind(a.value)]
            found = _best_layout(a.value, candidates, values, signatures)
            if found is not None:
                tensor, perm, rel = found
                # Position alone proves nothing: a structural pair must agree in value,
                # or a wrongly paired tensor would show up as a divergence.
                layout = "" if perm is None else f", transposed {list(perm)}"
                pair = TensorPair(
                    a, tensor, graph.node_of(tensor).name, graph.node_of(tensor).op_type, MatchMethod.STRUCTURE,
                    round(1.0 - rel, 6), f"same values (rel. L2 {rel:.1e}{layout})", perm)
                draft.claim(pair)
                if leaf:
                    taken.add(tensor)
                by_value.setdefault(id(a.value), pair)
        p = draft.get(a.index)
        own = graph.order_of(p.tensor) if p is not None and p.tensor in graph.producer else -1
        reach[a.index] = max([own] + [reach.get(i, -1) for i in a.inputs])
    return draft.claims


def _signature(v: np.ndarray) -> tuple[int, float, float] | None:
    """Size, sum and sum of squares (float64): equal for any reshape or transpose of the same numbers."""
    if v.dtype.kind not in "fiub" or v.size == 0:
        return None
    x = v.ravel()
    total, squares = float(x.sum(dtype=np.float64)), float(np.einsum("i,i->", x, x, dtype=np.float64))
    if not (np.isfinite(total) and np.isfinite(squares)):
        return None
    return v.size, total, squares


def _buckets(graph: GraphIndex, values, signatures) -> dict:
    """Tensors by (size, finite), in graph order, with their positions, sums and sums of squares as arrays."""
    grouped: dict[tuple[int, bool], list[str]] = {}
    for t in sorted(signatures, key=graph.order_of):  # ties: the earliest copy
        grouped.setdefault((values[t].size, signatures[t] is not None), []).append(t)
    return {key: (names, np.array([graph.order_of(t) for t in names]),
                  np.array([signatures[t][1] if key[1] else 0.0 for t in names]),
                  np.array([signatures[t][2] if key[1] else 0.0 for t in names])) for key, names in grouped.items()}


def _same_numbers(buckets, size: int, sig, lo: int) -> list[str]:
    """Tensors after position ``lo`` whose signature matches ``sig`` (sums within 1e-3 of their scale)."""
    found = buckets.get((size, sig is not None))
    if found is None:
        return []
    names, order, totals, squares = found
    keep = order > lo
    if sig is not None:
        _, total, square = sig
        scale = max(square, 1e-30) ** 0.5 * size ** 0.5
        keep &= (np.abs(totals - total) <= 1e-3 * scale) & (np.abs(squares - square) <= 1e-3 * max(square, 1e-30))
    return [names[i] for i in np.flatnonzero(keep)]


def _best_layout(ref: np.ndarray, candidates: list[str], values, signatures
                 ) -> tuple[str, tuple[int, ...] | None, float] | None:
    """The candidate (and axis permutation of ``ref``) holding the same values; the earliest of equals.

    Once one matches, its copies (reshaped or transposed: the same signature)
    cannot do better and are not compared again.
    """
    best, copies = None, None
    for t in candidates:
        if copies is not None and _copy_key(signatures[t]) == copies:
            continue
        found = layout_of(ref, values[t], screen=SCREEN_MAX_REL)
        if found is not None and found[1] <= STRUCTURE_MAX_REL and (best is None or found[1] < best[2]):
            best, copies = (t, *found), _copy_key(signatures[t])
    return best


def _copy_key(sig) -> tuple:
    """A signature up to the summation order (a transposed copy sums in another order)."""
    return sig[0], float(f"{sig[1]:.9g}"), float(f"{sig[2]:.9g}")


def layout_of(ref: np.ndarray, v: np.ndarray, measure=distance, screen: float | None = None,
              sampled: bool = False) -> tuple[tuple[int, ...] | None, float] | None:
    """The axis permutation of ``ref`` closest to ``v`` (first within float noise), and its distance.

    With ``screen``, a layout farther than that on a sample of the elements is
    not measured on all of them (nor returned); with ``sampled``, the distance
    is the sample's only (a cheap ranking).
    """
    if v.size != ref.size:
        return None
    best = None
    stable = _stable_order(ref.shape, v.shape)
    for perm in perms(ref, v):
        if perm is not None and (v.shape == ref.shape or stable is not None and _order(perm, ref.shape) != stable):
            # a tensor holding PyTorch's value with two axes of equal size swapped (a channels-last copy of an
            # H x W map as W x H, or its own shape transposed; size-1 axes anywhere) is what a wrong permutation
            # of those axes makes: no pair (the fault must stay inside the blamed segment)
            continue
        r = laid_out(ref, perm)
        if (screen is not None or sampled) and r.size > SCREEN_SAMPLE * 4:
            sample = np.unravel_index((np.arange(SCREEN_SAMPLE) * (r.size // SCREEN_SAMPLE | 1) + 7) % r.size,
                                      r.shape)
            rel = measure(v.reshape(r.shape)[sample], r[sample])
            if sampled:
                best = (perm, rel) if best is None or rel < best[1] else best
                continue
            if rel > screen:
                continue
        rel = measure(v.reshape(r.shape), r)
        if best is None or rel < best[1]:
            best = (perm, rel)
        if rel <= STRUCTURE_MAX_REL:
            break
    return best


def _order(perm: tuple[int, ...], ref_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The axes of ``ref_shape`` larger than 1, in the order ``perm`` lays them out."""
    return tuple(i for i in perm if ref_shape[i] != 1)


def _stable_order(ref_shape: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The order of ``ref_shape``'s axes larger than 1 that gives ``shape``'s (size-1 axes dropped on both
    sides) keeping axes of equal size in their order, or None when ``shape`` is no permutation of it."""
    ref_axes = [i for i, size in enumerate(ref_shape) if size != 1]
    sizes = [size for size in shape if size != 1]
    if sorted(ref_shape[i] for i in ref_axes) != sorted(sizes):
        return None
    free: dict[int, list[int]] = {}
    for i in ref_axes:
        free.setdefault(ref_shape[i], []).append(i)
    return tuple(free[size].pop(0) for size in sizes)


def output_divergence(capture: Capture, graph: GraphIndex, values) -> float:
    """The largest relative L2 distance between a graph output and the model's output."""
    worst = 0.0
    for name, ref in zip(graph.graph_outputs, capture.outputs):
        v = values.get(name)
        if v is not None and v.size == ref.size and kind(v) == "f" == kind(ref):
            worst = max(worst, distance(v.reshape(ref.shape), ref))
    return worst


def loose_gate(x: AlignInputs) -> bool:
    """Whether loose pairs are wanted: a graph without scope information whose outputs diverge."""
    return not x.scopes.module_of and x.output_divergence > LOOSE_GATE_REL


def pair_loosely(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Pairs by nearness of value where exact values cannot exist: a graph without scope
    information whose outputs diverge (see :func:`loose_gate`).

    Downstream of a fault no tensor equals its activation (the structural pass
    leaves it unaligned; the fault would be blamed on the last module).  Here
    an activation takes the nearest tensor of its layout
    after its inputs, when that tensor is within ``LOOSE_MAX_REL`` (in value or in
    direction: a wrongly scaled tensor points the same way) and clearly nearer
    than the others.  Never taken: a tensor feeding one that holds its
    activation's value far more exactly than the outputs hold theirs (it lies
    upstream of any fault), a tensor that an earlier call's tensor is computed
    from (a later call's value cannot be there), the numbers of a tensor already
    paired, reshaped, and for a normalization a tensor no spread divides.
    """
    acts, graph, values, signatures = x.acts, x.graph, x.values, x.signatures
    draft = state.draft()
    exact_rel = min(STRUCTURE_MAX_REL, x.output_divergence / 10)
    exact = {p.tensor for p in draft.values() if p.method is MatchMethod.STRUCTURE and p.tensor in graph.producer
             and p.tensor in values and distance(values[p.tensor].reshape(p.reference().shape), p.reference())
             <= exact_rel}
    upstream = ancestors_of(graph, exact)
    later = _latest_source(graph, {p.tensor: p.activation.index for p in draft.values()
                                   if p.tensor in exact and p.activation.is_leaf and p.activation.module})
    keys = {t: _copy_key(sig) for t, sig in signatures.items() if t not in upstream and sig is not None}
    taken = leaf_tensors(draft)
    held = _held_numbers(draft, taken, signatures)
    ordered = sorted(keys, key=graph.order_of)
    reach = reaches(acts, graph, draft)
    enclosing = enclosing_calls(acts)
    holders: dict[int, list[int]] = {}
    for a in acts:
        holders.setdefault(id(a.value), []).append(a.index)
    earlier: set[str] = set()  # what earlier calls' tensors are computed from
    cuts, readers, computable, normalized = (_cut_lookup(graph, values), _leaf_readers(acts), _computable(graph),
                                             _normalized(graph))
    for a in acts:
        if a.index not in draft and a.is_leaf and a.module and kind(a.value) == "f" and a.value.size \
                and not _returns_paired_value(a, holders, draft):
            lo = max(lower_bound(e, reach) for e in [a, *enclosing.get(a.index, ())])
            mine, extent = _torch_key(a), _extent(a.value)  # once per activation: passes over its value

            def allowed(t: str, a=a, lo=lo, mine=mine, extent=extent) -> bool:
                return (t in keys and graph.order_of(t) > lo and t not in taken
                        and values[t].size == a.value.size and mine in held.get(keys[t], {mine})
                        and kind(values[t]) == "f" and (a.passthrough or t not in earlier)
                        and later.get(t, -1) < a.index and not _beyond(cuts(t), extent) and computable(a, t))
            found = _nearest(a.value, _first_values([t for t in ordered if allowed(t)], keys), values, graph)
            unfit = found is None or _is_norm(a) and not normalized(found[0], lo)  # a norm's, never x - mean
            if not unfit and not _held_by_reader(a, found, readers, draft, values):
                tensor = _claim_loose(a, _climb(a.value, found, values, graph, allowed), graph, draft, values)
                taken.add(tensor)
                held.setdefault(keys[tensor], set()).add(mine)
        p = draft.get(a.index)
        own = graph.order_of(p.tensor) if p is not None and p.tensor in graph.producer else -1
        reach[a.index] = max([reach.get(a.index, -1), own] + [reach.get(i, -1) for i in a.inputs])
        if enclosing.get(a.index):  # a call's output is computed after everything computed inside it
            parent = enclosing[a.index][0].index
            reach[parent] = max(reach.get(parent, -1), reach[a.index])
        if own >= 0:
            earlier |= ancestors_of(graph, {p.tensor}, earlier)
    return draft.claims


#: ops that hand a layer's output on unchanged in value (a bias Add or a folded scale aside): looked through to
#: the node that computed it
HANDING_ON = frozenset({"Add", "Mul", "Cast", "QuantizeLinear", "DequantizeLinear", "Identity", "Reshape",
                        "Transpose", "Squeeze", "Unsqueeze", "Flatten"})


#: ops that divide by a spread computed at run time: a normalization's output lies downstream of one
NORMALIZING = frozenset({"Sqrt", "Reciprocal", "LayerNormalization", "SimplifiedLayerNormalization",
                         "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupNormalization",
                         "InstanceNormalization", "RMSNormalization", "LpNormalization", "MeanVarianceNormalization",
                         "ReduceL2", "LRN"})
#: what a normalization module's class is called (the layer norms models write themselves), and what not
NORM_NAMES = ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm", "ResponseNorm")
NOT_NORMS = ("BatchNorm", "NoNorm")


def _computable(graph: GraphIndex):
    """``(activation, tensor) -> bool``: a Conv's or a Linear's value (told by class ancestry) only in a tensor
    a convolution or a matrix product computed, looked through a bias Add, casts and Q/DQ pairs — never a
    normalization's output that happens to lie nearer (downstream of a fault an InstanceNorm undoes the
    convolution's error in scale)."""
    from .fusion import HOST_OPS  # (fusion imports this module)

    ops, memo = HOST_OPS["conv"] | HOST_OPS["linear"], {}

    def computed(t: str, depth: int = 0) -> bool:
        if t not in memo:
            node = graph.node_of(t)
            memo[t] = node is not None and (node.op_type in ops or depth < 4 and node.op_type in HANDING_ON and any(
                computed(i, depth + 1) for i in node.inputs if i and not graph.is_constant(i)))
        return memo[t]

    return lambda a, t: a.kind not in (ModuleKind.CONV, ModuleKind.LINEAR) or computed(t)


def _normalized(graph: GraphIndex):
    """``(tensor, lower bound) -> bool``: whether the tensor is computed after the lower bound through a division
    by a spread computed at run time — a Sqrt, a Reciprocal, a Div by a tensor or a normalization op — as a
    normalization's output (a LayerNorm, an RMSNorm, a GroupNorm) is; the centred input ``x - mean`` is not,
    and lies nearer than the output when the fault is in the statistics (a loose pair must not take it)."""
    def normalized(t: str, lo: int, depth: int = 0) -> bool:
        node = graph.node_of(t)
        if node is None or depth > 8 or graph.order_of(t) <= lo:
            return False
        divides = node.op_type == "Div" and len(node.inputs) > 1 and not graph.is_constant(node.inputs[1])
        return node.op_type in NORMALIZING or divides or any(
            normalized(i, lo, depth + 1) for i in node.inputs if i and not graph.is_constant(i))

    return normalized


def _is_norm(a: Activation) -> bool:
    """Whether ``a`` is a normalization module's call that computes its statistics at run time (not a
    BatchNorm in eval mode: an affine map)."""
    name = a.module_type or ""
    return a.kind is not ModuleKind.BATCHNORM and not a.op and not any(n in name for n in NOT_NORMS) and (
        name.endswith("Norm") or any(n in name for n in NORM_NAMES))


def _leaf_readers(acts) -> dict[int, list[Activation]]:
    """For each value object, the leaf activations that read it."""
    readers: dict[int, list[Activation]] = {}
    for b in acts:
        if b.is_leaf and b.module:
            for i in b.inputs:
                readers.setdefault(id(acts[i].value), []).append(b)
    return readers


def _held_by_reader(a: Activation, found: tuple[str, tuple[int, ...] | None, float], readers, draft,
                    values) -> bool:
    """Whether a module reading ``a``'s value, not yet paired, holds the found tensor's value clearly more
    nearly (``LOOSE_MARGIN``): the tensor is that reader's (a layer scale a simplifier folded into the Linear
    before it — the Linear's own value then exists in no tensor), and ``a`` takes nothing rather than a value
    off by the reader's factor."""
    tensor, _, rel = found
    for b in readers.get(id(a.value), ()):
        if b.index > a.index and b.index not in draft and kind(b.value) == "f" and b.value.size == values[tensor].size:
            near = layout_of(b.value, values[tensor], nearness)
            if near is not None and LOOSE_MARGIN * near[1] <= rel:
                return True
    return False


def _torch_key(a: Activation) -> tuple | None:
    """The copy key of ``a``'s value (the same numbers reshaped or transposed share it)."""
    sig = _signature(a.value)
    return None if sig is None else _copy_key(sig)


def _held_numbers(draft, taken: set[str], signatures) -> dict[tuple, set]:
    """For each copy key of the taken tensors' numbers, the copy keys of the values of the activations holding
    them: a tensor holding those numbers (reshaped, transposed) is another activation's only if that
    activation's value is the same numbers too (Swin's window reverse of its output projection, which a
    DropPath returns)."""
    held: dict[tuple, set] = {}
    for p in draft.values():
        if p.tensor in taken and signatures.get(p.tensor) is not None:
            held.setdefault(_copy_key(signatures[p.tensor]), set()).add(_torch_key(p.activation))
    return held


def _claim_loose(a: Activation, found: tuple[str, tuple[int, ...] | None, float], graph: GraphIndex,
                 draft, values) -> str:
    """Claim ``found`` (tensor, layout, distance) for ``a`` as a loose pair — or, for a Linear / Conv whose
    tensor holds its value times a plain factor computed by the node with the weights, as ``fused`` there (a
    simplifier folded the scale after the layer into its weights: compared as is, the layer would look
    diverged by the factor); its tensor."""
    tensor, perm, rel = found
    layout = "" if perm is None else f", transposed {list(perm)}"
    node = graph.node_of(tensor)
    factor = _folded_factor(a, tensor, perm, values, graph) if rel <= FOLDED_DIRECTION else None
    if factor is not None:
        draft.claim(TensorPair(a, None, node.name, node.op_type, MatchMethod.FUSED, LOOSE_CONFIDENCE,
                               f"no ONNX tensor of its own: {tensor} holds its value times {factor:.4g}, a factor "
                               f"folded into {node.name}'s weights (nearest in direction {rel:.1e}{layout})"))
        return tensor
    draft.claim(TensorPair(a, tensor, node.name, node.op_type, MatchMethod.STRUCTURE, LOOSE_CONFIDENCE,
                           f"nearest value after its inputs while the outputs diverge (rel. L2 or direction "
                           f"{rel:.1e}{layout})", perm))
    return tensor


#: a tensor this near a Linear's value in direction (float16 noise upstream at most) may hold it times a factor
#: folded into its weights; farther, the layer computes something else (a weight fault)
FOLDED_DIRECTION = 1e-2


def _folded_factor(a: Activation, tensor: str, perm, values, graph: GraphIndex) -> float | None:
    """The factor ``tensor`` holds a Linear's / Conv's value times, when it is plainly not 1 and the node
    computing the tensor (or the MatMul before its bias Add) has constant weights the factor can live in."""
    if a.kind not in (ModuleKind.LINEAR, ModuleKind.CONV) or kind(values[tensor]) != "f":
        return None
    node = graph.node_of(tensor)
    if node is not None and node.op_type == "Add":  # a bias Add after the MatMul
        node = next((graph.node_of(i) for i in node.inputs if i and not graph.is_constant(i)), None)
    if node is None or not graph.has_constant_weights(node):
        return None
    r = laid_out(np.asarray(a.value, np.float64), perm).ravel()
    v = np.asarray(values[tensor], np.float64).ravel()
    den = float(r @ r)
    factor = float(v @ r) / den if den > 0 and v.size == r.size else float("nan")
    return factor if np.isfinite(factor) and abs(factor - 1.0) >= PLAIN_FACTOR else None


def _returns_paired_value(a: Activation, holders: dict[int, list[int]], draft) -> bool:
    """Whether ``a`` returns its input unchanged, a value another activation holds that is paired already
    (``holders``: the activations recording each value object): the identity pass gives it that tensor (a
    nearest other tensor would be the step before it: a MatMul before its bias Add)."""
    return a.passthrough and any(j != a.index and j in draft for j in holders.get(id(a.value), ()))


def enclosing_calls(acts) -> dict[int, list[Activation]]:
    """For each activation, the module calls it ran inside, innermost first (the first later record of its
    parent module: a container records when its call returns).  Everything a call computes comes after what
    it was handed, so its inputs bound the graph position of its children's tensors too — where a child's own
    inputs say nothing (it reads what functional code computed from them: an attention output projection
    reading the context its parent computed)."""
    by_module: dict[str, list[Activation]] = {}
    for a in sorted(acts, key=lambda a: a.index):
        by_module.setdefault(a.module, []).append(a)
    starts = {name: [b.index for b in calls] for name, calls in by_module.items()}
    out: dict[int, list[Activation]] = {}
    for a in acts:
        chain, name, after = [], a.module, a.index
        while name:
            name = name.rpartition(".")[0]
            i = bisect.bisect_right(starts.get(name, ()), after)
            if i == len(starts.get(name, ())):
                break
            chain.append(by_module[name][i])
            after = chain[-1].index
        out[a.index] = chain
    return out


def _latest_source(graph: GraphIndex, owners: dict[str, int]) -> dict[str, int]:
    """For every tensor, the latest activation (by index: PyTorch's order) whose exactly paired tensor it is
    computed from (``owners``: tensor -> activation, leaf modules only: a container records when it returns,
    which says nothing of when the values it hands on were computed — a model returning its attention caches).
    An activation's value cannot be in a tensor computed from what PyTorch ran after it (a position embedding
    is no tensor of the layer after it)."""
    latest: dict[str, int] = dict(owners)
    for node in graph.nodes:
        found = max((latest[i] for i in node.inputs if i in latest), default=None)
        if found is not None:
            for t in node.outputs:
                latest[t] = max(found, latest.get(t, -1))
    return latest


def _first_values(ordered: list[str], keys: dict) -> list[str]:
    """The first tensors of ``ordered`` holding ``LOOSE_CANDIDATES`` distinct values (the same numbers
    reshaped or transposed count once: an attention's context, transposed and reshaped, is one candidate),
    among its first ``LOOSE_REACH`` tensors (the window stays near the activation's inputs)."""
    seen: set = set()
    out = []
    for t in ordered[:LOOSE_REACH]:
        if keys[t] not in seen:
            if len(seen) == LOOSE_CANDIDATES:
                break
            seen.add(keys[t])
        out.append(t)
    return out


def _nearest(ref: np.ndarray, near: list[str], values,
             graph: GraphIndex) -> tuple[str, tuple[int, ...] | None, float] | None:
    """The tensor of ``near`` clearly nearest to ``ref`` (and ``ref``'s layout in it), within ``LOOSE_MAX_REL``."""
    if len(near) > LOOSE_FINALISTS:  # rank on a sample of the elements, measure the finalists in full
        ranked = sorted((found[1], i) for i, t in enumerate(near)
                        if (found := layout_of(ref, values[t], nearness, sampled=True)) is not None)
        near = [near[i] for i in sorted(i for _, i in sorted(ranked)[:LOOSE_FINALISTS])]  # in graph order
    scored = sorted((found[1], i, found[0]) for i, t in enumerate(near)
                    if (found := layout_of(ref, values[t], nearness)) is not None)
    if not scored or scored[0][0] > LOOSE_MAX_REL:
        return None
    best = scored[0]
    # the same numbers reshaped or transposed are one candidate, not a rival; nor is a step of the same
    # computation (a MatMul and the bias Add after it): of those the last is the module's output
    rivals, steps = [], [best]
    for c in scored[1:]:
        apart = layout_of(values[near[c[1]]], values[near[best[1]]])
        if apart is not None and apart[1] <= STRUCTURE_MAX_REL:
            continue
        if _same_direction(values[near[c[1]]], values[near[best[1]]]):
            steps.append(c)  # the best rescaled (a projection before its attention scale): magnitude decides
            continue
        if c[0] >= LOOSE_MARGIN * best[0]:
            continue
        (steps if _one_step(graph, near[c[1]], near[best[1]]) else rivals).append(c)
    if rivals:
        return None
    rel, i, perm = max(_unscaled(steps, [values[t] for t in near], ref), key=lambda c: c[1])
    return near[i], perm, rel


def _unscaled(steps: list[tuple], tensors: list[np.ndarray], ref: np.ndarray) -> list[tuple]:
    """``steps`` (``(rel, index into tensors, perm)``) less those that are another step times a constant: the
    same direction, so nearness by value only rewards shrinking a tensor that upstream error made noisy (a
    GELU's ×0.5 after the Linear it reads was taken for the Linear).  Of such copies the one whose magnitude
    is nearest ``ref``'s stays."""
    def off(c) -> float:
        size, want = float(np.linalg.norm(tensors[c[1]].astype(np.float64))), float(np.linalg.norm(ref))
        return abs(float(np.log(size / want))) if size > 0 and want > 0 else float("inf")

    kept = [c for c in steps if all(off(c) <= off(d) for d in steps
                                    if d is not c and _same_direction(tensors[c[1]], tensors[d[1]]))]
    return kept or steps


def _same_direction(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``b`` is ``a`` times a positive constant (to float noise), element for element."""
    if a.size != b.size:
        return False
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    nx, ny = float(np.dot(x, x)), float(np.dot(y, y))
    return nx > 0 and ny > 0 and float(np.dot(x, y)) / np.sqrt(nx * ny) >= 1 - STRUCTURE_MAX_REL ** 2


def _climb(ref: np.ndarray, found: tuple[str, tuple[int, ...] | None, float], values, graph: GraphIndex,
           allowed) -> tuple[str, tuple[int, ...] | None, float]:
    """``found`` moved forward while a tensor its consumers compute is nearer ``ref`` (the window of candidates
    may end just before the module's output: the residual Add before a LayerNorm is near its output, the
    LayerNorm's own tensor nearer)."""
    tensor, perm, rel = found
    while True:
        after = [o for c in graph.consumers.get(tensor, ()) for o in graph.nodes[c].outputs if o and allowed(o)]
        scored = sorted((f[1], o, f[0]) for o in after if (f := layout_of(ref, values[o], nearness)) is not None)
        if not scored or scored[0][0] >= rel or _rescaled_away(values[tensor], values[scored[0][1]], ref):
            return tensor, perm, rel
        rel, tensor, perm = scored[0]


def _rescaled_away(here: np.ndarray, there: np.ndarray, ref: np.ndarray) -> bool:
    """Whether ``there`` is ``here`` times a constant that takes it farther from ``ref``'s magnitude: nearer in
    direction only because the step is exact (an attention scale after a projection whose input carries
    noise), not the module's output."""
    if not _same_direction(here, there):
        return False
    want = float(np.linalg.norm(np.asarray(ref, np.float64)))
    size = [float(np.linalg.norm(np.asarray(t, np.float64))) for t in (here, there)]
    return want > 0 and all(n > 0 for n in size) and abs(np.log(size[1] / want)) > abs(np.log(size[0] / want))


#: ops that saturate their input: their output is nearer a noisy module's value only by cutting the noise off
SATURATING = frozenset({"Clip", "Relu", "Min", "Max"})


def _cut_lookup(graph: GraphIndex, values):
    """``cuts(tensor)``: the bounds a saturating op's output was cut at (:func:`_cut_bounds`), ``(None, None)``
    for any other tensor; each tensor read once."""
    found: dict[str, tuple[float | None, float | None]] = {}

    def cuts(t: str) -> tuple[float | None, float | None]:
        if t not in found:
            node = graph.node_of(t)
            found[t] = _cut_bounds(values[t]) if node is not None and node.op_type in SATURATING else (None, None)
        return found[t]
    return cuts


def _cut_bounds(out: np.ndarray) -> tuple[float | None, float | None]:
    """``(upper, lower)`` bounds a saturating op's output shows it cut at — ties at its extreme — or None each:
    an extreme no element was cut at is only the data's (a ReLU's maximum)."""
    o = out[np.isfinite(out)]
    if not o.size:
        return None, None
    hi, lo = float(o.max()), float(o.min())
    return (hi if np.count_nonzero(o == hi) > 1 else None), (lo if np.count_nonzero(o == lo) > 1 else None)


def _extent(ref: np.ndarray) -> tuple[float, float, float] | None:
    """``(max, min, slack)`` of an activation's finite values."""
    r = np.asarray(ref)[np.isfinite(ref)] if np.size(ref) else np.zeros(0)
    if not r.size:
        return None
    return float(r.max()), float(r.min()), 1e-3 * max(float(np.max(np.abs(r))), 1e-12)


def _beyond(cut: tuple[float | None, float | None], extent: tuple[float, float, float] | None) -> bool:
    """Whether a saturating op's output cannot hold an activation: the activation reaches beyond a bound the op
    cut at (a GroupNorm's value beyond the bounds of the hardtanh after it), so the op is after the module, not
    its end (a block's last ReLU passes its non-negative value)."""
    if extent is None:
        return False
    (hi, lo), (r_max, r_min, slack) = cut, extent
    return (hi is not None and r_max > hi + slack) or (lo is not None and r_min < lo - slack)


def _one_step(graph: GraphIndex, a: str, b: str) -> bool:
    """Whether one of the tensors is computed from the other by one node with a constant operand (a bias Add, a
    scale Mul)."""
    for x, y in ((a, b), (b, a)):
        node = graph.node_of(y)
        if node is not None and x in node.inputs and len([i for i in node.inputs if i]) > 1 and all(
                i == x or not i or graph.is_constant(i) for i in node.inputs):
            return True
    return False


def ancestors_of(graph: GraphIndex, tensors: set[str], known: set[str] = frozenset()) -> set[str]:
    """Every tensor that ``tensors`` are computed from (themselves included); the walk stops at
    ``known`` tensors, whose ancestors the caller already has."""
    seen: set[str] = set()
    stack = list(tensors)
    while stack:
        t = stack.pop()
        if t in seen or t in known:
            continue
        seen.add(t)
        node = graph.node_of(t)
        if node is not None:
            stack.extend(i for i in node.inputs if i and i not in seen)
    return seen
