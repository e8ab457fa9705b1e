"""Weights: an initializer the segment reads differs from the PyTorch parameter it was exported from."""
from __future__ import annotations

import numpy as np

from ..support.param_layouts import gates_exchanged, is_rnn_parameter, owner_of
from ..support import edits, layout
from .epsilon import NORM_OPS
from ...records import Cause, Layout
from ..context import DiagnosisContext, Finding, FixedSegment, Rule
from . import quantization
from .weight_biases import bias_after, bias_missing, bias_moved
from .weight_borrowed import borrowed
from .weight_layouts import exchanged, norm_scales, rearranged, relaid, scale_offset, sibling_rows
from .weight_params import (concatenated_parameters, constant_activations, model_arrays, nearest_parameter, output_axis,
                            own_tensors, parameter_holding, parameters_sized, segment_initializers,
                            weight_readers, stacked_slices)
from .weight_tables import stale_table


#: every differing initializer bears its parameter's name: above a number the attribute rule found by searching
#: (an exponent fitted to make up for a norm's scale left at ones), below a reading that names a function
NAMED_CONFIDENCE = 0.89


class WeightMismatch(Rule):
    """Pair each float initializer of the segment with its PyTorch tensor (by name, else by value; transposes and BatchNorm folds allowed)."""

    cause = Cause.WEIGHT_MISMATCH

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        # beyond the tolerance, but not necessarily beyond rounding noise: the evidence is the weights themselves
        # (not equal to float32's resolution), and re-running with PyTorch's confirms it — a tiny noise whose
        # error later layers amplify (the segment judged against the tolerance divided by that gain) is within
        # 64 ULPs of a large activation, and must still be named
        if ctx.layer.local is None or ctx.layer.local.ok:
            return None
        candidates = layout.torch_candidates(ctx)
        differing = _differing(ctx, candidates) + _quantized(ctx, candidates)
        if differing and norm_scales(ctx) & {n for n, _, _, _ in differing}:
            offset = scale_offset(ctx)  # a ``1 + weight`` scale off by one pairs with the weight, and differs
            if offset is not None:
                return offset
        if not differing:
            return (bias_after(ctx) or bias_missing(ctx, candidates) or bias_moved(ctx) or exchanged(ctx, candidates)
                    or borrowed(ctx) or relaid(ctx) or _parameter_early(ctx)
                    or scale_offset(ctx) or stale_table(ctx) or rearranged(ctx))
        moved = _parameter_moved(ctx, differing) or sibling_rows(ctx, differing)
        if moved is not None:
            return moved
        if not all(r.related for _, _, r, _ in differing):
            # numbers unlike the parameter they are named after may be another module's (two layers' weights
            # exchanged), a folded weight in another layout (a BatchNorm folded into a kernel whose channels
            # were then reversed) or the parameter's own numbers rearranged: a confirmed reading says more
            found = exchanged(ctx, candidates) or relaid(ctx) or rearranged(ctx)
            if found is not None:
                return found
        rows = [{"initializer": n, "parameter": p, "layout": r.layout.value, "max_abs": r.max_abs, "rel_l2": r.rel_l2,
                 "fraction_differing": r.fraction_differing, "correlation": r.correlation}
                for n, p, r, _ in differing]
        listed = "; ".join(f"'{n}' vs {p} ({r.layout.value}): max abs {r.max_abs:.2g}, relative L2 {r.rel_l2:.2g}, "
                           f"{r.fraction_differing:.0%} of elements differ" for n, p, r, _ in differing)
        summary, fix = _explained(ctx, differing, listed)
        if _dequantizes_activations(ctx):
            summary += (" The fix is re-run in the segment's float computation (its activation Q/DQ pairs undone and "
                        "integer products computed in float, as the quantization rule's own fix does, which alone "
                        "does not remove the divergence).")
        named = all(n == p for n, p, _, _ in differing)
        return Finding(self.cause, NAMED_CONFIDENCE if named else 0.85, summary, fix, {"parameters": rows},
                       changes=weight_readers(ctx, [n for n, _, _, _ in differing]),
                       counterfactual=lambda c: _restore(c, differing))


