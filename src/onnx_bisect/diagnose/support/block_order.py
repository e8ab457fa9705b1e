"""Two consecutive residual blocks run in the opposite order (a port listing a model's sub-layers in the wrong order,
an MLP before the attention it follows): the second block reads the stream the first should have read, and the
first runs on the second's result.  Read where a segment node is an entry of a residual block — it reads the block's
input, the skip of the block's Add — and the block's output is the input of the next block: both blocks put back in
the other order, kept only when the tensors after each block then hold PyTorch's values (one node rewired to the
other block's output reproduces the first tensor too, but not what follows).  Also read on residual blocks: a block
run on the previous block's input (:func:`parallel_blocks`), and a block's norm on the other side of its residual
Add (:func:`norm_placements`)."""
from __future__ import annotations

import dataclasses
from typing import Iterator

import onnx

from . import edits
from .edited_inputs import edited_inputs

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
        for given in _upstream(graph, proto):
            # the stream the node hands on as it is (a TorchScript norm's cast to the type it has) is the block's input
            source, passed = _handed_on(graph, given)
            first = _block_from(graph, source, None if proto.name in passed else proto.name)
            second = _block_from(graph, first.end, None) if first is not None else None
            if second is None or (first.end, second.end) in tried or set(first.nodes) & set(second.nodes):
                continue
            tried.add((first.end, second.end))
            edit = _exchanged(first, second)
            held = _holds_after(ctx, edit, (first, second))
            if held is None:
                continue
            feeds, reference = held
            shown = tuple(dict.fromkeys((*first.entries, first.add, *second.entries, second.add)))
            yield dataclasses.replace(make(
                proto.name, "block order", f"the block ending at {first.add} ({len(first.nodes)} nodes) run before "
                f"the block ending at {second.add} ({len(second.nodes)} nodes)", "the two blocks in the other order",
                "the PyTorch output", edit), shows_in=shown, feeds=feeds or None, reference=reference)


def parallel_blocks(ctx, protos, make) -> Iterator:
    """A residual block run on the input of the block before it where the model runs it on that block's output
    (``use_parallel_residual`` read wrong, GPT-J style ``x + f(x) + g(x)`` for ``s = x + f(x); s + g(s)``): for a
    segment node of a branch computed from a block's input ``x`` and added to the block's output ``s``, the branch's
    entries made to read ``s`` (kept only when the segment then reproduces PyTorch)."""
    graph = ctx.onnx.graph
    tried: set[tuple[str, str]] = set()
    for proto in protos:
        for given in _upstream(graph, proto):
            source, _ = _handed_on(graph, given)
            first = _block_from(graph, source, None)
            if first is None:
                continue
            for add in (graph.nodes[i] for i in graph.consumers.get(first.end, ())):
                if add.op_type != "Add" or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1] \
                        or (first.end, add.name) in tried:
                    continue
                branch = add.inputs[1] if add.inputs[0] == first.end else add.inputs[0]
                nodes = [n for n in _between(graph, source, branch) if n.name not in first.nodes]
                if proto.name not in {n.name for n in nodes} or _between(graph, first.end, branch):
                    continue
                tried.add((first.end, add.name))
                entries = tuple(n.name for n in nodes if source in n.inputs)
                edit = _reading(set(entries), source, first.end)
                feeds = edited_inputs(ctx, edit, {n.name for n in nodes} | {add.name})
                if feeds is None:
                    continue
                yield dataclasses.replace(make(
                    proto.name, "block input", f"the branch added at {add.name} ({len(nodes)} nodes) computed from "
                    f"'{source}', the input of the block ending at {first.add}", f"it computed from that block's "
                    f"output '{first.end}' (the blocks in sequence, not in parallel)", "the PyTorch output", edit),
                    shows_in=entries, feeds=feeds or None)


