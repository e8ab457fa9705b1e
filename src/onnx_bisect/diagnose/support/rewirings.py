"""Rewirings: a node of the divergent segment reading the wrong tensor — another tensor of its shape and type
computed before it (the previous block's output for this one's, a sibling branch's, a norm's output where its
input belongs), or, where no tensor of the file holds the value the node should read, PyTorch's own value of the
op it is computed from fed in its place — and a block applied twice, removed.  Each is an edit the attribute
rule keeps only when the segment then reproduces PyTorch (see :mod:`.kind_alternatives` for the other readings).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import onnx
from onnx import helper

from ...records import ModuleKind
from ...records.graph import CARRIER_OPS, LAYOUT_OPS
from ...records.nest import informative, to_numpy
from . import edits
from .alternative_edits import composed, identity_of, outputs_swapped


#: earlier tensors of an input's shape tried in its place, per input of a node
MAX_REWIRED = 6
#: ... per input of a node of a segment of at most SMALL_REWIRED nodes (few nodes, few inputs: a block-sparse
#: attention gathers a dozen key blocks of one shape, the right one eight tensors back)
MAX_REWIRED_SMALL, SMALL_REWIRED = 16, 3


def rewirings(ctx, proto, make) -> Iterator:
    """Each computed float input of the node read from another tensor of its shape and type computed before the
    node (those paired with PyTorch values first, then the nearest): a graph edit, a fusion or a converter's
    aliasing bug wiring the wrong tensor (the previous block's output for this one's, a sibling branch's) —
    kept only when the segment then reproduces PyTorch.  The node's input must hold a right value (one of
    PyTorch's, more than one number) and the other a value unlike it: a value gone wrong upstream, or one
    rounded, is another fault."""
    graph = ctx.onnx.graph
    at = graph.producer.get(proto.output[0]) if proto.output and proto.output[0] else None
    if at is None:
        return
    inside = {t for n in ctx.segment_nodes for t in n.outputs}
    for i, tensor in enumerate(proto.input):
        if not tensor or graph.is_constant(tensor):
            continue
        kind = graph.elem_types.get(tensor)
        now = ctx.computed([tensor]).get(tensor) if kind in FLOATS or kind is None else None
        if kind is None and now is not None:  # a file shape inference cannot type (ONNX Runtime's fused ops)
            kind = helper.np_dtype_to_tensor_dtype(np.asarray(now).dtype) if now.dtype.kind == "f" else None
        held = _held_by(ctx, now) if kind in FLOATS and now is not None and informative(now) else None
        if held is None:
            continue
        limit = MAX_REWIRED_SMALL if len(ctx.layer.segment) <= SMALL_REWIRED else MAX_REWIRED
        others = _earlier_of(ctx, at, tuple(now.shape), kind, set(proto.input), limit)
        source = graph.node_of(tensor)
        if source is not None and source.op_type in NORM_NODES and source.inputs[0] not in others \
                and fits(graph.shapes.get(source.inputs[0]), tuple(now.shape), unknown=True):
            # a norm's output read where its input belongs (the residual taken from the normed stream): the input
            # may lie a whole block back
            others = [source.inputs[0], *others]
        values = ctx.computed(others)
        for other in others:
            if other in values and values[other].shape == now.shape and not ctx.compare(values[other], now).ok:
                yield from _outputs_exchanged(ctx, proto, tensor, other, held, values[other], make)
                after = _repeated_after(ctx, proto, tensor, other)
                if after is not None:  # the op moved past the node: both put back
                    past = "" if after.name in ctx.layer.segment else ", past the segment: named by its form"
                    alt = make(proto.name, f"input {i} (node {after.name} applies the {after.op_type} that computes "
                               f"'{other}' to this node's output instead: the two ops' order swapped{past})", tensor,
                               other, "the PyTorch output", composed(_input_read(proto.name, i, other),
                                                                     identity_of(after.name, after.input[0])))
                    yield dataclasses.replace(alt, shows_in=(after.name,)) if alt is not None else alt
                alt = make(proto.name, f"input {i}", tensor, other, "the PyTorch output",
                           _input_read(proto.name, i, other))
                copy = _repeated_block(ctx, proto, tensor, other)
                yield alt if not copy or alt is None else dataclasses.replace(
                    alt, what=f"input {i} (nodes {copy[0]} … {copy[-1]} repeat the {len(copy)} nodes computing "
                    f"'{tensor}' from '{other}', with the same weights: the block applied twice)", shows_in=copy)
        source = graph.node_of(tensor)
        if source is not None and source.op_type == "Identity" and tensor in inside:
            continue  # an op left as an Identity in the segment: the Identity's readings name it there
        if (proto.output[0] == ctx.tensor or tensor not in inside) and kind != onnx.TensorProto.BFLOAT16:
            yield from _fed_inputs(ctx, proto, i, tensor, now, held, make)


def reads_right(ctx, tensor: str) -> bool | None:
    """Whether the other layers computed from ``tensor`` are right on their own (every layer but the divergent one
    whose segment holds one of its readers agrees with exact inputs): True, False when one of them diverges, None
    when no other layer holds its readers.  Two outputs of one node exchanged make both outputs' readers go wrong;
    one reader rewired leaves the other output's readers right."""
    graph = ctx.onnx.graph
    readers = {graph.nodes[c].name for c in graph.consumers.get(tensor, ())}
    judged = [r.local.ok for r in ctx.layers
              if r is not ctx.layer and r.local is not None and readers & set(r.segment)]
    return None if not judged else all(judged)


def _outputs_exchanged(ctx, proto, tensor: str, other: str, held: int, value: np.ndarray, make) -> Iterator:
    """Two outputs of one node (a Split's chunks, an Unbind's pieces) exchanged, where the node reads one and the
    other is the right one: named at the producer when the two hold PyTorch's pieces as far apart as the outputs
    are, and the other output's readers go wrong on their own too (:func:`reads_right`) — the pieces exchanged,
    not one reader rewired (which would leave the others right)."""
    graph = ctx.onnx.graph
    producer = graph.node_of(tensor)
    if producer is None or held < 0 or len(producer.outputs) < 2 or other not in producer.outputs:
        return
    theirs = _held_by(ctx, value)
    i, j = producer.outputs.index(tensor), producer.outputs.index(other)
    kinds = {a.index: a.module_type for a in ctx.ops}
    if theirs is None or theirs < 0 or kinds.get(theirs) != kinds.get(held) or abs(held - theirs) != abs(j - i):
        return
    if reads_right(ctx, other) is not False:
        return
    alt = make(producer.name, "output order", [i, j], [j, i], "the PyTorch output",
               outputs_swapped(producer.name, i, j))
    yield dataclasses.replace(alt, feeds={tensor: value}, shows_in=(proto.name,)) if alt is not None else alt


def _fed_inputs(ctx, proto, i: int, tensor: str, now: np.ndarray, held, make) -> Iterator:
    """PyTorch's values the divergent op (or module) is computed from — its inputs, then theirs — fed at the
    node's input: where no tensor tried holds the value the node should read (its producer may be gone from the
    file, and the value may lie several ops before the divergent one: an attention's values before their heads
    are repeated and reshaped for a batched product).  Not when that value is computed directly from the one the
    node reads alone (an op between them missing: another reading — directly only: in a residual network
    everything later is computed from everything earlier), nor when another kind of op computes it from the same
    input (siblings: a max pool where an average pool belongs — the op that computed the value read is wrong, not
    the wiring; a key head split read for the value one is a wiring)."""
    by_index = {a.index: a for a in (*ctx.baseline.capture.activations, *ctx.ops)}
    fed_ops = op_inputs(ctx.layer.pair.activation, by_index, now.size, ctx.ops)
    for op in fed_ops + _unpaired(ctx, now.size, {a.index for a in fed_ops}):
        fed_value = np.asarray(op.value).reshape(now.shape).astype(now.dtype)
        if ctx.compare(now, fed_value).ok or _one_op_on(by_index, op, held) or _a_sibling(by_index, held, op.index):
            continue
        fed = f"{proto.name}_input_{i}_as_pytorch"
        moved = _norm_elsewhere(ctx, op, proto, tensor, by_index)
        alternative = make(proto.name, f"input {i}", tensor, f"PyTorch's {op.name} value" + (
            f" (the norm's node {moved} applies it to another tensor: the norm moved)" if moved else ""),
                           ctx.layer.pair.activation.name, _input_read(proto.name, i, fed), feeds={fed: fed_value})
        chain = _layout_chain(ctx.onnx.graph, tensor) + ((moved,) if moved else ())
        yield dataclasses.replace(alternative, shows_in=chain) if chain and alternative is not None else alternative
    yield from _product_before_bias(ctx, proto, i, tensor, now, make)


def _feeding_chain(graph, tensor: str) -> list:
    """The node computing ``tensor`` and the layout ops (and Casts) before it back to the first other node."""
    chain, node = [], graph.node_of(tensor)
    while node is not None and len(chain) < 8:
        chain.append(node)
        if node.op_type not in CARRIER_OPS | LAYOUT_OPS or not node.inputs:
            break
        node = graph.node_of(node.inputs[0])
    return chain


#: ONNX normalization ops a norm module is exported as (one node holding its scale)
NORM_NODES = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                        "GroupNormalization", "InstanceNormalization", "BatchNormalization", "SkipLayerNormalization",
                        "SkipSimplifiedLayerNormalization"})


