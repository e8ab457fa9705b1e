"""An op written in another form than the model's: a view where it permutes, a softmax over a flattened tail, a
scale after a softmax where the model scales its input, an activation before its layer where the model applies it
after, an RNN given a state it does not carry, a functional pool with another window. Each is named as the node whose
attribute (or form) differs, and confirmed by re-running the segment."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


def _shapes(proto):
    import onnx

    inferred = onnx.shape_inference.infer_shapes(proto)
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}


class _Attention(torch.nn.Module):
    """Two-head self-attention written out: projections, a head split by view + transpose, softmax, merge."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(181)
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):  # 1, T (6), 16
        q, k, v = self.qkv(x).view(1, x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(1, x.shape[1], 16))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_view_written_where_the_model_permutes_is_made_a_transpose(exporter):
    """The merge's transpose(1, 2) replaced by a Reshape to the transposed shape (``.view`` for ``.permute``):
    the values keep their memory order, so the heads are interleaved wrong. Named as the Reshape, whose
    Transpose with PyTorch's permutation reproduces PyTorch."""
    model, x = _Attention().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(183))
    proto = dc.export(model, (x,), exporter)
    shapes = _shapes(proto)
    node = next(n for n in proto.graph.node if n.op_type == "Transpose" and len(shapes.get(n.output[0], [])) == 4
                and shapes[n.output[0]] == [1, 6, 2, 8])
    out_shape = shapes[node.output[0]]
    proto.graph.initializer.append(numpy_helper.from_array(np.array(out_shape, np.int64), "viewed_shape"))
    view = helper.make_node("Reshape", [node.input[0], "viewed_shape"], [node.output[0]], name="planted_view")
    nodes = list(proto.graph.node)
    nodes[nodes.index(node)] = view
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    fd = _bisect(model, (x,), proto)
    _found(fd, "planted_view", at_most=2)
    assert "Transpose perm=[0, 2, 1, 3]" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_softmax_over_a_flattened_tail_is_named_with_the_axis_pytorch_normalises(exporter):
    """The scores' Softmax computed as opset 11 does (the input flattened from axis 1, normalised jointly over
    heads × queries × keys, reshaped back): made a Softmax over the last axis of the unflattened scores."""
    model, x = _Attention().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(187))
    proto = dc.export(model, (x,), exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    scores, out = softmax.input[0], softmax.output[0]
    proto.graph.initializer.extend([numpy_helper.from_array(np.array([1, -1], np.int64), "flat_shape"),
                                    numpy_helper.from_array(np.array([1, 2, 6, 6], np.int64), "back_shape")])
    planted = [helper.make_node("Reshape", [scores, "flat_shape"], ["scores_flat"], name="planted_flatten"),
               helper.make_node("Softmax", ["scores_flat"], ["probs_flat"], name="planted_softmax", axis=1),
               helper.make_node("Reshape", ["probs_flat", "back_shape"], [out], name="planted_back")]
    nodes = list(proto.graph.node)
    at = nodes.index(softmax)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + planted + nodes[at + 1:])
    fd = _bisect(model, (x,), proto)
    _found(fd, "planted_softmax", at_most=3)
    assert "normalised jointly" in fd.explanation and "implies 3 of [1, 2, 6, 6]" in fd.explanation, fd.explanation


