"""Inventory: every node with its operator version and the types it actually sees."""
from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from ..records.graph import input_free
from .graphwalk import iter_nodes, node_keys
from .records import Inventory, NodeInfo, OpSignature
from .schemas import bind_types, find_schema, normalise_domain

_SIMPLE_ATTRS = {
    onnx.AttributeProto.FLOAT, onnx.AttributeProto.INT, onnx.AttributeProto.STRING,
    onnx.AttributeProto.FLOATS, onnx.AttributeProto.INTS, onnx.AttributeProto.STRINGS,
}
#: constants up to this many elements are kept for the risk rules (GELU's sqrt(2), Pow's 3 ...)
_SMALL = 64


def take_inventory(model: onnx.ModelProto, original: onnx.ModelProto | None = None) -> Inventory:
    """List the nodes of ``model`` (carrying shape-inference results) in walk order.

    Each node gets its schema's since-version under the model's opset imports,
    its input/output types from the inferred value infos, and the binding of
    those types to the schema's type constraints.  ``original`` is the model as
    given, when ``model`` is a view in which split-off weights became inputs.
    """
    source = (original or model).graph
    initializers = {i.name for i in source.initializer}
    declared = {i.name for i in source.input}
    opsets = {normalise_domain(o.domain): int(o.version) for o in model.opset_import}
    keys = node_keys(model.graph)
    types = _types(model.graph, {})
    constants = _small_initializers(model.graph)
    nodes: list[NodeInfo] = []
    producers: dict[str, int] = {}
    scopes: dict[int, dict[str, str | None]] = {id(model.graph): types}
    for index, (node, graph, owner) in enumerate(iter_nodes(model.graph)):
        scope = scopes.get(id(graph))
        if scope is None:  # a subgraph: its own value infos on top of the outer scope
            scope = scopes[id(graph)] = _types(graph, types)
            constants.update(_small_initializers(graph))
        nodes.append(_node_info(index, node, keys[index], owner, scope, opsets))
        for out in node.output:
            if out:
                producers[out] = index
        if node.op_type == "Constant" and not node.domain:
            _constant_value(node, constants)
    return Inventory(nodes=tuple(nodes), opsets=tuple(sorted(opsets.items())), ir_version=int(model.ir_version),
                     producers=producers, constants=constants, graph_inputs=frozenset(declared - initializers),
                     overridable=frozenset(declared & initializers), input_free=input_free(source))


def _node_info(index: int, node: onnx.NodeProto, key: str, owner: str, scope: dict, opsets: dict) -> NodeInfo:
    domain = normalise_domain(node.domain)
    schema = find_schema(domain, node.op_type, opsets.get(domain))
    in_types = [scope.get(name) if name else None for name in node.input]
    out_types = [scope.get(name) if name else None for name in node.output]
    bindings = bind_types(schema, in_types, out_types) if schema else {}
    return NodeInfo(
        index=index, name=node.name, key=key,
        signature=OpSignature(domain, node.op_type, schema.since_version if schema else None,
                              tuple(short_type(t) for t in in_types)),
        output_types=tuple(short_type(t) for t in out_types),
        inputs=tuple(node.input), outputs=tuple(node.output),
        attributes=tuple((a.name, _attr_value(a)) for a in node.attribute if a.type in _SIMPLE_ATTRS),
        graph=owner,
        type_bindings=tuple(sorted((k, tuple(sorted(v))) for k, v in bindings.items())),
        has_function=bool(schema and schema.inlinable_at(opsets.get(domain, 0))),
    )


def type_string(tp: onnx.TypeProto) -> str | None:
    """``tensor(float16)``, ``seq(tensor(float))``, ``optional(...)``; None when unknown."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        elem = tp.tensor_type.elem_type
        return f"tensor({_elem_name(elem)})" if elem else None
    if kind == "sequence_type":
        inner = type_string(tp.sequence_type.elem_type)
        return f"seq({inner})" if inner else None
    if kind == "optional_type":
        inner = type_string(tp.optional_type.elem_type)
        return f"optional({inner})" if inner else None
    if kind == "map_type":
        value = type_string(tp.map_type.value_type)
        return f"map({_elem_name(tp.map_type.key_type)},{value})" if value else None
    return None


def short_type(type_str: str | None) -> str | None:
    """``tensor(float16)`` -> ``float16``; other kinds unchanged."""
    if type_str and type_str.startswith("tensor(") and type_str.endswith(")"):
        return type_str[7:-1]
    return type_str


def _elem_name(elem: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem).lower()
    except ValueError:  # a number ONNX does not define (a corrupt file): shown as such, never raised
        return f"unknown-type-{elem}"


def _types(graph: onnx.GraphProto, outer: dict[str, str | None]) -> dict[str, str | None]:
    types = dict(outer)
    for init in graph.initializer:
        types[init.name] = f"tensor({_elem_name(init.data_type)})"
    for info in (*graph.input, *graph.value_info, *graph.output):
        found = type_string(info.type)
        if found or info.name not in types:
            types[info.name] = found
    return types


def _small_initializers(graph: onnx.GraphProto) -> dict:
    out = {}
    for init in graph.initializer:
        count = 1
        for d in init.dims:
            count *= d
        if count <= _SMALL and init.data_location != onnx.TensorProto.EXTERNAL:
            try:
                out[init.name] = numpy_helper.to_array(init)
            except Exception:  # exotic element types: not needed by any rule
                pass
    return out


def _constant_value(node: onnx.NodeProto, constants: dict) -> None:
    for attr in node.attribute:
        try:
            if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                value = numpy_helper.to_array(attr.t)
            elif attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
                value = helper.get_attribute_value(attr)
            else:
                continue
        except Exception:
            continue
        if getattr(value, "size", 1) <= _SMALL:
            constants[node.output[0]] = value


def _attr_value(attr: onnx.AttributeProto):
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value)
    return value
