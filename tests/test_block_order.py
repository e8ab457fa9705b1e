"""Two residual blocks run in the opposite order (a port listing the sub-layers wrongly): the second block reads
the stream the first should have read, the first runs on its result.  Named as the two blocks exchanged — their
entries and residual Adds — where a rewiring of the first entry alone reproduces only the first tensor after it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import onnx
import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from fault_sweep import rename  # noqa: E402


class _PreNormStack(torch.nn.Module):
    """Three pre-norm residual MLP blocks written in the model's own forward, then a head."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(281)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(3))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(d, 2 * d) for _ in range(3))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * d, d) for _ in range(3))
        self.head = torch.nn.Linear(d, 4)

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = x + down(torch.relu(up(norm(x))))
        return self.head(x)


def _toposorted(nodes, proto):
    made = {o for n in nodes for o in n.output}
    ready = {i.name for i in proto.graph.input} | {i.name for i in proto.graph.initializer} | {""}
    order, pending = [], list(nodes)
    while pending:
        n = next(n for n in pending if all(i in ready or i not in made for i in n.input))
        order.append(n)
        pending.remove(n)
        ready.update(n.output)
    return order


def _resort(proto) -> None:
    """``proto``'s nodes put in an order their inputs allow (in place), after a planted rewiring."""
    nodes = _toposorted(list(proto.graph.node), proto)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)


def _residual_adds(proto):
    made = {o: n for n in proto.graph.node for o in n.output}

    def computed_from(tensor, source, depth=12):
        frontier = [tensor]
        for _ in range(depth):
            nxt = []
            for t in frontier:
                if t == source:
                    return True
                if t in made:
                    nxt += list(made[t].input)
            frontier = nxt
        return False
    return [n for n in proto.graph.node if n.op_type == "Add" and len(n.input) == 2
            and any(computed_from(n.input[1 - k], n.input[k]) for k in (0, 1) if n.input[k] in made or k == 0)
            and n.input[0] != n.input[1]]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_two_residual_blocks_run_in_the_other_order_are_named_as_exchanged(exporter):
    model = _PreNormStack().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(282))
    proto = dc.export(model, (x,), exporter)
    norms = [n for n in proto.graph.node if n.op_type == "LayerNormalization"]
    adds = [a for a in _residual_adds(proto) if any(n.input[0] in a.input for n in norms)]
    assert len(norms) == 3 and len(adds) == 3, ([n.name for n in norms], [a.name for a in adds])
    (n1, n2), (a1, a2) = norms[1:], adds[1:]  # the second and third blocks exchanged
    x1, out1, out2 = n1.input[0], a1.output[0], a2.output[0]
    skip1, skip2 = list(a1.input).index(x1), list(a2.input).index(out1)
    n2.input[0], a2.input[skip2] = x1, x1  # the third block reads the second's input
    n1.input[0], a1.input[skip1] = out2, out2  # the second runs on the third's output
    for n in proto.graph.node:
        if n is not n1 and n is not a1 and out2 in n.input and n is not n2:
            n.input[:] = [out1 if t == out2 else t for t in n.input]  # the head reads the last block's output
    _resort(proto)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert {n1.name, n2.name, a1.name, a2.name} <= named, named
    assert "other order" in fd.explanation, fd.explanation


class _RMSStack(torch.nn.Module):
    """Three pre-norm residual MLP blocks around written-out RMSNorms (the stream cast to float32 first, as Llama
    writes it: TorchScript records the cast of a float32 tensor as a Cast node), then a head."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(283)
        self.scales = torch.nn.ParameterList(torch.nn.Parameter(1 + 0.1 * torch.randn(d)) for _ in range(3))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(d, 2 * d) for _ in range(3))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * d, d) for _ in range(3))
        self.head = torch.nn.Linear(d, 4)

    def forward(self, x):
        for scale, up, down in zip(self.scales, self.ups, self.downs):
            x = x.to(torch.float32)
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * scale
            x = x + down(torch.nn.functional.silu(up(h)))
        return self.head(x)


class _PostNormStack(torch.nn.Module):
    """Three post-norm residual blocks (the norm after each Add) and nothing after: the last block's norm writes the
    graph output."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(284)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(3))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(d, 2 * d) for _ in range(3))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * d, d) for _ in range(3))

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = norm(x + down(torch.tanh(up(x))))
        return x


