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


# ---------------------------------------------------------------- internals

def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


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
