"""Read-only index of an ONNX graph: nodes in order, producers, consumers, scopes."""
from __future__ import annotations

import ast
import re
from collections import defaultdict

import numpy as np
import onnx

from ..records.graph import HALF_TYPES, GraphIndex, NodeInfo, outer_inputs

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
REWRITE_RULE_KEY = "pkg.onnxscript.rewriter.rule_name"






def index_graph(model: onnx.ModelProto) -> GraphIndex:
    """Index ``model`` (ideally a shape-inferred skeleton, see ``weights``)."""
    g = model.graph
    initializers = frozenset(i.name for i in g.initializer) | frozenset(
        i.values.name for i in g.sparse_initializer)
    raw_nodes = _topological(list(g.node), {i.name for i in g.input} | initializers)
    nodes = []
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(raw_nodes):
        meta = {p.key: p.value for p in node.metadata_props}
        scope, source = _scope(node, meta)
        info = NodeInfo(
            index=i, name=node.name or f"{node.op_type}_{i}", op_type=node.op_type, domain=node.domain,
            inputs=tuple(node.input) + outer_inputs(node), outputs=tuple(node.output),
            scope=scope, scope_source=source, rewrite_rule=meta.get(REWRITE_RULE_KEY, ""),
            attributes=_plain_attributes(node),
        )
        nodes.append(info)
        for out in node.output:
            if out:
                producer[out] = i
        for inp in set(info.inputs):
            if inp:
                consumers[inp].append(i)
    elem_types, shapes = {}, {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type"):
            elem_types[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    for init in g.initializer:
        elem_types[init.name] = init.data_type
        shapes[init.name] = tuple(init.dims)
    return GraphIndex(
        nodes=tuple(nodes), producer=producer, consumers={k: tuple(v) for k, v in consumers.items()},
        graph_inputs=tuple(i.name for i in g.input if i.name not in initializers),
        graph_outputs=tuple(o.name for o in g.output), initializers=initializers,
        elem_types=elem_types, shapes=shapes, half_resolution=_half_resolution(
            nodes, elem_types, consumers, {o.name for o in g.output}), half_share=_half_share(g.initializer),
    )


def _half_share(initializers) -> float:
    """Share of the float initializers' elements stored in float16 or bfloat16 (0 when there are none)."""
    sizes = {}
    for init in initializers:
        if init.data_type in _WIDE + HALF_TYPES:
            n = int(np.prod(init.dims, dtype=np.int64)) if len(init.dims) else 1
            sizes[init.data_type in HALF_TYPES] = sizes.get(init.data_type in HALF_TYPES, 0) + n
    total = sum(sizes.values())
    return sizes.get(True, 0) / total if total else 0.0


_PLAIN = {onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING,
          onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS}


def _plain_attributes(node: onnx.NodeProto) -> tuple[tuple[str, object], ...]:
    """``(name, value)`` of the node's int, float and string attributes and their (short) lists."""
    out = []
    for a in node.attribute:
        if a.type in _PLAIN and len(a.ints) + len(a.floats) <= 64:
            value = onnx.helper.get_attribute_value(a)
            out.append((a.name, value.decode("utf-8", "replace") if isinstance(value, bytes) else
                        tuple(value) if isinstance(value, list) else value))
    return tuple(out)


#: ops whose outputs only hold values taken from their data inputs (a float16 value stays one)
_VALUE_MOVING = frozenset({
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Gather", "GatherElements",
    "GatherND", "Expand", "Tile", "Split", "Concat", "Pad", "DepthToSpace", "SpaceToDepth", "MaxPool", "Relu",
    "ReduceMax", "ReduceMin", "Neg", "Abs",
})
_WIDE = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def _half_resolution(nodes: list[NodeInfo], elem_types: dict[str, int], consumers: dict[str, list[int]],
                     outputs: set[str]) -> frozenset[str]:
    """Float32/float64 tensors that hold float16 data.

    * a Cast up from float16 (``keep_io_types`` converters end every graph
      output with one; a runtime may drop the Cast pair and compute the last
      op in float32, still from float16 data), and what only moves its values;
    * an op's float32 result that every consumer casts straight down to
      float16 (an op a converter kept in float32 between casts, Resize, say).

    Such a tensor is judged at float16 resolution though its type is float32.
    A float32 op that reads float16 data and hands on float32 is not: it is
    where a partly converted model leaves float16, and its error is measured
    at float32 resolution.
    """
    half: set[str] = set()
    for node in nodes:
        if not node.inputs or node.domain not in ("", "ai.onnx"):
            continue
        data = [i for i in node.inputs if i and elem_types.get(i) in _WIDE + HALF_TYPES]
        if node.op_type == "Cast":
            from_half = bool(data) and (elem_types.get(data[0]) in HALF_TYPES or data[0] in half)
        elif node.op_type in _VALUE_MOVING:
            data = data if node.op_type == "Concat" else data[:1]
            from_half = bool(data) and all(i in half for i in data)
        else:
            from_half = False
        for out in node.outputs:
            if not out or elem_types.get(out) not in _WIDE:
                continue
            readers = [nodes[i] for i in consumers.get(out, ())]
            narrowed = bool(readers) and out not in outputs and all(
                r.op_type == "Cast" and any(elem_types.get(o) in HALF_TYPES for o in r.outputs) for r in readers)
            if from_half or narrowed:
                half.add(out)
    return frozenset(half)


def _topological(nodes: list, available: set[str]) -> list:
    """Nodes in a valid topological order (exporters already emit one; keep it if so)."""
    ready = set(available)
    ordered, pending = [], list(nodes)
    while pending:
        progressed, rest = False, []
        for node in pending:
            needs = [i for i in list(node.input) + list(outer_inputs(node)) if i]
            if all(i in ready for i in needs):
                ordered.append(node)
                ready.update(o for o in node.output if o)
                progressed = True
            else:
                rest.append(node)
        if not progressed:  # a cycle or a dangling input: keep file order for the rest
            ordered.extend(rest)
            break
        pending = rest
    return ordered




_TS_NAME = re.compile(r"^/(.+)/[^/]+$")
_TS_TENSOR = re.compile(r"^/(.+)/[^/]+_output_\d+$")
_TS_ROOT = re.compile(r"^/[A-Za-z][A-Za-z0-9]*(_\d+)?$")  # "/Add", "/Concat_1": a node of the root forward


def _scope(node: onnx.NodeProto, meta: dict[str, str]) -> tuple[tuple[str, ...] | None, str]:
    """Module path of a node from dynamo metadata, else from a TorchScript-style name."""
    scopes = meta.get(NAME_SCOPES_KEY)
    if scopes:
        try:
            parts = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            parts = None
        if isinstance(parts, list) and parts:
            # ['', 'encoder', 'encoder.layer.0', ..., 'linear']: the last entry is the
            # FX node; the one before it is the innermost module's qualified name.
            module = parts[-2] if len(parts) >= 2 else ""
            return (tuple(module.split(".")) if module else ()), "metadata"
    # An optimizer that fuses nodes keeps the first node's name but the last node's
    # output tensor (ONNX Runtime's FusedConv: node /conv1/Conv, output
    # /relu1/Relu_output_0): the output's scope says what the node computes.
    # When the output's scope is an ancestor of the name's (a quantizer that absorbed a functional Relu left the
    # Conv /enc1/conv1/Conv writing /enc1/Relu_output_0), the name is the more exact — unless the node computes
    # the activation itself (ONNX Runtime's FusedConv writes the functional Relu's value: its output is right).
    by_output = _TS_TENSOR.match(node.output[0]) if node.output else None
    by_name = _TS_NAME.match(node.name or "")
    if by_output and by_name and not node.op_type.startswith("Fused"):
        outer, inner = _ts_parts(by_output.group(1)), _ts_parts(by_name.group(1))
        return (inner if len(inner) > len(outer) and inner[:len(outer)] == outer else outer), "name"
    m = by_output or by_name
    if m:
        return _ts_parts(m.group(1)), "name"
    if _TS_ROOT.match(node.name or ""):
        return (), "name"
    return None, ""


def _ts_parts(path: str) -> tuple[str, ...]:
    """``model/layer/layer.0/conv`` → ('model', 'layer', '0', 'conv').

    TorchScript names a Sequential's child after the Sequential *and* the child
    (``layer/layer.0``); the second component already contains the first.
    """
    comps: list[str] = []
    for comp in (c for c in path.split("/") if c):
        if comps and comp.startswith(comps[-1] + "."):
            comps[-1] = comp
        else:
            comps.append(comp)
    return tuple(p for comp in comps for p in comp.split(".") if p)
