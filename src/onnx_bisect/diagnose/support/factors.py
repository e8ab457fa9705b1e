"""Factors PyTorch does not apply: a Mul (or Div) of the divergent segment scaling a computed tensor by a factor
computed for the purpose from the segment's own tensors (an attention sink's share, queries and keys normalised
before the scores), tried as an Identity of the tensor it scales, with the nodes computing the factor and a
scalar scaling after it named with it (:func:`extra_factors`)."""
from __future__ import annotations

import dataclasses
from typing import Iterator

from .alternative_edits import identity_of


#: nodes computing a factor, at most, walked up from the Mul that applies it
MAX_FACTOR_NODES = 4


def extra_factors(ctx, protos, make) -> Iterator:
    """A factor PyTorch does not apply, computed for the purpose: a Mul (or Div) of the segment scaling a computed
    tensor by a factor computed from the segment's own tensors and broadcast over one of its axes (a per-row
    ``σ(logsumexp(s))`` sink share on attention probabilities, a gate no module has), made an Identity of the
    tensor it scales; the nodes computing the factor for it alone are named with it.  A scaling by a scalar
    constant that alone reads the result goes with it (``x · √d / ‖x‖``, an RMS normalisation no module has),
    and where the segment holds several such factors, all of them together are tried last (queries and keys
    both normalised before the scores)."""
    found = list(_factors(ctx, protos))
    for proto, scaled, small, chain, scale in found:
        described = (f"{proto.op_type} by '{chain[-1].outputs[0]}' (a factor of shape {list(small)} computed by "
                     f"{', '.join(n.op_type for n in chain)})")
        alt = make(proto.name, "op", described, "Identity (not applied: PyTorch reads the tensor as it is)",
                   "the PyTorch output", identity_of(proto.name, scaled))
        yield dataclasses.replace(alt, shows_in=tuple(n.name for n in chain)) if alt is not None else alt
        if scale is not None:
            alt = make(proto.name, "op", f"{described}, then scaled by {scale[1]:.6g}", "Identity (neither applied: "
                       "PyTorch reads the tensor as it is)", "the PyTorch output", _identities(
                           [(proto.name, scaled), (scale[0].name, proto.output[0])]))
            yield dataclasses.replace(alt, shows_in=(*(n.name for n in chain), scale[0].name)) if alt else alt
    if len(found) > 1:
        pairs, shown = [], []
        for proto, scaled, _, chain, scale in found:
            pairs.append((proto.name, scaled))
            shown += [n.name for n in chain]
            if scale is not None:
                pairs.append((scale[0].name, proto.output[0]))
                shown.append(scale[0].name)
        alt = make(found[0][0].name, "op", f"{len(found)} computed factors ({', '.join(f[0].name for f in found)})"
                   + (" and the scalings after them" if any(f[4] for f in found) else ""), "Identity (none applied: "
                   "PyTorch reads the tensors as they are)", "the PyTorch output", _identities(pairs))
        yield dataclasses.replace(alt, shows_in=tuple(shown[:] + [f[0].name for f in found[1:]])) if alt else alt


def _factors(ctx, protos) -> Iterator:
    """``(node, tensor scaled, factor shape, nodes computing the factor, (scaling node, its factor) or None)`` of
    each computed factor of the segment (see :func:`extra_factors`)."""
    graph = ctx.onnx.graph
    for proto in protos:
        if proto.op_type not in ("Mul", "Div") or len(proto.input) != 2 or proto.domain not in ("", "ai.onnx"):
            continue
        for k in ((0, 1) if proto.op_type == "Mul" else (0,)):
            scaled, factor = proto.input[k], proto.input[1 - k]
            if graph.is_constant(factor) or graph.is_constant(scaled):
                continue
            big, small = ctx.shape_of(scaled), ctx.shape_of(factor)
            if not big or not small or len(small) != len(big) or small == big or any(
                    f not in (1, b) for f, b in zip(small, big)):
                continue  # a factor broadcast over an axis of the tensor, not an operand of its shape
            chain = _factor_nodes(graph, factor)
            if chain:
                yield proto, scaled, small, chain, _scaling_after(ctx, proto.output[0])
                break


def _scaling_after(ctx, tensor: str):
    """``(node, factor)`` of the scaling by a scalar constant that alone reads ``tensor``, else None."""
    graph = ctx.onnx.graph
    readers = graph.consumers.get(tensor, ())
    node = graph.nodes[readers[0]] if len(readers) == 1 else None
    factor = scalar_scaling(ctx, node, tensor) if node is not None else None
    return (node, factor) if factor is not None else None


def _identities(pairs: list[tuple[str, str]]):
    """Each ``(node, tensor)``'s node made an Identity of its tensor."""
    def edit(model, weights):
        for node, tensor in pairs:
            model, weights = identity_of(node, tensor)(model, weights)
        return model, weights
    return edit


def _factor_nodes(graph, tensor: str) -> list:
    """The nodes computing ``tensor`` for its reader alone (each output read once), up to a node reading a tensor
    others read too: [] when the first already is (a factor the model uses elsewhere is the model's)."""
    chain, node = [], graph.node_of(tensor)
    while node is not None and len(chain) < MAX_FACTOR_NODES and len(node.outputs) == 1 \
            and len(graph.consumers.get(node.outputs[0], ())) == 1:
        chain.append(node)
        computed = [t for t in node.inputs if t and not graph.is_constant(t)]
        if len(computed) != 1 or len(graph.consumers.get(computed[0], ())) > 1:
            break
        node = graph.node_of(computed[0])
    return chain[::-1]


def scalar_scaling(ctx, node, operand: str | None = None) -> float | None:
    """The factor a Mul or Div of a tensor by a scalar constant applies to it (``operand``: that tensor), else
    None."""
    if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2 or node.domain not in ("", "ai.onnx"):
        return None
    for k in ((0, 1) if node.op_type == "Mul" else (0,)):
        tensor, constant = node.inputs[k], ctx.constant(node.inputs[1 - k])
        if (operand is None or tensor == operand) and constant is not None and constant.size == 1 \
                and constant.dtype.kind == "f" and float(constant.reshape(())) != 0:
            value = float(constant.reshape(()))
            return value if node.op_type == "Mul" else 1.0 / value
    return None
