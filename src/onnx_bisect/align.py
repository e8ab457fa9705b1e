"""Align stage: pair each PyTorch activation with the ONNX tensor computing the same value.

Methods, in order of trust:
1. scope: the node's module path (dynamo metadata or TorchScript-style names);
   a module's candidates are the tensors its scope hands to the rest of the
   graph, of the activation's shape, taken call by call in graph order;
2. graph outputs for the model's own outputs;
3. identity for modules that return their input unchanged (Dropout in eval);
4. fusion when a module has no tensor of its own (a BatchNorm folded into the
   preceding Conv, a scale folded into a MatMul; see :mod:`.fusion`), run again
   after each pass below;
5. structure: the same elements (up to a reshape or transpose) after the
   tensors of the activation's inputs, accepted only when the values agree;
6. loose structure, only in a graph without scope information whose outputs
   diverge: the nearest value after the inputs, so that a fault is still
   located at its own segment rather than at the last module.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from . import fusion
from .graph import GraphIndex
from .records import Activation, Capture, MatchMethod, TensorPair
from .similarity import distance, fits, kind, laid_out, perms

_CALL_SUFFIX = re.compile(r"^(.*)_(\d+)$")
STRUCTURE_MAX_REL = 1e-4  # relative L2 distance for a structural pair: float noise only
WEAK_MAX_REL = 1e-3  # the same for a scope output read by a node of unknown scope
HALF_MAX_REL = 1e-2  # the same for a float16 / bfloat16 tensor
#: loose pairs (outputs diverging, no scopes): within this distance, and this many times nearer than the next
LOOSE_MAX_REL = 0.5
LOOSE_MARGIN = 2.0
LOOSE_CANDIDATES = 8  # same-sized tensors after an activation's inputs that a loose pair may take
#: graph outputs this far (relative L2) from the model's: beyond float32 noise, so a fault lies somewhere
LOOSE_GATE_REL = 1e-5
LOOSE_CONFIDENCE = 0.9  # enough to cut there: the segment after a fault is then measured on its own


@dataclass(frozen=True)
class ScopeMap:
    """Module qualname of every node that has one, and the tensors each scope exports."""

    module_of: dict[int, str]  # node index -> qualified module name
    boundary: dict[str, tuple[str, ...]]  # module -> tensors leaving its scope, graph order
    # Tensors read by a node of unknown scope (an optimizer's fused node, a renamed
    # node): the scope's real output may have been fused away, so such a tensor
    # is paired only when its values agree.
    weak: frozenset[str] = frozenset()


def map_scopes(capture: Capture, graph: GraphIndex) -> ScopeMap:
    """Resolve node scopes to known module names and find each scope's exported tensors."""
    known = {a.module for a in capture.activations}
    prefix = _common_prefix(graph, known)
    module_of: dict[int, str] = {}
    for node in graph.nodes:
        if node.scope is None:
            continue
        resolved = _resolve(node.scope[prefix:], known)
        if resolved is not None:
            module_of[node.index] = resolved
    boundary: dict[str, list[str]] = defaultdict(list)
    weak: set[str] = set()
    outputs = set(graph.graph_outputs)
    for node in graph.nodes:
        q = module_of.get(node.index)
        if q is None:
            continue
        for t in node.outputs:
            if not t:
                continue
            consumer_scopes = [module_of.get(i) for i in _effective_consumers(graph, t, module_of)]
            if None in consumer_scopes:
                weak.add(t)
            for s in _ancestors(q):
                if t in outputs or any(c is None or not _within(c, s) for c in consumer_scopes):
                    boundary[s].append(t)
                else:
                    break
    return ScopeMap(module_of=module_of, boundary={k: tuple(v) for k, v in boundary.items()}, weak=frozenset(weak))


#: nodes that converters insert around a tensor without changing what it means
#: (fp16 casts, QDQ pairs); scope analysis looks through them to the real consumers.
TRANSPARENT_OPS = frozenset({"Cast", "QuantizeLinear", "DequantizeLinear", "Identity"})


