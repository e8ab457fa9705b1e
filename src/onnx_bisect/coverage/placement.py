"""Placement: create real ONNX Runtime sessions and read which provider each node was assigned to.

The registry predicts; a session confirms.  Nodes the registry already
rejects are cut out of the full-model session (their outputs become inputs)
so one refusal does not hide every other placement, and each of them is
tried on its own in a one-node session.  Sessions are created with graph
optimizations off so nodes keep their names; nothing is run.
"""
from __future__ import annotations

import re
from typing import Iterable

import onnx
from onnx import helper

from .graphwalk import iter_nodes
from .records import Inventory, NodeInfo, Placement, ProviderInfo, RegistryState

_NOT_IMPLEMENTED = re.compile(r"Could not find an implementation for \S+?\(\d+\) node with name '([^']*)'")
_UNREGISTERED = re.compile(r"([\w.]*):(\w+)\(-?\d+\) is not a registered function/op")
_MAX_RETRIES = 16


def confirm_placement(skeleton: onnx.ModelProto, weights, inventory: Inventory, providers: Iterable[ProviderInfo],
                      suspects: set[str]) -> Placement:
    """Place the model's nodes with ONNX Runtime; ``suspects`` are node keys the registry says cannot run."""
    import onnxruntime as ort

    names = [p.name for p in providers if p.state is not RegistryState.NOT_IN_BUILD and not p.implicit]
    names = names or ["CPUExecutionProvider"]
    if not hasattr(ort.InferenceSession, "get_provider_graph_assignment_info"):
        return Placement(attempted=False, note=f"onnxruntime {ort.__version__} cannot report node placement")
    by_key = {n.key: n for n in inventory.nodes}
    model = _renamed(skeleton, [n.key for n in inventory.nodes])
    removable = {n.key for n in inventory.nodes if not n.graph and _typed_outputs(n)}
    removed = {k for k in suspects if k in removable}
    failed: dict[str, str] = {}
    note = ""
    for _ in range(_MAX_RETRIES):
        session, error = _session(_cut(model, [by_key[k] for k in removed]), weights, names)
        if session is not None:
            break
        refused = _refused_nodes(error, inventory)
        if not refused:
            return Placement(attempted=True, failed=failed, error=error)
        for key in refused:
            failed[key] = error
        if not set(refused) <= removable:
            stuck = ", ".join(sorted(set(refused) - removable))
            note = (f"the full-model session stopped at {stuck}, which cannot be cut out (untyped outputs or inside "
                    "a subgraph); the other nodes' placements are unconfirmed")
            session = None
            break
        removed |= set(refused)
    else:
        session = None
        note = "too many nodes refused; placements of the rest are unconfirmed"
    assigned = _assignments(session, by_key) if session is not None else {}
    present = set(assigned) | removed
    expanded = frozenset(k for k, n in by_key.items()
                         if session is not None and k not in present and (n.has_function or _is_constant(n)))
    probed_assigned, probed_failed = _probe(skeleton, [by_key[k] for k in removed - set(failed)], weights, names)
    assigned.update(probed_assigned)
    failed.update(probed_failed)
    return Placement(attempted=True, assigned=assigned, failed=failed, expanded=expanded,
                     probed=frozenset(probed_assigned) | frozenset(probed_failed), note=note)


def _session(model: onnx.ModelProto, weights, providers: list[str]):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.add_session_config_entry("session.disable_prepacking", "1")
    present = {i.name for i in model.graph.initializer}
    arrays = getattr(weights, "arrays", None) or {}
    names = [n for n in arrays if n in present]
    if names:
        options.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(arrays[n]) for n in names])
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers), None
    except Exception as exc:  # onnxruntime raises its own exception zoo
        return None, " ".join(str(exc).split())[:500]


