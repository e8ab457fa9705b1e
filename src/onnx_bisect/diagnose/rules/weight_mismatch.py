"""Weights: an initializer the segment reads differs from the PyTorch parameter it was exported from."""
from __future__ import annotations

import dataclasses
import enum
import re

import numpy as np
from onnx import helper

from ..support.param_layouts import gates_exchanged, is_rnn_parameter, model_rnn_weights, owner_of
from ..support import edits, layout
from ..support.rows import nearest_rows
from ..support.alternative_edits import with_inputs
from ..support import alternatives
from .epsilon import NORM_OPS
from ...records import Cause, Layout
from ...records.graph import LAYOUT_OPS, PRODUCT_OPS
from ...records.nest import to_numpy
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute
from . import attribute_mismatch, quantization

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
#: an nn.LSTM/GRU/RNN parameter as PyTorch stores it (compared in the ONNX layout instead: param_layouts)
RAW_RNN = re.compile(r"(^|\.)(weight|bias)_(ih|hh)_l\d+(_reverse)?$")


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
        if differing and _norm_scales(ctx) & {n for n, _, _, _ in differing}:
            offset = _scale_offset(ctx)  # a ``1 + weight`` scale off by one pairs with the weight, and differs
            if offset is not None:
                return offset
        if not differing:
            return (_bias_after(ctx) or _bias_missing(ctx, candidates) or _bias_moved(ctx) or _exchanged(ctx, candidates)
                    or _relaid(ctx)
                    or _scale_offset(ctx) or _stale_table(ctx) or _rearranged(ctx))
        moved = _parameter_moved(ctx, differing)
        if moved is not None:
            return moved
        if not all(r.related for _, _, r, _ in differing):
            # numbers unlike the parameter they are named after may be another module's (two layers' weights
            # exchanged), a folded weight in another layout (a BatchNorm folded into a kernel whose channels
            # were then reversed) or the parameter's own numbers rearranged: a confirmed reading says more
            found = _exchanged(ctx, candidates) or _relaid(ctx) or _rearranged(ctx)
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
        return Finding(self.cause, 0.85, summary, fix, {"parameters": rows},
                       changes=_readers(ctx, [n for n, _, _, _ in differing]),
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
        how = _repeated(ctx, differing) or _pruned(ctx, differing) or how
        summary = (f"The ONNX weights differ from the PyTorch parameters they were exported from: {listed}. "
                   + how + _other_owners(ctx, [p for _, p, _, _ in differing]))
        fix = ("Re-export from the checkpoint PyTorch runs (or load the checkpoint the ONNX file was made from); "
               "check the export script loads the weights before torch.onnx.export.")
    return summary, fix


def _repeated(ctx: DiagnosisContext, differing) -> str:
    """A sentence naming the differing weights that hold one number repeated where their parameter has one per
    channel, '' when none does."""
    repeated = [f"'{n}' holds one number ({float(np.asarray(ctx.initializer(n)).ravel()[0]):.4g}) where {p} has one "
                "per channel" for n, p, _, t in differing if t is not None and ctx.initializer(n) is not None
                and np.ptp(np.asarray(ctx.initializer(n), np.float64)) == 0 and np.ptp(np.asarray(t)) > 0]
    if not repeated:
        return ""
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
        reader = next((ctx.node(n) for n in _readers(ctx, [name]) if ctx.node(n) is not None), None)
        axis = _output_axis(reader, value) if reader is not None and value.ndim > 1 else 0
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
    differing, arrays = [], None  # the model's parameters as arrays: read once, when first needed
    for name in _segment_initializers(ctx):
        value = ctx.initializer(name) if name not in refolded else None
        if value is None or not np.issubdtype(value.dtype, np.floating) or value.size < 2:
            continue
        best, owned, zeroed = _counterpart(ctx, name, value, candidates), None, None
        if best is None or not best[1].equal and (not _same_tensor(best, name, value) or name in folded_biases):
            owned, zeroed = _owned(ctx, name, value, candidates), _zeroed(ctx, name, value, candidates)
            best = zeroed or owned or best
        # zeros pair with anything of their size: only in a bias slot the module has (``_zeroed``), or named so
        if best is None or best[1].equal or not (_same_tensor(best, name, value) or best is zeroed or best is owned):
            continue
        if value.dtype == np.float16 and _only_clamped(value, best[2], best[1].layout):
            continue
        arrays = _model_arrays(ctx) if arrays is None else arrays
        ref = best[1].layout.apply(best[2], value.shape)
        if not layout.reparameterised(value, ref, arrays):
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


#: ops that only carry a weight to the node computing with it (dequantized, cast, laid out)
WEIGHT_CARRIERS = frozenset({"DequantizeLinear", "Cast", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Identity"})


def _readers(ctx: DiagnosisContext, initializers: list[str]) -> tuple[str, ...]:
    """The nodes computing with ``initializers``, through the ops carrying them there (a DequantizeLinear, a
    Cast, a Transpose): the nodes a weight fix changes."""
    graph, found, stack, seen = ctx.onnx.graph, {}, list(initializers), set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for c in graph.consumers.get(tensor, ()):
            node = graph.nodes[c]
            found[node.name] = None
            if node.op_type in WEIGHT_CARRIERS:
                stack.extend(node.outputs)
    return tuple(found)


def _counterpart(ctx: DiagnosisContext, name: str, value: np.ndarray, candidates):
    """``(parameter, relation, torch value)`` for an initializer: the segment's parameters first, else any of the
    model's, else sibling projections concatenated, else a constant activation; None when nothing relates."""
    rnn = any(ctx.onnx.graph.nodes[c].op_type in ("LSTM", "GRU", "RNN") for c in ctx.onnx.graph.consumers.get(name, ()))
    best = _best(value, name, rnn_input=rnn, candidates=candidates)
    if best is None or (not best[1].equal and not _same_tensor(best, name, value)):
        # the segment may hold another module's weight (its output fused away): search the whole model
        best = _best(value, name, rnn_input=rnn, candidates=_everything(ctx, value.size)) or best
    if best is None or (not best[1].equal and not _same_tensor(best, name, value)):
        # a simplifier merges projections of one input into one MatMul (q, k and v): their weights concatenated
        best = _best(value, name, rnn_input=rnn, candidates=_concatenated(ctx, value.size)) or best
    if best is None or (not best[1].equal and not _same_tensor(best, name, value)):
        # an exporter folds an activation that depends on no input into a constant (the position embeddings of
        # a fixed length): the constant then stands for that module's output
        folded = _best(value, name, rnn_input=rnn, candidates=_constant_activations(ctx, value.size))
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
    set aside on both sides first: what is left pairs by elimination."""
    same = {t: v for t in _segment_initializers(ctx) if (v := ctx.initializer(t)) is not None and v.size == value.size}
    own = _own_tensors(ctx, candidates, value.size)
    left = [t for t, v in same.items() if not any(_equal(v, p) for p in own.values())]
    if left != [name]:
        return None
    own = {k: p for k, p in own.items() if not any(_equal(v, p) for v in same.values())}
    if len(own) != 1:
        return None
    parameter, tensor = next(iter(own.items()))
    relation = layout.relate(value, tensor)
    if relation is None or relation.equal or np.ptp(np.asarray(value, np.float64)) > 0:
        return None  # numbers of their own (noise, another layer's): the value pairing's case
    return parameter, relation, tensor


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


def _segment_initializers(ctx: DiagnosisContext) -> list[str]:
    names = []
    for p in ctx.segment_protos:
        if p.op_type in QDQ_OPS:
            continue
        names += [t for t in p.input if t and (t in ctx.onnx.weights.arrays or t in ctx.onnx.graph.initializers)]
    return list(dict.fromkeys(names))


def _everything(ctx: DiagnosisContext, size: int) -> dict[str, np.ndarray]:
    """Every floating parameter and buffer of the model with ``size`` elements (the fallback search)."""
    if ctx.baseline.loaded.module is None:
        return {}  # --reference: the candidates were every initializer of the reference already
    tensors = list(ctx.baseline.loaded.module.named_parameters()) + list(ctx.baseline.loaded.module.named_buffers())
    out = {n: t.detach().double().cpu().numpy() for n, t in tensors if t.is_floating_point() and t.numel() == size}
    out.update({n: a for n, a in model_rnn_weights(ctx.baseline.loaded.module).items() if a.size == size})
    return out


def _concatenated(ctx: DiagnosisContext, size: int) -> dict[str, np.ndarray]:
    """The weights (and biases) of consecutive sibling Linear layers reading inputs of one size, concatenated
    along their outputs, where that makes ``size`` elements: ``"concat(a.q.weight, a.k.weight, a.v.weight)"``."""
    module = ctx.baseline.loaded.module
    if module is None:
        return {}
    import torch  # noqa: PLC0415 - only with a PyTorch model

    children: dict[str, list[tuple[str, torch.nn.Linear]]] = {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear):
            children.setdefault(name.rpartition(".")[0], []).append((name, m))
    out: dict[str, np.ndarray] = {}
    for linears in children.values():
        for i in range(len(linears)):
            for j in range(i + 2, len(linears) + 1):
                run = linears[i:j]
                if len({m.in_features for _, m in run}) != 1:
                    break
                for part in ("weight", "bias"):
                    tensors = [getattr(m, part) for _, m in run]
                    if any(t is None for t in tensors) or sum(t.numel() for t in tensors) != size:
                        continue
                    key = f"concat({', '.join(f'{n}.{part}' for n, _ in run)})"
                    out[key] = np.concatenate([t.detach().double().cpu().numpy() for t in tensors], axis=0)
    return out


def _constant_activations(ctx: DiagnosisContext, size: int) -> dict[str, np.ndarray]:
    """Leaf-module outputs of ``size`` elements, by a name saying what the constant holding one would be."""
    if ctx.baseline.capture is None:
        return {}
    return {f"the output of {a.name} (folded into a constant)": np.asarray(a.value, dtype=np.float64)
            for a in ctx.baseline.capture.activations
            if a.is_leaf and a.module and a.value.size == size and a.value.dtype.kind == "f" and a.call == 0}


def _best(value: np.ndarray, name: str, candidates: dict[str, np.ndarray], rnn_input: bool = False):
    """``(parameter, relation, torch value)`` of the closest candidate (an exact name match is preferred, the
    name's BatchNorm fold matching it too)."""
    scored = []
    for pname, tensor in candidates.items():
        if rnn_input and RAW_RNN.search(pname):  # an ONNX RNN never reads PyTorch's gate order: that is the bug
            continue
        rel = layout.relate(value, tensor)
        if rel is not None:  # an RNN's gates in another order: its own weight, though another correlates better
            gates = not rel.equal and is_rnn_parameter(pname) and gates_exchanged(value, tensor)
            # a BatchNorm folded into a conv keeps the conv's parameter name: its fold is named so too
            named = pname == name or pname.startswith(f"fold({name}, ")
            scored.append((rel.equal, named, gates, -rel.rel_l2, pname, rel, tensor))
    if not scored:
        return None
    *_, pname, rel, tensor = max(scored, key=lambda s: s[:4])
    return pname, rel, tensor


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


def _model_arrays(ctx: DiagnosisContext) -> dict[str, np.ndarray]:
    module = ctx.baseline.loaded.module
    return {} if module is None else {n: to_numpy(t) for n, t in
                                      [*module.named_parameters(), *module.named_buffers()] if t.is_floating_point()}


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
        best = _best(w, name, candidates)
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
            node = edits.node(fixed.model, proto.name)
            node.op_type = "Identity"
            del node.input[:]
            node.input.append(stream)
            if not ctx.reproduces(fixed):
                continue
            owner = next(iter(_readers(ctx, [name])), name)
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


#: ops whose weight (second input) may have been written with its first two axes swapped
SWAPPABLE = PRODUCT_OPS
#: a weight this close to its own transpose (relative L2) is symmetric: swapping it changes nothing to speak of
SYMMETRIC = 0.05
#: weights tried per diagnosis in each other layout (swapped, flipped, reversed)
MAX_SWAPS = 4


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


def _relaid(ctx: DiagnosisContext) -> Finding | None:
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
                   changes=_readers(ctx, [name]),
                   counterfactual=lambda c, n=name, v=relaid: FixedSegment(
                       *edits.replace_array(edits.copy_model(c.onnx.skeleton), c.onnx.weights, n, v)))


#: weights whose numbers are a parameter's own rearranged, tried per diagnosis
MAX_REARRANGED = 4


def _rearranged(ctx: DiagnosisContext) -> Finding | None:
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
                continue  # PyTorch's layout, or its first two axes swapped (the _relaid reading)
            for laid in _layouts_for(tensor, value.shape):
                tried += 1
                fixed, permuted = _with_bias_unpermuted(ctx, proto, value, laid)
                if ctx.reproduces(_replaced(ctx, fixed)):
                    reshaped = any(np.array_equal(value, t.reshape(value.shape)) for t in (tensor, tensor.T))
                    return _rearranged_finding(ctx, name, value, param, fixed, permuted, reshaped)
    return None


#: the parameters compared with a weight's sorted numbers: at most this many elements in all
MAX_REARRANGED_ELEMENTS = 50_000_000


def _same_numbers(ctx: DiagnosisContext, value: np.ndarray):
    """``(parameter, tensor rounded to the file's type)`` for the divergent module's parameters (every one's, for
    the root) holding exactly ``value``'s numbers in some order, rounded to the file's type: same size and sum (float32 sums of one
    multiset may differ by rounding: compared loosely) before the full sort."""
    module = ctx.layer.pair.activation.module
    arrays = {n: t for n, t in _model_arrays(ctx).items() if t.size == value.size and t.ndim >= 2
              and (not module or n.startswith(module + "."))}
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
    axis = _output_axis(proto, value)
    perm = _channel_permutation(np.moveaxis(value, axis, 0), np.moveaxis(laid, axis, 0))
    if perm is None:
        return fixed, False
    bias = _bias_of(ctx, proto)
    value_b = ctx.initializer(bias) if bias else None
    if value_b is not None and value_b.dtype.kind == "f" and value_b.size == len(perm):
        fixed[bias] = value_b.reshape(-1)[np.argsort(perm)].reshape(value_b.shape)
    return fixed, True


def _output_axis(proto, value: np.ndarray) -> int:
    """The axis of a product's weight that indexes its output channels."""
    if proto.op_type in ("Conv", "FusedConv"):
        return 0
    if proto.op_type == "ConvTranspose":
        return 1
    if proto.op_type in ("Gemm", "FusedGemm"):
        return 0 if attribute(proto, "transB", 0) else 1
    return value.ndim - 1  # MatMul: x @ B, B's last axis


def _bias_of(ctx: DiagnosisContext, proto) -> str | None:
    """The constant a product adds as its bias: its third input (Conv, Gemm), or the constant of the one Add that
    reads a MatMul's output."""
    if proto.op_type != "MatMul" and len(proto.input) > 2 and proto.input[2]:
        return proto.input[2]
    graph = ctx.onnx.graph
    readers = [graph.nodes[c] for c in graph.consumers.get(proto.output[0], ())] if proto.output else []
    if len(readers) == 1 and readers[0].op_type == "Add":
        other = [i for i in readers[0].inputs if i != proto.output[0]]
        return other[0] if len(other) == 1 and graph.is_constant(other[0]) else None
    return None


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
    summary = (f"The weight '{name}' {tuple(value.shape)} holds exactly the numbers of PyTorch's {param}, but {how}: "
               f"laid out as {param} is for this node, the segment reproduces PyTorch's output.")
    fix = ("Write the weight from the checkpoint in the node's layout (ONNX MatMul takes x @ B, so a Linear's weight "
           "goes in transposed; a Conv kernel is [out, in/groups, kh, kw]): a converter reshaped a kernel of another "
           "layout, or permuted channels (a rotary head permutation applied twice, a channel order) — check it.")
    return Finding(Cause.WEIGHT_MISMATCH, 0.9, summary, fix,
                   {"parameters": [{"initializer": name, "parameter": param, "layout": "rearranged",
                                    "also_fixed": biases}]},
                   changes=_readers(ctx, list(fixed)),
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


def _norm_scales(ctx: DiagnosisContext) -> set[str]:
    return {p.input[k] for p in ctx.segment_protos if (k := NORM_SCALES.get(p.op_type)) is not None and len(p.input) > k}


def _scale_offset(ctx: DiagnosisContext) -> Finding | None:
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


#: ops that add a bias to a product after it
BIAS_ADDERS = frozenset({"Add"})


def _bias_after(ctx: DiagnosisContext) -> Finding | None:
    """A Linear's or Conv's value paired with its product because the bias added after it does nothing (zeroed)
    or too little: the product plus the module's own bias reproduces PyTorch, while the Add after it adds
    another vector.  The stale bias is the Add's constant; the finding names the Add (just past the segment)."""
    bias = _captured_bias(ctx)
    if bias is None or ctx.layer.local is None or ctx.layer.local.ok:
        return None
    found = _adding_node(ctx, ctx.tensor, bias.size)
    if found is None:
        return None
    add, const_input, value = found
    try:
        product = ctx.local_value.astype(np.float64)
        shape = [1] * product.ndim
        shape[_channel_axis(product, bias.size, ctx.onnx.graph.node_of(ctx.tensor))] = bias.size
        restored = product + bias.astype(np.float64).reshape(shape)
    except (ValueError, IndexError):
        return None
    if not ctx.compare(restored.astype(ctx.local_value.dtype), ctx.reference).ok:
        return None
    rel = layout.relate(value.reshape(bias.shape).astype(np.float64), bias.astype(np.float64))
    if rel is None or rel.equal:
        return None
    param = _bias_name(ctx) or "bias"
    summary = (f"The bias '{const_input}' that node {add.name} adds after this product differs from {param} "
               f"(max abs {rel.max_abs:.2g}, relative L2 {rel.rel_l2:.2g}"
               + (", all zero" if not np.any(value) else "") + "): with the module's own bias added the product "
               "reproduces PyTorch's output. The file's bias comes from another checkpoint, or was dropped.")
    fix = ("Re-export from the checkpoint PyTorch runs, or restore the bias: check the export or conversion step "
           "that wrote it (a converter that drops or zeroes biases, a state dict loaded without them).")
    product = ctx.onnx.graph.node_of(ctx.tensor)
    nodes = tuple(dict.fromkeys([*([product.name] if product is not None else []), add.name]))
    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix,
                   {"parameters": [{"initializer": const_input, "parameter": param, "layout": rel.layout.value,
                                    "max_abs": rel.max_abs, "rel_l2": rel.rel_l2,
                                    "fraction_differing": rel.fraction_differing, "correlation": rel.correlation}]},
                   changes=nodes, counterfactual=lambda c: _with_bias_at(c, add.name, const_input, bias))


def _readers_own(ctx: DiagnosisContext, candidates, size: int, initializer: str) -> dict[str, np.ndarray]:
    """The parameters of ``size`` elements of the modules whose nodes in the segment read ``initializer`` (by
    their scope): a weight's own module, wherever the segment's output was paired."""
    modules = {ctx.module_of(n)[0] for n in ctx.segment_nodes if initializer in n.inputs} - {None, ""}
    return {k: v for k, v in candidates.items() if v.size == size and any(k.startswith(m + ".") and "." not in
                                                                            k[len(m) + 1:] for m in modules)}


def _own_tensors(ctx: DiagnosisContext, candidates, size: int) -> dict[str, np.ndarray]:
    """The divergent module's own tensors of ``size`` elements: for an op, the parameters PyTorch's ops in the
    segment read (:attr:`DiagnosisContext.op_params`); else its parameters and folds, and its sibling Linear
    layers' weights concatenated with its own (a merged q/k/v projection) — not its neighbours' (a key's weight
    and a value's, exchanged, are both near)."""
    read = ctx.op_params
    by_op = {k: v for k, v in candidates.items()  # an op's own: the parameters PyTorch's ops in the segment read
             if v.size == size and (k in read or k.startswith("fold(") and any(  # (a functional attention's
                 f"{p}," in k or f"{p})" in k for p in read))}  # projections, another module's weight)
    if by_op:
        return by_op
    module = ctx.layer.pair.activation.module
    if not module:
        return {}
    parent = module.rpartition(".")[0]
    own = {k: v for k, v in candidates.items() if v.size == size and (k.startswith(module + ".") or k.startswith(
        "fold(") and f"{module}." in k)}
    for key, value in _concatenated(ctx, size).items():
        parents = {part.strip().rsplit(".", 2)[0] for part in key[len("concat("):-1].split(",")}
        if parents == {parent} and f"{module}." in key:
            own[key] = value
    return own


def _exchanged(ctx: DiagnosisContext, candidates) -> Finding | None:
    """An initializer holding exactly another module's parameter where the segment's module has one of its size
    with other numbers: with the module's own put back (in the same layout) the segment reproduces PyTorch — two
    layers' weights exchanged, a loader or converter matching parameters by shape."""
    tried = 0
    for name in _segment_initializers(ctx):
        value = ctx.initializer(name)
        if value is None or value.dtype.kind != "f" or value.size < 4:
            continue
        own = _readers_own(ctx, candidates, value.size, name) or _own_tensors(ctx, candidates, value.size)
        if not own or any((r := layout.relate(value, v)) is not None and r.equal for v in own.values()):
            continue
        elsewhere = _best(value, name, {**_everything(ctx, value.size), **_concatenated(ctx, value.size)})
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


#: constant tables tried in the place of a segment's constant, at most
MAX_TABLES = 8


def _stale_table(ctx: DiagnosisContext) -> Finding | None:
    """Constants the segment reads (no layer's weight) holding other numbers than the module outputs they were
    folded from (rotary cos and sin tables, a position table, a mask computed from buffers): with those outputs in
    their place the segment reproduces PyTorch — tables built with another base or length, a stale buffer.  Each
    constant is given its nearest such outputs (most rows in common, then correlation), all together first, then
    one at a time."""
    graph, found, fixed = ctx.onnx.graph, [], _input_free(ctx.ops)
    candidates = layout.torch_candidates(ctx)
    for name in dict.fromkeys(t for p in ctx.segment_protos for t in p.input):
        value = ctx.constant(name)
        if value is None or value.dtype.kind != "f" or value.size < 4 or graph.weighted_readers(name) \
                or any(graph.nodes[c].op_type in PRODUCT_OPS for c in graph.consumers.get(name, ())):
            continue
        if any((r := layout.relate(value, v)) is not None and r.equal for v in candidates.values()
               if v.size == value.size):
            continue  # a parameter's own numbers (a norm's scale, a bias): not a table
        outputs = {**_constant_activations(ctx, value.size),  # and PyTorch's ops computed from no input (a table
                   **{f"{a.name} (folded into a constant)": np.asarray(a.value, np.float64) for a in fixed  # gathered
                      if a.value.size == value.size and a.value.dtype.kind == "f"}}  # from a buffer in a forward)
        # in the constant's dtype, saturated as converters store them (float32's lowest is float16's in a mask)
        span = np.finfo(value.dtype)
        tables = [(what, np.clip(t.reshape(value.shape), span.min, span.max).astype(value.dtype))
                  for what, t in outputs.items()]
        tables = [(w, t) for w, t in tables if not np.allclose(t, value, rtol=1e-3, atol=1e-6)]
        # nearest first: most of the constant's rows among the table's (a table read from another offset, its
        # rows shifted), then by correlation
        tables.sort(key=lambda p: (-_rows_shared(value, p[1]), -layout.relate(value, p[1]).correlation))
        if tables:
            what, table = tables[0]
            if value.ndim >= 2 and value.shape[-1] == value.shape[-2] and np.allclose(
                    np.swapaxes(table, -1, -2), value, rtol=1e-3, atol=1e-6):
                continue  # the table transposed (a mask with query and key exchanged): the attribute rule's case
            found.append([(name, value, w, t.astype(value.dtype)) for w, t in tables[:TABLES_PER_CONSTANT]])
    # all constants' nearest together, then each constant's nearest alone, then each one's next ones
    tries = ([[f[0] for f in found]] if len(found) > 1 else []) + [
        [f[r]] for r in range(TABLES_PER_CONSTANT) for f in found if r < len(f)]
    for chosen in tries[:MAX_TABLES]:
        model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
        try:
            for name, _, _, restored in chosen:
                model, weights = edits.replace_array(model, weights, name, restored)
            values = ctx.run_segment(model, weights)
        except Exception:  # noqa: BLE001 - a table that does not fit or run is not the answer
            continue
        if ctx.compare(values[ctx.tensor], ctx.reference).ok:
            return _table_finding(ctx, chosen)
    return None


#: PyTorch values tried in a constant table's place, nearest first
TABLES_PER_CONSTANT = 3


def _nearest_rows(value: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """For each of ``value``'s rows (along its last axis) the nearest row of ``table`` and whether it equals it;
    None when the tables are too large to compare row by row or hold non-finite numbers."""
    if value.ndim == 0 or value.shape[-1] < 2:
        return None
    a = value.reshape(-1, value.shape[-1]).astype(np.float64)
    b = table.reshape(-1, value.shape[-1]).astype(np.float64)
    if len(a) * len(b) * a.shape[1] > MAX_ROW_WORK or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    nearest, distance = nearest_rows(a, b)
    return nearest, distance <= 1e-8 * ((a ** 2).sum(1) + 1e-30)


#: multiply-adds a row-by-row comparison of two tables may take
MAX_ROW_WORK = 1 << 26


def _rows_shared(value: np.ndarray, table: np.ndarray) -> float:
    """The fraction of ``value``'s rows (along its last axis) that equal some row of ``table``."""
    rows = _nearest_rows(value, table)
    return 0.0 if rows is None else float(np.mean(rows[1]))


def _row_shift(value: np.ndarray, table: np.ndarray) -> tuple[int, int, int] | None:
    """``(k, rows, of)`` when ``rows`` of ``value``'s ``of`` rows i — at least half — are ``table``'s row i + k
    (k ≠ 0: a table read from another offset)."""
    found = _nearest_rows(value, table) if value.ndim >= 2 else None
    if found is None:
        return None
    nearest, equal = found
    shifts = (nearest - np.arange(len(nearest)))[equal]
    if not shifts.size:
        return None
    k, count = np.unique(shifts, return_counts=True)
    best = int(k[count.argmax()])
    return (best, int(count.max()), len(nearest)) if best != 0 and count.max() >= len(nearest) / 2 else None


def _shift_text(row: dict) -> str:
    if row.get("row_shift") is None:
        return ""
    k, n, of = row["row_shift"], row["rows_shifted"], row["rows"]
    return f"; {n} of its {of} rows are PyTorch's shifted by {k} positions, row i holding row i + {k}"


def _input_free(ops) -> list:
    """PyTorch's ops computed from no model input: those reading nothing captured (a range, a full, a buffer)
    and those reading only such ops."""
    free: set[int] = set()
    for op in sorted(ops, key=lambda a: a.index):
        if all(i in free for i in op.inputs):
            free.add(op.index)
    return [a for a in ops if a.index in free]


def _table_finding(ctx: DiagnosisContext, chosen) -> Finding:
    rows = [{"initializer": name, "parameter": what, "layout": "folded table",
             "fraction_differing": float(np.mean(~np.isclose(value, restored, rtol=1e-3, atol=1e-6)))}
            for name, value, what, restored in chosen]
    for r, (_, value, _, restored) in zip(rows, chosen):
        shift = _row_shift(value, restored)
        if shift is not None:
            r["row_shift"], r["rows_shifted"], r["rows"] = shift
    listed = "; ".join(f"'{r['initializer']}' is {r['parameter']} with other numbers ({r['fraction_differing']:.0%} "
                       f"of its elements differ{_shift_text(r)})" for r in rows)
    summary = (f"Constant tables differ from what PyTorch computes: {listed} (each paired with the PyTorch value "
               "nearest it, by rows in common then correlation, among those computed from no input). With "
               "PyTorch's in their place the segment reproduces PyTorch's output. The tables were perhaps computed "
               "with another configuration than the model runs (a rotary base or a position offset, another "
               "length) or from a stale buffer.")
    fix = ("Re-export with the configuration and buffers the model runs with (rope_theta, max positions), or "
           "recompute the table in the graph instead of folding it.")
    replaced = [(name, restored) for name, _, _, restored in chosen]

    def counterfactual(c):
        model, weights = edits.copy_model(c.onnx.skeleton), c.onnx.weights
        for name, restored in replaced:
            model, weights = edits.replace_array(model, weights, name, restored)
        return FixedSegment(model, weights)

    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix, {"parameters": rows},
                   changes=_readers(ctx, [name for name, _ in replaced]), counterfactual=counterfactual)


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
                   changes=_readers(ctx, [name]),
                   counterfactual=lambda c: FixedSegment(*edits.replace_array(
                       edits.copy_model(c.onnx.skeleton), c.onnx.weights, name, restored)))


def _captured_bias(ctx: DiagnosisContext):
    """The divergent Linear's or Conv's bias as captured, else the bias of the module whose op the value is."""
    activation = ctx.layer.pair.activation
    return activation.bias if activation.bias is not None else _op_bias(ctx)


def _module_bias(ctx: DiagnosisContext) -> np.ndarray | None:
    """The divergent module's bias: a Linear's or Conv's (captured), an op's module's, else a one-dimensional
    ``bias`` parameter of the module itself (GPT-2's Conv1D, a custom projection)."""
    activation = ctx.layer.pair.activation
    bias = _captured_bias(ctx)
    if bias is None and not activation.op:
        module = ctx.torch_module()
        own = getattr(module, "bias", None) if module is not None else None
        bias = to_numpy(own) if hasattr(own, "detach") and own.dim() == 1 else None
    return None if bias is None else np.asarray(bias)


def _bias_missing(ctx: DiagnosisContext, candidates) -> Finding | None:
    """A Linear's or Conv's product that no bias is added to, where the module has one — or where a BatchNorm
    folded into it gives it one: the product plus that bias reproduces PyTorch (a converter dropped the bias
    input, or the Add after a MatMul).  The product node is the one computing the divergent tensor, or the one a
    Reshape / Transpose after it lays out."""
    product = _product_of(ctx, ctx.tensor)
    if product is None:
        return _bias_missing_inside(ctx)
    if product.op_type in ("Conv", "ConvTranspose", "Gemm") and len(product.inputs) > 2 and product.inputs[2]:
        return None  # it has a bias: a wrong one is a differing initializer
    own = _module_bias(ctx)
    biases = ([(own, _bias_name(ctx) or "the module's bias")] if own is not None else []) + [
        (np.asarray(v), k) for k, v in candidates.items() if k.startswith("fold(") and ".bias, " in k]
    value = ctx.local_value.astype(np.float64)
    for bias, param in biases[:3]:
        try:
            shape = [1] * value.ndim
            shape[_channel_axis(value, bias.size, product if ctx.onnx.graph.node_of(ctx.tensor) is product
                                else None)] = bias.size
            restored = value + bias.astype(np.float64).reshape(shape)
        except (ValueError, IndexError):
            continue
        if _adding_node(ctx, ctx.tensor, bias.size) is not None:
            return None  # a bias is added after it: the stale-bias reading (_bias_after)
        if np.any(bias) and ctx.compare(restored.astype(ctx.local_value.dtype), ctx.reference).ok:
            return _moved_later(ctx, product, bias) or _bias_missing_finding(ctx, product, bias, param, shape)
    return None


#: elementwise ops an activation is written with, walked back from an Add to the product it follows
ELEMENTWISE = alternatives.ELEMENTWISE | {"Celu", "Min", "Max", "Where"}


def _bias_moved(ctx: DiagnosisContext) -> Finding | None:
    """A bias added after the activation instead of to the product: in the segment, an Add of a constant of C
    values reads (through elementwise ops only) a product of C channels that no bias is added to; the segment
    with that Add moved onto the product reproduces PyTorch (``act(x) + b`` written for ``act(x + b)``)."""
    inside, tries = {n.name: n for n in ctx.segment_nodes}, 0
    for add in inside.values():
        if add.op_type != "Add" or len(add.inputs) != 2:
            continue
        constants = [ctx.constant(t) for t in add.inputs]
        if sum(c is not None for c in constants) != 1:
            continue
        at = 0 if constants[0] is not None else 1
        bias, stream = np.asarray(constants[at]), add.inputs[1 - at]
        if bias.size < 2 or max(bias.shape, default=1) != bias.size:
            continue
        for product, between in _products_behind(ctx, stream, inside):
            if not between or _bias_of(ctx, product) is not None:
                continue  # nothing between them, or the product has its bias: no bias moved past an activation
            tries += 1
            if tries > MAX_SWAPS:
                return None
            fixed = _moved(ctx, add, stream, product, bias)
            if fixed is not None and ctx.reproduces(fixed):
                return _bias_moved_finding(ctx, add, product, between, bias, fixed)
    return None


def _products_behind(ctx: DiagnosisContext, tensor: str, inside: dict) -> list:
    """``(product, the ops between)`` for each bias-less product (MatMul, Gemm, Conv) of the segment that
    ``tensor`` is computed from through elementwise ops only, nearest first."""
    graph, found, seen, frontier, between = ctx.onnx.graph, [], set(), [tensor], []
    while frontier and len(seen) < 32:
        node = graph.node_of(frontier.pop(0))
        if node is None or node.name in seen or node.name not in inside:
            continue
        seen.add(node.name)
        if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
            if not (node.op_type != "MatMul" and len(node.inputs) > 2 and node.inputs[2]):
                found.append(node)
        elif node.op_type in ELEMENTWISE:
            between.append(node.op_type)
            frontier.extend(t for t in node.inputs if t and ctx.constant(t) is None)
    return [(p, tuple(dict.fromkeys(between))) for p in found]


def _moved_later(ctx: DiagnosisContext, product, bias: np.ndarray) -> Finding | None:
    """The bias-moved finding when the bias missing from ``product`` is added after the ops reading it."""
    later = _added_later(ctx, product, bias)
    if later is None:
        return None
    add, stream, between = later
    fixed = _moved(ctx, add, stream, product, bias)
    return None if fixed is None else _bias_moved_finding(ctx, add, product, between, bias, fixed)


def _added_later(ctx: DiagnosisContext, product, bias: np.ndarray):
    """``(Add node, the tensor it adds to, the ops between)`` of an Add of ``bias`` after the ops that read the
    bias-less ``product`` (elementwise ops only, at most 16 nodes on): the bias moved past the activation."""
    graph, flat = ctx.onnx.graph, bias.reshape(-1)
    frontier, seen, between = [product.outputs[0]], set(), []
    while frontier and len(seen) < 16:
        tensor = frontier.pop(0)
        for reader in (graph.nodes[c] for c in graph.consumers.get(tensor, ())):
            if reader.name in seen or reader.op_type not in ELEMENTWISE:
                continue
            seen.add(reader.name)
            others = [ctx.constant(t) for t in reader.inputs if t != tensor]
            if reader.op_type == "Add" and between and len(others) == 1 and others[0] is not None \
                    and others[0].size == flat.size and np.allclose(others[0].reshape(-1), flat, rtol=1e-6, atol=0):
                return reader, tensor, tuple(dict.fromkeys(between))
            between.append(reader.op_type)
            frontier.extend(reader.outputs)
    return None


def _bias_broadcast(ctx: DiagnosisContext, product, size: int) -> list[int] | None:
    """The shape a bias of ``size`` values takes to be added to ``product``'s output (over a Conv's channel axis,
    a MatMul's / Gemm's last axis); None when that axis is not ``size`` long or the shape is unknown."""
    shape = ctx.onnx.graph.shapes.get(product.outputs[0])
    if not shape:
        return None
    axis = 1 if product.op_type in ("Conv", "ConvTranspose") else len(shape) - 1
    if shape[axis] != size:
        return None
    broadcast = [1] * len(shape)
    broadcast[axis] = size
    return broadcast


def _moved(ctx: DiagnosisContext, add, stream: str, product, bias: np.ndarray) -> FixedSegment | None:
    """The segment with ``add``'s constant added to ``product``'s output instead (the Add passing ``stream`` on)."""
    broadcast = _bias_broadcast(ctx, product, bias.size)
    if broadcast is None:
        return None
    fixed = _with_bias_after(ctx, product, broadcast, bias.reshape(-1))
    node = edits.node(fixed.model, add.name)
    node.op_type = "Identity"
    del node.input[:]
    node.input.append(stream)
    return fixed


def _bias_moved_finding(ctx: DiagnosisContext, add, product, between: tuple, bias: np.ndarray,
                        fixed: FixedSegment) -> Finding:
    param = _parameter_named(ctx, bias)
    what = f"{param} ({bias.size} values)" if param else f"a constant of {bias.size} values"
    summary = (f"Node {add.name} adds {what} after the ops ({', '.join(between)}) "
               f"that follow the product {product.name} ({product.op_type}), which no bias is added to: PyTorch adds "
               "the bias to the product before the activation. With the Add moved onto the product the segment "
               "reproduces PyTorch's output.")
    fix = ("Add the bias to the product (the node's bias input, or the Add right after the MatMul) and apply the "
           "activation to the sum; check the conversion or graph rewrite that moved it past the activation.")
    constant = next((t for t in add.inputs if ctx.constant(t) is not None), None)
    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix,
                   {"parameters": [{"initializer": constant, "parameter": param or None, "layout": "after activation",
                                    "max_abs": float(np.max(np.abs(bias))), "rel_l2": 0.0 if param else None,
                                    "fraction_differing": 0.0 if param else None,
                                    "correlation": 1.0 if param else None}]},
                   changes=(add.name, product.name), counterfactual=lambda c: fixed)


def _parameter_named(ctx: DiagnosisContext, value: np.ndarray) -> str:
    """The PyTorch parameter (or buffer) equal to ``value``, "" when none is (or with --reference)."""
    flat = value.reshape(-1).astype(np.float64)
    return next((name for name, tensor in _everything(ctx, flat.size).items()
                 if np.allclose(tensor.reshape(-1), flat, rtol=1e-5, atol=1e-7)), "")


def _product_of(ctx: DiagnosisContext, tensor: str):
    """The Conv / Gemm / MatMul computing ``tensor``, through the layout ops after it (at most two)."""
    node = ctx.onnx.graph.node_of(tensor)
    for _ in range(3):
        if node is None or node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul"):
            return node
        if node.op_type not in LAYOUT_OPS and node.op_type != "Cast":
            return None
        node = ctx.onnx.graph.node_of(node.inputs[0])
    return None


def _bias_missing_inside(ctx: DiagnosisContext) -> Finding | None:
    """The module's bias missing from a product inside the segment, with ops after it (``sin(ω·(xW + b))``, an
    activation the module applies itself): with the bias added to that product (an Add after it, or the node's
    bias input) the segment reproduces PyTorch."""
    bias = _module_bias(ctx)
    if bias is None or not np.any(bias):
        return None
    graph = ctx.onnx.graph
    for proto in ctx.segment_protos:
        node = graph.node_of(proto.output[0]) if proto.output else None
        if node is None or node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or (
                node.op_type != "MatMul" and len(node.inputs) > 2 and node.inputs[2]) \
                or _adding_node(ctx, node.outputs[0], bias.size) is not None:
            continue
        broadcast = _bias_broadcast(ctx, node, bias.size)
        if broadcast is None:
            continue
        fixed = _with_bias_after(ctx, node, broadcast, bias)
        try:
            values = ctx.run_segment(fixed.model, fixed.weights)
        except Exception:  # noqa: BLE001 - a bias that does not fit or run is not the answer
            continue
        if ctx.compare(values[ctx.tensor], ctx.reference).ok:
            moved = _moved_later(ctx, node, bias)
            if moved is not None:
                return moved
            finding = _bias_missing_finding(ctx, node, bias, _bias_name(ctx) or "the module's bias", broadcast)
            return dataclasses.replace(finding, counterfactual=lambda c, n=node, b=broadcast: _with_bias_after(
                c, n, b, bias))
    return None


def _with_bias_after(ctx: DiagnosisContext, product, shape: list[int], bias: np.ndarray) -> FixedSegment:
    """The model with ``bias`` added to the product's output by an Add right after it (its readers read the sum)."""
    model = edits.copy_model(ctx.onnx.skeleton)
    out = product.outputs[0]
    weight = next((ctx.constant(t) for t in product.inputs[1:2] if ctx.constant(t) is not None), None)
    kind = ctx.onnx.graph.elem_types.get(out)
    dtype = helper.tensor_dtype_to_np_dtype(kind) if kind else (weight.dtype if weight is not None else np.float32)
    inner = f"{out}_without_bias"
    nodes = list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == product.name)
    nodes[at].output[0] = inner
    const = edits.add_initializer(model, f"{product.name}_restored_bias", bias.astype(dtype).reshape(shape))
    add = helper.make_node("Add", [inner, const], [out], name=f"{product.name}_bias_add")
    model.graph.ClearField("node")
    model.graph.node.extend(nodes[:at + 1] + [add] + nodes[at + 1:])
    edits.drop_value_info(model, {out, inner})
    return FixedSegment(model, ctx.onnx.weights)


