"""Two consecutive residual blocks run in the opposite order (a port listing a model's sub-layers in the wrong order,
an MLP before the attention it follows): the second block reads the stream the first should have read, and the
first runs on the second's result.  Read where a segment node is an entry of a residual block — it reads the block's
input, the skip of the block's Add — and the block's output is the input of the next block: both blocks put back in
the other order, kept only when the tensors after each block then hold PyTorch's values (one node rewired to the
other block's output reproduces the first tensor too, but not what follows)."""
from __future__ import annotations

import dataclasses
from typing import Iterator

import onnx

from . import edits

#: norms a post-norm block ends with, after its residual Add
NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "BatchNormalization",
                   "GroupNormalization", "InstanceNormalization"})
#: nodes a block may hold, at most
MAX_BLOCK = 400


@dataclasses.dataclass(frozen=True)
class Block:
    """A residual block: ``source`` its input (the skip), ``end`` its output (its Add's, or the norm's after it),
    ``nodes`` the names of the nodes computing ``end`` from ``source``, ``entries`` those reading ``source``."""

    source: str
    end: str
    add: str
    nodes: tuple[str, ...]
    entries: tuple[str, ...]


def exchanged_blocks(ctx, protos, make) -> Iterator:
    """For a segment node that is an entry of a residual block followed by another, the two blocks run in the
    other order (see the module's docstring)."""
    graph = ctx.onnx.graph
    tried: set[tuple[str, str]] = set()
    for proto in protos:
        for source in dict.fromkeys(t for t in proto.input if t and not graph.is_constant(t)):
            first = _block_from(graph, source, proto.name)
            second = _block_from(graph, first.end, None) if first is not None else None
            if second is None or (first.end, second.end) in tried or set(first.nodes) & set(second.nodes) \
                    or second.end in graph.graph_outputs:
                continue
            tried.add((first.end, second.end))
            edit = _exchanged(first, second)
            if not _holds_after(ctx, edit, (first, second)):
                continue
            shown = tuple(dict.fromkeys((*first.entries, first.add, *second.entries, second.add)))
            yield dataclasses.replace(make(
                proto.name, "block order", f"the block ending at {first.add} ({len(first.nodes)} nodes) run before "
                f"the block ending at {second.add} ({len(second.nodes)} nodes)", "the two blocks in the other order",
                "the PyTorch output", edit), shows_in=shown)


def _block_from(graph, source: str, through: str | None) -> Block | None:
    """The residual block whose input is ``source`` (and, given, holding node ``through``): an Add reading
    ``source`` and a tensor computed from it, its output or the norm reading it alone; None when there is none."""
    readers = [graph.nodes[i] for i in graph.consumers.get(source, ())]
    for add in sorted(readers, key=lambda n: n.index):
        if add.op_type != "Add" or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
            continue
        branch = add.inputs[1] if add.inputs[0] == source else add.inputs[0]
        nodes = _between(graph, source, branch)
        if not nodes or len(nodes) > MAX_BLOCK or through is not None and through not in {n.name for n in nodes} \
                and through != add.name:
            continue
        end, tail = add.outputs[0], []
        after = [graph.nodes[i] for i in graph.consumers.get(end, ())]
        if len(after) == 1 and after[0].op_type in NORMS:
            end, tail = after[0].outputs[0], [after[0]]
        names = tuple(n.name for n in sorted([*nodes, add, *tail], key=lambda n: n.index))
        entries = tuple(n.name for n in nodes if source in n.inputs)
        return Block(source, end, add.name, names, entries)
    return None


def _between(graph, source: str, tensor: str) -> list:
    """The nodes on the paths from tensor ``source`` to tensor ``tensor`` (its producer included), in graph order."""
    last = graph.node_of(tensor)
    if last is None:
        return []
    down: set[str] = {source}
    found = []
    start = min((graph.nodes[i].index for i in graph.consumers.get(source, ())), default=last.index + 1)
    for n in graph.nodes[start:last.index + 1]:
        if any(t in down for t in n.inputs):
            down.update(o for o in n.outputs if o)
            found.append(n)
    up, frontier = {last.name}, [last]
    by_out = {o: n for n in found for o in n.outputs}
    while frontier:
        for t in frontier.pop().inputs:
            p = by_out.get(t)
            if p is not None and p.name not in up:
                up.add(p.name)
                frontier.append(p)
    return [n for n in found if n.name in up] if last.name in {n.name for n in found} else []


def _exchanged(first: Block, second: Block):
    """The edit running ``second`` on ``first``'s input and ``first`` on ``second``'s output, what read
    ``second``'s output reading ``first``'s."""
    def edit(model: onnx.ModelProto, weights):
        a, b = set(first.nodes), set(second.nodes)
        for n in model.graph.node:
            if n.name in b:
                n.input[:] = [first.source if t == second.source else t for t in n.input]
            elif n.name in a:
                n.input[:] = [second.end if t == first.source else t for t in n.input]
            else:
                n.input[:] = [first.end if t == second.end else t for t in n.input]
        nodes = list(model.graph.node)
        moved = [n for n in nodes if n.name in b]
        at = next(i for i, n in enumerate(nodes) if n.name in a)
        rest = [n for n in nodes if n.name not in b]
        model.graph.ClearField("node")
        model.graph.node.extend(edits.toposorted(rest[:at] + moved + rest[at:], model))
        edits.drop_value_info(model, {first.end, second.end})
        return model, weights
    return edit


#: nodes walked past the blocks to the first tensor paired with PyTorch's
AFTER_BLOCKS = 64


def _holds_after(ctx, edit, blocks: tuple[Block, Block]) -> bool:
    """Whether, with ``edit``, the tensors after the blocks hold PyTorch's values: each block output that is a cut
    tensor, and the first tensor past both that a layer pairs with PyTorch's (or, with none, the block now run
    first computing a value PyTorch recorded)."""
    first, second = blocks
    model, weights = edit(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights)
    inside = {n for b in blocks for n in b.nodes}
    known = [t for t in (first.end, second.end) if t in ctx.cut.references]
    paired = {layer.pair.tensor: layer for layer in ctx.layers if layer.pair.tensor}
    later = next((o for n in ctx.onnx.graph.downstream(first.end, AFTER_BLOCKS) if n.name not in inside
                  for o in n.outputs if o in paired), None)
    wanted = list(dict.fromkeys([*known, *([later] if later else []), second.end]))
    try:
        values = ctx.run_segment(model, weights, outputs=wanted, through=wanted)
    except Exception:  # noqa: BLE001 - an exchange the runtime rejects is no reading
        return False
    if any(t not in values or not ctx.agrees(values[t], ctx.cut.references[t]) for t in known):
        return False
    if later is not None:
        return later in values and ctx.agrees(values[later], paired[later].pair.reference())
    return bool(known) or second.end in values and _recorded(ctx, values[second.end])


def _recorded(ctx, value) -> bool:
    """Whether one of PyTorch's recorded module outputs holds ``value``."""
    capture = ctx.baseline.capture
    if capture is None:
        return False
    return any(a.value.shape == value.shape and a.value.dtype.kind == "f" and ctx.agrees(value, a.value)
               for a in capture.activations)
