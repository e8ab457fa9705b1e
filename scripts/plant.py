"""Plant single numerical faults into exported ONNX models, and find the nodes to plant them in.

Every planting function is pure: it takes an ``onnx.ModelProto`` (initializer
data loaded, not external) and returns a modified copy.  Nodes are found by
op type and the PyTorch module that emitted them: dynamo exports record it in
the ``pkg.torch.onnx.name_scopes`` metadata, TorchScript exports in node names
of the form ``/scope/path/OpType``.
"""
from __future__ import annotations

import ast
import math
from typing import Iterable

import numpy as np
import onnx
import torch
from onnx import numpy_helper

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_SQRT2 = math.sqrt(2.0)


# ---------------------------------------------------------------- finding nodes

def node_scope(node: onnx.NodeProto) -> str | None:
    """Qualified name of the innermost module that emitted ``node`` ('' = root, None = unknown)."""
    for prop in node.metadata_props:
        if prop.key == NAME_SCOPES_KEY:
            scopes = ast.literal_eval(prop.value)  # [..., innermost module, fx node name]
            return scopes[-2] if len(scopes) >= 2 else ""
    if node.name.startswith("/"):
        return ".".join(node.name.split("/")[1:-1])
    return None


def find_nodes(model: onnx.ModelProto, op_type: str | None = None,
               module: str | Iterable[str] | None = None) -> list[onnx.NodeProto]:
    """Top-level nodes, in graph order, of ``op_type`` emitted inside ``module`` or its submodules.

    ``module`` may be several alternatives, e.g. ``("conv2", "bn2")`` for a
    Conv with a folded BatchNorm (dynamo scopes it to the BatchNorm,
    TorchScript to the Conv).
    """
    modules = None if module is None else ((module,) if isinstance(module, str) else tuple(module))

    def inside(scope: str | None) -> bool:
        return scope is not None and any(
            m == "" or scope == m or scope.startswith(m + ".") for m in modules)

    return [n for n in model.graph.node
            if (op_type is None or n.op_type == op_type) and (modules is None or inside(node_scope(n)))]


def find_node(model: onnx.ModelProto, op_type: str, module: str | Iterable[str],
              index: int = 0) -> onnx.NodeProto:
    """The ``index``-th node of :func:`find_nodes`; LookupError (listing the scopes of that op type) if none."""
    nodes = find_nodes(model, op_type, module)
    if index >= len(nodes):
        seen = sorted({str(node_scope(n)) for n in find_nodes(model, op_type)})
        raise LookupError(f"no {op_type} node #{index} in module {module!r}; {op_type} nodes are in: {seen}")
    return nodes[index]


def weight_of(model: onnx.ModelProto, node_name: str) -> str:
    """Name of the first initializer among the inputs of ``node_name`` (a Conv/Gemm/MatMul weight)."""
    inits = {i.name for i in model.graph.initializer}
    for name in _node(model, node_name).input:
        if name in inits:
            return name
    raise LookupError(f"node {node_name!r} reads no initializer")


# ---------------------------------------------------------------- planting faults

def set_attribute(model: onnx.ModelProto, node_name: str, attr: str, value) -> onnx.ModelProto:
    """Copy of ``model`` with attribute ``attr`` of ``node_name`` set to ``value``.

    An existing attribute keeps its type (``epsilon=1`` stays a float).
    """
    out = _copy(model)
    node = _node(out, node_name)
    for a in node.attribute:
        if a.name == attr:
            coerce = {onnx.AttributeProto.FLOAT: float, onnx.AttributeProto.INT: int}.get(a.type)
            a.CopyFrom(onnx.helper.make_attribute(attr, coerce(value) if coerce else value, attr_type=a.type))
            return out
    node.attribute.append(onnx.helper.make_attribute(attr, value))
    return out


def perturb_initializer(model: onnx.ModelProto, init_name: str, rel: float = 0.05,
                        seed: int = 0) -> onnx.ModelProto:
    """Copy of ``model`` with Gaussian noise of ``rel`` times its std added to initializer ``init_name``."""
    out = _copy(model)
    init = _initializer(out, init_name)
    w = numpy_helper.to_array(init)
    noise = np.random.default_rng(seed).standard_normal(w.shape)
    init.CopyFrom(numpy_helper.from_array((w + rel * w.std() * noise).astype(w.dtype), init.name))
    return out


