"""What else a node of the divergent segment could have been: plausible other attributes and constant inputs.

Each alternative is an edit of a copy of the model.  The attribute rule tries
them one at a time on the segment alone and keeps one with which the segment
reproduces PyTorch's output: a Softmax over another axis, a Transpose with two
axes swapped, a Where with its branches the other way round, a scale, offset
or clip bound fitted to PyTorch's output (or taken from the op PyTorch ran), a
Reshape to the shape PyTorch's view produced.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import onnx

from ...records.weights import Weights
from . import edits
from .form_alternatives import unflattened
from .op_alternatives import op_alternatives
from ..context import attribute

#: ``(model, weights) -> (model, weights)``: applies an alternative to copies
Edit = Callable[[onnx.ModelProto, Weights], tuple[onnx.ModelProto, Weights]]
#: binary ops whose scalar constant operand is tried at other values
SCALAR_OPS = frozenset({"Mul", "Div", "Add", "Sub", "Pow"})
#: of them, those whose scalar is also searched for by re-running the segment
SEARCHED_OPS = frozenset({"Mul", "Div", "Pow"})
#: what a value found by searching the segment's re-runs is said to come from (closed by what follows it)
SEARCHED_SOURCE = "the PyTorch output (searched"


@dataclass(frozen=True)
class Alternative:
    """One other configuration of one node: what changes, from what to what, and on whose evidence."""

    node: str
    what: str  # "axis", "perm", "constant input 'scale'", "branches", "shape input"
    have: Any
    want: Any
    source: str  # what implies ``want``: "the PyTorch output", "aten.mul.Scalar's factor"
    edit: Edit
    feeds: dict[str, np.ndarray] | None = None  # values the segment reads instead (a fixed node outside it)
    shows_in: tuple[str, ...] = ()  # the nodes the change takes effect in (a shape piece: the Reshape)
    #: the PyTorch value the divergent tensor holds with the change, where it is not the one paired with it (a
    #: block run in its own place computes another module's value there); None: the paired one
    reference: Any = field(default=None, compare=False, repr=False)

    def apply(self, model: onnx.ModelProto, weights: Weights) -> tuple[onnx.ModelProto, Weights]:
        """This alternative applied to ``model``/``weights`` (which are modified: pass copies)."""
        return self.edit(model, weights)


def attribute_change(node: str, name: str, have, want, source: str) -> Alternative:
    """An attribute set to another value."""
    def edit(model, weights):
        return edits.set_attribute(model, node, name, want), weights
    return Alternative(node, name, have, want, source, edit)


def searched(ctx, proto: onnx.NodeProto) -> Iterator[Alternative]:
    """The alternatives found by searching, by re-running the segment, for a scalar no closed form fits (inside
    the segment): tried after every node's other alternatives, so that a fit where the error shows (a Div's
    divisor computing the divergent tensor) wins over a compensating search on the node before it (a Mul by
    the attention scale: ``x·a/b`` is fixed by either constant)."""
    if proto.op_type in SEARCHED_OPS:
        yield from _scalars(ctx, proto, searching=True)


def alternatives(ctx, proto: onnx.NodeProto, shape_of: Callable[[str], tuple | None]) -> Iterator[Alternative]:
    """The plausible alternatives of one segment node (``ctx`` is the DiagnosisContext); see also
    :func:`searched`."""
    op = proto.op_type
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        yield from _axis(ctx, proto, shape_of)
        yield from unflattened(ctx, proto, shape_of, Alternative)  # an axis of the tensor before a flatten
    elif op == "Transpose":
        yield from _perm(ctx, proto, shape_of)
    elif op == "Pad":
        have = attribute(proto, "mode", "constant")
        yield from (attribute_change(proto.name, "mode", have, m, "the PyTorch output")
                    for m in ("constant", "reflect", "edge") if m != have)
    elif op == "Gemm":
        for attr in ("transA", "transB"):
            operand = shape_of(proto.input[0 if attr == "transA" else 1])
            if operand and len(operand) == 2 and operand[0] == operand[1]:
                have = attribute(proto, attr, 0)
                yield attribute_change(proto.name, attr, have, 1 - have, "the PyTorch output")
    elif op == "Where" and len(proto.input) == 3:
        yield _swapped_branches(proto)
    elif op in SCALAR_OPS:
        yield from _scalars(ctx, proto)
    elif op == "Reshape" and len(proto.input) > 1:
        yield from _shapes(ctx, proto)
    elif op == "Concat":
        yield from _shape_pieces(ctx, proto, shape_of)
    elif op == "Clip":
        yield from _clip_bounds(ctx, proto, shape_of)
    elif op in ("FusedConv", "FusedGemm") and attribute(proto, "activation") == "Clip":
        yield from _fused_clip_bounds(ctx, proto)
    elif op in ("FusedConv", "FusedGemm") and attribute(proto, "activation") in FUSED_DEFAULTS:
        have = [float(x) for x in attribute(proto, "activation_params", [])]
        want = list(FUSED_DEFAULTS[attribute(proto, "activation")])
        if len(have) == len(want) and not np.allclose(have, want):
            yield attribute_change(proto.name, "activation_params", have, want, "PyTorch's "
                                   f"{FUSED_TORCH[attribute(proto, 'activation')]}")
    elif op == "Trilu":
        yield from _trilu(ctx, proto)
    elif op in FLAG_ATTRIBUTES:
        yield from _flags(proto)
    elif op == "DepthToSpace":
        have = attribute(proto, "mode", "DCR")
        yield attribute_change(proto.name, "mode", have, "CRD" if have == "DCR" else "DCR", "the PyTorch output")
    if op in MASKED_BY:
        yield from _transposed_masks(ctx, proto)
        yield from _shifted_masks(ctx, proto)
    yield from op_alternatives(ctx, proto, shape_of, Alternative)


#: ops that add or select by a mask or a bias table (an attention mask, a relative position bias)
MASKED_BY = ("Add", "Where", "Mul")
#: ops a mask constant passes through on its way to the node (a cast, a broadcast, a cut to the length)
MASK_CARRIERS = ("Cast", "Unsqueeze", "Expand", "Slice", "Reshape", "Identity")


def _square_constants(ctx, proto) -> Iterator[tuple[str, np.ndarray]]:
    """``(constant, value)`` for each constant the node reads (through casts, broadcasts and slices) that is square
    in its last two axes and no weight: a mask or a position bias."""
    graph = ctx.onnx.graph
    for tensor in proto.input:
        source, hops = tensor, 0
        while not graph.is_constant(source) and hops < 3:
            node = graph.node_of(source)
            if node is None or node.op_type not in MASK_CARRIERS:
                break
            source, hops = node.inputs[0], hops + 1
        value = ctx.constant(source) if graph.is_constant(source) else None
        if value is None or value.ndim < 2 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 2 \
                or graph.weighted_readers(source):
            continue
        yield source, value


#: triangular masks are read up to this size (a diagonal searched in full)
MAX_MASK_SIDE = 256


def _shifted_masks(ctx, proto) -> Iterator[Alternative]:
    """A constant triangular mask the node reads (two values, the same in every leading slice), its diagonal moved
    one step either way: a causal mask letting a query see one future key (or not itself)."""
    for source, value in _square_constants(ctx, proto):
        found = _triangle(value)
        if found is None:
            continue
        lower, k, inside, outside = found
        n = value.shape[-1]
        for step in (1, -1):
            if -n < k + step < n:
                tri = (np.tril if lower else np.triu)(np.ones((n, n), bool), k + step)
                shifted = np.broadcast_to(np.where(tri, inside, outside).astype(value.dtype), value.shape).copy()
                yield Alternative(proto.name, f"constant input '{source}'", f"a {'lower' if lower else 'upper'} "
                                  f"triangle from diagonal {k}", f"from diagonal {k + step}", "the PyTorch output",
                                  _replacement(source, shifted))


def _triangle(value: np.ndarray) -> tuple[bool, int, object, object] | None:
    """``(lower, diagonal, value inside, value outside)`` when ``value`` is one triangular two-valued matrix in its
    last two axes (repeated over the leading ones), else None."""
    n = value.shape[-1]
    if n > MAX_MASK_SIDE:
        return None
    slices = value.reshape(-1, n, n)
    first = slices[0]
    values = np.unique(first)
    if values.size != 2 or not all(np.array_equal(first, m) for m in slices[1:]):
        return None
    for lower in (True, False):
        for inside, outside in ((values[0], values[1]), (values[1], values[0])):
            held = first == inside
            # the diagonal is where the inside region's edge lies in the first row (lower) or column (upper)
            edge = np.flatnonzero(held[0] if lower else held[:, 0])
            k = (int(edge.max()) if lower else -int(edge.max())) if edge.size else (-n if lower else n)
            tri = (np.tril if lower else np.triu)(np.ones((n, n), bool), k)
            if np.array_equal(held, tri):
                return lower, k, inside, outside
    return None


def _transposed_masks(ctx, proto) -> Iterator[Alternative]:
    """A constant the node reads (through casts, broadcasts and slices) that is square in its last two axes and
    not symmetric, transposed there: a causal mask or a position bias built with query and key exchanged."""
    for source, value in _square_constants(ctx, proto):
        flipped = np.swapaxes(value, -1, -2)
        if np.array_equal(flipped, value):
            continue
        yield Alternative(proto.name, f"constant input '{source}'", "as stored", "transposed in its last two axes "
                          "(query and key exchanged)", "the PyTorch output", _replacement(source, flipped))


#: ops whose 0/1 attributes change what they compute, with ONNX's defaults: each flipped, then all together
FLAG_ATTRIBUTES = {"CumSum": {"exclusive": 0, "reverse": 0}, "Trilu": {"upper": 1},
                   # the k smallest where PyTorch keeps the largest (a router, a beam), in another order; the
                   # first or the last of tied maxima
                   "TopK": {"largest": 1, "sorted": 1}, "ArgMax": {"select_last_index": 0},
                   "ArgMin": {"select_last_index": 0}}


def _flags(proto) -> Iterator[Alternative]:
    """Each 0/1 attribute of the node flipped (a cumulative sum made exclusive or reversed, a lower triangle
    kept where PyTorch keeps the upper one), then every one of them flipped."""
    flags = FLAG_ATTRIBUTES[proto.op_type]
    for name, default in flags.items():
        have = int(attribute(proto, name, default))
        yield attribute_change(proto.name, name, have, 1 - have, "the PyTorch output")
    if len(flags) > 1:
        have = {n: int(attribute(proto, n, d)) for n, d in flags.items()}
        want = {n: 1 - v for n, v in have.items()}

        def edit(model, weights):
            for n, v in want.items():
                model = edits.set_attribute(model, proto.name, n, v)
            return model, weights
        yield Alternative(proto.name, "+".join(flags), have, want, "the PyTorch output", edit)


def _trilu(ctx, proto) -> Iterator[Alternative]:
    """A Trilu's ``upper`` flipped, and its diagonal offset ``k`` one either way (a causal mask one position
    off: ``triu(..., diagonal=1)`` written with 0)."""
    yield from _flags(proto)
    k = ctx.constant(proto.input[1]) if len(proto.input) > 1 and proto.input[1] else np.array(0, np.int64)
    if k is None or k.size != 1:
        return
    for step in (1, -1):
        want = np.asarray(int(k.reshape(())) + step, np.int64)

        def edit(model, weights, want=want):
            name = edits.add_initializer(model, f"{proto.name}_k", want)
            node = edits.node(model, proto.name)
            if len(node.input) > 1:
                node.input[1] = name
            else:
                node.input.append(name)
            return model, weights
        yield Alternative(proto.name, "constant input 'k'", int(k.reshape(())), int(want), "the PyTorch output", edit)


def _axis(ctx, proto, shape_of) -> Iterator[Alternative]:
    shape = shape_of(proto.input[0]) if proto.input else None
    if not shape:
        return
    rank = len(shape)
    opset = next((o.version for o in ctx.onnx.skeleton.opset_import if o.domain in ("", "ai.onnx")), 0)
    have = attribute(proto, "axis", -1 if opset >= 13 else 1) % rank
    yield from (attribute_change(proto.name, "axis", have, a, "the PyTorch output") for a in range(rank) if a != have)


def _perm(ctx, proto, shape_of) -> Iterator[Alternative]:
    """The permutation PyTorch's op ran (``aten.permute``'s dims, ``aten.transpose``'s two axes) where the
    node's input has that op's rank, then the perms two swapped axes away that keep the node's output shape or
    give PyTorch's (a wrong perm may change the shape)."""
    shape = shape_of(proto.input[0]) if proto.input else None
    if not shape:
        return
    rank = len(shape)
    have = list(attribute(proto, "perm", list(range(rank))[::-1]))
    activation = ctx.layer.pair.activation
    tried = [have]
    for alt in backed_perms(ctx, proto, shape_of):
        tried.append(alt.want)
        yield alt
    shapes = [[shape[i] for i in have]]
    if proto.output[0] == ctx.tensor:
        shapes.append(list(activation.value.shape))
    for i, j in itertools.combinations(range(rank), 2):
        perm = list(have)
        perm[i], perm[j] = perm[j], perm[i]
        if perm not in tried and [shape[k] for k in perm] in shapes:
            tried.append(perm)
            yield attribute_change(proto.name, "perm", have, perm, "the PyTorch output")


