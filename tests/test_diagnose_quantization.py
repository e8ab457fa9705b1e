"""Quantization rule: clipping and SQNR of the real activation, per-channel advice for weights."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import onnx_bisect
from onnx_bisect.records import ErrorOrigin, Status

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from cpu import VNNI  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402
import plant  # noqa: E402



def test_activation_quantizer_that_clips():
    report, _ = bisect_case(dc.quantization("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "quantization" and fd.confirmed is True
    [act] = fd.evidence["activations"]
    assert act["clip_fraction"] > 0.01 and 0 < act["sqnr_db"] < 40
    assert "recalibrate" in fd.fix.lower() and "nodes_to_exclude" in fd.fix


def test_per_tensor_weight_quantization():
    report, _ = bisect_case(dc.quantization("cnn", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "quantization" and fd.confirmed is True
    [w] = fd.evidence["weights"]
    assert w["parameter"] == "conv3.weight" and not w["per_channel"]
    assert w["sqnr_db_per_channel"] > w["sqnr_db"]


@VNNI
def test_a_clean_quantized_model_whose_outputs_agree_is_not_said_to_hide_a_fault():
    """A QDQ int8 model at a tolerance its outputs meet: layers whose own error is their quantization (re-run
    without their Q/DQ and with PyTorch's float weights they agree) are marked ``quantized``, not diverged, and
    no hidden-fault warning is given."""
    case = dc.quantization_static("transformer", "torchscript")
    strict = onnx_bisect.bisect(case.model, case.inputs, onnx=case.proto)
    worst = max(o.diff.max_abs for o in strict.outputs)
    loose = onnx_bisect.bisect(case.model, case.inputs, onnx=case.proto, atol=1.5 * worst, rtol=0.0)
    assert loose.ok
    beyond = [r for r in loose.layers if r.diff is not None and not r.diff.ok]
    assert beyond, "the tolerance leaves some layer beyond it: the case tests nothing otherwise"
    assert all(r.status is Status.QUANTIZED and r.origin is ErrorOrigin.NONE for r in beyond), \
        [(r.pair.activation.name, r.status) for r in beyond]
    assert not [w for w in loose.warnings if "inside the model introduce error" in w]
    from onnx_bisect.report.node_data import node_data  # the status is coloured on Model Explorer's graph too
    doc = node_data(loose)[2]
    results = doc["results"] if "results" in doc else next(iter(doc.values()))["results"]
    assert "quantized" in {r["value"] for r in results.values()}


def test_layers_that_differ_by_their_quantization_alone_are_passed_over_for_the_fault_after_them():
    """A quantized MLP with a Resize set to align_corners: at this tolerance fc1, bn1 and norm already exceed it
    by their quantization step (their float twins agree with PyTorch), which is the quantized model; the first
    layer whose own error quantization does not explain is the Resize, and a warning names those passed over."""
    plant = dc.plant
    model, inputs, proto = dc.clean("mlp", "torchscript")
    with dc.quiet():
        quantized = plant.quantize_static_qdq(proto, {proto.graph.input[0].name: inputs[0].numpy()})
    resize = plant.find_node(quantized, "Resize", "up")
    bad = plant.set_attribute(quantized, resize.name, "coordinate_transformation_mode", "align_corners")
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=bad, atol=0.008, rtol=0.008)
    fd = report.first_divergence
    assert not report.ok and resize.name in fd.layer.segment and fd.cause == "resize-mode", fd.explanation
    [warning] = [w for w in report.warnings if "by their quantization alone" in w]
    assert "fc1" in warning and "norm" in warning
    earlier = [r for r in report.layers if r.pair.activation.module in ("fc1", "norm") and r.local is not None]
    assert earlier and all(not r.local.ok for r in earlier), "they do exceed the tolerance"


def test_a_quantized_weight_overwritten_with_other_values_is_named_after_its_parameter():
    """An int8 weight replaced by unrelated values (correlation near 0): no value says whose weight it was, but
    the quantizer named it after the parameter (conv2.weight_quantized), so it is compared with conv2.weight
    and called a weight mismatch, not quantization."""
    import numpy as np
    import onnx
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Tanh(), torch.nn.Conv2d(8, 8, 3),
                                torch.nn.Tanh(), torch.nn.Flatten(),
                                torch.nn.Linear(512, 4)).eval()
    x = torch.randn(1, 3, 12, 12)
    proto = dc.export(model, (x,), "torchscript")
    quantized = dc.plant.quantize_static_qdq(proto, {proto.graph.input[0].name: x.numpy()})
    init = next(i for i in quantized.graph.initializer if i.name == "2.weight_quantized")
    q = onnx.numpy_helper.to_array(init)
    other = np.random.default_rng(1).integers(-100, 100, q.shape).astype(q.dtype)
    init.CopyFrom(onnx.numpy_helper.from_array(other, init.name))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=quantized, atol=0.05, rtol=0.05)
    fd = report.first_divergence
    assert not report.ok and fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    [row] = fd.evidence["parameters"]
    assert row["initializer"] == "2.weight_quantized" and row["parameter"] == "2.weight"
    assert abs(row["correlation"]) < 0.3 and "bear the parameters' names" in fd.explanation


def test_a_quantized_constant_takes_an_ops_value_only_when_it_is_that_value():
    """A causal mask of 0 and -1e9 quantized to uint8 lies wholly at the two ends of its range, where rounding
    tells nothing (clipped elements are set aside): any value of its size passes the rounding test. The float
    twin gives the constant a PyTorch op's value only when that value is the constant's (correlated, close), so
    a distance term of the same size is refused and the mask itself taken."""
    from types import SimpleNamespace

    import numpy as np
    from onnx import helper

    from onnx_bisect.diagnose.rules.quantization import _op_value, beyond_rounding, dequantized_weight

    mask = np.triu(np.full((8, 8), -1e9, np.float32), 1)[None, None]
    scale = np.float32(1e9 / 255)
    q = np.clip(np.round(mask / scale) + 255, 0, 255).astype(np.uint8)
    arrays = {"mask_quantized": q, "mask_scale": np.array(scale), "mask_zero_point": np.array(255, np.uint8)}
    dq = helper.make_node("DequantizeLinear", list(arrays), ["mask_dq"], name="mask_DequantizeLinear")
    pos = np.arange(8, dtype=np.float32)
    distance = (np.abs(pos[None, :] - pos[:, None]) / 8)[None, None]

    def op(name, value):
        return SimpleNamespace(op=name, module_type=name, value=value)

    def ctx(*ops):
        return SimpleNamespace(ops=ops, initializer=arrays.get, constant=arrays.get)

    w = dequantized_weight(ctx(), dq)
    assert w is not None and beyond_rounding(ctx(), dq, w, distance.astype(np.float64)) == 0.0
    assert _op_value(ctx(op("aten.div#1", distance)), dq, w) is None
    taken = _op_value(ctx(op("aten.div#1", distance), op("aten.add#2", mask)), dq, w)
    assert taken is not None and np.array_equal(taken, mask.astype(np.float64))


class _Deep(torch.nn.Module):
    """Sixteen residual Linear+ReLU layers and a small head: a quantized copy rounds every layer beyond a
    tolerance its outputs still meet."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(16))
        self.head = torch.nn.Linear(32, 2)
        with torch.no_grad():
            self.head.weight.mul_(0.01)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
        return self.head(x)


def test_a_clean_quantized_model_with_many_rounded_layers_warns_of_nothing():
    """Every one of its sixteen layers exceeds the tolerance by its quantization alone: all are re-run without
    their Q/DQ pairs (not the first eight, leaving the rest to be reported as a hidden divergence)."""
    model, x = _Deep().eval(), torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    proto = dc.export(model, (x,), "torchscript")
    quantized = plant.quantize_static_qdq(proto, {proto.graph.input[0].name: x.numpy()})
    with dc.quiet():
        strict = onnx_bisect.bisect(model, (x,), onnx=quantized, atol=1e-9, rtol=0)
        tol = 1.5 * max(o.diff.max_abs for o in strict.outputs)
        report = onnx_bisect.bisect(model, (x,), onnx=quantized, atol=tol, rtol=0)
    assert report.ok and not report.warnings, report.warnings
    assert sum(r.status is Status.QUANTIZED for r in report.layers) >= 12
    assert not [r for r in report.layers if r.status is Status.DIVERGED]


def test_noise_in_a_quantized_weight_is_a_weight_fault_where_activation_rounding_also_exceeds_the_tolerance():
    """Noise written into the int8 weight of a QDQ model's first Linear, at a tolerance its activations' own
    rounding exceeds: restoring PyTorch's weight alone leaves that rounding, undoing the quantization alone leaves
    the noise — re-run in the segment's float computation with PyTorch's weight, it agrees: a weight fault,
    confirmed, pinned to the nodes reading the weight (a set encoder's QDQ file: quantization, unconfirmed)."""
    import numpy as np
    import onnx
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 5)).eval()
    x = torch.randn(2, 10, 6, generator=torch.Generator().manual_seed(1))
    proto = dc.export(model, (x,), "torchscript")
    with dc.quiet():
        quantized = dc.plant.quantize_static_qdq(proto, {proto.graph.input[0].name: x.numpy()})
    init = next(i for i in quantized.graph.initializer if i.name.endswith("_quantized") and len(i.dims) == 2)
    q = onnx.numpy_helper.to_array(init)
    noise = np.random.default_rng(2).normal(0, 0.3 * q.astype(float).std(), q.shape)
    init.CopyFrom(onnx.numpy_helper.from_array(np.clip(np.round(q + noise), -127, 127).astype(q.dtype), init.name))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=quantized, atol=0.01, rtol=0.01)
    fd = report.first_divergence
    assert not report.ok and fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert fd.evidence["parameters"][0]["initializer"] == init.name and "float computation" in fd.explanation
    assert fd.layer.segment[-1] == "/0/MatMul" and len(fd.layer.segment) <= 2, fd.layer.segment