def set_gelu_tanh(model: onnx.ModelProto, node_name: str) -> onnx.ModelProto:
    """Copy of ``model`` whose GELU at ``node_name`` uses the tanh approximation.

    ``node_name`` is a ``Gelu`` node (its ``approximate`` becomes "tanh") or the
    ``Erf`` node of a decomposed exact GELU ``x/2 * (1 + erf(x/sqrt(2)))``.  That
    ``Erf(u)`` is replaced by ``tanh(2/sqrt(pi) * (u + 2*0.044715*u**3))``, which
    turns the surrounding arithmetic into exactly the tanh approximation.  The new
    nodes keep the Erf's name prefix and metadata, so they map to the same module.
    """
    node = _node(model, node_name)
    if node.op_type == "Gelu":
        return set_attribute(model, node_name, "approximate", "tanh")
    if node.op_type != "Erf" or not _is_gelu_erf(model, node):
        raise ValueError(f"{node_name!r} is a {node.op_type}, not a Gelu or the Erf of a decomposed GELU")
    out = _copy(model)
    erf = _node(out, node_name)
    u, y = erf.input[0], erf.output[0]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(_elem_type(out, u))
    c_cube, c_scale = f"{erf.name}_tanh_cube_coef", f"{erf.name}_tanh_scale"
    out.graph.initializer.extend([
        numpy_helper.from_array(np.array(2 * 0.044715, dtype), c_cube),
        numpy_helper.from_array(np.array(2 / math.sqrt(math.pi), dtype), c_scale),
    ])
    t = [f"{y}_tanh_{k}" for k in range(5)]
    steps = [("Mul", [u, u], t[0]), ("Mul", [t[0], u], t[1]), ("Mul", [t[1], c_cube], t[2]),
             ("Add", [u, t[2]], t[3]), ("Mul", [t[3], c_scale], t[4]), ("Tanh", [t[4]], y)]
    replacement = []
    for k, (op, inputs, output) in enumerate(steps):
        new = onnx.helper.make_node(op, inputs, [output], name=f"{erf.name}_tanh_{k}_{op}")
        new.metadata_props.extend(erf.metadata_props)
        replacement.append(new)
    nodes = list(out.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == node_name)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes[:at] + replacement + nodes[at + 1:])
    return out


def refold_batchnorm(model: onnx.ModelProto, conv_node_name: str, torch_conv: torch.nn.Conv2d,
                     torch_bn: torch.nn.modules.batchnorm._BatchNorm, eps: float) -> onnx.ModelProto:
    """Copy of ``model`` whose Conv ``conv_node_name`` holds ``torch_conv`` folded with ``torch_bn``
    using ``eps`` instead of ``torch_bn.eps`` (what a BatchNorm fold with the wrong epsilon produces).

    The Conv's weight and bias initializers are overwritten; a bias is added if the Conv has none.
    """
    with torch.no_grad():
        weight = torch_conv.weight.double()
        channels = weight.shape[0]
        gamma = torch_bn.weight.double() if torch_bn.weight is not None else torch.ones(channels, dtype=torch.float64)
        beta = torch_bn.bias.double() if torch_bn.bias is not None else torch.zeros(channels, dtype=torch.float64)
        bias = torch_conv.bias.double() if torch_conv.bias is not None else torch.zeros(channels, dtype=torch.float64)
        scale = gamma / torch.sqrt(torch_bn.running_var.double() + eps)
        folded_w = (weight * scale.reshape(-1, *[1] * (weight.dim() - 1))).numpy()
        folded_b = ((bias - torch_bn.running_mean.double()) * scale + beta).numpy()
    out = _copy(model)
    conv = _node(out, conv_node_name)
    if conv.op_type != "Conv":
        raise ValueError(f"{conv_node_name!r} is a {conv.op_type}, not a Conv")
    w_init = _initializer(out, conv.input[1])
    if tuple(w_init.dims) != folded_w.shape:
        raise ValueError(f"{conv_node_name!r} weight has shape {tuple(w_init.dims)}, torch_conv {folded_w.shape}")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(w_init.data_type)
    w_init.CopyFrom(numpy_helper.from_array(folded_w.astype(dtype), w_init.name))
    if len(conv.input) > 2 and conv.input[2]:
        b_init = _initializer(out, conv.input[2])
        b_init.CopyFrom(numpy_helper.from_array(folded_b.astype(dtype), b_init.name))
    else:
        name = f"{conv_node_name}_folded_bias"
        out.graph.initializer.append(numpy_helper.from_array(folded_b.astype(dtype), name))
        del conv.input[2:]
        conv.input.append(name)
    return out