def norm_placements(ctx, protos, make) -> Iterator:
    """A residual block's norm on the other side of it (a port writing a post-norm model as pre-norm, or back —
    BERT's ``LN(x + f(x))`` as ``x + f(LN(x))``): for a norm node the segment is computed from, either the norm of
    a block's input whose branch reads it (pre-norm) moved after the block's residual Add, the branch reading the
    input itself; or the norm after a block's Add (post-norm) moved onto the block's input, read by the branch's
    entries, the Add's sum handed on.  Kept only when the tensors after the block then hold PyTorch's values."""
    graph = ctx.onnx.graph
    tried: set[str] = set()
    for proto in protos:
        for norm in _norms_near(graph, proto):
            if norm.name in tried or not norm.inputs:
                continue
            tried.add(norm.name)
            for block, edit, said, made in (_pre_to_post(graph, norm), _post_to_pre(graph, norm)):
                if block is None:
                    continue
                held = _holds_after(ctx, edit, (block, block), also=made)
                if held is None:
                    continue
                feeds, reference = held
                yield dataclasses.replace(make(
                    norm.name, "placement", said[0], said[1], "the PyTorch output", edit),
                    shows_in=(*block.entries, block.add), feeds=feeds or None, reference=reference)


def _norms_near(graph, proto) -> list:
    """The norm nodes ``proto`` is computed from (or is), and those ending the residual blocks it is in (a
    post-norm block's norm lies after the segment when the segment is one of its entries)."""
    found = []
    for tensor in (*(o for o in proto.output if o), *_upstream(graph, proto)):
        norm = graph.node_of(tensor)
        if norm is not None and norm.op_type in NORMS:
            found.append(norm)
        block = _block_from(graph, tensor, proto.name) if tensor in proto.input else None
        end = graph.node_of(block.end) if block is not None else None
        if end is not None and end.op_type in NORMS:
            found.append(end)
    return found


def _pre_to_post(graph, norm):
    """``(block, edit, (have, want), made)`` for a norm whose output only a residual block's branch reads, the
    block's Add reading the norm's input: the norm moved after the Add (post-norm) — the branch's entries reading
    the input, the norm the Add's sum, what read the sum the norm's output (tensor names kept: the divergent one
    may be the norm's) — ``made`` the sum; ``(None, None, None, ())`` otherwise."""
    source, normed = norm.inputs[0], norm.outputs[0]
    for add in (graph.nodes[i] for i in graph.consumers.get(source, ())):
        if add.op_type != "Add" or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1] or not add.outputs[0]:
            continue
        branch = add.inputs[1] if add.inputs[0] == source else add.inputs[0]
        nodes = _between(graph, normed, branch)
        inside = {n.name for n in nodes}
        readers = {graph.nodes[i].name for i in graph.consumers.get(normed, ())}
        summed = add.outputs[0]
        if not nodes or len(nodes) > MAX_BLOCK or not readers <= inside or normed in graph.graph_outputs \
                or summed in graph.graph_outputs:
            continue
        entries = tuple(n.name for n in nodes if normed in n.inputs)
        block = Block(source, normed, add.name,
                      tuple(n.name for n in sorted([norm, *nodes, add], key=lambda n: n.index)), entries)
        rewired = {e: (normed, source) for e in entries}
        rewired.update({graph.nodes[i].name: (summed, normed) for i in graph.consumers.get(summed, ())})
        edit = _moved(norm.name, rewired, summed)
        return block, edit, (f"{norm.op_type} applied to the block's input '{source}', its branch reading the "
                             f"normed value (pre-norm)", f"applied after the residual Add {add.name}, the branch "
                             "reading the input itself (post-norm)"), (summed,)
    return None, None, None, ()