def _dynamic(arch: str):
    model, inputs, proto = dc.clean(arch, "torchscript")
    with dc.quiet():
        return model, inputs, plant.quantize_dynamic(proto)


def test_a_clean_dynamically_quantized_model_is_not_said_to_hide_a_fault():
    """quantize_dynamic's files quantize each activation at run time (DynamicQuantizeLinear, then ConvInteger or
    MatMulInteger, a Cast and a Mul by the two scales): at a tolerance the outputs meet but some layer's own
    rounding exceeds, those layers are re-run with the integer products computed in float and marked
    ``quantized`` — no hidden-fault warning."""
    for arch in ("cnn", "transformer"):
        model, inputs, quantized = _dynamic(arch)
        assert any(n.op_type in ("ConvInteger", "MatMulInteger") for n in quantized.graph.node)
        with dc.quiet():
            strict = onnx_bisect.bisect(model, inputs, onnx=quantized, atol=1e-9, rtol=0)
            loose = onnx_bisect.bisect(model, inputs, onnx=quantized,
                                       atol=1.2 * max(o.diff.max_abs for o in strict.outputs), rtol=0.0)
        assert loose.ok, arch
        beyond = [r for r in loose.layers if r.diff is not None and not r.diff.ok]
        assert beyond, f"{arch}: the tolerance leaves no layer beyond it: the case tests nothing"
        assert all(r.status is Status.QUANTIZED for r in beyond), \
            [(arch, r.pair.activation.name, r.status) for r in beyond]
        assert not loose.warnings, loose.warnings


