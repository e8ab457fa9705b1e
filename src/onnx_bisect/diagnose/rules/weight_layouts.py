"""Weight readings of a parameter's own numbers in another place: relaid (transposed, flipped, reversed),
rearranged (channels permuted), offset by one (a ``1 + weight`` scale), or another module's (weights exchanged)."""
from __future__ import annotations

import enum

import numpy as np

from ..support import edits, layout
from ..support.alternative_edits import with_inputs
from ...records import Cause, Layout
from ...records.nest import to_numpy
from ...records.graph import PRODUCT_OPS
from ..context import DiagnosisContext, Finding, FixedSegment, attribute
from . import attribute_mismatch
from .weight_params import (MAX_SWAPS, bias_input, concatenated_parameters, model_arrays, nearest_parameter,
                            output_axis, own_tensors, parameters_sized, readers_own, segment_initializers,
                            weight_readers)


#: ops whose weight (second input) may have been written with its first two axes swapped
SWAPPABLE = PRODUCT_OPS


#: a weight this close to its own transpose (relative L2) is symmetric: swapping it changes nothing to speak of
SYMMETRIC = 0.05


class Relayout(enum.Enum):
    """Another layout a weight may have been written in."""

    SWAPPED = "first two axes swapped"
    FLIPPED = "spatial axes flipped"
    REVERSED = "reversed along an axis"
    TRANSPOSED = "spatial axes exchanged"


def _relay(value: np.ndarray, how: Relayout, axis: int | None) -> np.ndarray:
    """``value`` laid out back from ``how`` (``axis``: the reversed one)."""
    if how is Relayout.SWAPPED:
        return np.swapaxes(value, 0, 1)
    if how is Relayout.TRANSPOSED:
        return np.swapaxes(value, -1, -2)
    return np.flip(value, _spatial(value) if how is Relayout.FLIPPED else axis)


def relaid(ctx: DiagnosisContext) -> Finding | None:
    """A weight in another layout than the node reads: a square weight with its first two axes swapped (a matrix
    transposed, a Conv kernel's input and output channels exchanged — a layout bug of an exporter, a converter or
    a loader), or a convolution kernel flipped along its spatial axes (a convolution taken for a correlation by
    a converter).  Its values pair with a PyTorch tensor (in some layout) or with none (a folded BatchNorm), so
    nothing above differs, yet laid out back the segment reproduces PyTorch.  Only a layout confirmed that way
    is named."""
    tried: dict[Relayout, int] = {}
    for name, value, how, axis in _relaid_weights(ctx):
        if tried.get(how, 0) >= MAX_SWAPS:
            continue
        relaid = _relay(value, how, axis)
        # a weight holding no PyTorch tensor's numbers (a BatchNorm folded into a Conv's kernel) is still tried:
        # its layout reproducing PyTorch is the evidence (no weight but a re-laid one does that)
        tried[how] = tried.get(how, 0) + 1
        if ctx.reproduces(_replaced(ctx, {name: relaid})):
            return _relaid_finding(ctx, name, value, how, axis, relaid)
    return None


