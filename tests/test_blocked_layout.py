"""A file saved after ONNX Runtime's ORT_ENABLE_ALL optimization on CPU holds its convolutions in the NCHWc layout
(com.microsoft.nchwc ops between ReorderInput and ReorderOutput): those tensors declare NCHW shapes but their memory
is channel-blocked.  Read against PyTorch they look wildly wrong; they must not be compared (no false alarm on a
clean file, and no blame placed on them), and each module computed there says why it has no tensor."""
from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_bisect
from onnx_bisect.records import Status


class _Convs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(91)
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, 1, 1)
        self.act1, self.act2 = torch.nn.ReLU6(), torch.nn.ReLU()
        self.pool, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(16, 5)
        with torch.no_grad():
            self.bn1.running_mean.uniform_(-0.5, 0.5), self.bn1.running_var.uniform_(0.5, 2)

    def forward(self, x):
        h = self.act2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.fc(self.pool(h).flatten(1))


def _all_optimized(tmp_path, model, inputs) -> onnx.ModelProto:
    torch.onnx.export(model, inputs, tmp_path / "plain.onnx", dynamo=False, opset_version=17)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "all.onnx")
    ort.InferenceSession(str(tmp_path / "plain.onnx"), so, providers=["CPUExecutionProvider"])
    proto = onnx.load(tmp_path / "all.onnx")
    if not any(n.domain == "com.microsoft.nchwc" for n in proto.graph.node):
        pytest.skip("ONNX Runtime made no NCHWc nodes on this CPU")
    return proto


def test_a_clean_file_in_nchwc_layout_raises_no_alarm_and_says_why_its_convolutions_are_not_compared(tmp_path):
    model = _Convs().eval()
    inputs = (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(92)),)
    result = onnx_bisect.bisect(model, inputs, onnx=_all_optimized(tmp_path, model, inputs))
    assert result.first_divergence is None and not result.warnings, result.warnings
    assert not [r for r in result.layers if r.status is Status.DIVERGED]
    notes = {r.pair.activation.module: r.pair.note for r in result.layers}
    assert "NCHWc" in notes["act2"], notes["act2"]  # the Conv fused with the ReLU after it is named after it
    assert [r for r in result.layers if r.pair.activation.module == "fc" and r.status is Status.MATCHED]


class _Residual(torch.nn.Module):
    """Convolutions with SiLU and GELU and a residual sum: ONNX Runtime runs the activations (com.microsoft
    QuickGelu / Gelu) and the Add on the blocked tensors as they are, outside the nchwc domain."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(93)
        self.conv1, self.conv2, self.conv3 = (torch.nn.Conv2d(3, 16, 3, 1, 1), torch.nn.Conv2d(16, 16, 3, 1, 1),
                                              torch.nn.Conv2d(16, 16, 1))
        self.act1, self.act2 = torch.nn.SiLU(), torch.nn.GELU()
        self.pool, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.act1(self.conv1(x))
        h = h + self.act2(self.conv2(h))
        return self.fc(self.pool(self.conv3(h)).flatten(1))


def test_elementwise_ops_on_blocked_tensors_are_not_compared_either(tmp_path):
    model = _Residual().eval()
    inputs = (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(94)),)
    proto = _all_optimized(tmp_path, model, inputs)
    result = onnx_bisect.bisect(model, inputs, onnx=proto)
    assert result.first_divergence is None and not result.warnings, result.warnings
    assert not [r for r in result.layers if r.status is Status.DIVERGED]
    # (a guard: these fused nodes carry no scope, so nothing paired them before blocked tensors were followed
    # through the ops computing on them either)
