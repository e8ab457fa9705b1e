"""Regenerate fixtures/coverage/: small models with known coverage problems, and registry.json.

    python scripts/coverage_fixtures.py

Each entry of the registry names the file, the command-line arguments, the
exit status, and the status the triage must give each planted node (ONNX
files) or the exporter problem it must report (Python models: exporter, kind,
operator substring and the source line, found by a ``# <-`` marker comment).
tests/test_coverage_fixtures.py walks the registry.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "coverage"
IR_VERSION = 10  # what onnxruntime 1.18+ loads; onnx's helper would stamp its newest


# -- Python models: export-side problems -------------------------------------------------

AUTOGRAD = '''
    """A custom autograd Function whose forward leaves PyTorch (numpy): TorchScript cannot export it."""
    import numpy as np
    import torch


    class NumpyClip(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.from_numpy(np.clip(x.detach().numpy(), -1.0, 1.0))  # <-

        @staticmethod
        def backward(ctx, grad):
            return grad


    class ClippedLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return NumpyClip.apply(self.fc(x))


    def get_model():
        torch.manual_seed(0)
        return ClippedLinear().eval()


    def get_inputs():
        return (torch.randn(2, 4, generator=torch.Generator().manual_seed(1)),)
'''

NO_LOWERING = '''
    """An op with no ONNX lowering in either exporter (eigenvalues)."""
    import torch


    class Spectrum(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            eig = torch.linalg.eigvals(h @ h.T).real  # <-
            return h + eig.sum()


    def get_model():
        torch.manual_seed(0)
        return Spectrum().eval()


    def get_inputs():
        return (torch.randn(4, 4, generator=torch.Generator().manual_seed(1)),)
'''

DATA_DEPENDENT = '''
    """Data-dependent control flow: torch.export refuses it, the TorchScript trace bakes in one branch."""
    import torch


    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            if h.sum() > 0:  # <-
                return torch.relu(h)
            return torch.sigmoid(h)


    def get_model():
        torch.manual_seed(0)
        return Gate().eval()


    def get_inputs():
        return (torch.randn(2, 4, generator=torch.Generator().manual_seed(1)),)
'''


def _write_source(name: str, source: str) -> int:
    """Write the model file; return the line number of its ``# <-`` marker."""
    text = textwrap.dedent(source).lstrip()
    (OUT / name).write_text(text)
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# <-"))


# -- ONNX models: runtime-side problems ----------------------------------------------------