def set_constant(model: onnx.ModelProto, tensor: str, value: float) -> onnx.ModelProto:
    """Copy of ``model`` whose scalar initializer or Constant output ``tensor`` holds ``value`` (its dtype kept)."""
    out = _copy(model)
    for init in out.graph.initializer:
        if init.name == tensor:
            old = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(np.full(old.shape, value, old.dtype), tensor))
            return out
    for node in out.graph.node:
        if node.op_type == "Constant" and node.output[0] == tensor:
            old = _constant(out, tensor)
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(np.full(old.shape, value, old.dtype))))
            return out
    raise KeyError(f"{tensor!r} is neither an initializer nor a Constant output")


def set_gelu_formula(model: onnx.ModelProto, module: str | Iterable[str], formula: str) -> onnx.ModelProto:
    """Copy of ``model`` whose GELU emitted by ``module`` computes ``formula`` ("erf", "tanh" or "fast" for
    com.microsoft FastGelu), whatever form it had.

    The module's nodes are replaced by one node or a decomposition reading the
    module's input and writing its output, with the scope of the last node.
    """
    nodes = [n for n in find_nodes(model, None, module) if n.op_type != "Constant"]
    if not nodes:
        raise LookupError(f"no nodes in module {module!r}")
    produced = {o for n in nodes for o in n.output}
    x = next(i for n in nodes for i in n.input if i and i not in produced and _constant(model, i) is None)
    y = nodes[-1].output[0]
    if len(nodes) == 1 and nodes[0].op_type == "Gelu" and formula in ("erf", "tanh"):
        return set_attribute(model, nodes[0].name, "approximate", "none" if formula == "erf" else "tanh")
    out = _copy(model)
    prefix = f"{nodes[-1].name}_{formula}"
    dtype = onnx.helper.tensor_dtype_to_np_dtype(_elem_type(out, x))
    if formula == "fast":
        new = [onnx.helper.make_node("FastGelu", [x], [y], name=prefix, domain="com.microsoft")]
        if not any(o.domain == "com.microsoft" for o in out.opset_import):
            out.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    else:
        consts = {"half": 0.5, "one": 1.0, "sqrt2": _SQRT2, "c": 0.044715, "k": math.sqrt(2 / math.pi)}
        out.graph.initializer.extend(numpy_helper.from_array(np.array(v, dtype), f"{prefix}_{k}") for k, v in consts.items())
        c = {k: f"{prefix}_{k}" for k in consts}
        t = [f"{prefix}_t{k}" for k in range(8)]
        if formula == "erf":
            steps = [("Div", [x, c["sqrt2"]], t[0]), ("Erf", [t[0]], t[1]), ("Add", [t[1], c["one"]], t[2]),
                     ("Mul", [x, t[2]], t[3]), ("Mul", [t[3], c["half"]], y)]
        else:
            steps = [("Mul", [x, x], t[0]), ("Mul", [t[0], x], t[1]), ("Mul", [t[1], c["c"]], t[2]),
                     ("Add", [x, t[2]], t[3]), ("Mul", [t[3], c["k"]], t[4]), ("Tanh", [t[4]], t[5]),
                     ("Add", [t[5], c["one"]], t[6]), ("Mul", [x, t[6]], t[7]), ("Mul", [t[7], c["half"]], y)]
        new = [onnx.helper.make_node(op, ins, [o], name=f"{prefix}_{k}_{op}") for k, (op, ins, o) in enumerate(steps)]
    for n in new:
        n.metadata_props.extend(nodes[-1].metadata_props)
    _replace(out, {n.name for n in nodes}, new)
    return out