def test_noise_in_a_dynamically_quantized_weight_is_still_the_weights_fault():
    """The same file made from a checkpoint whose conv2 weight carries noise: re-run in float the segment still
    differs (the integer weight is beyond rounding of PyTorch's), so it is no quantization noise: the first
    divergence is conv2's, a weight mismatch."""
    import numpy as np
    import onnx

    model, inputs, proto = dc.clean("cnn", "torchscript")
    proto = plant._copy(proto)  # the clean export is cached: plant into a copy
    conv = next(n for n in plant.find_nodes(proto, "Conv", "conv2"))
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    w = onnx.numpy_helper.to_array(init)
    noisy = w + np.random.default_rng(3).normal(0, 0.3 * w.std(), w.shape).astype(w.dtype)
    init.CopyFrom(onnx.numpy_helper.from_array(noisy, init.name))
    with dc.quiet():
        quantized = plant.quantize_dynamic(proto)
        report = onnx_bisect.bisect(model, inputs, onnx=quantized, atol=0.05, rtol=0.05)
    fd = report.first_divergence
    assert not report.ok and fd.layer.pair.activation.module == "conv2", fd.layer.pair.activation
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert "integer products computed in float" in fd.explanation, fd.explanation


@VNNI
def test_a_fault_in_a_quantized_segment_that_its_quantization_does_not_explain_is_diagnosed_in_float(tmp_path):
    """A QDQ int8 involution network (an im2col: Pad, index Gathers, each output quantized) whose second unfold's
    Pad was given other pads (the same total): undoing the segment's quantization leaves the divergence, so
    quantization is not the cause; diagnosed as the segment's float twin, the Pad's pads are found and the fix
    confirmed there.  In the quantized segment the Pad's output Q/DQ pair lies outside the narrowed segment, so no
    fix of the Pad reached the divergent tensor: it was called quantization, unconfirmed."""
    import alignment_corpus
    import sweep_models
    model, inputs = sweep_models.build("involution")
    src, dst = tmp_path / "clean.onnx", tmp_path / "int8.onnx"
    onnx.save(dc.export(model, inputs, "torchscript"), src)
    with dc.quiet():
        alignment_corpus.int8(sweep_models.calibration("involution", 4))(src, dst)
    bad = onnx.load(dst)
    pad = [n for n in bad.graph.node if n.op_type == "Pad"][1]
    source = next(n for n in bad.graph.node if n.output[0] == pad.input[1])
    pads = onnx.numpy_helper.to_array(source.attribute[0].t).copy()
    pads[3], pads[7] = pads[3] - 1, pads[7] + 1  # the same width, shifted by a column
    source.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(pads))
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=bad, atol=0.03, rtol=0.03)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert list(fd.layer.segment) == [pad.name] and fd.evidence.get("diagnosed_in_float")
    assert f"{pad.name}.pads = {pads.tolist()}" in fd.explanation