def _relaid_finding(ctx: DiagnosisContext, name: str, value: np.ndarray, how: Relayout, axis: int | None,
                    relaid: np.ndarray) -> Finding:
    if how is Relayout.REVERSED:
        what = ("channels along axis 1 (a Conv's input channels, a ConvTranspose's output channels)"
                if axis == 1 and value.ndim >= 3 else "elements")
        summary = (f"The constant '{name}' {tuple(value.shape)} holds the right numbers, but its {what} in reversed "
                   f"order: reversed back, the segment reproduces PyTorch's output.")
        fix = ("Write the constant in the model's channel order: a converter or preprocessing change reversed it (an "
               "RGB model's first convolution given BGR weights, a per-channel bias or scale written backwards).")
        layout_text, confidence = f"reversed along axis {axis}", 0.9
    elif how is Relayout.TRANSPOSED:
        summary = (f"The convolution kernel '{name}' {tuple(value.shape)} holds the right numbers, but with its two "
                   "spatial axes exchanged: transposed back, the segment reproduces PyTorch's output.")
        fix = ("Write the kernel as [out, in/groups, height, width]: a converter or a loader took a [kw, kh] kernel "
               "for [kh, kw] — check the conversion step.")
        layout_text, confidence = how.value, 0.9
    elif how is Relayout.FLIPPED:
        summary = (f"The convolution kernel '{name}' {tuple(value.shape)} holds the right numbers, but flipped along "
                   f"its spatial axes {list(_spatial(value))}: flipped back, the segment reproduces PyTorch's output.")
        fix = ("Write the kernel unflipped: ONNX Conv (like PyTorch) computes a cross-correlation; a converter "
               "from a framework that convolves (flips) must not flip it again — check the conversion step.")
        layout_text, confidence = how.value, 0.9
    else:
        what = "matrix is transposed" if value.ndim == 2 else "kernel has its output and input channels exchanged"
        summary = (f"The weight '{name}' {tuple(value.shape)} holds the right numbers, but its {what}: with its "
                   "first two axes swapped back the segment reproduces PyTorch's output.")
        fix = ("Write the weight in the layout the node expects (ONNX MatMul takes x @ B, so a Linear's weight goes "
               "in transposed; Gemm says so with transB; a Conv kernel is [out, in/groups, ...]) — check the "
               "converter or the code that copied the weights in.")
        layout_text = how.value
        # a Gemm says how it reads its weight (transA/transB): the attribute rule's flip explains the same numbers.
        # Between the two, the file's other Gemms tell (attribute_mismatch._trans_confidence): a Gemm reading its
        # weight as they do has the odd weight, one that does not has the odd attribute — this ranks between
        confidence = 0.9
        gemm = next((p for p in ctx.segment_protos if p.op_type in ("Gemm", "FusedGemm") and name in p.input), None)
        if gemm is not None:
            confidence = 0.85
            summary += (" Equivalently, the Gemm reading it could flip its transB: the same numbers" + (
                "; the file's other Gemms read their weights as this one does, so the weight is the odd one."
                if attribute_mismatch.gemm_conforms(ctx, gemm.name) else "; the file cannot tell the two apart."))
    return Finding(Cause.WEIGHT_MISMATCH, confidence, summary, fix,
                   {"parameters": [{"initializer": name, "layout": layout_text}]},
                   changes=weight_readers(ctx, [name]),
                   counterfactual=lambda c, n=name, v=relaid: FixedSegment(
                       *edits.replace_array(edits.copy_model(c.onnx.skeleton), c.onnx.weights, n, v)))


#: weights whose numbers are a parameter's own rearranged, tried per diagnosis
MAX_REARRANGED = 4


def rearranged(ctx: DiagnosisContext) -> Finding | None:
    """A weight holding exactly a PyTorch parameter's numbers, arranged otherwise than any transpose of it: a
    kernel stored in another framework's layout and reshaped where a transpose belongs (``[in, out]`` read as
    ``[out, in]``, HWIO as OIHW), or its output channels permuted (a converter's rotary head permutation applied
    to a checkpoint that had it already) — with the bias that goes with them.  Laid out as the parameter is for
    the node (MatMul reads it transposed), and the bias permuted back alike, the segment must reproduce PyTorch:
    only a confirmed arrangement is named.  The parameters compared are those of the divergent module (all of
    them for the root), same size, same sum first: no sort of the whole model's weights."""
    tried = 0
    for proto in ctx.segment_protos:
        name = proto.input[1] if proto.op_type in PRODUCT_OPS and len(proto.input) > 1 else None
        value = ctx.initializer(name) if name else None
        if value is None or value.dtype.kind != "f" or value.ndim < 2 or value.size < 4 or tried >= MAX_REARRANGED:
            continue
        for param, tensor in _same_numbers(ctx, value):
            if any(np.array_equal(laid, value) for laid in _layouts_for(tensor, value.shape)) or (
                    tensor.ndim == value.ndim and np.array_equal(np.swapaxes(tensor, 0, 1), value)):
                continue  # PyTorch's layout, or its first two axes swapped (the relaid reading)
            for laid in _layouts_for(tensor, value.shape):
                tried += 1
                fixed, permuted = _with_bias_unpermuted(ctx, proto, value, laid)
                if ctx.reproduces(_replaced(ctx, fixed)):
                    reshaped = any(np.allclose(value, t.reshape(value.shape), rtol=1e-5) for t in (tensor, tensor.T))
                    return _rearranged_finding(ctx, name, value, param, fixed, permuted, reshaped)
    return None


#: the parameters compared with a weight's sorted numbers: at most this many elements in all
MAX_REARRANGED_ELEMENTS = 50_000_000