def _bias_missing_finding(ctx: DiagnosisContext, product, bias: np.ndarray, param: str, shape: list[int]) -> Finding:
    summary = (f"Node {product.name} ({product.op_type}) computes the product without a bias, while PyTorch adds "
               f"{param} ({bias.size} values, max abs {float(np.max(np.abs(bias))):.2g}): the product plus that bias "
               "reproduces PyTorch's output. The file dropped the bias.")
    fix = ("Restore the bias (the node's bias input, or the Add after the MatMul), or re-export: check the "
           "conversion step that dropped it (a converter that skips biases, a state dict loaded without them).")
    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix,
                   {"parameters": [{"initializer": None, "parameter": param, "layout": "missing",
                                    "max_abs": float(np.max(np.abs(bias))), "rel_l2": 1.0,
                                    "fraction_differing": 1.0, "correlation": None}]},
                   changes=(product.name,), counterfactual=lambda c: _with_bias(c, product, shape, bias))


def _with_bias(ctx: DiagnosisContext, product, shape: list[int], bias: np.ndarray) -> FixedSegment:
    """The segment with the module's bias added to the product: as the node's bias input (Conv, Gemm), else by
    an Add after it that computes the divergent tensor."""
    model = edits.copy_model(ctx.onnx.skeleton)
    dtype = ctx.local_value.dtype
    if product.op_type in ("Conv", "ConvTranspose", "Gemm"):
        target = edits.node(model, product.name)
        del target.input[2:]
        while len(target.input) < 2:
            target.input.append("")
        target.input.append(edits.add_initializer(model, f"{product.name}_restored_bias",
                                                  bias.astype(dtype).reshape(-1)))
        return FixedSegment(model, ctx.onnx.weights)
    inner = f"{ctx.tensor}_without_bias"
    for n in model.graph.node:  # the node computing the divergent tensor: the product, or a layout op after it
        if ctx.tensor in n.output:
            n.output[list(n.output).index(ctx.tensor)] = inner
    const = edits.add_initializer(model, f"{product.name}_restored_bias", bias.astype(dtype).reshape(shape))
    model.graph.node.append(helper.make_node("Add", [inner, const], [ctx.tensor], name=f"{product.name}_bias_add"))
    edits.drop_value_info(model, {ctx.tensor, inner})
    return FixedSegment(model, ctx.onnx.weights)