def _norm_elsewhere(ctx, op, proto, tensor: str, by_index) -> str | None:
    """The node of a norm whose output ``proto`` should read (PyTorch's ``op`` is a norm module's output or op) when the
    file applies that norm — a normalization node reading exactly the module's scale — to another tensor than
    ``proto``'s input comes from: the norm moved (pre-norm written as post-norm, or back); None otherwise."""
    module = ctx.torch_module(_behind_views(op, by_index).module)  # a norm module's output or op, or a view of it
    scale = getattr(module, "weight", None) if module is not None else None
    if not hasattr(scale, "detach") or scale.dim() != 1:
        return None
    want = to_numpy(scale).astype(np.float64)
    feeding = {n.name for n in _feeding_chain(ctx.onnx.graph, tensor)}
    for node in ctx.onnx.graph.nodes:
        if node.op_type not in NORM_NODES or node.name == proto.name or len(node.inputs) < 2 or node.name in feeding:
            continue  # the norm in place (its output is what the node reads, through layout ops): not moved
        held = ctx.constant(node.inputs[1])
        if held is not None and held.size == want.size and np.allclose(np.asarray(held, np.float64).reshape(-1),
                                                                        want, rtol=1e-6, atol=0):
            return node.name
    return None


#: ATen ops that only lay a value out (a Linear's input viewed as 2-D before its addmm)
VIEW_OPS = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.clone", "aten.contiguous",
            "aten.t.", "aten.transpose", "aten.permute", "aten.unsqueeze", "aten.squeeze")


