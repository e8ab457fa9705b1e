"""An error below the tolerance that the layers after it amplify: traced to the segment that introduces it.

The model's first Linear has small weights, so its outputs have a small spread that the LayerNorm after it
divides by: an error well inside the tolerance at ``fc1`` is many times the tolerance after ``norm``. No
segment's own error exceeds the tolerance, so comparing tensors one by one blames nothing (or the first
layer whose accumulated error crosses it); the bisection over cut points finds ``fc1``.
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from conftest import run_cli, write_source

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import plant  # noqa: E402

SOURCE = """
    import torch

    class Amplifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = torch.nn.Linear(16, 32)
            self.norm = torch.nn.LayerNorm(32)
            self.act = torch.nn.GELU()
            self.fc2 = torch.nn.Linear(32, 32)
            self.head = torch.nn.Linear(32, 8)
            with torch.no_grad():
                self.fc1.weight.mul_(0.01)
                self.fc1.bias.mul_(0.01)
                self.fc2.weight.mul_(3.0)

        def forward(self, x):
            return self.head(self.act(self.fc2(self.act(self.norm(self.fc1(x))))))

    def get_model():
        return Amplifier().eval()

    def get_inputs():
        return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)
"""


def _export(folder: Path, dynamo: bool = False, text: str = SOURCE):
    """The model file and its TorchScript export (node names ``/fc1/Gemm`` ...), or its dynamo export."""
    source = write_source(folder / "amp.py", text)
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    model, inputs = namespace["get_model"](), namespace["get_inputs"]()
    buffer = io.BytesIO()
    if dynamo:
        return source, torch.onnx.export(model, inputs, dynamo=True, input_names=["x"]).model_proto
    torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=17, input_names=["x"])
    return source, onnx.load_from_string(buffer.getvalue())


def _plant_noise(proto: onnx.ModelProto) -> onnx.ModelProto:
    """fc1's weight off by 3e-3 of its spread: its own error is half the tolerance, the outputs' 27x."""
    gemm = plant.find_node(proto, "Gemm", "fc1")
    return plant.perturb_initializer(proto, plant.weight_of(proto, gemm.name), rel=3e-3)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("amplified")
    source, proto = _export(folder)
    return folder, source, proto


def _diverging(folder: Path, source: Path, proto: onnx.ModelProto, name: str):
    """The CLI on ``proto`` saved as ``name``.onnx: it must diverge; its result and first divergence (JSON)."""
    faulty = folder / f"{name}.onnx"
    onnx.save(proto, faulty)
    result = run_cli(source, "--onnx", faulty, "--json", folder / f"{name}.json")
    assert result.exit_status == 1, result.stderr
    return result, result.json["first_divergence"]


def test_weight_noise_below_tolerance_is_traced_to_its_layer(exported):
    folder, source, proto = exported
    result, fd = _diverging(folder, source, _plant_noise(proto), "noisy")
    assert fd["module"] == "fc1" and fd["onnx_nodes"] == ["/fc1/Gemm"]
    amp = fd["amplification"]
    assert amp["local_tolerance_ratio"] < 1 < amp["outputs_tolerance_ratio"]
    assert amp["outputs_tolerance_ratio_without"] < 1 and amp["gain"] > 2
    assert amp["runs"] <= 2 + int(np.ceil(np.log2(amp["cut_points"]))) + 1
    assert fd["cause"] == "weight-mismatch" and fd["confirmed"] is True
    assert "Amplified: this segment's own error is" in result.stdout


def _half_norm(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The LayerNormalization computed in float16: Casts down before it, a Cast up after it (what a
    converter's op list or a hand edit leaves)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes = []
    for node in out.graph.node:
        if node.op_type != "LayerNormalization":
            nodes.append(node)
            continue
        for i, name in enumerate(node.input):
            nodes.append(onnx.helper.make_node("Cast", [name], [f"{name}_half"], to=onnx.TensorProto.FLOAT16,
                                               name=f"{node.name}_in{i}"))
            node.input[i] = f"{name}_half"
        result = node.output[0]
        node.output[0] = f"{result}_half"
        nodes += [node, onnx.helper.make_node("Cast", [node.output[0]], [result], to=onnx.TensorProto.FLOAT,
                                              name=f"{node.name}_out")]
    out.graph.ClearField("node")
    out.graph.node.extend(nodes)
    out.graph.ClearField("value_info")
    return out


def test_one_float16_node_in_a_float32_file_is_blamed(exported):
    """A LayerNorm computed in float16 stays within float16's rounding, so judged at float16 resolution it
    passes; its error is what the layers after it amplify."""
    folder, source, proto = exported
    _, fd = _diverging(folder, source, _half_norm(proto), "half_norm")
    assert fd["module"] == "norm" and "LayerNormalization" in fd["op_types"]
    assert fd["amplification"]["outputs_tolerance_ratio_without"] < 1
    assert fd["cause"] == "precision" and fd["confirmed"] is True


def test_one_float16_node_paired_at_its_float16_output_is_blamed_not_its_reader(tmp_path):
    """In a dynamo export the LayerNorm's activation pairs with the node's own (now float16) output, and the
    Cast up belongs to the next segment: fed the rounded value, that Linear would seem to introduce the error.
    The Cast's float32 output is fed the exact value too, so the rounding stays with the float16 node."""
    # fc2 (weights tripled) reads the norm directly
    text = SOURCE.replace("self.fc2(self.act(self.norm(", "self.fc2((self.norm(")
    source, proto = _export(tmp_path, dynamo=True, text=text)
    _, fd = _diverging(tmp_path, source, _half_norm(proto), "half_norm")
    norm = [n.name for n in proto.graph.node if n.op_type == "LayerNormalization"]
    assert fd["module"] == "norm" and set(norm) <= set(fd["onnx_nodes"]), fd["onnx_nodes"]
    assert not {"Gemm", "MatMul"} & set(fd["op_types"]), fd["op_types"]
    assert fd["cause"] == "precision" and fd["confirmed"] is True


