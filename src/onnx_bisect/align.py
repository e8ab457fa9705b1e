"""Align stage: pair each PyTorch activation with the ONNX tensor computing the same value.

Methods, in order of trust:
1. scope: the node's module path (dynamo metadata or TorchScript-style names);
   a module's candidates are the tensors its scope hands to the rest of the
   graph, of the activation's shape, taken call by call in graph order;
2. graph outputs for the model's own outputs;
3. identity for modules that return their input unchanged (Dropout in eval);
4. fusion when a module has no node of its own (a BatchNorm folded into the
   preceding Conv), confirmed by value where both sides have a tensor;
5. structure: same shape near the expected position in graph order, accepted
   only when the values agree.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from .graph import GraphIndex
from .records import Activation, Capture, MatchMethod, TensorPair

_CALL_SUFFIX = re.compile(r"^(.*)_(\d+)$")
STRUCTURE_MAX_REL = 1e-4  # relative L2 distance for a structural pair: float noise only
WEAK_MAX_REL = 1e-3  # the same for a scope output read by a node of unknown scope
FUSED_MAX_REL = 0.2  # a neighbour's value computed by another module's node: near it, not merely nearer


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
    _pair_graph_outputs(acts, graph, values, pairs)
    _pair_by_scope(acts, graph, scopes, values, pairs)
    _pair_fusions(acts, graph, scopes, values, pairs)
    _pair_shared(acts, pairs)
    _pair_identities(acts, graph, pairs)
    _pair_by_structure(acts, graph, values, pairs)
    _pair_shared(acts, pairs)
    _pair_identities(acts, graph, pairs)
    return tuple(pairs.get(a.index) or _unmatched(a, scopes) for a in acts)


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
            pairs[a.index] = TensorPair(a, src.tensor, src.node, src.op_type, src.method, src.confidence,
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
                       or any(_fits(values[t], r) and _distance(values[t], r) <= WEAK_MAX_REL for r in refs)]
            if not tensors:
                continue
        method = _scope_method(graph, tensors[0])
        last = -1
        for a in sorted(group, key=lambda a: (a.call, a.index)):
            fits = [t for t in tensors if graph.order_of(t) > last and _fits(values[t], a.value)]
            if not fits:
                # a rewritten graph may reshape the module's output inside the same node
                # chain (Reshape→Gemm→Reshape): accept that only when the values agree
                fits = [t for t in tensors if graph.order_of(t) > last and values[t].size == a.value.size
                        and _kind(values[t]) == _kind(a.value)
                        and _distance(values[t].reshape(a.value.shape), a.value) <= STRUCTURE_MAX_REL]
            if not fits:
                continue
            if len(fits) == 1 or _same_count(group, a, tensors, values):
                chosen, conf = fits[0], 1.0
            else:
                chosen, conf = _closest(fits, a.value, values)
            pairs[a.index] = _pair(a, graph, chosen, method, conf)
            last = graph.order_of(chosen) if a.path == _last_path(group, a) else last


def _last_path(group, a) -> str:
    paths = [b.path for b in group if b.call == a.call]
    return paths[-1]


def _same_count(group, a, tensors, values) -> bool:
    """True when the scope exports exactly one fitting tensor per call: assign in order."""
    same = [b for b in group if b.path == a.path]
    fits = [t for t in tensors if _fits(values[t], a.value)]
    return len(fits) == len(same) and len({b.path for b in group}) == 1


def _scope_method(graph: GraphIndex, tensor: str) -> MatchMethod:
    node = graph.node_of(tensor)
    return MatchMethod.METADATA if node and node.scope_source == "metadata" else MatchMethod.SCOPE_NAME


def _fits(onnx_value: np.ndarray, ref: np.ndarray) -> bool:
    return onnx_value.shape == ref.shape and _kind(onnx_value) == _kind(ref)


def _kind(v: np.ndarray) -> str:
    return "f" if v.dtype.kind in "fc" else ("b" if v.dtype.kind == "b" else "i")


def _distance(onnx_value: np.ndarray, ref: np.ndarray) -> float:
    """Relative L2 distance, the yardstick for choosing between candidates."""
    a = onnx_value.astype(np.float64, copy=False).ravel()
    b = ref.astype(np.float64, copy=False).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return float("inf")
    num = np.linalg.norm(a[finite] - b[finite])
    den = np.linalg.norm(b[finite]) + 1e-12
    return float(num / den)


def _closest(fits, ref, values) -> tuple[str, float]:
    ranked = sorted(fits, key=lambda t: (_distance(values[t], ref), -fits.index(t)))
    best = _distance(values[ranked[0]], ref)
    runner = _distance(values[ranked[1]], ref) if len(ranked) > 1 else float("inf")
    confident = best < 1e-3 or runner > 10 * best
    return ranked[0], 0.95 if confident else 0.7


def _pair_fusions(acts, graph: GraphIndex, scopes: ScopeMap, values, pairs) -> None:
    """Modules with no ONNX node of their own were folded into a neighbour's node."""
    consumers: dict[int, list[Activation]] = defaultdict(list)
    for a in acts:
        for i in a.inputs:
            consumers[i].append(a)
    for b in acts:
        if b.index in pairs or b.passthrough or b.module in scopes.boundary or len(b.inputs) != 1:
            continue
        a = acts[b.inputs[0]]
        pa = pairs.get(a.index)
        if pa is None or pa.tensor is None or pa.method is MatchMethod.FUSED:
            continue
        v = values.get(pa.tensor)
        if v is None or not _fits(v, b.value):
            continue
        # The node computes B rather than A, and within float noise: an optimizer that
        # fused more (Conv+BN+ReLU) must not make B look diverged.
        if _distance(v, b.value) < _distance(v, a.value) and _distance(v, b.value) <= FUSED_MAX_REL:
            note = f"{a.name} and {b.name} are computed by one ONNX node"
            pairs[b.index] = _pair(b, graph, pa.tensor, MatchMethod.FUSED, pa.confidence, note)
            pairs[a.index] = TensorPair(a, None, pa.node, pa.op_type, MatchMethod.FUSED, pa.confidence,
                                        f"folded into {pa.node} with {b.name}")
    for a in acts:
        if a.index in pairs or a.passthrough or a.module in scopes.boundary:
            continue
        for b in consumers.get(a.index, ()):
            pb = pairs.get(b.index)
            if pb and pb.tensor and pb.node:
                node = graph.node_of(pb.tensor)
                rule = f" by {node.rewrite_rule}" if node and node.rewrite_rule else ""
                pairs[a.index] = TensorPair(a, None, pb.node, pb.op_type, MatchMethod.FUSED, pb.confidence,
                                            f"no ONNX node of its own; folded into {pb.node}{rule} with {b.name}")
                if pb.method in (MatchMethod.METADATA, MatchMethod.SCOPE_NAME) and rule:
                    pairs[b.index] = TensorPair(pb.activation, pb.tensor, pb.node, pb.op_type, MatchMethod.FUSED,
                                                pb.confidence, f"computed together with {a.name}{rule}")
                break