#: PyTorch ops around the divergence whose permutations a Transpose is tried at
MAX_OP_PERMS = 6


def backed_perms(ctx, proto, shape_of) -> Iterator[Alternative]:
    """A Transpose at the permutations PyTorch's ops ran — the divergent op's, then those of the ops around it
    (nearest first) — of the node's rank: evidence, tried before any guessed alternative of any node (a guess on
    an earlier Transpose can compensate a later one's fault)."""
    shape = shape_of(proto.input[0]) if proto.op_type == "Transpose" and proto.input else None
    if not shape:
        return
    rank, pair = len(shape), ctx.layer.pair.activation
    have = list(attribute(proto, "perm", list(range(rank))[::-1]))
    ops = [pair] + sorted((o for o in ctx.ops if o is not pair), key=lambda o: abs(o.index - pair.index))
    tried = [have]
    for op in ops:
        implied = op_perm(op, rank)
        if implied is not None and implied not in tried:
            tried.append(implied)
            call = f"{op.module_type}({', '.join(str(a) for _, a in op.args)})"
            yield attribute_change(proto.name, "perm", have, implied, f"the call {call}")
            if len(tried) > MAX_OP_PERMS:
                return


def op_perm(activation, rank: int) -> list[int] | None:
    """The permutation an ATen permute/transpose ran, from its arguments (None for another op or rank)."""
    op = activation.module_type
    numbers = [a for _, a in activation.args]
    if op.startswith("aten.permute") and numbers and isinstance(numbers[0], tuple) and len(numbers[0]) == rank:
        perm = [int(d) % rank for d in numbers[0]]
        return perm if sorted(perm) == list(range(rank)) else None
    if op.startswith(("aten.transpose", "aten.swapaxes")) and len(numbers) >= 2 and all(
            isinstance(d, int) and not isinstance(d, bool) for d in numbers[:2]):
        perm = list(range(rank))
        i, j = numbers[0] % rank, numbers[1] % rank
        perm[i], perm[j] = perm[j], perm[i]
        return perm
    return None