def _exchange(proto, skip, first_add, second_add, norms=()):
    """The blocks ending at the two residual Adds (``skip`` the first's input) run in the other order: a block is
    what computes its Add's branch from its input, and the norm after its Add (post-norm: ``norms``, one per
    Add); the two blocks' outputs exchange their names, so that what reads them is left as it is.  The entries and
    Adds (the nodes whose own output changes) are returned."""
    made = {o: n for n in proto.graph.node for o in n.output}
    after = dict(zip((first_add.name, second_add.name), norms))

    def block(add, source):
        branch = next(t for t in add.input if t != source)
        names, frontier = {add.name}, [branch]
        while frontier:
            t = frontier.pop()
            if t != source and t in made and made[t].name not in names:
                names.add(made[t].name)
                frontier += list(made[t].input)
        return names | ({after[add.name].name} if add.name in after else set())

    def end(add):
        return after[add.name].output[0] if add.name in after else add.output[0]

    mid, last = end(first_add), end(second_add)
    one, two = block(first_add, skip), block(second_add, mid)
    entries = {n.name for n in proto.graph.node if n.op_type != "Cast" and (  # a cast to the type it has aside
        n.name in one and skip in n.input or n.name in two and mid in n.input)}
    for n in proto.graph.node:
        if n.name in two:
            n.input[:] = [skip if t == mid else t for t in n.input]
            n.output[:] = [mid if t == last else t for t in n.output]
        elif n.name in one:
            n.input[:] = [mid if t == skip else t for t in n.input]
            n.output[:] = [last if t == mid else t for t in n.output]
    _resort(proto)
    return entries | {first_add.name, second_add.name}


def _stream_adds(proto, reader_op):
    """The residual Adds of a stack: Adds reading a stream tensor that a ``reader_op`` node (a norm's) reads too,
    directly or through a Cast; with that tensor."""
    casts = {n.output[0]: n.input[0] for n in proto.graph.node if n.op_type == "Cast"}
    stream = {n.input[0] for n in proto.graph.node if n.op_type == reader_op}
    stream |= {casts[t] for t in stream if t in casts}
    found = []
    for a in proto.graph.node:
        if a.op_type == "Add" and len(a.input) == 2:
            skip = next((t for t in a.input if t in stream), None)
            if skip is not None:
                found.append((skip, a))
    return found


def _bisect(model, x, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence


def _pinned(fd, planted):
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert planted <= named and len(named) <= 12, (planted, named)
    assert "other order" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_blocks_around_written_out_rms_norms_are_named_as_exchanged(exporter):
    """The norms' statistics read the stream directly (or through TorchScript's Cast to the type it has): the
    segment may narrow to the norm's last Mul — its input holds the value the other block's norm computes."""
    model = _RMSStack().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(285))
    proto = dc.export(model, (x,), exporter)
    adds = _stream_adds(proto, "Pow")
    assert len(adds) == 3, [a.name for _, a in adds]
    (skip, first), (_, second) = adds[1:]
    planted = _exchange(proto, skip, first, second)
    _pinned(_bisect(model, x, proto), planted)


def test_post_norm_blocks_ending_at_the_graph_output_are_named_as_exchanged(tmp_path):
    """The last block's norm writes the graph output; in a file whose every node and tensor was renamed the
    tensors inside the blocks are paired by their place, so the divergent tensor, once the blocks are put back,
    stands for another module's value — which PyTorch recorded."""
    model = _PostNormStack().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(286))
    proto = dc.export(model, (x,), "dynamo")
    norms = [n for n in proto.graph.node if n.op_type == "LayerNormalization"]
    adds = [(a, n) for n in norms for a in proto.graph.node if a.output[0] == n.input[0]]
    assert len(adds) == 3 and norms[-1].output[0] == proto.graph.output[0].name
    skip = norms[0].output[0]
    planted = _exchange(proto, skip, adds[1][0], adds[2][0], norms=(adds[1][1], adds[2][1]))
    _pinned(_bisect(model, x, proto), planted)
    onnx.save(proto, tmp_path / "bad.onnx")
    rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    order = {n.name: i for i, n in enumerate(proto.graph.node)}
    names = {n.name: r.name for n, r in zip(proto.graph.node, renamed.graph.node)}
    assert all(proto.graph.node[order[k]].op_type == renamed.graph.node[order[k]].op_type for k in names)
    _pinned(_bisect(model, x, renamed), {names[p] for p in planted})


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_block_run_on_the_previous_blocks_input_is_named_as_parallel(exporter):
    """``s = x + f(x); s + g(x)`` where the model computes ``s + g(s)`` (a parallel residual read into a sequential
    model): the second block's entries — a written-out RMSNorm's statistics and scale, which then compute the value
    the first block's norm computes, so the segment narrows past them — named, made to read ``s``."""
    model = _RMSStack().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(287))
    proto = dc.export(model, (x,), exporter)
    adds = _stream_adds(proto, "Pow")
    (skip, _), (after, _) = adds[1], adds[2]
    entries = {n.name for n in proto.graph.node if after in n.input and n.op_type in ("Pow", "Mul")}
    assert entries, after
    for n in proto.graph.node:
        if n.name in entries:
            n.input[:] = [skip if t == after else t for t in n.input]
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert entries <= named and len(named) <= 12, (entries, named)
    assert "not in parallel" in fd.explanation, fd.explanation


