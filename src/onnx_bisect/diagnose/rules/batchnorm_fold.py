"""BatchNorm fold: a Conv/Gemm carrying a folded BatchNorm whose weights are not the fold of the PyTorch parameters."""
from __future__ import annotations

import functools

import numpy as np

from ..support import edits, layout
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule

#: relative per-channel error above which a folded scale or shift counts as wrong
CHANNEL_RTOL = 1e-4


class BatchNormFold(Rule):
    """Refold the BatchNorm from the PyTorch parameters and see which channels, and which mistake, explain the weights."""

    cause = Cause.BATCHNORM_FOLD

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local):
            return None
        pair = layout.conv_bn_pair(ctx)
        if pair is None:
            return _scale_and_shift(ctx)
        conv_name, conv, bn_name, bn = pair
        shape = layout.conv_bn_arrays(conv, bn)[0].shape  # output channels first
        for site in layout.weight_sites(ctx):
            stored = ctx.initializer(site.weight)
            w = layout.as_out_in(site, stored)
            if w is None or tuple(w.shape) != tuple(shape):
                continue
            b = ctx.constant(site.bias) if site.bias else None
            # a fold stored in float16 is off by float16's rounding, which is no fold mistake (precision's case)
            rtol = max(CHANNEL_RTOL, 2 * float(np.finfo(stored.dtype).eps)) \
                if np.issubdtype(stored.dtype, np.floating) else CHANNEL_RTOL
            fold = _analyse(ctx, w, b, conv, bn, conv_name, rtol)
            if fold is None:
                continue
            channels = fold["channels_off"]
            summary = (
                f"{site.node} ({site.op}) carries {bn_name} ({type(bn).__name__}) folded into {conv_name}, but "
                f"{len(channels)} of {fold['channels']} output channels do not match the fold of the PyTorch "
                f"parameters (scale off by up to {fold['max_scale_rel_error']:.2g} relative, shift by "
                f"{fold['max_shift_abs_error']:.2g}); the weights fit {fold['mistake_text']}."
            )
            fix = ("Refold the BatchNorm from the module in eval mode: w' = w·γ/√(running_var+eps), "
                   "b' = (b − running_mean)·γ/√(running_var+eps) + β, with the module's own eps and running "
                   "statistics (call model.eval() before folding or exporting).")
            evidence = {k: v for k, v in fold.items() if k != "mistake_text"}
            evidence.update(onnx_node=site.node, weight=site.weight, bias=site.bias, conv=conv_name, batchnorm=bn_name)
            reference = None
            if ctx.layer.pair.activation.module == conv_name:
                # aligned with the conv (the wrong fold matched nothing else), but it computes conv + BatchNorm
                summary += f" The tensor was aligned with {conv_name}; it computes {conv_name} followed by {bn_name}."
                reference = functools.partial(_bn_reference, bn_name=bn_name)
            # no way of folding fits (other statistics, or another BatchNorm's): unconfirmed, that is a lead only
            confidence = 0.75 if fold["mistake"] == "running-statistics" else 0.9
            readers = [site.node] + [p.name for p in ctx.segment_protos if site.bias and site.bias in p.input]
            return Finding(self.cause, confidence, summary, fix, evidence, changes=tuple(dict.fromkeys(readers)),
                           counterfactual=lambda c, s=site: _refold(c, s, conv, bn), reference=reference)
        # the layer before it carries no fold (a Linear before a BatchNorm1d): the BatchNorm may be its own Mul, Add
        return _scale_and_shift(ctx)


#: scale and shift mistakes of a BatchNorm written as a per-channel Mul and Add: ``(name, text, scale, shift)``
#: from ``(gamma, beta, mean, var, eps)``
SCALE_SHIFT_MISTAKES = (
    ("variance-for-std", "the variance where the standard deviation belongs (scale γ/(var+eps))",
     lambda g, b, m, v, e: g / (v + e), lambda g, b, m, v, e: b - m * g / (v + e)),
    ("epsilon-dropped", "no epsilon (scale γ/√var)",
     lambda g, b, m, v, e: g / np.sqrt(v), lambda g, b, m, v, e: b - m * g / np.sqrt(v)),
    ("mean-not-subtracted", "the running mean not subtracted (shift β)",
     lambda g, b, m, v, e: g / np.sqrt(v + e), lambda g, b, m, v, e: b),
    ("shift-not-scaled", "the shift not scaled (shift β − μ)",
     lambda g, b, m, v, e: g / np.sqrt(v + e), lambda g, b, m, v, e: b - m),
)