def _same_numbers(ctx: DiagnosisContext, value: np.ndarray):
    """``(parameter, tensor rounded to the file's type)`` for the divergent module's parameters (every one's, for
    the root) holding exactly ``value``'s numbers in some order, rounded to the file's type: same size and sum
    (float32 sums of one multiset may differ by rounding: compared loosely) before the full sort."""
    module = ctx.layer.pair.activation.module
    arrays = {n: t for n, t in model_arrays(ctx).items() if t.size == value.size and t.ndim >= 2
              and (not module or ctx.owns(module, n))}
    if sum(t.size for t in arrays.values()) > MAX_REARRANGED_ELEMENTS:
        return
    total, ordered = float(np.sum(value, dtype=np.float64)), None
    scale = float(np.sum(np.abs(value), dtype=np.float64)) + 1e-12
    for param, tensor in arrays.items():
        stored = tensor.astype(value.dtype)  # as the file stores it (a float16 file rounds every weight)
        if abs(float(np.sum(stored, dtype=np.float64)) - total) > 1e-6 * scale:
            continue
        ordered = np.sort(value.ravel()) if ordered is None else ordered
        if np.array_equal(np.sort(stored.ravel()), ordered):
            yield param, stored
    # a Conv's weight with the BatchNorm after it folded in (HWIO reshaped as OIHW after the fold): the fold's
    # numbers as an exporter computes them, equal up to rounding
    ordered = np.sort(value.ravel()) if ordered is None else ordered
    for conv_name, conv, bn_name, bn in layout.conv_bn_pairs(ctx):
        weight, _ = layout.fold_arrays(conv, bn)
        if weight.size != value.size:
            continue
        stored = weight.astype(value.dtype)
        if np.allclose(np.sort(stored.ravel()), ordered, rtol=1e-5, atol=1e-7 * (np.abs(ordered).max() + 1e-30)):
            yield f"fold({conv_name}.weight, {bn_name})", stored


def _layouts_for(tensor: np.ndarray, shape: tuple) -> list[np.ndarray]:
    """``tensor`` in the layouts a node of weight shape ``shape`` may read it: as it is, or transposed (a matrix)."""
    found = [tensor.reshape(shape)] if tensor.shape == tuple(shape) else []
    if tensor.ndim == 2 and tensor.T.shape == tuple(shape):
        found.append(np.ascontiguousarray(tensor.T))
    return found


def _with_bias_unpermuted(ctx: DiagnosisContext, proto, value: np.ndarray, laid: np.ndarray) -> tuple[dict, bool]:
    """``({initializer: value}, permuted)``: the weight laid out as PyTorch's, and — when the file's weight is
    PyTorch's with its output channels permuted — the product's own bias (a Conv's / Gemm's third input, or the
    constant an Add right after a MatMul adds) permuted back alike."""
    name = proto.input[1]
    fixed = {name: laid}
    axis = output_axis(proto, value)
    perm = _channel_permutation(np.moveaxis(value, axis, 0), np.moveaxis(laid, axis, 0))
    if perm is None:
        return fixed, False
    bias = bias_input(ctx, proto)
    value_b = ctx.initializer(bias) if bias else None
    if value_b is not None and value_b.dtype.kind == "f" and value_b.size == len(perm):
        fixed[bias] = value_b.reshape(-1)[np.argsort(perm)].reshape(value_b.shape)
    return fixed, True


def _channel_permutation(have: np.ndarray, want: np.ndarray) -> np.ndarray | None:
    """``perm`` with ``have[k] == want[perm[k]]`` for every channel (axis 0), None when no exact one exists or it is
    the identity."""
    index: dict[bytes, list[int]] = {}
    for k in range(want.shape[0]):
        index.setdefault(np.ascontiguousarray(want[k]).tobytes(), []).append(k)
    perm = []
    for k in range(have.shape[0]):
        slot = index.get(np.ascontiguousarray(have[k]).tobytes())
        if not slot:
            return None
        perm.append(slot.pop(0))
    perm = np.array(perm)
    return None if np.array_equal(perm, np.arange(len(perm))) else perm