def _explained(ctx: DiagnosisContext, differing, listed: str) -> tuple[str, str]:
    """``(summary, fix)`` of initializers that differ from their parameters: the reference file's, corrupt
    numbers, or another checkpoint's (reordered, repeated, pruned)."""
    if ctx.baseline.loaded.module is None:  # --reference: another ONNX model stands in for PyTorch
        summary = (f"The ONNX weights differ from the reference model's initializers: {listed}. The values are "
                   "correlated (same layer) but not equal: the conversion step changed them.")
        fix = ("Redo the conversion from the reference file, or find the step that rewrote these initializers "
               "(a converter, a quantizer, an edit by hand).")
    elif any(_corrupt(r) for _, _, r, _ in differing):
        summary = (f"The ONNX weights differ from the PyTorch parameters they were exported from: {listed}. The "
                   "file holds inf/NaN or values far beyond the parameter's range where PyTorch has ordinary "
                   "weights: its weights were corrupted (a broken conversion, a truncated or edited file)."
                   + _other_owners(ctx, [p for _, p, _, _ in differing]))
        fix = ("Re-export the model, and check the file's integrity where it is stored or transferred (compare "
               "a checksum with the exported file's).")
    else:
        how = ("The values are correlated (same layer) but not equal, as from another checkpoint." if
               all(r.related for _, _, r, _ in differing) else "The weights bear the parameters' names but "
               "hardly their values (correlation " + ", ".join(f"{r.correlation:.2f}" for _, _, r, _ in differing)
               + "): they were overwritten or come from another model.")
        reordered = _reordered(ctx, differing)
        if reordered:
            how = reordered
        how = _repeated(ctx, differing) or _pruned(ctx, differing) or _standardised(ctx, differing) or how
        summary = (f"The ONNX weights differ from the PyTorch parameters they were exported from: {listed}. "
                   + how + _other_owners(ctx, [p for _, p, _, _ in differing]))
        fix = ("Re-export from the checkpoint PyTorch runs (or load the checkpoint the ONNX file was made from); "
               "check the export script loads the weights before torch.onnx.export.")
    return summary, fix


def _standardised(ctx: DiagnosisContext, differing) -> str:
    """A sentence naming the weights that hold their parameter standardised per output channel where PyTorch's
    layer reads it as it is (a plain Conv2d, not a weight-standardised one), '' when none does."""
    named = [f"'{n}' is {p} standardised per output channel ((W − mean) / std)" for n, p, r, t in differing
             if t is not None and ctx.initializer(n) is not None and layout.standardised(
                 np.asarray(ctx.initializer(n)), r.layout.apply(np.asarray(t), np.shape(ctx.initializer(n))))]
    if not named:
        return ""
    return ("; ".join(named) + ", while PyTorch's layer computes with the weight as it is: a weight-standardised "
            "convolution (StdConv2d, BiT's) exported for a plain one, or a converter standardising the kernel.")


def _repeated(ctx: DiagnosisContext, differing) -> str:
    """A sentence naming the differing weights that hold one number repeated where their parameter has one per
    channel, '' when none does."""
    repeated = [f"'{n}' holds one number ({float(np.asarray(ctx.initializer(n)).ravel()[0]):.4g}) where {p} has one "
                "per channel" for n, p, _, t in differing if t is not None and ctx.initializer(n) is not None
                and np.ptp(np.asarray(ctx.initializer(n), np.float64)) == 0 and np.ptp(np.asarray(t)) > 0]
    if not repeated:
        return ""
    initial = all(float(np.asarray(ctx.initializer(n)).ravel()[0]) in (0.0, 1.0) for n, _, _, t in differing
                  if t is not None and ctx.initializer(n) is not None
                  and np.ptp(np.asarray(ctx.initializer(n), np.float64)) == 0 and np.ptp(np.asarray(t)) > 0)
    if initial:
        return ("; ".join(repeated) + ": the values a layer starts from (ones and zeros), as if the checkpoint's "
                "were never loaded into it (a key renamed or missing, loaded with strict=False), or a per-tensor "
                "default written in the place of the per-channel values.")
    return ("; ".join(repeated) + ": a per-tensor value (a mean, a default) was written in the place of the "
            "per-channel one (a converter or quantizer collapsing the axis).")


def _pruned(ctx: DiagnosisContext, differing) -> str:
    """A sentence naming the weights whose differing output channels (first axis, as the relation lays them out)
    are all zeros where PyTorch's are not, the others equal, '' when none is so."""
    found = []
    for name, param, relation, tensor in differing:
        value = ctx.initializer(name)
        if value is None or tensor is None or value.ndim < 1 or value.size < 2:
            continue
        reader = next((ctx.node(n) for n in weight_readers(ctx, [name]) if ctx.node(n) is not None), None)
        axis = output_axis(reader, value) if reader is not None and value.ndim > 1 else 0
        ref = relation.layout.apply(np.asarray(tensor), value.shape).astype(value.dtype)  # rounded as stored
        rows = np.moveaxis(np.asarray(value, np.float64), axis, 0).reshape(value.shape[axis], -1)
        want = np.moveaxis(np.asarray(ref, np.float64), axis, 0).reshape(value.shape[axis], -1)
        off = ~np.all(np.isclose(rows, want, rtol=1e-5, atol=1e-7), axis=1)
        if off.any() and not rows[off].any() and want[off].any():
            found.append(f"'{name}' has output channel(s) {', '.join(str(int(i)) for i in np.nonzero(off)[0][:8])} "
                         f"of {value.shape[axis]} zeroed, the others {param}'s")
    if not found:
        return ""
    return "; ".join(found) + " (channels pruned or masked by a compression or conversion step)."


