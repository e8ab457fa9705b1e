"""The fourteenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a quantiser's, an exporter's, a converter's, a checkpoint loader's or a graph rewriter's mistake the
earlier sets never planted:

* ``weight-int8-unsigned`` — a weight quantised to int8 whose bytes a converter reads as uint8 (TFLite / ONNX
  int8 ↔ uint8 confusion, no re-centring): a float MatMul / Gemm / Conv / ConvTranspose / RNN weight becomes
  ``DequantizeLinear(uint8(q), s, 0, axis)`` with q the symmetric per-output-channel int8 quantisation (s = max|w| /
  127 per channel), so every negative weight q·s turns into (q + 256)·s; a weight already behind a
  DequantizeLinear (a QDQ file) gets its int8 bytes read as uint8 (uint8 bytes as int8), the zero point alike.
  Expected ``quantization`` (``weight-mismatch`` recorded as also accepted, as ``weight-int8-clipped`` does).
* ``qdq-axis`` — a per-channel weight quantisation whose scales are applied along the wrong axis (a MatMul's
  [in, out] weight dequantised with ``axis=0``, the Conv default, where its channels are on axis 1; a Conv's output
  channels read on its input axis): the weight quantised per PyTorch output channel, then
  ``DequantizeLinear(q, s, 0, axis=other)``; square weights only (the two axes of equal size, else ONNX Runtime
  rejects the scale), and a per-channel DequantizeLinear already in the file has its ``axis`` moved likewise.
  Expected ``quantization`` (``weight-mismatch`` also accepted).
* ``gather-one-based`` — a lookup table indexed as if its indices were 1-based (a converter from a 1-based
  framework, or a vocabulary shifted by a dropped special token): a ``Sub`` of one inserted before the indices of a
  Gather from a float constant table (an embedding, a relative-position bias table; a QDQ file's dequantized
  table too), index 0 wrapping to the last row; constant index buffers (Swin's ``relative_position_index``) are shifted in place.  Position ids (increasing
  ranges, ``position-offset``'s) are left out, and so are Gathers on activations (``gather-index``'s).  Expected
  ``attribute-mismatch``.
* ``hidden-act`` — a model config's ``hidden_act`` read as another family member (BERT's ``gelu`` vs OPT's ``relu``
  vs Llama's ``silu``): a GELU (Gelu op, or the Erf of a decomposed exact GELU) computed as a ReLU (the Erf replaced
  by a Sign: x/2·(1 + sign x)), else as a SiLU (Erf(u) → tanh(u/√2): x/2·(1 + tanh(x/2)) = x·σ(x)); a SiLU
  (``x·Sigmoid(x)``) computed as an exact GELU (the Sigmoid replaced by Φ(x) = ½(1 + erf(x/√2))), else a ReLU; a
  Relu computed as an exact GELU, else a SiLU.  The GELU → tanh-GELU and GELU → x·σ(1.702x) swaps are
  ``gelu-swap``'s and ``gelu-quick``'s.  Expected ``attribute-mismatch`` (``gelu-approximation`` also accepted).
* ``conv-padding-mode`` — a Conv's ``padding_mode`` lost or invented by a converter (``Conv2d(padding_mode=
  'reflect' / 'replicate' / 'circular')`` exported with the zero padding, or the other way round): the Conv's zero
  padding moved into an explicit ``Pad`` (mode reflect, else edge, else wrap) inserted before it, the Conv's pads
  set to 0.  Sites: 1-d and 2-d Convs with explicit non-zero pads.  Expected ``attribute-mismatch`` (the changed
  Pad's ``pad-mode`` is the registry's kind for a Pad node already in the file).
* ``act-quant-unsigned`` — an activation quantised as uint8 with zero point 0 and the range [0, max] (a quantiser
  that assumed a fused ReLU after the node, or calibrated min clamped to 0) where the tensor has negative values: a
  QuantizeLinear / DequantizeLinear pair (scale max / 255) inserted after a Conv, MatMul, Gemm, Add, norm or
  activation with ≥ 5 % negative entries, so the negatives clip to 0.  ``qdq-scale`` (a scale divided) and
  ``zero-point`` (a zero point moved) change existing quantizers.  Expected ``quantization``.
* ``norm-groups`` — a normalisation with the wrong number of groups (a LayerNorm over the channels exported as a
  GroupNorm of 2, 4 or 8 groups, a qk-norm applied per head where the model normalises the whole projection): a
  LayerNormalization over the last axis replaced by a Reshape into (G, D/G), a LayerNormalization of each group
  (unit scale, zero bias, same epsilon), a Reshape back and the Mul / Add of the original scale and bias;
  a GroupNormalization has its ``num_groups`` changed.  Expected ``attribute-mismatch`` (``norm-axis`` moves the
  axis, ``reduce-axes`` a decomposed norm's reduction).
* ``residual-doubled`` — a skip connection counted twice (a SkipLayerNormalization / residual fusion that kept the
  original Add, or a block that returns ``x + f(x)`` whose caller adds ``x`` again): an Add of the skip inserted
  after the residual Add of a computed branch (read by that Add alone) and the skip (a tensor other nodes read too).
  Expected ``attribute-mismatch`` (``residual-dropped`` is the opposite).

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; as in the thirteenth set, a site
where even the strongest variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (the sweep
then tries the next site), so every planted fault of this set counts.

Planted nodes: the changed node (a weight's reader — for a weight behind a DequantizeLinear, the layer reading the
dequantized weight, the sweep's convention; for a shifted index buffer, the Gather); for an inserted node or pair
(the indices' Sub, the activation's QuantizeLinear or its Cast, the second skip Add) the first new node, as
``cast-bf16`` and ``int-truncation`` do; for a replaced subgraph (the activation's, the grouped norm's, the Pad and
the unpadded Conv) the new nodes, as ``gelu-swap`` does.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import plant
from onnx import TensorProto, helper, numpy_helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, dead_nodes,
                          insert_nodes, is_float_array, node_by_name, producer, prune, readers, replace_node, set_attr,
                          unique_name, weight_input, with_own_constant)
from sweep_faults_nine import _onnx
from sweep_faults_ten import _checked, _dynamic, _named, _value
from sweep_faults_thirteen import WN_OPS, _add_constant, _after, _counting, _norm_axis, _ranges, _wn_axes
from sweep_faults_twelve import _float_output, _graph_outputs

MS_DOMAIN = "com.microsoft"
INV_SQRT2 = 1 / math.sqrt(2)


def _layer_ok(n: onnx.NodeProto) -> bool:
    return n.op_type in WN_OPS and (_onnx(n.domain) or n.domain == MS_DOMAIN)


def _channel_quant(value: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantisation of ``value`` per channel along ``axis``: (q int8, scale float32 [C])."""
    v = value.astype(np.float64)
    others = tuple(a for a in range(v.ndim) if a != axis)
    top = np.max(np.abs(v), axis=others) if others else np.abs(v)
    scale = np.where(top > 0, top / 127.0, 1.0).astype(np.float32)
    shape = [1] * v.ndim
    shape[axis] = -1
    q = np.clip(np.round(v / scale.astype(np.float64).reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def _dequantized(ctx: FileContext, site_node: str, k: int, source: str, q: np.ndarray, scale: np.ndarray,
                 zero: np.ndarray, axis: int, dtype) -> tuple[onnx.ModelProto, str]:
    """Copy of the file whose node ``site_node`` reads ``DequantizeLinear(q, scale, zero, axis)`` at input ``k``
    instead of its float weight ``source`` (a Cast after it for a float16 weight).  Returns (model, DQ name)."""
    out = copy(ctx.proto)
    qname = unique_name(out, f"{source}_quantized")
    out.graph.initializer.append(numpy_helper.from_array(q, qname))
    sname = _add_constant(out, f"{source}_scale", scale)
    zname = _add_constant(out, f"{source}_zero_point", zero)
    dq_out = unique_name(out, f"{source}_dequantized")
    dq = helper.make_node("DequantizeLinear", [qname, sname, zname], [dq_out],
                          name=unique_name(out, f"{site_node}_weight_dq"), axis=axis)
    new, read = [dq], dq_out
    if np.dtype(dtype) != np.float32:
        read = unique_name(out, f"{source}_dequantized_cast")
        new.append(helper.make_node("Cast", [dq_out], [read], name=unique_name(out, f"{site_node}_weight_cast"),
                                    to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype))))
    node_by_name(out, site_node).input[k] = read
    insert_nodes(out, site_node, new, [])
    prune(out, dead_nodes(ctx.proto))
    return out, dq.name


