"""Small pure graph edits that counterfactuals are built from.

Each counterfactual starts from :func:`copy_model` of the context's skeleton and
edits only that copy; large weights are replaced by building a new ``Weights``
(the context's arrays are read-only and may be memory-mapped).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...records.weights import Weights


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of ``model``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    """The node called ``name`` in ``model`` (KeyError if none)."""
    for n in model.graph.node:
        if n.name == name:
            return n
    raise KeyError(f"no node named {name!r}")


def set_attribute(model: onnx.ModelProto, node_name: str, name: str, value: Any) -> onnx.ModelProto:
    """Set attribute ``name`` of ``node_name`` in ``model`` (in place on the copy; returned for chaining).

    An existing attribute keeps its type, so ``epsilon=1`` stays a float; ``None`` removes the attribute (its
    default applies).
    """
    target = node(model, node_name)
    if value is None:
        kept = [a for a in target.attribute if a.name != name]
        del target.attribute[:]
        target.attribute.extend(kept)
        return model
    for attr in target.attribute:
        if attr.name == name:
            coerce = {onnx.AttributeProto.FLOAT: float, onnx.AttributeProto.INT: int,
                      onnx.AttributeProto.INTS: lambda v: [int(x) for x in v],
                      onnx.AttributeProto.FLOATS: lambda v: [float(x) for x in v]}.get(attr.type)
            attr.CopyFrom(helper.make_attribute(name, coerce(value) if coerce else value, attr_type=attr.type))
            return model
    target.attribute.append(helper.make_attribute(name, value))
    return model


def replace_array(model: onnx.ModelProto, weights: Weights, name: str,
                  value: np.ndarray) -> tuple[onnx.ModelProto, Weights]:
    """Give initializer (or Constant output) ``name`` the value ``value``, in its own dtype.

    Split-off weights are replaced in a new ``Weights``; inline ones in ``model``.
    """
    if name in weights.arrays:
        arrays = dict(weights.arrays)
        arrays[name] = np.ascontiguousarray(value.astype(weights.arrays[name].dtype).reshape(weights.arrays[name].shape))
        return model, Weights(arrays)
    for init in model.graph.initializer:
        if init.name == name:
            dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
            init.CopyFrom(numpy_helper.from_array(np.asarray(value).astype(dtype).reshape(tuple(init.dims)), name))
            return model, weights
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            old = next(a for a in n.attribute if a.name in ("value", "value_float", "value_floats"))
            dtype = helper.tensor_dtype_to_np_dtype(old.t.data_type) if old.name == "value" else np.float32
            del n.attribute[:]
            n.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.asarray(value).astype(dtype))))
            return model, weights
    raise KeyError(f"{name!r} is neither an initializer nor a constant")


def add_initializer(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    """Add an inline initializer (in place) and return its name."""
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def make_identity(model: onnx.ModelProto, name: str, tensor: str) -> None:
    """Make node ``name`` an Identity of ``tensor`` (in place): its op not applied, its first output passing
    ``tensor`` on (its attributes and any further outputs dropped)."""
    target = node(model, name)
    target.op_type, target.domain = "Identity", ""
    del target.input[:], target.attribute[:], target.output[1:]
    target.input.append(tensor)


def rewire(model: onnx.ModelProto, old: str, new: str) -> None:
    """Make every consumer of tensor ``old`` (and the graph outputs) read ``new`` instead (in place)."""
    for n in model.graph.node:
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = new
    for out in model.graph.output:
        if out.name == old:
            out.name = new


def replace_nodes(model: onnx.ModelProto, remove: set[str], new_nodes: Sequence[onnx.NodeProto]) -> None:
    """Remove the nodes named in ``remove`` and put ``new_nodes`` where the first of them was (in place)."""
    nodes = list(model.graph.node)
    at = next((i for i, n in enumerate(nodes) if n.name in remove), len(nodes))
    kept_before = [n for n in nodes[:at] if n.name not in remove]
    kept_after = [n for n in nodes[at:] if n.name not in remove]
    model.graph.ClearField("node")
    model.graph.node.extend(kept_before + list(new_nodes) + kept_after)


def toposorted(nodes: Sequence[onnx.NodeProto], model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """``nodes`` reordered (stably) so that each follows the producers of its inputs; as given if they cycle."""
    made = {o for n in nodes for o in n.output if o}
    ready = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    pending, order = list(nodes), []
    while pending:
        rest = []
        for n in pending:
            if all(i in ready or i not in made for i in n.input):
                order.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            return list(nodes)
        pending = rest
    return order


def set_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """``model`` holding ``nodes`` (in place), re-sorted by :func:`toposorted`: an edit that rewires, moves or
    inserts nodes may leave one before what it now reads."""
    ordered = toposorted(list(nodes), model)
    model.graph.ClearField("node")
    model.graph.node.extend(ordered)
    return model


def drop_value_info(model: onnx.ModelProto, names: set[str] | None = None) -> None:
    """Forget recorded types of ``names`` (all when None), e.g. after a dtype change (in place)."""
    keep = [] if names is None else [v for v in model.graph.value_info if v.name not in names]
    model.graph.ClearField("value_info")
    model.graph.value_info.extend(keep)


def convert_float_type(model: onnx.ModelProto, weights: Weights, nodes: set[str], source: set[int],
                       target: int) -> tuple[onnx.ModelProto, Weights]:
    """Make the ``nodes`` compute in ``target`` instead of the ``source`` float types (in place on ``model``).

    Casts to a source type become casts to ``target``; initializers and
    constants of a source type that those nodes read are converted; recorded
    value types are dropped so the runtime infers the new ones.  The rest of
    the graph is left alone: only the segment is meant to run.
    """
    np_target = helper.tensor_dtype_to_np_dtype(target)
    read = {t for n in model.graph.node if n.name in nodes for t in n.input}
    arrays = dict(weights.arrays)
    for name in read & set(arrays):
        if helper.np_dtype_to_tensor_dtype(arrays[name].dtype) in source:
            arrays[name] = arrays[name].astype(np_target)
    for init in model.graph.initializer:
        if init.name in read and init.data_type in source and init.data_location != onnx.TensorProto.EXTERNAL:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np_target), init.name))
        elif init.name in read and init.name in arrays and init.data_type in source:
            init.data_type = target
    for n in model.graph.node:
        if n.name not in nodes:
            continue
        for attr in n.attribute:
            if attr.name in ("to", "dtype") and attr.i in source:
                attr.i = target
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in source:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np_target), attr.t.name))
    drop_value_info(model)
    return model, Weights(arrays)
