"""Weight readings of a bias: one dropped, stale, added after the activation, or missing inside the segment — each
confirmed by re-running the segment with PyTorch's bias where the module adds it."""
from __future__ import annotations

import dataclasses

import numpy as np
from onnx import helper

from ..support import edits, layout
from ..support import alternatives
from ...records import Cause
from ...records.graph import LAYOUT_OPS
from ...records.nest import to_numpy
from ..context import DiagnosisContext, Finding, FixedSegment
from .weight_params import MAX_SWAPS, bias_input, parameter_holding


#: ops that add a bias to a product after it
BIAS_ADDERS = frozenset({"Add"})


def bias_after(ctx: DiagnosisContext) -> Finding | None:
    """A Linear's or Conv's value paired with its product because the bias added after it does nothing (zeroed)
    or too little: the product plus the module's own bias reproduces PyTorch, while the Add after it adds
    another vector.  The stale bias is the Add's constant; the finding names the Add (just past the segment)."""
    bias = _captured_bias(ctx)
    if bias is None or ctx.layer.local is None or ctx.layer.local.ok:
        return None
    found = _adding_node(ctx, ctx.tensor, bias.size)
    if found is None:
        return None
    add, const_input, value = found
    try:
        product = ctx.local_value.astype(np.float64)
        shape = [1] * product.ndim
        shape[_channel_axis(product, bias.size, ctx.onnx.graph.node_of(ctx.tensor))] = bias.size
        restored = product + bias.astype(np.float64).reshape(shape)
    except (ValueError, IndexError):
        return None
    if not ctx.compare(restored.astype(ctx.local_value.dtype), ctx.reference).ok:
        return None
    rel = layout.relate(value.reshape(bias.shape).astype(np.float64), bias.astype(np.float64))
    if rel is None or rel.equal:
        return None
    param = _bias_name(ctx) or "bias"
    summary = (f"The bias '{const_input}' that node {add.name} adds after this product differs from {param} "
               f"(max abs {rel.max_abs:.2g}, relative L2 {rel.rel_l2:.2g}"
               + (", all zero" if not np.any(value) else "") + "): with the module's own bias added the product "
               "reproduces PyTorch's output. The file's bias comes from another checkpoint, or was dropped.")
    fix = ("Re-export from the checkpoint PyTorch runs, or restore the bias: check the export or conversion step "
           "that wrote it (a converter that drops or zeroes biases, a state dict loaded without them).")
    product = ctx.onnx.graph.node_of(ctx.tensor)
    nodes = tuple(dict.fromkeys([*([product.name] if product is not None else []), add.name]))
    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix,
                   {"parameters": [{"initializer": const_input, "parameter": param, "layout": rel.layout.value,
                                    "max_abs": rel.max_abs, "rel_l2": rel.rel_l2,
                                    "fraction_differing": rel.fraction_differing, "correlation": rel.correlation}]},
                   changes=nodes, counterfactual=lambda c: _with_bias_at(c, add.name, const_input, bias))


def _captured_bias(ctx: DiagnosisContext):
    """The divergent Linear's or Conv's bias as captured, else the bias of the module whose op the value is."""
    activation = ctx.layer.pair.activation
    return activation.bias if activation.bias is not None else _op_bias(ctx)


def _module_bias(ctx: DiagnosisContext) -> np.ndarray | None:
    """The divergent module's bias: a Linear's or Conv's (captured), an op's module's, else a one-dimensional
    ``bias`` parameter of the module itself (GPT-2's Conv1D, a custom projection)."""
    activation = ctx.layer.pair.activation
    bias = _captured_bias(ctx)
    if bias is None and not activation.op:
        module = ctx.torch_module()
        own = getattr(module, "bias", None) if module is not None else None
        bias = to_numpy(own) if hasattr(own, "detach") and own.dim() == 1 else None
    return None if bias is None else np.asarray(bias)


