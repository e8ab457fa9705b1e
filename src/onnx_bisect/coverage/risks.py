"""Numerically risky ops: semantics that commonly differ between PyTorch, ONNX and runtimes.

Each rule is a small function ``(node, inventory) -> RiskFlag | None`` that
names the diagnosis slugs a divergence at that node would most likely carry,
so the triage points at where to look before anything is measured.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..records import Cause
from .records import Inventory, NodeInfo, RiskFlag

Rule = Callable[[NodeInfo, Inventory], "RiskFlag | None"]
RULES: list[Rule] = []

_FP16 = ("float16", "bfloat16")
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_NORMS = ("LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
          "RMSNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
          "SkipSimplifiedLayerNormalization", "MeanVarianceNormalization", "LpNormalization")
_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum",
               "ReduceProd", "ReduceL1", "Softmax", "LogSoftmax", "CumSum", "Mean", "Sum")
_QUANT = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
          "MatMulInteger", "ConvInteger", "QLinearAdd", "QLinearMul", "QAttention", "MatMulNBits",
          "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QLinearSoftmax", "QLinearSigmoid")
_FUSED = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "SkipLayerNormalization",
          "EmbedLayerNormalization", "BiasGelu", "FastGelu", "FusedMatMul", "FusedConv", "FusedGemm",
          "BiasSoftmax", "RotaryEmbedding", "SkipSimplifiedLayerNormalization", "BiasAdd", "BiasSplitGelu")


def rule(fn: Rule) -> Rule:
    """Register a risk rule."""
    RULES.append(fn)
    return fn


def assess_risks(node: NodeInfo, inventory: Inventory) -> tuple[RiskFlag, ...]:
    """Every risk rule that matches ``node``."""
    return tuple(flag for flag in (r(node, inventory) for r in RULES) if flag is not None)


def _first_input(node: NodeInfo) -> str | None:
    return node.signature.input_types[0] if node.signature.input_types else None


def _producer(node: NodeInfo, inventory: Inventory, i: int = 0) -> NodeInfo | None:
    if i >= len(node.inputs) or node.inputs[i] not in inventory.producers:
        return None
    return inventory.nodes[inventory.producers[node.inputs[i]]]


def _constant(inventory: Inventory, name: str):
    value = inventory.constants.get(name)
    return None if value is None else np.asarray(value)


@rule
def resize_mode(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Resize/Upsample: coordinate transform, cubic coefficient and nearest rounding differ across frameworks."""
    if node.signature.op_type not in ("Resize", "Upsample"):
        return None
    mode = node.attribute("mode", "nearest")
    transform = node.attribute("coordinate_transformation_mode", "half_pixel")
    if mode == "nearest":
        detail = f"nearest_mode {node.attribute('nearest_mode', 'round_prefer_floor')}, {transform}"
        hint = "PyTorch 'nearest' is asymmetric + floor"
    else:
        detail = f"{mode}, {transform}" + (f", cubic_coeff_a {node.attribute('cubic_coeff_a', -0.75):g}"
                                           if mode == "cubic" else "")
        hint = "PyTorch align_corners=False is half_pixel/pytorch_half_pixel, True is align_corners; antialias"
    return RiskFlag((Cause.RESIZE_MODE,), f"{node.signature.op_type} {detail}: {hint}")