def _reordered(ctx: DiagnosisContext, differing) -> str:
    """A sentence naming the differing weights that hold their parameter's numbers in reversed order along an axis
    (a Conv kernel's input channels: an RGB model given BGR weights; a bias or scale reversed), '' when none does."""
    found = []
    for name, param, relation, tensor in differing:
        value = ctx.initializer(name)
        if value is None or tensor is None:
            continue
        ref = relation.layout.apply(np.asarray(tensor), value.shape)
        axis = next((a for a in range(value.ndim) if value.shape[a] > 1
                     and (rel := layout.relate(value, np.flip(ref, a))) is not None and rel.equal), None)
        if axis is not None:
            found.append(f"'{name}' is {param} reversed along axis {axis}")
    if not found:
        return ""
    return ("The numbers are the parameters' own in another order: " + "; ".join(found) + " (a channel order "
            "changed by a converter or by hand: RGB and BGR input channels, a per-channel constant reversed).")


def _differing(ctx: DiagnosisContext, candidates) -> list:
    """The segment's float initializers unlike the PyTorch tensor they pair with, as ``(initializer, parameter,
    relation, torch value)`` rows — not a BatchNorm refold (that rule's case), a float16 clamp (precision's), a
    parameter times a layer scale of the model (a simplifier's fold) or standardised per output channel (a
    weight-standardised convolution folded at export): the model's own numbers."""
    folded_biases = {s.bias for s in layout.weight_sites(ctx) if s.bias and _exact_fold(ctx, s.weight, candidates)}
    refolded = {t for s in layout.weight_sites(ctx) if _is_refold(ctx, ctx.initializer(s.weight), s.weight)
                for t in (s.weight, s.bias) if t and t not in folded_biases}
    differing, arrays, called = [], None, None  # the model's parameters as arrays, the modules called: read once
    for name in segment_initializers(ctx):
        value = ctx.initializer(name) if name not in refolded else None
        if value is None or not np.issubdtype(value.dtype, np.floating) or value.size < 2:
            continue
        best, owned, zeroed = _counterpart(ctx, name, value, candidates), None, None
        viewed = None
        if best is None or not best[1].equal and (not _same_tensor(best, name, value) or name in folded_biases):
            owned, zeroed = _owned(ctx, name, value, candidates), _zeroed(ctx, name, value, candidates)
            viewed = _viewed(ctx, name, value) or _slotted(ctx, name, value, candidates)
            best = zeroed or owned or viewed or best
        # zeros pair with anything of their size: only in a bias slot the module has (``_zeroed``), or named so
        if best is None or best[1].equal or not (_same_tensor(best, name, value) or best is zeroed or best is owned
                                                 or best is viewed):
            continue
        if value.dtype == np.float16 and _only_clamped(value, best[2], best[1].layout):
            continue
        arrays = model_arrays(ctx) if arrays is None else arrays
        ref = best[1].layout.apply(best[2], value.shape)
        called = {a.module for a in ctx.baseline.capture.activations} if called is None else called
        if not layout.reparameterised(value, ref, arrays, layout.read_as_is(ctx.baseline.loaded.module, best[0],
                                                                            called)):
            differing.append((name, *best))
    return differing + _fold_biases(ctx, differing, candidates)


def _fold_biases(ctx: DiagnosisContext, differing, candidates) -> list:
    """The biases of weights that differ from a BatchNorm fold, where they differ from that fold's bias (a few
    numbers pair by value with whatever is nearest; the bias beside a folded weight is that fold's)."""
    rows, named = [], {d[0] for d in differing}
    for site in layout.weight_sites(ctx):
        weight = next((d for d in differing if d[0] == site.weight and d[1].startswith("fold(")), None)
        if weight is None or not site.bias or site.bias in named:
            continue
        key = weight[1].replace(".weight, ", ".bias, ", 1)
        tensor, value = candidates.get(key), ctx.initializer(site.bias)
        relation = layout.relate(value, np.asarray(tensor)) if tensor is not None and value is not None else None
        if relation is not None and not relation.equal:
            rows.append((site.bias, key, relation, np.asarray(tensor)))
    return rows


