"""Module scopes: which module emitted each ONNX node, the tensors each scope hands on, and the scope pass.

A node's module path comes from the dynamo exporter's metadata or from
TorchScript-style ``/scope/Op`` names; a module's candidates are the tensors
its scope hands to the rest of the graph, of the activation's shape, taken
call by call in graph order.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import onnx

from ..records import Activation, Capture, MatchMethod
from ..records.graph import CARRIER_OPS, LAYOUT_OPS, GraphIndex, NodeInfo
from .similarity import QUANTIZED_MAX_REL, STRUCTURE_MAX_REL, agreement, distance, fits, float_noise, kind, perms
from .state import AlignInputs, AlignmentState, Claim, Draft, pair_to

_CALL_SUFFIX = re.compile(r"^(.*)_(\d+)$")
@dataclass(frozen=True)
class ScopeMap:
    """Module qualname of every node that has one, and the tensors each scope exports."""

    module_of: dict[int, str]  # node index -> qualified module name
    boundary: dict[str, tuple[str, ...]]  # module -> tensors leaving its scope, graph order
    # Tensors read by a node of unknown scope (an optimizer's fused node, a renamed
    # node): the scope's real output may have been fused away, so such a tensor
    # is paired only when its values agree.
    weak: frozenset[str] = frozenset()
    #: modules whose nodes write only tensors in a runtime's blocked layout (see GraphIndex.blocked_layout)
    blocked: frozenset[str] = frozenset()


def map_scopes(capture: Capture, graph: GraphIndex) -> ScopeMap:
    """Resolve node scopes to known module names and find each scope's exported tensors."""
    known = {a.module for a in capture.activations} | set(capture.aliases)
    prefix = _common_prefix(graph, known)
    module_of: dict[int, str] = {}
    for node in graph.nodes:
        if node.scope is None:
            continue
        resolved = _resolve(node.scope[prefix:], known)
        if resolved is not None:
            module_of[node.index] = capture.aliases.get(resolved, resolved)
    boundary: dict[str, list[str]] = defaultdict(list)
    weak: set[str] = set()
    blocked: set[str] = set()
    outputs = set(graph.graph_outputs)
    for node in graph.nodes:
        q = module_of.get(node.index)
        if q is None:
            continue
        for t in node.outputs:
            if t and graph.blocked_layout(t):
                blocked.add(q)
            if not t or graph.blocked_layout(t):
                continue
            consumer_scopes = [module_of.get(i) for i in _effective_consumers(graph, t, module_of)]
            if not graph.consumers.get(t) and t not in outputs:
                # nothing reads it (an RNN's final state when the model uses only the sequence):
                # still what the module computes, for the module itself
                boundary[q].append(t)
                continue
            if None in consumer_scopes:
                weak.add(t)
            for s in _ancestors(q):
                if t in outputs or any(c is None or not _within(c, s) for c in consumer_scopes):
                    boundary[s].append(t)
                else:
                    break
    return ScopeMap(module_of=module_of, boundary={k: tuple(v) for k, v in boundary.items()}, weak=frozenset(weak),
                    blocked=frozenset(blocked - set(boundary)))


#: nodes that converters insert around a tensor without changing what it means
#: (fp16 casts, QDQ pairs); scope analysis looks through them to the real consumers.
TRANSPARENT_OPS = CARRIER_OPS


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
    # the operands a runtime-fused node adds (a module's last Add summed inside it: see .fused_outputs)
    summed = {i for node in graph.nodes if node.op_type in SUMMING for i in node.inputs[:2] + node.inputs[4:5] if i}
    # and the biases a runtime-fused node adds (a Linear's bias Add fused into the op after it)
    summed |= {node.inputs[BIAS_INPUT[node.op_type]] for node in graph.nodes if node.op_type in BIAS_INPUT
               and len(node.inputs) > BIAS_INPUT[node.op_type] and node.inputs[BIAS_INPUT[node.op_type]]}
    names.update(dict.fromkeys(sorted(summed)))
    found = [n for n in names if n not in graph.initializers and n not in graph.graph_inputs
             and not graph.blocked_layout(n)]
    # an activation that does not depend on the inputs (position embeddings) may be folded into a constant (one no
    # node reads is left out: ONNX Runtime drops unused initializers, and cannot hand them out)
    return found + sorted(t for t in graph.initializers if graph.elem_types.get(t) in FLOAT_TYPES and (
        t in summed or t in graph.shapes and _may_have_shape(graph.shapes[t], sizes)) and graph.consumers.get(t))