def test_clean_export_is_not_bisected(exported):
    folder, source, proto = exported
    clean = folder / "clean.onnx"
    onnx.save(proto, clean)
    result = run_cli(source, "--onnx", clean, "--json", folder / "clean.json")
    assert result.exit_status == 0, result.stdout + result.stderr
    assert result.json["first_divergence"] is None and "amplify" not in result.json["timings"]


class OwnOps(torch.nn.Module):
    """A module computing with its own parameters (no child module between them): a MatMul of small weights,
    a LayerNorm that divides by their outputs' small spread, more of its own ops, then a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(16, 32) * 0.01)
        self.w2 = torch.nn.Parameter(torch.randn(32, 32) * 0.2)
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.nn.functional.layer_norm(x @ self.w, (32,))
        h = torch.nn.functional.gelu(h) @ self.w2
        return self.head(torch.nn.functional.layer_norm(torch.tanh(h) + h, (32,)))


def test_an_op_whose_own_error_is_below_the_tolerance_inside_a_segment_above_it_is_judged_like_an_amplified_one():
    """Weight noise on the first MatMul: the segment of the module's own ops exceeds the tolerance (the
    LayerNorm after the MatMul amplifies), the MatMul alone does not. Narrowed to the MatMul, the cause is still
    named: it is judged against the tolerance divided by what the rest of the segment amplifies."""
    import onnx_bisect

    model, x = OwnOps().eval(), torch.randn(4, 16)
    proto = torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto
    matmul = next(n for n in proto.graph.node if n.op_type == "MatMul" and "w" in n.input)
    report = onnx_bisect.bisect(model, (x,), onnx=plant.perturb_initializer(proto, "w", rel=0.0005))
    fd = report.first_divergence
    assert not report.ok and fd.layer.segment == (matmul.name,) and len(fd.within.segment) > 3
    within = fd.within.local.tol_ratio
    assert within > 1, "the segment of the module's own ops exceeds the tolerance"
    assert fd.layer.local.tol_ratio == pytest.approx(within) and not fd.layer.local.ok  # restated against the gain
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert fd.evidence["parameters"][0]["parameter"] == "w"


def test_the_bisection_finds_the_segment_carrying_most_of_the_error_above_the_floor_no_cut_removes():
    """E(k) with the first k cuts fed: a segment at cut 2 carries 1.3 of the divergence, one at cut 13 another
    0.8, and 0.3 remains however many cuts are fed (a quantized model's last layers round however exact their
    inputs). The last crossing of the tolerance is at cut 13, which carries too little to be blamed; the
    error falls through the middle of its range at cut 2, which carries more than half of it."""
    from onnx_bisect.pipeline.amplify import bisect_amplification

    ordered = [f"t{i}" for i in range(22)]

    def error(cut: frozenset) -> float:
        k = len(cut)
        return 0.3 + (1.3 if k <= 2 else 0.0) + (0.8 if k <= 13 else 0.0)

    runs = []
    amp = bisect_amplification(lambda cut: runs.append(cut) or cut, ordered, error, lambda t: 0.9)
    assert amp is not None and amp.tensor == "t2", amp
    assert amp.output_ratio == pytest.approx(2.4) and amp.output_ratio_without == pytest.approx(1.1)
    assert len(runs) <= 2 + int(np.ceil(np.log2(len(ordered))))


def test_weight_noise_whose_error_is_within_rounding_of_the_largest_activation_is_still_named(tmp_path):
    """fc1 also computes one large channel (20, read only faintly later): the noise's own error on the small
    channels is then below 64 ULPs of that channel's magnitude — what float32 re-ordering could explain at that
    scale — though it is the error the LayerNorm amplifies.  The weights are the evidence (not equal to float32's
    resolution, and restoring PyTorch's makes the layer agree): weight-mismatch, not unknown (MobileBERT's
    bottleneck, amplified fault)."""
    text = SOURCE.replace("self.fc1.bias.mul_(0.01)", "self.fc1.bias.mul_(0.01)\n                self.fc1.bias[0] = 20.0")
    text = text.replace("return self.head(self.act(self.fc2(self.act(self.norm(self.fc1(x))))))",
                        "h = self.fc1(x)\n            y = self.head(self.act(self.fc2(self.act(self.norm(h[:, 1:])))))"
                        "\n            return y + 1e-3 * h[:, :1]")
    text = text.replace("torch.nn.LayerNorm(32)", "torch.nn.LayerNorm(31)").replace("torch.nn.Linear(32, 32)",
                                                                                  "torch.nn.Linear(31, 32)")
    source, proto = _export(tmp_path, text=text)
    _, fd = _diverging(tmp_path, source, _plant_noise(proto), "noisy")
    assert fd["module"] == "fc1" and fd["onnx_nodes"] == ["/fc1/Gemm"], fd["onnx_nodes"]
    assert fd["amplification"] is not None and fd["local_max_abs"] < 64 * np.finfo(np.float32).eps * 21
    assert fd["cause"] == "weight-mismatch" and fd["confirmed"] is True, fd["explanation"]


def test_one_float16_node_in_a_renamed_file_is_blamed_not_the_linear_reading_it(tmp_path):
    """Every node and tensor renamed: the LayerNorm's float16 output is judged at float16's resolution (or not
    paired at all), so the error shows first in the Linear reading it, whose segment only reads a float16 input.
    The precision fix names the nodes that computed that input in float16, and the segment becomes them (a
    CLIP vision tower in a renamed file: blamed on the Linear, the fix's node list empty)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from fault_sweep import rename

    text = SOURCE.replace("self.fc2(self.act(self.norm(", "self.fc2((self.norm(")
    source, proto = _export(tmp_path, dynamo=True, text=text)
    onnx.save(_half_norm(proto), tmp_path / "half.onnx")
    rename(tmp_path / "half.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    norm = [n.name for n in renamed.graph.node if n.op_type == "LayerNormalization"]
    _, fd = _diverging(tmp_path, source, renamed, "renamed_half_norm")
    assert set(norm) <= set(fd["onnx_nodes"]) and len(fd["onnx_nodes"]) <= 6, fd["onnx_nodes"]
    assert not {"Gemm", "MatMul"} & {n.op_type for n in renamed.graph.node if n.name in fd["onnx_nodes"]}
    assert fd["cause"] == "precision" and fd["confirmed"] is True
    assert set(norm) <= set(fd["evidence"].get("low_precision_nodes", []) + fd["evidence"].get(
        "low_precision_producers", [])), fd["evidence"]