def _swapped_branches(proto) -> Alternative:
    def edit(model, weights):
        node = edits.node(model, proto.name)
        node.input[1], node.input[2] = node.input[2], node.input[1]
        return model, weights
    return Alternative(proto.name, "branches (mask polarity)", [proto.input[1], proto.input[2]],
                       [proto.input[2], proto.input[1]], "the PyTorch output", edit)


def _replacement(tensor: str, value: np.ndarray) -> Edit:
    def edit(model, weights):
        return edits.replace_array(model, weights, tensor, value)
    return edit


def _scalars(ctx, proto, searching: bool = False) -> Iterator[Alternative]:
    """A scalar constant operand at the value fitted to PyTorch's output, or at the factors PyTorch's op used
    (``searching``: only at the value a search finds, where nothing is fitted)."""
    for position, tensor in enumerate(proto.input[:2]):
        value = ctx.constant(tensor)
        if value is None or value.size != 1 or value.dtype.kind != "f":
            continue
        have = float(value.reshape(-1)[0])
        if proto.op_type == "Div" and position == 0 and have == 1.0:
            continue  # a reciprocal's numerator is its form, not a factor: fitted, it undoes any scale before it
        tried = set()
        candidates = (_searched_candidates(ctx, proto, position, have, tensor, value) if searching else
                      _scalar_candidates(ctx, proto, position, have, tensor, value))
        for want, source in candidates:
            key = float(f"{want:.6g}")
            if not np.isfinite(want) or key in tried or np.isclose(want, have, rtol=1e-6, atol=0):
                continue
            tried.add(key)
            yield Alternative(proto.name, f"constant input '{tensor}'", have, key, source,
                              _replacement(tensor, np.full(value.shape, want, value.dtype)))


