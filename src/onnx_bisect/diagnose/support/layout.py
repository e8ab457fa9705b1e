"""Where a segment keeps its weights, in which layout, and which PyTorch Conv/Linear + BatchNorm they come from."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from .param_layouts import model_rnn_weights, owner_of, rnn_weights
from . import edits
from ...records import Layout, ModuleKind
from ...records.kinds import module_kind as module_kind_of
from ..context import DiagnosisContext, attribute



@dataclass(frozen=True)
class WeightSite:
    """A Conv/Gemm/MatMul node of the segment reading its weight (and maybe bias) from initializers."""

    node: str
    op: str
    weight: str
    bias: str | None
    transposed: bool  # the ONNX weight is (in, out), the PyTorch one (out, in)
    groups: int = 0  # a ConvTranspose's groups: its weight is (in, out/groups, k...); 0 for the others


def weight_sites(ctx: DiagnosisContext) -> list[WeightSite]:
    """Every weight-carrying node of the segment whose weight is an initializer."""
    sites = []
    for p in ctx.segment_protos:
        if p.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or len(p.input) < 2:
            continue
        if ctx.initializer(p.input[1]) is None:
            continue
        if p.op_type == "ConvTranspose":
            bias = p.input[2] if len(p.input) > 2 and p.input[2] else None
            sites.append(WeightSite(p.name, p.op_type, p.input[1], bias, False, int(attribute(p, "group", 1))))
        elif p.op_type == "Conv":
            bias = p.input[2] if len(p.input) > 2 and p.input[2] else None
            sites.append(WeightSite(p.name, p.op_type, p.input[1], bias, False))
        elif p.op_type == "Gemm":
            bias = p.input[2] if len(p.input) > 2 and p.input[2] and ctx.constant(p.input[2]) is not None else None
            sites.append(WeightSite(p.name, p.op_type, p.input[1], bias, not attribute(p, "transB", 0)))
        else:
            sites.append(WeightSite(p.name, p.op_type, p.input[1], _matmul_bias(ctx, p), True))
    return sites


def _matmul_bias(ctx: DiagnosisContext, matmul: onnx.NodeProto) -> str | None:
    for i in ctx.onnx.graph.consumers.get(matmul.output[0], ()):
        add = ctx.onnx.graph.nodes[i]
        if add.op_type == "Add" and add.name in ctx.layer.segment:
            for t in add.inputs:
                value = ctx.constant(t) if t != matmul.output[0] else None
                if value is not None and value.ndim == 1:
                    return t
    return None


def as_out_in(site: WeightSite, w: np.ndarray | None) -> np.ndarray | None:
    """The ONNX weight in a convolution's (out, in, ...) layout (a ConvTranspose's regrouped, see
    :func:`out_major`); None when it is not a float array."""
    if w is None or not np.issubdtype(w.dtype, np.floating):
        return None
    if site.groups:
        return out_major(w, site.groups)
    return w.T if site.transposed and w.ndim == 2 else w


def to_onnx_layout(site: WeightSite, w: np.ndarray) -> np.ndarray:
    """Inverse of :func:`as_out_in`."""
    if site.groups:
        return from_out_major(w, site.groups)
    return w.T if site.transposed and w.ndim == 2 else w


def out_major(w: np.ndarray, groups: int) -> np.ndarray:
    """A transposed convolution's weight (in, out/groups, k...) as a convolution's (out, in/groups, k...): each
    group's block transposed, so that a per-output-channel scale (a folded BatchNorm) is along axis 0."""
    cin, cog, k = w.shape[0], w.shape[1], w.shape[2:]
    return w.reshape(groups, cin // groups, cog, *k).swapaxes(1, 2).reshape(groups * cog, cin // groups, *k)


def from_out_major(w: np.ndarray, groups: int) -> np.ndarray:
    """Inverse of :func:`out_major`."""
    cout, cig, k = w.shape[0], w.shape[1], w.shape[2:]
    return w.reshape(groups, cout // groups, cig, *k).swapaxes(1, 2).reshape(groups * cig, cout // groups, *k)


def _transpose_groups(conv) -> int:
    """A PyTorch transposed convolution's groups; 0 for any other module."""
    return int(conv.groups) if module_kind_of(conv) is ModuleKind.CONV_TRANSPOSE else 0


def add_bias(model: onnx.ModelProto, site: WeightSite, bias: np.ndarray) -> None:
    """Give ``site``'s node a bias it did not have (in place on a copy)."""
    name = edits.add_initializer(model, f"{site.node}_refolded_bias", bias)
    node = edits.node(model, site.node)
    if site.op in ("Conv", "Gemm"):
        del node.input[2:]
        node.input.append(name)
        return
    out = node.output[0]
    node.output[0] = f"{out}_unbiased"
    add = helper.make_node("Add", [node.output[0], name], [out], name=f"{site.node}_refolded_bias_add")
    nodes = list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == site.node) + 1
    model.graph.ClearField("node")
    model.graph.node.extend(nodes[:at] + [add] + nodes[at:])


def conv_bn_pair(ctx: DiagnosisContext):
    """``(conv name, conv, bn name, bn)`` when the divergent layer is a Conv/Linear followed by a BatchNorm."""
    return next(conv_bn_pairs(ctx), None)


def conv_bn_pairs(ctx: DiagnosisContext):
    """Every ``(conv name, conv, bn name, bn)`` of a Conv/Linear followed by a BatchNorm among the divergent
    layer, the modules the segment's nodes belong to and the modules owning the weights it reads by name (a
    file without scopes keeps its initializers' names), the divergent layer's first."""
    acts = ctx.baseline.capture.activations
    candidates = [ctx.layer.pair.activation]
    owners = [ctx.layer.pair.activation.module] if ctx.layer.pair.activation.op else []  # an op: its module's
    owners += [ctx.module_of(n)[0] for n in ctx.segment_nodes]
    owners += [owner_of(t) for p in ctx.segment_protos for t in p.input[1:] if "." in t]
    owners = [o for o in dict.fromkeys(owners) if o]
    for name in owners:
        act = ctx.activation_of(name)
        if act is not None:
            candidates.append(act)
    # a node scoped to a container (a fused node named after the Relu its block applies) computes one of its
    # children: their Conv → BatchNorm pairs are the segment's too
    candidates += [a for a in acts if a.call == 0 and a.kind.folds_batchnorm and not a.op
                   and any(a.module.startswith(o + ".") for o in owners)]
    seen = set()
    for act in candidates:
        found = None
        if act.kind is ModuleKind.BATCHNORM:
            src = next((acts[i] for i in act.inputs if acts[i].kind.folds_batchnorm), None)
            found = (src, act) if src is not None else None
        elif act.kind.folds_batchnorm:
            bn = next((later for later in acts[act.index + 1:]
                       if act.index in later.inputs and later.kind is ModuleKind.BATCHNORM), None)
            found = (act, bn) if bn is not None else None
        if found is not None and (found[0].module, found[1].module) not in seen:
            seen.add((found[0].module, found[1].module))
            conv, bn = found
            yield conv.module, ctx.torch_module(conv.module), bn.module, ctx.torch_module(bn.module)


def _arr(t):
    return t.detach().double().cpu().numpy()


def out_channels(module) -> int | None:
    """A Conv's, ConvTranspose's or Linear's number of output channels (None for another module)."""
    return getattr(module, "out_channels", None) or getattr(module, "out_features", None)


def conv_bn_arrays(conv, bn):
    """``(w, b, gamma, beta, running_mean, running_var)`` as float64 arrays (defaults for absent ones); ``w``
    output channels first (a transposed convolution's regrouped, see :func:`out_major`)."""
    groups = _transpose_groups(conv)
    w = out_major(_arr(conv.weight), groups) if groups else _arr(conv.weight)
    b = _arr(conv.bias) if conv.bias is not None else np.zeros(w.shape[0])
    return (w, b, *bn_arrays(bn, w.shape[0]))


def bn_arrays(bn, channels: int | None = None):
    """``(gamma, beta, running_mean, running_var)`` of a BatchNorm as float64 arrays (defaults for absent ones)."""
    out = channels if channels is not None else bn.num_features
    gamma = _arr(bn.weight) if bn.weight is not None else np.ones(out)
    beta = _arr(bn.bias) if bn.bias is not None else np.zeros(out)
    mean = _arr(bn.running_mean) if bn.running_mean is not None else np.zeros(out)
    var = _arr(bn.running_var) if bn.running_var is not None else np.ones(out)
    return gamma, beta, mean, var


@dataclass(frozen=True)
class Relation:
    """How an ONNX initializer relates to a PyTorch tensor in the best-fitting layout."""

    layout: Layout
    max_abs: float  # inf when the initializer holds inf/NaN where PyTorch is finite
    rel_l2: float  # ||onnx − torch|| / ||torch||
    correlation: float  # over the elements finite on both sides
    fraction_differing: float
    equal: bool  # equal up to the ONNX dtype's rounding

    @property
    def related(self) -> bool:
        """Whether the two are the same tensor with some values changed (correlated, or mostly equal), not
        merely two tensors of one size."""
        return self.correlation >= 0.5 or self.fraction_differing <= 0.5


def relate(onnx_value: np.ndarray, torch_value: np.ndarray) -> Relation | None:
    """Compare an initializer with a PyTorch tensor, allowing a transpose or a reshape; None if sizes differ.

    Non-finite or absurd values (a corrupt or hostile file) give honest figures: they differ, by inf.
    """
    if onnx_value.size != torch_value.size or onnx_value.size == 0:
        return None
    t = torch_value.astype(np.float64)
    layouts = []
    if onnx_value.shape == t.shape:
        layouts.append((Layout.SAME, t))
    if t.ndim == 2 and onnx_value.shape == t.T.shape:
        layouts.append((Layout.TRANSPOSED, t.T))
    if not layouts:
        layouts.append((Layout.RESHAPED, t.reshape(onnx_value.shape)))
    o = onnx_value.astype(np.float64)
    best = None
    with np.errstate(all="ignore"):
        for name, ref in layouts:
            rounded = ref.astype(onnx_value.dtype).astype(np.float64) if onnx_value.dtype != np.float64 else ref
            d = np.abs(o - rounded)
            d = np.where(np.isnan(d), np.inf, d)  # NaN where PyTorch has a number differs (0-d safe)
            rel = _rel_l2(o, ref)
            if best is None or rel < best[2]:
                best = (name, ref, rel, d)
    name, ref, rel, d = best
    finite = np.isfinite(ref)
    scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 1.0
    tol = 4 * float(np.finfo(onnx_value.dtype).eps) * (scale or 1.0) \
        if np.issubdtype(onnx_value.dtype, np.floating) else 0.0
    both = finite & np.isfinite(o)
    off = _off_by_more_than_a_step(ref, d, onnx_value.dtype)
    return Relation(name, float(d.max()), rel, _correlation(o[both], ref[both]),
                    float(np.mean(d > tol)) if off is None else off,
                    bool(d.max() <= tol) and (off is None or off <= HALF_OFF_BY_MORE))


#: of a half-precision copy, the fraction of elements allowed more than one unit in the last place from the
#: rounded PyTorch value (a fold computed in another order lands on the neighbouring float16 value at most)
HALF_OFF_BY_MORE = 0.01


def _off_by_more_than_a_step(ref: np.ndarray, d: np.ndarray, dtype) -> float | None:
    """For a half-precision initializer, the fraction of its elements more than one unit in the last place from
    PyTorch's value rounded (None for other dtypes): its step (~1e-3 relative) is so coarse that noise of a few
    steps hides under a bound scaled by the largest weight, while a rounded copy is within a step of every
    element."""
    if not np.issubdtype(dtype, np.floating) or np.dtype(dtype).itemsize > 2 or d.size == 0:
        return None
    with np.errstate(all="ignore"):
        step = np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
    return float(np.mean(d > step))


def _rel_l2(o: np.ndarray, ref: np.ndarray) -> float:
    """``||o − ref|| / ||ref||``; inf when ``o`` is non-finite where ``ref`` is not, or the difference overflows."""
    if not np.isfinite(o).all() and np.isfinite(ref).all():
        return float("inf")
    norm = float(np.linalg.norm(ref)) or 1.0
    diff = float(np.linalg.norm(o - ref))
    return diff / norm if np.isfinite(diff) else float("inf")


def _correlation(o: np.ndarray, ref: np.ndarray) -> float:
    """Pearson correlation of two flat arrays (1 for two equal constants, 0 when one is constant)."""
    if not o.size:
        return 0.0
    oc, rc = o.ravel() - o.mean(), ref.ravel() - ref.mean()
    denom = float(np.linalg.norm(oc) * np.linalg.norm(rc))
    if denom > 0 and np.isfinite(denom):
        return float(oc @ rc / denom)
    return 1.0 if np.allclose(o, ref) else 0.0


def torch_candidates(ctx: DiagnosisContext) -> dict[str, np.ndarray]:
    """PyTorch tensors the segment's initializers may come from (float64): the parameters and buffers of
    the modules near the divergence, and the Conv/Linear + BatchNorm folds of the segment."""
    if ctx.baseline.loaded.module is None:
        return reference_tensors(ctx)
    out: dict[str, np.ndarray] = {}
    for qualname, module in ctx.modules_near():
        for pname, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if tensor is not None and tensor.is_floating_point():
                out[f"{qualname}.{pname}" if qualname else pname] = tensor.detach().double().cpu().numpy()
        out.update(rnn_weights(qualname, module))
    named = _named_tensors(ctx)
    # the parameters the segment's weights are named after, whoever reads them, and those PyTorch's op read
    read = [float_name(t) for p in ctx.segment_protos for t in p.input] + list(ctx.op_params)
    for name in read:
        if name not in out and name in named and named[name].is_floating_point():
            out[name] = named[name].detach().double().cpu().numpy()
    for pair in conv_bn_pairs(ctx):  # every fold of the segment: a long one holds many
        out.update(folds(*pair))
    return out


#: what onnxruntime's quantizer appends to the name of the weight it quantizes
QUANTIZED_SUFFIX = "_quantized"


def float_name(initializer: str) -> str:
    """The name of the float weight a quantized initializer was made from (``w_quantized`` → ``w``)."""
    return initializer[:-len(QUANTIZED_SUFFIX)] if initializer.endswith(QUANTIZED_SUFFIX) else initializer


def _named_tensors(ctx: DiagnosisContext) -> dict:
    module = ctx.baseline.loaded.module
    return dict(list(module.named_parameters()) + list(module.named_buffers()))


def reference_tensors(ctx: DiagnosisContext) -> dict[str, np.ndarray]:
    """The reference ONNX model's float initializers (float64), when it stands in for PyTorch."""
    return {name: np.asarray(v, dtype=np.float64) for name, v in (ctx.baseline.weights or {}).items()
            if np.issubdtype(np.asarray(v).dtype, np.floating)}


def folds(conv_name: str, conv, bn_name: str, bn) -> dict[str, np.ndarray]:
    """The weight and bias of ``conv`` with ``bn`` folded in (float64), by descriptive name."""
    w, b = fold_arrays(conv, bn)
    return {f"fold({conv_name}.weight, {bn_name})": w, f"fold({conv_name}.bias, {bn_name})": b}


def fold_arrays(conv, bn) -> tuple[np.ndarray, np.ndarray]:
    """``conv``'s weight (in its own layout) and bias with ``bn`` folded in, float64."""
    w, b, gamma, beta, mean, var = conv_bn_arrays(conv, bn)
    scale = gamma / np.sqrt(var + bn.eps)
    folded = w * scale.reshape(-1, *[1] * (w.ndim - 1))
    groups = _transpose_groups(conv)
    return (from_out_major(folded, groups) if groups else folded), (b - mean) * scale + beta


def all_torch_tensors(ctx: DiagnosisContext) -> dict[str, np.ndarray]:
    """Every floating parameter and buffer of the model, and every Conv/Linear + BatchNorm fold (float64)."""
    model = ctx.baseline.loaded.module
    if model is None:
        return reference_tensors(ctx)
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    out = {n: t.detach().double().cpu().numpy() for n, t in tensors if t.is_floating_point()}
    out.update(model_rnn_weights(model))
    acts = ctx.baseline.capture.activations
    for act in acts:
        if act.kind is ModuleKind.BATCHNORM:
            for i in act.inputs:
                if acts[i].kind.folds_batchnorm:
                    out.update(folds(acts[i].module, ctx.torch_module(acts[i].module), act.module,
                                     ctx.torch_module(act.module)))
    return out


def exact_torch_value(ctx: DiagnosisContext, value: np.ndarray, candidates: dict[str, np.ndarray]):
    """``(name, PyTorch value in the initializer's layout)`` of the candidate ``value`` is a rounded copy of."""
    for name, tensor in candidates.items():
        rel = relate(value, tensor)
        if rel is not None and rel.equal:
            return name, rel.layout.apply(tensor, value.shape)
    return None


def pruned_channels(value: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per output channel (first axis), whether ``value`` holds only zeros where ``ref`` does not: a channel
    pruned, which no per-channel rescale (a folded BatchNorm) makes."""
    rows, kept = np.asarray(value).reshape(value.shape[0], -1), np.asarray(ref).reshape(ref.shape[0], -1)
    return ~rows.any(axis=1) & kept.any(axis=1)


def channel_ratios(value: np.ndarray, ref: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares factor per channel (along ``axis``) with ``value ≈ factor · ref``, and each channel's
    relative residual: a folded BatchNorm, a folded layer scale."""
    v = np.moveaxis(value.astype(np.float64), axis, 0).reshape(value.shape[axis], -1)
    r = np.moveaxis(ref.astype(np.float64), axis, 0).reshape(ref.shape[axis], -1)
    ratio = np.sum(v * r, axis=1) / np.maximum(np.sum(r * r, axis=1), 1e-300)
    residual = np.linalg.norm(v - ratio[:, None] * r, axis=1) / np.maximum(np.linalg.norm(v, axis=1), 1e-30)
    return ratio, residual


#: relative residual of a folded per-channel scale (float32 rounding of the product)
FOLDED_SCALE_REL = 1e-5


def scaling_parameter(value: np.ndarray, ref: np.ndarray, arrays: dict[str, np.ndarray]) -> str | None:
    """The name of the array in ``arrays`` (the model's parameters and buffers) whose values scale ``ref`` channel
    by channel into ``value`` (same shape, or a 2-d one transposed) — a layer scale a simplifier folded into the
    weights and bias of the layer before it (DINOv2's ``lambda1`` into its MLP's last Linear) — or None."""
    if value.ndim == 0:
        return None
    refs = [ref] if ref.shape == value.shape else []
    refs += [ref.T] if ref.ndim == 2 and ref.T.shape == value.shape and ref.shape != value.shape else []
    # the product rounded to the initializer's type (a float16 file: a few steps of ~1e-3)
    step = float(np.finfo(value.dtype).eps) if np.issubdtype(value.dtype, np.floating) else 0.0
    fit, match = max(FOLDED_SCALE_REL, 2 * step), max(1e-4, step)
    for r in refs:
        for axis in dict.fromkeys((0, value.ndim - 1)):
            ratio, residual = channel_ratios(value, r, axis)
            if residual.max() > fit or np.allclose(ratio, 1.0, rtol=match):
                continue
            name = next((n for n, a in arrays.items() if a.size == ratio.size and np.allclose(
                a.astype(np.float64).reshape(-1), ratio, rtol=match, atol=1e-7)), None)
            if name is not None:
                return name
    return None


def standardised(value: np.ndarray, ref: np.ndarray) -> bool:
    """Whether ``value`` is ``ref`` (same shape) standardised channel by channel along its first axis — zero
    mean and unit variance per output channel, up to a small epsilon: a weight-standardised convolution (BiT)
    whose standardised weight the exporter folded into a constant is the model's own numbers, not another
    checkpoint's."""
    if value.shape != ref.shape or value.ndim < 2 or value[0].size < 2:
        return False
    v = value.astype(np.float64).reshape(value.shape[0], -1)
    r = ref.astype(np.float64).reshape(ref.shape[0], -1)
    spread = r.std(axis=1, keepdims=True)
    if not np.all(spread > 0):
        return False
    z = (r - r.mean(axis=1, keepdims=True)) / spread
    step = float(np.finfo(value.dtype).eps) if np.issubdtype(value.dtype, np.floating) else 0.0
    scale = np.sum(v * z, axis=1, keepdims=True) / np.sum(z * z, axis=1, keepdims=True)  # 1 / sqrt(1 + eps / var)
    residual = float(np.linalg.norm(v - scale * z)) / (float(np.linalg.norm(v)) + 1e-30)
    return bool(np.all((scale > 0.9) & (scale <= 1.0 + 1e-3)) and residual <= max(FOLDED_SCALE_REL, 4 * step))


def reparameterised(value: np.ndarray, ref: np.ndarray, arrays: dict[str, np.ndarray], as_is: bool = False) -> bool:
    """Whether ``value``, unequal to the parameter ``ref`` it pairs with, is still the model's own numbers: the
    parameter times a layer scale of the model (:func:`scaling_parameter`) or standardised per output channel
    (:func:`standardised`; not for a parameter its layer reads ``as_is``: :func:`read_as_is`) or plus one (a norm
    that multiplies by ``1 + weight``: Gemma's RMSNorm, Nemotron's LayerNorm1P, the sum folded at export) — a
    transformed copy a simplifier or exporter folded, not another checkpoint's."""
    return (scaling_parameter(value, ref, arrays) is not None or not as_is and standardised(value, ref)
            or value.shape == ref.shape and bool(np.allclose(value, ref + 1.0, rtol=1e-5, atol=1e-6)))


#: PyTorch's layers whose forward reads their weight as it is (``torch.nn.Conv2d`` itself, not a subclass such as
#: timm's StdConv2d, which standardises it, nor a parametrized copy)
AS_IS_LAYERS = frozenset({"Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
                          "Linear"})


def read_as_is(model, parameter: str, called) -> bool:
    """Whether the parameter named ``parameter`` is the weight of one of PyTorch's own layers
    (:data:`AS_IS_LAYERS`) that the forward called (its module among ``called``, the captured modules' names) —
    which computes with it unchanged, so a standardised copy in the file is not the model's numbers.  A layer
    whose weight the forward reads itself (BiT's standardisation written around a plain Conv2d, ``F.conv2d``
    of the standardised weight) is never called, and is not read as is.  A fold (``fold(conv.weight, bn)``) is
    judged by its Conv's weight."""
    if parameter.startswith("fold(") and "," in parameter:  # a Conv's weight with a BatchNorm folded in
        parameter = parameter[len("fold("):].split(",", 1)[0].strip()
    owner, _, leaf = parameter.rpartition(".")
    if model is None or leaf != "weight" or owner not in called:
        return False
    try:
        module = model.get_submodule(owner)
    except (AttributeError, TypeError):
        return False
    kind = type(module)
    return kind.__module__.startswith("torch.nn.modules.") and kind.__name__ in AS_IS_LAYERS