class _BiasedAttention(_Attention):
    """As _Attention, with a learned relative position bias added to the scaled scores (Swin's)."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(2, 6, 6))

    def forward(self, x):  # 1, 6, 16
        q, k, v = self.qkv(x).view(1, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + self.bias, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(1, 6, 16))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("biased", [False, True], ids=["plain", "position-bias"])
def test_an_attention_scale_applied_after_the_softmax_is_moved_inside_it(exporter, biased):
    """The scores' scale taken off the path into the Softmax and applied to its output (``softmax(qkᵀ)·s`` for
    ``softmax(s·qkᵀ)``): named at the Mul after the Softmax, whose scale applied to the Softmax's input reproduces
    PyTorch — or, with a position bias added to the scaled scores (which the scale must not touch), applied to the
    product's scores."""
    model = (_BiasedAttention() if biased else _Attention()).eval()
    x = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(189))
    proto = dc.export(model, (x,), exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    made = {o: n for n in proto.graph.node for o in n.output}
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    scale, frontier = None, [softmax.input[0]]
    while scale is None:  # up from the softmax (past the bias Add) to the scalar Div / Mul of the scores
        node = made[frontier.pop(0)]
        held = [t for t in node.input if (t in inits or t in consts)
                and np.asarray(inits.get(t, consts.get(t))).size == 1]
        scale = node if node.op_type in ("Div", "Mul") and held else None
        frontier += [t for t in node.input if t in made and t not in consts]
    k = next(i for i, t in enumerate(scale.input) if t in inits or t in consts)
    number = float(np.asarray(inits.get(scale.input[k], consts.get(scale.input[k]))).reshape(-1)[0])
    number = 1 / number if scale.op_type == "Div" else number
    for n in proto.graph.node:  # the scale left out of the scores
        n.input[:] = [scale.input[1 - k] if t == scale.output[0] else t for t in n.input]
    proto.graph.initializer.append(numpy_helper.from_array(np.array(number, np.float32), "late_scale"))
    out = softmax.output[0]
    softmax.output[0] = out + "_unscaled"
    late = helper.make_node("Mul", [out + "_unscaled", "late_scale"], [out], name="planted_late_scale")
    nodes = [n for n in proto.graph.node if n is not scale]
    at = nodes.index(softmax)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at + 1] + [late] + nodes[at + 1:])
    fd = _bisect(model, (x,), proto)
    _found(fd, "planted_late_scale", at_most=6 if biased else 4)
    said = "applied to the scores" if biased else "applied to its input"
    assert said in fd.explanation, fd.explanation


class _ConvStack(torch.nn.Module):
    """Conv, Conv, ReLU, a pooled head: the activation after the second layer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(191)
        self.c1, self.c2, self.head = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.c2(self.c1(x))).mean((2, 3)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_activation_applied_before_its_layer_is_moved_after_it(exporter):
    """The second layer's ReLU applied to its input instead of its output (``c2(relu(x))`` for ``relu(c2(x))``,
    a pre-activation port of a post-activation block): named at the ReLU and the Conv, the ReLU moved to the Conv's
    output reproduces PyTorch."""
    model, x = _ConvStack().eval(), torch.randn(1, 3, 10, 10, generator=torch.Generator().manual_seed(193))
    proto = dc.export(model, (x,), exporter)
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    relu = next(n for n in proto.graph.node if n.op_type == "Relu" and n.input[0] == convs[1].output[0])
    h, out = convs[0].output[0], relu.output[0]
    relu.input[0], relu.output[0] = h, "relu_early"  # the ReLU reads the layer's input
    convs[1].input[0], convs[1].output[0] = "relu_early", out  # the Conv reads it, and writes what the ReLU wrote
    nodes = [n for n in proto.graph.node if n is not relu]
    nodes.insert(nodes.index(convs[1]), relu)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    fd = _bisect(model, (x,), proto)
    _found(fd, relu.name, at_most=3)
    assert convs[1].name in fd.layer.segment and "applied to the layer's output" in fd.explanation, fd.explanation


class _Tagger(torch.nn.Module):
    """An embedding-free tagger: a projection, a one-layer LSTM started from zeros, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(191)
        self.inp, self.lstm, self.head = torch.nn.Linear(4, 8), torch.nn.LSTM(8, 8, batch_first=True), \
            torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.lstm(torch.tanh(self.inp(x)))[0])


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_rnn_given_a_state_pytorch_does_not_carry_is_run_from_zeros(exporter):
    """The LSTM given a baked initial state (a traced state kept as a constant, a port threading another layer's
    final state): PyTorch's module was called with its input alone, so it starts from zeros — the state inputs
    left empty reproduce PyTorch."""
    model, x = _Tagger().eval(), torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(193))
    proto = dc.export(model, (x,), exporter)
    lstm = next(n for n in proto.graph.node if n.op_type == "LSTM")
    rng = np.random.default_rng(197)
    while len(lstm.input) < 7:
        lstm.input.append("")
    for i, name in ((5, "stale_h"), (6, "stale_c")):
        proto.graph.initializer.append(numpy_helper.from_array(rng.normal(0, 0.5, (1, 2, 8)).astype(np.float32), name))
        lstm.input[i] = name
    fd = _bisect(model, (x,), proto)
    _found(fd, lstm.name, at_most=3)
    assert "initial state" in fd.explanation and "zeros" in fd.explanation, fd.explanation


