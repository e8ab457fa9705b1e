"""Expose stage: pure graph rewrites that make intermediate tensors observable.

Nothing here runs a model and nothing mutates the caller's graph: each rewrite
imports a copy into onnx-graphsurgeon, edits it and exports a new ModelProto.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import OnnxLoadError

REF_SUFFIX = "::reference"


def expose_tensors(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose outputs also include ``names`` (in the given order)."""
    graph = _import(model)
    tensors = graph.tensors()
    have = {t.name for t in graph.outputs}
    for name in names:
        t = tensors.get(name)
        if t is None or name in have:
            continue  # an initializer is exposed as is: ONNX Runtime returns it like any output
        graph.outputs.append(t)
        have.add(name)
    return _export(graph, model)


def cut_at_tensors(model: onnx.ModelProto, references: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` in which the consumers of each tensor named in ``references``
    read a new graph input ``<name>::reference`` instead, and each such tensor is an output.

    Feeding the PyTorch reference values to those inputs makes every segment
    between two cut tensors compute from exact inputs, so one run measures each
    segment's *local* error.  The new inputs take the references' dtypes and the
    tensors' own declared shapes (symbolic where the graph leaves a dimension
    free, so one cut graph serves every input size), else the references' shapes.
    """
    graph = _import(model)
    tensors = graph.tensors()
    have = {t.name for t in graph.outputs}
    for name, value in references.items():
        t = tensors.get(name)
        if t is None or isinstance(t, gs.Constant) or t in graph.inputs:
            continue
        ref = gs.Variable(name + REF_SUFFIX, dtype=value.dtype, shape=_reference_shape(t, value))
        for node in list(t.outputs):
            node.inputs = [ref if x is t else x for x in node.inputs]
            _rename_outer(node, t.name, ref.name)
        graph.inputs.append(ref)
        if name not in have:
            graph.outputs.append(t)
            have.add(name)
    return _export(graph, model)


SWITCH_SUFFIX = "::cut"


def _reference_shape(tensor: gs.Variable, value: np.ndarray) -> list:
    """The shape a reference input for ``tensor`` declares: the tensor's own where it agrees with the value fed
    (symbolic dimensions kept, so one cut graph serves every input size), else the value's — a file's value
    info can be stale (an edited node computes another shape than the one recorded), and ONNX Runtime refuses a
    feed that contradicts the declared input."""
    declared = tensor.shape
    if declared is None or len(declared) != value.ndim:
        return list(value.shape)
    if any(isinstance(d, int) and d >= 0 and d != v for d, v in zip(declared, value.shape)):
        return list(value.shape)
    return list(declared)


def switch_at_tensors(model: onnx.ModelProto, references: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` in which the consumers of each tensor named in ``references`` read
    ``Where(<name>::cut, <name>::reference, <name>)``: fed ``True`` at ``<name>::cut``, the tensor is cut (its
    consumers read the PyTorch value fed at ``<name>::reference``); fed ``False``, the graph computes on from
    its own value. One session then runs any set of cuts (``Where`` selects, it computes nothing), which is
    what bisecting an amplified error needs. The outputs are the model's own."""
    graph = _import(model)
    tensors = graph.tensors()
    for name, value in references.items():
        t = tensors.get(name)
        if t is None or isinstance(t, gs.Constant) or t in graph.inputs or not t.outputs:
            continue
        shape = _reference_shape(t, value)
        ref = gs.Variable(name + REF_SUFFIX, dtype=value.dtype, shape=shape)
        flag = gs.Variable(name + SWITCH_SUFFIX, dtype=np.bool_, shape=[])
        chosen = gs.Variable(name + "::switched", dtype=value.dtype, shape=list(shape))
        consumers = list(t.outputs)
        graph.nodes.append(gs.Node("Where", name=name + "::switch", inputs=[flag, ref, t], outputs=[chosen]))
        for node in consumers:
            node.inputs = [chosen if x is t else x for x in node.inputs]
            _rename_outer(node, t.name, chosen.name)
        graph.inputs.extend([ref, flag])
    graph.toposort()
    return _export(graph, model)


def switch_input_name(tensor: str) -> str:
    """The boolean graph input that cuts ``tensor`` in a switched graph (see :func:`switch_at_tensors`)."""
    return tensor + SWITCH_SUFFIX


def reference_input_name(tensor: str) -> str:
    """The graph input that carries the PyTorch value of ``tensor`` in a cut graph."""
    return tensor + REF_SUFFIX


def _rename_outer(node: gs.Node, old: str, new: str) -> None:
    """Point subgraph references to an outer-scope tensor at its replacement."""
    for attr in node.attrs.values():
        graphs = [attr] if isinstance(attr, gs.Graph) else [a for a in attr if isinstance(a, gs.Graph)] if isinstance(attr, list) else []
        for sub in graphs:
            for sub_node in sub.nodes:
                for i, x in enumerate(sub_node.inputs):
                    if x.name == old:
                        sub_node.inputs[i] = gs.Variable(new, dtype=x.dtype, shape=x.shape)
                _rename_outer(sub_node, old, new)


def _import(model: onnx.ModelProto) -> gs.Graph:
    try:
        return gs.import_onnx(model)
    except Exception as exc:  # graphsurgeon raises its own exception types (and KeyError) on malformed graphs
        raise OnnxLoadError(_unreadable(exc)) from exc


def _unreadable(exc: Exception) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return (f"The ONNX graph cannot be rewritten to expose its tensors ({type(exc).__name__}: {first}): an "
            "attribute, type or name in the file is malformed. Re-export the model, or run onnx.checker on it.")


def _export(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    try:
        out = gs.export_onnx(graph, do_type_check=False)
    except Exception as exc:
        raise OnnxLoadError(_unreadable(exc)) from exc
    out.ir_version = original.ir_version
    del out.opset_import[:]
    out.opset_import.extend(original.opset_import)
    for f in original.functions:
        if f.name not in {x.name for x in out.functions}:
            out.functions.append(f)
    for vi in out.graph.output:
        # Outputs of ops shape inference does not know (contrib ops of an
        # optimized file) stay untyped; ONNX Runtime infers their types itself.
        if vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            vi.ClearField("type")
    return out