def _dq_of(ctx: FileContext, node: onnx.NodeProto, k: int) -> onnx.NodeProto | None:
    dq = producer(ctx.proto, node.input[k])
    return dq if dq is not None and dq.op_type == "DequantizeLinear" else None


def _private_dq_inputs(ctx: FileContext, node_name: str, k: int, q: np.ndarray, zero: np.ndarray | None,
                       axis: int | None) -> onnx.ModelProto:
    """Copy of the file whose DequantizeLinear feeding input ``k`` of ``node_name`` reads new initializers ``q``
    (and ``zero``), its ``axis`` set where given."""
    out = copy(ctx.proto)
    node = node_by_name(out, node_name)
    dq = producer(out, node.input[k])
    qname = unique_name(out, f"{dq.input[0]}_planted")
    out.graph.initializer.append(numpy_helper.from_array(q, qname))
    dq.input[0] = qname
    if zero is not None:
        zname = _add_constant(out, f"{dq.input[0]}_zero_point", zero)
        if len(dq.input) >= 3:
            dq.input[2] = zname
        else:
            dq.input.append(zname)
    if axis is not None:
        set_attr(dq, "axis", axis)
    prune(out, dead_nodes(ctx.proto))
    return out


# --------------------------------------------------------------------------- int8 weight bytes read as uint8