def _rearranged_finding(ctx: DiagnosisContext, name: str, value: np.ndarray, param: str, fixed: dict,
                        permuted: bool, reshaped: bool) -> Finding:
    biases = [n for n in fixed if n != name]
    how = ("its output channels permuted" + (" (and the bias " + ", ".join(f"'{b}'" for b in biases) + " alike)"
                                             if biases else "") if permuted else
           "arranged otherwise (not a transpose of it: a reshape where a transpose belongs)" if reshaped else
           "its elements in another order (no transpose, reshape or channel permutation of it)")
    exactly = ", up to rounding, the numbers of PyTorch's layer with its BatchNorm folded in," if param.startswith(
        "fold(") else " exactly the numbers of PyTorch's"
    summary = (f"The weight '{name}' {tuple(value.shape)} holds{exactly} {param}, but {how}: "
               f"laid out as {param} is for this node, the segment reproduces PyTorch's output.")
    fix = ("Write the weight from the checkpoint in the node's layout (ONNX MatMul takes x @ B, so a Linear's weight "
           "goes in transposed; a Conv kernel is [out, in/groups, kh, kw]): a converter reshaped a kernel of another "
           "layout, or permuted channels (a rotary head permutation applied twice, a channel order) — check it.")
    return Finding(Cause.WEIGHT_MISMATCH, 0.9, summary, fix,
                   {"parameters": [{"initializer": name, "parameter": param, "layout": "rearranged",
                                    "also_fixed": biases}]},
                   changes=weight_readers(ctx, list(fixed)),
                   counterfactual=lambda c, f=fixed: _replaced(c, f))


def _replaced(ctx: DiagnosisContext, fixed: dict) -> FixedSegment:
    model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
    for n, v in fixed.items():
        model, weights = edits.replace_array(model, weights, n, v)
    return FixedSegment(model, weights)


def _spatial(value: np.ndarray) -> tuple[int, ...]:
    return tuple(a for a in range(2, value.ndim) if value.shape[a] > 1)


def _relaid_weights(ctx: DiagnosisContext):
    """``(initializer, value, Relayout, reversed axis or None)``: the square weights, the convolution kernels with
    a spatial extent, then the kernels' input channels and the per-channel vectors in reversed order (none
    symmetric under the change)."""
    yield from ((name, value, Relayout.SWAPPED, None) for name, value in _square_weights(ctx))
    yield from _flipped_kernels(ctx)
    yield from _reversible(ctx)


def _reversible(ctx: DiagnosisContext):
    """Kernels whose input channels (axis 1), and 1-D constants of the segment's nodes (biases, scales), reversed
    order would change: an RGB model given BGR weights, a per-channel constant written backwards."""
    seen = set()
    for p in ctx.segment_protos:
        for k, t in enumerate(p.input):
            name = _stored_weight(ctx, t) if t else None
            value = ctx.initializer(name) if name and name not in seen else None
            if value is None or value.dtype.kind != "f" or value.size < 2:
                continue
            if p.op_type in ("Conv", "ConvTranspose", "FusedConv") and k == 1 and value.ndim >= 3:
                axis = 1
            elif value.size == max(value.shape):  # a vector, perhaps shaped to broadcast ([C, 1, 1])
                axis = int(np.argmax(value.shape))
            else:
                continue
            if value.shape[axis] < 2:
                continue
            v = value.astype(np.float64)
            norm = float(np.linalg.norm(v))
            if norm > 0 and float(np.linalg.norm(v - np.flip(v, axis))) > SYMMETRIC * norm:
                seen.add(name)
                yield name, value, Relayout.REVERSED, axis


def _flipped_kernels(ctx: DiagnosisContext):
    """The convolution kernels with a spatial extent, not symmetric under a flip of it (and the square 2-D ones not
    symmetric under an exchange of their spatial axes)."""
    for p in ctx.segment_protos:
        if p.op_type not in ("Conv", "ConvTranspose", "FusedConv") or len(p.input) < 2:
            continue
        name = _stored_weight(ctx, p.input[1])
        value = ctx.initializer(name) if name else None
        if value is None or value.ndim < 3 or not _spatial(value) or value.dtype.kind not in "fiu":
            continue
        v = value.astype(np.float64)
        norm = float(np.linalg.norm(v))
        if norm > 0 and float(np.linalg.norm(v - np.flip(v, _spatial(value)))) > SYMMETRIC * norm:
            yield name, value, Relayout.FLIPPED, None
        # a square 2-D kernel stored [kw, kh] and read [kh, kw] (a converter from a width-first framework)
        if value.ndim == 4 and value.shape[2] == value.shape[3] > 1 \
                and float(np.linalg.norm(v - np.swapaxes(v, -1, -2))) > SYMMETRIC * norm:
            yield name, value, Relayout.TRANSPOSED, None


