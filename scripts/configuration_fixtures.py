"""Regenerate fixtures/configurations/: models whose ONNX file diverges only in some configurations.

    python scripts/configuration_fixtures.py

Each fault shows in one kind of configuration and nowhere else:

* ``baked_batch``     — the TorchScript trace baked a Python ``int(x.shape[0])`` into a Reshape: right at
                        batch 1 (the export size), wrong at every other batch size.
* ``batch_reduction`` — an RMSNorm whose ReduceMean was edited to also reduce over the batch axis: the
                        same numbers at batch 1, mixed rows at batch > 1.
* ``detector_fp16``   — a float16 conversion (onnxconverter-common, keep_io_types) whose box head exceeds
                        float16's range (65504) on large inputs only.
* ``gelu_block``      — an erf-GELU that ONNX Runtime rewrites into the tanh approximation only when the
                        session sets ``optimization.enable_gelu_approximation=1``.

registry.json names, per fixture, the command-line arguments and the expected matrix: per configuration
(runtime label, input label) the status, and for a divergence the module blamed and the cause.
tests/test_configuration_fixtures.py walks it.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import textwrap
import warnings
from pathlib import Path

import onnx
import torch
from onnx import helper

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "configurations"

BAKED_BATCH = '''
    """Pools tokens after a reshape sized with a Python int: the TorchScript trace bakes the batch size in."""
    import torch


    class TokenPool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(8, 16)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            h = torch.relu(self.embed(x))
            b = int(h.shape[0])  # a Python int: traced as a constant
            return self.head(h.reshape(b, -1, 16).mean(dim=1))


    def get_model():
        torch.manual_seed(0)
        return TokenPool().eval()


    def get_inputs():
        return (torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(1)),)
'''

GELU_BLOCK = '''
    """An MLP block: projection, RMSNorm, erf-GELU, projection."""
    import torch


    class RMSNorm(torch.nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(8, 32)
            self.norm = RMSNorm(32)
            self.act = torch.nn.GELU()
            self.down = torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.down(self.act(self.norm(self.up(x))))


    def get_model():
        torch.manual_seed(0)
        return Block().eval()


    def get_inputs():
        return (torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1)),)
'''

DETECTOR = '''
    """A box-regression head: features, then 3 anchors x 4 coordinates per sample (large box scale)."""
    import torch


    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Linear(8, 32)
            self.act = torch.nn.ReLU()
            self.boxes = torch.nn.Linear(32, 12)
            with torch.no_grad():
                self.boxes.weight.mul_(32.0)

        def forward(self, x):
            return self.boxes(self.act(self.features(x))).reshape(-1, 3, 4)


    def get_model():
        torch.manual_seed(0)
        return Detector().eval()


    def get_inputs():
        return (torch.randn(2, 8, generator=torch.Generator().manual_seed(1)),)
'''

CPU = "CPU/all"
GELU = "CPU/all+optimization.enable_gelu_approximation=1"


def _write_model(name: str, source: str):
    path = OUT / f"{name}.py"
    path.write_text(textwrap.dedent(source).lstrip())
    spec = importlib.util.spec_from_file_location(f"fixture_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _export(module, path: Path) -> onnx.ModelProto:
    """TorchScript export at the sample's size, batch axis declared dynamic (as most deployments do)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module.get_model(), module.get_inputs(), buffer, dynamo=False, opset_version=17,
                          input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.save(proto, path)
    return proto


def _reduce_over_batch(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The RMSNorm's ReduceMean (axes=[-1]) also reduces over axis 0."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    node = next(n for n in out.graph.node if n.op_type == "ReduceMean" and "norm" in n.name)
    keep = [a for a in node.attribute if a.name != "axes"]
    del node.attribute[:]
    node.attribute.extend(keep + [helper.make_attribute("axes", [0, -1])])
    return out


def _float16(proto: onnx.ModelProto) -> onnx.ModelProto:
    from onnxconverter_common import float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float16.convert_float_to_float16(proto, keep_io_types=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    registry = []

    baked = _write_model("baked_batch", BAKED_BATCH)
    _export(baked, OUT / "baked_batch.onnx")
    registry.append({
        "name": "baked-batch", "model": "baked_batch.py", "onnx": "baked_batch.onnx",
        "args": ["--batch-sizes", "1,4,8"], "exit_status": 1,
        "expect": {
            f"{CPU} | batch=1": {"status": "ok"},
            f"{CPU} | batch=4": {"status": "diverged", "module": "", "cause": "baked-shape"},
            f"{CPU} | batch=8": {"status": "diverged", "module": "", "cause": "baked-shape"},
        },
    })

    block = _write_model("gelu_block", GELU_BLOCK)
    clean = _export(block, OUT / "gelu_block.onnx")
    onnx.save(_reduce_over_batch(clean), OUT / "batch_reduction.onnx")
    registry.append({
        "name": "batch-reduction", "model": "gelu_block.py", "onnx": "batch_reduction.onnx",
        "args": ["--batch-sizes", "1,3"], "exit_status": 1,
        "expect": {
            f"{CPU} | batch=1": {"status": "ok"},
            f"{CPU} | batch=3": {"status": "diverged", "module": "norm", "cause": "batch-mixing"},
        },
    })
    registry.append({
        "name": "gelu-approximation-setting", "model": "gelu_block.py", "onnx": "gelu_block.onnx",
        "args": ["--ort-variant", "optimization.enable_gelu_approximation=1", "--batch-sizes", "1,2",
                 "--atol", "1e-5", "--rtol", "1e-4"],
        "exit_status": 1,
        "expect": {
            f"{CPU} | batch=1": {"status": "ok"},
            f"{CPU} | batch=2": {"status": "ok"},
            f"{GELU} | batch=1": {"status": "diverged", "module": "act", "cause": "runtime-optimization"},
            f"{GELU} | batch=2": {"status": "diverged", "module": "act", "cause": "runtime-optimization"},
        },
    })

    detector = _write_model("detector", DETECTOR)
    onnx.save(_float16(_export(detector, OUT / "detector.onnx")), OUT / "detector.fp16.onnx")
    (OUT / "detector.onnx").unlink()
    edges = ["zeros", "tiny", "min", "max", "extremes"]
    registry.append({
        "name": "fp16-overflow-on-large-inputs", "model": "detector.py", "onnx": "detector.fp16.onnx",
        "args": ["--edge-cases", "--atol", "1e-2", "--rtol", "1e-2"], "exit_status": 1,
        "expect": {
            f"{CPU} | sample": {"status": "ok"},
            **{f"{CPU} | edge:{e}": {"status": "ok"} for e in edges},
            f"{CPU} | edge:large": {"status": "diverged", "module": "boxes", "cause": "precision"},
        },
    })
    (OUT / "registry.json").write_text(json.dumps(registry, indent=2) + "\n")
    print(f"wrote {len(registry)} fixtures to {OUT}")


if __name__ == "__main__":
    main()
