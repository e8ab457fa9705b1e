"""Activation kind: the segment computes another activation function than PyTorch's — a ReLU where the model
has a GELU, a GELU where it has a SiLU (a config's ``hidden_act`` read as another, a converter mapping one
activation to another) — whatever ops it is written with."""
from __future__ import annotations

import numpy as np
from onnx import helper

from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule
from ..support import edits
from .gelu import between, decomposed, gelu_erf, gelu_sigmoid, gelu_tanh, sigmoid_form


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.clip(x, -500, 500)))


def _softplus(x):
    return np.logaddexp(0.0, x)


#: activation functions by name, in float64
FUNCTIONS = {
    "ReLU": lambda x: np.maximum(x, 0.0),
    "GELU (erf)": gelu_erf,
    "GELU (tanh)": gelu_tanh,
    "quick GELU": gelu_sigmoid,
    "SiLU": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "Mish": lambda x: x * np.tanh(_softplus(x)),
    "Hardswish": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "Hardsigmoid": lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "ELU": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "LeakyReLU": lambda x: np.where(x > 0, x, 0.01 * x),
    "softplus": _softplus,
    "ReLU6": lambda x: np.clip(x, 0.0, 6.0),
}
#: the GELU forms among each other are the GELU rule's (gelu-approximation)
GELUS = frozenset({"GELU (erf)", "GELU (tanh)", "quick GELU"})
#: ops one of which a segment applying an activation function holds (an identity-like segment has no function)
NONLINEAR = frozenset({"Relu", "Sigmoid", "Tanh", "Erf", "Clip", "Softplus", "Elu", "LeakyRelu", "HardSwish",
                       "HardSigmoid", "Max", "Min", "Sign", "Gelu", "FastGelu", "QuickGelu", "BiasGelu", "Mish",
                       "Selu", "Celu", "PRelu", "Exp", "Softsign", "Where", "Abs", "ThresholdedRelu"})
#: elements of a tensor the functions are first told apart on
SAMPLE = 1 << 16
#: tensors of the output's shape tried as the activation's input, nearest the output first
MAX_INPUTS = 8
#: a function "fits" a tensor when it is this close, relative to 1 + the tensor's largest magnitude
FIT = 1e-3
#: the least distance, relative to 1 + the largest magnitude, that tells two functions apart (ten times it, or ten
#: times the fits' own distances)
APART = 1e-5


class ActivationKind(Rule):
    """Find the tensor the activation reads and which function each side applies to it."""

    cause = Cause.ATTRIBUTE_MISMATCH

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local) or not any(n.op_type in NONLINEAR for n in ctx.segment_nodes):
            return None
        site = _site(ctx)
        if site is None:
            return None
        x, onnx_fn, torch_fn, errors = site
        nodes = between(ctx, x, ctx.tensor)
        if not nodes:
            return None
        module = ctx.layer.pair.activation
        summary = (f"The ONNX segment computing {module.name} ({module.module_type}) applies {onnx_fn} to "
                   f"'{x}' where PyTorch applies {torch_fn}: on the segment's real input its output is "
                   f"{errors[onnx_fn]:.2g} from {onnx_fn} and {errors[torch_fn]:.2g} from {torch_fn} "
                   f"({', '.join(nodes)}). With {torch_fn} in their place the segment reproduces PyTorch's output.")
        fix = (f"Export the activation as {torch_fn}: check the configuration the export was made from (a "
               "hidden_act read as another) and the converter's mapping of the activation.")
        dtype = ctx.local_value.dtype
        if not ctx.reproduces(_replaced(ctx, x, nodes, torch_fn, dtype)):
            return None  # a replacement that does not reproduce PyTorch is no reading
        return Finding(self.cause, 0.9, summary, fix,
                       {"activation_input": x, "onnx_function": onnx_fn, "pytorch_function": torch_fn,
                        "nodes": list(nodes), **{f"max_abs_onnx_vs_{k}": v for k, v in errors.items()}},
                       changes=nodes, counterfactual=lambda c: _replaced(c, x, nodes, torch_fn, dtype))