def _square_weights(ctx: DiagnosisContext):
    """``(initializer, value)`` of the segment's weights with equal first two axes that are not symmetric."""
    for p in ctx.segment_protos:
        if p.op_type not in SWAPPABLE or len(p.input) < 2:
            continue
        name = _stored_weight(ctx, p.input[1])
        value = ctx.initializer(name) if name else None
        if value is None or value.ndim < 2 or value.shape[0] != value.shape[1] or value.shape[0] < 2 \
                or value.dtype.kind not in "fiu":
            continue
        v = value.astype(np.float64)
        norm = float(np.linalg.norm(v))
        if norm == 0 or float(np.linalg.norm(v - np.swapaxes(v, 0, 1))) <= SYMMETRIC * norm:
            continue
        yield name, value


def _stored_weight(ctx: DiagnosisContext, tensor: str) -> str | None:
    """The initializer behind a node's weight input: itself, or the integers a DequantizeLinear with one scale
    for the whole tensor reads (their axes swap with the dequantized ones)."""
    if ctx.initializer(tensor) is not None:
        return tensor
    info = ctx.onnx.graph.node_of(tensor)
    if info is None or info.op_type != "DequantizeLinear" or len(info.inputs) < 2:
        return None
    scale = ctx.constant(info.inputs[1])
    return info.inputs[0] if scale is not None and scale.size == 1 and ctx.initializer(info.inputs[0]) is not None \
        else None


#: normalizations and the input position of their scale
NORM_SCALES = {"LayerNormalization": 1, "SimplifiedLayerNormalization": 1, "GroupNormalization": 1,
               "InstanceNormalization": 1, "BatchNormalization": 1, "SkipLayerNormalization": 2,
               "SkipSimplifiedLayerNormalization": 2, "RMSNormalization": 1}


def norm_scales(ctx: DiagnosisContext) -> set[str]:
    return {p.input[k] for p in ctx.segment_protos if (k := NORM_SCALES.get(p.op_type)) is not None and len(p.input) > k}


def scale_offset(ctx: DiagnosisContext) -> Finding | None:
    """A normalization's constant scale off by one: models store ``weight`` and multiply by ``1 + weight``
    (Gemma's RMSNorm, Nemotron's LayerNorm1P) or apply no scale at all (a non-parametric LayerNorm), and an
    exporter or converter that loses or doubles the ``1 +`` writes a scale equal to a parameter — nothing above
    differs.  Tried: the scale minus one, plus one, and ones; named only when the segment then reproduces
    PyTorch."""
    for p in ctx.segment_protos:
        k = NORM_SCALES.get(p.op_type)
        value = ctx.constant(p.input[k]) if k is not None and len(p.input) > k and p.input[k] else None
        if value is None or value.dtype.kind != "f":
            continue
        tries = [("minus one", value - 1), ("plus one", value + 1)]
        tries += [] if np.all(value == 1) else [("ones (no scale)", np.ones_like(value))]
        for how, new in tries:
            fix = with_inputs(p.name, {k: new.astype(value.dtype)})
            try:
                values = ctx.run_segment(*fix(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights))
            except Exception:  # noqa: BLE001 - a value the runtime rejects is not the answer
                continue
            if not ctx.compare(values[ctx.tensor], ctx.reference).ok:
                continue
            summary = (f"The scale '{p.input[k]}' {tuple(value.shape)} of {p.op_type} {p.name} is off by one: with "
                       f"the scale {how} the segment reproduces PyTorch's output. The model multiplies by "
                       "`1 + weight` (or by no weight) and the file's constant lost or doubled the `1 +`.")
            advice = ("Export the scale the norm applies (1 + weight where the module adds one, ones where it has "
                      "no weight): check the converter's or the export code's handling of this norm's weight.")
            return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, advice,
                           {"parameters": [{"initializer": p.input[k], "layout": f"scale {how}"}]},
                           changes=(p.name,),
                           counterfactual=lambda c, f=fix: FixedSegment(
                               *f(edits.copy_model(c.onnx.skeleton), c.onnx.weights)))
    return None


