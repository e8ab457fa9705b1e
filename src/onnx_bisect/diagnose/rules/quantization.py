"""Quantization: QuantizeLinear/DequantizeLinear on the segment's path clip or coarsen the values."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..support import edits, layout
from ...records import Cause
from ...records.nest import informative
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
             "MatMulInteger", "ConvInteger", "QGemm", "QLinearAdd", "QLinearMul"}
RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127), np.dtype(np.uint16): (0, 65535),
          np.dtype(np.int16): (-32768, 32767)}


class Quantization(Rule):
    """Measure each quantizer on the real activation (clipping, SQNR) and each quantized weight against PyTorch."""

    cause = Cause.QUANTIZATION

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        protos = [p for p in ctx.segment_protos if p.op_type in QUANT_OPS]
        if not protos or not ctx.significant(ctx.layer.local):
            return None
        before = _quantizers_before(ctx, protos)  # a DequantizeLinear's QuantizeLinear, cut off the segment
        protos += before
        quantizers = [p for p in protos if p.op_type == "QuantizeLinear"]
        acts = _activations(ctx, quantizers)
        if _relu_like(acts) and not _reproduces(ctx, protos, _relu_like(acts)) and _reproduces(ctx, protos, set()):
            # a range from 0 taken for a ReLU the quantizer absorbed, but PyTorch applies none there: it clips
            acts = _activations(ctx, quantizers, absorbed=False)
        products = integer_products(ctx, protos)
        dequantizers = [p for p in protos if p.op_type == "DequantizeLinear"] + [q.dequantizer for q in products]
        reread = next((m for m in (misread(ctx, p) for p in dequantizers if p.op_type == "DequantizeLinear")
                       if m is not None), None)
        if reread is not None:
            return reread
        weights = [w for w in (_weight(ctx, p) for p in dequantizers) if w is not None]
        inside = set(ctx.layer.segment)
        compute = sorted({ctx.onnx.graph.nodes[i].name for p in protos if p.op_type == "DequantizeLinear"
                          for i in ctx.onnx.graph.consumers.get(p.output[0], ())
                          if ctx.onnx.graph.nodes[i].op_type not in QUANT_OPS and ctx.onnx.graph.nodes[i].name in inside})
        compute += [q.op.name for q in products]  # dynamic quantization's integer products
        advice = _advice(acts, weights, compute, dynamic=bool(products) and not quantizers)
        parts = [f"{a['node']}: {a['clip_fraction']:.1%} of the activation clipped, SQNR {a['sqnr_db']:.1f} dB" for a in acts]
        parts += [f"{w['initializer']} ({'per-channel' if w['per_channel'] else 'per-tensor'}): "
                  + ("no float weight to compare with" if w["sqnr_db"] is None else f"SQNR {w['sqnr_db']:.1f} dB")
                  + (f", {w['clip_fraction']:.1%} of the weight clipped at the integer bounds"
                     if w.get("clip_fraction", 0) > 0.001 else "")
                  + (f", per-channel would give {w['sqnr_db_per_channel']:.1f} dB" if w.get("sqnr_db_per_channel") else "")
                  for w in weights]
        summary = (f"The segment computing {ctx.layer.pair.activation.name} is quantized ({len(protos)} Q/DQ node(s)): "
                   + ("; ".join(parts) or "the quantized values differ from PyTorch's")
                   + f". Local max abs {ctx.layer.local.max_abs:.2g}.")
        evidence = {"activations": acts, "weights": weights, "quantized_nodes": compute}
        relu = _relu_like(acts)
        return Finding(self.cause, 0.9, summary, advice, evidence,
                       changes=(*ctx.layer.segment, *(p.name for p in before)) if before else (),
                       counterfactual=lambda c: _dequantized(c, protos, relu))


def _quantizers_before(ctx: DiagnosisContext, protos) -> list:
    """The QuantizeLinear nodes outside the segment whose integers a DequantizeLinear of it reads (the segment
    begins at a tensor the quantizer's input is paired with): where the activation is quantized, so where its
    range or scale is measured — and shown."""
    graph, inside = ctx.onnx.graph, {p.name for p in protos}
    found = []
    for p in protos:
        source = graph.node_of(p.input[0]) if p.op_type == "DequantizeLinear" else None
        if source is not None and source.op_type == "QuantizeLinear" and source.name not in inside:
            inside.add(source.name)
            found.append(ctx.node(source.name))
    return [p for p in found if p is not None]


def misread(ctx: DiagnosisContext, dq, candidates=None) -> Finding | None:
    """A quantized weight that, read as the file reads it, is not PyTorch's parameter within rounding, but read
    as its quantizer wrote it is: its per-channel scales applied along another axis of that length (the
    DequantizeLinear's ``axis``), or its integers' bytes (and zero point) read with the other signedness (int8
    written, uint8 read: every negative weight 256 steps too high).  Claimed only when the segment, re-run with
    PyTorch's weight in the quantized one's place, reproduces PyTorch's output."""
    q, scale = ctx.initializer(dq.input[0]), ctx.constant(dq.input[1])
    if q is None or scale is None or q.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or q.ndim == 0 \
            or q.size < 2:
        return None
    zp_name = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
    zp = ctx.constant(zp_name) if zp_name else np.zeros((), q.dtype)
    axis = attribute(dq, "axis", 1) % q.ndim
    candidates = layout.torch_candidates(ctx) if candidates is None else candidates  # once for every reading
    as_read = _reading(ctx, dq, q, scale, zp, axis, candidates)
    if as_read is not None and as_read[2] <= BEYOND_ROUNDING:
        return None  # the weight is PyTorch's: nothing misread
    other = np.int8 if q.dtype == np.uint8 else np.uint8
    readings = [(f"its per-channel scales applied along axis {axis} where they were computed along axis {a}",
                 {"axis": a}, q, zp, a) for a in range(q.ndim) if a != axis and scale.size > 1
                and q.shape[a] == scale.size]
    readings.append((f"its integers read as {np.dtype(other)}, the type its quantizer wrote them in (stored as "
                     f"{q.dtype}: the same bytes read {'unsigned' if q.dtype == np.uint8 else 'signed'})", {},
                     q.view(other),
                     zp.astype(q.dtype).view(other), axis))
    for text, attrs, q2, zp2, a in readings:
        found = _reading(ctx, dq, q2, scale, zp2, a, candidates)
        if found is None or found[2] > BEYOND_ROUNDING:
            continue
        name, _, _ = found
        summary = (f"The quantized weight '{dq.input[0]}' ({dq.name}) is not {name} within rounding as the file "
                   f"reads it, but is with {text}: read that way it lies within half a step of PyTorch's weight. "
                   "With PyTorch's weight in its place the segment reproduces PyTorch's output.")
        fix = ("Re-quantize the weight, or write the DequantizeLinear to read it as quantized: the same axis for "
               "the scales as the quantizer used, the integer type the quantizer wrote.")

        def restored(c: DiagnosisContext, value=found[1]) -> FixedSegment:
            # the reading is exact only to the quantizer's rounding: the re-run restores PyTorch's own weight
            model = edits.copy_model(c.onnx.skeleton)
            float_weight(model, dq.name, value)
            return FixedSegment(model, c.onnx.weights)
        if not ctx.reproduces(restored(ctx)):
            continue
        readers = tuple(ctx.onnx.graph.nodes[i].name for i in ctx.onnx.graph.consumers.get(dq.output[0], ()))
        return Finding(Cause.QUANTIZATION, 0.95, summary, fix,
                       {"initializer": dq.input[0], "parameter": name, "reading": text, "attributes": attrs},
                       changes=(dq.name, *readers), counterfactual=restored)
    return None


def _reading(ctx: DiagnosisContext, dq, q: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, candidates):
    """``(parameter, PyTorch value, fraction beyond half a step)`` of integers ``q`` dequantized with ``scale``
    and ``zp`` per slice along ``axis``; None when no parameter matches it."""
    w = dequantize(q, scale, zp, axis)
    match = _torch_weight(ctx, w, dq.input[0], candidates)
    if match is None:
        return None
    step = np.abs(dequantize(np.ones(q.shape, np.int8), scale, np.zeros(()), axis))  # each element's step
    half = 0.5 * step * (1 + 1e-3) + 1e-12
    low, high = RANGES[q.dtype]
    inside = (q != low) & (q != high)
    return match[0], match[1], float(np.mean((np.abs(w - match[1]) > half) & inside))


def _activations(ctx: DiagnosisContext, quantizers, absorbed: bool = True) -> list[dict]:
    """Each activation quantizer measured on the value it quantizes in the segment's run (``absorbed``: a range
    from 0 may be a ReLU the quantizer absorbed)."""
    values = ctx.run_segment(outputs=[q.input[0] for q in quantizers])
    acts = [_activation(ctx, q, values[q.input[0]], absorbed) for q in quantizers if q.input[0] in values]
    return [a for a in acts if a is not None]


def _reproduces(ctx: DiagnosisContext, protos, relu: set[str]) -> bool:
    """Whether the segment without its quantization (the quantizers in ``relu`` kept as a ReLU) reproduces
    PyTorch's output."""
    try:
        fixed = _dequantized(ctx, protos, relu)
    except Exception:  # noqa: BLE001 - a twin that cannot be made says nothing
        return False
    return ctx.reproduces(fixed)


def _absorbing_relu(ctx: DiagnosisContext, protos) -> set[str]:
    """The quantizers whose zero point at the bottom of the range clips like a Relu the graph folded into them."""
    return _relu_like(_activations(ctx, [p for p in protos if p.op_type == "QuantizeLinear"]))


def _relu_like(acts: list[dict]) -> set[str]:
    return {a["node"] for a in acts if a["acts_as_relu"]}


def _activation(ctx: DiagnosisContext, q, x: np.ndarray, absorbed: bool = True) -> dict | None:
    scale = ctx.constant(q.input[1])
    if scale is None or not np.issubdtype(x.dtype, np.floating):
        return None
    zp = ctx.constant(q.input[2]) if len(q.input) > 2 and q.input[2] else np.zeros((), np.uint8)
    lo_q, hi_q = RANGES.get(np.dtype(zp.dtype), (0, 255))
    axis = attribute(q, "axis", 1)
    shape = [1] * x.ndim
    if scale.size > 1:
        shape[axis % x.ndim] = scale.size
    s, z = scale.astype(np.float64).reshape(shape), zp.astype(np.float64).reshape(shape if zp.size > 1 else [1] * x.ndim)
    x64 = x.astype(np.float64)
    lo, hi = (lo_q - z) * s, (hi_q - z) * s
    # A range starting at 0 in front of a tensor that is non-negative in the reference is a ReLU the quantizer
    # absorbed (quantize_static fuses Conv+Relu this way): cutting the negatives there is the model, not clipping.
    relu = absorbed and bool(np.all(lo == 0)) and float(x64.min()) < 0 and _reference_nonnegative(ctx, q)
    below = np.zeros(x64.shape, bool) if relu else x64 < lo - 0.5 * s
    clipped = float(np.mean(below | (x64 > hi + 0.5 * s)))
    dq = (np.clip(np.round(x64 / s) + z, lo_q, hi_q) - z) * s
    return {"node": q.name, "tensor": q.input[0], "scale": float(scale.reshape(-1)[0]) if scale.size == 1 else scale.tolist(),
            "zero_point": int(zp.reshape(-1)[0]) if zp.size == 1 else zp.tolist(),
            "range": [float(np.min(lo)), float(np.max(hi))], "activation_range": [float(x64.min()), float(x64.max())],
            "clip_fraction": clipped, "sqnr_db": _sqnr(np.maximum(x64, 0) if relu else x64, dq),
            "acts_as_relu": relu}


def _reference_nonnegative(ctx: DiagnosisContext, q) -> bool:
    """Whether PyTorch's value after ``q`` is >= 0: the reference, where the DequantizeLinear after ``q`` computes
    the divergent tensor; inside the segment, the calibration's word (a range starting at exactly 0 in front of
    a tensor with negatives: the calibrator saw only the Relu's output, and the quantizer dropped the Relu)."""
    after = [ctx.onnx.graph.nodes[i] for i in ctx.onnx.graph.consumers.get(q.output[0], ())]
    if any(n.op_type == "DequantizeLinear" and n.outputs[0] == ctx.tensor for n in after):
        return float(np.min(ctx.reference)) >= 0
    return any(n.op_type == "DequantizeLinear" for n in after)


def _weight(ctx: DiagnosisContext, dq) -> dict | None:
    w = dequantized_weight(ctx, dq)
    if w is None:
        return None
    scale = ctx.constant(dq.input[1])
    match = _torch_weight(ctx, w, dq.input[0])
    if match is None:
        return {"initializer": dq.input[0], "per_channel": scale.size > 1, "sqnr_db": None}
    name, ref = match
    out = {"initializer": dq.input[0], "parameter": name, "per_channel": scale.size > 1, "sqnr_db": _sqnr(ref, w),
           "clip_fraction": weight_clip_fraction(ctx, dq, w, ref)}
    if scale.size == 1 and ref.ndim >= 2:
        out["sqnr_db_per_channel"] = max(_sqnr(ref, _symmetric(ref, a)) for a in (0, ref.ndim - 1))
    return out


def dequantized_weight(ctx: DiagnosisContext, dq) -> np.ndarray | None:
    """The float weight a DequantizeLinear of an integer initializer produces (None for activations)."""
    q = ctx.initializer(dq.input[0])
    scale = ctx.constant(dq.input[1])
    if q is None or scale is None or np.issubdtype(q.dtype, np.floating):
        return None
    zp = ctx.constant(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), q.dtype)
    return dequantize(q, scale, zp, attribute(dq, "axis", 1) % max(q.ndim, 1))


def dequantize(q: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> np.ndarray:
    """``(q − zp)·scale`` in float64, per slice along ``axis`` when the scale has more than one value."""
    shape = [1] * q.ndim
    if scale.size > 1:
        shape[axis] = scale.size
    return (q.astype(np.float64) - zp.astype(np.float64).reshape(shape if zp.size > 1 else [1] * q.ndim)) \
        * scale.astype(np.float64).reshape(shape)


def _scale_shape(dq, q: np.ndarray, scale: np.ndarray) -> list[int]:
    """The shape a DequantizeLinear's scale (or zero point) broadcasts to over ``q``: one value per slice
    along its axis, or one for all."""
    shape = [1] * q.ndim
    if scale.size > 1:
        shape[attribute(dq, "axis", 1) % q.ndim] = scale.size
    return shape


#: a quantized weight differs from PyTorch's when more of its elements than this lie beyond rounding's reach
BEYOND_ROUNDING = 0.01


def beyond_rounding(ctx: DiagnosisContext, dq, w: np.ndarray, ref: np.ndarray) -> float:
    """The fraction of a quantized weight's elements whose dequantized value ``w`` lies further from PyTorch's
    ``ref`` (in ``w``'s layout) than rounding to the grid explains (half a step), clipped elements aside: what
    quantizing PyTorch's weight cannot produce (a weight from another checkpoint, noise written into it)."""
    q, half_step = _half_step(ctx, dq)
    return float(np.mean((np.abs(w - ref) > half_step) & ~_at_bounds(ctx, dq, q)))


def _half_step(ctx: DiagnosisContext, dq) -> tuple[np.ndarray, np.ndarray]:
    """``(integers, half a quantization step)`` of a quantized weight, the step broadcast over the integers (a
    hair wider: rounding to the grid moves a value by at most half a step)."""
    q = ctx.initializer(dq.input[0])
    scale = np.abs(ctx.constant(dq.input[1]).astype(np.float64))
    return q, 0.5 * scale.reshape(_scale_shape(dq, q, scale)) * (1 + 1e-3) + 1e-12


def _at_bounds(ctx: DiagnosisContext, dq, q: np.ndarray) -> np.ndarray:
    """Where integer weights sit at their type's bounds — for a signed type with a zero point of 0 the symmetric
    ones too (±127: what a symmetric weight quantizer clamps to): values clipped there."""
    low, high = RANGES.get(q.dtype, (None, None))
    if low is None:
        return np.zeros(q.shape, bool)
    zp = ctx.constant(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    symmetric = low < 0 and (zp is None or not np.any(zp))
    return (q == low) | (q == high) | ((q == -high) if symmetric else False)


def weight_clip_fraction(ctx: DiagnosisContext, dq, w: np.ndarray, ref: np.ndarray) -> float:
    """The fraction of a quantized weight's elements clipped: at the integer bounds where PyTorch's value lies
    beyond them by more than half a step (the scale too small for the weight's range)."""
    q, half_step = _half_step(ctx, dq)
    return float(np.mean(_at_bounds(ctx, dq, q) & (np.abs(ref) > np.abs(w) + half_step)))


def dequantized_weights(ctx: DiagnosisContext) -> list[tuple[np.ndarray, object]]:
    """``(float weight, DequantizeLinear node)`` of the segment's integer initializers (an integer product's: the
    DequantizeLinear its weight stands for)."""
    out = []
    dequantizers = [p for p in ctx.segment_protos if p.op_type == "DequantizeLinear"]
    for dq in dequantizers + [product.dequantizer for product in integer_products(ctx)]:
        w = dequantized_weight(ctx, dq)
        if w is not None and w.size >= 2:
            out.append((w, dq))
    return out


def float_weight(model, dq_name: str, value: np.ndarray) -> None:
    """Make node ``dq_name`` (a DequantizeLinear of a weight) hand on ``value`` in float (in place on a copy)."""
    _identity(model, dq_name, edits.add_initializer(model, f"{dq_name}_float_weight", value.astype(np.float32)))


def _torch_weight(ctx: DiagnosisContext, w: np.ndarray, initializer: str = "", candidates=None):
    """``(name, PyTorch value in w's layout)`` of the parameter (or Conv + BatchNorm fold) ``w`` quantizes: the
    one the quantized initializer is named after (whatever its values: they may be another checkpoint's), else
    the closest strongly correlated one."""
    best = None
    named = layout.float_name(initializer)
    for name, tensor in (layout.torch_candidates(ctx) if candidates is None else candidates).items():
        rel = layout.relate(w, tensor)
        if rel is None:
            continue
        if name == named:
            return name, rel.layout.apply(tensor, w.shape)
        if rel.correlation > 0.9 and (best is None or rel.rel_l2 < best[0]):
            best = (rel.rel_l2, name, rel.layout.apply(tensor, w.shape))
    return None if best is None else best[1:]


def _op_value(ctx: DiagnosisContext, dq, w: np.ndarray) -> np.ndarray | None:
    """The value of a PyTorch op (``ctx.ops``) that a quantized constant no parameter holds rounds (an exporter
    folded a computed position bias into an initializer, which the quantizer then quantized), in ``w``'s shape;
    None when no op's value of that size lies within rounding of it."""
    for op in ctx.ops:
        if op.value.size != w.size or op.value.dtype.kind != "f":
            continue
        ref = np.asarray(op.value, dtype=np.float64).reshape(w.shape)
        rel = layout.relate(w, ref)
        # within rounding, and the same values: a step as wide as a mask's range (0 or the float minimum) puts
        # anything within half a step
        if (rel is not None and rel.correlation > 0.9 and rel.rel_l2 < 0.1 and informative(ref)
                and beyond_rounding(ctx, dq, w, ref) <= BEYOND_ROUNDING):
            return ref
    return None


def _symmetric(w: np.ndarray, axis: int) -> np.ndarray:
    """``w`` through symmetric int8 quantization with one scale per slice along ``axis``."""
    amax = np.max(np.abs(w), axis=tuple(i for i in range(w.ndim) if i != axis), keepdims=True)
    s = np.where(amax > 0, amax / 127.0, 1.0)
    return np.clip(np.round(w / s), -127, 127) * s


def _sqnr(ref: np.ndarray, approx: np.ndarray) -> float:
    noise = float(np.sum((ref - approx) ** 2))
    signal = float(np.sum(ref ** 2))
    return float("inf") if noise == 0 else (float(10 * np.log10(signal / noise)) if signal > 0 else float("-inf"))


def _advice(acts: list[dict], weights: list[dict], compute: list[str], dynamic: bool = False) -> str:
    steps, quantizer = [], "quantize_dynamic" if dynamic else "quantize_static"
    if any(a["clip_fraction"] > 0.01 for a in acts):
        worst = max(acts, key=lambda a: a["clip_fraction"])
        steps.append(f"recalibrate: {worst['node']}'s range clips {worst['clip_fraction']:.1%} of the activation "
                     "(calibrate on representative data; CalibrationMethod.Percentile or Entropy)")
    elif any(a["sqnr_db"] < 30 for a in acts):
        steps.append("use a tighter calibration (CalibrationMethod.Percentile) or 16-bit activations: the range is "
                     "wide for the values")
    if any(w.get("clip_fraction", 0) > 0.001 for w in weights):
        worst = max(weights, key=lambda w: w.get("clip_fraction", 0))
        steps.append(f"requantize {worst['initializer']} with a scale that covers its range (max |w| / 127 for int8: "
                     f"{worst['clip_fraction']:.1%} of it clips now)")
    if any(w.get("sqnr_db_per_channel") and w["sqnr_db"] is not None and w["sqnr_db_per_channel"] > w["sqnr_db"] + 3
           for w in weights):
        steps.append(f"quantize weights per channel ({quantizer}(..., per_channel=True))")
    steps.append(f"or keep {', '.join(compute) or 'this node'} in float: {quantizer}(..., nodes_to_exclude="
                 f"{compute or ['<node>']})")
    text = "; ".join(steps)
    return text[0].upper() + text[1:] + "."


def _dequantized(ctx: DiagnosisContext, protos, relu: set[str] = frozenset(),
                 values: dict[str, np.ndarray] | None = None) -> FixedSegment:
    """The segment with its activation Q/DQ pairs made identities (a Relu where the pair absorbed one) and its
    quantized weights replaced by PyTorch's (or the reference model's) where rounding explains the difference
    (dynamic quantization's integer products computed in float; ``values``: float weights to use for given
    integer initializers of those)."""
    model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
    own = _pytorchs_own(ctx, protos)
    for q in (p for p in protos if p.op_type == "QuantizeLinear"):
        for i in ctx.onnx.graph.consumers.get(q.output[0], ()):
            if ctx.onnx.graph.nodes[i].op_type == "DequantizeLinear" and ctx.onnx.graph.nodes[i].name not in own:
                _identity(model, ctx.onnx.graph.nodes[i].name, q.input[0], "Relu" if q.name in relu else "Identity")
    inside = {p.name for p in protos}
    for dq in (p for p in protos if p.op_type == "DequantizeLinear" and p.name not in own):
        q = ctx.onnx.graph.node_of(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and q.name not in inside and q.inputs:
            # the segment reads a value quantized upstream: it reads the float value instead
            _identity(model, dq.name, q.inputs[0], "Relu" if q.name in relu else "Identity")
            continue
        w = dequantized_weight(ctx, dq)
        match = _torch_weight(ctx, w, dq.input[0]) if w is not None else None
        if match is not None and beyond_rounding(ctx, dq, w, match[1]) <= BEYOND_ROUNDING:
            # (a weight rounding cannot explain stays as the file has it: that error is no quantization's)
            float_weight(model, dq.name, match[1])
        elif w is not None and (value := _op_value(ctx, dq, w)) is not None:
            float_weight(model, dq.name, value)
    _integer_products_in_float(ctx, model, protos, values or {})
    return FixedSegment(model, weights)


#: PyTorch ops that quantize a value themselves (quantization-aware training's fake quantization, a model that
#: quantizes and dequantizes on its own)
TORCH_QUANTIZERS = ("aten.fake_quantize", "aten._fake_quantize", "aten.dequantize", "quantized_decomposed.dequantize")


def _pytorchs_own(ctx: DiagnosisContext, protos) -> set[str]:
    """The segment's DequantizeLinear nodes whose value PyTorch computes too, by a quantizer of its own (a
    quantization-aware model's fake quantization): the model's quantization, which the float computation the
    twin stands for keeps — its weight or activation rounded as PyTorch rounds it."""
    quantizers = [op for op in ctx.ops if op.module_type.startswith(TORCH_QUANTIZERS) and op.value.dtype.kind == "f"]
    dqs = [p for p in protos if p.op_type == "DequantizeLinear"]
    if not quantizers or not dqs:
        return set()
    values = ctx.computed([dq.output[0] for dq in dqs])
    own = set()
    for dq in dqs:
        v = values.get(dq.output[0])
        if v is None and (w := dequantized_weight(ctx, dq)) is not None:
            v = w
        if v is not None and any(op.value.size == v.size and ctx.compare(
                v, np.asarray(op.value, dtype=v.dtype).reshape(v.shape)).ok for op in quantizers):
            own.add(dq.name)
    return own


#: dynamic quantization's integer products and the float op each approximates
INTEGER_PRODUCTS = {"ConvInteger": "Conv", "MatMulInteger": "MatMul"}


@dataclass(frozen=True)
class IntegerProduct:
    """A ConvInteger / MatMulInteger that dynamic quantization made: DynamicQuantizeLinear on its input (``source``
    reads the float value), the integer product, a Cast, then ``rescale`` (a Mul by the input's and the weight's
    scales); ``dequantizer`` is the DequantizeLinear its integer weight stands for."""

    op: object
    source: object
    rescale: object
    dequantizer: onnx.NodeProto


def integer_products(ctx: DiagnosisContext, protos=None) -> list[IntegerProduct]:
    """The segment's integer products of dynamic quantization (of ``protos`` when given)."""
    out = []
    for op in (p for p in (ctx.segment_protos if protos is None else protos) if p.op_type in INTEGER_PRODUCTS):
        source, rescale = ctx.onnx.graph.node_of(op.input[0]), _rescaling(ctx, op)
        weight = ctx.initializer(op.input[1])
        if source is None or source.op_type != "DynamicQuantizeLinear" or rescale is None or weight is None:
            continue
        mul, w_scale = rescale
        zero_point = [op.input[3]] if len(op.input) > 3 and op.input[3] else []
        dq = onnx.helper.make_node("DequantizeLinear", [op.input[1], w_scale, *zero_point], [f"{op.name}_w"],
                                   name=f"{op.name}_w", axis=0 if op.op_type == "ConvInteger" else weight.ndim - 1)
        out.append(IntegerProduct(op, source, mul, dq))
    return out


def _integer_products_in_float(ctx: DiagnosisContext, model, protos, values: dict[str, np.ndarray]) -> None:
    """Each integer product of the segment computed in float: the Mul that rescales it becomes the float op on the
    unquantized input and the weight — ``values``' where given (by integer initializer), else PyTorch's where
    rounding explains the file's, else the file's dequantized (in place on a copy)."""
    for product in integer_products(ctx, protos):
        op, dq = product.op, product.dequantizer
        value = values.get(op.input[1])
        if value is None:
            w = dequantized_weight(ctx, dq)
            match = _torch_weight(ctx, w, op.input[1])
            value = match[1] if match is not None and beyond_rounding(ctx, dq, w, match[1]) <= BEYOND_ROUNDING else w
        node = edits.node(model, product.rescale.name)
        node.op_type, node.domain = INTEGER_PRODUCTS[op.op_type], ""
        del node.input[:]
        node.input.extend([product.source.inputs[0],
                           edits.add_initializer(model, f"{op.name}_float_weight", value.astype(np.float32))])
        del node.attribute[:]
        node.attribute.extend(op.attribute)


def _rescaling(ctx: DiagnosisContext, op):
    """``(Mul node, weight scale)``: the Mul scaling integer product ``op``'s cast result by the product of the
    input's and the weight's scales, and the weight scale's name; None when the graph does not read so."""
    g = ctx.onnx.graph
    for cast in (g.nodes[i] for i in g.consumers.get(op.output[0], ())):
        if cast.op_type != "Cast":
            continue
        for mul in (g.nodes[i] for i in g.consumers.get(cast.outputs[0], ())):
            if mul.op_type != "Mul":
                continue
            scales = next((g.node_of(x) for x in mul.inputs if x != cast.outputs[0]), None)
            if scales is not None and scales.op_type == "Mul":
                w_scale = next((x for x in scales.inputs if ctx.constant(x) is not None), None)
                if w_scale is not None:
                    return mul, w_scale
    return None


def _identity(model, node_name: str, source: str, op_type: str = "Identity") -> None:
    """Turn node ``node_name`` into ``Identity(source)`` (or another one-input op), keeping its output (in place on
    a copy)."""
    node = edits.node(model, node_name)
    node.op_type, node.domain = op_type, ""
    del node.input[:]
    node.input.append(source)
    del node.attribute[:]


def float_twin(ctx: DiagnosisContext, values: dict[str, np.ndarray] | None = None,
               relu_judged: bool = False) -> FixedSegment | None:
    """The model with the segment's quantization undone (its activation Q/DQ pairs made identities, its quantized
    weights replaced by PyTorch's, its integer products computed in float — with ``values``' weights where given):
    the float computation the quantized segment approximates, whose tensors pair with PyTorch's ops at float
    noise.  None when the segment holds no Q/DQ node.  A quantizer whose range from 0 clips like a ReLU stays a
    ReLU, unless ``relu_judged`` and only the twin without it reproduces PyTorch's output (no ReLU of PyTorch's
    was absorbed there: the quantizer clips, and the twin is the computation without it)."""
    protos = [p for p in ctx.segment_protos if p.op_type in QUANT_OPS]
    if not protos:
        return None
    relu = _absorbing_relu(ctx, protos)
    twin = _dequantized(ctx, protos, relu, values)
    if relu and relu_judged and not ctx.reproduces(twin):
        plain = _dequantized(ctx, protos, set(), values)
        if ctx.reproduces(plain):
            return plain
    return twin


def explained_by_quantization(ctx: DiagnosisContext) -> bool:
    """Whether the segment's own error is its quantization: with its activation Q/DQ pairs made identities and
    its quantized weights replaced by PyTorch's, re-run from the same PyTorch inputs, it agrees (a clean
    quantized model's layers differ from PyTorch by that much, and that is no fault)."""
    try:
        fixed = float_twin(ctx)
    except Exception:  # noqa: BLE001 - a twin that cannot be made explains nothing
        return False
    return fixed is not None and ctx.reproduces(fixed)


def clips(ctx: DiagnosisContext) -> bool:
    """Whether one of the segment's quantizers clips its activation as a scale calibrated too small does: a
    share of :data:`CLIPPING_SHARE` or more cut, by :data:`OVERSHOOT` of the range or more (rounding alone clips
    nothing; another input than the calibration's may graze the range).  A constant's quantizer is left out: it
    rounds one fixed value (an epsilon of 1e-5 to zero), calibrated on no input."""
    quantizers = [p for p in ctx.segment_protos if p.op_type == "QuantizeLinear" and ctx.constant(p.input[0]) is None]
    if not quantizers:
        return False
    try:
        acts = _activations(ctx, quantizers)
    except Exception:  # noqa: BLE001 - a segment that cannot be re-run clips nothing we can see
        return False
    return any(a["clip_fraction"] >= CLIPPING_SHARE and _overshoot(a) > OVERSHOOT for a in acts)


#: a quantizer clipping this share of its activation may be a fault
CLIPPING_SHARE = 0.05
#: how far (a share of the quantization range) an activation must reach beyond the range for its clipping to be
#: a scale calibrated too small, not the extremes of another input than the calibration's grazing the range
OVERSHOOT = 0.25


def _overshoot(act: dict) -> float:
    """How far the activation reaches beyond the quantizer's range, as a share of the range (a Relu's cut — a
    range from 0 — aside)."""
    lo, hi = act["range"]
    a_lo, a_hi = act["activation_range"]
    width = max(hi - lo, 1e-30)
    below = 0.0 if act["acts_as_relu"] else (lo - a_lo) / width
    return max((a_hi - hi) / width, below)