class _ResidualNorm(torch.nn.Module):
    """A residual block whose sum is RMS-normalised (unit weight) before a projection: the norm is blind to a
    per-row scale, so any row-scaled value of the sum fed in its place clears the norm's output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(251)
        self.mix, self.head = torch.nn.Linear(16, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        h = x + self.mix(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.head(h)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_unsigned_activation_quantizer_before_a_scale_blind_norm_is_named_with_its_pair(exporter):
    """A residual sum quantised as uint8 with zero point 0 (every negative entry clipped to 0) before an RMS
    norm: the DequantizeLinear's value is PyTorch's sum after its pair, the same op its QuantizeLinear reads —
    not the norm's output, which fed there clears the norm too.  Both nodes are named, the quantization undone
    confirms it."""
    model, x = _ResidualNorm().eval(), torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(252))
    proto = dc.export(model, (x,), exporter)
    add = next(n for n in proto.graph.node if n.op_type == "Add" and not any(
        i.name in n.input for i in proto.graph.initializer))
    with torch.no_grad():
        top = float(model.mix(x).add(x).max())
    out = add.output[0]
    add.output[0] = out + "_raw"
    proto.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(top / 255, np.float32), "act_scale"),
                                    onnx.numpy_helper.from_array(np.array(0, np.uint8), "act_zero_point")])
    at = list(proto.graph.node).index(add) + 1
    proto.graph.node.insert(at, onnx.helper.make_node("QuantizeLinear", [out + "_raw", "act_scale", "act_zero_point"],
                                                      [out + "_uint8"], name="sum_quant"))
    proto.graph.node.insert(at + 1, onnx.helper.make_node("DequantizeLinear", [out + "_uint8", "act_scale",
                                                                               "act_zero_point"], [out],
                                                          name="sum_dequant"))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "quantization" and fd.confirmed is True, fd.explanation
    assert {"sum_quant", "sum_dequant"} <= set(fd.layer.segment) and len(fd.layer.segment) <= 3, fd.layer.segment