#: ONNX Runtime's fused nodes that add inputs 0, 1 (and the bias, input 4) before normalizing
SUMMING = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")
#: ONNX Runtime's contrib ops that add a bias to their first operand(s) before their own op, and the bias's input
#: index: its transformer optimizer fuses a Linear's bias Add into the op after it (BiasGelu, SkipLayerNorm ...)
BIAS_INPUT = {"BiasGelu": 1, "FastGelu": 1, "BiasSplitGelu": 1, "BiasAdd": 1, "BiasDropout": 1,
              "SkipLayerNormalization": 4, "SkipSimplifiedLayerNormalization": 3}


#: adding the fused node's bias brings the tensor this much nearer the module's value (the rest is noise an
#: error upstream left): the bias is the module's
BIAS_GAIN = 10.0
#: or, downstream of a fault (no value near the module's), the mean over rows of what the tensor lacks is the
#: fused node's bias within this share of it, over at least this many rows
BIAS_OFFSET, BIAS_ROWS = 0.25, 4


def bias_added_by(graph: GraphIndex, values, tensor: str, v: np.ndarray, a: Activation) -> NodeInfo | None:
    """The consumer that adds a bias to ``tensor`` inside its own op — the bias the module ``a`` (a Linear)
    adds: that consumer's bias input holds the module's bias parameter, or ``tensor`` holds the module's value
    less that bias (where the bias is not a known constant, less a constant per channel of the last axis) —
    the module's bias Add the runtime fused into that node."""
    ref = np.asarray(a.value)
    if not ref.ndim or kind(v) != "f" or v.size != ref.size:
        return None
    r, x = np.asarray(ref, np.float64), np.asarray(v, np.float64).reshape(ref.shape)
    for c in graph.consumers.get(tensor, ()):
        node = graph.nodes[c]
        at = BIAS_INPUT.get(node.op_type)
        if at is None or len(node.inputs) <= at or not node.inputs[at] or tensor not in node.inputs[:2]:
            continue
        gap = (r - x).reshape(-1, r.shape[-1])
        offset = gap.mean(axis=0)  # the bias, and the mean over rows of any error upstream
        bias = values.get(node.inputs[at])
        if bias is not None and kind(bias) == "f" and np.size(bias) == r.shape[-1] and np.any(bias):
            b = np.asarray(bias, np.float64).reshape(-1)
            if a.bias is not None and a.bias.size == b.size and np.allclose(
                    b, a.bias, rtol=max(1e-5, 2 * float(np.finfo(np.asarray(bias).dtype).eps)), atol=1e-7):
                return node  # the module's own bias parameter, wherever the values stand (a fault upstream)
            if distance(x + b, r) <= max(float_noise(v), distance(x, r) / BIAS_GAIN) or (
                    len(gap) >= BIAS_ROWS and np.linalg.norm(offset - b) <= BIAS_OFFSET * np.linalg.norm(b)):
                return node
            continue
        if np.any(offset) and float(np.linalg.norm(gap - offset)) / (float(np.linalg.norm(r)) + 1e-30) <= float_noise(v):
            return node
    return None


FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                         onnx.TensorProto.BFLOAT16})


def _may_have_shape(static: tuple | None, sizes: set[int]) -> bool:
    """Whether a tensor whose inferred shape is ``static`` (None = unknown) may hold
    as many elements as one of the activations (it may be reshaped or transposed)."""
    if static is None or any(d is None for d in static):
        return True
    return int(np.prod(static, dtype=np.int64)) in sizes


