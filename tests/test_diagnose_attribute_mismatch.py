"""Attribute rule: node attributes against the module's configuration, else found by trying alternatives."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import onnx
import torch
from onnx import helper, numpy_helper

import onnx_bisect
from onnx_bisect.report.text import computing_nodes
import rewrites

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_softmax_axis_against_the_module_dim():
    report, _ = bisect_case(dc.attribute("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    [row] = fd.evidence["attributes"]
    assert (row["attribute"], row["onnx_value"], row["expected"]) == ("axis", 0, -1)
    assert "softmax" in row["source"]


def test_conv_pads_against_the_conv2d():
    report, _ = bisect_case(dc.attribute("cnn", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    row = fd.evidence["attributes"][0]
    assert (row["attribute"], row["expected"]) == ("pads", [1, 1, 1, 1])


def test_transpose_perm_found_by_search():
    """k.transpose(-2, -1) inside forward has no module configuration: the alternative perm reproduces PyTorch."""
    report, _ = bisect_case(dc.attribute("transformer", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    row = fd.evidence["attributes"][0]
    assert row["attribute"] == "perm" and row["expected"] == [0, 1, 3, 2]


class _Head(torch.nn.Module):
    """Conv → BatchNorm → ReLU6, a GELU MLP: ONNX Runtime fuses the first three into a FusedConv with a Clip
    activation; TorchScript writes the GELU as x·(1 + erf(x/√2))·0.5."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.conv, self.bn, self.act = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6()
        self.fc1, self.gelu, self.fc2 = torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.conv.weight.mul_(4.0)  # outputs well beyond 6: the clamp matters

    def forward(self, x):
        h = self.act(self.bn(self.conv(x))).mean(dim=(2, 3))
        return self.fc2(self.gelu(self.fc1(h)))


def _head_report(edit, rewrite=None):
    model, x = _Head().eval(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    proto = dc.export(model, (x,), "torchscript")
    proto = edit(rewrites.rewrite(proto, rewrite) if rewrite else proto)
    with dc.quiet():
        return onnx_bisect.bisect(model, (x,), onnx=proto), proto


def test_a_wrong_constant_inside_a_gelus_formula_is_found_from_the_formula():
    """The Div by √2 inside the GELU is no op's argument: the constant the GELU formula needs is tried."""
    def edit(proto):
        div = next(n for n in proto.graph.node if n.op_type == "Div" and "gelu" in n.name.lower())
        const = next(n for n in proto.graph.node if n.output[0] == div.input[1])
        value = numpy_helper.to_array(const.attribute[0].t) * np.float32(1.5)
        const.attribute[0].t.CopyFrom(numpy_helper.from_array(value.astype(np.float32)))
        return proto
    report, proto = _head_report(edit)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert "Div" in row["onnx_node"] and abs(row["expected"] - 2 ** 0.5) < 1e-5 and "GELU formula" in row["source"]


def test_the_clip_bounds_of_a_fused_conv_against_the_relu6():
    """ONNX Runtime's offline optimizer fused Conv+BatchNorm+ReLU6 into one FusedConv; its activation_params
    are the clamp's bounds, set wrong here: the bounds ReLU6 clamps to reproduce PyTorch."""
    def edit(proto):
        fused = next(n for n in proto.graph.node if n.op_type == "FusedConv")
        params = next(a for a in fused.attribute if a.name == "activation_params")
        params.CopyFrom(helper.make_attribute("activation_params", [0.0, 3.0]))
        return proto
    report, _ = _head_report(edit, "ort-extended")
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert (row["attribute"], row["onnx_value"], row["expected"]) == ("activation_params", [0.0, 3.0], [0.0, 6.0])


class _Recurrent(torch.nn.Module):
    """A batch-first GRU read by a Linear: the export reshapes the GRU's sequence-first output, then transposes it
    to batch-first."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(17)
        self.gru, self.out = torch.nn.GRU(8, 16, batch_first=True), torch.nn.Linear(16, 5)

    def forward(self, x):
        b, n, _ = x.shape
        return self.out(self.gru(x)[0].reshape(b * n, 16)).reshape(b, n, 5)


def test_a_reshape_before_a_transpose_is_checked_against_the_shape_before_the_transpose():
    """The Reshape after the GRU gets another shape of as many elements (the rows flattened later, so the model
    still runs): the Transpose after it then lays the values out wrong.  The shape that was due is no PyTorch value's shape — it
    is the GRU output's laid out as before that Transpose — and with it the segment reproduces PyTorch (a TCN's
    GRU in an onnxslim file, whose nodes carry no scopes: cause unknown, the Linear's ops the only ones known)."""
    model, x = _Recurrent().eval(), torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(18))
    proto = dc.export(model, (x,), "dynamo")
    nodes = list(proto.graph.node)
    reshape = next(n for i, n in enumerate(nodes) if n.op_type == "Reshape" and nodes[i + 1].op_type == "Transpose")
    shape = next(i for i in proto.graph.initializer if i.name == reshape.input[1])
    assert list(numpy_helper.to_array(shape)) == [4, 2, 16]
    shape.CopyFrom(numpy_helper.from_array(np.array([4, 8, 4], dtype=np.int64), shape.name))
    for node in proto.graph.node:  # no scopes (as onnxslim leaves it): only the Linear's ops are captured
        node.ClearField("metadata_props")
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert not report.ok and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert reshape.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    [row] = fd.evidence["attributes"]
    assert row["onnx_node"] == reshape.name and row["expected"] == [4, 2, 16], row