def fold_batchnorm(model: onnx.ModelProto, node_name: str, torch_layer: torch.nn.Module,
                   torch_bn: torch.nn.modules.batchnorm._BatchNorm, *, eps: float | None = None,
                   mean=None, var=None, bn_node: str | None = None) -> onnx.ModelProto:
    """Copy of ``model`` whose Conv/Gemm ``node_name`` holds ``torch_layer`` folded with ``torch_bn`` using the
    given ``eps`` / running ``mean`` / ``var`` instead of the module's (what a faulty fold produces).

    ``bn_node``: a BatchNormalization node still in the graph after the layer; it
    is removed and the layer writes its output (the fold a simplifier performs).
    """
    with torch.no_grad():
        w = torch_layer.weight.double().numpy()
        out_ch = w.shape[0]
        b = torch_layer.bias.double().numpy() if torch_layer.bias is not None else np.zeros(out_ch)
        gamma = torch_bn.weight.double().numpy() if torch_bn.weight is not None else np.ones(out_ch)
        beta = torch_bn.bias.double().numpy() if torch_bn.bias is not None else np.zeros(out_ch)
        m = torch_bn.running_mean.double().numpy() if mean is None else np.asarray(mean, np.float64)
        v = torch_bn.running_var.double().numpy() if var is None else np.asarray(var, np.float64)
    scale = gamma / np.sqrt(v + (torch_bn.eps if eps is None else eps))
    folded_w = w * scale.reshape(-1, *[1] * (w.ndim - 1))
    folded_b = (b - m) * scale + beta
    out = _copy(model)
    layer = _node(out, node_name)
    if layer.op_type not in ("Conv", "Gemm"):
        raise ValueError(f"{node_name!r} is a {layer.op_type}, not a Conv or Gemm")
    w_init = _initializer(out, layer.input[1])
    transposed = layer.op_type == "Gemm" and not any(a.name == "transB" and a.i for a in layer.attribute)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(w_init.data_type)
    w_init.CopyFrom(numpy_helper.from_array((folded_w.T if transposed else folded_w).astype(dtype), w_init.name))
    if len(layer.input) > 2 and layer.input[2]:
        b_init = _initializer(out, layer.input[2])
        b_init.CopyFrom(numpy_helper.from_array(folded_b.astype(dtype).reshape(tuple(b_init.dims)), b_init.name))
    else:
        name = f"{node_name}_folded_bias"
        out.graph.initializer.append(numpy_helper.from_array(folded_b.astype(dtype), name))
        del layer.input[2:]
        layer.input.append(name)
    if bn_node is not None:
        bn = _node(out, bn_node)
        layer.output[0] = bn.output[0]
        _replace(out, {bn_node}, [])
    return out