def _scalar_candidates(ctx, proto, position: int, have: float, tensor: str, value: np.ndarray
                       ) -> Iterator[tuple[float, str]]:
    fitted = _fit_scalar(ctx, proto, position) if proto.output[0] == ctx.tensor else None
    if fitted is not None:  # a simple number near the fit first (a float16 segment's fit is off by its noise)
        yield from ((nice, "the PyTorch output (a simple number near the fit)") for nice in _nice_numbers(fitted))
        yield fitted, "the PyTorch output"
    yield from _formula_constants(ctx.layer.pair.activation)
    for name, arg in ctx.layer.pair.activation.args:
        for x in _numbers(arg):
            if x not in (0.0, 1.0, -1.0):
                op = ctx.layer.pair.activation.module_type
                yield x, f"{op}'s argument {x:.6g}"
                yield 1.0 / x, f"the inverse of {op}'s argument {x:.6g}"
    if proto.op_type == "Pow" and position == 1:
        yield from ((e, "a usual exponent") for e in USUAL_EXPONENTS)


def _searched_candidates(ctx, proto, position: int, have: float, tensor: str, value: np.ndarray
                         ) -> Iterator[tuple[float, str]]:
    """Inside the segment (a macaron half-step's 0.5 before a residual Add and a LayerNorm) no closed form fits,
    so the factor is searched by re-running the segment, and a simple number near it tried first."""
    if proto.output[0] == ctx.tensor and _fit_scalar(ctx, proto, position) is not None:
        return  # fitted in closed form
    found = _searched_scalar(ctx, tensor, have, value)
    if found is not None:
        for nice in _nice_numbers(found):
            yield nice, f"{SEARCHED_SOURCE}, a simple number near it)"
        yield found, f"{SEARCHED_SOURCE})"