def _behind_views(op, by_index):
    """The op whose value ``op`` lays out, through at most three view-like ops (``op`` itself otherwise)."""
    for _ in range(3):
        if not op.op or not op.module_type.startswith(VIEW_OPS) or len(op.inputs) != 1 or op.inputs[0] not in by_index:
            break
        op = by_index[op.inputs[0]]
    return op


def _product_before_bias(ctx, proto, i: int, tensor: str, now: np.ndarray, make) -> Iterator:
    """The bias Add of the divergent Linear / Conv (it adds the module's bias) reading another tensor than the
    product: fed PyTorch's output less the bias (the product no op of PyTorch's holds: ``addmm`` adds the bias in
    one op) — the product's MatMul gone from the file, its Add wired to an earlier tensor."""
    activation = ctx.layer.pair.activation
    bias = activation.bias
    if proto.op_type != "Add" or bias is None or activation.op or proto.output[0] != ctx.tensor:
        return
    other = proto.input[1 - i] if len(proto.input) == 2 else None
    value = ctx.constant(other) if other else None
    if value is None or value.size != bias.size or not np.allclose(value.reshape(-1), bias.reshape(-1), rtol=1e-5,
                                                                      atol=1e-6):
        return
    product = (np.asarray(activation.value, np.float64).reshape(now.shape) - value.astype(np.float64)).astype(now.dtype)
    if ctx.compare(now, product).ok:
        return
    fed = f"{proto.name}_input_{i}_as_pytorch"
    yield make(proto.name, f"input {i}", tensor, f"PyTorch's {activation.name} product before its bias",
               activation.name, _input_read(proto.name, i, fed), feeds={fed: product})