class _Pooled(torch.nn.Module):
    """Convolutions with a functional max pool between them (no pool module to read the window from)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(199)
        self.a, self.b = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.b(torch.nn.functional.max_pool2d(torch.relu(self.a(x)), 2))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_functional_pools_window_is_read_from_pytorchs_pool_op(exporter):
    """The max pool's window 3×3 with padding 1 (the output shape kept) where ``F.max_pool2d(x, 2)`` pools 2×2:
    no module holds the configuration; the ATen op's arguments do (kernel 2, stride = kernel, no padding)."""
    model, x = _Pooled().eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(211))
    proto = dc.export(model, (x,), exporter)
    pool = next(n for n in proto.graph.node if n.op_type == "MaxPool")
    for a in pool.attribute:
        if a.name == "kernel_shape":
            a.ints[:] = [3, 3]
        elif a.name == "pads":
            a.ints[:] = [1, 1, 1, 1]
    if not any(a.name == "pads" for a in pool.attribute):
        pool.attribute.append(helper.make_attribute("pads", [1, 1, 1, 1]))
    fd = _bisect(model, (x,), proto)
    _found(fd, pool.name, at_most=3)
    assert "kernel_shape = [3, 3] where PyTorch's max_pool2d implies [2, 2]" in fd.explanation, fd.explanation


class _Residual(torch.nn.Module):
    """A stem, one residual block (conv, ReLU, conv, added to its input), a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(223)
        self.stem, self.c1, self.c2 = (torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1),
                                       torch.nn.Conv2d(8, 8, 3, padding=1))
        self.head = torch.nn.Conv2d(8, 2, 1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return self.head(h + self.c2(torch.relu(self.c1(h))))


def _copies(block, block_in: str, block_out: str) -> list:
    """The block's nodes copied (same weights), the copy reading ``block_out`` where the block reads ``block_in``;
    names and tensors suffixed ``_again``."""
    import onnx

    renamed, copies = {block_in: block_out}, []
    for n in block:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = n.name + "_again"
        c.input[:] = [renamed.get(t, t) for t in n.input]
        for k, t in enumerate(n.output):
            renamed[t] = c.output[k] = t + "_again"
        copies.append(c)
    return copies


def _applied_twice(proto):
    """The residual block's nodes copied (same weights) and run again on its output; the readers of the block's
    output read the copy's. Returns the copy's node names."""
    nodes = list(proto.graph.node)
    add = next(n for n in nodes if n.op_type == "Add" and all(not t.startswith("onnx::") for t in n.input)
               and len({p.op_type for p in nodes if set(p.output) & set(n.input)}) == 2)
    producers = {t: n for n in nodes for t in n.output}
    skip = next(t for t in add.input if producers[t].op_type == "Relu" and not any(
        p.op_type == "Conv" and p.output[0] == t for p in nodes))
    block, frontier = [add], [t for t in add.input if t != skip]
    while frontier:
        n = producers.get(frontier.pop())
        if n is not None and n not in block and skip not in n.output:
            block.append(n)
            frontier.extend(t for t in n.input if t in producers)
    block.sort(key=nodes.index)
    copies = _copies(block, skip, add.output[0])
    for n in nodes[nodes.index(add) + 1:]:
        n.input[:] = [add.output[0] + "_again" if t == add.output[0] else t for t in n.input]
    for o in proto.graph.output:
        if o.name == add.output[0]:
            o.name += "_again"
    at = nodes.index(add) + 1
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + copies + nodes[at:])
    return [c.name for c in copies]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_block_applied_twice_is_named_as_the_copy_of_its_nodes(exporter):
    """A residual block run again on its own output with the same weights (an unrolled loop one step too many):
    the copy's first node reads the block's output where PyTorch's value implies the block's input; its nodes are
    the same ops, attributes and weights as the block's, so the finding names the whole copy."""
    model, x = _Residual().eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(227))
    proto = dc.export(model, (x,), exporter)
    copy = _applied_twice(proto)
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert set(copy) <= set(fd.layer.segment) and len(fd.layer.segment) <= len(copy) + 2, (copy, fd.layer.segment)
    assert f"repeat the {len(copy)} nodes" in fd.explanation and "applied twice" in fd.explanation, fd.explanation


