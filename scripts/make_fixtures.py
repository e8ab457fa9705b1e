"""Regenerate fixtures/: inputs, clean and fault-planted ONNX exports, and registry.json.

    python scripts/make_fixtures.py

Model weights (fixtures/models/<name>.pt) are created with a fixed seed on the
first run and reused afterwards, so the fixtures do not depend on RNG details.
Every file is checked with ONNX Runtime against PyTorch: clean exports must
agree within the tolerance, planted ones must not (and neither must the output
of the planted node itself, compared with the clean export).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plant  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = ("mlp", "cnn", "bert")
EXPORTERS = ("dynamo", "torchscript")
ATOL, RTOL = 1e-4, 1e-3
SEED = 0
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


@dataclass(frozen=True)
class Fault:
    """One planted fault: where it goes and how it is planted into the clean export."""

    stem: str
    model: str
    exporter: str
    kind: str
    module: str
    op_type: str
    plant: Callable[[onnx.ModelProto, onnx.NodeProto, torch.nn.Module], onnx.ModelProto]
    also_ok_modules: tuple[str, ...] = ()
    dynamic_batch: bool = False  # planted into an export whose batch axis is dynamic (the README's example)


FAULTS = (
    Fault("mlp.gelu_tanh", "mlp", "dynamo", "gelu-approximation", "act1", "Gelu",
          lambda proto, node, model: plant.set_gelu_tanh(proto, node.name)),
    Fault("cnn.weight", "cnn", "torchscript", "weight-mismatch", "bn2", "Conv",
          lambda proto, node, model: plant.perturb_initializer(proto, plant.weight_of(proto, node.name)),
          also_ok_modules=("conv2",)),
    Fault("bert.ln_eps", "bert", "dynamo", "epsilon-mismatch",
          "bert.encoder.layer.1.attention.output.LayerNorm", "LayerNormalization",
          lambda proto, node, model: plant.set_attribute(proto, node.name, "epsilon", 1e-1)),
    Fault("bert.weight", "bert", "torchscript", "weight-mismatch",
          "bert.encoder.layer.0.intermediate.dense", "MatMul",
          lambda proto, node, model: plant.perturb_initializer(proto, plant.weight_of(proto, node.name))),
    Fault("cnn.bn_eps", "cnn", "dynamo", "batchnorm-fold", "bn1", "Conv",
          lambda proto, node, model: plant.refold_batchnorm(proto, node.name, model.conv1, model.bn1, eps=1e-1),
          also_ok_modules=("conv1",), dynamic_batch=True),
)


def load_fixture(name: str):
    """Import fixtures/models/<name>.py."""
    spec = importlib.util.spec_from_file_location(f"fixture_{name}", FIXTURES / "models" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ensure_weights(name: str, fixture) -> None:
    """Create fixtures/models/<name>.pt from a fixed seed unless it exists."""
    path = FIXTURES / "models" / f"{name}.pt"
    if path.exists():
        return
    torch.manual_seed(SEED)
    model = fixture.build()
    randomize(model)
    if name == "mlp":
        # Most act1 inputs then sit on GELU's negative tail, where the tanh approximation's error
        # is large next to the activation; centred at 0, the gelu_tanh fault stays within rtol.
        with torch.no_grad():
            model.fc1.bias -= 3.0
    torch.save(model.state_dict(), path)


@torch.no_grad()
def randomize(model: torch.nn.Module) -> None:
    """Give every layer distinct, non-trivial weights.

    Exporters merge equal initializers (BERT's zero biases and unit norms end
    up as one tensor), and small faults must show.  Linear weights get std
    1/sqrt(fan_in) (BERT's default 0.02 leaves a tiny model nearly linear),
    zero biases become small noise, norms get random affine parameters and
    BatchNorms random running statistics.
    """
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight.normal_(0.0, m.in_features ** -0.5)
            if m.bias is not None and not m.bias.any():
                m.bias.normal_(0.0, 0.02)
        elif isinstance(m, (torch.nn.LayerNorm, torch.nn.BatchNorm2d)):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.1)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.5)
                m.running_var.uniform_(0.25, 2.0)


@contextlib.contextmanager
def quiet():
    """Silence the exporters' progress prints, warnings and log records."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def export(model: torch.nn.Module, args: tuple, exporter: str, dynamic_batch: bool = False) -> onnx.ModelProto:
    """Clean export (``dynamic_batch``: the first input's axis 0 dynamic, dynamo only); dynamo stack traces
    (absolute paths of this checkout) are dropped."""
    with quiet():
        if exporter == "torchscript":
            buffer = io.BytesIO()
            torch.onnx.export(model, args, buffer, dynamo=False, opset_version=17)
            return onnx.load_from_string(buffer.getvalue())
        shapes = ({0: torch.export.Dim("batch")},) if dynamic_batch else None
        proto = torch.onnx.export(model, args, dynamo=True, verbose=False, dynamic_shapes=shapes).model_proto
    for node in proto.graph.node:
        keep = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
        node.ClearField("metadata_props")
        node.metadata_props.extend(keep)
    return proto


def run(proto: onnx.ModelProto, inputs: list[np.ndarray], extra_output: str | None = None) -> list[np.ndarray]:
    """Run ``proto`` on the CPU provider; ``extra_output`` is appended to the outputs."""
    if extra_output:
        proto, original = onnx.ModelProto(), proto
        proto.CopyFrom(original)
        proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(extra_output))
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), inputs)})