def batch_statistics(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and (biased) variance of an (N, C, ...) activation: what a training-mode BatchNorm uses."""
    axes = tuple(i for i in range(values.ndim) if i != 1)
    return values.mean(axis=axes), values.var(axis=axes)


def insert_qdq(model: onnx.ModelProto, tensor: str, scale: float, zero_point: int = 0,
               dtype=np.int8) -> onnx.ModelProto:
    """Copy of ``model`` whose consumers of ``tensor`` read it through QuantizeLinear → DequantizeLinear
    with the given per-tensor ``scale`` and ``zero_point`` (a calibrated activation quantizer)."""
    out = _copy(model)
    base = tensor.replace("/", "_").replace(":", "_")
    s_name, z_name = f"{base}_qdq_scale", f"{base}_qdq_zero_point"
    out.graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), s_name),
                                  numpy_helper.from_array(np.array(zero_point, dtype), z_name)])
    q, dq = f"{base}_quantized", f"{base}_dequantized"
    for n in out.graph.node:
        for i, x in enumerate(n.input):
            if x == tensor:
                n.input[i] = dq
    for o in out.graph.output:
        if o.name == tensor:
            raise ValueError("quantizing a graph output is not supported")
    producer = next((k for k, n in enumerate(out.graph.node) if tensor in n.output), -1)
    meta = list(out.graph.node[producer].metadata_props) if producer >= 0 else []
    new = [onnx.helper.make_node("QuantizeLinear", [tensor, s_name, z_name], [q], name=f"{base}_QuantizeLinear"),
           onnx.helper.make_node("DequantizeLinear", [q, s_name, z_name], [dq], name=f"{base}_DequantizeLinear")]
    for n in new:
        n.metadata_props.extend(meta)
    nodes = list(out.graph.node)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes[:producer + 1] + new + nodes[producer + 1:])
    return out


def quantize_initializer(model: onnx.ModelProto, init_name: str, per_channel_axis: int | None = None) -> onnx.ModelProto:
    """Copy of ``model`` whose float initializer ``init_name`` is stored as symmetric int8 behind a
    DequantizeLinear (per tensor, or per channel along ``per_channel_axis``)."""
    out = _copy(model)
    init = _initializer(out, init_name)
    w = numpy_helper.to_array(init).astype(np.float64)
    if per_channel_axis is None:
        scale = np.array(max(np.abs(w).max(), 1e-12) / 127.0)
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    else:
        axes = tuple(i for i in range(w.ndim) if i != per_channel_axis)
        scale = np.maximum(np.abs(w).max(axis=axes), 1e-12) / 127.0
        shape = [1] * w.ndim
        shape[per_channel_axis] = -1
        q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    qname = f"{init_name}_int8"
    init.CopyFrom(numpy_helper.from_array(q, qname))
    out.graph.initializer.extend([numpy_helper.from_array(scale.astype(np.float32), f"{init_name}_scale"),
                                  numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{init_name}_zero_point")])
    attrs = {} if per_channel_axis is None else {"axis": per_channel_axis}
    dq = onnx.helper.make_node("DequantizeLinear", [qname, f"{init_name}_scale", f"{init_name}_zero_point"],
                               [init_name], name=f"{init_name}_DequantizeLinear", **attrs)
    consumer = next(k for k, n in enumerate(out.graph.node) if init_name in n.input)
    dq.metadata_props.extend(out.graph.node[consumer].metadata_props)
    nodes = list(out.graph.node)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes[:consumer] + [dq] + nodes[consumer:])
    return out


def quantize_static_qdq(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime.quantization.quantize_static (QDQ, int8, per-tensor, MinMax),
    calibrated on ``feeds``: a real quantizer's output."""
    import os
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = [feeds]

        def get_next(self):
            return self.batches.pop() if self.batches else None

    with tempfile.TemporaryDirectory() as tmp:
        source, target = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "qdq.onnx")
        onnx.save(model, source)
        quantize_static(source, target, _Reader(), quant_format=QuantFormat.QDQ)
        return onnx.load(target)