def _counterpart(ctx: DiagnosisContext, name: str, value: np.ndarray, candidates):
    """``(parameter, relation, torch value)`` for an initializer: the segment's parameters first, else any of the
    model's, else sibling projections concatenated, else a constant activation; None when nothing relates."""
    rnn = any(ctx.onnx.graph.nodes[c].op_type in ("LSTM", "GRU", "RNN") for c in ctx.onnx.graph.consumers.get(name, ()))
    best = nearest_parameter(value, name, rnn_input=rnn, candidates=candidates)
    if best is None or (not best[1].equal and not _same_tensor(best, name, value)):
        # the segment may hold another module's weight (its output fused away): search the whole model
        best = nearest_parameter(value, name, rnn_input=rnn, candidates=parameters_sized(ctx, value.size)) or best
    if best is None or (not best[1].equal and not _same_tensor(best, name, value)):
        # a simplifier merges projections of one input into one MatMul (q, k and v): their weights concatenated
        best = nearest_parameter(value, name, rnn_input=rnn,
                                 candidates=concatenated_parameters(ctx, value.size)) or best
    if best is None or (not best[1].equal and not _same_tensor(best, name, value)):
        # one expert's (one layer's) slice of a stacked parameter, folded into an initializer of its own
        sliced = nearest_parameter(value, name, rnn_input=rnn, candidates=stacked_slices(ctx, value.size))
        best = sliced if sliced is not None and (best is None or sliced[1].rel_l2 < best[1].rel_l2) else best
    if best is None or (not best[1].equal and not _same_tensor(best, name, value)):
        # an exporter folds an activation that depends on no input into a constant (the position embeddings of
        # a fixed length): the constant then stands for that module's output
        folded = nearest_parameter(value, name, rnn_input=rnn, candidates=constant_activations(ctx, value.size))
        best = folded if folded is not None and folded[1].correlation >= 0.9 else best
    return best


def _exact_fold(ctx: DiagnosisContext, weight: str, candidates) -> bool:
    """Whether ``weight`` is a Conv/Linear + BatchNorm fold of the PyTorch parameters exactly: its bias is then
    no fold mistake (a wrong eps or statistics rescale the weight too) but a value of its own to compare."""
    value = ctx.initializer(weight)
    return value is not None and any(
        k.startswith("fold(") and ".weight, " in k and (r := layout.relate(value, t)) is not None and r.equal
        for k, t in candidates.items())


def _zeroed(ctx: DiagnosisContext, name: str, value: np.ndarray, candidates):
    """A weight of zeros the divergent module's own bias slot holds (values cannot pair a zeroed weight with
    anything): ``(parameter, relation, torch value)`` of that module's bias of the same size, else None."""
    if np.any(value):
        return None
    module = ctx.layer.pair.activation.module
    folded = [k for k in candidates if k.startswith("fold(") and ".bias, " in k and candidates[k].size == value.size]
    key = folded[0] if len(folded) == 1 else f"{module}.bias" if module else "bias"  # a folded BatchNorm's shift
    bias = candidates.get(key)
    if bias is None or bias.size != value.size or not np.any(bias):
        return None
    readers = [p for p in ctx.segment_protos if name in p.input]
    if not any(p.op_type in ("Gemm", "Conv", "ConvTranspose", "Add") for p in readers):
        return None
    rel = layout.relate(value, bias)
    return (key, rel, bias) if rel is not None else None


def _corrupt(relation) -> bool:
    """Whether the differing values are garbage (non-finite, or a thousand times the parameter's norm)."""
    return not np.isfinite(relation.max_abs) or relation.rel_l2 > 1e3


def _owned(ctx: DiagnosisContext, name: str, value: np.ndarray, candidates):
    """``(parameter, relation, tensor)`` for an initializer whose numbers relate to no parameter (one number
    repeated where the module has a per-channel scale: a per-tensor value written for it) when it is the
    segment's only initializer of its size and its module's only tensor of that size: paired by ownership, not
    by value; None otherwise.  Tensors that pair exactly (a LayerNorm's scale beside its collapsed shift) are
    set aside on both sides first: what is left pairs by elimination.  A parameter is set aside only for an
    initializer read by the same node as ``name`` (its other slots): one that another node holds (a norm's scale
    moved onto a Mul before it) leaves the slot's own parameter to pair."""
    same = {t: v for t in segment_initializers(ctx) if (v := ctx.initializer(t)) is not None and v.size == value.size}
    own = own_tensors(ctx, candidates, value.size)
    left = [t for t, v in same.items() if not any(_equal(v, p) for p in own.values())]
    if left != [name]:
        return None
    beside = {t for p in ctx.segment_protos if name in p.input for t in p.input}
    own = {k: p for k, p in own.items() if not any(_equal(v, p) for t, v in same.items() if t in beside)}
    if len(own) != 1:
        return None
    parameter, tensor = next(iter(own.items()))
    relation = layout.relate(value, tensor)
    if relation is None or relation.equal or np.ptp(np.asarray(value, np.float64)) > 0:
        return None  # numbers of their own (noise, another layer's): the value pairing's case
    return parameter, relation, tensor