def release_early_containers(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """A container paired by its scope's name keeps a tensor that comes before a tensor of a module it
    called only when the values agree.

    PyTorch computes a container's output after every call it makes; a scope
    tensor earlier in the graph than a child's output is an inner one (the first
    residual Add of a block whose last Add an optimizer fused into the next
    LayerNormalization, renaming it), not the container's output — though its
    values may be close when the later children add little: only float noise
    counts as agreement here.
    """
    acts, graph, values = x.acts, x.graph, x.values
    last_of_call: dict[tuple[str, int], int] = {}
    for b in acts:
        last_of_call[(b.module, b.call)] = b.index
    claims = []
    for a in acts:
        p = state.get(a.index)
        if (p is None or p.tensor is None or a.is_leaf or not a.module or p.tensor not in values
                or p.method not in (MatchMethod.METADATA, MatchMethod.SCOPE_NAME)):
            continue
        start = last_of_call.get((a.module, a.call - 1), -1)  # where this call's children begin
        order = graph.order_of(p.tensor)
        later = [q for b in acts[start + 1:a.index] if b.module.startswith(a.module + ".")
                 for q in [state.get(b.index)] if q is not None and q.tensor and graph.order_of(q.tensor) > order]
        v = values[p.tensor]
        if later and fits(v, a.value) and distance(v, a.value) > float_noise(v):
            claims.append(Claim(a.index, None, replaces=True))
    return claims


def pair_by_scope(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Each module's activations with the tensors its scope hands on, call by call in graph order."""
    by_module: dict[str, list[Activation]] = defaultdict(list)
    for a in x.acts:
        if a.index not in state:
            by_module[a.module].append(a)
    draft = state.draft()
    for module, group in by_module.items():
        tensors = _scope_tensors(module, group, x)
        if tensors:
            _pair_group(group, tensors, x, draft)
    return draft.claims


def _scope_tensors(module: str, group: list[Activation], x: AlignInputs) -> list[str]:
    """The tensors ``module``'s scope hands on; one read by a node of unknown scope only when its values agree
    with one of the module's activations."""
    tensors = [t for t in x.scopes.boundary.get(module, ()) if t in x.values]
    if not any(t in x.scopes.weak for t in tensors):
        return tensors
    refs = [a.value for a in group]
    return [t for t in tensors if t not in x.scopes.weak
            or any(fits(x.values[t], r) and distance(x.values[t], r) <= _weak_agreement(x.graph, t, x.values[t])
                   for r in refs)
            or any(bias_added_by(x.graph, x.values, t, x.values[t], b) is not None for b in group)]


def _pair_group(group: list[Activation], tensors: list[str], x: AlignInputs, draft: Draft) -> None:
    """Pair one module's activations, call by call, with its scope's ``tensors``."""
    graph, values = x.graph, x.values
    method = _scope_method(graph, tensors[0])
    last = -1
    for a in sorted(group, key=lambda a: (a.call, a.index)):
        after = [t for t in tensors if graph.order_of(t) > last]
        fitting = [t for t in after if fits(values[t], a.value)] or _reshaped_in_scope(a, after, values, graph)
        if not fitting:
            moved = _transposed_in_scope(a, after, values, graph)
            if moved is not None:
                draft.claim(dataclasses.replace(
                    pair_to(a, graph, moved[0], method), perm=moved[1],
                    note=f"the module's only output-sized tensor, transposed {list(moved[1])} (by shape)"))
                last = graph.order_of(moved[0]) if a.path == _last_path(group, a) else last
            continue
        # A module called several times whose scope exports fewer tensors than calls are left (a
        # shared layer whose earlier calls feed its later ones inside the scope: ALBERT) cannot be
        # paired by order: only the values can say which call a tensor belongs to.
        calls_left = sum(1 for b in group if b.path == a.path and b.call >= a.call)
        if (len(fitting) == 1 and calls_left <= 1) or _same_count(group, a, tensors, values):
            chosen, conf = fitting[0], 1.0
        else:
            # Several tensors of this shape leave the scope: the values choose, and a
            # choice no value supports is no pair (it would show as a divergence).
            chosen, conf = _closest(fitting, a.value, values)
            if distance(values[chosen], a.value) > agreement(values[chosen]):
                continue
        draft.claim(pair_to(a, graph, chosen, method, conf))
        last = graph.order_of(chosen) if a.path == _last_path(group, a) else last


def _reshaped_in_scope(a: Activation, tensors: list[str], values, graph: GraphIndex) -> list[str]:
    """Scope tensors holding ``a``'s elements in another shape.

    A rewritten graph reshapes a module's output inside the same node chain
    (Reshape→Gemm→Reshape, the Gemm's 2-d output in the module's scope).  A leaf
    whose scope exports exactly one computed tensor holding its elements in the
    same order (axes merged or split) takes it on the name alone, like a tensor
    of its shape would — so a fault in the leaf's own weights still shows there
    — ; anything else must agree in value.  A tensor that a layout op makes
    (the chain's leading Reshape of the module's *input*, as large as the output
    when a Linear keeps the width) is not what the module computes.
    """
    same_size = _same_size(a, tensors, values)
    rows = [t for t in same_size if _merged_axes(values[t].shape, a.value.shape)]
    computed = [t for t in rows if _computed_in(a.module, t, graph)]
    if a.is_leaf and a.module and (len(rows) == 1 or len(computed) == 1):
        return rows if len(rows) == 1 else computed
    return [t for t in same_size if distance(values[t].reshape(a.value.shape), a.value) <= STRUCTURE_MAX_REL]


def _same_size(a: Activation, tensors: list[str], values) -> list[str]:
    """The tensors holding as many elements of the same kind as ``a``'s value."""
    return [t for t in tensors if values[t].size == a.value.size and kind(values[t]) == kind(a.value)]


def _computed_in(module: str, tensor: str, graph: GraphIndex) -> bool:
    """Whether ``tensor`` is computed inside ``module``'s scope, looking through layout ops: a Reshape of
    the Gemm inside is (a head split the simplifier merged with the Gemm's own Reshape), a Reshape of the
    module's input is not (the chain's leading Reshape, as large as the output when a Linear keeps the
    width)."""
    node = graph.node_of(tensor)
    while node is not None and node.op_type in _LAYOUT_OPS and node.inputs:
        node = graph.node_of(node.inputs[0])
    if node is None or node.scope is None:
        return False
    parts = tuple(module.split("."))
    return node.scope[:len(parts)] == parts


def _transposed_in_scope(a: Activation, tensors: list[str], values, graph: GraphIndex
                         ) -> tuple[str, tuple[int, ...]] | None:
    """``(tensor, perm)`` when a leaf's scope computes exactly one tensor of its size, and that tensor's
    shape is the activation's in one axis order only (an RNN's time-major output of a batch-first
    module, [5, 2, 16] for [2, 5, 16]).

    Taken on the name and the shape alone, like a reshaped output, so that a
    fault in the module itself still shows there rather than unpairing it.
    """
    if not (a.is_leaf and a.module) or kind(a.value) != "f":
        return None
    same_size = _same_size(a, tensors, values)
    computed = [t for t in same_size if _computed_in(a.module, t, graph) or len(same_size) == 1]
    if len(computed) != 1:
        return None
    layouts = [perm for perm in perms(a.value, values[computed[0]]) if perm is not None]
    if len(layouts) != 1 or len(set(a.value.shape)) != a.value.ndim:
        return None
    return computed[0], layouts[0]


#: ops that only lay out their input's elements anew
_LAYOUT_OPS = LAYOUT_OPS | {"Identity"}


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


def _weak_agreement(graph: GraphIndex, tensor: str, v: np.ndarray) -> float:
    """How far a scope output read by a node of unknown scope may be from its activation and still be
    its value: float noise, or quantization noise when it is quantized before use or computed from
    dequantized inputs (a QDQ file; the quantizer's nodes carry no scope)."""
    node = graph.node_of(tensor)
    quantized = any(graph.nodes[i].op_type == "QuantizeLinear" for i in graph.consumers.get(tensor, ())) or (
        node is not None and any((p := graph.node_of(i)) is not None and p.op_type == "DequantizeLinear"
                                 for i in node.inputs))
    return QUANTIZED_MAX_REL if quantized else agreement(v)








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