def bias_missing(ctx: DiagnosisContext, candidates) -> Finding | None:
    """A Linear's or Conv's product that no bias is added to, where the module has one — or where a BatchNorm
    folded into it gives it one: the product plus that bias reproduces PyTorch (a converter dropped the bias
    input, or the Add after a MatMul).  The product node is the one computing the divergent tensor, or the one a
    Reshape / Transpose after it lays out."""
    product = _product_of(ctx, ctx.tensor)
    if product is None:
        return _bias_missing_inside(ctx)
    if product.op_type in ("Conv", "ConvTranspose", "Gemm") and len(product.inputs) > 2 and product.inputs[2]:
        return None  # it has a bias: a wrong one is a differing initializer
    own = _module_bias(ctx)
    biases = ([(own, _bias_name(ctx) or "the module's bias")] if own is not None else []) + [
        (np.asarray(v), k) for k, v in candidates.items() if k.startswith("fold(") and ".bias, " in k]
    value = ctx.local_value.astype(np.float64)
    for bias, param in biases[:3]:
        try:
            shape = [1] * value.ndim
            shape[_channel_axis(value, bias.size, product if ctx.onnx.graph.node_of(ctx.tensor) is product
                                else None)] = bias.size
            restored = value + bias.astype(np.float64).reshape(shape)
        except (ValueError, IndexError):
            continue
        if _adding_node(ctx, ctx.tensor, bias.size) is not None:
            return None  # a bias is added after it: the stale-bias reading (bias_after)
        if np.any(bias) and ctx.compare(restored.astype(ctx.local_value.dtype), ctx.reference).ok:
            return _moved_later(ctx, product, bias) or _bias_missing_finding(ctx, product, bias, param, shape)
    return None


#: elementwise ops an activation is written with, walked back from an Add to the product it follows
ELEMENTWISE = alternatives.ELEMENTWISE | {"Celu", "Min", "Max", "Where"}


def bias_moved(ctx: DiagnosisContext) -> Finding | None:
    """A bias added after the activation instead of to the product: in the segment, an Add of a constant of C
    values reads (through elementwise ops only) a product of C channels that no bias is added to; the segment
    with that Add moved onto the product reproduces PyTorch (``act(x) + b`` written for ``act(x + b)``)."""
    inside, tries = {n.name: n for n in ctx.segment_nodes}, 0
    for add in inside.values():
        if add.op_type != "Add" or len(add.inputs) != 2:
            continue
        constants = [ctx.constant(t) for t in add.inputs]
        if sum(c is not None for c in constants) != 1:
            continue
        at = 0 if constants[0] is not None else 1
        bias, stream = np.asarray(constants[at]), add.inputs[1 - at]
        if bias.size < 2 or max(bias.shape, default=1) != bias.size:
            continue
        for product, between in _products_behind(ctx, stream, inside):
            if not between or bias_input(ctx, product) is not None:
                continue  # nothing between them, or the product has its bias: no bias moved past an activation
            tries += 1
            if tries > MAX_SWAPS:
                return None
            fixed = _moved(ctx, add, stream, product, bias)
            if fixed is not None and ctx.reproduces(fixed):
                return _bias_moved_finding(ctx, add, product, between, bias, fixed)
    return None


def _products_behind(ctx: DiagnosisContext, tensor: str, inside: dict) -> list:
    """``(product, the ops between)`` for each bias-less product (MatMul, Gemm, Conv) of the segment that
    ``tensor`` is computed from through elementwise ops only, nearest first."""
    graph, found, seen, frontier, between = ctx.onnx.graph, [], set(), [tensor], []
    while frontier and len(seen) < 32:
        node = graph.node_of(frontier.pop(0))
        if node is None or node.name in seen or node.name not in inside:
            continue
        seen.add(node.name)
        if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
            if not (node.op_type != "MatMul" and len(node.inputs) > 2 and node.inputs[2]):
                found.append(node)
        elif node.op_type in ELEMENTWISE:
            between.append(node.op_type)
            frontier.extend(t for t in node.inputs if t and ctx.constant(t) is None)
    return [(p, tuple(dict.fromkeys(between))) for p in found]


def _moved_later(ctx: DiagnosisContext, product, bias: np.ndarray) -> Finding | None:
    """The bias-moved finding when the bias missing from ``product`` is added after the ops reading it."""
    later = _added_later(ctx, product, bias)
    if later is None:
        return None
    add, stream, between = later
    fixed = _moved(ctx, add, stream, product, bias)
    return None if fixed is None else _bias_moved_finding(ctx, add, product, between, bias, fixed)


def _added_later(ctx: DiagnosisContext, product, bias: np.ndarray):
    """``(Add node, the tensor it adds to, the ops between)`` of an Add of ``bias`` after the ops that read the
    bias-less ``product`` (elementwise ops only, at most 16 nodes on): the bias moved past the activation."""
    graph, flat = ctx.onnx.graph, bias.reshape(-1)
    frontier, seen, between = [product.outputs[0]], set(), []
    while frontier and len(seen) < 16:
        tensor = frontier.pop(0)
        for reader in (graph.nodes[c] for c in graph.consumers.get(tensor, ())):
            if reader.name in seen or reader.op_type not in ELEMENTWISE:
                continue
            seen.add(reader.name)
            others = [ctx.constant(t) for t in reader.inputs if t != tensor]
            if reader.op_type == "Add" and between and len(others) == 1 and others[0] is not None \
                    and others[0].size == flat.size and np.allclose(others[0].reshape(-1), flat, rtol=1e-6, atol=0):
                return reader, tensor, tuple(dict.fromkeys(between))
            between.append(reader.op_type)
            frontier.extend(reader.outputs)
    return None