def _viewed(ctx: DiagnosisContext, name: str, value: np.ndarray):
    """``(parameter, relation, tensor)`` for the segment's only float initializer of its size when PyTorch's op
    read exactly one parameter view of that size (one expert's slice of a stacked weight, transposed): paired by
    what the op read, whatever the numbers now are (rows permuted, another checkpoint's); None otherwise."""
    views = [(n, v) for n, v in ctx.op_param_views if v.size == value.size]
    same = [t for t in segment_initializers(ctx) if (v := ctx.initializer(t)) is not None and v.size == value.size]
    if len(views) != 1 or same != [name]:
        return None
    parameter, tensor = views[0]
    relation = layout.relate(value, tensor)
    if relation is None or relation.equal:
        return None
    return parameter, relation, tensor


#: the parameters of a norm node's inputs past the first, in order: PyTorch's norm modules name them so
NORM_SLOTS = {"LayerNormalization": ("weight", "bias"), "InstanceNormalization": ("weight", "bias"),
              "GroupNormalization": ("weight", "bias"), "BatchNormalization": ("weight", "bias", "running_mean",
                                                                                "running_var"),
              "SimplifiedLayerNormalization": ("weight",), "RMSNormalization": ("weight",)}


def _slotted(ctx: DiagnosisContext, name: str, value: np.ndarray, candidates):
    """``(parameter, relation, tensor)`` for an initializer a norm node of the segment reads as its scale, bias
    or statistics, paired with the divergent norm module's parameter of that slot whatever the numbers (a norm
    left at its initialisation — ones and zeros — relates by value to nothing; in a renamed file no name pairs
    it either); None when the module has no such parameter of its size, or holds it exactly."""
    readers = [p for p in ctx.segment_protos if name in p.input]
    norms = [p for p in ctx.segment_protos if p.op_type in NORM_SLOTS]
    if len(readers) != 1 or readers[0].op_type not in NORM_SLOTS or len(norms) != 1:
        return None  # the segment's one norm node: the divergent norm module's (another norm's slots are not its)
    slots, k = NORM_SLOTS[readers[0].op_type], list(readers[0].input).index(name) - 1
    module = ctx.layer.pair.activation.module
    if not 0 <= k < len(slots) or not module:
        return None
    parameter = f"{module}.{slots[k]}"
    tensor = candidates.get(parameter)
    if tensor is None or np.size(tensor) != value.size:
        return None
    relation = layout.relate(value, tensor)
    return None if relation is None or relation.equal else (parameter, relation, tensor)


def _equal(value: np.ndarray, tensor: np.ndarray) -> bool:
    """Whether an initializer holds a PyTorch tensor's numbers exactly, in some layout."""
    relation = layout.relate(value, tensor)
    return relation is not None and relation.equal


def _same_tensor(best, name: str, value: np.ndarray) -> bool:
    """Whether an initializer and its closest PyTorch tensor are one tensor with changed values: correlated or
    mostly equal (another checkpoint, a few corrupted values), or of the same name (whatever the values: inf,
    NaN or 1e38 written over the weights is still this weight)."""
    parameter, relation, tensor = best
    return (relation.related or parameter == name or is_rnn_parameter(parameter) and gates_exchanged(value, tensor)
            or _constant_parameter(tensor) and relation.rel_l2 < 1.0)


def _constant_parameter(tensor: np.ndarray) -> bool:
    """Whether a PyTorch tensor holds one nonzero number repeated (a bias initialised to a constant, as Hiera's
    are): no changed copy of it can correlate with it, so nearness (relative L2 below 1) says it is the same."""
    t = np.asarray(tensor)
    return t.size > 1 and bool(np.all(t == t.reshape(-1)[0])) and bool(t.reshape(-1)[0] != 0)


def _other_owners(ctx: DiagnosisContext, parameters: list[str]) -> str:
    """A sentence naming the modules that own the differing parameters when the blamed activation is another
    one: the segment computes them too, but the file keeps no tensor of their own (fused away)."""
    blamed = ctx.layer.pair.activation.module
    modules = dict(ctx.baseline.loaded.module.named_modules(remove_duplicate=False))
    owners = []
    for name in parameters:
        owner = owner_of(name)
        if owner in modules and owner != blamed and not blamed.startswith(owner + ".") and owner not in owners:
            owners.append(owner)
    if not owners:
        return ""
    return (f" The weight belongs to {', '.join(owners)}, which this segment also computes: the file keeps no "
            f"tensor of {'its' if len(owners) == 1 else 'their'} own output (fused or unaligned), so the divergence "
            f"shows at {blamed or '<model>'}.")