def test_a_wrong_constant_inside_a_quick_gelu_is_found_from_its_formula(tmp_path):
    """The 1.702 of CLIP's quick GELU (x·sigmoid(1.702·x)) scaled ×1.5 in its Mul, in a renamed file of the fault
    sweep's CLIP vision tower: no op's argument says 1.702 and no single scalar fits the segment's values; the
    activation's formula does (cause unknown before)."""
    import fault_sweep
    import sweep_models

    model, inputs = sweep_models.build("clipvision")
    proto = fault_sweep.export(model, inputs, "dynamo")
    muls = [n for n in proto.graph.node if n.op_type == "Mul" and any(
        i.name in n.input and i.dims == [] and abs(float(numpy_helper.to_array(i)) - 1.702) < 1e-4
        for i in proto.graph.initializer)]
    mul = muls[-1]
    const = next(i for i in proto.graph.initializer if i.name in mul.input and i.dims == [])
    own = numpy_helper.from_array(numpy_helper.to_array(const) * np.float32(1.5), const.name + "_planted")
    proto.graph.initializer.append(own)  # the layers share the constant: the second layer's Mul gets its own
    mul.input[list(mul.input).index(const.name)] = own.name
    onnx.save(proto, tmp_path / "bad.onnx")
    fault_sweep.rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    planted = renamed.graph.node[list(proto.graph.node).index(mul)].name
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=renamed)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    [row] = fd.evidence["attributes"]
    assert row["onnx_node"] == planted and abs(row["expected"] - 1.702) < 1e-5, row


def test_a_scalar_whose_product_no_module_returns_is_found_by_searching_it():
    """The fault sweep's Conformer block, TorchScript export optimized offline by ONNX Runtime: the macaron
    half-step's 0.5 (``x + 0.5·ff1(x)``, the parent's own arithmetic) set to 0.75.  Its Mul's output is no
    module's value and the segment ends at the LayerNorm after the residual Add, so no closed form fits the
    factor; searched by re-running the segment, 0.5 is found and confirmed (cause unknown before)."""
    import fault_sweep
    import sweep_models

    model, inputs = sweep_models.build("conformer")
    proto = rewrites.ort_optimized(fault_sweep.export(model, inputs, "torchscript"), "extended")
    mul = next(n for n in proto.graph.node if n.op_type == "Mul" and n.name == "/Mul")
    const = next(i for i in proto.graph.initializer if i.name in mul.input and not i.dims)
    assert float(numpy_helper.to_array(const)) == 0.5
    own = numpy_helper.from_array(np.array(0.75, dtype=np.float32), const.name + "_planted")
    proto.graph.initializer.append(own)
    mul.input[list(mul.input).index(const.name)] = own.name
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    [row] = fd.evidence["attributes"]
    assert row["onnx_node"] == mul.name and row["expected"] == 0.5, row
    assert mul.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment


def test_a_reshape_moving_a_size_one_axis_is_found_before_the_segment_that_reads_it(tmp_path):
    """The fault sweep's ConvNeXt V2 simplified by onnx-simplifier: the Reshape after the first pointwise Linear
    gets [8, 1, 8, 64] for [1, 8, 8, 64] — the same numbers in the same order, so the Linear and its GELU pair
    as matching, and only the global response norm after them, reducing over the spatial axes, computes wrong.
    Fed PyTorch's value in PyTorch's shape, as that Reshape at PyTorch's shape would give it, the norm agrees:
    the Reshape is named (cause unknown before, the norm's five nodes blamed)."""
    import fault_sweep
    import sweep_models

    model, inputs = sweep_models.build("convnextv2")
    onnx.save(fault_sweep.export(model, inputs, "torchscript"), tmp_path / "plain.onnx")
    fault_sweep.simplify(tmp_path / "plain.onnx", tmp_path / "sim.onnx")
    proto = onnx.load(tmp_path / "sim.onnx")
    inits = {i.name: i for i in proto.graph.initializer}
    reshape = next(n for n in proto.graph.node if n.op_type == "Reshape" and n.input[1] in inits
                   and list(numpy_helper.to_array(inits[n.input[1]])) == [1, 8, 8, 64])
    own = numpy_helper.from_array(np.array([8, 1, 8, 64], dtype=np.int64), reshape.input[1] + "_planted")
    proto.graph.initializer.append(own)
    reshape.input[1] = own.name
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    [row] = fd.evidence["attributes"]
    assert row["onnx_node"] == reshape.name and row["expected"] == [1, 8, 8, 64], row
    assert fd.layer.segment == (reshape.name,) and reshape.name not in fd.within.segment


class _RelativeGather(torch.nn.Module):
    """Relative positions clamped to a bucket range and gathered from per-bucket scores (DeBERTa's c2p/p2c
    attention, T5's buckets): the clamp works on integers, which no PyTorch float value holds."""

    def __init__(self, span: int = 4):
        super().__init__()
        torch.manual_seed(12)
        self.span, self.proj, self.table = span, torch.nn.Linear(16, 16), torch.nn.Parameter(torch.randn(2 * span, 16))

    def forward(self, x):
        n = x.shape[1]
        pos = torch.arange(n, device=x.device)
        index = torch.clamp(pos[None, :] - pos[:, None] + self.span, 0, 2 * self.span - 1)
        scores = self.proj(x) @ self.table.t()  # 1, n, 2 * span
        return torch.gather(scores, -1, index.unsqueeze(0).expand(x.shape[0], n, n)).softmax(-1)


def test_the_bounds_of_a_clip_on_gather_indices_are_the_gathered_axis_range():
    """A Clip of integer positions with a narrowed upper bound, inside an unnamed segment of integer arithmetic:
    the bounds that keep the indices within the axis the Gather reads reproduce PyTorch (a DeBERTa TorchScript
    file: a 29-node segment, unknown)."""
    model, x = _RelativeGather().eval(), torch.randn(1, 12, 16, generator=torch.Generator().manual_seed(3))
    buffer = io.BytesIO()
    with dc.quiet():  # a dynamic length: the positions are computed at run time, not folded into a constant
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {1: "n"}})
    proto = onnx.load_from_string(buffer.getvalue())
    clip = next(n for n in proto.graph.node if n.op_type == "Clip")
    bound = next(n for n in proto.graph.node if n.output[0] == clip.input[2])
    assert int(numpy_helper.to_array(bound.attribute[0].t)) == 7
    bound.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(3, dtype=np.int64)))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert (row["onnx_node"], row["attribute"], row["onnx_value"], row["expected"]) == (clip.name, "max", 3.0, 7.0)
    assert clip.name in fd.layer.segment and len(fd.layer.segment) <= 12, fd.layer.segment