def _vi(name: str, elem: int, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, opset: int, initializers=(), extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "coverage_fixture", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def low_precision() -> onnx.ModelProto:
    """float16/bfloat16/int8/int16 nodes, some without a CPU kernel for that type."""
    n = helper.make_node
    nodes = [
        n("MatMul", ["a", "b"], ["ab"], name="matmul_fp16"),  # no float16 kernel: float32 via Casts
        n("Relu", ["ab"], ["ab_relu"], name="relu_fp16"),  # no float16 kernel either (no function body at 17)
        n("Transpose", ["ab_relu"], ["ab_t"], name="transpose_fp16", perm=[1, 0]),  # float16 kernel exists
        n("Transpose", ["ab_t"], ["ab_tt"], name="transpose_back", perm=[1, 0]),
        n("LayerNormalization", ["ab_tt", "scale"], ["y"], name="layernorm_fp16", axis=-1, epsilon=1e-5),
        n("Mul", ["c", "c"], ["c2"], name="mul_bf16"),  # no bfloat16 kernel, and no Cast rescue
        n("Trilu", ["d"], ["d_tri"], name="trilu_int8"),  # no int8 kernel
        n("Relu", ["e"], ["e_relu"], name="relu_int16"),  # no int16 kernel
    ]
    return _model(
        nodes,
        [_vi("a", T.FLOAT16, [2, 4]), _vi("b", T.FLOAT16, [4, 4]), _vi("c", T.BFLOAT16, [4]),
         _vi("d", T.INT8, [4, 4]), _vi("e", T.INT16, [4])],
        [_vi("y", T.FLOAT16, [2, 4]), _vi("c2", T.BFLOAT16, [4]), _vi("d_tri", T.INT8, [4, 4]),
         _vi("e_relu", T.INT16, [4])],
        opset=17, initializers=[numpy_helper.from_array(np.ones(4, np.float16), "scale")],
    )


def custom_domain() -> onnx.ModelProto:
    """A node in a custom domain that no onnx schema and no ONNX Runtime kernel knows."""
    n = helper.make_node
    nodes = [
        n("Relu", ["x"], ["h"], name="relu"),
        n("FancyActivation", ["h"], ["f"], name="fancy", domain="com.example.ops", alpha=0.5),
        n("Add", ["f", "x"], ["y"], name="residual"),
    ]
    return _model(nodes, [_vi("x", T.FLOAT, [2, 4])], [_vi("y", T.FLOAT, [2, 4])], opset=17,
                  extra_opsets=[helper.make_opsetid("com.example.ops", 1)])


def new_ops() -> onnx.ModelProto:
    """Opset 20 ops that opset 13 lacks (LayerNormalization, Gelu) or defines differently (ReduceMean)."""
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "scale", "bias"], ["ln"], name="layernorm", axis=-1),
        n("Gelu", ["ln"], ["g"], name="gelu"),
        n("ReduceMean", ["g", "axes"], ["m"], name="reducemean", keepdims=1),  # axes became an input in 18
        n("Sigmoid", ["m"], ["y"], name="sigmoid"),  # unchanged since 13
    ]
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "scale"),
             numpy_helper.from_array(np.zeros(4, np.float32), "bias"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    return _model(nodes, [_vi("x", T.FLOAT, [2, 4])], [_vi("y", T.FLOAT, [2, 1])], opset=20, initializers=inits)


def risky_ops() -> onnx.ModelProto:
    """Ops that run everywhere but whose numbers commonly differ between frameworks."""
    n = helper.make_node
    nodes = [
        n("Resize", ["img", "", "scales"], ["up"], name="resize_linear", mode="linear",
          coordinate_transformation_mode="half_pixel"),
        n("Conv", ["up", "w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["conv", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], name="batchnorm", epsilon=1e-5),
        n("Gelu", ["bn"], ["act"], name="gelu_tanh", approximate="tanh"),
        n("Cast", ["act"], ["act16"], name="cast_fp16", to=T.FLOAT16),
        n("Div", ["i", "j"], ["q"], name="div_int"),
        n("Mod", ["i", "j"], ["r"], name="mod_int", fmod=0),
        n("NonMaxSuppression", ["boxes", "scores", "max_out"], ["keep"], name="nms", center_point_box=0),
        n("RoiAlign", ["conv", "rois", "batch_idx"], ["pooled"], name="roialign", output_height=2,
          output_width=2, sampling_ratio=2, coordinate_transformation_mode="output_half_pixel"),
        n("Sigmoid", ["conv"], ["plain"], name="sigmoid"),
    ]
    c = 2
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.ones(c, np.float32), "bn_s"), numpy_helper.from_array(np.zeros(c, np.float32), "bn_b"),
        numpy_helper.from_array(np.zeros(c, np.float32), "bn_m"), numpy_helper.from_array(np.ones(c, np.float32), "bn_v"),
        numpy_helper.from_array(np.array([10], np.int64), "max_out"),
        numpy_helper.from_array(np.array([[0, 0, 3, 3]], np.float32), "rois"),
        numpy_helper.from_array(np.array([0], np.int64), "batch_idx"),
    ]
    return _model(
        nodes,
        [_vi("img", T.FLOAT, [1, c, 4, 4]), _vi("i", T.INT64, [3]), _vi("j", T.INT64, [3]),
         _vi("boxes", T.FLOAT, [1, 5, 4]), _vi("scores", T.FLOAT, [1, 1, 5])],
        [_vi("act16", T.FLOAT16, [1, c, 8, 8]), _vi("q", T.INT64, [3]), _vi("r", T.INT64, [3]),
         _vi("keep", T.INT64, [None, 3]), _vi("pooled", T.FLOAT, [1, c, 2, 2]), _vi("plain", T.FLOAT, [1, c, 8, 8])],
        opset=20, initializers=inits,
    )


# -- registry ---------------------------------------------------------------------------------


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    registry = []
    line = _write_source("autograd_numpy.py", AUTOGRAD)
    registry.append({
        "name": "autograd-function", "file": "autograd_numpy.py", "args": [], "exit_status": 0,
        "problems": [{"exporter": "torchscript", "kind": "custom autograd Function / Python op", "line": line,
                      "fatal": True}],
        "exported_by": ["dynamo"],
    })
    line = _write_source("no_lowering.py", NO_LOWERING)
    registry.append({
        "name": "no-lowering", "file": "no_lowering.py", "args": [], "exit_status": 1,
        "problems": [{"exporter": "dynamo", "kind": "no ONNX lowering", "operator": "linalg_eig", "line": line,
                      "fatal": True},
                     {"exporter": "torchscript", "kind": "no ONNX lowering", "operator": "linalg_eigvals",
                      "line": line, "fatal": True}],
        "exported_by": [],
    })
    line = _write_source("data_dependent.py", DATA_DEPENDENT)
    registry.append({
        "name": "data-dependent-control-flow", "file": "data_dependent.py", "args": [], "exit_status": 0,
        "problems": [{"exporter": "dynamo", "kind": "data-dependent control flow", "line": line, "fatal": True},
                     {"exporter": "torchscript", "kind": "trace baked in a Python value", "line": line,
                      "fatal": False}],
        "exported_by": ["torchscript"],
    })
    onnx_cases = [
        ("low-precision", "low_precision.onnx", low_precision(), [], 1, {
            "matmul_fp16": "falls back", "relu_fp16": "falls back", "transpose_fp16": "ok", "layernorm_fp16": "risky",
            "mul_bf16": "unsupported", "trilu_int8": "unsupported", "relu_int16": "unsupported"}),
        ("custom-domain", "custom_domain.onnx", custom_domain(), [], 1, {
            "fancy": "unsupported", "relu": "ok", "residual": "ok"}),
        ("newer-than-opset", "new_ops.onnx", new_ops(), ["--opset", "13"], 0, {
            "layernorm": "needs newer opset", "gelu": "needs newer opset", "reducemean": "needs newer opset",
            "sigmoid": "ok"}),
        ("risky-ops", "risky_ops.onnx", risky_ops(), [], 0, {
            "resize_linear": "risky", "batchnorm": "risky", "gelu_tanh": "risky", "cast_fp16": "risky",
            "div_int": "risky", "mod_int": "risky", "nms": "risky", "roialign": "risky", "conv": "ok",
            "sigmoid": "ok"}),
    ]
    for name, file, model, args, exit_status, expect in onnx_cases:
        onnx.save(model, OUT / file)
        registry.append({"name": name, "file": file, "args": args, "exit_status": exit_status, "nodes": expect})
    (OUT / "registry.json").write_text(json.dumps(registry, indent=2) + "\n")
    print(f"wrote {len(registry)} fixtures to {OUT}")


if __name__ == "__main__":
    main()