#: a Pow's exponents in the formulas models use (squares and variances, roots, cubes, reciprocals)
USUAL_EXPONENTS = (2.0, 0.5, 3.0, 1.0, -0.5, -1.0, 1.0 / 3.0)
#: the constants of the formulas exporters write these modules (or ATen ops) as, by a word of their name: a
#: wrong one inside the decomposition (GELU's x/√2 divided by another number) is no op's argument
FORMULA_CONSTANTS = {
    "gelu": (math.sqrt(2.0), 1.0 / math.sqrt(2.0), 1.0, 0.5, 0.044715, math.sqrt(2.0 / math.pi)),
    "quickgelu": (1.702,),  # x·sigmoid(1.702·x): CLIP's
    "hardswish": (3.0, 6.0, 1.0 / 6.0),
    "hardsigmoid": (3.0, 6.0, 1.0 / 6.0, 0.5),
    "mish": (1.0,),
}
#: the bounds a module clamps to without arguments
KNOWN_BOUNDS = {"relu6": (0.0, 6.0), "hardtanh": (-1.0, 1.0)}


def _formula_constants(a) -> Iterator[tuple[float, str]]:
    name = f"{a.module_type} {a.op or ''}".lower().replace("_", "")
    for word, constants in FORMULA_CONSTANTS.items():
        if word in name:
            yield from ((c, f"the {word.upper()} formula") for c in constants)


#: a fused activation's parameters as PyTorch computes it (``hardsigmoid``: relu6(x + 3) / 6)
FUSED_DEFAULTS = {"HardSigmoid": (1.0 / 6.0, 0.5)}
FUSED_TORCH = {"HardSigmoid": "hardsigmoid (alpha 1/6, beta 0.5)"}


def _fused_clip_bounds(ctx, proto) -> Iterator[Alternative]:
    """A fused Clip activation's ``activation_params`` at the module's bounds (ReLU6: 0 and 6), its
    arguments, or the range of PyTorch's output."""
    have = [float(x) for x in attribute(proto, "activation_params", [])]
    if len(have) != 2:
        return
    a = ctx.layer.pair.activation
    guesses = []
    if a.module_type.lower() in KNOWN_BOUNDS:
        guesses.append((KNOWN_BOUNDS[a.module_type.lower()], a.module_type))
    numbers = [x for _, arg in a.args for x in _numbers(arg)]
    if len(numbers) >= 2:
        guesses.append((tuple(numbers[:2]), f"{a.module_type}'s arguments"))
    finite = ctx.reference[np.isfinite(ctx.reference)]
    if proto.output[0] == ctx.tensor and finite.size:
        guesses.append(((float(finite.min()), float(finite.max())), "the range of the PyTorch output"))
    for want, source in guesses:
        want = [float(f"{w:.6g}") for w in want]
        if not np.allclose(want, have):
            yield attribute_change(proto.name, "activation_params", have, want, source)


def _numbers(arg) -> list[float]:
    if isinstance(arg, bool):
        return []
    if isinstance(arg, (int, float)):
        return [float(arg)]
    return []


#: segment runs a scalar search may take, and how far from the file's value it looks (a factor either way)
SEARCH_RUNS = 24
SEARCH_SPAN = 8.0