def exchanged(ctx: DiagnosisContext, candidates) -> Finding | None:
    """An initializer holding exactly another module's parameter where the segment's module has one of its size
    with other numbers: with the module's own put back (in the same layout) the segment reproduces PyTorch — two
    layers' weights exchanged, a loader or converter matching parameters by shape."""
    tried = 0
    for name in segment_initializers(ctx):
        value = ctx.initializer(name)
        if value is None or value.dtype.kind != "f" or value.size < 4:
            continue
        own = readers_own(ctx, candidates, value.size, name) or own_tensors(ctx, candidates, value.size)
        if not own or any((r := layout.relate(value, v)) is not None and r.equal for v in own.values()):
            continue
        elsewhere = nearest_parameter(value, name, {**parameters_sized(ctx, value.size),
                                                    **concatenated_parameters(ctx, value.size)})
        if elsewhere is None or not elsewhere[1].equal or elsewhere[0] in own:
            continue
        for pname, tensor in own.items():
            if tried >= MAX_SWAPS:
                return None
            tried += 1
            try:
                restored = elsewhere[1].layout.apply(tensor, value.shape).astype(value.dtype)
                model, weights = edits.replace_array(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights, name,
                                                     restored)
                values = ctx.run_segment(model, weights)
            except Exception:  # noqa: BLE001 - a layout that does not fit or runs is not the answer
                continue
            if ctx.compare(values[ctx.tensor], ctx.reference).ok:
                return _exchanged_finding(ctx, name, value, elsewhere[0], pname, restored)
    return None


def _exchanged_finding(ctx: DiagnosisContext, name: str, value: np.ndarray, other: str, own: str,
                       restored: np.ndarray) -> Finding:
    summary = (f"The weight '{name}' {tuple(value.shape)} holds exactly the numbers of {other}, another module's, "
               f"where this segment computes with {own}: with {own} in its place the segment reproduces PyTorch's "
               "output. The file's weights were put in the wrong layers (a loader or converter matching parameters "
               "by shape or by position, two layers' weights exchanged).")
    fix = ("Re-export, or map each parameter to its layer by name: check the step that wrote the weights into the "
           "file (a converter's parameter mapping, a state dict loaded with renamed keys).")
    return Finding(Cause.WEIGHT_MISMATCH, 0.9, summary, fix,
                   {"parameters": [{"initializer": name, "parameter": own, "layout": f"holds {other}"}]},
                   changes=weight_readers(ctx, [name]),
                   counterfactual=lambda c: FixedSegment(*edits.replace_array(
                       edits.copy_model(c.onnx.skeleton), c.onnx.weights, name, restored)))


#: the file's weights of a projection's shape searched for its siblings' rows, at most
MAX_SIBLING_WEIGHTS = 64


def sibling_rows(ctx: DiagnosisContext, differing) -> Finding | None:
    """Projections of one input holding each other's output rows: a differing Linear weight each of whose rows is
    a row of the Linear layers beside it (one parent, one input width, one shape), from more than one of them — q,
    k and v loaded from a fused [q; k; v] in another head layout ((3, H, d) read as (H, 3, d)), a converter
    splitting a packed projection wrongly.  The file's other weights made of those rows (and the biases of their
    layers, made of the siblings' bias entries) are found by the same test; each is put back as the layer its
    product is paired with holds it, and the segment must then reproduce PyTorch: every projection is named."""
    weights = [(n, p, r.layout) for n, p, r, _ in differing] + _product_weights(ctx)
    for name, param, laid in weights:
        owner = param.rpartition(".")[0] if param.endswith(".weight") else ""
        siblings = _siblings(ctx, owner)
        value = ctx.initializer(name)
        if len(siblings) < 2 or value is None or value.ndim != 2:
            continue
        stacked = np.concatenate([w for _, w, _ in siblings])
        whose = [n for n, w, _ in siblings for _ in range(w.shape[0])]
        mine = _row_sources(value.T if laid is Layout.TRANSPOSED else value, stacked)
        if mine is None or len({whose[i] for i in mine}) < 2:
            continue
        fixes, layers = _sibling_fixes(ctx, siblings, stacked, laid, value.shape, _product_inputs(ctx, name))
        if name not in fixes:
            continue
        model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
        for tensor, restored in fixes.items():
            model, weights = edits.replace_array(model, weights, tensor, restored)
        try:
            if not ctx.compare(ctx.run_segment(model, weights)[ctx.tensor], ctx.reference).ok:
                continue
        except Exception:  # noqa: BLE001 - a fix the runtime rejects is no reading
            continue
        return _sibling_finding(ctx, fixes, layers, model, weights)
    return None