def _refused_nodes(error: str | None, inventory: Inventory) -> list[str]:
    """Node keys named by a session's refusal; [] when the refusal is about the whole model."""
    if not error:
        return []
    found = _NOT_IMPLEMENTED.search(error)
    if found:
        return [found.group(1)]
    found = _UNREGISTERED.search(error)
    if found:
        domain, op = ("" if found.group(1) == "ai.onnx" else found.group(1)), found.group(2)
        return [n.key for n in inventory.nodes if n.signature.op_type == op and n.signature.domain == domain]
    return []


def _assignments(session, by_key: dict[str, NodeInfo]) -> dict[str, str]:
    out: dict[str, str] = {}
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            if node.name in by_key:
                out[node.name] = subgraph.ep_name
    return out


def _renamed(skeleton: onnx.ModelProto, keys: list[str]) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(skeleton)
    for (node, _, _), key in zip(iter_nodes(model.graph), keys):
        node.name = key
    return model


def _typed_outputs(node: NodeInfo) -> bool:
    return all(t is not None and _elem(t) is not None for o, t in zip(node.outputs, node.output_types) if o)


def _elem(short_type: str) -> int | None:
    try:
        return onnx.TensorProto.DataType.Value(short_type.upper())
    except ValueError:
        return None


def _cut(model: onnx.ModelProto, nodes: list[NodeInfo]) -> onnx.ModelProto:
    """A copy without ``nodes``; each of their outputs becomes a typed graph input."""
    if not nodes:
        return model
    drop = {n.key for n in nodes}
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    kept = [n for n in cut.graph.node if n.name not in drop]
    cut.graph.ClearField("node")
    cut.graph.node.extend(kept)
    declared = {i.name for i in cut.graph.input}
    for n in nodes:
        for out, t in zip(n.outputs, n.output_types):
            if out and out not in declared:
                cut.graph.input.append(helper.make_tensor_value_info(out, _elem(t), None))
    return cut


def _probe(skeleton: onnx.ModelProto, nodes: list[NodeInfo], weights, providers: list[str]):
    """One-node sessions for ``nodes``, one per distinct signature and attributes."""
    assigned: dict[str, str] = {}
    failed: dict[str, str] = {}
    groups: dict[tuple, list[NodeInfo]] = {}
    for n in nodes:
        groups.setdefault((n.signature, n.attributes, n.output_types), []).append(n)
    originals = [node for node, _, _ in iter_nodes(skeleton.graph)]
    for members in groups.values():
        first = members[0]
        model = _one_node(skeleton, originals[first.index], first)
        if model is None:
            continue
        session, error = _session(model, weights, providers)
        if session is not None:
            where = _assignments(session, {first.key: first}).get(first.key)
            if where:
                assigned.update({m.key: where for m in members})
        elif _NOT_IMPLEMENTED.search(error or "") or _UNREGISTERED.search(error or ""):
            failed.update({m.key: error for m in members})
    return assigned, failed


def _one_node(skeleton: onnx.ModelProto, original: onnx.NodeProto, info: NodeInfo) -> onnx.ModelProto | None:
    inline = {i.name: i for i in skeleton.graph.initializer if i.data_location != onnx.TensorProto.EXTERNAL}
    inputs, initializers = [], []
    for name, t in zip(info.inputs, info.signature.input_types):
        if not name or any(i.name == name for i in inputs) or any(i.name == name for i in initializers):
            continue
        if name in inline:
            initializers.append(inline[name])
        elif t is None or _elem(t) is None:
            return None  # an untyped or non-tensor input: cannot build the probe
        else:
            inputs.append(helper.make_tensor_value_info(name, _elem(t), None))
    node = onnx.NodeProto()
    node.CopyFrom(original)
    node.name = info.key
    outputs = [onnx.ValueInfoProto(name=o) for o in info.outputs if o]
    graph = helper.make_graph([node], "probe", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=list(skeleton.opset_import))
    model.ir_version = skeleton.ir_version
    return model


def _is_constant(node: NodeInfo) -> bool:
    return node.signature.op_type == "Constant" and not node.signature.domain