@rule
def gelu(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """GELU, exact (erf) or tanh-approximated, as one op or as the exporters' decomposition."""
    op, domain = node.signature.op_type, node.signature.domain
    if op == "Gelu":
        approx = node.attribute("approximate", "none")
        return RiskFlag((Cause.GELU_APPROXIMATION,), f"GELU (approximate={approx}): must match the PyTorch "
                        "module's approximate= setting")
    if domain == "com.microsoft" and op in ("FastGelu", "BiasGelu", "QuickGelu"):
        return RiskFlag((Cause.GELU_APPROXIMATION, Cause.RUNTIME_OPTIMIZATION),
                        f"{op}: a fused GELU ({'tanh approximation' if op == 'FastGelu' else op})")
    if op == "Erf" and (p := _producer(node, inv)) is not None and p.signature.op_type in ("Div", "Mul"):
        return RiskFlag((Cause.GELU_APPROXIMATION,), "exact GELU (erf form); ONNX Runtime's "
                        "optimization.enable_gelu_approximation or a fused kernel may switch it to tanh")
    if op == "Tanh" and _upstream_has(node, inv, "Pow", depth=4):
        return RiskFlag((Cause.GELU_APPROXIMATION,), "tanh-approximated GELU; PyTorch nn.GELU() defaults to "
                        "the exact erf form")
    return None


def _upstream_has(node: NodeInfo, inv: Inventory, op_type: str, depth: int) -> bool:
    frontier = [node]
    for _ in range(depth):
        frontier = [p for n in frontier for i in range(len(n.inputs)) if (p := _producer(n, inv, i)) is not None]
        if any(n.signature.op_type == op_type for n in frontier):
            return True
    return False


@rule
def low_precision_reduction(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Reductions, softmax and norms in float16/bfloat16 accumulate differently on each runtime."""
    dtype = _first_input(node)
    if dtype not in _FP16 or node.signature.op_type not in _REDUCTIONS + _NORMS:
        return None
    return RiskFlag((Cause.PRECISION,), f"{node.signature.op_type} on {dtype}: accumulation precision differs "
                    "between runtimes (PyTorch accumulates in float32)")


@rule
def norm_epsilon(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """A norm epsilon that float16 cannot hold (it becomes 0)."""
    if node.signature.op_type not in _NORMS or _first_input(node) != "float16":
        return None
    eps = node.attribute("epsilon")
    if eps is None or eps >= 6e-8:
        return None
    return RiskFlag((Cause.EPSILON_MISMATCH, Cause.PRECISION),
                    f"epsilon {eps:g} underflows to 0 in float16")


@rule
def batchnorm(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """BatchNormalization in training mode, or after a Conv (runtimes fold it into the Conv's weights)."""
    if node.signature.op_type != "BatchNormalization":
        return None
    if node.attribute("training_mode", 0) and node.inputs[0] not in inv.input_free:
        return RiskFlag((Cause.TRAINING_MODE,), "BatchNormalization with training_mode=1 uses batch statistics")
    producer = _producer(node, inv)
    if producer is not None and producer.signature.op_type in ("Conv", "ConvTranspose"):
        return RiskFlag((Cause.BATCHNORM_FOLD, Cause.RUNTIME_OPTIMIZATION),
                        "BatchNormalization after a Conv: ONNX Runtime folds it into the Conv's weights")
    return None


@rule
def dropout_training(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Dropout whose training_mode input is not a constant False."""
    if node.signature.op_type != "Dropout" or len(node.inputs) < 3 or not node.inputs[2]:
        return None
    value = _constant(inv, node.inputs[2])
    if value is not None and not value.any():
        return None
    return RiskFlag((Cause.TRAINING_MODE,), "Dropout with a training_mode input: random masks when it is true")


@rule
def integer_division(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Integer Div truncates; Mod's sign convention depends on fmod."""
    op, dtype = node.signature.op_type, _first_input(node)
    if op == "Div" and dtype in _INTS:
        return RiskFlag((Cause.DTYPE,), f"integer Div ({dtype}) truncates toward zero; PyTorch // and "
                        "div(rounding_mode='floor') floor (differs for negative operands)")
    if op == "Mod":
        fmod = node.attribute("fmod", 0)
        return RiskFlag((Cause.DTYPE, Cause.ATTRIBUTE_MISMATCH), f"Mod fmod={fmod}: the result's sign follows the "
                        + ("dividend (C fmod, torch.fmod)" if fmod else "divisor (Python %, torch.remainder)"))
    return None


@rule
def detection_ops(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """NonMaxSuppression and RoiAlign: box conventions, ordering and sampling differ from torchvision."""
    op = node.signature.op_type
    if op == "NonMaxSuppression":
        return RiskFlag((Cause.ATTRIBUTE_MISMATCH,), f"NonMaxSuppression center_point_box="
                        f"{node.attribute('center_point_box', 0)}: box format, tie order and the number of boxes "
                        "kept differ between runtimes and torchvision.ops.nms")
    if op == "RoiAlign":
        transform = node.attribute("coordinate_transformation_mode",
                                   "half_pixel" if (node.signature.since_version or 0) >= 16 else "output_half_pixel")
        return RiskFlag((Cause.ATTRIBUTE_MISMATCH,), f"RoiAlign {node.attribute('mode', 'avg')}, {transform}: "
                        "torchvision aligned=True is half_pixel, aligned=False output_half_pixel; sampling_ratio "
                        f"{node.attribute('sampling_ratio', 0)}")
    return None


@rule
def quantization(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Quantized arithmetic: rounding, saturation and zero points."""
    if node.signature.op_type not in _QUANT:
        return None
    return RiskFlag((Cause.QUANTIZATION,), f"{node.signature.op_type}: rounding (half to even), saturation and "
                    "zero-point handling differ between quantization toolkits and runtimes")


@rule
def narrowing_cast(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Casts that drop precision or range."""
    if node.signature.op_type != "Cast" or not node.output_types:
        return None
    src, dst = _first_input(node), node.output_types[0]
    if src in ("float", "double") and (dst in _FP16 or (dst or "").startswith("float8")):
        return RiskFlag((Cause.PRECISION,), f"Cast {src} -> {dst} drops precision")
    if src in ("float", "double", *_FP16) and dst in _INTS:
        return RiskFlag((Cause.DTYPE,), f"Cast {src} -> {dst} truncates; NaN and out-of-range values are undefined")
    return None


@rule
def fused_contrib(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Fused com.microsoft ops come from a runtime optimizer, not from the exporter."""
    if node.signature.domain != "com.microsoft" or node.signature.op_type not in _FUSED:
        return None
    if node.signature.op_type in ("FastGelu", "BiasGelu"):
        return None  # the GELU rule names these
    return RiskFlag((Cause.RUNTIME_OPTIMIZATION,), f"fused {node.signature.op_type}: its kernel may reorder or "
                    "approximate what the unfused graph computes")


@rule
def float_range(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Range over floats: the element count depends on rounding of (limit - start) / delta."""
    if node.signature.op_type != "Range" or _first_input(node) not in ("float", "double", *_FP16):
        return None
    return RiskFlag((Cause.DTYPE,), "floating-point Range: the number of elements can differ by one between "
                    "frameworks")


@rule
def legacy_softmax_axis(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Softmax before opset 13 flattens to 2-D at ``axis``: not PyTorch's dim semantics unless axis is last."""
    op = node.signature.op_type
    if op not in ("Softmax", "LogSoftmax", "Hardmax") or node.signature.domain or \
            (node.signature.since_version or 13) >= 13:
        return None
    axis = node.attribute("axis", 1)
    if axis == -1:
        return None
    return RiskFlag((Cause.ATTRIBUTE_MISMATCH,), f"{op}-{node.signature.since_version} axis={axis} normalises over "
                    "all dimensions from axis on (opset < 13), unlike PyTorch's single dim")


@rule
def pool_ceil_mode(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """ceil_mode pooling: whether a window that starts in the padding is kept differs across runtimes."""
    if node.signature.op_type not in ("MaxPool", "AveragePool", "LpPool") or not node.attribute("ceil_mode", 0):
        return None
    return RiskFlag((Cause.ATTRIBUTE_MISMATCH,), f"{node.signature.op_type} ceil_mode=1: the last window's "
                    "handling (and count_include_pad) differs between PyTorch and runtimes")


@rule
def weights_from_inputs(node: NodeInfo, inv: Inventory) -> RiskFlag | None:
    """Weights that a feed can replace: graph inputs, or initializers also declared as inputs."""
    if node.signature.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or len(node.inputs) < 2:
        return None
    weight = node.inputs[1]
    if weight in inv.overridable:
        return RiskFlag((Cause.WEIGHT_MISMATCH,), "weight initializer is also a graph input: a feed of that "
                        "name silently replaces it (keep_initializers_as_inputs)")
    if weight in inv.graph_inputs and node.signature.op_type != "MatMul":  # MatMul of two activations is common
        return RiskFlag((Cause.WEIGHT_MISMATCH,), "weight is a graph input: it is whatever the caller feeds")
    return None
