"""The ninth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a converter's or a checkpoint loader's mistake the earlier sets never planted: a Pad's mode
changed (reflection against replication padding, a zero pad made a reflection or the reverse), a CumSum's
``exclusive`` or ``reverse`` flipped (position ids counted from a mask one off, or from the wrong end), a
DepthToSpace in the other layout (PixelShuffle's CRD against DCR), a Trilu's ``upper`` flipped or its diagonal
``k`` moved by one (a causal mask one position off), the epsilon of a decomposed normalization added after the
square root instead of before it (``std + eps`` against ``sqrt(var + eps)``), a decomposed normalization's
variance made unbiased (``var(unbiased=True)``: an inserted Mul by n/(n−1)), a weight rounded to a coarse
per-tensor grid (a fake-quantized checkpoint saved as float) and a Resize's rounding (``nearest_mode``, the
cubic coefficient ``cubic_coeff_a`` or ``exclude_outside``).  Each follows :mod:`sweep_faults`' conventions.

Where a kind has several variants at a site (another mode, the other attribute, a larger epsilon, a coarser
grid), it plants the first, in its order of preference, whose outputs diverge from PyTorch's by ≥ 2× the
tolerance (optimizations on and off: the sweep's count), else the strongest one (the sweep then finds it silent).
So ``eps-placement`` scales the epsilon up (×10, ×100, ×1000, said in the description) when the placement alone
does not count, and ``weight-rounded`` takes the int4 grid when the int8 one does not.  The sweep scores one
expected cause per planted fault (``fault_sweep.score``: equality), so ``weight-rounded`` expects
``weight-mismatch`` and records ``quantization`` as also accepted in its ``extra``.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, folded,
                          insert_nodes, is_float_array, is_float_tensor, node_by_name, producer, readers,
                          reduce_axes, scalar_inputs, set_attr, shape_of, top_nodes, unique_name, weight_input,
                          with_argument, with_initializer, with_own_constant)
from sweep_faults_ops import _usable

ONNX_DOMAIN = ("", "ai.onnx")
OUTPUT_MIN = 2.0  # the sweep's count ratio (fault_sweep.COUNT_RATIO): outputs ≥ 2× tolerance, ORT on and off
PASS_OPS = ("Cast", "Identity")  # nodes a pattern looks through (float16 files: Casts between the ops)


def _onnx(domain: str) -> bool:
    return domain in ONNX_DOMAIN


def _pick(ctx: FileContext, variants) -> Planted | None:
    """The first of ``variants`` (Planted or None, made lazily, in order of preference) whose outputs differ from
    PyTorch's by ≥ 2× the tolerance (optimizations on and off); else the one whose outputs diverge most (it will be
    silent); None when every variant is None."""
    best, best_ratio = None, -1.0
    for planted in variants:
        if planted is None:
            continue
        worst = min(ctx.output_ratio(planted.model, opt) for opt in (False, True))
        if worst >= OUTPUT_MIN:
            return planted
        if worst > best_ratio:
            best, best_ratio = planted, worst
    return best


def _finite_outputs(ctx: FileContext, out: onnx.ModelProto) -> bool:
    return all(np.isfinite(o).all() for o in ctx.run(out, False) if np.asarray(o).dtype.kind == "f")


def _up(proto: onnx.ModelProto, tensor: str) -> onnx.NodeProto | None:
    """The node computing ``tensor``, looking through Casts and Identities."""
    node = producer(proto, tensor)
    for _ in range(8):
        if node is None or node.op_type not in PASS_OPS:
            return node
        node = producer(proto, node.input[0])
    return node


def _down(proto: onnx.ModelProto, tensor: str) -> tuple[list[onnx.NodeProto], onnx.NodeProto | None]:
    """(the Casts / Identities, the node) ``tensor`` flows into when each tensor on the way has one reader and is
    no graph output; (…, None) when it does not."""
    outputs = {o.name for o in proto.graph.output}
    chain = []
    for _ in range(8):
        found = readers(proto, tensor)
        if len(found) != 1 or tensor in outputs:
            return chain, None
        if found[0].op_type not in PASS_OPS:
            return chain, found[0]
        chain.append(found[0])
        tensor = found[0].output[0]
    return chain, None


def _scalar(proto: onnx.ModelProto, tensor: str) -> float | None:
    value = constant(proto, tensor)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


# --------------------------------------------------------------------------- Pad mode

#: a Pad's mode -> the modes it is given (the realistic confusion first)
PAD_MODES = {"reflect": ("edge",), "edge": ("reflect", "constant"), "constant": ("reflect", "edge"),
             "wrap": ("reflect", "edge")}


def pad_mode_sites(ctx: FileContext) -> list[Site]:
    """Pads of a float tensor that pad something (the output's shape is not the input's)."""
    return [Site(n.name) for n in top_nodes(ctx, ("Pad",), _onnx)
            if n.output[0] in ctx.values and is_float_tensor(ctx, n.input[0])
            and attribute(n, "mode", "constant") in PAD_MODES
            and shape_of(ctx, n.input[0]) != ctx.values[n.output[0]].shape]


def plant_pad_mode(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Pad's mode changed (reflect ↔ edge, constant → reflect / edge, edge → constant) where the output
    changes: the first (realistic order, else shuffled) whose outputs count, else the strongest."""
    node = node_by_name(ctx.proto, site.node)
    old = attribute(node, "mode", "constant")
    modes = list(PAD_MODES[old])
    if old in ("constant", "wrap"):
        rng.shuffle(modes)

    def variants():
        for new in modes:
            out = copy(ctx.proto)
            set_attr(node_by_name(out, site.node), "mode", str(new))
            checked = _usable(ctx, out, node.output[0])
            text = f"Pad mode {old!r} → {str(new)!r}"
            yield None if checked is None else Planted(checked, [site.node], "attribute-mismatch", text)

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant(f"no other mode than {old!r} runs and changes the Pad's output")
    return planted