def _bias_broadcast(ctx: DiagnosisContext, product, size: int) -> list[int] | None:
    """The shape a bias of ``size`` values takes to be added to ``product``'s output (over a Conv's channel axis,
    a MatMul's / Gemm's last axis); None when that axis is not ``size`` long or the shape is unknown."""
    shape = ctx.onnx.graph.shapes.get(product.outputs[0])
    if not shape:
        return None
    axis = 1 if product.op_type in ("Conv", "ConvTranspose") else len(shape) - 1
    if shape[axis] != size:
        return None
    broadcast = [1] * len(shape)
    broadcast[axis] = size
    return broadcast


def _moved(ctx: DiagnosisContext, add, stream: str, product, bias: np.ndarray) -> FixedSegment | None:
    """The segment with ``add``'s constant added to ``product``'s output instead (the Add passing ``stream`` on)."""
    broadcast = _bias_broadcast(ctx, product, bias.size)
    if broadcast is None:
        return None
    fixed = _with_bias_after(ctx, product, broadcast, bias.reshape(-1))
    edits.make_identity(fixed.model, add.name, stream)
    return fixed


def _bias_moved_finding(ctx: DiagnosisContext, add, product, between: tuple, bias: np.ndarray,
                        fixed: FixedSegment) -> Finding:
    param = _parameter_named(ctx, bias)
    what = f"{param} ({bias.size} values)" if param else f"a constant of {bias.size} values"
    summary = (f"Node {add.name} adds {what} after the ops ({', '.join(between)}) "
               f"that follow the product {product.name} ({product.op_type}), which no bias is added to: PyTorch adds "
               "the bias to the product before the activation. With the Add moved onto the product the segment "
               "reproduces PyTorch's output.")
    fix = ("Add the bias to the product (the node's bias input, or the Add right after the MatMul) and apply the "
           "activation to the sum; check the conversion or graph rewrite that moved it past the activation.")
    constant = next((t for t in add.inputs if ctx.constant(t) is not None), None)
    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix,
                   {"parameters": [{"initializer": constant, "parameter": param or None, "layout": "after activation",
                                    "max_abs": float(np.max(np.abs(bias))), "rel_l2": 0.0 if param else None,
                                    "fraction_differing": 0.0 if param else None,
                                    "correlation": 1.0 if param else None}]},
                   changes=(add.name, product.name), counterfactual=lambda c: fixed)


def _parameter_named(ctx: DiagnosisContext, value: np.ndarray) -> str:
    """The PyTorch parameter (or buffer) equal to ``value``, "" when none is (or with --reference)."""
    return parameter_holding(ctx, value, rtol=1e-5, atol=1e-7) or ""


def _product_of(ctx: DiagnosisContext, tensor: str):
    """The Conv / Gemm / MatMul computing ``tensor``, through the layout ops after it (at most two)."""
    node = ctx.onnx.graph.node_of(tensor)
    for _ in range(3):
        if node is None or node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul"):
            return node
        if node.op_type not in LAYOUT_OPS and node.op_type != "Cast":
            return None
        node = ctx.onnx.graph.node_of(node.inputs[0])
    return None


def _bias_missing_inside(ctx: DiagnosisContext) -> Finding | None:
    """The module's bias missing from a product inside the segment, with ops after it (``sin(ω·(xW + b))``, an
    activation the module applies itself): with the bias added to that product (an Add after it, or the node's
    bias input) the segment reproduces PyTorch."""
    own = _module_bias(ctx)
    if own is not None and not np.any(own):
        return None
    graph = ctx.onnx.graph
    for proto in ctx.segment_protos:
        node = graph.node_of(proto.output[0]) if proto.output else None
        if node is None or node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or (
                node.op_type != "MatMul" and len(node.inputs) > 2 and node.inputs[2]):
            continue
        param, bias = (_bias_name(ctx) or "the module's bias", own) if own is not None else _weights_bias(ctx, node)
        if bias is None or not np.any(bias) or _adding_node(ctx, node.outputs[0], bias.size) is not None:
            continue
        broadcast = _bias_broadcast(ctx, node, bias.size)
        if broadcast is None:
            continue
        fixed = _with_bias_after(ctx, node, broadcast, bias)
        try:
            values = ctx.run_segment(fixed.model, fixed.weights)
        except Exception:  # noqa: BLE001 - a bias that does not fit or run is not the answer
            continue
        if ctx.compare(values[ctx.tensor], ctx.reference).ok:
            moved = _moved_later(ctx, node, bias)
            if moved is not None:
                return moved
            finding = _bias_missing_finding(ctx, node, bias, param, broadcast)
            return dataclasses.replace(finding, counterfactual=lambda c, n=node, b=broadcast, v=bias: _with_bias_after(
                c, n, b, v))
    return None