def _searched_scalar(ctx, tensor: str, have: float, value: np.ndarray) -> float | None:
    """The factor near ``have`` (same sign, within :data:`SEARCH_SPAN` either way) whose segment output is
    nearest PyTorch's: a golden-section search on its logarithm, one segment run per step."""
    if not np.isfinite(have) or have == 0:
        return None
    reference = ctx.reference.astype(np.float64)

    def error(u: float) -> float:
        model, weights = _replacement(tensor, np.full(value.shape, have * math.exp(u), value.dtype))(
            edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights)
        try:
            out = ctx.run_segment(model, weights)[ctx.tensor].astype(np.float64)
        except Exception:  # noqa: BLE001 - a value the segment will not run with is no candidate
            return math.inf
        return float(np.linalg.norm(out.reshape(-1) - reference.reshape(-1))) if out.size == reference.size \
            else math.inf

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    lo, hi = -math.log(SEARCH_SPAN), math.log(SEARCH_SPAN)
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = error(a), error(b)
    for _ in range(SEARCH_RUNS - 2):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = error(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = error(b)
    best = a if fa <= fb else b
    return have * math.exp(best) if math.isfinite(min(fa, fb)) else None


def _nice_numbers(x: float) -> list[float]:
    """Simple numbers within 0.5 % of ``x``: a fraction p/q (q ≤ 16), or the square root of one, or its inverse
    (an attention scale 1/√d)."""
    out = []
    for transform, back in ((lambda v: v, lambda v: v), (lambda v: v * v, math.sqrt), (lambda v: 1 / (v * v),
                                                                                         lambda v: 1 / math.sqrt(v))):
        t = transform(abs(x))
        for q in range(1, 17):
            p = round(t * q)
            if p and abs(p / q - t) <= 5e-3 * t:
                out.append(math.copysign(back(p / q), x))
                break
    return list(dict.fromkeys(out))


def _fit_scalar(ctx, proto, position: int) -> float | None:
    """The scalar that makes ``proto`` (whose output is the divergent tensor) reproduce PyTorch's output, by least
    squares: ``y = x·c``, ``x/c``, ``c/x``, ``x±c``, ``c−x``."""
    other = proto.input[1 - position]
    values = ctx.run_segment(outputs=[other])
    if other not in values:
        return None
    reference = ctx.reference
    try:
        x = np.broadcast_to(values[other].astype(np.float64), reference.shape).ravel()
    except ValueError:  # the reference is in PyTorch's layout (a view ONNX computes in another shape)
        return None
    with np.errstate(all="ignore"):
        y = reference.astype(np.float64).ravel()
        keep = np.isfinite(x) & np.isfinite(y) & (np.abs(y) < 1e30)
        x, y = x[keep], y[keep]
        if not x.size:
            return None
        op = proto.op_type
        if op == "Mul":
            return float(x @ y / (x @ x)) if x @ x else None
        if op == "Div":
            if position == 1:
                return float(x @ x / (x @ y)) if x @ y else None
            inv = 1.0 / x
            return float(inv @ y / (inv @ inv)) if np.isfinite(inv).all() and inv @ inv else None
        if op == "Add":
            return float(np.mean(y - x))
        if op == "Sub":
            return float(np.mean(x - y)) if position == 1 else float(np.mean(y + x))
    return None


def _shapes(ctx, proto) -> Iterator[Alternative]:
    """A Reshape to the shape PyTorch's op produced, or to a shape PyTorch's view was asked for."""
    have = ctx.constant(proto.input[1])
    if have is None or have.dtype.kind not in "iu":
        return
    activation = ctx.layer.pair.activation
    own = f"{activation.module_type}'s shape"
    wanted = [(tuple(activation.value.shape), own)] if proto.output[0] == ctx.tensor else []
    # a Reshape whose output only Transposes lead to the divergent tensor: the shapes PyTorch's values there had
    # (the op's own; those of ops nearby holding as many elements: a recurrent layer's batch-first output the
    # op flattened), laid out as before those Transposes
    near = list(dict.fromkeys([tuple(activation.value.shape)] + _near_shapes(ctx, activation)))
    for shape in near:
        laid_out = _before_transposes(ctx, proto.output[0], _at_rank(shape, have.size))
        if laid_out is not None:
            wanted.append((laid_out, f"PyTorch's {list(shape)} before the Transpose after the Reshape"))
    # a Reshape inside the segment back to the shape of a value around it (a GroupNorm's Reshape after its
    # InstanceNormalization restores the input's shape): those shapes, where they hold the Reshape's elements
    size = ctx.shape_of(proto.input[0])
    wanted += [(_at_rank(shape, have.size), f"the shape of PyTorch's {list(shape)} value nearby") for shape in near
               if size is not None and int(np.prod(shape)) == int(np.prod(size))]
    wanted += [(tuple(a), own) for _, a in activation.args
               if isinstance(a, tuple) and all(isinstance(x, int) for x in a)]
    wanted += _view_shapes(ctx, proto, activation)
    first: dict[tuple[int, ...], str] = {}
    for want, source in wanted:
        first.setdefault(want, source)
    for want, source in first.items():
        if len(want) == have.size or proto.output[0] == ctx.tensor:
            value = np.array(want, dtype=have.dtype)
            if value.shape != have.shape or not np.array_equal(value, have):
                yield Alternative(proto.name, f"shape input '{proto.input[1]}'", have.tolist(), list(want),
                                  source, _replacement_shape(proto.input[1], value))


def _shape_pieces(ctx, proto, shape_of) -> Iterator[Alternative]:
    """A Concat assembling a Reshape's shape from computed sizes and constant pieces: each constant piece at the
    entries of the shape PyTorch's value (or view) has there."""
    graph = ctx.onnx.graph
    reshape = next((graph.nodes[c] for c in graph.consumers.get(proto.output[0], ())
                    if graph.nodes[c].op_type == "Reshape" and graph.nodes[c].inputs[1:2] == (proto.output[0],)), None)
    if reshape is None:
        return
    pieces, offset = [], 0
    for tensor in proto.input:
        value, shape = ctx.constant(tensor), shape_of(tensor)
        length = value.size if value is not None else (shape[0] if shape and isinstance(shape[0], int) else None)
        if length is None:
            return
        pieces.append((tensor, value, offset))
        offset += length
    activation = ctx.layer.pair.activation
    wanted = [tuple(activation.value.shape)] if reshape.outputs[0] == ctx.tensor else []
    wanted += [w for w, _ in _view_shapes(ctx, ctx.node(reshape.name), activation)]
    for want in dict.fromkeys(w for w in wanted if len(w) == offset):
        for tensor, value, at in pieces:
            if value is None or value.dtype.kind not in "iu" or value.ndim != 1:
                continue
            fixed = np.array(want[at:at + value.size], dtype=value.dtype)
            if not np.array_equal(fixed, value) and not (value == -1).any():
                yield Alternative(proto.name, f"shape piece '{tensor}'", value.tolist(), fixed.tolist(),
                                  f"{activation.name}'s shape", _replacement_shape(tensor, fixed),
                                  shows_in=(reshape.name,))


def _at_rank(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """``shape`` with its leading axes merged (or size-1 axes put in front) to ``rank`` axes: an exporter lays a
    4-d transpose out as a 3-d one, the leading batch and head axes merged."""
    if len(shape) > rank >= 1:
        cut = len(shape) - rank + 1
        return (int(np.prod(shape[:cut])),) + tuple(shape[cut:])
    return (1,) * (rank - len(shape)) + tuple(shape)


def _near_shapes(ctx, activation) -> list[tuple[int, ...]]:
    """Shapes of the values PyTorch computed with as many elements as ``activation``: of the ops around it
    (nearest first), then of the layers whose tensors the segment reads (the layer before it, whose output it
    flattened)."""
    size = activation.value.size
    ops = sorted((a for a in ctx.ops if a.value is not None and np.size(a.value) == size),
                 key=lambda a: abs(a.index - activation.index))
    read = {t for p in ctx.segment_protos for t in p.input}
    inputs = [r.pair.activation for r in ctx.layers if r.pair.tensor in read and r.pair.activation.value is not None
              and np.size(r.pair.activation.value) == size]
    return list(dict.fromkeys(tuple(np.shape(a.value)) for a in ops + inputs))[:MAX_VIEW_SHAPES]


def _before_transposes(ctx, tensor: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape ``tensor`` must have for the Transposes that alone lead from it to the divergent tensor to give
    ``shape`` (a recurrent output reshaped sequence-first, then transposed to PyTorch's batch-first), or None
    when other nodes (or none) lie between them."""
    perms = []
    while tensor != ctx.tensor:
        readers = [n for n in ctx.segment_protos if tensor in n.input]
        if len(readers) != 1 or readers[0].op_type != "Transpose":
            return None
        perms.append(list(attribute(readers[0], "perm", [])))
        tensor = readers[0].output[0]
    if not perms or any(sorted(p) != list(range(len(shape))) for p in perms):
        return None
    for perm in reversed(perms):  # undo the last Transpose first: out[i] = in[perm[i]]
        before = [0] * len(shape)
        for i, axis in enumerate(perm):
            before[axis] = shape[i]
        shape = tuple(before)
    return shape


def boundary_shapes(ctx) -> Iterator[Alternative]:
    """A Reshape just outside the segment whose output — a tensor the segment reads, paired with an activation
    it holds element for element — has another shape than PyTorch's value (a size-1 axis moved: the same
    numbers in the same order, read along other axes by a reduction or a Conv): the Reshape at PyTorch's
    shape, the segment fed the value in that shape."""
    by_tensor = {r.pair.tensor: r.pair.activation for r in ctx.layers if r.pair.tensor and r.pair.activation.value
                 is not None}
    for t, value in ctx.segment_feeds().items():
        a = by_tensor.get(t)
        producer, projected = _reshape_behind(ctx, t) if a is not None else (None, False)
        if producer is None or len(producer.inputs) < 2:
            continue
        want = tuple(np.shape(a.value))
        have = ctx.constant(producer.inputs[1])
        if have is None or have.dtype.kind not in "iu" or value.shape == want or int(np.prod(want)) != value.size \
                or have.shape != (len(want),) or projected and have[-1] <= 0:
            continue
        # through a Linear (a MatMul over the last axis) the Reshape's last axis is the Linear's input width
        fixed = np.array(want[:-1] + (int(have[-1]),) if projected else want, dtype=have.dtype)
        yield Alternative(producer.name, f"shape input '{producer.inputs[1]}'", have.tolist(), fixed.tolist(),
                          f"{a.name}'s shape {list(want)}", _replacement_shape(producer.inputs[1], fixed),
                          feeds={t: np.ascontiguousarray(value.reshape(want))})


#: ops whose output has the shape of their (non-constant) input
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Erf", "Relu", "Sigmoid", "Tanh", "Gelu", "Cast", "Neg",
                         "Abs", "Sqrt", "Exp", "Log", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Softplus",
                         "Identity", "Mish", "Elu", "Selu", "PRelu", "FastGelu", "QuickGelu"})


def _reshape_behind(ctx, tensor: str):
    """``(Reshape, projected)``: the nearest Reshape ``tensor`` is computed from through elementwise ops (a
    Linear's output reshaped, then its activation) and MatMuls with constant weights (``projected``: a Linear
    over the reshaped value's last axis), or ``(None, False)``."""
    graph, queue, seen = ctx.onnx.graph, [(tensor, False)], set()
    while queue and len(seen) < 16:  # nearest first: a GELU reads its input on two paths
        t, projected = queue.pop(0)
        node = graph.node_of(t)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type == "Reshape":
            return node, projected
        if node.op_type in ELEMENTWISE:  # (not by the file's shapes: they may be stale where it was edited)
            queue += [(i, projected) for i in node.inputs if i and not graph.is_constant(i)]
        elif node.op_type == "MatMul" and not projected and graph.has_constant_weights(node):
            queue.append((node.inputs[0], True))
    return None, False


#: ATen ops that only give their input another shape
VIEW_OPS = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten._reshape_alias", "aten.unflatten", "aten.flatten")
#: view shapes tried per Reshape, nearest the divergent op first
MAX_VIEW_SHAPES = 6


def _view_shapes(ctx, proto, activation) -> list[tuple[tuple[int, ...], str]]:
    """The shapes PyTorch's view-like ops gave values of the Reshape's input size, in the window around the
    divergence (nearest the divergent op first): the shape the Reshape should have had is among them."""
    size = ctx.shape_of(proto.input[0])
    if size is None:
        return []
    numel = int(np.prod(size))
    views = [a for a in ctx.ops if a.module_type.startswith(VIEW_OPS) and a.value.size == numel]
    views.sort(key=lambda a: abs(a.index - activation.index))
    shapes = list(dict.fromkeys(tuple(a.value.shape) for a in views))[:MAX_VIEW_SHAPES]
    return [(shape, "PyTorch's view") for shape in shapes]


def _replacement_shape(tensor: str, value: np.ndarray) -> Edit:
    def edit(model, weights):
        for init in model.graph.initializer:
            if init.name == tensor:
                init.CopyFrom(onnx.numpy_helper.from_array(value, tensor))
                return model, weights
        for n in model.graph.node:
            if n.op_type == "Constant" and n.output[0] == tensor:
                del n.attribute[:]
                n.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(value)))
                return model, weights
        raise KeyError(tensor)
    return edit


def _clip_bounds(ctx, proto, shape_of) -> Iterator[Alternative]:
    """Clip bounds at those of PyTorch's clamps (the divergent op's arguments, then those of the clamps captured
    around it), at the range of PyTorch's output, or — for a Clip of integers that index a Gather — at the
    gathered axis's range."""
    bounds = [(i, proto.input[i]) for i in (1, 2) if len(proto.input) > i and proto.input[i]]
    if not bounds:
        return
    reference = ctx.reference
    finite = reference[np.isfinite(reference)]
    pair = ctx.layer.pair.activation
    numbers = [(x, f"{pair.module_type} (its arguments)") for _, a in pair.args for x in _numbers(a)]
    numbers += [(x, f"{op.module_type} (its arguments)") for op in ctx.ops if op.module_type.startswith(CLAMP_OPS)
                for _, a in op.args for x in _numbers(a)]
    axis = _indexed_axis(ctx, proto.output[0], shape_of)
    for i, tensor in bounds:
        value = ctx.constant(tensor)
        if value is None or value.size != 1:
            continue
        have = float(value.reshape(-1)[0])
        guesses = list(numbers) + ([(0.0 if i == 1 else float(axis - 1), "the range of the axis the Gather reads")]
                                   if axis else [])
        if proto.output[0] == ctx.tensor and finite.size:
            guesses.append((float(finite.min() if i == 1 else finite.max()), "the range of the PyTorch output"))
        tried: set[float] = set()
        for guess, source in guesses:
            want = float(f"{guess:.6g}")
            if want not in tried and not np.isclose(want, have):
                tried.add(want)
                yield Alternative(proto.name, "min" if i == 1 else "max", have, want, source,
                                  _replacement(tensor, np.full(value.shape, want, value.dtype)))


#: ATen ops clamping to their arguments
CLAMP_OPS = ("aten.clamp", "aten.clip", "aten.hardtanh")
#: ops carrying integer indices unchanged in value to the Gather reading them
INDEX_CARRIERS = frozenset({"Squeeze", "Unsqueeze", "Expand", "Reshape", "Cast", "Identity", "Flatten"})
GATHERS = frozenset({"Gather", "GatherElements"})


def _indexed_axis(ctx, tensor: str, shape_of) -> int | None:
    """The size of the axis a Gather reads along with ``tensor``'s integers as its indices (through ops that
    carry them unchanged), when there is one such axis; None otherwise."""
    graph, sizes, stack, seen = ctx.onnx.graph, set(), [tensor], set()
    while stack:
        t = stack.pop()
        if t in seen or len(seen) > 32:
            continue
        seen.add(t)
        for c in graph.consumers.get(t, ()):
            node = graph.nodes[c]
            if node.op_type in INDEX_CARRIERS and node.inputs and node.inputs[0] == t:
                stack.extend(node.outputs)
            elif node.op_type in GATHERS and node.inputs[1:2] == (t,):
                shape = shape_of(node.inputs[0])
                axis = node.attribute("axis", 0)
                if shape and -len(shape) <= axis < len(shape) and isinstance(shape[axis], int):
                    sizes.add(shape[axis])
    return sizes.pop() if len(sizes) == 1 else None