def _effective_consumers(graph: GraphIndex, tensor: str, module_of: dict[int, str]) -> list[int]:
    """Consumers of ``tensor``, looking through unscoped casts and quantize/dequantize pairs."""
    out, stack, seen = [], list(graph.consumers.get(tensor, ())), set()
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        node = graph.nodes[i]
        if node.op_type in TRANSPARENT_OPS and i not in module_of:
            for o in node.outputs:
                stack.extend(graph.consumers.get(o, ()))
        else:
            out.append(i)
    return out


def _common_prefix(graph: GraphIndex, known: set[str]) -> int:
    """How many leading scope components to drop (a wrapper module at export time)."""
    votes: Counter[int] = Counter()
    for node in graph.nodes[:: max(1, len(graph.nodes) // 200)]:
        if not node.scope:
            continue
        for k in range(0, min(3, len(node.scope))):
            if _resolve(node.scope[k:], known) not in (None, ""):
                votes[k] += 1
                break
    return votes.most_common(1)[0][0] if votes else 0


def _resolve(parts: tuple[str, ...], known: set[str]) -> str | None:
    """The innermost known module that ``parts`` names, tolerating ``_N`` call suffixes
    (TorchScript names a module's second call ``fc_1``) and containers that are never
    called themselves (ModuleList)."""
    plain = tuple(_strip_call(p) for p in parts)
    for k in range(len(parts), 0, -1):
        for candidate in (".".join(parts[:k]), ".".join(plain[:k])):
            if candidate in known:
                return candidate
    return "" if "" in known else None


def _strip_call(part: str) -> str:
    m = _CALL_SUFFIX.match(part)
    return m.group(1) if m else part


def _ancestors(q: str):
    parts = q.split(".") if q else []
    for k in range(len(parts), -1, -1):
        yield ".".join(parts[:k])


def _within(q: str, scope: str) -> bool:
    return scope == "" or q == scope or q.startswith(scope + ".")


def candidate_tensors(capture: Capture, graph: GraphIndex, scopes: ScopeMap) -> list[str]:
    """Every tensor alignment may want to look at: scope exports, graph outputs, and for
    modules the graph has no scope for, the tensors whose inferred shape fits."""
    names: dict[str, None] = dict.fromkeys(graph.graph_outputs)
    for tensors in scopes.boundary.values():
        names.update(dict.fromkeys(tensors))
    scoped = set(scopes.boundary)
    sizes = {a.value.size for a in capture.activations if a.module not in scoped}
    if sizes:
        for node in graph.nodes:
            for t in node.outputs:
                if t and _may_have_shape(graph.shapes.get(t), sizes):
                    names[t] = None
    return [n for n in names if n not in graph.initializers and n not in graph.graph_inputs]


def _may_have_shape(static: tuple | None, sizes: set[int]) -> bool:
    """Whether a tensor whose inferred shape is ``static`` (None = unknown) may hold
    as many elements as one of the activations (it may be reshaped or transposed)."""
    if static is None or any(d is None for d in static):
        return True
    return int(np.prod(static, dtype=np.int64)) in sizes


def align_activations(
    capture: Capture, graph: GraphIndex, scopes: ScopeMap, values: dict[str, np.ndarray]
) -> tuple[TensorPair, ...]:
    """Pair every activation with an ONNX tensor (or say why none), in capture order."""
    acts = capture.activations
    pairs: dict[int, TensorPair] = {}

    def make_pair(a, tensor, method, confidence=1.0, note=""):
        return _pair(a, graph, tensor, method, confidence, note)

    def settle() -> None:
        _pair_shared(acts, pairs)
        _pair_identities(acts, graph, pairs)

    _pair_graph_outputs(acts, graph, values, pairs)
    _pair_by_scope(acts, graph, scopes, values, pairs)
    fusion.pair_into_producer(acts, scopes, values, pairs, make_pair)
    settle()
    _pair_by_structure(acts, graph, values, pairs)
    settle()
    reach = _reach(acts, graph, pairs)
    fusion.pair_scaled(acts, graph, scopes, values, pairs, lambda a: _lower_bound(a, reach))
    fusion.pair_into_consumers(acts, graph, scopes, values, pairs)
    settle()
    divergence = _output_divergence(capture, graph, values)
    if not scopes.module_of and divergence > LOOSE_GATE_REL:
        _pair_loosely(acts, graph, values, pairs, divergence)
        fusion.pair_into_consumers(acts, graph, scopes, values, pairs)
        settle()
    return tuple(pairs.get(a.index) or _unmatched(a, scopes, values) for a in acts)


def _pair_shared(acts, pairs) -> None:
    """A container returning its last child's tensor unchanged shares that child's pair."""
    by_value: dict[int, TensorPair] = {}
    for a in acts:
        p = pairs.get(a.index)
        if p is not None and p.tensor is not None:
            by_value.setdefault(id(a.value), p)
    for a in acts:
        src = by_value.get(id(a.value))
        if a.index not in pairs and src is not None:
            pairs[a.index] = _shared(a, src)


def _shared(a: Activation, src: TensorPair) -> TensorPair:
    return TensorPair(a, src.tensor, src.node, src.op_type, src.method, src.confidence,
                      f"returns the tensor of {src.activation.name}", src.perm)


def _pair(a: Activation, graph: GraphIndex, tensor: str, method: MatchMethod, confidence=1.0, note="") -> TensorPair:
    node = graph.node_of(tensor)
    return TensorPair(a, tensor, node.name if node else None, node.op_type if node else None, method, confidence, note)


def _pair_graph_outputs(acts, graph, values, pairs) -> None:
    roots = [a for a in acts if a.module == ""]
    for a, name in zip(roots, graph.graph_outputs):
        v = values.get(name)
        if v is not None and v.shape == a.value.shape:
            pairs[a.index] = _pair(a, graph, name, MatchMethod.GRAPH_OUTPUT)


def _pair_by_scope(acts, graph, scopes: ScopeMap, values, pairs) -> None:
    by_module: dict[str, list[Activation]] = defaultdict(list)
    for a in acts:
        if a.index not in pairs:
            by_module[a.module].append(a)
    for module, group in by_module.items():
        tensors = [t for t in scopes.boundary.get(module, ()) if t in values]
        if not tensors:
            continue
        if any(t in scopes.weak for t in tensors):
            refs = [a.value for a in group]
            tensors = [t for t in tensors if t not in scopes.weak
                       or any(fits(values[t], r) and distance(values[t], r) <= WEAK_MAX_REL for r in refs)]
            if not tensors:
                continue
        method = _scope_method(graph, tensors[0])
        last = -1
        for a in sorted(group, key=lambda a: (a.call, a.index)):
            fitting = [t for t in tensors if graph.order_of(t) > last and fits(values[t], a.value)]
            if not fitting:
                fitting = _reshaped_in_scope(a, [t for t in tensors if graph.order_of(t) > last], values)
            if not fitting:
                continue
            if len(fitting) == 1 or _same_count(group, a, tensors, values):
                chosen, conf = fitting[0], 1.0
            else:
                # Several tensors of this shape leave the scope: the values choose, and a
                # choice no value supports is no pair (it would show as a divergence).
                chosen, conf = _closest(fitting, a.value, values)
                if distance(values[chosen], a.value) > _agreement(values[chosen]):
                    continue
            pairs[a.index] = _pair(a, graph, chosen, method, conf)
            last = graph.order_of(chosen) if a.path == _last_path(group, a) else last


def _reshaped_in_scope(a: Activation, tensors: list[str], values) -> list[str]:
    """Scope tensors holding ``a``'s elements in another shape.

    A rewritten graph reshapes a module's output inside the same node chain
    (Reshape→Gemm→Reshape, the Gemm's 2-d output in the module's scope).  A leaf
    whose scope exports exactly one tensor holding its elements in the same
    order (axes merged or split) takes it on the name alone, like a tensor of
    its shape would; anything else must agree in value.
    """
    same_size = [t for t in tensors if values[t].size == a.value.size and kind(values[t]) == kind(a.value)]
    rows = [t for t in same_size if _merged_axes(values[t].shape, a.value.shape)]
    if a.is_leaf and a.module and len(rows) == 1:
        return rows
    return [t for t in same_size if distance(values[t].reshape(a.value.shape), a.value) <= STRUCTURE_MAX_REL]


def _merged_axes(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether one shape is the other with adjacent axes merged (size-1 axes aside): the same
    elements in the same order, as [16, 32] is [1, 16, 32] and [32, 64] is [2, 16, 64]; [12, 2, 32]
    is not [2, 12, 32] (a transpose)."""
    short, long_ = sorted(([d for d in a if d != 1], [d for d in b if d != 1]), key=len)
    i = 0
    for d in short:
        size = 1
        while i < len(long_) and size < d:
            size *= long_[i]
            i += 1
        if size != d:
            return False
    return i == len(long_)


def _agreement(v: np.ndarray) -> float:
    """Largest relative L2 distance at which a tensor of ``v``'s dtype still holds the same value."""
    return HALF_MAX_REL if v.dtype in (np.float16,) or v.dtype.name == "bfloat16" else WEAK_MAX_REL


def _last_path(group, a) -> str:
    paths = [b.path for b in group if b.call == a.call]
    return paths[-1]


def _same_count(group, a, tensors, values) -> bool:
    """True when the scope exports exactly one fitting tensor per call: assign in order."""
    same = [b for b in group if b.path == a.path]
    fitting = [t for t in tensors if fits(values[t], a.value)]
    return len(fitting) == len(same) and len({b.path for b in group}) == 1


def _scope_method(graph: GraphIndex, tensor: str) -> MatchMethod:
    node = graph.node_of(tensor)
    return MatchMethod.METADATA if node and node.scope_source == "metadata" else MatchMethod.SCOPE_NAME


def _closest(candidates, ref, values) -> tuple[str, float]:
    ranked = sorted(candidates, key=lambda t: (distance(values[t], ref), -candidates.index(t)))
    best = distance(values[ranked[0]], ref)
    runner = distance(values[ranked[1]], ref) if len(ranked) > 1 else float("inf")
    confident = best < 1e-3 or runner > 10 * best
    return ranked[0], 0.95 if confident else 0.7


def _pair_identities(acts, graph: GraphIndex, pairs) -> None:
    for a in acts:
        if a.index in pairs or not a.passthrough:
            continue
        source = next((pairs[i] for i in a.inputs if i in pairs and pairs[i].tensor
                       and acts[i].value.shape == a.value.shape), None)
        if source is not None:
            pairs[a.index] = TensorPair(a, source.tensor, source.node, source.op_type, MatchMethod.IDENTITY,
                                        source.confidence, f"returns its input unchanged ({source.activation.name})")


def _reach(acts, graph: GraphIndex, pairs) -> dict[int, int]:
    """The latest graph position among the tensors of each activation and of the
    activations it consumed, directly or not."""
    reach: dict[int, int] = {}
    for a in acts:
        p = pairs.get(a.index)
        own = graph.order_of(p.tensor) if p is not None and p.tensor in graph.producer else -1
        reach[a.index] = max([own] + [reach.get(i, -1) for i in a.inputs])
    return reach


def _lower_bound(a: Activation, reach: dict[int, int]) -> int:
    """Graph position a tensor holding ``a`` must come after: where its inputs were computed."""
    return max((reach.get(i, -1) for i in a.inputs), default=-1)


def _leaf_tensors(pairs) -> set[str]:
    """Tensors already holding a leaf module's value (a container's claim does not block a leaf)."""
    return {p.tensor for p in pairs.values() if p.tensor and p.activation.is_leaf and p.activation.module}


def _pair_by_structure(acts, graph: GraphIndex, values, pairs) -> None:
    """Same elements (up to a reshape or transpose), after the tensors of earlier
    activations in graph order, confirmed by value.

    A permutation-invariant signature (size, sum, sum of squares) filters the
    candidates, so only tensors that can hold the same numbers are compared.
    """
    taken = _leaf_tensors(pairs)
    ordered = sorted((t for t in values if t in graph.producer), key=graph.order_of)  # ties: the earliest copy
    signatures = {t: _signature(values[t]) for t in ordered}
    by_value = {id(p.activation.value): p for p in pairs.values() if p.tensor is not None}
    # ``reach[i]``: the latest graph position among the tensors of activation i and of
    # the activations it consumed, directly or not.  A structural match must come
    # after what its own inputs came from, not after unrelated branches that the
    # ONNX graph happens to schedule later.
    reach: dict[int, int] = {}
    for a in acts:
        if a.index not in pairs and id(a.value) in by_value:
            pairs[a.index] = _shared(a, by_value[id(a.value)])  # a container returning its child's tensor
        elif a.index not in pairs and a.value.size:
            lo = _lower_bound(a, reach)
            sig = _signature(a.value)
            leaf = a.is_leaf and bool(a.module)
            candidates = [t for t in ordered if (a.passthrough or not leaf or t not in taken) and graph.order_of(t) > lo
                          and kind(values[t]) == kind(a.value) and _same_signature(signatures[t], sig)]
            found = _best_layout(a.value, candidates, values)
            if found is not None:
                tensor, perm, rel = found
                # Position alone proves nothing: a structural pair must agree in value,
                # or a wrongly paired tensor would show up as a divergence.
                layout = "" if perm is None else f", transposed {list(perm)}"
                pairs[a.index] = TensorPair(
                    a, tensor, graph.node_of(tensor).name, graph.node_of(tensor).op_type, MatchMethod.STRUCTURE,
                    round(1.0 - rel, 6), f"same values (rel. L2 {rel:.1e}{layout})", perm)
                if leaf:
                    taken.add(tensor)
                by_value.setdefault(id(a.value), pairs[a.index])
        p = pairs.get(a.index)
        own = graph.order_of(p.tensor) if p is not None and p.tensor in graph.producer else -1
        reach[a.index] = max([own] + [reach.get(i, -1) for i in a.inputs])


def _signature(v: np.ndarray) -> tuple[int, float, float] | None:
    if v.dtype.kind not in "fiub" or v.size == 0:
        return None
    x = v.astype(np.float64, copy=False)
    if not np.isfinite(x).all():
        return None
    return v.size, float(x.sum()), float(np.square(x).sum())


def _same_signature(s, ref) -> bool:
    if s is None or ref is None:
        return s is ref
    size, total, squares = ref
    if s[0] != size:
        return False
    scale = max(squares, 1e-30) ** 0.5 * size ** 0.5
    return abs(s[1] - total) <= 1e-3 * scale and abs(s[2] - squares) <= 1e-3 * max(squares, 1e-30)


def _best_layout(ref: np.ndarray, candidates: list[str], values, max_rel: float = STRUCTURE_MAX_REL
                 ) -> tuple[str, tuple[int, ...] | None, float] | None:
    """The candidate (and axis permutation of ``ref``) holding the same values."""
    best = None
    for t in candidates:
        found = _layout(ref, values[t])
        if found is not None and found[1] <= max_rel and (best is None or found[1] < best[2]):
            best = (t, *found)
    return best


def _layout(ref: np.ndarray, v: np.ndarray) -> tuple[tuple[int, ...] | None, float] | None:
    """The axis permutation of ``ref`` closest to ``v`` (first within float noise), and its distance."""
    if v.size != ref.size:
        return None
    best = None
    for perm in perms(ref, v):
        r = laid_out(ref, perm)
        rel = distance(v.reshape(r.shape), r)
        if best is None or rel < best[1]:
            best = (perm, rel)
        if rel <= STRUCTURE_MAX_REL:
            break
    return best


def _output_divergence(capture: Capture, graph: GraphIndex, values) -> float:
    """The largest relative L2 distance between a graph output and the model's output."""
    worst = 0.0
    for name, ref in zip(graph.graph_outputs, capture.outputs):
        v = values.get(name)
        if v is not None and v.size == ref.size and kind(v) == "f" == kind(ref):
            worst = max(worst, distance(v.reshape(ref.shape), ref))
    return worst


def _pair_loosely(acts, graph: GraphIndex, values, pairs, divergence: float) -> None:
    """Pairs by nearness of value where exact values cannot exist: a graph without scope
    information whose outputs diverge by ``divergence`` (relative L2).

    Downstream of a fault no tensor equals its activation, so the structural
    pass leaves the rest of the graph unaligned and the fault would be blamed on
    the last module.  Here an activation takes the nearest tensor of its layout
    after its inputs, when that tensor is within ``LOOSE_MAX_REL`` and clearly
    nearer than the others.  A tensor that feeds one holding its activation's
    value far more exactly than the outputs hold theirs lies upstream of any
    fault and is never taken.
    """
    exact_rel = min(STRUCTURE_MAX_REL, divergence / 10)
    exact = {p.tensor for p in pairs.values() if p.method is MatchMethod.STRUCTURE and p.tensor in graph.producer
             and p.tensor in values and distance(values[p.tensor].reshape(p.reference().shape), p.reference())
             <= exact_rel}
    upstream = _ancestors_of(graph, exact)
    taken = _leaf_tensors(pairs)
    # a reshape or transpose of a paired tensor holds that pair's numbers, nobody else's
    held = {_signature(values[t]) for t in taken if t in values}
    ordered = sorted((t for t in values if t in graph.producer and t not in upstream
                      and _signature(values[t]) not in held), key=graph.order_of)
    reach = _reach(acts, graph, pairs)
    for a in acts:
        leaf = a.is_leaf and bool(a.module)
        if a.index in pairs or not leaf or kind(a.value) != "f" or not a.value.size:
            reach[a.index] = max([reach.get(a.index, -1)] + [reach.get(i, -1) for i in a.inputs])
            continue
        lo = _lower_bound(a, reach)
        near = [t for t in ordered if graph.order_of(t) > lo and t not in taken and values[t].size == a.value.size
                and kind(values[t]) == "f"][:LOOSE_CANDIDATES]
        scored = sorted((found[1], graph.order_of(t), t, found[0]) for t in near
                        if (found := _layout(a.value, values[t])) is not None)
        if not scored or scored[0][0] > LOOSE_MAX_REL:
            continue
        rel, _, tensor, perm = scored[0]
        # the same numbers reshaped or transposed are one candidate, not a rival
        rivals = [s for s in scored[1:] if (same := _layout(values[s[2]], values[tensor])) is None
                  or same[1] > STRUCTURE_MAX_REL]
        if rivals and rivals[0][0] < LOOSE_MARGIN * rel:
            continue
        layout = "" if perm is None else f", transposed {list(perm)}"
        node = graph.node_of(tensor)
        pairs[a.index] = TensorPair(a, tensor, node.name, node.op_type, MatchMethod.STRUCTURE, LOOSE_CONFIDENCE,
                                    f"nearest value after its inputs while the outputs diverge "
                                    f"(rel. L2 {rel:.1e}{layout})", perm)
        taken.add(tensor)
        held.add(_signature(values[tensor]))
        ordered = [t for t in ordered if t == tensor or _signature(values[t]) not in held]
        reach[a.index] = max([graph.order_of(tensor)] + [reach.get(i, -1) for i in a.inputs])


def _ancestors_of(graph: GraphIndex, tensors: set[str]) -> set[str]:
    """Every tensor that ``tensors`` are computed from (themselves included)."""
    seen: set[str] = set()
    stack = list(tensors)
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        node = graph.node_of(t)
        if node is not None:
            stack.extend(i for i in node.inputs if i and i not in seen)
    return seen


ABSENT = "absent from the ONNX graph"


def _unmatched(a: Activation, scopes: ScopeMap, values) -> TensorPair:
    if a.module in scopes.boundary:
        same = [t for t in scopes.boundary[a.module] if t in values and values[t].shape == a.value.shape]
        note = (f"{len(same)} ONNX tensor(s) of shape {list(a.value.shape)} leave this module's scope and none holds "
                "its value" if same else f"no ONNX tensor of shape {list(a.value.shape)} leaves this module's scope")
    elif scopes.module_of:
        note = (f"{ABSENT}: no node carries this module's scope (pruned as unused or folded into a "
                "constant) and no tensor with equal values was found")
    else:
        note = "the graph carries no scope information and no tensor with equal values was found"
    return TensorPair(a, None, None, None, MatchMethod.NONE, 0.0, note)


def reuse_alignment(template: tuple[TensorPair, ...], capture: Capture) -> tuple[TensorPair, ...]:
    """The pairs found for one input case, carried over to another capture of the same model.

    Activations are matched by module, call and output path; the pairing is a
    property of the model and the graph, so a case whose values cannot be
    matched by value (all zeros) still gets it.  An activation the template
    lacks (other control flow) is unmatched, with that reason.
    """
    by_key = {(p.activation.module, p.activation.call, p.activation.path): p for p in template}
    pairs = []
    for a in capture.activations:
        p = by_key.get((a.module, a.call, a.path))
        if p is None:
            pairs.append(TensorPair(a, None, None, None, MatchMethod.NONE, 0.0,
                                    "not called on the input the alignment was made on"))
        else:
            pairs.append(dataclasses.replace(p, activation=a))
    return tuple(pairs)