def _scale_and_shift(ctx: DiagnosisContext) -> Finding | None:
    """A BatchNorm module the file computes as a per-channel Mul and Add of constants (folded on its own, no
    conv before it) whose scale and shift are not γ/√(var+eps) and β − μ·scale: which channels, which mistake
    fits; the fix writes the true ones."""
    module = ctx.layer.pair.activation.module
    bn = ctx.torch_module(module) if module else None
    if bn is None or type(bn).__name__ not in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d") \
            or getattr(bn, "running_var", None) is None:
        return None
    gamma, beta, mean, var = layout.bn_arrays(bn)
    found, outputs, nodes = {}, {}, {}
    for proto in ctx.segment_protos:
        if proto.op_type in ("Mul", "Add") and len(proto.input) == 2:
            for t in proto.input:
                value = ctx.initializer(t)
                if value is not None and value.size == gamma.size and np.issubdtype(value.dtype, np.floating) \
                        and proto.op_type not in found and (proto.op_type == "Mul" or outputs.get("Mul") in proto.input):
                    found[proto.op_type], outputs[proto.op_type] = (t, value), proto.output[0]
                    nodes[proto.op_type] = proto.name
    if set(found) != {"Mul", "Add"}:  # the scale's Mul, then the Add of the shift to its product
        return None
    (scale_name, scale), (shift_name, shift) = found["Mul"], found["Add"]
    true = (gamma / np.sqrt(var + bn.eps), beta - mean * gamma / np.sqrt(var + bn.eps))
    have = (scale.astype(np.float64).reshape(-1), shift.astype(np.float64).reshape(-1))
    off = [np.max(np.abs(h - t) / (np.abs(t) + 1e-6)) for h, t in zip(have, true)]
    if max(off) <= max(CHANNEL_RTOL, 2 * float(np.finfo(scale.dtype).eps)):  # a float16 fold's rounding is none
        return None
    params = (gamma, beta, mean, var, bn.eps)
    fits = {name: max(np.max(np.abs(have[0] - fs(*params)) / (np.abs(fs(*params)) + 1e-6)),
                      np.max(np.abs(have[1] - ft(*params)) / (np.abs(ft(*params)) + 1e-6)))
            for name, _, fs, ft in SCALE_SHIFT_MISTAKES}
    best = min(fits, key=fits.get)
    text = next(t for n, t, _, _ in SCALE_SHIFT_MISTAKES if n == best) if fits[best] <= 1e-3 else \
        "no known mistake (running statistics or affine parameters from elsewhere)"
    summary = (f"{module} ({type(bn).__name__}) is computed as a per-channel scale '{scale_name}' and shift "
               f"'{shift_name}', but they are not its fold γ/√(running_var+eps) and β − running_mean·scale (scale "
               f"off by up to {off[0]:.2g} relative, shift by {off[1]:.2g}); they fit {text}.")
    fix = ("Refold the BatchNorm from the module in eval mode: scale = γ/√(running_var+eps), shift = β − "
           "running_mean·scale, with the module's own eps and running statistics.")
    evidence = {"batchnorm": module, "scale": scale_name, "shift": shift_name, "mistake": best if fits[best] <= 1e-3
                else "unknown", "max_scale_rel_error": float(off[0]), "max_shift_rel_error": float(off[1])}

    def refolded(c: DiagnosisContext) -> FixedSegment:
        model, weights = edits.copy_model(c.onnx.skeleton), c.onnx.weights
        for name, value, want in ((scale_name, scale, true[0]), (shift_name, shift, true[1])):
            model, weights = edits.replace_array(model, weights, name, want.reshape(value.shape).astype(value.dtype))
        return FixedSegment(model, weights)
    return Finding(Cause.BATCHNORM_FOLD, 0.9, summary, fix, evidence, changes=(nodes["Mul"], nodes["Add"]),
                   counterfactual=refolded)


def _analyse(ctx: DiagnosisContext, w: np.ndarray, b: np.ndarray | None, conv, bn, conv_name: str,
             rtol: float = CHANNEL_RTOL) -> dict | None:
    """Per-channel comparison with the true fold, and the mistake that fits best (None: a correct fold, or no fold)."""
    wc, bc, gamma, beta, mean, var = layout.conv_bn_arrays(conv, bn)
    w = w.astype(np.float64).reshape(w.shape[0], -1)
    wc2 = wc.reshape(wc.shape[0], -1)
    b = np.zeros(w.shape[0]) if b is None else b.astype(np.float64).reshape(-1)
    denom = np.maximum(np.sum(wc2 * wc2, axis=1), 1e-300)
    ratio = np.sum(w * wc2, axis=1) / denom
    residual = np.linalg.norm(w - ratio[:, None] * wc2, axis=1) / np.maximum(np.linalg.norm(w, axis=1), 1e-30)
    if residual.max() > 1e-3:
        return None  # not a per-channel rescale of the conv weight: not a fold (weight-mismatch's case)
    scale = gamma / np.sqrt(var + bn.eps)
    shift = (bc - mean) * scale + beta
    scale_err = np.abs(ratio - scale) / np.maximum(np.abs(scale), 1e-30)
    shift_err = np.abs(b - shift)
    off = np.nonzero((scale_err > rtol) | (shift_err > rtol * (1 + np.abs(shift)) + 1e-6))[0]
    if off.size == 0:
        return None
    mistake, text, fitted = _mistake(ctx, ratio, b, (bc, gamma, beta, mean, var, bn.eps), conv_name)
    if layout.pruned_channels(w, wc2)[off].all():
        return None  # whole output channels zeroed (pruned): no fold rescales by zero, the weight rule's case
    if mistake == "running-statistics" and float(scale_err.max()) <= rtol:
        # the scale is the fold's exactly and only the shift differs, as no way of folding explains: a bias
        # (or running mean / beta) from another checkpoint — the weight rule's stale value, not a fold mistake
        return None
    return {"channels": int(w.shape[0]), "channels_off": off.tolist()[:64], "n_channels_off": int(off.size),
            "max_scale_rel_error": float(scale_err.max()), "max_shift_abs_error": float(shift_err.max()),
            "mistake": mistake, "mistake_text": text, **fitted}