def _weights_bias(ctx: DiagnosisContext, node) -> tuple[str, np.ndarray | None]:
    """``(name, value)`` of the bias of the Linear or Conv whose weight a product node of the segment reads, found
    by the weight's numbers (as the module holds it, or transposed for a MatMul): a divergence paired with an op
    after the layer (a head's projection split into its parts) has no bias of its own to read."""
    weight = ctx.initializer(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or weight.dtype.kind != "f" or weight.ndim < 2:
        return "", None
    for laid in (weight, weight.T) if weight.ndim == 2 else (weight,):
        name = parameter_holding(ctx, laid, rtol=1e-6, atol=0.0)
        owner, _, leaf = (name or "").rpartition(".")
        module = ctx.torch_module(owner) if leaf == "weight" else None
        bias = getattr(module, "bias", None) if module is not None else None
        if hasattr(bias, "detach") and bias.dim() == 1:
            return f"{owner}.bias", to_numpy(bias)
    return "", None


def _with_bias_after(ctx: DiagnosisContext, product, shape: list[int], bias: np.ndarray) -> FixedSegment:
    """The model with ``bias`` added to the product's output by an Add right after it (its readers read the sum)."""
    model = edits.copy_model(ctx.onnx.skeleton)
    out = product.outputs[0]
    weight = next((ctx.constant(t) for t in product.inputs[1:2] if ctx.constant(t) is not None), None)
    kind = ctx.onnx.graph.elem_types.get(out)
    dtype = helper.tensor_dtype_to_np_dtype(kind) if kind else (weight.dtype if weight is not None else np.float32)
    inner = f"{out}_without_bias"
    nodes = list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == product.name)
    nodes[at].output[0] = inner
    const = edits.add_initializer(model, f"{product.name}_restored_bias", bias.astype(dtype).reshape(shape))
    add = helper.make_node("Add", [inner, const], [out], name=f"{product.name}_bias_add")
    model.graph.ClearField("node")
    model.graph.node.extend(nodes[:at + 1] + [add] + nodes[at + 1:])
    edits.drop_value_info(model, {out, inner})
    return FixedSegment(model, ctx.onnx.weights)


def _bias_missing_finding(ctx: DiagnosisContext, product, bias: np.ndarray, param: str, shape: list[int]) -> Finding:
    summary = (f"Node {product.name} ({product.op_type}) computes the product without a bias, while PyTorch adds "
               f"{param} ({bias.size} values, max abs {float(np.max(np.abs(bias))):.2g}): the product plus that bias "
               "reproduces PyTorch's output. The file dropped the bias.")
    fix = ("Restore the bias (the node's bias input, or the Add after the MatMul), or re-export: check the "
           "conversion step that dropped it (a converter that skips biases, a state dict loaded without them).")
    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix,
                   {"parameters": [{"initializer": None, "parameter": param, "layout": "missing",
                                    "max_abs": float(np.max(np.abs(bias))), "rel_l2": 1.0,
                                    "fraction_differing": 1.0, "correlation": None}]},
                   changes=(product.name,), counterfactual=lambda c: _with_bias(c, product, shape, bias))


def _with_bias(ctx: DiagnosisContext, product, shape: list[int], bias: np.ndarray) -> FixedSegment:
    """The segment with the module's bias added to the product: as the node's bias input (Conv, Gemm), else by
    an Add after it that computes the divergent tensor."""
    model = edits.copy_model(ctx.onnx.skeleton)
    dtype = ctx.local_value.dtype
    if product.op_type in ("Conv", "ConvTranspose", "Gemm"):
        target = edits.node(model, product.name)
        del target.input[2:]
        while len(target.input) < 2:
            target.input.append("")
        target.input.append(edits.add_initializer(model, f"{product.name}_restored_bias",
                                                  bias.astype(dtype).reshape(-1)))
        return FixedSegment(model, ctx.onnx.weights)
    inner = f"{ctx.tensor}_without_bias"
    for n in model.graph.node:  # the node computing the divergent tensor: the product, or a layout op after it
        if ctx.tensor in n.output:
            n.output[list(n.output).index(ctx.tensor)] = inner
    const = edits.add_initializer(model, f"{product.name}_restored_bias", bias.astype(dtype).reshape(shape))
    model.graph.node.append(helper.make_node("Add", [inner, const], [ctx.tensor], name=f"{product.name}_bias_add"))
    edits.drop_value_info(model, {ctx.tensor, inner})
    return FixedSegment(model, ctx.onnx.weights)