class _PreNorm(torch.nn.Module):
    """A projection, one pre-norm residual MLP block (x + fc2(gelu(fc(norm(x))))), a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(239)
        self.inp, self.norm, self.fc, self.fc2, self.head = (
            torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 16),
            torch.nn.Linear(16, 4))
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        h = self.inp(x)
        return self.head(h + self.fc2(torch.nn.functional.gelu(self.fc(self.norm(h)))))


@pytest.mark.parametrize("shape", [(3, 8), (2, 3, 8)])  # a sequence: PyTorch's Linear reads a view of the norm
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_norm_moved_after_the_residual_is_named_with_the_branch_that_lost_it(exporter, shape):
    """Pre-norm written as post-norm (``norm(x + fc(x))`` for ``x + fc(norm(x))``): the branch's product reads the
    stream where PyTorch's value is the norm's output, and the norm — its node known by the module's scale, held
    exactly — is applied after the residual instead. The finding names the product and the moved norm, put back
    onto the block's input."""
    model, x = _PreNorm().eval(), torch.randn(*shape, generator=torch.Generator().manual_seed(241))
    proto = dc.export(model, (x,), exporter)
    nodes = list(proto.graph.node)
    norm = next(n for n in nodes if n.op_type == "LayerNormalization")
    entry = next(n for n in nodes if norm.output[0] in n.input)
    add = next(n for n in nodes if n.op_type == "Add" and norm.input[0] in n.input)
    entry.input[list(entry.input).index(norm.output[0])] = norm.input[0]
    for n in nodes[nodes.index(add) + 1:]:
        n.input[:] = ["normed_after" if t == add.output[0] else t for t in n.input]
    norm.input[0], norm.output[0] = add.output[0], "normed_after"
    nodes.remove(norm)
    nodes.insert(nodes.index(add) + 1, norm)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert {entry.name, norm.name} <= set(fd.layer.segment) and len(fd.layer.segment) <= 4, fd.layer.segment
    assert f"{norm.name}.placement" in fd.explanation and "(pre-norm)" in fd.explanation.split("implies")[1], \
        fd.explanation  # the norm moved back onto the block's input (block_order.norm_placements)


class _PostNormMlp(torch.nn.Module):
    """A projection, a post-norm MLP block (norm(x + fc2(gelu(fc1(x))))) and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(261)
        self.inp, self.fc1, self.fc2, self.norm, self.head = (
            torch.nn.Linear(8, 16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16),
            torch.nn.Linear(16, 4))

    def forward(self, x):
        h = self.inp(x)
        return self.head(self.norm(h + self.fc2(torch.nn.functional.gelu(self.fc1(h)))))


def _mlp_applied_twice(proto):
    """The MLP block (from the first product reading the stream to the residual Add) copied with its weights and
    run again on the Add's output, the norm reading the copy's Add. Returns the copy's node names."""
    nodes = list(proto.graph.node)
    producers = {t: n for n in nodes for t in n.output}
    norm = next(n for n in nodes if n.op_type == "LayerNormalization")
    add = producers[norm.input[0]]
    skip = next(t for t in add.input if any(n.op_type in ("MatMul", "Gemm") and t in n.input for n in nodes))
    block, frontier = [add], [t for t in add.input if t != skip]
    while frontier:
        n = producers.get(frontier.pop())
        if n is not None and n not in block and skip not in n.output:
            block.append(n)
            frontier.extend(t for t in n.input if t in producers and t != skip)
    block.sort(key=nodes.index)
    copies = _copies(block, skip, add.output[0])
    norm.input[0] = add.output[0] + "_again"
    at = nodes.index(add) + 1
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + copies + nodes[at:])
    return [c.name for c in copies]