def _site(ctx: DiagnosisContext):
    """``(input tensor, ONNX's function, PyTorch's, ONNX's distance to each)``: a float tensor of the segment of
    the divergent tensor's shape that one function maps to ONNX's output and another to PyTorch's; None."""
    y = ctx.local_value.astype(np.float64)
    ref = ctx.reference.astype(np.float64).reshape(y.shape)
    tensors = [t for p in ctx.segment_protos for t in p.input if t and ctx.initializer(t) is None
               and ctx.shape_of(t) == y.shape]
    # the activation's input lies just before its output: the nearest few tensors of its shape
    tensors = sorted(dict.fromkeys(tensors), key=ctx.onnx.graph.order_of, reverse=True)[:MAX_INPUTS]
    values = ctx.computed(tensors)
    sample = _sample(y.size)
    for x in tensors:
        value = values.get(x)
        if value is None or x == ctx.tensor or np.shape(value) != y.shape or np.asarray(value).dtype.kind != "f":
            continue
        xv = np.asarray(value, np.float64).reshape(-1)[sample]
        with np.errstate(all="ignore"):  # told on a sample; the winners are then measured on everything
            onnx_err = {k: float(np.max(np.abs(y.reshape(-1)[sample] - f(xv)))) for k, f in FUNCTIONS.items()}
            torch_err = {k: float(np.max(np.abs(ref.reshape(-1)[sample] - f(xv)))) for k, f in FUNCTIONS.items()}
        onnx_fn, torch_fn = min(onnx_err, key=onnx_err.get), min(torch_err, key=torch_err.get)
        if onnx_fn == torch_fn or {onnx_fn, torch_fn} <= GELUS:
            continue
        close_y, close_ref = FIT * (1 + np.max(np.abs(y))), FIT * (1 + np.max(np.abs(ref)))
        # told apart by how far the other function is from ONNX's output against how well each one fits (not
        # against the fit's bound: GELU and SiLU differ by 0.2 at most, however large the activations grow)
        apart = 10 * max(onnx_err[onnx_fn], torch_err[torch_fn], APART * (1 + np.max(np.abs(y))))
        if onnx_err[onnx_fn] <= close_y and torch_err[torch_fn] <= close_ref and onnx_err[torch_fn] > apart:
            full = np.asarray(value, np.float64)
            with np.errstate(all="ignore"):
                errors = {k: float(np.max(np.abs(y - FUNCTIONS[k](full)))) for k in (onnx_fn, torch_fn)}
            if errors[onnx_fn] <= close_y:
                return x, onnx_fn, torch_fn, errors
    return None


def _sample(size: int) -> np.ndarray | slice:
    """Evenly spread positions of at most SAMPLE elements of a flat tensor of ``size``."""
    return slice(None) if size <= SAMPLE else np.linspace(0, size - 1, SAMPLE).astype(np.int64)


def _replaced(ctx: DiagnosisContext, x: str, nodes: tuple[str, ...], function: str, dtype) -> FixedSegment:
    """The skeleton with the nodes computing the divergent tensor from ``x`` replaced by ``function``."""
    model = edits.copy_model(ctx.onnx.skeleton)
    y, prefix = ctx.tensor, f"{nodes[-1]}_as_{function.split()[0].lower()}"

    def const(name, value):
        return edits.add_initializer(model, f"{prefix}_{name}", np.array(value, dtype=dtype))

    def node(op, ins, out, **attrs):
        return helper.make_node(op, ins, [out], name=f"{prefix}_{op}", **attrs)

    single = {"ReLU": ("Relu", {}), "sigmoid": ("Sigmoid", {}), "tanh": ("Tanh", {}), "softplus": ("Softplus", {}),
              "Hardswish": ("HardSwish", {}), "Hardsigmoid": ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}),
              "ELU": ("Elu", {"alpha": 1.0}), "LeakyReLU": ("LeakyRelu", {"alpha": 0.01})}
    if function in single:
        op, attrs = single[function]
        new = [node(op, [x], y, **attrs)]
    elif function == "GELU (erf)" or function == "GELU (tanh)":
        new = decomposed(model, x, y, "erf" if "erf" in function else "tanh", prefix, dtype)
    elif function == "quick GELU":
        new = sigmoid_form(model, x, y, prefix, dtype, None)
    elif function == "SiLU":
        new = [node("Sigmoid", [x], f"{prefix}_s"), node("Mul", [x, f"{prefix}_s"], y)]
    elif function == "Mish":
        new = [node("Softplus", [x], f"{prefix}_p"), node("Tanh", [f"{prefix}_p"], f"{prefix}_t"),
               node("Mul", [x, f"{prefix}_t"], y)]
    else:  # ReLU6
        new = [node("Clip", [x, const("low", 0.0), const("high", 6.0)], y)]
    edits.replace_nodes(model, set(nodes), new)
    return FixedSegment(model, ctx.onnx.weights)