def quantize_dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime.quantization.quantize_dynamic (DynamicQuantizeLinear + ConvInteger /
    MatMulInteger, int8 weights, uint8 where ONNX Runtime's CPU kernels take no int8 ones): a real quantizer's
    output."""
    import os
    import tempfile

    import onnxruntime as ort
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as _quantize

    with tempfile.TemporaryDirectory() as tmp:
        source, target = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "dynamic.onnx")
        onnx.save(model, source)
        for weight_type in (QuantType.QInt8, QuantType.QUInt8):
            _quantize(source, target, weight_type=weight_type)
            try:
                ort.InferenceSession(target, providers=["CPUExecutionProvider"])
                break
            except Exception:  # noqa: BLE001 - ConvInteger has no int8-weight kernel on CPU
                continue
        return onnx.load(target)


def insert_offset(model: onnx.ModelProto, tensor: str, offset: np.ndarray) -> onnx.ModelProto:
    """Copy of ``model`` whose consumers of ``tensor`` read ``tensor + offset``: a fault none of the known
    causes explains (a stray constant from a hand edit)."""
    out = _copy(model)
    base = tensor.replace("/", "_").replace(":", "_")
    c, y = f"{base}_stray_offset", f"{base}_offset"
    out.graph.initializer.append(numpy_helper.from_array(np.asarray(offset, np.float32), c))
    for n in out.graph.node:
        n.input[:] = [y if x == tensor else x for x in n.input]
    producer = next(k for k, n in enumerate(out.graph.node) if tensor in n.output)
    add = onnx.helper.make_node("Add", [tensor, c], [y], name=f"{base}_stray_Add")
    add.metadata_props.extend(out.graph.node[producer].metadata_props)
    nodes = list(out.graph.node)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes[:producer + 1] + [add] + nodes[producer + 1:])
    return out


def insert_dropout(model: onnx.ModelProto, tensor: str, ratio: float = 0.2) -> onnx.ModelProto:
    """Copy of ``model`` with an active (training_mode=True) Dropout on ``tensor``: what exporting a model in
    training mode leaves in the graph."""
    out = _copy(model)
    base = tensor.replace("/", "_").replace(":", "_")
    r, t, y = f"{base}_dropout_ratio", f"{base}_dropout_training", f"{base}_dropped"
    out.graph.initializer.extend([numpy_helper.from_array(np.array(ratio, np.float32), r),
                                  numpy_helper.from_array(np.array(True), t)])
    for n in out.graph.node:
        for i, x in enumerate(n.input):
            if x == tensor:
                n.input[i] = y
    producer = next(k for k, n in enumerate(out.graph.node) if tensor in n.output)
    drop = onnx.helper.make_node("Dropout", [tensor, r, t], [y], name=f"{base}_Dropout")
    drop.metadata_props.extend(out.graph.node[producer].metadata_props)
    nodes = list(out.graph.node)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes[:producer + 1] + [drop] + nodes[producer + 1:])
    for o in out.graph.output:
        if o.name == tensor:
            o.name = y
    return out


def to_float16(model: onnx.ModelProto, keep_float32: Iterable[str] = ()) -> onnx.ModelProto:
    """Copy of ``model`` converted to float16 by onnxconverter-common (inputs and outputs stay float32),
    except the nodes named in ``keep_float32``.

    Two converter pitfalls are avoided first: graph outputs that other nodes also
    read get an Identity of their own, and recorded value types are dropped.
    """
    from onnxconverter_common import float16

    out = _copy(model)
    out.graph.ClearField("value_info")
    for o in out.graph.output:
        inner = f"{o.name}_before_output"
        for n in out.graph.node:
            n.output[:] = [inner if x == o.name else x for x in n.output]
            n.input[:] = [inner if x == o.name else x for x in n.input]
        out.graph.node.append(onnx.helper.make_node("Identity", [inner], [o.name], name=f"{o.name}_output"))
    return float16.convert_float_to_float16(out, keep_io_types=True, node_block_list=list(keep_float32))


# ---------------------------------------------------------------- internals

def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _replace(model: onnx.ModelProto, remove: set[str], new_nodes: list) -> None:
    """Put ``new_nodes`` where the first node named in ``remove`` was, dropping all of those (in place)."""
    nodes = list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name in remove)
    model.graph.ClearField("node")
    model.graph.node.extend([n for n in nodes[:at] if n.name not in remove] + list(new_nodes)
                            + [n for n in nodes[at:] if n.name not in remove])


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    for node in model.graph.node:
        if node.name == name:
            return node
    raise KeyError(f"no node named {name!r}")


def _initializer(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    for init in model.graph.initializer:
        if init.name == name:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                raise ValueError(f"initializer {name!r} is external data; load the model with its data")
            return init
    raise KeyError(f"no initializer named {name!r}")


def _constant(model: onnx.ModelProto, tensor: str) -> np.ndarray | None:
    """Value of ``tensor`` if it is an initializer or a Constant node's output."""
    for init in model.graph.initializer:
        if init.name == tensor:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == tensor:
            return numpy_helper.to_array(next(a.t for a in node.attribute if a.name == "value"))
    return None


def _is_gelu_erf(model: onnx.ModelProto, erf: onnx.NodeProto) -> bool:
    """Whether the Erf's input is ``x / sqrt(2)`` (a Div by sqrt(2) or a Mul by 1/sqrt(2))."""
    producer = next((n for n in model.graph.node if erf.input[0] in n.output), None)
    if producer is None or producer.op_type not in ("Div", "Mul"):
        return False
    target = _SQRT2 if producer.op_type == "Div" else 1 / _SQRT2
    for operand in producer.input[1:] if producer.op_type == "Div" else producer.input:
        value = _constant(model, operand)
        if value is not None and value.size == 1 and math.isclose(float(value), target, rel_tol=1e-3):
            return True
    return False


def _elem_type(model: onnx.ModelProto, tensor: str) -> int:
    """ONNX element type of ``tensor`` (shape inference if the graph does not record it)."""
    def lookup(graph: onnx.GraphProto) -> int | None:
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            if vi.name == tensor and vi.type.tensor_type.elem_type:
                return vi.type.tensor_type.elem_type
        return None

    found = lookup(model.graph) or lookup(onnx.shape_inference.infer_shapes(model).graph)
    if found is None:
        raise ValueError(f"cannot determine the element type of {tensor!r}")
    return found