def _post_to_pre(graph, norm):
    """``(block, edit, (have, want), made)`` for a norm reading a residual block's Add alone: the norm moved onto
    the block's input, read by the branch's entries, what read the norm reading the Add's sum (pre-norm; tensor
    names kept), ``made`` the sum; ``(None, None, None, ())`` otherwise."""
    summed, normed = norm.inputs[0], norm.outputs[0]
    add = graph.node_of(summed)
    if add is None or add.op_type != "Add" or len(add.inputs) != 2 or normed in graph.graph_outputs \
            or graph.consumers.get(summed, ()) != (graph.producer.get(normed),):
        return None, None, None, ()
    for source in add.inputs:
        block = _block_from(graph, source, None)
        if block is None or block.add != add.name or norm.name not in block.nodes or not block.entries:
            continue
        rewired = {e: (source, normed) for e in block.entries}
        rewired.update({graph.nodes[i].name: (normed, summed) for i in graph.consumers.get(normed, ())})
        edit = _moved(norm.name, rewired, source)
        return block, edit, (f"{norm.op_type} applied after the residual Add {add.name} (post-norm)",
                             f"applied to the block's input '{source}', read by the branch's entries, the sum "
                             "handed on (pre-norm)"), (summed,)
    return None, None, None, ()


def _moved(norm: str, rewired: dict[str, tuple[str, str]], reads: str):
    """The edit moving ``norm`` to read ``reads``, each node of ``rewired`` reading its ``(old, new)`` tensor
    instead, the nodes re-sorted."""
    def edit(model, weights):
        for n in model.graph.node:
            if n.name in rewired:
                old, new = rewired[n.name]
                n.input[:] = [new if t == old else t for t in n.input]
            elif n.name == norm:
                n.input[0] = reads
        edits.set_nodes(model, list(model.graph.node))
        return model, weights
    return edit


def _reading(nodes: set[str], old: str, new: str):
    """``nodes`` reading ``new`` where they read ``old``."""
    def edit(model, weights):
        for n in model.graph.node:
            if n.name in nodes:
                n.input[:] = [new if t == old else t for t in n.input]
        edits.set_nodes(model, model.graph.node)
        return model, weights
    return edit


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
        end, passed = _handed_on(graph, end)
        tail += [graph.node_of(t) for t in passed.values()]
        names = tuple(n.name for n in sorted([*nodes, add, *tail], key=lambda n: n.index))
        entries = tuple(n.name for n in nodes if source in n.inputs)
        return Block(source, end, add.name, names, entries)
    return None


#: nodes walked up from a segment node to the block's input (a segment narrowed to a norm's last Mul: the block's
#: entries, whose values PyTorch computes elsewhere, were paired with those)
UPSTREAM = 24


def _upstream(graph, proto) -> list[str]:
    """The tensors ``proto`` is computed from (constants aside), its inputs first, then up the graph, nearest
    first, at most :data:`UPSTREAM` nodes."""
    found = [t for t in proto.input if t and not graph.is_constant(t)]
    seen, at = set(found), 0
    while at < len(found) and at < UPSTREAM:
        node = graph.node_of(found[at])
        at += 1
        for t in node.inputs if node is not None else ():
            if t and t not in seen and not graph.is_constant(t):
                seen.add(t)
                found.append(t)
    return found


#: nodes handing a tensor on as it is, when they cast to the type it has
PASSING = frozenset({"Identity", "Cast"})


def _handed_on(graph, tensor: str) -> tuple[str, dict[str, str]]:
    """``tensor`` followed through the nodes that alone read it and hand it on as it is (an Identity, a Cast to the
    type it has: TorchScript records a norm's ``x.to(torch.float32)`` of a float32 stream), and those nodes' names
    (each to its output)."""
    passed: dict[str, str] = {}
    while len(graph.consumers.get(tensor, ())) == 1 and tensor not in graph.graph_outputs:
        node = graph.nodes[graph.consumers[tensor][0]]
        if node.op_type not in PASSING or len(node.outputs) != 1 or not node.outputs[0] \
                or node.op_type == "Cast" and (graph.elem_types.get(tensor) is None
                                               or node.attribute("to") != graph.elem_types[tensor]):
            break
        passed[node.name] = tensor = node.outputs[0]
    return tensor, passed


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
    """The edit running ``second`` on ``first``'s input and ``first`` on ``second``'s output: the two outputs
    exchange their names too, so that every tensor after one block, and after both, keeps its name (what reads
    them, a graph output among them, is left as it is)."""
    def edit(model: onnx.ModelProto, weights):
        a, b = set(first.nodes), set(second.nodes)
        for n in model.graph.node:
            if n.name in b:
                n.input[:] = [first.source if t == first.end else t for t in n.input]
                n.output[:] = [first.end if t == second.end else t for t in n.output]
            elif n.name in a:
                n.input[:] = [first.end if t == first.source else t for t in n.input]
                n.output[:] = [second.end if t == first.end else t for t in n.output]
        nodes = list(model.graph.node)
        moved = [n for n in nodes if n.name in b]
        at = next(i for i, n in enumerate(nodes) if n.name in a)
        rest = [n for n in nodes if n.name not in b]
        edits.set_nodes(model, rest[:at] + moved + rest[at:])
        edits.drop_value_info(model, {first.end, second.end})
        return model, weights
    return edit