def _is_refold(ctx: DiagnosisContext, value: np.ndarray, name: str) -> bool:
    pair = layout.conv_bn_pair(ctx)
    site = next((s for s in layout.weight_sites(ctx) if s.weight == name), None)
    if pair is None or site is None:
        return False
    w = layout.as_out_in(site, value)
    wc = layout.conv_bn_arrays(pair[1], pair[3])[0]  # output channels first, as ``w``
    if w is None or w.shape != wc.shape:
        return False
    if layout.pruned_channels(w, wc).any():
        return False  # an output channel zeroed (pruned) is no rescale a fold makes: a weight of its own
    return bool(layout.channel_ratios(w, wc)[1].max() <= 1e-3)


def _only_clamped(value: np.ndarray, tensor: np.ndarray, relation: Layout) -> bool:
    """Whether the float16 initializer equals PyTorch's tensor except where a converter clamped large values."""
    ref = relation.apply(tensor, value.shape)
    limit = float(np.max(np.abs(value.astype(np.float64))))
    inside = np.abs(ref) < limit
    if limit == 0 or not inside.any():  # all zero (a dropped weight), or nothing left to compare: no clamp
        return False
    rounded = ref.astype(np.float16).astype(np.float64)
    return bool(np.allclose(value.astype(np.float64)[inside], rounded[inside], rtol=2e-3, atol=0))


def _quantized(ctx: DiagnosisContext, candidates) -> list:
    """The segment's quantized weights (integer initializer + DequantizeLinear) whose dequantized values differ
    from the PyTorch tensor they pair with by more than quantizing it explains, as ``(integer initializer,
    parameter, relation, torch value)`` rows."""
    out = []
    for w, dq in quantization.dequantized_weights(ctx):
        if dq.op_type == "DequantizeLinear" and quantization.misread(ctx, dq, candidates) is not None:
            continue  # the quantizer's weight read another way (the scales' axis, the integers' sign): its rule's
        name = layout.float_name(dq.input[0])
        best = nearest_parameter(w, name, candidates)
        if best is None or not (best[1].related or best[0] == name):
            continue
        ref = best[1].layout.apply(best[2], w.shape)
        if quantization.beyond_rounding(ctx, dq, w, ref) > quantization.BEYOND_ROUNDING:
            out.append((dq.input[0], *best))
    return out


def _dequantizes_activations(ctx: DiagnosisContext) -> bool:
    """Whether the segment quantizes or dequantizes an activation (not only weights)."""
    return any(p.op_type in quantization.QUANT_OPS and (p.op_type != "DequantizeLinear"
                                                       or not ctx.onnx.graph.is_constant(p.input[0]))
               for p in ctx.segment_protos)


def _parameter_moved(ctx: DiagnosisContext, differing) -> Finding | None:
    """A parameter applied at another node of the segment: the initializer in its slot differs (a norm's scale
    of ones) while another node multiplies (or adds) by exactly PyTorch's numbers of it — a scale folded to the
    wrong side of a norm.  With the parameter back in its slot and that node an Identity, the segment must
    reproduce PyTorch."""
    for row in differing:
        name, param, relation, tensor = row
        for proto in ctx.segment_protos:
            if proto.op_type not in ("Mul", "Add", "Div", "Sub") or name in proto.input or len(proto.input) != 2:
                continue
            held = [i for i, t in enumerate(proto.input) if (c := ctx.constant(t)) is not None and c.size == tensor.size
                    and c.size > 1 and _equal(np.asarray(c), tensor)]
            if len(held) != 1:
                continue
            stream = proto.input[1 - held[0]]
            fixed = _restore(ctx, [row])
            edits.make_identity(fixed.model, proto.name, stream)
            if not ctx.reproduces(fixed):
                continue
            owner = next(iter(weight_readers(ctx, [name])), name)
            norm = ctx.node(owner) is not None and ctx.node(owner).op_type in NORM_OPS
            summary = (f"Node {proto.name} ({proto.op_type}) applies {param} ({tensor.size} values, exactly "
                       f"PyTorch's) where PyTorch does not, while {owner}, where PyTorch applies it, reads "
                       f"'{name}' instead ({_described(ctx.initializer(name))}): the parameter was moved to another "
                       "node" + (" — before the normalisation, where a rewrite folding a norm's scale into the layer "
                                 "before it puts it" if norm else "") + f". With it back in its place and "
                       f"{proto.name} left out, the segment reproduces PyTorch's output.")
            fix = ("Apply the parameter where the model does (a norm's scale after the normalisation), or "
                   "re-export; check the graph rewrite that moved it.")
            return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix,
                           {"parameters": [{"initializer": name, "parameter": param, "layout": "moved to "
                                            + proto.name, "max_abs": relation.max_abs, "rel_l2": relation.rel_l2,
                                            "fraction_differing": relation.fraction_differing,
                                            "correlation": relation.correlation}]},
                           changes=(proto.name, owner), counterfactual=lambda c, f=fixed: f)
    return None