def _siblings(ctx: DiagnosisContext, owner: str) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """``(name, weight, bias)`` of the Linear-like layers beside ``owner`` (one parent) with its weight's shape, in
    the order they are registered; empty when ``owner`` is no such layer."""
    module = ctx.torch_module(owner) if owner else None
    weight = getattr(module, "weight", None)
    if not hasattr(weight, "detach") or weight.dim() != 2:
        return []
    parent = owner.rpartition(".")[0]
    found = []
    for name, other in ctx.torch_modules():
        w = getattr(other, "weight", None)
        if name.rpartition(".")[0] == parent and hasattr(w, "detach") and tuple(w.shape) == tuple(weight.shape) \
                and name not in {f[0] for f in found} and type(other) is type(module):
            b = getattr(other, "bias", None)
            found.append((name, to_numpy(w), to_numpy(b) if hasattr(b, "detach") else None))
    return found


def _row_sources(rows: np.ndarray, stacked: np.ndarray) -> list[int] | None:
    """For each row of ``rows`` the index of an equal row of ``stacked`` (up to the rounding of ``rows``' type: a
    float16 file's), None when one has none."""
    if rows.ndim != 2 or rows.shape[1] != stacked.shape[1]:
        return None
    step = float(np.finfo(rows.dtype).eps) if rows.dtype.kind == "f" else 0.0
    scale = (np.abs(stacked).max() + 1e-30) * max(1.0, step / 1e-6)
    found = []
    for row in rows.astype(np.float64):
        gaps = np.abs(stacked - row).max(axis=1)
        best = int(np.argmin(gaps))
        if gaps[best] > 1e-6 * scale:
            return None
        found.append(best)
    return found


def _product_inputs(ctx: DiagnosisContext, weight: str) -> set[str]:
    """The computed tensors the products reading ``weight`` read (a projection's input), followed up through the
    Casts and Identities before them (a float16 converter casts the input once per reader)."""
    graph = ctx.onnx.graph
    readers = [ctx.node(name) for name in weight_readers(ctx, [weight])]
    return {graph.carried_from(t) for p in readers if p is not None for t in p.input
            if t and not graph.is_constant(t)}


def _product_weights(ctx: DiagnosisContext) -> list[tuple[str, str, Layout]]:
    """``(initializer, parameter, layout)`` of the segment's product weights, paired with the divergent module's
    weight by shape alone (a weight mixing three layers' rows pairs with none of them by value)."""
    module = ctx.layer.pair.activation.module
    weight = getattr(ctx.torch_module(), "weight", None) if module else None
    if not hasattr(weight, "detach") or weight.dim() != 2:
        return []
    found = []
    for proto in ctx.segment_protos:
        value = ctx.initializer(proto.input[1]) if proto.op_type in PRODUCT_OPS and len(proto.input) > 1 else None
        if value is None or value.ndim != 2:
            continue
        transposed = proto.op_type == "MatMul" or proto.op_type == "Gemm" and not attribute(proto, "transB", 0)
        if tuple(value.shape) == tuple(weight.shape)[::-1 if transposed else 1]:
            found.append((proto.input[1], f"{module}.weight", Layout.TRANSPOSED if transposed else Layout.SAME))
    return found