def test_a_reshape_laying_a_4d_transpose_out_in_3d_is_checked_against_the_merged_shape():
    """The dynamo exporter lays Falcon's multi-query key transpose (1, 1, 16, 8) -> (1, 1, 8, 16) out as a Reshape
    to [-1, 16, 8], a 3-d Transpose and a Reshape back: PyTorch has no value of that rank, so the wanted shape
    is PyTorch's with its leading axes merged, laid out as before the Transpose (unknown before)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import fault_sweep
    import sweep_models

    model, inputs = sweep_models.build("falcon")
    proto = fault_sweep.export(model, inputs, "dynamo")
    consumers = {t: n for n in proto.graph.node for t in n.input}
    constants = {i.name: i for i in proto.graph.initializer}
    reshape = next(n for n in proto.graph.node if n.op_type == "Reshape" and n.input[1] in constants
                   and numpy_helper.to_array(constants[n.input[1]]).tolist() == [-1, 16, 8]
                   and consumers[n.output[0]].op_type == "Transpose")
    constants[reshape.input[1]].CopyFrom(numpy_helper.from_array(np.array([-1, 32, 4], np.int64), reshape.input[1]))
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert row["onnx_node"] == reshape.name and row["expected"] == [1, 16, 8], row
    assert reshape.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment


class _Windows(torch.nn.Module):
    """Window partition with sizes read from the input (a dynamic file): the Reshape's shape is a Concat of
    computed sizes and constant pieces."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.conv(x).permute(0, 2, 3, 1)
        n, h, w, c = y.shape
        y = y.reshape(-1, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, c)
        return self.fc(y).softmax(1)


def test_a_wrong_constant_piece_of_a_computed_shape_is_found_against_pytorchs_shape():
    """One constant piece of the Concat that assembles a Reshape's shape is wrong (the -1 absorbs it): the piece
    at the entries of PyTorch's shape reproduces PyTorch, and the fix names the Concat and the Reshape (Swin V2
    window partition in a TorchScript file: baked-shape, 17 nodes)."""
    model, x = _Windows().eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    buffer = io.BytesIO()
    with dc.quiet():
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}})
    proto = onnx.load_from_string(buffer.getvalue())
    reshape = next(n for n in proto.graph.node if n.op_type == "Reshape")
    concat = next(n for n in proto.graph.node if n.output[0] == reshape.input[1])
    assert concat.op_type == "Concat"
    piece = next(n for n in proto.graph.node if n.output[0] == concat.input[2])
    assert numpy_helper.to_array(piece.attribute[0].t).tolist() == [2]
    piece.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([1], dtype=np.int64)))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert (row["onnx_node"], row["onnx_value"], row["expected"]) == (concat.name, [1], [2]), row
    assert {concat.name, reshape.name} <= set(fd.layer.segment) and len(computing_nodes(fd.layer)) <= 6, \
        fd.layer.segment