#: nodes past the segment searched for the place a parameter applied early belongs, and past that place for a
#: tensor compared with PyTorch's
MAX_SLOT_DISTANCE = 16


def _parameter_early(ctx: DiagnosisContext) -> Finding | None:
    """A parameter applied before its place, the place outside the segment: a node of the segment multiplies (or
    adds) by exactly PyTorch's numbers of a parameter, and the segment reproduces PyTorch without it; a node of the
    same op past the segment applies a constant of that size that is not the parameter (a norm's scale of ones).
    With that node reading the parameter and the early one left out, the first tensor past it that is compared
    with PyTorch reproduces PyTorch's value too, and does not with the early node left out alone — a norm's scale
    folded before a normalisation written out op by op (the mirror of :func:`_parameter_moved`)."""
    for proto in ctx.segment_protos:
        if proto.op_type not in ("Mul", "Add") or len(proto.input) != 2:
            continue
        held = [i for i, t in enumerate(proto.input) if (c := ctx.constant(t)) is not None and c.size > 1]
        if len(held) != 1:
            continue
        value = np.asarray(ctx.constant(proto.input[held[0]]))
        param = _parameter_equal(ctx, value)
        if param is None or value.dtype.kind != "f":
            continue
        early = _left_out(ctx, proto.name, proto.input[1 - held[0]])
        if not ctx.reproduces(early):
            continue
        for slot, at, later in _slots_after(ctx, proto.op_type, value):
            found = _applied_there(ctx, early, slot, at, value, later)
            if found is not None:
                return _early_finding(ctx, proto, param, value, slot, at, later, found)
    return None


def _parameter_equal(ctx: DiagnosisContext, value: np.ndarray) -> str | None:
    """The PyTorch parameter holding exactly ``value``'s numbers (the first, by name), None when none does."""
    varies = np.ptp(np.asarray(value, np.float64)) > 0  # one number repeated pairs with any constant parameter
    return parameter_holding(ctx, value, rtol=1e-6, atol=0) if varies else None


def _left_out(ctx: DiagnosisContext, node: str, stream: str, model=None) -> FixedSegment:
    """The model with ``node`` an Identity of ``stream`` (its constant operand not applied)."""
    model = edits.copy_model(ctx.onnx.skeleton) if model is None else model
    edits.make_identity(model, node, stream)
    return FixedSegment(model, ctx.onnx.weights)


def _slots_after(ctx: DiagnosisContext, op_type: str, value: np.ndarray):
    """``(node, constant input index, later tensor)`` for each node of ``op_type`` at most
    :data:`MAX_SLOT_DISTANCE` nodes past the segment reading a constant of ``value``'s size that is not
    ``value``, with the first tensor past it (or its own output) that has a PyTorch value to compare with."""
    graph, inside = ctx.onnx.graph, {n.name for n in ctx.segment_nodes}
    frontier, seen = [ctx.tensor], set()
    while frontier and len(seen) < MAX_SLOT_DISTANCE:
        for reader in (graph.nodes[c] for c in graph.consumers.get(frontier.pop(0), ())):
            if reader.name in seen or reader.name in inside:
                continue
            seen.add(reader.name)
            frontier.extend(reader.outputs)
            if reader.op_type != op_type or len(reader.inputs) != 2:
                continue
            at = [i for i, t in enumerate(reader.inputs) if (c := ctx.constant(t)) is not None and c.size == value.size]
            if len(at) != 1 or np.allclose(np.asarray(ctx.constant(reader.inputs[at[0]]), np.float64).reshape(-1),
                                           np.asarray(value, np.float64).reshape(-1), rtol=1e-6, atol=0):
                continue
            later = _compared_after(ctx, reader.outputs[0])
            if later is not None:
                yield reader, at[0], later