# --------------------------------------------------------------------------- CumSum attributes

def cumsum_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("CumSum",), _onnx) if n.output[0] in ctx.values]


def plant_cumsum_attr(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The CumSum's ``exclusive`` or ``reverse`` flipped (position ids from a mask's cumsum one off, or counted
    from the end)."""
    node = node_by_name(ctx.proto, site.node)

    def variants():
        for name in rng.permutation(["exclusive", "reverse"]):
            old = int(attribute(node, str(name), 0))
            out = copy(ctx.proto)
            set_attr(node_by_name(out, site.node), str(name), 1 - old)
            checked = _usable(ctx, out, node.output[0])
            text = f"CumSum {name} {old} → {1 - old}"
            yield None if checked is None else Planted(checked, [site.node], "attribute-mismatch", text)

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("neither exclusive nor reverse flipped changes the CumSum's output")
    return planted


# --------------------------------------------------------------------------- DepthToSpace mode

def d2s_sites(ctx: FileContext) -> list[Site]:
    """DepthToSpace nodes (SpaceToDepth has no mode)."""
    return [Site(n.name) for n in top_nodes(ctx, ("DepthToSpace",), _onnx) if n.output[0] in ctx.values]


def plant_d2s_mode(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """DepthToSpace DCR ↔ CRD (a PixelShuffle exported in the other channel layout)."""
    node = node_by_name(ctx.proto, site.node)
    old = attribute(node, "mode", "DCR")
    new = "CRD" if old == "DCR" else "DCR"
    out = copy(ctx.proto)
    set_attr(node_by_name(out, site.node), "mode", new)
    checked = _usable(ctx, out, node.output[0])
    if checked is None:
        raise NoVariant(f"DepthToSpace mode {new} does not run or gives the same output")
    return Planted(checked, [site.node], "attribute-mismatch",
                   f"DepthToSpace mode {old} → {new} (blocksize {attribute(node, 'blocksize')})")


# --------------------------------------------------------------------------- Trilu

def trilu_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("Trilu",), _onnx) if n.output[0] in ctx.values]


def plant_trilu_attr(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Trilu's diagonal ``k`` moved by ±1 (a causal mask one position off) or its ``upper`` flipped, where
    the output changes and the graph outputs stay finite (a fully masked row gives NaN): the first whose outputs
    count, else the strongest."""
    node = node_by_name(ctx.proto, site.node)
    has_k = len(node.input) > 1 and bool(node.input[1])
    k_value = folded(ctx, node.input[1]) if has_k else np.array(0, np.int64)
    upper = int(attribute(node, "upper", 1))
    moves = [int(d) for d in rng.permutation([1, -1])] if k_value is not None else []

    def variants():
        for d in [*moves, None]:
            if d is None:
                out = copy(ctx.proto)
                set_attr(node_by_name(out, site.node), "upper", 1 - upper)
                text = f"Trilu upper {upper} → {1 - upper}"
            else:
                k = int(k_value.reshape(-1)[0])
                new_k = np.array(k + d, k_value.dtype).reshape(k_value.shape)
                if has_k:
                    out = with_argument(ctx, site.node, 1, new_k)
                else:
                    out = copy(ctx.proto)
                    name = unique_name(out, f"{site.node}_k")
                    out.graph.initializer.append(numpy_helper.from_array(new_k, name))
                    node_by_name(out, site.node).input.append(name)
                text = f"Trilu (upper={upper}) k {k} → {k + d}"
            checked = _usable(ctx, out, node.output[0])
            finite = checked is not None and _finite_outputs(ctx, checked)
            yield Planted(checked, [site.node], "attribute-mismatch", text) if finite else None

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("no moved diagonal or flipped triangle runs, changes the output and keeps it finite")
    return planted