def _sibling_fixes(ctx: DiagnosisContext, siblings, stacked: np.ndarray, laid: Layout, shape,
                   inputs: set[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """The file's weights of ``shape`` made of the siblings' rows, read by products of one of ``inputs`` (and their
    layers' biases made of the siblings' bias entries, a layer without one adding zeros), each unlike the value its
    layer holds, given that value: ``({initializer: value}, the layers whose rows they hold)``.  A weight's layer
    is the one its product is paired with (among those whose rows it holds); where a product pairs with none of
    them (a renamed or float16 file's), the weights found, one per layer whose rows they hold, are taken in the
    order their products run, the layers in the order PyTorch ran them (Whisper registers k, v, q and runs q, k,
    v)."""
    names = [n for n, _, _ in siblings]
    by_name = {n: (w, b if b is not None else np.zeros(w.shape[0], w.dtype)) for n, w, b in siblings}
    transposed = laid is Layout.TRANSPOSED
    stacked_bias = np.concatenate([b for _, b in by_name.values()])
    found: list[tuple[int, str, set[str], str | None]] = []  # (position, initializer, readers, paired layer)
    tried, whose, used = 0, [n for n, w, _ in siblings for _ in range(w.shape[0])], set()
    for tensor in sorted(ctx.onnx.graph.initializers):
        value = ctx.initializer(tensor) if tried < MAX_SIBLING_WEIGHTS else None
        if value is None or tuple(value.shape) != tuple(shape) or value.dtype.kind != "f":
            continue
        tried += 1
        sources = _row_sources(value.T if transposed else value, stacked) if _product_inputs(ctx, tensor) & inputs \
            else None
        if sources is None:
            continue
        mine = {whose[i] for i in sources}
        used |= mine
        readers = set(weight_readers(ctx, [tensor]))
        # paired: a layer whose segment holds the product and some of whose rows the weight holds (in a file
        # aligned by value alone, another sibling's segment may span the products)
        layer = next((r.pair.activation.module for r in ctx.layers
                      if readers & set(r.segment) and r.pair.activation.module in mine), None)
        position = min((ctx.onnx.graph.producer.get(o, 0) for r in readers if (p := ctx.node(r)) is not None
                        for o in p.output[:1]), default=0)
        found.append((position, tensor, readers, layer))
    found.sort()
    # the layers whose rows the weights hold (not a sibling reading another input), in the order PyTorch ran them
    names = sorted((n for n in names if n in used), key=lambda n: _ran_at(ctx, n, names))
    if any(layer is None for *_, layer in found):  # by order: as many weights as layers, the paired ones agreeing
        if len(found) != len(names) or any(layer not in (None, names[i]) for i, (*_, layer) in enumerate(found)):
            found = [f for f in found if f[3] is not None]
        else:
            found = [(p, t, r, names[i]) for i, (p, t, r, _) in enumerate(found)]
    fixes: dict[str, np.ndarray] = {}
    for _, tensor, readers, layer in found:
        value = ctx.initializer(tensor)
        weight, bias = by_name[layer]
        own = (weight.T if transposed else weight).astype(value.dtype)
        if not np.array_equal(own, value):
            fixes[tensor] = own
        for node in readers:  # the bias the product's layer adds: a Gemm's C, or the Add after the product
            for candidate in _bias_of(ctx, node, bias.size):
                held = ctx.initializer(candidate)
                rtol = max(1e-6, float(np.finfo(held.dtype).eps)) if held is not None else 0.0
                if held is not None and not np.allclose(held, bias, rtol=rtol, atol=1e-7) and all(
                        np.isclose(stacked_bias, v, rtol=rtol, atol=1e-7).any() for v in held.ravel()):
                    fixes[candidate] = bias.astype(held.dtype)
    return fixes, names


def _ran_at(ctx: DiagnosisContext, layer: str, registered: list[str]) -> tuple[int, int]:
    """Where ``layer`` ran in PyTorch's forward (its first call's capture index), then where it is registered."""
    activation = ctx.activation_of(layer)
    return (activation.index if activation is not None else 1 << 62, registered.index(layer))


def _bias_of(ctx: DiagnosisContext, node: str, size: int) -> list[str]:
    """The constant of ``size`` elements a product node adds: its own bias input, or the Add reading it."""
    graph = ctx.onnx.graph
    proto = ctx.node(node)
    if proto is None or not proto.output:
        return []
    found = [t for t in proto.input[2:3] if t in graph.initializers]
    for c in graph.consumers.get(proto.output[0], ()):
        add = graph.nodes[c]
        if add.op_type == "Add":
            found += [t for t in add.inputs if t in graph.initializers and ctx.initializer(t) is not None
                      and ctx.initializer(t).size == size]
    return found


def _sibling_finding(ctx: DiagnosisContext, fixes: dict[str, np.ndarray], siblings: list[str], model,
                     weights) -> Finding:
    listed = ", ".join(f"'{t}'" for t in fixes)
    summary = (f"The weights {listed} hold the rows of the layers {', '.join(siblings)} mixed among them — each "
               "output channel is one of those layers' own, in another layer's place: projections of one input "
               "loaded from a fused weight in another head layout (a [q; k; v] of blocks (3, H, d) read as "
               "(H, 3, d)), or a packed projection split wrongly. With each layer's own weight (and bias) back "
               "the segment reproduces PyTorch's output.")
    fix = ("Split the fused weight as the model packs it (check the head layout the converter or loader assumes: "
           "(3, heads, head_dim) against (heads, 3, head_dim)), or re-export from the PyTorch model.")
    return Finding(Cause.WEIGHT_MISMATCH, 0.9, summary, fix,
                   {"parameters": [{"initializer": t, "layout": "rows of " + " / ".join(siblings)} for t in fixes]},
                   changes=weight_readers(ctx, list(fixes)),
                   counterfactual=lambda c, m=model, w=weights: FixedSegment(m, w))