class _GatedStack(torch.nn.Module):
    """Three residual blocks whose branch is a gated MLP (two entries: ``up`` and ``gate`` read the block's input),
    pre-norm (``x + f(LN(x))``) or post-norm (``LN(x + f(x))``), then a head."""

    def __init__(self, post: bool, d=16):
        super().__init__()
        torch.manual_seed(291)
        self.post = post
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(3))
        self.ups, self.gates = (torch.nn.ModuleList(torch.nn.Linear(d, 2 * d) for _ in range(3)) for _ in range(2))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * d, d) for _ in range(3))
        self.head = torch.nn.Linear(d, 4)

    def forward(self, x):
        for norm, up, gate, down in zip(self.norms, self.ups, self.gates, self.downs):
            branch = (lambda h, up=up, gate=gate, down=down: down(torch.tanh(up(h)) * torch.sigmoid(gate(h))))
            x = norm(x + branch(x)) if self.post else x + branch(norm(x))
        return self.head(x)


def _moved_norm(proto, post: bool, block: int = 1) -> set[str]:
    """The ``block``-th norm moved to the other side of its block (in place): in a pre-norm file after the residual
    Add (the entries reading the block's input), in a post-norm file onto the block's input (the entries reading
    it, the Add's sum handed on); the planted nodes (the norm and the entries)."""
    norm = [n for n in proto.graph.node if n.op_type == "LayerNormalization"][block]
    readers = lambda t: [n for n in proto.graph.node if t in n.input]  # noqa: E731
    if not post:  # x + f(LN(x)) -> LN(x + f(x))
        source, normed = norm.input[0], norm.output[0]
        entries = readers(normed)
        add = next(n for n in readers(source) if n.op_type == "Add")
        for n in entries:
            n.input[:] = [source if t == normed else t for t in n.input]
        end = add.output[0]
        add.output[0] = end + "_unnormed"
        norm.input[0], norm.output[0] = add.output[0], end
    else:  # LN(x + f(x)) -> x + f(LN(x))
        add = next(n for n in proto.graph.node if norm.input[0] in n.output)
        source = next(t for t in add.input if len(readers(t)) > 1)
        entries = [n for n in readers(source) if n is not add]
        end = norm.output[0]
        for n in entries:
            n.input[:] = [end + "_normed" if t == source else t for t in n.input]
        norm.input[0], norm.output[0] = source, end + "_normed"
        add.output[0] = end
    _resort(proto)
    return {norm.name, *(n.name for n in entries)}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("post", [False, True], ids=["pre-norm-model", "post-norm-model"])
def test_a_norm_on_the_other_side_of_its_block_is_named_with_every_entry(exporter, post):
    """A pre-norm model's block written post-norm (its first divergence is the branch's entry, before the norm it
    misses), and a post-norm model's written pre-norm (its first divergence after the norm): the norm named with
    the block's entries, moved to the other side — not one entry rewired, nor the norm made an Identity."""
    model = _GatedStack(post).eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(292))
    proto = dc.export(model, (x,), exporter)
    planted = _moved_norm(proto, post)
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert planted <= named and len(named) <= 12, (planted, named)
    assert ".placement" in fd.explanation and ("(pre-norm)" if not post else "(post-norm)") in fd.explanation.split(
        "implies")[1], fd.explanation