class _Hardtanh(torch.nn.Module):
    """A Conv, a functional hardtanh (its bounds in no module) and an upsampling into the next Conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.conv, self.out = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.hardtanh(self.conv(x), -0.5, 0.5)
        return self.out(torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest"))


def test_the_bounds_of_a_functional_clamp_in_a_small_segment_are_the_ops_arguments():
    """A 3-node segment (Clip, Resize, Conv) is too small to narrow, and its Clip's bounds are no module's: with
    PyTorch's ops captured around it, the hardtanh's arguments reproduce PyTorch (an MLP-Mixer decoder's
    hardtanh in every file: unknown before)."""
    model, x = _Hardtanh().eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    proto = dc.export(model, (x,), "dynamo")
    clip = next(n for n in proto.graph.node if n.op_type == "Clip")
    bound = next(i for i in proto.graph.initializer if i.name == clip.input[2])
    bound.CopyFrom(numpy_helper.from_array(np.array(0.0, dtype=np.float32), bound.name))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert (row["onnx_node"], row["attribute"], row["expected"]) == (clip.name, "max", 0.5), row
    assert "hardtanh" in row["source"] and clip.name in fd.layer.segment, row


class _StandardizedBlock(torch.nn.Module):
    """Weight-standardised convolutions (BiT's): the dynamo exporter folds the standardised weight into a
    constant; each is followed by a GroupNorm, exported as Reshape → InstanceNormalization → Reshape back."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
        self.norm1, self.norm2 = torch.nn.GroupNorm(2, 8), torch.nn.GroupNorm(2, 8)
        for norm in (self.norm1, self.norm2):
            torch.nn.init.normal_(norm.weight)
            torch.nn.init.normal_(norm.bias)

    @staticmethod
    def _standardized(conv, x):
        w = conv.weight
        w = torch.nn.functional.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True, momentum=0.0,
                                           eps=1e-8).reshape_as(w)
        return torch.nn.functional.conv2d(x, w, conv.bias, padding=1)

    def forward(self, x):
        x = torch.relu(self.norm1(self._standardized(self.conv1, x)))
        return torch.relu(self.norm2(self._standardized(self.conv2, x)))


def _with_own_shape(model, inputs, proto, reshape, planted: list[int], expected: list[int]):
    """``(report, first divergence)`` of ``proto`` with ``reshape`` given a shape constant of its own holding
    ``planted``: found as an attribute mismatch at that Reshape, wanting ``expected``, confirmed."""
    proto.graph.initializer.append(numpy_helper.from_array(np.array(planted, np.int64), "planted_shape"))
    reshape.input[1] = "planted_shape"
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert row["onnx_node"] == reshape.name and row["expected"] == expected, row
    return report, fd


def test_a_groupnorms_reshape_back_is_checked_against_the_shape_of_the_values_around_it():
    """A wrong shape constant on the Reshape that restores a GroupNorm's input shape: no PyTorch op has a value
    of that Reshape's output (the group norm is one ATen op), so the shapes of PyTorch's values nearby are
    tried; the standardised weights the exporter folded are the model's own numbers, not a stale checkpoint."""
    model, x = _StandardizedBlock().eval(), torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(6))
    proto = rewrites.export(model, (x,), "dynamo")
    constants = {i.name: i for i in proto.graph.initializer}
    reshapes = [n for n in proto.graph.node if n.op_type == "Reshape" and n.input[1] in constants
                and numpy_helper.to_array(constants[n.input[1]]).tolist() == [1, 8, 6, 6]]
    assert len(reshapes) == 2, [n.name for n in proto.graph.node]
    reshape = reshapes[0]  # its shape constant is shared with the second GroupNorm's: given one of its own
    report, fd = _with_own_shape(model, (x,), proto, reshape, [6, 8, 6, 1], [1, 8, 6, 6])
    assert fd.layer.segment == (reshape.name,), fd.layer.segment
    assert not [w for w in report.warnings if "stale" in w], report.warnings


class _Modulation(torch.nn.Module):
    """Tokens viewed as an image before a Linear, then channels first for a depthwise Conv (FocalNet's
    modulation): the view's Reshape lies before the Linear, outside the segment that diverges."""

    def __init__(self, c: int = 16):
        super().__init__()
        torch.manual_seed(7)
        self.norm, self.proj, self.dw = torch.nn.LayerNorm(c), torch.nn.Linear(c, 24), torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.out = torch.nn.Linear(24, c)

    def forward(self, x):  # N, 64, C
        y = self.proj(self.norm(x).view(x.shape[0], 8, 8, -1)).permute(0, 3, 1, 2)
        y = torch.nn.functional.gelu(self.dw(y)).permute(0, 2, 3, 1)
        return self.out(y).reshape(x.shape[0], 64, -1)