#: nodes walked past the blocks to the first tensor paired with PyTorch's
AFTER_BLOCKS = 64


def _holds_after(ctx, edit, blocks: tuple[Block, Block], also: tuple[str, ...] = ()) -> tuple[dict, object] | None:
    """Whether, with ``edit``, the tensors after the blocks hold PyTorch's values: each block output that is a cut
    tensor, and the first tensor past both that a layer pairs with PyTorch's (or, with none, the block now run
    first computing a value PyTorch recorded) — every tensor of the blocks computed, none fed.  The values the
    edit gives the inputs of the edited segment computed inside the blocks (a segment narrowed to a norm's last
    Mul, its input paired with the value the other block's norm computes; a block output that now stands where
    the other stood), to feed the segment, and the PyTorch value the divergent tensor then holds where it is not
    the one paired with it; None when they do not hold.  ``also``: tensors the edit makes that may hold a block
    output's PyTorch value too (a norm moved out of a block: its output, where the block's output was the norm's)."""
    first, second = blocks
    model, weights = edit(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights)
    inside = {n for b in blocks for n in b.nodes}
    made = {o for n in ctx.onnx.graph.nodes if n.name in inside for o in n.outputs if o}
    _, boundary, _ = ctx.segment_model(model, weights)
    fed = [t for t in boundary if t in made]
    known = [t for t in (first.end, second.end) if t in ctx.cut.references]
    paired = {layer.pair.tensor: layer for layer in ctx.layers if layer.pair.tensor}
    later = next((o for n in ctx.onnx.graph.downstream(first.end, AFTER_BLOCKS) if n.name not in inside
                  for o in n.outputs if o in paired), None)
    wanted = list(dict.fromkeys([*known, *([later] if later else []), first.end, second.end, *also, *fed]))
    try:
        values = ctx.run_segment(model, weights, outputs=wanted, through=[*wanted, *made])
    except Exception:  # noqa: BLE001 - an exchange the runtime rejects is no reading
        return None
    # a block output's pair may follow its name (paired by place or value) or the node writing it (by scope): each
    # of PyTorch's values there must be held by one of the two
    ends = [values[t] for t in (first.end, second.end, *also) if t in values]
    if any(not any(ctx.agrees(v, ctx.cut.references[t]) for v in ends) for t in known):
        return None
    if later is not None:
        holds = later in values and ctx.agrees(values[later], paired[later].pair.reference())
    else:
        holds = bool(known) or first.end in values and _recorded(ctx, values[first.end]) is not None
    if not holds:
        return None
    mine = values.get(ctx.tensor)
    if ctx.tensor in made and mine is not None and not ctx.agrees(mine, ctx.reference):
        # the divergent tensor computed inside a block now run in the other place stands for another of PyTorch's
        # values (a renamed file's tensors paired by their place): the one recorded there, or no reading
        reference = _recorded(ctx, mine)
        if reference is None:
            return None
        return {t: values[t] for t in fed if t in values}, reference
    return {t: values[t] for t in fed if t in values}, None


def _recorded(ctx, value):
    """The recorded PyTorch module output that holds ``value``, or None."""
    capture = ctx.baseline.capture
    if capture is None:
        return None
    return next((a.value for a in capture.activations
                 if a.value.shape == value.shape and a.value.dtype.kind == "f" and ctx.agrees(value, a.value)), None)