#: ATen ops that add their module's bias to the product they compute
BIASED_OPS = ("aten.addmm", "aten.linear", "aten.convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d",
              "aten.baddbmm")


def _op_bias(ctx: DiagnosisContext) -> np.ndarray | None:
    """The bias parameter of the module whose weight the divergent op (``aten.addmm`` ...) read — a functional
    ``F.linear`` with a child's weight, an attention's packed projections — else of the module running it."""
    found = _op_bias_param(ctx)
    return None if found is None else found[1]


def _op_bias_param(ctx: DiagnosisContext) -> tuple[str, np.ndarray] | None:
    """``(qualified name, value)`` of :func:`_op_bias`'s parameter."""
    activation = ctx.layer.pair.activation
    if not activation.op or not activation.module_type.startswith(BIASED_OPS):
        return None
    for name in activation.params:  # a one-dimensional bias parameter the op read itself (a GRUCell's bias_hh)
        owner, _, leaf = name.rpartition(".")
        module = ctx.torch_module(owner) if "bias" in leaf else None
        bias = getattr(module, leaf, None) if module is not None else None
        if hasattr(bias, "detach") and bias.dim() == 1:
            return name, to_numpy(bias)
    owners = [p.rpartition(".")[0] for p in activation.params if p.endswith(".weight")] + [activation.module]
    for owner in owners:
        module = ctx.torch_module(owner)
        bias = getattr(module, "bias", None) if module is not None else None
        if bias is not None and hasattr(bias, "detach"):
            return (f"{owner}.bias" if owner else "bias"), to_numpy(bias)
    return None