def _mistake(ctx: DiagnosisContext, ratio, b, params, conv_name: str):
    """The hypothesis about how the fold went wrong that reproduces the ONNX scale and shift best."""
    bc, gamma, beta, mean, var, eps = params
    implied = (gamma / np.where(ratio == 0, np.nan, ratio)) ** 2  # = var' + eps'
    eps_fit = float(np.nanmedian(implied - var))
    hypotheses = {"epsilon": (mean, var, max(eps_fit, 0.0))}
    act = ctx.activation_of(conv_name)
    if act is not None and act.value.ndim >= 2:
        x = act.value.astype(np.float64)
        axes = tuple(i for i in range(x.ndim) if i != 1)
        hypotheses["batch-statistics"] = (x.mean(axis=axes), x.var(axis=axes), eps)
        n = x.size / x.shape[1]
        hypotheses["batch-statistics-unbiased"] = (x.mean(axis=axes), x.var(axis=axes) * n / max(n - 1, 1), eps)
    hypotheses["default-statistics"] = (np.zeros_like(mean), np.ones_like(var), eps)
    errors = {}
    for name, (m, v, e) in hypotheses.items():
        s = gamma / np.sqrt(v + e)
        errors[name] = float(max(np.max(np.abs(s - ratio) / np.maximum(np.abs(ratio), 1e-30)),
                                 np.max(np.abs((bc - m) * s + beta - b) / (1 + np.abs(b)))))
    best = min(errors, key=errors.get)
    fitted = {"fit_error": {k: round(v, 6) for k, v in errors.items()}, "fitted_epsilon": eps_fit, "pytorch_eps": eps}
    if errors[best] > 1e-3:
        implied_mean = bc - (b - beta) / np.where(ratio == 0, np.nan, ratio)
        fitted.update(implied_running_var_max_rel_error=float(np.nanmax(np.abs(implied - eps - var) / var)),
                      implied_running_mean_max_abs_error=float(np.nanmax(np.abs(implied_mean - mean))))
        return "running-statistics", "running statistics other than the module's (another checkpoint or a stale copy)", fitted
    if best == "epsilon":
        if abs(eps_fit) < 0.1 * eps:
            return "epsilon-dropped", f"a fold without epsilon (eps=0 instead of {eps:g})", fitted
        return "epsilon", f"a fold with eps={eps_fit:.3g} instead of the module's {eps:g}", fitted
    if best.startswith("batch-statistics"):
        return "batch-statistics", "a fold with the batch's own mean and variance (BatchNorm in training mode)", fitted
    return "default-statistics", "a fold with mean 0 and variance 1 (running statistics never loaded)", fitted


def _refold(ctx: DiagnosisContext, site, conv, bn) -> FixedSegment:
    """The skeleton and weights with ``site``'s weight and bias replaced by the true fold."""
    wc, bc, gamma, beta, mean, var = layout.conv_bn_arrays(conv, bn)
    scale = gamma / np.sqrt(var + bn.eps)
    w = wc * scale.reshape(-1, *[1] * (wc.ndim - 1))
    shift = (bc - mean) * scale + beta
    model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
    model, weights = edits.replace_array(model, weights, site.weight, layout.to_onnx_layout(site, w))
    if site.bias:
        model, weights = edits.replace_array(model, weights, site.bias, shift)
    else:
        layout.add_bias(model, site, shift.astype(np.float32))
    return FixedSegment(model, weights)


def _bn_reference(ctx: DiagnosisContext, bn_name: str) -> np.ndarray:
    """The BatchNorm's PyTorch output in the layout of the divergent tensor."""
    value = ctx.activation_of(bn_name).value
    return value.reshape(ctx.reference.shape)