# --------------------------------------------------------------------------- epsilon after the square root

EPS_MAX = 1e-3  # an Add of a positive scalar up to this before a square root is a norm's epsilon
EPS_SCALES = (1, 10, 100, 1000)  # the epsilon scaled up until the outputs count


def _root(proto: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether the node takes a square root of its first input: Sqrt, or Pow by a constant 0.5."""
    if node.op_type == "Sqrt":
        return True
    return node.op_type == "Pow" and _scalar(proto, node.input[1]) == 0.5


def eps_placement_sites(ctx: FileContext) -> list[Site]:
    """Adds of a small positive scalar (≤ 1e-3) to a computed tensor (a variance or mean square) whose output
    flows, through Casts alone and read once, into a Sqrt or a Pow by 0.5: ``sqrt(var + eps)``."""
    sites = []
    for n in top_nodes(ctx, ("Add",), _onnx):
        if len(n.input) != 2 or n.output[0] not in ctx.values:
            continue
        for k in scalar_inputs(ctx.proto, n):
            eps = _scalar(ctx.proto, n.input[k])
            if not 0 < eps <= EPS_MAX or folded(ctx, n.input[1 - k]) is not None:
                continue
            chain, root = _down(ctx.proto, n.output[0])
            if root is not None and _onnx(root.domain) and _root(ctx.proto, root) and \
                    root.input[0] == (chain[-1].output[0] if chain else n.output[0]):
                sites.append(Site(n.name, (k, root.name, tuple(c.name for c in chain))))
    return sites


def _eps_after(ctx: FileContext, site: Site, factor: float) -> onnx.ModelProto:
    """Copy of the file computing ``root(v) + eps·factor`` where it computed ``root(v + eps)``: the root reads
    the Add's other input, the Add (then the Casts) reads the root's result, the last of them writes what the
    root wrote.  The Add and the Casts move right after the root."""
    k, root_name, chain_names = site.detail
    out = copy(ctx.proto)
    add, root = node_by_name(out, site.node), node_by_name(out, root_name)
    if factor != 1:
        value = constant(ctx.proto, add.input[k])
        out = with_own_constant(out, site.node, k, (value.astype(np.float64) * factor).astype(value.dtype),
                                "scaled")
        add, root = node_by_name(out, site.node), node_by_name(out, root_name)
    v, result = add.input[1 - k], root.output[0]
    rooted = unique_name(out, f"{result}_before_eps")
    root.input[0], root.output[0] = v, rooted
    add.input[1 - k] = rooted
    chain = [node_by_name(out, c) for c in chain_names]
    (chain[-1] if chain else add).output[0] = result
    moved = {add.name, *chain_names}
    kept = [n for n in out.graph.node if n.name not in moved]
    at = next(i for i, n in enumerate(kept) if n.name == root_name)
    ordered = kept[:at + 1] + [add, *chain] + kept[at + 1:]
    nodes = [onnx.NodeProto() for _ in ordered]
    for new, old in zip(nodes, ordered):
        new.CopyFrom(old)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes)
    return out


def plant_eps_placement(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """``sqrt(v + eps)`` computed as ``sqrt(v) + eps``: the epsilon as it is, else scaled ×10, ×100, ×1000 (said
    in the description) until the outputs diverge ≥ 2× the tolerance; the strongest when none does."""
    k, root_name, _ = site.detail
    add = node_by_name(ctx.proto, site.node)
    root = node_by_name(ctx.proto, root_name)
    eps = _scalar(ctx.proto, add.input[k])
    what = "Sqrt" if root.op_type == "Sqrt" else "Pow 0.5"

    def variants():
        for factor in EPS_SCALES:
            checked = _usable(ctx, _eps_after(ctx, site, factor), root.output[0])
            scaled = "" if factor == 1 else f", epsilon ×{factor} ({eps:g} → {eps * factor:g})"
            yield None if checked is None else Planted(
                checked, [site.node, root_name], "epsilon-mismatch",
                f"epsilon {eps:g} added after the {what} ({root_name}) instead of before it{scaled}",
                {"eps_factor": factor})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("the epsilon after the square root does not run or change the output")
    return planted


# --------------------------------------------------------------------------- unbiased variance

def _deviation_square(proto: onnx.ModelProto, tensor: str) -> bool:
    """Whether ``tensor`` is ``(x − mean(x))²``: a Pow by 2 or a Mul of a tensor by itself, of a Sub whose
    subtrahend is a ReduceMean (Casts looked through)."""
    sq = _up(proto, tensor)
    if sq is None or not _onnx(sq.domain):
        return False
    if sq.op_type == "Pow" and _scalar(proto, sq.input[1]) == 2.0:
        base = sq.input[0]
    elif sq.op_type == "Mul" and len(sq.input) == 2 and sq.input[0] == sq.input[1]:
        base = sq.input[0]
    else:
        return False
    sub = _up(proto, base)
    if sub is None or sub.op_type != "Sub":
        return False
    mean = _up(proto, sub.input[1])
    return mean is not None and mean.op_type == "ReduceMean"


def _scaled_by(ctx: FileContext, tensor: str) -> float:
    """The product of the scalars ``tensor`` is multiplied (Mul) or divided (Div) by next — constants, or
    scalars computed from the input's shape (a dynamic export's n and n − 1) —, through Casts, each tensor on
    the way read once (1.0 when none)."""
    factor = 1.0
    for _ in range(4):
        chain, node = _down(ctx.proto, tensor)
        if node is None or node.op_type not in ("Mul", "Div") or len(node.input) != 2:
            break
        at = chain[-1].output[0] if chain else tensor
        k = 1 if node.input[0] == at else 0
        value = ctx.values.get(node.input[k], constant(ctx.proto, node.input[k]))
        if value is None or value.size != 1 or not value.reshape(-1)[0] or (node.op_type == "Div" and k == 0):
            break
        c = float(value.reshape(-1)[0])
        factor *= c if node.op_type == "Mul" else 1 / c
        tensor = node.output[0]
    return factor


def _reduced_size(ctx: FileContext, node: onnx.NodeProto) -> int | None:
    shape = shape_of(ctx, node.input[0])
    if shape is None:
        return None
    found = reduce_axes(ctx, node)
    if found is None:
        has_axes_input = len(node.input) > 1 and bool(node.input[1])
        if has_axes_input or attribute(node, "axes") or attribute(node, "noop_with_empty_axes", 0):
            return None  # axes that depend on the input, or a no-op
        axes = range(len(shape))
    else:
        axes = {a % len(shape) for a in found[0]}
    return int(np.prod([shape[a] for a in axes]))


def unbiased_sites(ctx: FileContext) -> list[Site]:
    """ReduceMeans computing a decomposed norm's variance, ``mean((x − mean(x))²)``, over n > 1 elements, not
    already corrected by a Mul by n/(n−1) (a LayerNormalization or an RMS norm has no such variance)."""
    sites = []
    for n in top_nodes(ctx, ("ReduceMean",), _onnx):
        if n.output[0] not in ctx.values or not is_float_tensor(ctx, n.output[0]):
            continue
        if any(o.name == n.output[0] for o in ctx.proto.graph.output) or not _deviation_square(ctx.proto, n.input[0]):
            continue
        size = _reduced_size(ctx, n)
        if size is None or size < 2:
            continue
        if abs(_scaled_by(ctx, n.output[0]) - size / (size - 1)) < 1e-3:
            continue  # already unbiased (torch.var's default, exported as a Mul by n and a Div by n − 1)
        sites.append(Site(n.name, (size,)))
    return sites


def plant_unbiased_var(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Mul by n/(n−1) inserted after the variance's ReduceMean (its readers read the product)."""
    (size,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    var = node.output[0]
    factor = size / (size - 1)
    c = unique_name(out, f"{site.node}_unbiased_factor")
    out.graph.initializer.append(numpy_helper.from_array(np.array(factor, ctx.values[var].dtype), c))
    corrected = unique_name(out, f"{var}_unbiased")
    name = unique_name(out, f"{site.node}_unbiased_Mul")
    for n in out.graph.node:
        for i, t in enumerate(n.input):
            if t == var:
                n.input[i] = corrected
    mul = helper.make_node("Mul", [var, c], [corrected], name=name)
    insert_nodes(out, site.node, [], [mul])
    reader = next(r for r in readers(ctx.proto, var))
    checked = _usable(ctx, out, reader.output[0])
    if checked is None:
        raise NoVariant("the unbiased variance does not run or change the output")
    return Planted(checked, [name], "attribute-mismatch",
                   f"variance {var} made unbiased: ×{size}/{size - 1} ({name} inserted after {site.node})",
                   {"n": size})


# --------------------------------------------------------------------------- weight rounded to a grid

ROUND_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "FusedGemm", "FusedConv")
GRIDS = (("int8", 127), ("int4", 7))  # symmetric per-tensor: scale = max|w| / levels