def excess(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Max abs error, and the largest ratio of error to the allowed ATOL + RTOL*|expected| (>1 fails)."""
    err = np.abs(actual.astype(np.float64) - expected)
    return float(err.max()), float((err / (ATOL + RTOL * np.abs(expected))).max())


def entry(name: str, stem: str, exporter: str, fault: Fault | None, node, max_abs: float) -> dict:
    """The registry record of one ONNX file (paths relative to fixtures/)."""
    return {
        "name": stem,
        "model": f"models/{name}.py",
        "inputs": [f"inputs/{name}.npy"],
        "onnx": f"onnx/{stem}.onnx",
        "exporter": exporter,
        "expect_exit": 0 if fault is None else 1,
        "fault": None if fault is None else {
            "kind": fault.kind,
            "module": fault.module,
            **({"also_ok_modules": list(fault.also_ok_modules)} if fault.also_ok_modules else {}),
            "onnx_node": node.name,
            "op_type": node.op_type,
        },
        "max_abs_measured": float(f"{max_abs:.3g}"),
    }


def main() -> None:
    entries, rows, failures = [], [], []
    for name in MODELS:
        fixture = load_fixture(name)
        ensure_weights(name, fixture)
        model, args = fixture.get_model(), fixture.get_inputs()
        inputs = [a.numpy() for a in args]
        np.save(FIXTURES / "inputs" / f"{name}.npy", inputs[0])
        with torch.no_grad():
            ref = model(*args).double().numpy()
        clean = {ex: export(model, args, ex) for ex in EXPORTERS}
        files = [(f"{name}.{ex}", ex, proto, None, None, proto) for ex, proto in clean.items()]
        for fault in (f for f in FAULTS if f.model == name):
            base = export(model, args, fault.exporter, dynamic_batch=True) if fault.dynamic_batch else \
                clean[fault.exporter]
            node = plant.find_node(base, fault.op_type, (fault.module, *fault.also_ok_modules))
            proto = fault.plant(base, node, model)
            files.append((f"{fault.stem}.{fault.exporter}", fault.exporter, proto, fault, node, base))
        for stem, exporter, proto, fault, node, base in files:
            onnx.checker.check_model(proto)
            onnx.save(proto, FIXTURES / "onnx" / f"{stem}.onnx")
            max_abs, ratio = excess(run(proto, inputs)[0], ref)
            node_max_abs = node_ratio = float("nan")
            if fault is None and ratio > 1:
                failures.append(f"{stem}: the clean export disagrees with PyTorch")
            elif fault is not None:
                tensor = node.output[0]
                node_max_abs, node_ratio = excess(run(proto, inputs, tensor)[-1],
                                                  run(base, inputs, tensor)[-1].astype(np.float64))
                if min(ratio, node_ratio) <= 1:
                    failures.append(f"{stem}: the planted fault is within tolerance")
            rows.append(f"{stem:<26} {max_abs:>10.3g} {ratio:>9.3g} {node_max_abs:>14.3g} {node_ratio:>9.3g}")
            entries.append(entry(name, stem, exporter, fault, node, max_abs))
    (FIXTURES / "registry.json").write_text(json.dumps(entries, indent=2) + "\n")
    print(f"{'file':<26} {'max abs':>10} {'x tol':>9} {'node max abs':>14} {'x tol':>9}", *rows, sep="\n")
    if failures:
        raise SystemExit("\n".join(failures))


if __name__ == "__main__":
    main()