@pytest.mark.parametrize("exporter", ["dynamo"])
def test_a_block_applied_twice_before_a_norm_is_named_as_the_copy_left_out(exporter):
    """The MLP block run twice with its weights before the norm: where the rewiring is not reached (its reader's
    input holds no PyTorch value), the copy is found by its nodes' twins and left out (the copy's last node an
    Identity of the block's output); the finding names the copy.  (The TorchScript file of this model is
    narrowed to a segment pairing the norm's op with the copy's residual Add, which holds neither: not read.)"""
    model, x = _PostNormMlp().eval(), torch.randn(3, 8, generator=torch.Generator().manual_seed(263))
    proto = dc.export(model, (x,), exporter)
    copy = _mlp_applied_twice(proto)
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert set(copy) <= set(fd.layer.segment) and len(fd.layer.segment) <= len(copy) + 2, (copy, fd.layer.segment)
    assert f"{len(copy)} nodes" in fd.explanation and "same weights" in fd.explanation, fd.explanation


class _MaskedAttention(_Attention):
    """The two-head attention with a causal mask added to its scores."""

    def forward(self, x):  # 1, 6, 16
        q, k, v = self.qkv(x).view(1, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
        mask = torch.triu(torch.full((6, 6), -1e9), diagonal=1)
        w = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + mask, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(1, 6, 16))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_mask_applied_to_the_probabilities_is_moved_to_the_scores(exporter):
    """``softmax(s).masked_fill(mask, 0)`` where the model computes ``softmax(s + mask)``: the mask's Add taken out
    and a Where of the probabilities and zero put after the Softmax (the masked weights zeroed, the others not
    renormalised)."""
    model, x = _MaskedAttention().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(186))
    proto = dc.export(model, (x,), exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    add = next(n for n in proto.graph.node if n.output[0] == softmax.input[0])
    assert add.op_type == "Add"
    constants = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    constants.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
                      if n.op_type == "Constant" and n.attribute[0].name == "value"})
    mask_value = next(constants[t] for t in add.input if t in constants)
    scores = next(t for t in add.input if t not in constants)
    softmax.input[0] = scores  # the scores unmasked
    keep = helper.make_tensor("keep", 9, list(mask_value.shape), (mask_value > -1).reshape(-1).tolist())
    zero = helper.make_tensor("zero", 1, [], [0.0])
    probs, masked = softmax.output[0], "probabilities_masked"
    for n in proto.graph.node:
        n.input[:] = [masked if t == probs else t for t in n.input]
    at = list(proto.graph.node).index(softmax) + 1
    proto.graph.node.insert(at, helper.make_node("Where", ["keep_mask", probs, "zero_fill"], [masked],
                                                 name="mask_after_softmax"))
    proto.graph.node.insert(at, helper.make_node("Constant", [], ["zero_fill"], value=zero))
    proto.graph.node.insert(at, helper.make_node("Constant", [], ["keep_mask"], value=keep))
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert {softmax.name, "mask_after_softmax"} <= named and len(named) <= 12, named
    assert "before the Softmax" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_softmax_written_out_without_its_division_is_named_whole(exporter):
    """``exp(x − max(x))`` left undivided by its sum (an online-softmax port missing its last step): the written-out
    softmax's three nodes named, the division by the sum put back."""
    model, x = _Attention().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(187))
    proto = dc.export(model, (x,), exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    scores, probs = softmax.input[0], softmax.output[0]
    at = list(proto.graph.node).index(softmax)
    proto.graph.node.remove(softmax)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= 18:  # the axes an input
        proto.graph.initializer.append(numpy_helper.from_array(np.array([3], np.int64), "max_axes"))
        peak = helper.make_node("ReduceMax", [scores, "max_axes"], ["peak"], name="written_max", keepdims=1)
    else:
        peak = helper.make_node("ReduceMax", [scores], ["peak"], name="written_max", axes=[3], keepdims=1)
    shift = helper.make_node("Sub", [scores, "peak"], ["shifted"], name="written_shift")
    exp = helper.make_node("Exp", ["shifted"], [probs], name="written_exp")
    for n in (exp, shift, peak):
        proto.graph.node.insert(at, n)
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert {"written_max", "written_shift", "written_exp"} <= named and len(named) <= 12, named
    assert "divided by their sum" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter,tokens", [("dynamo", 6), ("torchscript", 6), ("dynamo", 20)])
def test_attention_probabilities_scaled_by_a_sink_share_name_the_factor_with_its_nodes(exporter, tokens):
    """The probabilities multiplied by σ(logsumexp(scores)) per query (an attention sink the model does not have,
    a port of a model with sinks): the Mul made an Identity of the probabilities, the ReduceLogSumExp and Sigmoid
    computing the factor for it named with it — not the Sigmoid read as another activation.  With 20 keys every
    logsumexp passes 2.5, where a HardSigmoid saturates at 1: made a HardSigmoid, the Sigmoid would reproduce
    PyTorch too, by computing a factor of 1 — the reading is still that the factor is not applied."""
    model, x = _Attention().eval(), torch.randn(1, tokens, 16, generator=torch.Generator().manual_seed(229))
    proto = dc.export(model, (x,), exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    probs, scores = softmax.output[0], softmax.input[0]
    softmax.output[0] = probs + "_unshared"
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= 18:  # the axes an input
        proto.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "sink_axes"))
        lse = helper.make_node("ReduceLogSumExp", [scores, "sink_axes"], ["sink_lse"], name="sink_lse", keepdims=1)
    else:
        lse = helper.make_node("ReduceLogSumExp", [scores], ["sink_lse"], name="sink_lse", keepdims=1, axes=[-1])
    planted = [lse, helper.make_node("Sigmoid", ["sink_lse"], ["sink_share"], name="sink_share"),
               helper.make_node("Mul", [softmax.output[0], "sink_share"], [probs], name="sink_mul")]
    nodes = list(proto.graph.node)
    at = nodes.index(softmax) + 1
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + planted + nodes[at:])
    fd = _bisect(model, (x,), proto)
    _found(fd, "sink_mul")
    assert {"sink_lse", "sink_share"} <= set(fd.layer.segment) and "not applied" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_scores_soft_capped_where_the_model_does_not_cap_them_name_the_scalings_with_the_tanh(exporter):
    """c·tanh(s / c) inserted on the attention scores (a Gemma 2 soft cap carried into another model): the Tanh
    removed reproduces PyTorch, and the Div and Mul by c around it are named with it — three nodes, not the Tanh
    alone (a cap this small bends every score)."""
    model, x = _Attention().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(233))
    proto = dc.export(model, (x,), exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    scores = softmax.input[0]
    proto.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "cap"))
    planted = [helper.make_node("Div", [scores, "cap"], ["capped_in"], name="cap_div"),
               helper.make_node("Tanh", ["capped_in"], ["capped_tanh"], name="cap_tanh"),
               helper.make_node("Mul", ["capped_tanh", "cap"], ["capped"], name="cap_mul")]
    softmax.input[0] = "capped"
    nodes = list(proto.graph.node)
    at = nodes.index(softmax)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + planted + nodes[at:])
    fd = _bisect(model, (x,), proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert {"cap_div", "cap_tanh", "cap_mul"} <= set(fd.layer.segment) and len(fd.layer.segment) <= 4, fd.layer.segment
    assert "0.5·tanh(x / 0.5)" in fd.explanation, fd.explanation


def _scores_product(proto):
    """The MatMul computing an attention's scores: walked up from the Softmax through single computed inputs."""
    by_output = {o: n for n in proto.graph.node for o in n.output}
    consts = {i.name for i in proto.graph.initializer} | {n.output[0] for n in proto.graph.node if n.op_type == "Constant"}
    node = by_output[next(n for n in proto.graph.node if n.op_type == "Softmax").input[0]]
    while node.op_type != "MatMul":
        node = by_output[next(t for t in node.input if t not in consts)]
    return node


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_queries_and_keys_normalised_where_the_model_does_not_are_named_together(exporter):
    """q and k each RMS-normalised along the contracted axis before the scores (``x·√d / max(‖x‖, ε)``, a
    QK-norm port applied to a plain attention): neither factor alone explains the scores; both removed, with the
    scalings by √d after them, reproduce PyTorch — every inserted node named, none of the model's."""
    model, x = _Attention().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(234))
    proto = dc.export(model, (x,), exporter)
    product = _scores_product(proto)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    proto.graph.initializer.extend([numpy_helper.from_array(np.array(1e-6, np.float32), "qk_eps"),
                                    numpy_helper.from_array(np.array(8 ** 0.5, np.float32), "qk_root")])
    planted, inserted = [], []
    for k, axis in ((0, -1), (1, -2)):
        t, p = product.input[k], f"qk{k}"
        if opset >= 18:
            proto.graph.initializer.append(numpy_helper.from_array(np.array([axis], np.int64), f"{p}_axes"))
            l2 = helper.make_node("ReduceL2", [t, f"{p}_axes"], [f"{p}_l2"], name=f"{p}_l2", keepdims=1)
        else:
            l2 = helper.make_node("ReduceL2", [t], [f"{p}_l2"], name=f"{p}_l2", keepdims=1, axes=[axis])
        planted += [l2, helper.make_node("Max", [f"{p}_l2", "qk_eps"], [f"{p}_floor"], name=f"{p}_floor"),
                    helper.make_node("Div", [t, f"{p}_floor"], [f"{p}_div"], name=f"{p}_div"),
                    helper.make_node("Mul", [f"{p}_div", "qk_root"], [f"{p}_normed"], name=f"{p}_scale")]
        inserted += [f"{p}_l2", f"{p}_floor", f"{p}_div", f"{p}_scale"]
        product.input[k] = f"{p}_normed"
    nodes = list(proto.graph.node)
    at = nodes.index(product)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + planted + nodes[at:])
    fd = _bisect(model, (x,), proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert set(inserted) <= set(fd.layer.segment) and len(fd.layer.segment) <= 10, fd.layer.segment
    assert "2 computed factors" in fd.explanation and "none applied" in fd.explanation, fd.explanation


class _SequencePooled(torch.nn.Module):
    """A token encoder, then the sequence pooled — its first token (CLS) or the mean over tokens — and a head."""

    def __init__(self, pooling: str):
        super().__init__()
        torch.manual_seed(235)
        self.pooling, self.enc, self.head = pooling, torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)

    def forward(self, x):  # 2, 7, 8
        h = torch.tanh(self.enc(x))
        return self.head(h[:, 0] if self.pooling == "first" else h.mean(1))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_a_sequence_pooled_in_the_other_convention_is_named_at_the_pooling(exporter, pooling):
    """CLS pooling exported as a mean over the tokens, and mean pooling as the first token (a port reading
    ``global_pool`` the other way): the pooling node, made the other convention, reproduces PyTorch."""
    model, x = _SequencePooled(pooling).eval(), torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(236))
    proto = dc.export(model, (x,), exporter)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    shapes = _shapes(proto)
    if pooling == "first":
        node = next(n for n in proto.graph.node if n.op_type == "Gather" and len(shapes.get(n.input[0], [])) == 3)
        node.op_type = "ReduceMean"
        del node.attribute[:], node.input[1:]
        node.attribute.append(helper.make_attribute("keepdims", 0))
        if opset >= 18:
            proto.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "pool_axes"))
            node.input.append("pool_axes")
        else:
            node.attribute.append(helper.make_attribute("axes", [1]))
    else:
        node = next(n for n in proto.graph.node if n.op_type == "ReduceMean")
        node.op_type = "Gather"
        del node.attribute[:], node.input[1:]
        proto.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), "pool_index"))
        node.input.append("pool_index")
        node.attribute.append(helper.make_attribute("axis", 1))
    fd = _bisect(model, (x,), proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and node.name in fd.layer.segment, fd.explanation
    assert len(fd.layer.segment) <= 3 and f"{node.name}.op" in fd.explanation, fd.explanation