#: layout ops walked back from a rewired input to the node that read the wrong tensor, at most
MAX_CHAIN = 4
#: ops that lay a value out without computing: a wrong tensor read before them is carried through them
CHAIN_OPS = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Identity"})


#: ops selecting part of a tensor: a wrong value in the right place may be the wrong part selected
SELECTING = frozenset({"Slice", "Gather", "Split"})


def _layout_chain(graph, tensor: str) -> tuple[str, ...]:
    """The layout nodes (Reshape, Transpose ...) that hand ``tensor`` on from the tensor they read first, nearest
    last: where a node is wired to a wrong tensor through them, the first of them read it (a head split reading
    the keys for the values, its transpose carrying them on) — or, where it is a Slice, Gather or Split, selected
    the wrong part of it (a block-sparse attention's gathered block one off)."""
    chain, node = [], graph.node_of(tensor)
    while node is not None and len(chain) < MAX_CHAIN and (node.op_type in CHAIN_OPS or node.op_type in SELECTING):
        chain.append(node.name)
        if node.op_type in SELECTING:
            break
        node = graph.node_of(node.inputs[0]) if node.inputs else None
    return tuple(reversed(chain))


#: leaf modules no tensor of the file holds, tried as a node's input, at most
MAX_UNPAIRED = 3


def _unpaired(ctx, size: int, tried: set[int]) -> list:
    """PyTorch's outputs of ``size`` elements of leaf modules that no tensor of the file holds (their computation
    gone, another tensor read in its place: a value projection pruned where its head split reads the keys), the
    nearest the divergent layer first."""
    from ...records import Status

    at = ctx.layer.pair.activation.index
    found = [r.pair.activation for r in ctx.layers if r.status is Status.UNMATCHED and r.pair.absent is None
             and r.pair.activation.is_leaf and not r.pair.activation.op and r.pair.activation.index not in tried
             and r.pair.activation.index < at
             and r.pair.activation.value.size == size and r.pair.activation.value.dtype.kind == "f"]
    return sorted(found, key=lambda a: abs(a.index - at))[:MAX_UNPAIRED]


def _one_op_on(by_index, op, held: int) -> bool:
    """Whether PyTorch's ``op`` computes from the value the node reads (``held``) and no other activation: one op
    missing between them (an activation left out, a scale by a parameter), another reading.  An op combining it
    with a value computed elsewhere (a gated MLP's ``act(gate) * up`` where the file's down projection reads ``up``,
    the gate branch gone) is a wiring: no single op restores it."""
    return held in op.inputs and not any(i != held and i in by_index for i in op.inputs)


#: ops walked back to tell siblings: two values computed from one source within this many ops
SIBLING_STEPS = 3


#: ATen ops that only lay out or select numbers: looked through to the op that computed them
LAYOUT_ATEN = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.transpose", "aten.permute",
                         "aten.expand", "aten.unsqueeze", "aten.squeeze", "aten.clone", "aten.contiguous", "aten.t",
                         "aten.slice", "aten.select", "aten.alias", "aten.flatten"})


def _op_kind(by_index, index: int) -> str:
    """The ATen op (``aten.max_pool2d_with_indices``, overload dropped) that computed activation ``index``'s numbers,
    looking through layout ops (a view of a projection is the projection's); a module's type for a module."""
    activation = by_index[index]
    for _ in range(SIBLING_STEPS + 3):
        kind = ".".join(activation.module_type.split(".")[:2])
        sources = [by_index[i] for i in activation.inputs if i in by_index]
        if kind not in LAYOUT_ATEN or len(sources) != 1:
            return kind
        activation = sources[0]
    return kind


