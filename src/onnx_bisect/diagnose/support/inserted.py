"""Ops the file applies in several places where PyTorch applies none: one op with the same attributes and
operands of the same shapes on several tensors of the segment (a port's ``clip_qkv`` clipping queries, keys and
values, each perhaps at its own bound), left out together; a subgraph of several branches computing a tensor
of one shape from another (a rotary embedding applied to the values too), left out as a whole.  Removing one
op of a segment is :func:`.kind_alternatives.kind_alternatives`'s; a run of ops on one
tensor, :func:`.kind_alternatives.extra_runs`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterator, NamedTuple

from .alternative_edits import composed, identity_of, retyped
from .kind_alternatives import REMOVABLE
from .rewirings import FLOATS

#: how many nodes past the divergent tensor a copy of the removed ops may feed and still be named with them (an
#: attention's value product, three nodes after its scores)
PAST_AT_MOST = 8


class Signature(NamedTuple):
    """What kind of application of an op a node is, whatever it reads."""

    op_type: str
    attributes: tuple[bytes, ...]
    constants: tuple[tuple[str, tuple[int, ...]] | None, ...]  # (dtype, shape) of each operand past the first


def same_removals(ctx, protos, make) -> Iterator:
    """The removable ops of the segment (:data:`.kind_alternatives.REMOVABLE`) that apply one op — the same type
    and attributes, constant operands of the same shapes — to several tensors, left out together: each alone
    leaves the others' error.  Copies of an op whose constants are scalars (a Clip's bounds, not a norm's
    weights) just past the segment (read by a node a few nodes downstream of the divergent tensor: the values of
    the attention whose scores diverge) are named with them and left out too, their own error not measured here."""
    groups: dict[Signature, list] = {}
    for proto in protos:
        if proto.op_type in REMOVABLE and proto.domain in ("", "ai.onnx") and proto.input and len(proto.output) == 1:
            key = _signature(ctx, proto)
            if key is not None:
                groups.setdefault(key, []).append(proto)
    for key, members in groups.items():
        if len(members) < 2:
            continue
        inside = {p.name for p in members}
        scalars = bool(key.constants) and all(c is None or math.prod(c[1]) <= 1 for c in key.constants)
        past = [p for p in _copies_past(ctx, key) if p.name not in inside] if scalars else []
        nodes = members + past
        alt = make(members[-1].name, "op", f"{members[0].op_type} applied to {len(nodes)} tensors ("
                   + ", ".join(p.name for p in nodes) + ")", "Identity (none of them applied)",
                   "the PyTorch output", _removed(tuple(p.name for p in nodes)))
        yield dataclasses.replace(alt, shows_in=tuple(p.name for p in nodes)) if alt is not None else alt


def _signature(ctx, proto) -> Signature | None:
    """The node's :class:`Signature`: its type, attributes and the shapes of its constant operands (None when an
    operand past the first is computed)."""
    constants = []
    for t in proto.input[1:]:
        if not t:
            constants.append(None)
            continue
        value = ctx.constant(t)
        if value is None:
            return None
        constants.append((value.dtype.str, value.shape))
    return Signature(proto.op_type, tuple(a.SerializeToString() for a in proto.attribute), tuple(constants))


def _copies_past(ctx, key: Signature) -> list:
    """The nodes of signature ``key`` outside the segment whose output a node near the divergent tensor reads,
    themselves not computed from it (the values beside the scores, not an op after them)."""
    graph = ctx.onnx.graph
    near = {n.name for n in graph.downstream(ctx.tensor, PAST_AT_MOST)}
    found = []
    for node in graph.nodes:
        if node.op_type != key.op_type or node.name in ctx.layer.segment or node.name in near:
            continue
        if not any(graph.nodes[c].name in near for o in node.outputs for c in graph.consumers.get(o, ())):
            continue
        proto = ctx.node(node.name)
        if proto is not None and _signature(ctx, proto) == key:
            found.append(proto)
    return found


def _removed(nodes: tuple[str, ...]):
    """Each of ``nodes`` made an Identity of its first input."""
    return composed(*(retyped(n, "Identity", {}, drop=None, inputs=1) for n in nodes))


#: regions tried left out, per segment: a few of the smallest first
MAX_REGIONS = 6
#: the most nodes a region left out may hold
REGION_AT_MOST = 12


def inserted_regions(ctx, protos, make) -> Iterator:
    """A subgraph the file applies where PyTorch applies none: the nodes on every path from a tensor the segment
    reads in more than one place to a later tensor of its shape and type (``v·cos + rotate_half(v)·sin`` on an
    attention's values: several branches, side inputs computed apart from it), the later tensor made an Identity
    of the first.  A run of single nodes is :func:`.kind_alternatives.extra_runs`'s; smallest regions first."""
    graph, inside = ctx.onnx.graph, {p.name for p in protos}
    nodes = [n for n in ctx.segment_nodes if n.name in inside]
    produced = {o: n for n in nodes for o in n.outputs if o}
    readers: dict[str, list] = {}
    for n in nodes:
        for t in dict.fromkeys(i for i in n.inputs if i and not graph.is_constant(i)):
            readers.setdefault(t, []).append(n)
    found = []
    for source, read_by in readers.items():
        shape = ctx.shape_of(source)
        if len(read_by) < 2 or not shape or graph.elem_types.get(source) not in FLOATS:
            continue
        after = _descendants(source, readers)
        for last in nodes:
            out = last.outputs[0] if len(last.outputs) == 1 else None
            if last.name not in after or not out or ctx.shape_of(out) != shape \
                    or graph.elem_types.get(out) != graph.elem_types.get(source):
                continue
            region = _between(last, after, produced)
            branches = sum(1 for n in read_by if n.name in region)
            if 2 <= len(region) <= REGION_AT_MOST and branches >= 2 and _closed(region, last, nodes, graph):
                found.append((len(region), source, last, region))
    for _, source, last, region in sorted(found, key=lambda f: f[0])[:MAX_REGIONS]:
        ordered = tuple(n.name for n in nodes if n.name in region)
        alt = make(last.name, "op", f"{len(ordered)} nodes computing '{last.outputs[0]}' from '{source}' ("
                   + ", ".join(ordered) + ")", f"Identity of '{source}' (none of them applied)", "the PyTorch output",
                   identity_of(last.name, source))
        yield dataclasses.replace(alt, shows_in=ordered) if alt is not None else alt


def _descendants(source: str, readers: dict[str, list]) -> set[str]:
    """The names of the segment's nodes computed from ``source``."""
    seen, frontier = set(), [source]
    while frontier:
        for n in readers.get(frontier.pop(), ()):
            if n.name not in seen:
                seen.add(n.name)
                frontier.extend(o for o in n.outputs if o)
    return seen


def _closed(region: set[str], last, nodes, graph) -> bool:
    """Whether only ``last`` of the region is read outside it: leaving the region out (``last`` made an Identity
    of the source) then leaves none of its nodes computing anything another node reads."""
    for n in nodes:
        if n.name in region and n is not last and any(
                graph.nodes[c].name not in region for o in n.outputs if o for c in graph.consumers.get(o, ())):
            return False
    return True


def _between(last, after: set[str], produced: dict) -> set[str]:
    """The nodes computed from the source (``after``) that ``last`` is computed from, ``last`` included."""
    region, frontier = {last.name}, [last]
    while frontier:
        for t in frontier.pop().inputs:
            n = produced.get(t)
            if n is not None and n.name in after and n.name not in region:
                region.add(n.name)
                frontier.append(n)
    return region