def unsigned_sites(ctx: FileContext) -> list[Site]:
    """Weights of named MatMul / Gemm / Conv / ConvTranspose / RNN nodes: a float weight with a per-output-channel
    axis (``("float", k, source)``) or an 8-bit integer weight behind a DequantizeLinear (``("dq", k, source)``),
    not all zero."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _layer_ok(n):
            continue
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if value is None or value.size < 4 or not np.any(value):
                continue
            if is_float_array(value) and src == n.input[k]:
                if _wn_axes(n, k, value) is not None:
                    sites.append(Site(n.name, ("float", k, src)))
            elif value.dtype in (np.int8, np.uint8) and _dq_of(ctx, n, k) is not None:
                sites.append(Site(n.name, ("dq", k, src)))
    return sites


def plant_weight_int8_unsigned(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Float weight: ``DequantizeLinear(uint8 view of q, s, 0, axis)`` with q, s the symmetric per-output-channel
    int8 quantisation; a quantized weight: its bytes (and its zero point's) read in the other signedness.
    Planted: the layer."""
    how, k, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)

    def variants():
        if how == "float":
            axis = _wn_axes(node, k, value)[0]
            q, scale = _channel_quant(value, axis)
            wrapped = q.view(np.uint8)
            out, _ = _dequantized(ctx, site.node, k, source, wrapped, scale,
                                  np.zeros(scale.shape, np.uint8), axis, value.dtype)
            negative = float(np.mean(q < 0))
            text = (f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}) quantised to int8 per "
                    f"channel (axis {axis}) and read back as uint8: the {negative:.1%} negative weights q·s become "
                    f"(q + 256)·s")
        else:
            dq = _dq_of(ctx, node, k)
            other = np.uint8 if value.dtype == np.int8 else np.int8
            zp = constant(ctx.proto, dq.input[2]) if len(dq.input) >= 3 and dq.input[2] else None
            zero = (zp if zp is not None else np.zeros((), value.dtype)).astype(value.dtype).view(other)
            out = _private_dq_inputs(ctx, site.node, k, value.view(other), np.ascontiguousarray(zero), None)
            text = (f"{node.op_type} quantized weight {source} {list(value.shape)} ({value.dtype}) read as "
                    f"{np.dtype(other).name} (its zero point too): the sign bit taken for 128")
        checked = _checked(ctx, out, node.output)
        yield None if checked is None else Planted(checked, [site.node], "quantization", text,
                                                   {"weight": source, "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "int8 weight read as uint8")


# --------------------------------------------------------------------------- per-channel scales on the wrong axis

def axis_sites(ctx: FileContext) -> list[Site]:
    """Square weights of named MatMul / Gemm / Conv / ConvTranspose / RNN nodes (PyTorch's dim 0 and dim 1 of equal
    size ≥ 2): a float weight, ``("float", k, source, axis, wrong)``, or an 8-bit weight behind a per-channel
    DequantizeLinear, ``("dq", k, source, axis, wrong)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _layer_ok(n):
            continue
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if value is None or value.ndim < 2 or not np.any(value):
                continue
            if is_float_array(value) and src == n.input[k]:
                axes = _wn_axes(n, k, value)
                if axes is not None and value.shape[axes[0]] == value.shape[axes[1]] >= 2:
                    sites.append(Site(n.name, ("float", k, src, *axes)))
            elif value.dtype.kind in "iu":
                dq = _dq_of(ctx, n, k)
                scale = constant(ctx.proto, dq.input[1]) if dq is not None else None
                if scale is None or scale.size < 2:
                    continue
                axis = _norm_axis(attribute(dq, "axis", 1), value.ndim)
                wrong = 1 if axis == 0 else 0
                if value.shape[axis] == value.shape[wrong] == scale.size and np.ptp(scale) > 0:
                    sites.append(Site(n.name, ("dq", k, src, axis, wrong)))
    return sites


def plant_qdq_axis(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Float weight: ``DequantizeLinear(q, s, 0, axis=wrong)`` with q, s the symmetric int8 quantisation per
    channel along the right axis; a per-channel DequantizeLinear: its ``axis`` moved.  Planted: the layer."""
    how, k, source, axis, wrong = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)

    def variants():
        if how == "float":
            q, scale = _channel_quant(value, axis)
            out, _ = _dequantized(ctx, site.node, k, source, q, scale, np.zeros(scale.shape, np.int8), wrong,
                                  value.dtype)
            text = (f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}) quantised to int8 per channel "
                    f"along axis {axis}, dequantised with axis={wrong}: each scale applied to the other axis' slice")
        else:
            out = _private_dq_inputs(ctx, site.node, k, value, None, wrong)
            text = (f"{node.op_type} weight {source} {list(value.shape)}: per-channel DequantizeLinear axis "
                    f"{axis} → {wrong}")
        checked = _checked(ctx, out, node.output)
        yield None if checked is None else Planted(checked, [site.node], "quantization", text,
                                                   {"weight": source, "axis": axis, "wrong_axis": wrong,
                                                    "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "per-channel scales on the wrong axis")


# --------------------------------------------------------------------------- indices read as 1-based

def _table(ctx: FileContext, tensor: str) -> np.ndarray | None:
    """A constant float table, or the dequantized value of a DequantizeLinear of a constant (a QDQ file's
    quantized embedding); else None."""
    value = constant(ctx.proto, tensor)
    if value is not None:
        return value
    dq = producer(ctx.proto, tensor)
    if dq is not None and dq.op_type == "DequantizeLinear" and constant(ctx.proto, dq.input[0]) is not None:
        return ctx.values.get(tensor)
    return None


def one_based_sites(ctx: FileContext) -> list[Site]:
    """Named Gathers from a float constant table (≥ 2 dims, ≥ 2 rows on the gathered axis) by integer indices
    that are not increasing ranges (token ids, type ids, relative-position index buffers, not position ids) and
    not all one value when constant: ``("computed",)`` or ``("constant",)``."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Gather" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        table = _table(ctx, n.input[0])
        if not is_float_array(table) or table.ndim < 2:
            continue
        axis = _norm_axis(attribute(n, "axis", 0), table.ndim)
        idx = _value(ctx, n.input[1])
        if table.shape[axis] < 2 or idx is None or idx.dtype.kind not in "iu" or idx.size < 1 or _ranges(idx):
            continue
        if n.input[1] in dynamic:
            sites.append(Site(n.name, ("computed",)))
        elif constant(ctx.proto, n.input[1]) is not None and idx.size >= 2:
            sites.append(Site(n.name, ("constant",)))
    return sites


def plant_gather_one_based(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Computed indices: a Sub of one inserted before the Gather's indices (index 0 reads the last row); constant
    indices: the buffer itself minus one (a private copy where another node reads it).  Planted: the Sub, or the
    Gather for a constant buffer."""
    (how,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    table = _table(ctx, node.input[0])
    axis = _norm_axis(attribute(node, "axis", 0), table.ndim)
    rows = table.shape[axis]
    idx = _value(ctx, node.input[1])

    def variants():
        if how == "constant":
            norm = np.where(idx < 0, idx + rows, idx)
            out = with_own_constant(ctx.proto, site.node, 1, (norm - 1).astype(idx.dtype), "one_based")
            planted = site.node
        else:
            out = copy(ctx.proto)
            one = _add_constant(out, f"{site.node}_one", np.array(1, idx.dtype))
            shifted = unique_name(out, f"{node.input[1]}_one_based")
            sub = helper.make_node("Sub", [node.input[1], one], [shifted], name=unique_name(out, f"{site.node}_one_based"))
            node_by_name(out, site.node).input[1] = shifted
            insert_nodes(out, site.node, [sub], [])
            planted = sub.name
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [planted], "attribute-mismatch",
            f"Gather {site.node} from table {node.input[0]} {list(table.shape)} (axis {axis}) with its "
            f"{'constant ' if how == 'constant' else ''}indices {list(idx.shape)} read as 1-based: index i takes "
            f"row i − 1 (row 0 → row {rows - 1})", {"gather": site.node, "indices": how})

    return _counting(ctx, variants(), "1-based indices")


# --------------------------------------------------------------------------- hidden_act read as another activation

def _silu_mul(ctx: FileContext, sig: onnx.NodeProto) -> onnx.NodeProto | None:
    """The Mul computing ``x · Sigmoid(x)`` when the Sigmoid's only reader is that Mul, else None."""
    found = readers(ctx.proto, sig.output[0])
    if len(found) != 1 or sig.output[0] in _graph_outputs(ctx):
        return None
    mul = found[0]
    if mul.op_type != "Mul" or not _onnx(mul.domain) or len(mul.input) != 2 or not mul.name:
        return None
    other = mul.input[1] if mul.input[0] == sig.output[0] else mul.input[0]
    return mul if other == sig.input[0] else None


def act_sites(ctx: FileContext) -> list[Site]:
    """``("gelu-op",)``: an ONNX Gelu (approximate none); ``("gelu-erf",)``: the Erf of a decomposed exact GELU;
    ``("silu", mul)``: a Sigmoid whose only reader multiplies it by its input; ``("relu",)``: a Relu.  Float
    outputs the clean file computes, not all zero."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain) or not _float_output(ctx, n) or not np.any(ctx.values[n.output[0]]):
            continue
        if n.op_type == "Gelu" and attribute(n, "approximate", "none") == "none":
            sites.append(Site(n.name, ("gelu-op",)))
        elif n.op_type == "Erf" and plant._is_gelu_erf(ctx.proto, n):
            sites.append(Site(n.name, ("gelu-erf",)))
        elif n.op_type == "Sigmoid":
            mul = _silu_mul(ctx, n)
            if mul is not None:
                sites.append(Site(n.name, ("silu", mul.name)))
        elif n.op_type == "Relu":
            sites.append(Site(n.name, ("relu",)))
    return sites


def _phi_nodes(out: onnx.ModelProto, base: str, x: str, result: str, dtype) -> list[onnx.NodeProto]:
    """Nodes computing ``result = ½·(1 + erf(x/√2))`` (the normal CDF)."""
    c = {name: _add_constant(out, f"{base}_{name}", np.array(v, dtype))
         for name, v in (("inv_sqrt2", INV_SQRT2), ("one", 1.0), ("half", 0.5))}
    t = [unique_name(out, f"{result}_phi_{i}") for i in range(3)]
    return [helper.make_node("Mul", [x, c["inv_sqrt2"]], [t[0]], name=unique_name(out, f"{base}_phi_scale")),
            helper.make_node("Erf", [t[0]], [t[1]], name=unique_name(out, f"{base}_phi_erf")),
            helper.make_node("Add", [t[1], c["one"]], [t[2]], name=unique_name(out, f"{base}_phi_add")),
            helper.make_node("Mul", [t[2], c["half"]], [result], name=unique_name(out, f"{base}_phi_half"))]


def _step_nodes(out: onnx.ModelProto, base: str, x: str, result: str, dtype) -> list[onnx.NodeProto]:
    """Nodes computing ``result = ½·(1 + sign x)`` (the unit step: x · step(x) = relu(x))."""
    one = _add_constant(out, f"{base}_one", np.array(1.0, dtype))
    half = _add_constant(out, f"{base}_half", np.array(0.5, dtype))
    t = [unique_name(out, f"{result}_step_{i}") for i in range(2)]
    return [helper.make_node("Sign", [x], [t[0]], name=unique_name(out, f"{base}_step_sign")),
            helper.make_node("Add", [t[0], one], [t[1]], name=unique_name(out, f"{base}_step_add")),
            helper.make_node("Mul", [t[1], half], [result], name=unique_name(out, f"{base}_step_half"))]


ACT_TARGETS = {"gelu-op": ("relu", "silu"), "gelu-erf": ("relu", "silu"), "silu": ("gelu", "relu"),
               "relu": ("gelu", "silu")}
ACT_NAMES = {"gelu-op": "GELU", "gelu-erf": "GELU", "silu": "SiLU", "relu": "ReLU"}


def plant_hidden_act(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The activation replaced by another (see the module docstring; GELU → ReLU, else SiLU; SiLU → GELU, else
    ReLU; ReLU → GELU, else SiLU).  Planted: the new nodes."""
    how = site.detail[0]
    node = node_by_name(ctx.proto, site.node)
    dtype = ctx.values[node.output[0]].dtype
    watch = site.detail[1] if how == "silu" else site.node
    watched = node_by_name(ctx.proto, watch).output[0]

    def build(target: str):
        out = copy(ctx.proto)
        x, y = node.input[0], node.output[0]
        base = f"{site.node}_{target}"
        if how == "gelu-erf":  # Erf(u), u = x/√2, inside x/2·(1 + Erf(u))
            if target == "relu":
                new = [helper.make_node("Sign", [x], [y], name=unique_name(out, f"{base}_sign"))]
            else:
                c = _add_constant(out, f"{base}_inv_sqrt2", np.array(INV_SQRT2, dtype))
                mid = unique_name(out, f"{y}_half_x")
                new = [helper.make_node("Mul", [x, c], [mid], name=unique_name(out, f"{base}_scale")),
                       helper.make_node("Tanh", [mid], [y], name=unique_name(out, f"{base}_tanh"))]
        elif how == "gelu-op":
            if target == "relu":
                new = [helper.make_node("Relu", [x], [y], name=unique_name(out, base))]
            else:
                s = unique_name(out, f"{y}_sigmoid")
                new = [helper.make_node("Sigmoid", [x], [s], name=unique_name(out, f"{base}_sigmoid")),
                       helper.make_node("Mul", [x, s], [y], name=unique_name(out, f"{base}_mul"))]
        elif how == "silu":  # Sigmoid(x) replaced by Φ(x) or step(x); the Mul by x stays
            new = (_phi_nodes if target == "gelu" else _step_nodes)(out, base, x, y, dtype)
        else:  # relu: x · Φ(x) or x · σ(x)
            g = unique_name(out, f"{y}_gate")
            if target == "gelu":
                new = _phi_nodes(out, base, x, g, dtype)
            else:
                new = [helper.make_node("Sigmoid", [x], [g], name=unique_name(out, f"{base}_sigmoid"))]
            new.append(helper.make_node("Mul", [x, g], [y], name=unique_name(out, f"{base}_mul")))
        replace_node(out, site.node, new)
        return out, [n.name for n in new]

    def variants():
        for target in ACT_TARGETS[how]:
            out, names = build(target)
            checked = _checked(ctx, out, [watched])
            extra = {"activation": ACT_NAMES[how], "as": target}
            if "GELU" in (ACT_NAMES[how],) or target == "gelu":
                extra["also_accepted"] = "gelu-approximation"
            yield None if checked is None else Planted(
                checked, names, "attribute-mismatch",
                f"{ACT_NAMES[how]} at {site.node} ({node.op_type}{', ' + how if how == 'gelu-erf' else ''}) computed "
                f"as {target.upper() if target != 'silu' else 'SiLU'} (hidden_act read as {target!r})", extra)

    return _counting(ctx, variants(), "another hidden_act")


# --------------------------------------------------------------------------- Conv padding_mode

PAD_MODES = ("reflect", "edge", "wrap")


def conv_pad_sites(ctx: FileContext) -> list[Site]:
    """Named 1-d / 2-d Convs (ONNX) with explicit pads, some non-zero (no auto_pad), on a computed float input."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Conv" or not _onnx(n.domain) or not _float_output(ctx, n) or n.input[0] not in dynamic:
            continue
        if attribute(n, "auto_pad", "NOTSET") not in ("NOTSET", ""):
            continue
        pads = list(attribute(n, "pads", []) or [])
        x = _value(ctx, n.input[0])
        if x is None or x.ndim not in (3, 4) or len(pads) != 2 * (x.ndim - 2) or not any(pads):
            continue
        sites.append(Site(n.name, (tuple(pads),)))
    return sites


def plant_conv_padding_mode(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Pad (mode reflect, else edge, else wrap) of the Conv's pads inserted before it, the Conv's pads zeroed.
    Planted: the Pad and the Conv."""
    (pads,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    x = _value(ctx, node.input[0])
    spatial = x.ndim - 2
    full = np.array([0, 0, *pads[:spatial], 0, 0, *pads[spatial:]], np.int64)

    def variants():
        for mode in PAD_MODES:
            out = copy(ctx.proto)
            pname = _add_constant(out, f"{site.node}_padding", full)
            padded = unique_name(out, f"{node.input[0]}_{mode}_padded")
            pad = helper.make_node("Pad", [node.input[0], pname], [padded], name=unique_name(out, f"{site.node}_pad"),
                                   mode=mode)
            conv = node_by_name(out, site.node)
            conv.input[0] = padded
            set_attr(conv, "pads", [0] * len(pads))
            insert_nodes(out, site.node, [pad], [])
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [pad.name, site.node], "attribute-mismatch",
                f"Conv {site.node} ({list(x.shape)}, pads {list(pads)}) padded in mode {mode!r} (an explicit Pad "
                f"inserted, the Conv's pads zeroed) where the model pads with zeros (padding_mode)",
                {"conv": site.node, "mode": mode})

    return _counting(ctx, variants(), "padding mode")


# --------------------------------------------------------------------------- an activation quantised as unsigned

#: nodes a static quantiser puts an activation quantizer after and a fused ReLU could follow (layout ops such as
#: Reshape / Transpose share their input's quantizer and are left out)
QUANT_AFTER = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "Add", "Sub", "Mul", "LayerNormalization",
               "BatchNormalization", "InstanceNormalization", "GroupNormalization", "Concat", "Resize",
               "AveragePool", "GlobalAveragePool", "Gelu", "LeakyRelu", "Elu", "PRelu")
NEGATIVE_SHARE = 0.05


def act_quant_sites(ctx: FileContext) -> list[Site]:
    """Named nodes of :data:`QUANT_AFTER` with a computed float output of ≥ 8 entries, not a graph output, not
    already read by a QuantizeLinear, ≥ 5 % of it negative and its maximum positive: ``()``."""
    dynamic, outputs = _dynamic(ctx), _graph_outputs(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in QUANT_AFTER or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        t = n.output[0]
        if t not in dynamic or t in outputs or any(r.op_type == "QuantizeLinear" for r in readers(ctx.proto, t)):
            continue
        v = ctx.values[t]
        if v.size < 8 or not np.all(np.isfinite(v)) or float(v.max()) <= 0 or np.mean(v < 0) < NEGATIVE_SHARE:
            continue
        sites.append(Site(n.name))
    return sites


def plant_act_quant_unsigned(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """QuantizeLinear(x, max/255, uint8 0) → DequantizeLinear inserted after the node (Casts to float32 and back
    around them for a float16 tensor).  Planted: the first new node."""
    node = node_by_name(ctx.proto, site.node)
    v = ctx.values[node.output[0]]
    top = float(v.max())
    scale = np.array(top / 255.0, np.float32)

    def variants():
        def build(out, raw, result):
            sname = _add_constant(out, f"{site.node}_act_scale", scale)
            zname = _add_constant(out, f"{site.node}_act_zero_point", np.array(0, np.uint8))
            new, src = [], raw
            if v.dtype != np.float32:
                src = unique_name(out, f"{raw}_f32")
                new.append(helper.make_node("Cast", [raw], [src], name=unique_name(out, f"{site.node}_quant_cast"),
                                            to=TensorProto.FLOAT))
            q = unique_name(out, f"{raw}_uint8")
            d = result if v.dtype == np.float32 else unique_name(out, f"{raw}_dequantized")
            new += [helper.make_node("QuantizeLinear", [src, sname, zname], [q],
                                     name=unique_name(out, f"{site.node}_quant")),
                    helper.make_node("DequantizeLinear", [q, sname, zname], [d],
                                     name=unique_name(out, f"{site.node}_dequant"))]
            if v.dtype != np.float32:
                new.append(helper.make_node("Cast", [d], [result], name=unique_name(out, f"{site.node}_dequant_cast"),
                                            to=helper.np_dtype_to_tensor_dtype(v.dtype)))
            return new

        out, new = _after(ctx, site.node, build)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [new[0].name], "quantization",
            f"{node.op_type} {site.node} output {list(v.shape)} quantised as uint8 with zero point 0 and range "
            f"[0, {top:.4g}] (scale {float(scale):.3g}): its {float(np.mean(v < 0)):.1%} negative entries clip to 0",
            {"after": site.node, "scale": float(scale)})

    return _counting(ctx, variants(), "unsigned activation quantisation")


# --------------------------------------------------------------------------- a norm over the wrong number of groups

NORM_GROUPS = (2, 4, 8)


def norm_group_sites(ctx: FileContext) -> list[Site]:
    """Named LayerNormalizations over the last axis alone (D ≥ 4 with a divisor in 2, 4, 8 leaving ≥ 2 channels a
    group, rank ≥ 2, one output), ``("layer", D)``; named GroupNormalizations whose channel count has another
    divisor, ``("group", C)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in ("LayerNormalization", "GroupNormalization") or not _onnx(n.domain) \
                or not _float_output(ctx, n) or any(o for o in n.output[1:]):
            continue
        x = _value(ctx, n.input[0])
        if x is None or x.ndim < 2:
            continue
        if n.op_type == "LayerNormalization":
            d = x.shape[-1]
            if _norm_axis(attribute(n, "axis", -1), x.ndim) == x.ndim - 1 \
                    and any(d % g == 0 and d // g >= 2 for g in NORM_GROUPS):
                sites.append(Site(n.name, ("layer", d)))
        elif n.op_type == "GroupNormalization":
            c, groups = x.shape[1], attribute(n, "num_groups", 1)
            if any(c % g == 0 and g != groups for g in (*NORM_GROUPS, 1)):
                sites.append(Site(n.name, ("group", c)))
    return sites


def plant_norm_groups(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """LayerNormalization over D: Reshape (…, G, D/G) → LayerNormalization (unit scale, zero bias) → Reshape
    (…, D) → Mul scale → Add bias, G = 2, else 4, else 8; GroupNormalization: num_groups set to another divisor.
    Planted: the split, the per-group LayerNormalization and the merge (the GroupNormalization itself); the scale
    and bias re-applied after them compute what the model does and are not counted."""
    how, d = site.detail
    node = node_by_name(ctx.proto, site.node)
    x = _value(ctx, node.input[0])
    rank = x.ndim
    dtype = ctx.values[node.output[0]].dtype

    def variants():
        if how == "group":
            groups = attribute(node, "num_groups", 1)
            for g in (*NORM_GROUPS, 1):
                if d % g or g == groups:
                    continue
                out = copy(ctx.proto)
                set_attr(node_by_name(out, site.node), "num_groups", g)
                checked = _checked(ctx, out, [node.output[0]])
                yield None if checked is None else Planted(
                    checked, [site.node], "attribute-mismatch",
                    f"GroupNormalization {site.node} ({list(x.shape)}) with {g} groups instead of {groups}",
                    {"norm": site.node, "groups": g, "was": groups})
            return
        for g in NORM_GROUPS:
            if d % g or d // g < 2:
                continue
            out = copy(ctx.proto)
            y = node.output[0]
            base = f"{site.node}_groups{g}"
            split = _add_constant(out, f"{base}_shape", np.array([0] * (rank - 1) + [g, d // g], np.int64))
            back = _add_constant(out, f"{base}_back", np.array([0] * (rank - 1) + [d], np.int64))
            ones = _add_constant(out, f"{base}_unit_scale", np.ones(d // g, dtype))
            zeros = _add_constant(out, f"{base}_zero_bias", np.zeros(d // g, dtype))
            t = [unique_name(out, f"{y}_groups{g}_{i}") for i in range(4)]
            ln = helper.make_node("LayerNormalization", [t[0], ones, zeros], [t[1]], name=unique_name(out, base),
                                  axis=-1, epsilon=float(attribute(node, "epsilon", 1e-5)))
            for a in node.attribute:
                if a.name == "stash_type":
                    ln.attribute.append(a)
            new = [helper.make_node("Reshape", [node.input[0], split], [t[0]], name=unique_name(out, f"{base}_split")),
                   ln,
                   helper.make_node("Reshape", [t[1], back], [t[2]], name=unique_name(out, f"{base}_merge"))]
            bias = node.input[2] if len(node.input) >= 3 and node.input[2] else None
            new.append(helper.make_node("Mul", [t[2], node.input[1]], [t[3] if bias else y],
                                        name=unique_name(out, f"{base}_scale")))
            if bias:
                new.append(helper.make_node("Add", [t[3], bias], [y], name=unique_name(out, f"{base}_bias")))
            replace_node(out, site.node, new)
            checked = _checked(ctx, out, [y])
            # planted: the split, the per-group normalization and the merge; the scale and bias after them are
            # the model's own (re-applied as they were: first run of this set counted them too, see the note)
            yield None if checked is None else Planted(
                checked, [n.name for n in new[:3]], "attribute-mismatch",
                f"LayerNormalization {site.node} over the last axis ({list(x.shape)}) computed per group of "
                f"{d // g} channels ({g} groups: statistics of each group alone)", {"norm": site.node, "groups": g})

    return _counting(ctx, variants(), "norm groups")


# --------------------------------------------------------------------------- a skip connection added twice

def residual_sites(ctx: FileContext) -> list[Site]:
    """Named Adds of two computed float tensors of the output's shape: a branch read by this Add alone and a skip
    that other nodes read too (the residual stream): ``(skip,)``."""
    dynamic, outputs = _dynamic(ctx), _graph_outputs(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Add" or not _onnx(n.domain) or len(n.input) != 2 or n.input[0] == n.input[1] \
                or not _float_output(ctx, n) or n.output[0] in outputs:
            continue
        shape = ctx.values[n.output[0]].shape
        if not all(t in dynamic and t in ctx.values and ctx.values[t].shape == shape for t in n.input):
            continue
        many = [t for t in n.input if len(readers(ctx.proto, t)) > 1 or t in outputs]
        if len(many) == 1 and np.any(ctx.values[many[0]]):
            sites.append(Site(n.name, (many[0],)))
    return sites


def plant_residual_doubled(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """An Add of the skip inserted after the residual Add (its readers read skip + branch + skip).  Planted: the
    new Add."""
    (skip,) = site.detail
    node = node_by_name(ctx.proto, site.node)

    def variants():
        def build(out, raw, result):
            return [helper.make_node("Add", [raw, skip], [result], name=unique_name(out, f"{site.node}_skip_again"))]

        out, new = _after(ctx, site.node, build)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [new[0].name], "attribute-mismatch",
            f"residual Add {site.node} ({list(ctx.values[node.output[0]].shape)}) with its skip {skip} added a second "
            f"time", {"add": site.node, "skip": skip})

    return _counting(ctx, variants(), "skip added twice")


KINDS = (
    FaultKind("weight-int8-unsigned", unsigned_sites, plant_weight_int8_unsigned, "quantization",
              "an int8-quantised weight's bytes read as uint8 (or a uint8 weight's as int8): negative weights wrap "
              "by 256 steps", max_tries=40),
    FaultKind("qdq-axis", axis_sites, plant_qdq_axis, "quantization",
              "a square weight's per-channel int8 scales applied along the other axis (DequantizeLinear axis 0 ↔ 1)",
              max_tries=40),
    FaultKind("gather-one-based", one_based_sites, plant_gather_one_based, "attribute-mismatch",
              "a table lookup's indices read as 1-based: a Sub of one before a Gather from a float constant table "
              "(token / type ids, relative-position index buffers)", max_tries=40),
    FaultKind("hidden-act", act_sites, plant_hidden_act, "attribute-mismatch",
              "the hidden_act read as another: GELU → ReLU / SiLU, SiLU → GELU / ReLU, ReLU → GELU / SiLU",
              max_tries=40),
    FaultKind("conv-padding-mode", conv_pad_sites, plant_conv_padding_mode, "attribute-mismatch",
              "a Conv's zero padding made reflect / edge / wrap (an explicit Pad, the Conv's pads zeroed): "
              "padding_mode lost or invented", max_tries=40),
    FaultKind("act-quant-unsigned", act_quant_sites, plant_act_quant_unsigned, "quantization",
              "a signed activation quantised as uint8 with zero point 0 (range [0, max], a ReLU assumed): "
              "negatives clip to 0", max_tries=40),
    FaultKind("norm-groups", norm_group_sites, plant_norm_groups, "attribute-mismatch",
              "a LayerNorm computed per group of channels (2 / 4 / 8 groups), or a GroupNorm's num_groups changed",
              max_tries=40),
    FaultKind("residual-doubled", residual_sites, plant_residual_doubled, "attribute-mismatch",
              "a skip connection added twice (x + f(x) + x: a residual fusion that kept the original Add)",
              max_tries=40),
)
