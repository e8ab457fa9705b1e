"""Alternatives of form: an op written in another form than the model's — a view (Reshape) where the model permutes,
a Softmax over a flattened tail (opset 11's semantics) where it normalises over one axis, an RNN given an initial
state its PyTorch module was not called with, a scale applied to a Softmax's output where the model scales its
input, an activation applied to a layer's input where the model applies it to the layer's output.  Each is an edit the attribute rule keeps only when the segment then
reproduces PyTorch; :func:`form_alternatives` dispatches them by op type (the flattened softmax is tried among a
Softmax's own attribute readings, :mod:`.alternatives`)."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

import numpy as np
from onnx import helper

from ..context import attribute
from . import edits


def form_alternatives(ctx, proto, shape_of, make) -> Iterator:
    """The form alternatives of one node (``make`` builds an Alternative)."""
    if proto.op_type == "Reshape":
        yield from _permuted_views(ctx, proto, shape_of, make)
    if proto.op_type in ("LSTM", "GRU", "RNN"):
        yield from _zero_state(ctx, proto, make)
    if proto.op_type in ("Mul", "Div"):
        yield from _scale_inside_softmax(ctx, proto, make)
    if proto.op_type == "Softmax":
        yield from _mask_before_softmax(ctx, proto, make)
    if proto.op_type == "Exp":
        yield from _unnormalised(ctx, proto, make)
    if proto.op_type in MOVABLE_ACTIVATIONS or proto.op_type in ELEMENTWISE:
        yield from _activation_after_layer(ctx, proto, make)


#: permutations tried for a Reshape whose output holds its input's axes in another order, at most
MAX_VIEW_PERMS = 6


def _permuted_views(ctx, proto, shape_of, make) -> Iterator:
    """A Reshape whose output shape is its input's axes in another order, made a Transpose to it: ``x.view(...)``
    written where the model permutes (``.permute`` / ``.transpose`` — a view reinterprets the memory, a permute
    moves the values).  PyTorch's own op's permutation first, when the divergent op is one; then every
    permutation that gives the output shape (at most :data:`MAX_VIEW_PERMS`)."""
    have, want = shape_of(proto.input[0]), shape_of(proto.output[0])
    if not have or not want or len(have) != len(want) or have == want or sorted(have) != sorted(want) \
            or len(have) > 6:
        return
    perms = [list(p) for p in itertools.permutations(range(len(have)))
             if list(p) != list(range(len(have))) and tuple(have[i] for i in p) == tuple(want)]
    torch_perm = _torch_perm(ctx, len(have))
    if torch_perm in perms:
        perms.remove(torch_perm)
        perms.insert(0, torch_perm)
    for perm in perms[:MAX_VIEW_PERMS]:
        yield make(proto.name, "op", f"Reshape to {list(want)} (a view: the values keep their memory order)",
                   f"Transpose perm={perm} (the axes permuted)", "the PyTorch output", _as_transpose(proto.name, perm))


def _torch_perm(ctx, rank: int) -> list[int] | None:
    """The permutation of the divergent PyTorch op, when it is a ``permute`` / ``transpose`` of rank ``rank``."""
    from .alternatives import op_perm  # alternatives dispatches to this module: imported when first needed

    act = ctx.layer.pair.activation
    return op_perm(act, rank) if act.op else None


def _as_transpose(node: str, perm: list[int]):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type, target.domain = "Transpose", ""
        del target.input[1:]
        del target.attribute[:]
        target.attribute.append(helper.make_attribute("perm", perm))
        return model, weights
    return edit


def unflattened(ctx, proto, shape_of, make) -> Iterator:
    """A Softmax of a tensor a Reshape flattened (``[..., a, b] → [..., a·b]``, or to two dimensions as opset 11's
    Softmax coerces its input), made a Softmax of the unflattened tensor over one of the merged axes — the last
    first — and flattened after it as before: a normalisation over the merged axes jointly where the model
    normalises over one (an opset-11 Softmax's semantics read as opset 13's, a converter flattening the scores)."""
    graph = ctx.onnx.graph
    flat = graph.node_of(proto.input[0])
    if flat is None or flat.op_type not in ("Reshape", "Flatten"):
        return
    source = flat.inputs[0]
    full, merged = shape_of(source), shape_of(proto.input[0])
    if not full or not merged or len(full) <= len(merged) or tuple(full[:len(merged) - 1]) != tuple(
            merged[:-1]) and len(merged) != 2:
        return
    axis = attribute(proto, "axis", -1) % len(merged)
    start = (len(merged) - 1 if len(merged) != 2 or tuple(full[:1]) == tuple(merged[:1]) and axis == 1 else None)
    if start is None or int(np.prod(full[start:])) != merged[-1] or axis != len(merged) - 1:
        start = next((k for k in range(1, len(full)) if int(np.prod(full[:k])) == merged[0]
                      and int(np.prod(full[k:])) == merged[-1]), None) if len(merged) == 2 and axis == 1 else None
        if start is None:
            return
    for k in range(len(full) - 1, start - 1, -1):
        yield make(proto.name, "axis", f"{axis} of the flattened {list(merged)} (the axes from {start} of "
                   f"{list(full)} normalised jointly)", f"{k} of {list(full)} (then flattened as before)",
                   "the PyTorch output", _softmax_before_flatten(proto.name, source, k, flat.name))


def _softmax_before_flatten(node: str, source: str, axis: int, flatten: str):
    def edit(model, weights):
        target, flat = edits.node(model, node), edits.node(model, flatten)
        out = target.output[0]
        inner = f"{node}_unflattened"
        target.input[0], target.output[0] = source, inner
        kept = [a for a in target.attribute if a.name != "axis"]
        del target.attribute[:]
        target.attribute.extend(kept + [helper.make_attribute("axis", axis)])
        again = helper.make_node(flat.op_type, [inner, *flat.input[1:]], [out], name=f"{node}_flattened_after")
        again.attribute.extend(flat.attribute)
        nodes = list(model.graph.node)
        at = next(i for i, n in enumerate(nodes) if n.name == node)
        model.graph.ClearField("node")
        model.graph.node.extend(nodes[:at + 1] + [again] + nodes[at + 1:])
        edits.drop_value_info(model, {out, inner})
        return model, weights
    return edit


def _zero_state(ctx, proto, make) -> Iterator:
    """An RNN given an initial state (``initial_h``, ``initial_c``) where PyTorch starts from zeros (the module
    called without one): the state inputs left empty.  A port threading one layer's final state into the next,
    or a traced state baked in as a constant."""
    given = [i for i in (5, 6) if i < len(proto.input) and proto.input[i]]
    if not given or not _called_without_state(ctx, proto):
        return
    yield make(proto.name, "initial state", [proto.input[i] for i in given], "zeros (no initial state: PyTorch's "
               "default)", "the PyTorch output", _without_inputs(proto.name, given))


def _called_without_state(ctx, proto) -> bool:
    """Whether PyTorch's RNN module here was called with its input alone (so its state starts at zero); True when
    the call is not known (the re-run decides)."""
    info = next((n for n in ctx.segment_nodes if n.name == proto.name), None)
    if info is None:
        return True
    owner, module = ctx.module_of(info)
    act = ctx.activation_of(owner) if owner else None
    inputs = getattr(act, "inputs", None) if act is not None and not act.op else None
    return True if inputs is None else len(inputs) <= 1


def _without_inputs(node: str, positions: list[int]):
    def edit(model, weights):
        target = edits.node(model, node)
        for i in positions:
            target.input[i] = ""
        return model, weights
    return edit


def _scale_inside_softmax(ctx, proto, make) -> Iterator:
    """A Mul (Div) by one number applied to a Softmax's output, moved to its input: ``softmax(x)·s`` written where
    the model computes ``softmax(s·x)`` (an attention scale put after the normalisation: the weights then sum to s
    and keep the unscaled logits' sharpness)."""
    if len(proto.input) != 2:
        return
    graph = ctx.onnx.graph
    for k in (0, 1):
        source, scale = graph.node_of(proto.input[k]), ctx.constant(proto.input[1 - k])
        if source is None or source.op_type not in ("Softmax", "LogSoftmax") or scale is None or scale.size != 1 \
                or proto.op_type == "Div" and k != 0 or len(graph.consumers.get(proto.input[k], ())) != 1:
            continue
        number = float(np.asarray(scale).reshape(-1)[0])
        said = f"×{number:.6g}" if proto.op_type == "Mul" else f"÷{number:.6g}"
        inside = f"{number:.6g}·x" if proto.op_type == "Mul" else f"x/{number:.6g}"
        alt = make(proto.name, "placement", f"{said} applied to the output of {source.op_type} {source.name}",
                   f"{said} applied to its input ({source.op_type}({inside}))", "the PyTorch output",
                   _moved_before(proto.name, proto.input[1 - k], source.name))
        path = _scores_path(graph, source)
        yield dataclasses.replace(alt, shows_in=(*path, proto.name))
        product = next((n for n in graph.nodes if n.name in path and n.op_type in PRODUCTS), None)
        if product is not None and graph.node_of(source.inputs[0]) is not product:
            # a bias added to the scores between (a relative position bias) is not scaled: the scale on the product
            alt = make(proto.name, "placement", f"{said} applied to the output of {source.op_type} {source.name}",
                       f"{said} applied to the scores {product.name} computes, before what is added to them",
                       "the PyTorch output", _scaled_after(proto.name, proto.input[1 - k], product.name))
            yield dataclasses.replace(alt, shows_in=(*path, proto.name))


def _mask_before_softmax(ctx, proto, make) -> Iterator:
    """A mask applied to a Softmax's output (``softmax(s).masked_fill(mask, 0)``: the masked weights zeroed, the
    others not renormalised) moved to its input, where the model masks the scores (``softmax(s + mask)``): a Where
    of the probabilities and zero after the Softmax, its condition then applied to the scores with the type's
    lowest number."""
    graph = ctx.onnx.graph
    for c in graph.consumers.get(proto.output[0], ()):
        where = graph.nodes[c]
        if where.op_type != "Where" or len(where.inputs) != 3 or proto.output[0] not in where.inputs[1:]:
            continue
        kept = where.inputs.index(proto.output[0])  # 1: kept where the condition holds, 2: where it does not
        zero = ctx.constant(where.inputs[3 - kept])
        if zero is None or zero.size != 1 or float(np.asarray(zero).reshape(())) != 0.0:
            continue
        cond = graph.node_of(where.inputs[0])
        shown = (proto.name, where.name, *((cond.name,) if cond is not None and cond.op_type in COMPARISONS else ()))
        alt = make(proto.name, "placement", f"the mask of {where.name} applied to the probabilities (zeroed, not "
                   "renormalised)", "the mask applied to the scores before the Softmax", "the PyTorch output",
                   _masked_before(proto.name, where.inputs[0], kept, graph.elem_types.get(proto.input[0])))
        yield dataclasses.replace(alt, shows_in=shown)


def _unnormalised(ctx, proto, make) -> Iterator:
    """An exponential of scores shifted by their maximum, ``exp(x − max(x))``, that nothing divides by its sum: a
    softmax written out (an online / flash softmax port) without its last step — the division by the sum over the
    maximum's axes put back."""
    graph = ctx.onnx.graph
    shift = graph.node_of(proto.input[0]) if proto.input else None
    if shift is None or shift.op_type != "Sub" or len(shift.inputs) != 2:
        return
    peak = graph.node_of(shift.inputs[1])
    if peak is None or peak.op_type != "ReduceMax" or not peak.inputs or peak.inputs[0] != shift.inputs[0] \
            or not peak.attribute("keepdims", 1):
        return
    axes = peak.attribute("axes") if peak.attribute("axes") is not None else (
        ctx.constant(peak.inputs[1]) if len(peak.inputs) > 1 and peak.inputs[1] else None)
    if axes is None:
        return
    axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    readers = [graph.nodes[i] for i in graph.consumers.get(proto.output[0], ())]
    if any(r.op_type in ("ReduceSum", "Div") for r in readers):
        return  # normalised already (a softmax written out in full)
    alt = make(proto.name, "op", f"exp(x − max(x)) over axes {axes}, not divided by its sum",
               f"Softmax over axes {axes} (the exponentials divided by their sum)", "the PyTorch output",
               _normalised(proto.name, axes))
    yield dataclasses.replace(alt, shows_in=(peak.name, shift.name))  # the softmax written out, all of it


def _normalised(node: str, axes: list[int]):
    """The Exp's readers reading its output divided by its sum over ``axes``."""
    def edit(model, weights):
        target = edits.node(model, node)
        out = target.output[0]
        total, shares = f"{node}_sum", f"{node}_normalised"
        axes_name = edits.add_initializer(model, f"{node}_sum_axes", np.array(axes, dtype=np.int64))
        for n in model.graph.node:
            n.input[:] = [shares if t == out else t for t in n.input]
        for o in model.graph.output:
            if o.name == out:
                o.name = shares
        added = [helper.make_node("ReduceSum", [out, axes_name], [total], name=total, keepdims=1),
                 helper.make_node("Div", [out, total], [shares], name=shares)]
        nodes = list(model.graph.node)
        at = next(i for i, n in enumerate(nodes) if n.name == node) + 1
        model.graph.ClearField("node")
        model.graph.node.extend(nodes[:at] + added + nodes[at:])
        return model, weights
    return edit


#: nodes computing a mask's condition (named with the mask moved)
COMPARISONS = frozenset({"Greater", "Less", "Equal", "Not", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Cast"})


def _masked_before(softmax: str, cond: str, kept: int, elem_type: int | None):
    """The Softmax reading its scores where ``cond`` keeps them (``kept`` 1: where it holds) and the type's lowest
    number elsewhere."""
    def edit(model, weights):
        target = edits.node(model, softmax)
        dtype = helper.tensor_dtype_to_np_dtype(elem_type or 1)
        low = edits.add_initializer(model, f"{softmax}_mask_fill", np.array(np.finfo(dtype).min, dtype=dtype))
        masked = f"{softmax}_masked_scores"
        inputs = [cond, target.input[0], low] if kept == 1 else [cond, low, target.input[0]]
        where = helper.make_node("Where", inputs, [masked], name=f"{softmax}_mask_before")
        target.input[0] = masked
        nodes = list(model.graph.node)
        at = next(i for i, n in enumerate(nodes) if n.name == softmax)
        edits.set_nodes(model, nodes[:at] + [where] + nodes[at:])
        return model, weights
    return edit


#: ops computing scores a scale may apply to anywhere along (a product, the layouts of its operands, a mask added)
PRODUCTS = frozenset({"MatMul", "Gemm", "Einsum"})
SCORE_STEPS = frozenset({"Add", "Sub", "Where", "Mul", "Div", "Reshape", "Transpose", "Cast"})


def _scores_path(graph, softmax) -> tuple[str, ...]:
    """The nodes along which a scale of the Softmax's scores belongs, any of them equivalent: back from the Softmax
    through masks and layouts to the product computing the scores, and the layout ops just before its operands (a
    query scaled before its heads are split) — the Softmax included; the Softmax alone when no product is found."""
    path, node = [softmax.name], softmax
    for _ in range(6):
        node = graph.node_of(node.inputs[0]) if node.inputs else None
        if node is None or node.op_type not in PRODUCTS | SCORE_STEPS:
            return (softmax.name,)
        path.append(node.name)
        if node.op_type in PRODUCTS:
            for operand in node.inputs[:2]:
                up = graph.node_of(operand)
                for _ in range(2):
                    if up is None or up.op_type not in ("Reshape", "Transpose"):
                        break
                    path.append(up.name)
                    up = graph.node_of(up.inputs[0]) if up.inputs else None
            return tuple(reversed(path))
    return (softmax.name,)


def _scaled_after(node: str, scale: str, product: str):
    def edit(model, weights):
        target, made = edits.node(model, node), edits.node(model, product)
        raw = made.output[0]
        scaled = f"{node}_after_{product}"
        inputs = [raw, scale] if target.op_type == "Div" or list(target.input).index(scale) == 1 else [scale, raw]
        moved = helper.make_node(target.op_type, inputs, [scaled], name=f"{node}_moved")
        edits.rewire(model, raw, scaled)
        edits.make_identity(model, node, target.input[0] if target.input[0] != scale else target.input[1])
        nodes = list(model.graph.node)
        at = next(i for i, n in enumerate(nodes) if n.name == product)
        model.graph.ClearField("node")
        model.graph.node.extend(edits.toposorted(nodes[:at + 1] + [moved] + nodes[at + 1:], model))
        edits.drop_value_info(model, {scaled})
        return model, weights
    return edit


def _moved_before(node: str, scale: str, softmax: str):
    def edit(model, weights):
        target, norm = edits.node(model, node), edits.node(model, softmax)
        x, out = norm.input[0], norm.output[0]
        scaled = f"{node}_before_{softmax}"
        inputs = [x, scale] if target.op_type == "Div" or list(target.input).index(scale) == 1 else [scale, x]
        moved = helper.make_node(target.op_type, inputs, [scaled], name=f"{node}_moved")
        norm.input[0] = scaled
        edits.make_identity(model, node, out)
        nodes = list(model.graph.node)
        at = next(i for i, n in enumerate(nodes) if n.name == softmax)
        model.graph.ClearField("node")  # (re-sorted: the scale's Constant, made just before its reader, goes first)
        model.graph.node.extend(edits.toposorted(nodes[:at] + [moved] + nodes[at:], model))
        edits.drop_value_info(model, {scaled})
        return model, weights
    return edit


#: single-node activations a port may apply on the wrong side of a layer
MOVABLE_ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Softplus", "Sigmoid", "HardSigmoid",
                                 "HardSwish", "Tanh", "Softsign", "Clip", "Gelu", "Mish"})
#: a layer an activation may sit before or after: its product, then perhaps its bias
LAYERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


#: elementwise ops an activation written out is made of (GELU's x·½(1 + erf(x/√2)), SiLU's x·σ(x))
ELEMENTWISE = frozenset({"Div", "Mul", "Add", "Sub", "Erf", "Tanh", "Sigmoid", "Pow", "Sqrt", "Neg", "Exp", "Log",
                         "Abs", "Softplus", "Relu", "Clip", "HardSigmoid"})
#: nodes of a written-out activation, at most
MAX_ACTIVATION_NODES = 8


def _activation_after_layer(ctx, proto, make) -> Iterator:
    """An activation (one node, or written out of elementwise ops computing from one tensor and constants) whose
    only reader is a layer (a Conv, a Gemm, a MatMul, perhaps then its bias Add), moved to the layer's output:
    ``fc(act(x))`` written where the model computes ``act(fc(x))`` (pre-activation ordering where the model
    post-activates, as a ResNet v2 block's port into v1's)."""
    graph = ctx.onnx.graph
    readers = [graph.nodes[i] for i in graph.consumers.get(proto.output[0], ())]
    if len(readers) != 1 or readers[0].op_type not in LAYERS or readers[0].inputs[0] != proto.output[0]:
        return
    found = _unary_block(ctx, proto)
    if found is None and proto.op_type in MOVABLE_ACTIVATIONS and proto.input and proto.input[0]:
        found = (proto.name,), proto.input[0]  # the activation alone (what it reads is computed from more)
    if found is None or len(found[0]) == 1 and proto.op_type not in MOVABLE_ACTIVATIONS:
        return
    nodes, source = found
    layer = readers[0]
    last = layer
    after = [graph.nodes[i] for i in graph.consumers.get(layer.outputs[0], ())]
    if len(after) == 1 and after[0].op_type == "Add" and any(ctx.constant(t) is not None for t in after[0].inputs):
        last = after[0]  # the layer's bias, added after its product
    if any(graph.nodes[i].op_type == proto.op_type for i in graph.consumers.get(last.outputs[0], ())):
        return  # the file applies it after the layer too: an op added before the layer, not one moved
    what = proto.op_type if len(nodes) == 1 else f"the activation written out ({', '.join(nodes)})"
    for named in (False, True):  # the layer's output keeps its name (the activation's is new), or the other way
        alt = make(proto.name, "placement", f"{what} applied to the input of {layer.op_type} {layer.name}",
                   f"it applied to the layer's output (after {last.name}, "
                   f"{'writing its tensor' if named else 'to what reads it'})", "the PyTorch output",
                   _activated_after(nodes, source, layer.name, last.name, named))
        yield dataclasses.replace(alt, shows_in=(*nodes, layer.name))


def _unary_block(ctx, proto) -> tuple[tuple[str, ...], str] | None:
    """The elementwise nodes computing ``proto``'s output from one tensor and constants alone, and that tensor:
    ``((names, in graph order), source)``; None when more than one tensor feeds them or they are too many."""
    graph = ctx.onnx.graph
    names, sources, frontier = {proto.name}, set(), [proto]
    while frontier:
        node = frontier.pop()
        for t in node.input:
            if not t or ctx.constant(t) is not None:
                continue
            up = graph.node_of(t)
            # a tensor read twice is the activation's input (GELU's x, SiLU's x); a vector constant is a layer's
            # (a bias, a scale), not an activation's
            inner = up is not None and up.op_type in ELEMENTWISE | MOVABLE_ACTIVATIONS \
                and len(graph.consumers.get(t, ())) == 1 and len(names) < MAX_ACTIVATION_NODES \
                and all((c := ctx.constant(i)) is None or c.size <= 1 for i in up.inputs if i)
            if inner and any(ctx.constant(i) is None for i in up.inputs if i):
                if up.name not in names:
                    names.add(up.name)
                    frontier.append(_proto(ctx, up.name))
            else:
                sources.add(t)
    if len(sources) != 1:
        return None
    order = {n.name: n.index for n in graph.nodes}
    return tuple(sorted(names, key=order.get)), next(iter(sources))


def _proto(ctx, name: str):
    """The node ``name`` of the file, as a NodeProto."""
    return next(p for p in ctx.onnx.skeleton.graph.node if p.name == name)


def _activated_after(nodes: tuple[str, ...], source: str, layer: str, last: str, named: bool = False):
    """``named``: the activation writes the layer's output tensor (a scope naming it the activation's), the
    layer a new one; else the layer keeps it and the activation writes a new one its readers read."""
    def edit(model, weights):
        block, first, end = set(nodes), edits.node(model, layer), edits.node(model, last)
        y = end.output[0]
        tail = edits.node(model, nodes[-1])
        after = f"{tail.name}_after_{last}"
        first.input[0] = source
        edits.rewire(model, y, after)  # what read the layer's output reads it activated
        end.output[0] = y
        for n in model.graph.node:
            if n.name in block:
                n.input[:] = [y if t == source else t for t in n.input]
        tail.output[0] = after
        if named:  # the names exchanged: the activation's output is the layer's old tensor
            raw = f"{last}_raw"
            edits.rewire(model, y, raw)
            end.output[0] = raw
            edits.rewire(model, after, y)
            tail.output[0] = y
        moved = [n for n in model.graph.node if n.name in block]
        rest = [n for n in model.graph.node if n.name not in block]
        at = next(i for i, n in enumerate(rest) if n.name == last)
        model.graph.ClearField("node")
        model.graph.node.extend(edits.toposorted(rest[:at + 1] + moved + rest[at + 1:], model))
        edits.drop_value_info(model, {after})
        return model, weights
    return edit