def _bias_name(ctx: DiagnosisContext) -> str:
    """The qualified name of the divergent module's bias (its op's: :func:`_op_bias_param`), "" when unnamed."""
    found = _op_bias_param(ctx)
    module = ctx.layer.pair.activation.module
    return found[0] if found is not None else f"{module}.bias" if module else ""


def _adding_node(ctx: DiagnosisContext, tensor: str, size: int):
    """``(Add node, its constant input, the constant)`` of the one node reading ``tensor`` when it adds a constant
    of ``size`` elements (a bias)."""
    graph = ctx.onnx.graph
    readers = [graph.nodes[c] for c in graph.consumers.get(tensor, ())]
    if len(readers) != 1 or readers[0].op_type not in BIAS_ADDERS:
        return None
    add = readers[0]
    other = next((t for t in add.inputs if t != tensor), None)
    value = ctx.constant(other) if other else None
    if value is None or value.size != size or value.dtype.kind != "f":
        return None
    return add, other, value


def _channel_axis(value: np.ndarray, size: int, producer) -> int:
    """The axis a bias of ``size`` is added along: a Conv's channels (axis 1), else the last axis."""
    if producer is not None and producer.op_type in ("Conv", "ConvTranspose") and value.ndim > 1:
        return 1
    if value.shape[-1] != size:
        raise ValueError("no axis of the bias's size")
    return value.ndim - 1


def _with_bias_at(ctx: DiagnosisContext, add: str, const_input: str, bias: np.ndarray) -> FixedSegment:
    """The Add adds the module's bias, and computes the divergent tensor itself (the product renamed): the
    segment then ends with the bias added, as PyTorch's Linear or Conv does."""
    model = edits.copy_model(ctx.onnx.skeleton)
    product = f"{ctx.tensor}_without_bias"
    old_out = None
    for n in model.graph.node:
        if ctx.tensor in n.output:
            n.output[list(n.output).index(ctx.tensor)] = product
        elif n.name == add:
            old_out = n.output[0]
    target = edits.node(model, add)
    value = ctx.constant(const_input)
    fixed = edits.add_initializer(model, f"{add}_restored_bias", bias.astype(value.dtype).reshape(value.shape))
    target.input[:] = [product if t == ctx.tensor else fixed if t == const_input else t for t in target.input]
    target.output[0] = ctx.tensor
    if old_out is not None:
        edits.rewire(model, old_out, ctx.tensor)
    edits.drop_value_info(model, {ctx.tensor, old_out, product})
    return FixedSegment(model, ctx.onnx.weights)