def test_a_reshape_before_the_linear_that_feeds_the_segment_is_tried_at_pytorchs_shape():
    model, x = _Modulation().eval(), torch.randn(1, 64, 16, generator=torch.Generator().manual_seed(8))
    proto = rewrites.export(model, (x,), "torchscript")
    produced = {o: n for n in proto.graph.node for o in n.output}
    view = next(n for n in proto.graph.node if n.op_type == "Reshape" and produced.get(n.input[0]) is not None
                and produced[n.input[0]].op_type == "LayerNormalization")
    _, fd = _with_own_shape(model, (x,), proto, view, [8, 8, 1, 16], [1, 8, 8, 16])
    assert view.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment


class _DepthwiseBlock(torch.nn.Module):
    """A pointwise Conv, a depthwise Conv with a BatchNorm after it (folded at export), a ReLU, a pointwise Conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(231)
        self.pw, self.dw = torch.nn.Conv2d(3, 8, 1), torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn, self.out = torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.bn.running_mean.normal_(0.0, 0.3)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.dw(self.pw(x)))))


@pytest.mark.parametrize("provenance", ["dynamo", "renamed"])
@pytest.mark.parametrize("divided", [False, True])
def test_a_depthwise_conv_run_dense_with_its_kernel_tiled_is_its_group_confirmed(provenance, divided, tmp_path):
    """The depthwise Conv (its BatchNorm folded in) run dense: group 1, its kernel broadcast over every input
    channel (and divided by the channel count, a converter keeping the sum). The group the Conv2d has is the
    fix, with the kernel cut back to one repeated block (times the group count where it was divided) — confirmed
    by re-running; in a renamed file (no scopes, the Conv's value paired with nothing) the kernel alone says it."""
    model, x = _DepthwiseBlock().eval(), torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(232))
    proto = dc.export(model, (x,), "dynamo")
    conv = next(n for n in proto.graph.node if n.op_type == "Conv" and any(
        a.name == "group" and a.i == 8 for a in n.attribute))
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    kernel = numpy_helper.to_array(init)
    dense = np.repeat(kernel, 8, axis=1) / (8 if divided else 1)
    init.CopyFrom(numpy_helper.from_array(dense.astype(np.float32), init.name))
    next(a for a in conv.attribute if a.name == "group").i = 1
    index = list(proto.graph.node).index(conv)
    if provenance == "renamed":
        from fault_sweep import rename

        onnx.save(proto, tmp_path / "dense.onnx")
        rename(tmp_path / "dense.onnx", tmp_path / "renamed.onnx")
        proto = onnx.load(tmp_path / "renamed.onnx")
    name = proto.graph.node[index].name
    fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and fd.fixed_nodes == (name,), fd.explanation
    assert name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment  # a short one is kept whole
    assert f"{name}.group = 1" in fd.explanation and "implies 8" in fd.explanation, fd.explanation


class _PyramidPool(torch.nn.Module):
    """A Conv, an adaptive average pool to 2×2 (a pyramid pooling branch), a 1×1 Conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(245)
        self.conv, self.pool, self.proj = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.AdaptiveAvgPool2d(2), \
            torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.proj(self.pool(torch.relu(self.conv(x))))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_adaptive_pools_window_is_checked_against_its_output_size(exporter):
    """The adaptive pool exported as a fixed AveragePool (window = stride = 8 / 2 = 4), its window made 5 with
    padding on one side (the output shape kept): the module's output size implies the window, the strides and
    no padding — named and confirmed (before: no plain pool module, and no pool op to read them from)."""
    model, x = _PyramidPool().eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(246))
    proto = dc.export(model, (x,), exporter)
    pool = next((n for n in proto.graph.node if n.op_type == "AveragePool"), None)
    if pool is None:
        pytest.skip(f"the {exporter} exporter writes no AveragePool for the adaptive pool")
    del pool.attribute[:]
    pool.attribute.extend([helper.make_attribute("kernel_shape", [5, 5]), helper.make_attribute("strides", [4, 4]),
                           helper.make_attribute("pads", [0, 0, 1, 1])])
    fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and pool.name in fd.layer.segment, fd.explanation
    assert "AdaptiveAvgPool2d, output size [2, 2] of [8, 8]) implies [4, 4]" in fd.explanation, fd.explanation