#: ATen ops that add their module's bias to the product they compute
BIASED_OPS = ("aten.addmm", "aten.linear", "aten.convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d",
              "aten.baddbmm")


def _op_bias(ctx: DiagnosisContext) -> np.ndarray | None:
    """The bias parameter of the module whose weight the divergent op (``aten.addmm`` ...) read — a functional
    ``F.linear`` with a child's weight, an attention's packed projections — else of the module running it."""
    found = _op_bias_param(ctx)
    return None if found is None else found[1]


def _op_bias_param(ctx: DiagnosisContext) -> tuple[str, np.ndarray] | None:
    """``(qualified name, value)`` of :func:`_op_bias`'s parameter."""
    activation = ctx.layer.pair.activation
    if not activation.op or not activation.module_type.startswith(BIASED_OPS):
        return None
    for name in activation.params:  # a one-dimensional bias parameter the op read itself (a GRUCell's bias_hh)
        owner, _, leaf = name.rpartition(".")
        module = ctx.torch_module(owner) if "bias" in leaf else None
        bias = getattr(module, leaf, None) if module is not None else None
        if hasattr(bias, "detach") and bias.dim() == 1:
            return name, to_numpy(bias)
    owners = [p.rpartition(".")[0] for p in activation.params if p.endswith(".weight")] + [activation.module]
    for owner in owners:
        module = ctx.torch_module(owner)
        bias = getattr(module, "bias", None) if module is not None else None
        if bias is not None and hasattr(bias, "detach"):
            return (f"{owner}.bias" if owner else "bias"), to_numpy(bias)
    return None


def _bias_name(ctx: DiagnosisContext) -> str:
    """The qualified name of the divergent module's bias (its op's: :func:`_op_bias_param`), "" when unnamed."""
    found = _op_bias_param(ctx)
    module = ctx.layer.pair.activation.module
    return found[0] if found is not None else f"{module}.bias" if module else ""


def _adding_node(ctx: DiagnosisContext, tensor: str, size: int):
    """``(Add node, its constant input, the constant)`` of the one node reading ``tensor`` when it adds a constant
    of ``size`` elements (a bias)."""
    graph = ctx.onnx.graph
    readers = [graph.nodes[c] for c in graph.consumers.get(tensor, ())]
    if len(readers) != 1 or readers[0].op_type not in BIAS_ADDERS:
        return None
    add = readers[0]
    other = next((t for t in add.inputs if t != tensor), None)
    value = ctx.constant(other) if other else None
    if value is None or value.size != size or value.dtype.kind != "f":
        return None
    return add, other, value


def _channel_axis(value: np.ndarray, size: int, producer) -> int:
    """The axis a bias of ``size`` is added along: a Conv's channels (axis 1), else the last axis."""
    if producer is not None and producer.op_type in ("Conv", "ConvTranspose") and value.ndim > 1:
        return 1
    if value.shape[-1] != size:
        raise ValueError("no axis of the bias's size")
    return value.ndim - 1


def _with_bias_at(ctx: DiagnosisContext, add: str, const_input: str, bias: np.ndarray) -> FixedSegment:
    """The Add adds the module's bias, and computes the divergent tensor itself (the product renamed): the
    segment then ends with the bias added, as PyTorch's Linear or Conv does."""
    model = edits.copy_model(ctx.onnx.skeleton)
    product = f"{ctx.tensor}_without_bias"
    old_out = None
    for n in model.graph.node:
        if ctx.tensor in n.output:
            n.output[list(n.output).index(ctx.tensor)] = product
        elif n.name == add:
            old_out = n.output[0]
    target = edits.node(model, add)
    value = ctx.constant(const_input)
    fixed = edits.add_initializer(model, f"{add}_restored_bias", bias.astype(value.dtype).reshape(value.shape))
    target.input[:] = [product if t == ctx.tensor else fixed if t == const_input else t for t in target.input]
    target.output[0] = ctx.tensor
    if old_out is not None:
        edits.rewire(model, old_out, ctx.tensor)
    edits.drop_value_info(model, {ctx.tensor, old_out, product})
    return FixedSegment(model, ctx.onnx.weights)