def _compared_after(ctx: DiagnosisContext, tensor: str) -> str | None:
    """``tensor`` or the nearest tensor computed from it (at most :data:`MAX_SLOT_DISTANCE` nodes on) that has a
    PyTorch value to compare with (a cut tensor)."""
    graph, frontier, seen = ctx.onnx.graph, [tensor], 0
    while frontier and seen <= MAX_SLOT_DISTANCE:
        t = frontier.pop(0)
        if t in ctx.cut.references:
            return t
        seen += 1
        frontier.extend(o for c in graph.consumers.get(t, ()) for o in graph.nodes[c].outputs)
    return None


def _applied_there(ctx: DiagnosisContext, early: FixedSegment, slot, at: int, value: np.ndarray, later: str):
    """The fixed segment (the early node left out, ``slot`` reading ``value``) when it reproduces PyTorch at
    ``later`` while the early node left out alone does not; None otherwise."""
    reference = ctx.cut.references[later]
    try:
        alone = ctx.run_segment(early.model, early.weights, outputs=[later], through=[later])[later]
        if ctx.compare(alone, reference).ok:
            return None  # the slot computes what PyTorch does already: the parameter is not missing there
        model = edits.copy_model(early.model)
        held = np.asarray(ctx.constant(slot.inputs[at]))
        restored = edits.add_initializer(model, f"{slot.name}_restored_parameter",
                                         np.asarray(value, held.dtype).reshape(held.shape))
        edits.node(model, slot.name).input[at] = restored
        fixed = FixedSegment(model, early.weights)
        values = ctx.run_segment(model, early.weights, outputs=[later], through=[later])
    except Exception:  # noqa: BLE001 - a slot that does not fit or run is not the answer
        return None
    return fixed if ctx.compare(values[later], reference).ok else None


def _early_finding(ctx: DiagnosisContext, proto, param: str, value: np.ndarray, slot, at: int, later: str,
                   fixed: FixedSegment) -> Finding:
    slot_value = ctx.constant(slot.inputs[at])
    relation = layout.relate(np.asarray(slot_value, np.float64).reshape(value.shape), np.asarray(value, np.float64))
    summary = (f"Node {proto.name} ({proto.op_type}) applies {param} ({value.size} values, exactly PyTorch's) where "
               f"PyTorch does not — the segment reproduces PyTorch's output without it — while {slot.name} "
               f"({slot.op_type}), past the segment, reads '{slot.inputs[at]}' ({_described(slot_value)}) where "
               f"PyTorch applies {param}: the parameter was applied early (a norm's scale folded before the "
               f"normalisation). With it back at {slot.name} and {proto.name} left out, '{later}' reproduces "
               "PyTorch's value too; with the early node left out alone it does not.")
    fix = ("Apply the parameter where the model does (a norm's scale after the normalisation), or re-export; check "
           "the graph rewrite that moved it.")
    return Finding(Cause.WEIGHT_MISMATCH, 0.9, summary, fix,
                   {"parameters": [{"initializer": slot.inputs[at], "parameter": param,
                                    "layout": "applied early at " + proto.name,
                                    "max_abs": relation.max_abs if relation else None,
                                    "rel_l2": relation.rel_l2 if relation else None,
                                    "fraction_differing": relation.fraction_differing if relation else None,
                                    "correlation": relation.correlation if relation else None}]},
                   changes=(proto.name, slot.name), counterfactual=lambda c: fixed)


def _described(value: np.ndarray | None) -> str:
    if value is None:
        return "another value"
    flat = np.asarray(value, np.float64).reshape(-1)
    return f"one number, {flat[0]:.4g}, repeated" if np.ptp(flat) == 0 else f"{flat.size} other values"


def _restore(ctx: DiagnosisContext, differing) -> FixedSegment:
    """PyTorch's weights in place of the differing ones; in a segment that (de)quantizes activations, in its
    float computation (its Q/DQ pairs undone as the quantization rule's fix undoes them, its integer products
    computed in float): the activations' rounding alone exceeds the tolerance there, and only together with the
    weights does the segment agree."""
    values = {name: rel.layout.apply(tensor, ctx.initializer(name).shape) for name, _, rel, tensor in differing}
    integer = {product.op.input[1] for product in quantization.integer_products(ctx)}
    if _dequantizes_activations(ctx):
        base = quantization.float_twin(ctx, {name: v for name, v in values.items() if name in integer})
        model, weights = base.model, base.weights
    else:
        model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
    quantized = {p.input[0]: p for p in ctx.segment_protos if p.op_type == "DequantizeLinear"}
    for name, value in values.items():
        if name in integer:  # an integer product's weight: the float twin computes with PyTorch's
            continue
        if name in quantized:  # a quantized weight: its DequantizeLinear hands on PyTorch's float weight
            quantization.float_weight(model, quantized[name].name, value)
            continue
        model, weights = edits.replace_array(model, weights, name, value)
    return FixedSegment(model, weights)