def _a_sibling(by_index, held: int, index: int) -> bool:
    """Whether PyTorch's activation ``index`` is a sibling of ``held`` (a cut reference, -1, has none): another
    kind of op computing from the same numbers within ``SIBLING_STEPS`` ops."""
    if held < 0 or _op_kind(by_index, held) == _op_kind(by_index, index):
        return False
    return _share_a_source(by_index, _near_sources(by_index, index), _near_sources(by_index, held))


def _share_a_source(by_index, mine: set[int], theirs: set[int]) -> bool:
    """Whether two sets of PyTorch activations share one, or two hold the very same numbers (the same tensor
    unsqueezed twice for two pools)."""
    if mine & theirs:
        return True
    values = [np.asarray(by_index[i].value) for i in theirs if i in by_index]
    return any(np.asarray(by_index[i].value).shape == v.shape and np.array_equal(by_index[i].value, v)
               for i in mine if i in by_index for v in values)


def _near_sources(by_index, index: int) -> set[int]:
    """What PyTorch's activation ``index`` is computed from within ``SIBLING_STEPS`` ops (its inputs, theirs…)."""
    found, frontier = set(), [index]
    for _ in range(SIBLING_STEPS):
        frontier = [i for j in frontier if j in by_index for i in by_index[j].inputs if i not in found]
        found.update(frontier)
    return found


#: PyTorch values compared with a node's input to tell a right value in the wrong place, at most
MAX_HELD_COMPARED = 256


def _held_by(ctx, value: np.ndarray) -> int | None:
    """The index of the PyTorch op (or -1 for a cut reference) whose value the tensor holds, None when it holds
    none: a right value in the wrong place, where a node is wired to a wrong tensor — not a value gone wrong
    upstream."""
    refs = [(a.index, a.value) for a in ctx.ops] + [(-1, r) for r in ctx.cut.references.values()]
    same = [(k, np.asarray(r)) for k, r in refs if np.asarray(r).size == value.size and np.asarray(r).dtype.kind == "f"]
    found = next((k for k, r in same[:MAX_HELD_COMPARED] if ctx.compare(value, r.reshape(value.shape)).ok), None)
    return found if found is not None else _product_held(ctx, value)


def _product_held(ctx, value: np.ndarray) -> int | None:
    """The index of the Linear whose product before its bias the tensor holds (a MatMul of a MatMul + Add pair:
    PyTorch's ``addmm`` keeps no such value), or None."""
    if value.ndim == 0 or value.dtype.kind != "f":
        return None
    here = ctx.layer.pair.activation.index
    biased = sorted((a for a in ctx.baseline.capture.activations if a.bias is not None and a.value.size == value.size
                     and a.bias.size == value.shape[-1] and a.kind is ModuleKind.LINEAR),
                    key=lambda a: abs(a.index - here))  # the Linears nearest the divergent layer
    for a in biased[:MAX_PRODUCTS]:
        with_bias = value + a.bias.astype(value.dtype)
        if ctx.compare(with_bias, np.asarray(a.value).reshape(value.shape)).ok:
            return a.index
    return None


#: Linears (nearest the divergent layer first) whose product before the bias an input is compared with
MAX_PRODUCTS = 8


#: PyTorch ops walked back from the divergent op for values to feed: at most this many steps (views, expands
#: and reshapes take one each)
MAX_FED_DEPTH = 8


def op_inputs(activation, by_index, size: int, ops=()) -> list:
    """The values of ``size`` elements PyTorch's op or module ``activation`` (the divergent one) is computed from,
    up to ``MAX_FED_DEPTH`` steps back, nearest first.  A module's output recorded with no inputs (it read an op's
    value, not another module's) is computed from what its own ops (``ops``: the narrowing's) read outside it."""
    frontier = [activation]
    if not activation.inputs and not activation.op:
        frontier = [o for o in ops if o.module == activation.module] or frontier
    found, seen = [], {activation.index, *(a.index for a in frontier)}
    for _ in range(MAX_FED_DEPTH):
        frontier = [by_index[i] for i in dict.fromkeys(i for a in frontier for i in a.inputs)
                    if i in by_index and i not in seen]
        seen.update(a.index for a in frontier)
        found += [a for a in frontier if a.value.size == size and a.value.dtype.kind == "f"]
        if len(found) >= MAX_REWIRED:
            break
    return found[:MAX_REWIRED]