def _pair_identities(acts, graph: GraphIndex, pairs) -> None:
    for a in acts:
        if a.index in pairs or not a.passthrough:
            continue
        source = next((pairs[i] for i in a.inputs if i in pairs and pairs[i].tensor
                       and acts[i].value.shape == a.value.shape), None)
        if source is not None:
            pairs[a.index] = TensorPair(a, source.tensor, source.node, source.op_type, MatchMethod.IDENTITY,
                                        source.confidence, f"returns its input unchanged ({source.activation.name})")


def _pair_by_structure(acts, graph: GraphIndex, values, pairs) -> None:
    """Same elements (up to a reshape or transpose), after the tensors of earlier
    activations in graph order, confirmed by value.

    A permutation-invariant signature (size, sum, sum of squares) filters the
    candidates, so only tensors that can hold the same numbers are compared.
    """
    taken = {p.tensor for p in pairs.values() if p.tensor}
    ordered = [t for t in values if t in graph.producer]
    signatures = {t: _signature(values[t]) for t in ordered}
    # ``reach[i]``: the latest graph position among the tensors of activation i and of
    # the activations it consumed, directly or not.  A structural match must come
    # after what its own inputs came from, not after unrelated branches that the
    # ONNX graph happens to schedule later.
    reach: dict[int, int] = {}
    for a in acts:
        if a.index not in pairs and a.value.size:
            lo = max((reach.get(i, -1) for i in a.inputs), default=-1)
            sig = _signature(a.value)
            fits = [t for t in ordered if (a.passthrough or t not in taken) and graph.order_of(t) > lo
                    and _kind(values[t]) == _kind(a.value) and _same_signature(signatures[t], sig)]
            found = _best_layout(a.value, fits, values)
            if found is not None:
                tensor, perm, rel = found
                # Position alone proves nothing: a structural pair must agree in value,
                # or a wrongly paired tensor would show up as a divergence.
                layout = "" if perm is None else f", transposed {list(perm)}"
                pairs[a.index] = TensorPair(
                    a, tensor, graph.node_of(tensor).name, graph.node_of(tensor).op_type, MatchMethod.STRUCTURE,
                    round(1.0 - rel, 6), f"same values (rel. L2 {rel:.1e}{layout})", perm)
                taken.add(tensor)
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


def _best_layout(ref: np.ndarray, fits: list[str], values) -> tuple[str, tuple[int, ...] | None, float] | None:
    """The candidate (and axis permutation of ``ref``) holding the same values."""
    best = None
    for t in fits:
        v = values[t]
        for perm in _perms(ref, v):
            r = ref if perm is None else ref.transpose(perm)
            rel = _distance(v.reshape(r.shape), r)
            if rel <= STRUCTURE_MAX_REL and (best is None or rel < best[2]):
                best = (t, perm, rel)
            if rel <= STRUCTURE_MAX_REL:
                break
    return best


def _perms(ref: np.ndarray, v: np.ndarray):
    """Identity first, then axis permutations of ``ref`` compatible with ``v``'s shape."""
    yield None
    if ref.ndim > 5 or ref.ndim < 2:
        return
    import itertools

    dims = [d for d in v.shape if d != 1]
    for perm in itertools.permutations(range(ref.ndim)):
        if perm == tuple(range(ref.ndim)):
            continue
        shape = [ref.shape[i] for i in perm]
        if [d for d in shape if d != 1] == dims:
            yield perm


ABSENT = "absent from the ONNX graph"


def _unmatched(a: Activation, scopes: ScopeMap) -> TensorPair:
    if a.module in scopes.boundary:
        note = f"no ONNX tensor of shape {list(a.value.shape)} leaves this module's scope"
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