def rounded_sites(ctx: FileContext) -> list[Site]:
    """Float weights (≥ 2 dims, read by this node alone) of MatMul / Gemm / Conv nodes (a DequantizeLinear's
    integer weight is on a grid already)."""
    sites = []
    for n in top_nodes(ctx, ROUND_OPS):
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if src == n.input[k] and is_float_array(value) and np.any(value):
                sites.append(Site(n.name, (k, src)))
    return sites


def on_grid(value: np.ndarray, levels: int) -> tuple[np.ndarray, float]:
    v = value.astype(np.float64)
    scale = float(np.abs(v).max()) / levels
    return (np.clip(np.round(v / scale), -levels, levels) * scale).astype(value.dtype), scale


def plant_weight_rounded(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The weight rounded to the symmetric per-tensor int8 grid (max|w|/127), else int4 (max|w|/7) when the
    int8 one does not reach the outputs at 2× the tolerance: a fake-quantized checkpoint saved as float."""
    _, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)

    def variants():
        for grid, levels in GRIDS:
            new, scale = on_grid(value, levels)
            checked = None if np.array_equal(new, value) else _usable(
                ctx, with_initializer(ctx.proto, source, new), node.output[0])
            if checked is None:
                yield None
                continue
            rel = float(np.linalg.norm(new.astype(np.float64) - value) / np.linalg.norm(value.astype(np.float64)))
            yield Planted(checked, [site.node], "weight-mismatch",
                          f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}) rounded to the {grid} "
                          f"grid (scale max|w|/{levels} = {scale:.3g}; relative error {rel:.3g})",
                          {"weight": source, "grid": grid, "also_accepted": "quantization"})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("the rounded weight gives the same output")
    return planted


# --------------------------------------------------------------------------- Resize rounding

NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
CUBIC_A = (-0.75, -0.5)  # PyTorch's and TensorFlow's


def resize_rounding_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("Resize",), _onnx)
            if n.output[0] in ctx.values and is_float_tensor(ctx, n.output[0])]


def plant_resize_rounding(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """nearest: another ``nearest_mode``; cubic: ``cubic_coeff_a`` −0.75 ↔ −0.5; then (or for linear)
    ``exclude_outside`` flipped; planted where the output changes: the first whose outputs count, else the
    strongest."""
    node = node_by_name(ctx.proto, site.node)
    mode = attribute(node, "mode", "nearest")
    variants = []
    if mode == "nearest":
        old = attribute(node, "nearest_mode", "round_prefer_floor")
        variants += [("nearest_mode", str(m), old) for m in rng.permutation([m for m in NEAREST_MODES if m != old])]
    elif mode == "cubic":
        old = float(attribute(node, "cubic_coeff_a", -0.75))
        variants.append(("cubic_coeff_a", CUBIC_A[1] if abs(old - CUBIC_A[0]) < 1e-6 else CUBIC_A[0], old))
    if mode != "nearest":
        old = int(attribute(node, "exclude_outside", 0))
        variants.append(("exclude_outside", 1 - old, old))

    def made():
        for name, new, old in variants:
            out = copy(ctx.proto)
            set_attr(node_by_name(out, site.node), name, new)
            checked = _usable(ctx, out, node.output[0])
            shown = (lambda x: f"{x:g}") if name == "cubic_coeff_a" else str
            yield None if checked is None else Planted(checked, [site.node], "resize-mode",
                                                       f"Resize ({mode}) {name} {shown(old)} → {shown(new)}")

    planted = _pick(ctx, made())
    if planted is None:
        raise NoVariant(f"no other rounding of the {mode} Resize runs and changes the output")
    return planted


KINDS = (
    FaultKind("pad-mode", pad_mode_sites, plant_pad_mode, "attribute-mismatch",
              "a Pad's mode changed: reflect ↔ edge, constant → reflect / edge, edge → constant"),
    FaultKind("cumsum-attr", cumsum_sites, plant_cumsum_attr, "attribute-mismatch",
              "a CumSum's exclusive or reverse flipped (position ids from a mask's cumsum one off)"),
    FaultKind("d2s-mode", d2s_sites, plant_d2s_mode, "attribute-mismatch",
              "a DepthToSpace's mode DCR ↔ CRD (PixelShuffle exported in the other layout)"),
    FaultKind("trilu-attr", trilu_sites, plant_trilu_attr, "attribute-mismatch",
              "a Trilu's diagonal k moved by ±1 or its upper flipped (a causal mask one position off)"),
    FaultKind("eps-placement", eps_placement_sites, plant_eps_placement, "epsilon-mismatch",
              "a decomposed norm's sqrt(v + eps) computed as sqrt(v) + eps (eps ×10–1000 where needed to count)"),
    FaultKind("unbiased-var", unbiased_sites, plant_unbiased_var, "attribute-mismatch",
              "a decomposed norm's variance made unbiased: a Mul by n/(n−1) inserted after its ReduceMean"),
    FaultKind("weight-rounded", rounded_sites, plant_weight_rounded, "weight-mismatch / quantization",
              "a MatMul/Gemm/Conv float weight rounded to a per-tensor int8 grid (int4 where int8 does not count)"),
    FaultKind("resize-nearest", resize_rounding_sites, plant_resize_rounding, "resize-mode",
              "a Resize's nearest_mode, cubic_coeff_a (−0.75 ↔ −0.5) or exclude_outside changed"),
)