#: nodes walked back from a node for tensors of its input's shape, at most
MAX_WALKED = 500


def _earlier_of(ctx, at: int, shape: tuple, kind: int, exclude: set[str], limit: int = MAX_REWIRED) -> list[str]:
    """Tensors of ``shape`` and element type ``kind`` computed by the nodes before position ``at`` (a
    topological order: none is computed from the node), nearest first: half of them paired with PyTorch values
    (module outputs), half not (a split's chunk, an op's output inside a module)."""
    graph = ctx.onnx.graph
    paired, others, half = [], [], limit // 2
    for node in reversed(graph.nodes[max(0, at - MAX_WALKED):at]):
        for t in node.outputs:
            if t and t not in exclude and graph.elem_types.get(t, kind) == kind \
                    and fits(graph.shapes.get(t), shape, unknown=t not in graph.elem_types):
                (paired if t in ctx.cut.references else others).append(t)
        if len(paired) >= half and len(others) >= half:
            break
    return paired[:max(half, limit - len(others))] + others[:max(half, limit - len(paired))]


def fits(known: tuple | None, shape: tuple, unknown: bool = False) -> bool:
    """Whether a file's shape (a dimension it leaves symbolic: None) can be ``shape``; a tensor shape inference
    could not reach (``unknown``: no shape at all) can be any (its computed value decides)."""
    if known is None:
        return unknown
    return len(known) == len(shape) and all(k is None or k == d for k, d in zip(known, shape))


#: nodes a block applied twice may hold, at most (a copy longer than a segment names nothing)
MAX_REPEATED = 12


def repeated_blocks(ctx, protos, make) -> Iterator:
    """A block applied twice, removed: a node of the segment that starts a copy of the block computing the tensor
    it reads (:func:`_repeated_block`: an earlier twin of its op, attributes and weights reads the block's input)
    — the copy's last node's readers made to read the block's own output, so the block runs once.  Where the
    divergent tensor lies past the copy (a norm after it); a tensor inside the copy is the rewiring's."""
    graph = ctx.onnx.graph
    by_name = {n.name: n for n in graph.nodes}
    for proto in protos:
        node = by_name.get(proto.name)
        if node is None:
            continue
        for tensor in dict.fromkeys(t for t in proto.input if t and not graph.is_constant(t)):
            end = graph.node_of(tensor)
            twins = [] if end is None else [n for n in graph.nodes[max(0, end.index - MAX_WALKED):end.index + 1]
                                             if n.name != node.name and _signature(ctx, n) == _signature(ctx, node)]
            for twin in twins[-2:]:
                other = next((t for t in twin.inputs if t and not graph.is_constant(t)), None)
                copy = _repeated_block(ctx, proto, tensor, other) if other else ()
                last = by_name[copy[-1]] if copy else None
                inside = {t for name in copy for t in by_name[name].outputs} - set(last.outputs[:1] if last else ())
                if not copy or ctx.tensor in inside:
                    continue  # the divergent tensor computed inside the copy: the rewiring names it
                yield dataclasses.replace(make(
                    proto.name, "op", f"nodes {copy[0]} … {copy[-1]} (a copy of the {len(copy)} nodes computing "
                    f"'{tensor}' from '{other}', with the same weights, run again on its output)",
                    "the block applied once (the copy left out)", "the PyTorch output",
                    identity_of(last.name, tensor)), shows_in=copy)
                break


