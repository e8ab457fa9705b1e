"""The cases of the diagnosis suite: every cause planted in an MLP, a CNN and a transformer, in files
from the dynamo exporter, the TorchScript exporter and onnxslim.

A case is a PyTorch model, its inputs, an ONNX model with one planted fault,
the bisect options it runs with (session settings, tolerance) and the cause the
diagnosis must name.  Clean cases carry ``cause=None``.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diagnosis_models as dm  # noqa: E402
import plant  # noqa: E402

PROVENANCES = ("dynamo", "torchscript", "onnxslim")
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
GELU = {"mlp": "act1", "cnn": "act1", "transformer": "blocks.0.act"}
FOLD = {"mlp": ("fc1", "bn1"), "cnn": ("conv1", "bn1"), "transformer": ("patch", "bn")}
NORM = {"mlp": ("norm", "LayerNormalization"), "cnn": ("gn", "InstanceNormalization"),
        "transformer": ("blocks.0.ln2", "LayerNormalization")}
WEIGHT = {"mlp": ("fc2", "Gemm"), "cnn": ("conv3", "Conv"), "transformer": ("blocks.1.fc1", None)}
ACTIVATION = {"mlp": "act1", "cnn": "relu", "transformer": "blocks.0.act"}
QUANT_WEIGHT = {"mlp": "fc2", "cnn": "conv3", "transformer": "blocks.0.fc2"}


@dataclass
class Case:
    """One ONNX file to bisect and the cause its diagnosis must name (None: clean)."""

    name: str
    cause: str | None
    arch: str
    provenance: str
    model: Any = field(repr=False)
    inputs: tuple = field(repr=False)
    proto: onnx.ModelProto = field(repr=False)
    options: dict = field(default_factory=dict)
    detail: str = ""


# ---------------------------------------------------------------- exports

@contextlib.contextmanager
def quiet():
    """Silence exporters and converters (prints, warnings, log records)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "root")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def export(model: torch.nn.Module, args: tuple, provenance: str, training: bool = False) -> onnx.ModelProto:
    """Export by ``provenance``: dynamo, TorchScript (opset 17), or onnxslim over the TorchScript export
    (``training``: TorchScript in training mode)."""
    with quiet():
        if provenance == "dynamo":
            proto = torch.onnx.export(model, args, dynamo=True, verbose=False).model_proto
            for node in proto.graph.node:
                keep = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
                node.ClearField("metadata_props")
                node.metadata_props.extend(keep)
            return proto
        if provenance == "torchscript":
            buffer = io.BytesIO()
            mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
            if training:
                model.train()
            try:
                torch.onnx.export(model, args, buffer, dynamo=False, opset_version=17, training=mode,
                                  do_constant_folding=not training)
            finally:
                model.eval()
            return onnx.load_from_string(buffer.getvalue())
        import onnxslim

        # over the TorchScript export: onnxslim keeps node names but drops the dynamo exporter's scope metadata
        return onnxslim.slim(export(model, args, "torchscript", training))


def export_opset(model: torch.nn.Module, args: tuple, opset: int) -> onnx.ModelProto:
    """TorchScript export at ``opset`` (below 17 it decomposes LayerNorm into ReduceMean/Sub/Pow/Add/Sqrt/Div)."""
    buffer = io.BytesIO()
    with quiet():
        torch.onnx.export(model, args, buffer, dynamo=False, opset_version=opset)
    return onnx.load_from_string(buffer.getvalue())


@functools.lru_cache(maxsize=None)
def clean(arch: str, provenance: str, training: bool = False, variant: str = ""):
    """``(model, inputs, proto)`` of a clean export, cached."""
    model, inputs = dm.build(arch)
    if variant == "tanh":
        for m in model.modules():
            if isinstance(m, torch.nn.GELU):
                m.approximate = "tanh"
    return model, inputs, export(model, inputs, provenance, training)


def activation_of(model: torch.nn.Module, inputs: tuple, module: str) -> np.ndarray:
    """The output of ``module`` on ``inputs`` (float64)."""
    seen = []
    handle = dict(model.named_modules())[module].register_forward_hook(lambda m, a, o: seen.append(o))
    with torch.no_grad():
        model(*inputs)
    handle.remove()
    return seen[0].double().numpy()