def _repeated_after(ctx, proto, tensor: str, other: str):
    """The node applying, to ``proto``'s output, the op that computes ``other`` from ``tensor`` (one node of one
    computed input, the same attributes and constants), where ``proto`` reads ``tensor``: the op moved past the
    node (a pool before the activation it should pool, a norm after the activation it should precede) — that
    node's proto, or None.  It must be the output's only reader."""
    graph = ctx.onnx.graph
    op = graph.node_of(other)
    if op is None or len(op.outputs) != 1 or not op.inputs or op.inputs[0] != tensor or any(
            t and not graph.is_constant(t) for t in op.inputs[1:]) or len(proto.output) != 1:
        return None
    readers = graph.consumers.get(proto.output[0], ())
    if len(readers) != 1:
        return None
    later = graph.nodes[readers[0]]
    if later.op_type != op.op_type or later.domain != op.domain or len(later.inputs) != len(op.inputs) \
            or later.inputs[0] != proto.output[0]:
        return None
    first, second = ctx.node(op.name), ctx.node(later.name)
    if first is None or second is None or list(first.attribute) != list(second.attribute):
        return None
    for a, b in zip(op.inputs[1:], later.inputs[1:]):
        va, vb = (ctx.constant(a), ctx.constant(b)) if a and b else (None, None)
        if bool(a) != bool(b) or a and (va is None or vb is None or va.shape != vb.shape or not np.array_equal(va, vb)):
            return None
    return second


def _repeated_block(ctx, proto, tensor: str, other: str) -> tuple[str, ...]:
    """The nodes of a block applied again, when ``proto`` (reading ``tensor``, where PyTorch's value implies
    ``other``) starts a copy of the nodes computing ``tensor`` from ``other``: an earlier node of its op, attributes
    and constant inputs reads ``other``, and each node from it to ``tensor``'s producer has such a twin among the
    nodes computed from ``proto`` — the copy's nodes in graph order, or () (an unrolled loop one step too many, a
    block repeated by a graph edit)."""
    graph = ctx.onnx.graph
    node = graph.node_of(proto.output[0]) if proto.output else None
    end = graph.node_of(tensor)
    if node is None or end is None:
        return ()
    twin = next((graph.nodes[c] for c in graph.consumers.get(other, ())
                 if graph.nodes[c].index < node.index and _signature(ctx, graph.nodes[c]) == _signature(ctx, node)),
                None)
    if twin is None or twin.index > end.index:
        return ()
    block = _between(graph, twin, end)
    if not 2 <= len(block) <= MAX_REPEATED or not any(_signature(ctx, n)[3] for n in block):
        return ()  # one node, or no weights to tell a copy from another op of the kind: no block
    after = graph.downstream(node.outputs[0], 3 * len(block)) if node.outputs else []
    copy, used = [node], {node.name}
    for original in block[1:]:
        match = next((n for n in after if n.name not in used and _signature(ctx, n) == _signature(ctx, original)),
                     None)
        if match is None:
            return ()
        copy.append(match)
        used.add(match.name)
    return tuple(n.name for n in sorted(copy, key=lambda n: n.index))


def _signature(ctx, node) -> tuple:
    """What makes two nodes the same computation on other data: op, attributes and constant inputs by name."""
    return (node.op_type, node.domain, node.attributes,
            tuple(t for t in node.inputs if t and ctx.onnx.graph.is_constant(t)))


def _between(graph, first, last) -> list:
    """The nodes on the paths from ``first`` to ``last`` (both included), in graph order."""
    down = {first.name: first}
    for n in graph.nodes[first.index + 1:last.index + 1]:
        if any((p := graph.node_of(t)) is not None and p.name in down for t in n.inputs):
            down[n.name] = n
    if last.name not in down:
        return []
    up, frontier = {last.name}, [last]
    while frontier:
        for t in frontier.pop().inputs:
            p = graph.node_of(t)
            if p is not None and p.name in down and p.name not in up:
                up.add(p.name)
                frontier.append(p)
    return [n for n in down.values() if n.name in up]


def _input_read(node: str, index: int, tensor: str):
    def edit(model, weights):
        edits.node(model, node).input[index] = tensor
        return model, weights
    return edit


#: ONNX float element types
FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                    onnx.TensorProto.BFLOAT16})