def output_of(proto: onnx.ModelProto, module: str, op_type: str | None = None) -> str:
    """The tensor of the last node (of ``op_type``) emitted by ``module``."""
    nodes = [n for n in plant.find_nodes(proto, op_type, module) if n.op_type != "Constant"]
    if not nodes:
        raise LookupError(f"no {op_type or ''} node in {module}")
    return nodes[-1].output[0]


# ---------------------------------------------------------------- planting, one function per cause

def gelu(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    formula = {"dynamo": "tanh", "torchscript": "tanh", "onnxslim": "fast"}[prov]
    bad = plant.set_gelu_formula(proto, GELU[arch], formula)
    return Case("", "gelu-approximation", arch, prov, model, inputs, bad, detail=f"GELU of {GELU[arch]} → {formula}")


def gelu_reverse(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov, variant="tanh")
    bad = plant.set_gelu_formula(proto, GELU[arch], "erf")
    return Case("", "gelu-approximation", arch, prov, model, inputs, bad,
                detail=f"PyTorch GELU(approximate='tanh') of {GELU[arch]}, ONNX erf")


def batchnorm_fold(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    layer_name, bn_name = FOLD[arch]
    layer, bn = dict(model.named_modules())[layer_name], dict(model.named_modules())[bn_name]
    op = "Gemm" if arch == "mlp" else "Conv"
    node = plant.find_node(proto, op, (layer_name, bn_name))
    bn_nodes = plant.find_nodes(proto, "BatchNormalization", bn_name)
    mistake = {"dynamo": "epsilon-dropped", "torchscript": "batch-statistics", "onnxslim": "wrong-epsilon"}[prov]
    kwargs: dict = {"bn_node": bn_nodes[0].name if bn_nodes else None}
    if mistake == "epsilon-dropped":
        kwargs["eps"] = 0.0
    elif mistake == "wrong-epsilon":
        kwargs["eps"] = 1e-1
    else:
        kwargs["mean"], kwargs["var"] = plant.batch_statistics(activation_of(model, inputs, layer_name))
    bad = plant.fold_batchnorm(proto, node.name, layer, bn, **kwargs)
    return Case("", "batchnorm-fold", arch, prov, model, inputs, bad, detail=f"{layer_name}+{bn_name} folded: {mistake}")


def epsilon(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    module, op = NORM[arch]
    if arch == "mlp" and prov == "torchscript":
        module, op = "bn1", "BatchNormalization"
    node = plant.find_node(proto, op, module)
    bad = plant.set_attribute(proto, node.name, "epsilon", 5e-2)
    return Case("", "epsilon-mismatch", arch, prov, model, inputs, bad, detail=f"{op} of {module}: epsilon 5e-2")


def weight(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    module, op = WEIGHT[arch]
    nodes = [n for n in plant.find_nodes(proto, op, module) if n.op_type in ("Gemm", "MatMul", "Conv")]
    init = plant.weight_of(proto, nodes[0].name)
    bad = plant.perturb_initializer(proto, init, rel=0.05)
    return Case("", "weight-mismatch", arch, prov, model, inputs, bad, detail=f"{init} of {module} perturbed 5%")


def attribute(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    plan = {
        ("mlp", "dynamo"): ("Softmax", "softmax", "axis", 0), ("mlp", "torchscript"): ("Softmax", "softmax", "axis", 0),
        ("mlp", "onnxslim"): ("Softmax", "softmax", "axis", 0),
        ("cnn", "dynamo"): ("Pad", "pad", "mode", "edge"), ("cnn", "torchscript"): ("Conv", "conv2", "pads", [2, 2, 0, 0]),
        ("cnn", "onnxslim"): ("Softmax", "softmax", "axis", 0),
        ("transformer", "dynamo"): ("Softmax", "blocks.0.attn.softmax", "axis", 2),
        ("transformer", "torchscript"): ("Transpose", "blocks.0.attn", "perm", [0, 1, 2, 3]),
        ("transformer", "onnxslim"): ("Gemm", "blocks.1.attn.proj", "transB", 0),
    }[(arch, prov)]
    op, module, attr, value = plan
    nodes = plant.find_nodes(proto, op, module)
    if op == "Transpose":  # the one turning k into kᵀ: perm (0, 1, 3, 2)
        nodes = [n for n in nodes if list(next(a.ints for a in n.attribute if a.name == "perm")) == [0, 1, 3, 2]]
    bad = plant.set_attribute(proto, nodes[0].name, attr, value)
    return Case("", "attribute-mismatch", arch, prov, model, inputs, bad, detail=f"{op} of {module}: {attr}={value}")


def precision(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    if prov == "onnxslim":  # only one block in float16
        module = {"mlp": ("fc2",), "cnn": ("conv2", "gn", "conv3"), "transformer": ("blocks.1.fc1",)}[arch]
        inside = {n.name for n in plant.find_nodes(proto, None, module)}
        keep = [n.name for n in proto.graph.node if n.name not in inside]
        detail = f"{module} in float16"
    else:
        keep, detail = [], "whole model in float16"
    with quiet():
        bad = plant.to_float16(proto, keep)
    return Case("", "precision", arch, prov, model, inputs, bad, detail=detail)


def quantization(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    if prov == "torchscript":
        module = QUANT_WEIGHT[arch]
        nodes = [n for n in plant.find_nodes(proto, None, module) if n.op_type in ("Gemm", "MatMul", "Conv")]
        bad = plant.quantize_initializer(proto, plant.weight_of(proto, nodes[0].name))
        return Case("", "quantization", arch, prov, model, inputs, bad, detail=f"{module} weight int8 per-tensor")
    module = ACTIVATION[arch]
    tensor = output_of(proto, module)
    values = activation_of(model, inputs, module)
    scale = 0.3 * float(np.abs(values).max()) / 127  # calibrated on too little data: clips the tails
    bad = plant.insert_qdq(proto, tensor, scale)
    return Case("", "quantization", arch, prov, model, inputs, bad, detail=f"{module} output int8, scale {scale:.3g}")


def quantization_static(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    with quiet():
        bad = plant.quantize_static_qdq(proto, {proto.graph.input[0].name: inputs[0].numpy()})
    return Case("", "quantization", arch, prov, model, inputs, bad, detail="onnxruntime quantize_static, QDQ int8")


def training_mode(arch: str, prov: str) -> Case:
    if prov == "dynamo":
        # The dynamo exporter folds BatchNorm with its running statistics even in training mode; what it can
        # leave is an active Dropout, which ONNX Runtime's optimizer deletes: it shows with optimizations off
        # (as in runtimes that honour training_mode).
        model, inputs, proto = clean(arch, prov)
        bad = plant.insert_dropout(proto, output_of(proto, ACTIVATION[arch]), 0.2)
        return Case("", "training-mode", arch, prov, model, inputs, bad, options={"ort_opt_level": "disable"},
                    detail=f"active Dropout after {ACTIVATION[arch]}, session without graph optimizations")
    model, inputs, proto = clean(arch, prov, training=True)
    torch.manual_seed(0)
    return Case("", "training-mode", arch, prov, model, inputs, proto, detail="exported with TrainingMode.TRAINING")


def resize(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, "torchscript" if (arch, prov) == ("mlp", "dynamo") else prov)
    plan = {
        ("mlp", "torchscript"): {"coordinate_transformation_mode": "align_corners"},
        ("mlp", "onnxslim"): {"mode": "nearest"},
        ("cnn", "dynamo"): {"coordinate_transformation_mode": "align_corners"},
        ("cnn", "torchscript"): {"mode": "nearest"},
        ("cnn", "onnxslim"): {"coordinate_transformation_mode": "asymmetric"},
        ("transformer", "dynamo"): {"coordinate_transformation_mode": "half_pixel"},
        ("transformer", "torchscript"): {"coordinate_transformation_mode": "asymmetric"},
        ("transformer", "onnxslim"): {"mode": "cubic"},
    }.get((arch, prov))
    if plan is None:
        raise NotImplementedError("the dynamo exporter decomposes this Resize")
    bad = proto
    node = plant.find_node(proto, "Resize", "up")
    for attr, value in plan.items():
        bad = plant.set_attribute(bad, node.name, attr, value)
    return Case("", "resize-mode", arch, prov, model, inputs, bad,
                detail=", ".join(f"{k}={v}" for k, v in plan.items()))


def runtime(arch: str, prov: str) -> Case:
    if prov == "dynamo":
        raise NotImplementedError("ONNX Runtime does not approximate the opset-20 Gelu op")
    model, inputs, proto = clean(arch, prov)
    return Case("", "runtime-optimization", arch, prov, model, inputs, proto,
                options={"ort_config": {"optimization.enable_gelu_approximation": "1"}},
                detail="session option optimization.enable_gelu_approximation=1")


def dtype(arch: str, prov: str) -> Case:
    exported, reference, inputs = dm.build_centered(arch)
    proto = export(exported, (inputs[0].float(),), prov)
    return Case("", "dtype", arch, prov, reference, inputs, proto, detail="float64 model and inputs, float32 ONNX")


def unknown(arch: str, prov: str) -> Case:
    model, inputs, proto = clean(arch, prov)
    values = activation_of(model, inputs, ACTIVATION[arch])
    channels = values.shape[1] if arch == "cnn" else values.shape[-1]
    offset = np.random.default_rng(7).normal(0.0, 0.05, channels).astype(np.float32)
    bad = plant.insert_offset(proto, output_of(proto, ACTIVATION[arch]), offset.reshape(-1, 1, 1) if arch == "cnn" else offset)
    return Case("", "unknown", arch, prov, model, inputs, bad, detail=f"stray Add of a random vector after {ACTIVATION[arch]}")


PLANTERS: dict[str, Callable[[str, str], Case]] = {
    "gelu-approximation": gelu, "gelu-approximation (reverse)": gelu_reverse, "batchnorm-fold": batchnorm_fold,
    "epsilon-mismatch": epsilon, "weight-mismatch": weight, "attribute-mismatch": attribute,
    "precision": precision, "quantization": quantization, "quantization (static)": quantization_static,
    "training-mode": training_mode,
    "resize-mode": resize, "runtime-optimization": runtime, "dtype": dtype, "unknown": unknown,
}
#: the variants that run in one provenance only (one per architecture is enough)
ONLY = {"gelu-approximation (reverse)": ("dynamo",), "quantization (static)": ("torchscript",)}


def planted_cases(causes=None, archs=dm.ARCHS, provenances=PROVENANCES):
    """Yield every planted case (or a ``(name, error)`` pair when a planting is not possible)."""
    for label, planter in PLANTERS.items():
        if causes and label.split(" ")[0] not in causes:
            continue
        for arch in archs:
            for prov in provenances:
                if prov not in ONLY.get(label, PROVENANCES):
                    continue
                name = f"{label.replace(' (', '.').rstrip(')')}/{arch}/{prov}"
                try:
                    case = planter(arch, prov)
                except NotImplementedError as exc:
                    yield name, f"not applicable: {exc}"
                    continue
                except Exception as exc:  # noqa: BLE001 - a planting bug is reported, not fatal
                    yield name, f"planting failed: {type(exc).__name__}: {exc}"
                    continue
                case.name = name
                yield case


def clean_cases(archs=dm.ARCHS, provenances=PROVENANCES):
    """Every clean export, at the default tolerance and at a tolerance tight enough to flag float32 rounding."""
    for arch in archs:
        for prov in provenances:
            model, inputs, proto = clean(arch, prov)
            yield Case(f"clean/{arch}/{prov}", None, arch, prov, model, inputs, proto)
            yield Case(f"clean-tight/{arch}/{prov}", None, arch, prov, model, inputs, proto,
                       options={"atol": 1e-9, "rtol": 1e-9}, detail="tolerance 1e-9: float32 rounding diverges")


__all__ = ["Case", "PLANTERS", "planted_cases", "clean_cases", "export", "clean", "copy"]
