"""Fault planters of the fault sweep (scripts/fault_sweep.py), and the ONNX Runtime checks they need.

A fault kind is a :class:`FaultKind`: ``candidates(ctx)`` lists the places in a
file where it can be planted (:class:`Site`), ``plant(ctx, site, rng)`` returns a
:class:`Planted` (the faulty model, the names of the planted nodes in it, the
expected cause, a description) or raises :class:`NoVariant` when no variant of
the fault works at that site (the model no longer runs, or the change is a no-op).  ``FAULTS`` maps
every kind name to its ``FaultKind``; the sweep shuffles the candidates with a
seeded generator and plants until it has the sites it wants.

The planted nodes are named as they are in the faulty file: for a changed
initializer or constant the node reading it (a shared constant is first given a
private copy, so exactly one node changes), for a weight behind a
DequantizeLinear the layer reading the dequantized weight, for a replaced
subgraph (GELU) the new nodes, for a node made to compute in float16 that node
(not the Casts around it).

Everything works on a plain ``onnx.ModelProto`` with its data loaded and never
modifies its input.  :class:`FileContext` runs a file in ONNX Runtime (graph
optimizations on or off) against the PyTorch reference outputs.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import onnx
import plant
from onnx import TensorProto, helper, numpy_helper

FLOAT_TYPES = (np.float32, np.float16)
#: nodes whose weight initializer ``weight-noise`` perturbs
WEIGHT_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "FusedConv", "FusedGemm", "FusedMatMul", "LSTM", "GRU", "RNN")
#: nodes with an ``epsilon`` attribute that ``norm-epsilon`` changes
NORM_OPS = ("LayerNormalization", "GroupNormalization", "BatchNormalization", "InstanceNormalization",
            "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization")
#: arithmetic nodes that ``node-float16`` and ``amplified`` may make compute in float16
FP16_OPS = ("MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt",
            "ReduceMean", "Erf", "Tanh", "Gelu", "Sigmoid", "Reciprocal")
NOISE_REL = 0.3
SCALE_FACTOR = 1.5
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class Site:
    """A place to plant a fault: a node (by name) and what of it to change."""

    node: str
    detail: tuple = ()


@dataclass
class Planted:
    """A planted fault: the faulty model, the planted nodes (names in it), the expected cause."""

    model: onnx.ModelProto
    nodes: list[str]
    expected: str
    description: str
    extra: dict = field(default_factory=dict)


class NoVariant(Exception):
    """Raised by a planter when no variant of its fault works at a site (the reason says why)."""


@dataclass(frozen=True)
class FaultKind:
    """A kind of fault: where it can go, how to plant it, the cause the team expects (see ``plant``'s
    ``Planted.expected`` where it depends on the site)."""

    name: str
    candidates: Callable[[FileContext], list[Site]]
    plant: Callable[[FileContext, Site, np.random.Generator], Planted]  # raises NoVariant
    expected: str
    summary: str
    max_tries: int = 200  # candidate sites tried before giving up


# --------------------------------------------------------------------------- ONNX Runtime

def ratio(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> float:
    """max |a − b| / (atol + rtol·|b|): allclose passes iff ≤ 1; a NaN or inf where the other side differs,
    or another shape, gives inf."""
    if actual.shape != expected.shape:
        return math.inf
    a, b = actual.astype(np.float64), expected.astype(np.float64)
    if not a.size:
        return 0.0
    with np.errstate(all="ignore"):
        err = np.abs(a - b) / (atol + rtol * np.abs(b))
    err = np.where(np.isnan(a) & np.isnan(b), 0.0, err)
    return float(np.where(np.isnan(err), np.inf, err).max())


def session(proto: onnx.ModelProto, optimize: bool):
    """A one-thread CPU ONNX Runtime session, graph optimizations all on or all off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def expose(proto: onnx.ModelProto, tensors) -> onnx.ModelProto:
    """Copy of ``proto`` with ``tensors`` added as graph outputs (after the real ones)."""
    out = copy(proto)
    have = {o.name for o in out.graph.output}
    for t in tensors:
        if t and t not in have:
            out.graph.output.append(helper.make_empty_tensor_value_info(t))
            have.add(t)
    return out


class FileContext:
    """One provenance file, its feeds and PyTorch's outputs, and the tolerance it is judged at."""

    def __init__(self, proto: onnx.ModelProto, inputs: tuple[np.ndarray, ...], reference: list[np.ndarray],
                 atol: float, rtol: float):
        self.proto, self.reference, self.atol, self.rtol = proto, reference, atol, rtol
        inits = {i.name for i in proto.graph.initializer}
        graph_inputs = [i for i in proto.graph.input if i.name not in inits]
        # a file with float16 inputs (onnxconverter-common, keep_io_types=False) is fed PyTorch's inputs rounded
        self.feeds = {i.name: np.asarray(x).astype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
                      for i, x in zip(graph_inputs, inputs)}

    def run(self, proto: onnx.ModelProto, optimize: bool) -> list[np.ndarray]:
        """The graph outputs of ``proto`` on the feeds."""
        return session(proto, optimize).run(None, self.feeds)

    def tensors(self, proto: onnx.ModelProto, names) -> dict[str, np.ndarray]:
        """Values of the tensors ``names`` (node outputs or graph outputs) when ``proto`` runs, optimizations off."""
        sess = session(expose(proto, names), False)
        wanted = set(names)
        outputs = [o.name for o in sess.get_outputs()]
        return {n: v for n, v in zip(outputs, sess.run(None, self.feeds)) if n in wanted}

    def output_ratio(self, proto: onnx.ModelProto, optimize: bool) -> float:
        """Worst allclose ratio of ``proto``'s outputs against PyTorch's."""
        outs = self.run(proto, optimize)
        return max(ratio(a, b, self.atol, self.rtol) for a, b in zip(outs, self.reference))

    def problem(self, proto: onnx.ModelProto) -> str:
        """Why ``proto`` is not a usable faulty file ('' when ONNX Runtime runs it, optimizations on and
        off, and its outputs keep PyTorch's shapes)."""
        for optimize in (False, True):
            try:
                outs = self.run(proto, optimize)
            except Exception as exc:  # noqa: BLE001 - any ORT failure disqualifies the variant
                return f"ONNX Runtime (optimizations {'on' if optimize else 'off'}): {str(exc).splitlines()[0][:160]}"
            shapes = [o.shape for o in outs], [r.shape for r in self.reference]
            if shapes[0] != shapes[1]:
                return f"output shapes {shapes[0]} instead of {shapes[1]}"
        return ""

    @cached_property
    def values(self) -> dict[str, np.ndarray]:
        """Every node output of the clean file (optimizations off)."""
        return self.tensors(self.proto, [o for n in self.proto.graph.node for o in n.output if o])

    def tensor(self, proto: onnx.ModelProto, name: str) -> np.ndarray:
        """Value of tensor ``name`` when ``proto`` runs (optimizations off)."""
        return self.tensors(proto, [name])[name]

    def local_ratio(self, proto: onnx.ModelProto, name: str) -> float:
        """Allclose ratio of tensor ``name`` in ``proto`` against the clean file's value of it."""
        return ratio(self.tensor(proto, name), self.values[name], self.atol, self.rtol)

    def changes(self, proto: onnx.ModelProto, name: str) -> bool:
        """Whether tensor ``name`` differs (shape or value) between ``proto`` and the clean file."""
        a, b = self.tensor(proto, name), self.values[name]
        return a.shape != b.shape or not np.array_equal(a, b, equal_nan=True)

    def dtype(self, tensor: str):
        """numpy dtype of a tensor of the clean file (initializer, Constant output, node output or input)."""
        value = constant(self.proto, tensor)
        if value is not None:
            return value.dtype
        if tensor in self.feeds:
            return self.feeds[tensor].dtype
        return self.values[tensor].dtype


# --------------------------------------------------------------------------- graph helpers

def copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    return out


def node_by_name(proto: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in proto.graph.node if n.name == name)


def producer(proto: onnx.ModelProto, tensor: str) -> onnx.NodeProto | None:
    return next((n for n in proto.graph.node if tensor in n.output), None)


def readers(proto: onnx.ModelProto, tensor: str) -> list[onnx.NodeProto]:
    return [n for n in proto.graph.node if tensor in n.input]


def constant(proto: onnx.ModelProto, tensor: str) -> np.ndarray | None:
    """Value of ``tensor`` when it is an initializer or a Constant node's output, else None."""
    for init in proto.graph.initializer:
        if init.name == tensor:
            return numpy_helper.to_array(init)
    node = producer(proto, tensor)
    if node is not None and node.op_type == "Constant":
        for a in node.attribute:
            if a.name == "value":
                return numpy_helper.to_array(a.t)
            if a.name in ("value_float", "value_int"):
                return np.array(a.f if a.name == "value_float" else a.i)
            if a.name in ("value_floats", "value_ints"):
                return np.array(list(a.floats) if a.name == "value_floats" else list(a.ints))
    return None


def attribute(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def set_attr(node: onnx.NodeProto, name: str, value) -> None:
    """Set attribute ``name`` of ``node`` in place (an existing one keeps its type)."""
    for a in node.attribute:
        if a.name == name:
            kind = {onnx.AttributeProto.FLOAT: float, onnx.AttributeProto.INT: int}.get(a.type)
            a.CopyFrom(helper.make_attribute(name, kind(value) if kind else value))
            return
    node.attribute.append(helper.make_attribute(name, value))


def with_input_constant(proto: onnx.ModelProto, node_name: str, index: int, value: np.ndarray,
                        suffix: str = "planted") -> onnx.ModelProto:
    """Copy of ``proto`` whose node ``node_name`` reads ``value`` at input ``index`` from a new initializer of
    its own (the old constant stays for any other reader)."""
    out = copy(proto)
    node = node_by_name(out, node_name)
    name = unique_name(out, f"{node.input[index] or node_name}_{suffix}")
    out.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    node.input[index] = name
    return out


def unique_name(proto: onnx.ModelProto, base: str) -> str:
    taken = {i.name for i in proto.graph.initializer} | {t for n in proto.graph.node for t in (*n.input, *n.output)}
    taken |= {n.name for n in proto.graph.node}
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def insert_nodes(proto: onnx.ModelProto, anchor: str, before: list, after: list) -> None:
    """Put ``before`` / ``after`` nodes right around node ``anchor`` (in place), copying its metadata."""
    nodes = list(proto.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == anchor)
    for n in (*before, *after):
        n.metadata_props.extend(nodes[at].metadata_props)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + before + [nodes[at]] + after + nodes[at + 1:])


def replace_node(proto: onnx.ModelProto, name: str, new: list) -> None:
    """Replace node ``name`` by ``new`` nodes in place (they take its metadata), then drop what became dead."""
    dead_before = dead_nodes(proto)
    nodes = list(proto.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == name)
    for n in new:
        n.metadata_props.extend(nodes[at].metadata_props)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at] + new + nodes[at + 1:])
    while True:
        dead = dead_nodes(proto) - dead_before
        if not dead:
            break
        kept = [n for n in proto.graph.node if n.name not in dead]
        proto.graph.ClearField("node")
        proto.graph.node.extend(kept)
    used = {t for n in proto.graph.node for t in n.input}
    used |= {o.name for o in proto.graph.output}
    kept_inits = [i for i in proto.graph.initializer if i.name in used]
    proto.graph.ClearField("initializer")
    proto.graph.initializer.extend(kept_inits)


def dead_nodes(proto: onnx.ModelProto) -> set[str]:
    """Nodes none of whose outputs is read by a node or is a graph output."""
    used = {t for n in proto.graph.node for t in n.input} | {o.name for o in proto.graph.output}
    return {n.name for n in proto.graph.node if not any(o in used for o in n.output if o)}


def top_nodes(ctx: FileContext, ops, domain_ok=lambda d: True) -> list[onnx.NodeProto]:
    return [n for n in ctx.proto.graph.node if n.op_type in ops and domain_ok(n.domain)]


def is_float_array(value) -> bool:
    return value is not None and value.dtype in FLOAT_TYPES


# --------------------------------------------------------------------------- weight-noise

def weight_input(proto: onnx.ModelProto, node: onnx.NodeProto) -> list[tuple[int, str]]:
    """``(input index, source)`` of the node's weights: a float initializer of ≥ 2 dims read by this node
    alone, or the int8 initializer behind a DequantizeLinear that only this node reads."""
    found = []
    for k, t in enumerate(node.input):
        if not t:
            continue
        value = constant(proto, t)
        if is_float_array(value) and value.ndim >= 2 and len(readers(proto, t)) == 1:
            found.append((k, t))
            continue
        dq = producer(proto, t)
        if dq is not None and dq.op_type == "DequantizeLinear" and len(readers(proto, t)) == 1:
            q = constant(proto, dq.input[0])
            if q is not None and q.ndim >= 2 and q.dtype.kind in "iu" and len(readers(proto, dq.input[0])) == 1:
                found.append((k, dq.input[0]))
    return found


def noisy(value: np.ndarray, rel: float, rng: np.random.Generator) -> np.ndarray:
    """``value`` plus Gaussian noise of ``rel`` times its std (integers: rounded and clipped to the dtype)."""
    v = value.astype(np.float64)
    out = v + rel * v.std() * rng.standard_normal(v.shape)
    if value.dtype.kind in "iu":
        info = np.iinfo(value.dtype)
        return np.clip(np.round(out), info.min, info.max).astype(value.dtype)
    return out.astype(value.dtype)


def with_initializer(proto: onnx.ModelProto, name: str, value: np.ndarray) -> onnx.ModelProto:
    """Copy of ``proto`` whose initializer (or Constant output) ``name`` holds ``value``."""
    out = copy(proto)
    for init in out.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(value, name))
            return out
    node = producer(out, name)
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
    return out


def weight_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name, (src,)) for n in top_nodes(ctx, WEIGHT_OPS) for _, src in weight_input(ctx.proto, n)]


def perturb_weight(ctx: FileContext, site: Site, rng: np.random.Generator, rel: float = NOISE_REL) -> Planted:
    (source,) = site.detail
    value = constant(ctx.proto, source)
    faulty = with_initializer(ctx.proto, source, noisy(value, rel, rng))
    return Planted(faulty, [site.node], "weight-mismatch", f"noise {rel:g}×std on {source} ({value.dtype})",
                   {"weight": source, "noise_rel": rel})


# --------------------------------------------------------------------------- attributes: softmax, transpose, where

def softmax_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("Softmax", "LogSoftmax"))
            if n.output[0] in ctx.values and ctx.values[n.output[0]].ndim >= 2]


def plant_softmax_axis(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    node = node_by_name(ctx.proto, site.node)
    shape = ctx.values[node.output[0]].shape
    axis = attribute(node, "axis", -1) % len(shape)
    others = [a for a in range(len(shape)) if a != axis and shape[a] > 1]
    if not others:
        raise NoVariant("no other axis of size > 1")
    new = int(rng.choice(others)) - len(shape)
    out = copy(ctx.proto)
    set_attr(node_by_name(out, site.node), "axis", new)
    return Planted(out, [site.node], "attribute-mismatch", f"axis {axis - len(shape)} → {new} (shape {list(shape)})")


def transpose_sites(ctx: FileContext) -> list[Site]:
    sites = []
    for n in top_nodes(ctx, ("Transpose",)):
        shape = ctx.values.get(n.output[0], np.empty(0)).shape
        pairs = [(i, j) for i in range(len(shape)) for j in range(i + 1, len(shape)) if shape[i] == shape[j] > 1]
        if pairs:
            sites.append(Site(n.name, tuple(pairs)))
    return sites


def plant_transpose_perm(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    node = node_by_name(ctx.proto, site.node)
    rank = ctx.values[node.output[0]].ndim
    perm = list(attribute(node, "perm", list(range(rank))[::-1]))
    i, j = site.detail[int(rng.integers(len(site.detail)))]
    new = perm.copy()
    new[i], new[j] = perm[j], perm[i]
    out = copy(ctx.proto)
    set_attr(node_by_name(out, site.node), "perm", new)
    return Planted(out, [site.node], "attribute-mismatch", f"perm {perm} → {new}")


def where_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("Where",))]


def plant_where_polarity(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    out = copy(ctx.proto)
    node = node_by_name(out, site.node)
    node.input[1], node.input[2] = node.input[2], node.input[1]
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(problem)
    if not ctx.changes(out, node.output[0]):
        raise NoVariant("swapping X and Y does not change the Where's output")
    return Planted(out, [site.node], "attribute-mismatch", "condition inverted (X and Y swapped)")


# --------------------------------------------------------------------------- constants: shape, scale, clip, eps

def shape_sites(ctx: FileContext) -> list[Site]:
    """Reshapes whose shape is a constant, or a Concat with constant pieces (one site per piece)."""
    sites = []
    for n in top_nodes(ctx, ("Reshape",)):
        if n.output[0] not in ctx.values:
            continue
        if constant(ctx.proto, n.input[1]) is not None:
            sites.append(Site(n.name, (n.name, 1)))
            continue
        concat = producer(ctx.proto, n.input[1])
        if concat is not None and concat.op_type == "Concat":
            sites += [Site(n.name, (concat.name, k)) for k, t in enumerate(concat.input)
                      if constant(ctx.proto, t) is not None]
    return sites


def shape_variants(shape: list[int]) -> list[list[int]]:
    """Other shape vectors of the same element count (or with a -1 to absorb): swaps, moved factors, and
    halved/doubled entries when a -1 is present."""
    out, n = [], len(shape)
    for i in range(n):
        for j in range(n):
            if i < j and shape[i] != shape[j] and shape[i] > 0 and shape[j] > 0:
                v = shape.copy()
                v[i], v[j] = shape[j], shape[i]
                out.append(v)
            for f in (2, 3, 4):
                if i != j and shape[i] > 0 and shape[j] > 1 and shape[j] % f == 0:
                    v = shape.copy()
                    v[i], v[j] = shape[i] * f, shape[j] // f
                    out.append(v)
    if -1 in shape or n == 1:
        for i in range(n):
            if shape[i] > 1:
                out += [shape[:i] + [shape[i] * 2] + shape[i + 1:]]
                if shape[i] % 2 == 0:
                    out += [shape[:i] + [shape[i] // 2] + shape[i + 1:]]
    unique = []
    for v in out:
        if v != shape and v not in unique:
            unique.append(v)
    return unique


def plant_shape_constant(ctx: FileContext, site: Site, rng: np.random.Generator, tries: int = 40) -> Planted:
    reader, index = site.detail
    reshape = node_by_name(ctx.proto, site.node)
    old = constant(ctx.proto, node_by_name(ctx.proto, reader).input[index])
    variants = shape_variants([int(x) for x in old.reshape(-1)])
    rng.shuffle(variants)
    before = ctx.values[reshape.output[0]].shape
    for v in variants[:tries]:
        faulty = with_input_constant(ctx.proto, reader, index, np.array(v, old.dtype).reshape(old.shape))
        if ctx.problem(faulty):
            continue
        faulty = drop_stale_value_info(ctx, faulty)
        if not ctx.changes(faulty, reshape.output[0]):
            continue
        after = ctx.tensor(faulty, reshape.output[0]).shape
        # a wrong constant at the size the file was made for is the op's argument, not a shape baked at export
        # for another input size (baked-shape is judged against the run's own input dims)
        expected = "attribute-mismatch"
        where = "" if reader == site.node else f" (a piece of Concat {reader})"
        change = f"shape constant {old.reshape(-1).tolist()} → {v}{where}; output {list(before)} → {list(after)}"
        return Planted(faulty, [site.node], expected, change, {"reader": reader})
    raise NoVariant(f"none of {min(len(variants), tries)} other shapes runs, keeps the outputs' shapes and "
                    "changes the Reshape's output")


def drop_stale_value_info(ctx: FileContext, proto: onnx.ModelProto) -> onnx.ModelProto:
    """Copy of ``proto`` without the ``value_info`` entries whose recorded shape the faulty graph no longer
    computes (an exporter that baked the other shape would have recorded that one)."""
    stripped = copy(proto)
    stripped.graph.ClearField("value_info")
    produced = {o for n in proto.graph.node for o in n.output}
    actual = ctx.tensors(stripped, [vi.name for vi in proto.graph.value_info if vi.name in produced])

    def fits(vi: onnx.ValueInfoProto) -> bool:
        if vi.name not in actual or not vi.type.tensor_type.HasField("shape"):
            return True
        dims = vi.type.tensor_type.shape.dim
        shape = actual[vi.name].shape
        return len(dims) == len(shape) and all(not d.HasField("dim_value") or d.dim_value == n
                                               for d, n in zip(dims, shape))

    stripped.graph.value_info.extend(vi for vi in proto.graph.value_info if fits(vi))
    return stripped


def scalar_inputs(proto: onnx.ModelProto, node: onnx.NodeProto) -> list[int]:
    """Indexes of the node's inputs that are float scalar constants other than 0."""
    out = []
    for k, t in enumerate(node.input):
        value = constant(proto, t)
        if is_float_array(value) and value.size == 1 and float(value.reshape(-1)[0]) != 0.0:
            out.append(k)
    return out


def scale_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name, (k,)) for n in top_nodes(ctx, ("Mul", "Div")) for k in scalar_inputs(ctx.proto, n)]


def plant_scale_constant(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    (k,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    old = constant(ctx.proto, node.input[k])
    faulty = with_input_constant(ctx.proto, site.node, k, (old.astype(np.float64) * SCALE_FACTOR).astype(old.dtype))
    if not ctx.changes(faulty, node.output[0]):
        raise NoVariant("scaling the constant does not change the node's output")
    return Planted(faulty, [site.node], "attribute-mismatch",
                   f"{node.op_type} scalar {float(old.reshape(-1)[0]):.6g} ×{SCALE_FACTOR:g}")


def clip_bounds(proto: onnx.ModelProto, node: onnx.NodeProto) -> tuple[float, float] | None:
    """(min, max) of a Clip (inputs or attributes) or of a fused Clip activation; None if not constant."""
    if node.op_type in ("FusedConv", "FusedGemm"):
        params = attribute(node, "activation_params")
        return tuple(params) if attribute(node, "activation") == "Clip" and params else None
    lo, hi = attribute(node, "min", -math.inf), attribute(node, "max", math.inf)
    for k, bound in ((1, "lo"), (2, "hi")):
        if len(node.input) > k and node.input[k]:
            value = constant(proto, node.input[k])
            if value is None:
                return None
            lo, hi = (float(value), hi) if bound == "lo" else (lo, float(value))
    return lo, hi


def clip_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("Clip", "FusedConv", "FusedGemm"))
            if (b := clip_bounds(ctx.proto, n)) is not None and (math.isfinite(b[0]) or math.isfinite(b[1]))]


def narrowed(lo: float, hi: float) -> tuple[float, float]:
    """The bounds with the upper one halved towards the lower one (or 0): ReLU6's (0, 6) → (0, 3); with no
    upper bound, the lower one lowered by 1."""
    if not math.isfinite(hi):
        return lo - 1.0, hi
    base = lo if math.isfinite(lo) else 0.0
    return lo, base + (hi - base) / 2


def plant_clip_bounds(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    node = node_by_name(ctx.proto, site.node)
    lo, hi = clip_bounds(ctx.proto, node)
    new = narrowed(lo, hi)
    upper = new[1] != hi  # which bound changes
    if node.op_type != "Clip":  # a fused activation
        out = copy(ctx.proto)
        set_attr(node_by_name(out, site.node), "activation_params", [float(new[0]), float(new[1])])
    elif len(node.input) > 1:  # opset >= 11: the bounds are inputs
        k = 2 if upper else 1
        out = with_input_constant(ctx.proto, site.node, k, np.array(new[k - 1], ctx.dtype(node.input[0])))
    else:
        out = copy(ctx.proto)
        set_attr(node_by_name(out, site.node), "max" if upper else "min", new[1] if upper else new[0])
    if not ctx.changes(out, node.output[0]):
        raise NoVariant("narrower bounds do not change the output (nothing is clipped)")
    return Planted(out, [site.node], "attribute-mismatch", f"bounds ({lo:g}, {hi:g}) → ({new[0]:g}, {new[1]:g})")


def epsilon_sites(ctx: FileContext) -> list[Site]:
    """Norm nodes with an epsilon attribute, and Adds of a small scalar whose output feeds a Sqrt."""
    sites = [Site(n.name, ("attr",)) for n in top_nodes(ctx, NORM_OPS)]
    for n in top_nodes(ctx, ("Add",)):
        if not any(r.op_type == "Sqrt" for r in readers(ctx.proto, n.output[0])):
            continue
        for k in scalar_inputs(ctx.proto, n):
            if 0 < float(constant(ctx.proto, n.input[k]).reshape(-1)[0]) <= 1e-3:
                sites.append(Site(n.name, ("const", k)))
    return sites


def plant_norm_epsilon(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    eps = float(np.round(rng.uniform(0.1, 1.0), 3))
    node = node_by_name(ctx.proto, site.node)
    if site.detail[0] == "attr":
        old = attribute(node, "epsilon", 1e-5)
        out = copy(ctx.proto)
        set_attr(node_by_name(out, site.node), "epsilon", eps)
    else:
        k = site.detail[1]
        value = constant(ctx.proto, node.input[k])
        old = float(value.reshape(-1)[0])
        out = with_input_constant(ctx.proto, site.node, k, np.full(value.shape, eps, value.dtype))
    return Planted(out, [site.node], "epsilon-mismatch", f"{node.op_type} epsilon {old:g} → {eps:g}")


# --------------------------------------------------------------------------- resize, gelu

RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_COORDS = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")


def resize_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("Resize",))]


def plant_resize_mode(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    node = node_by_name(ctx.proto, site.node)
    mode, coord = attribute(node, "mode", "nearest"), attribute(node, "coordinate_transformation_mode", "half_pixel")
    options = [(m, c) for m in RESIZE_MODES for c in RESIZE_COORDS if (m, c) != (mode, coord)]
    rng.shuffle(options)
    for m, c in options:
        out = copy(ctx.proto)
        target = node_by_name(out, site.node)
        set_attr(target, "mode", m)
        set_attr(target, "coordinate_transformation_mode", c)
        if not ctx.problem(out) and ctx.changes(out, node.output[0]):
            return Planted(out, [site.node], "resize-mode", f"({mode}, {coord}) → ({m}, {c})")
    raise NoVariant("no other mode / coordinate transformation runs and changes the output")


def gelu_sites(ctx: FileContext) -> list[Site]:
    """Gelu ops (ONNX or com.microsoft, FastGelu, BiasGelu) and the Erf / Tanh of decomposed GELUs."""
    sites = [Site(n.name, ("op",)) for n in top_nodes(ctx, ("Gelu", "FastGelu", "BiasGelu"))]
    sites += [Site(n.name, ("erf",)) for n in top_nodes(ctx, ("Erf",)) if plant._is_gelu_erf(ctx.proto, n)]
    sites += [Site(n.name, ("tanh", x)) for n in top_nodes(ctx, ("Tanh",))
              if (x := tanh_gelu_input(ctx.proto, n)) is not None]
    return sites


def tanh_gelu_input(proto: onnx.ModelProto, tanh: onnx.NodeProto) -> str | None:
    """``x`` of a decomposed ``tanh(sqrt(2/pi)·(x + 0.044715·x³))``, or None when the Tanh is not one."""
    scale = producer(proto, tanh.input[0])
    if scale is None or scale.op_type != "Mul":
        return None
    consts = [constant(proto, t) for t in scale.input]
    if not any(is_float_array(c) and c.size == 1 and abs(float(c.reshape(-1)[0]) - SQRT_2_OVER_PI) < 1e-3
               for c in consts):
        return None
    add = next((producer(proto, t) for t, c in zip(scale.input, consts) if c is None), None)
    if add is None or add.op_type != "Add":
        return None
    for x, other in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        if x in ancestors(proto, other, depth=4):
            return x
    return None


def ancestors(proto: onnx.ModelProto, tensor: str, depth: int) -> set[str]:
    """Tensors read by the nodes up to ``depth`` steps above ``tensor``."""
    seen, frontier = set(), [tensor]
    for _ in range(depth):
        nxt = []
        for t in frontier:
            node = producer(proto, t)
            if node is not None:
                nxt += [i for i in node.input if i and i not in seen]
                seen.update(node.input)
        frontier = nxt
    return seen


def plant_gelu_swap(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    kind = site.detail[0]
    node = node_by_name(ctx.proto, site.node)
    if kind == "erf":
        out = plant.set_gelu_tanh(ctx.proto, site.node)
        nodes = [n.name for n in out.graph.node if n.name.startswith(f"{site.node}_tanh_")]
        return Planted(out, nodes, "gelu-approximation", "Erf GELU → tanh GELU (Erf replaced by its tanh form)")
    if kind == "tanh":
        return tanh_to_erf(ctx, node, site.detail[1])
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    if node.domain in ("", "ai.onnx"):
        approx = attribute(node, "approximate", "none")
        new = "none" if approx == "tanh" else "tanh"
        set_attr(target, "approximate", new)
        return Planted(out, [site.node], "gelu-approximation", f"Gelu approximate {approx!r} → {new!r}")
    swap = {"Gelu": "FastGelu", "BiasGelu": "FastGelu", "FastGelu": "Gelu" if len(node.input) < 2 else "BiasGelu"}
    target.op_type = swap[node.op_type]
    return Planted(out, [site.node], "gelu-approximation", f"com.microsoft {node.op_type} → {target.op_type}")


def tanh_to_erf(ctx: FileContext, tanh: onnx.NodeProto, x: str) -> Planted:
    """The decomposed tanh GELU at ``tanh`` turned into the erf GELU: ``Tanh(u)`` becomes ``Erf(x/√2)``."""
    out = copy(ctx.proto)
    sqrt2 = unique_name(out, f"{tanh.name}_sqrt2")
    out.graph.initializer.append(numpy_helper.from_array(np.array(math.sqrt(2), ctx.dtype(x)), sqrt2))
    scaled = unique_name(out, f"{tanh.output[0]}_erf_in")
    new = [helper.make_node("Div", [x, sqrt2], [scaled], name=f"{tanh.name}_erf_0_Div"),
           helper.make_node("Erf", [scaled], [tanh.output[0]], name=f"{tanh.name}_erf_1_Erf")]
    replace_node(out, tanh.name, new)
    return Planted(out, [n.name for n in new], "gelu-approximation", "tanh GELU → Erf GELU (Tanh(u) → Erf(x/√2))")


# --------------------------------------------------------------------------- float16 nodes, amplified faults

def fp16_sites(ctx: FileContext) -> list[Site]:
    """ONNX-domain arithmetic nodes whose float inputs and outputs are all float32, of an op type that does
    compute in float16 when cast to it (see :meth:`FileContext.float16_op_types`)."""
    sites = []
    for n in top_nodes(ctx, FP16_OPS, lambda d: d in ("", "ai.onnx")):
        types = [ctx.dtype(t) for t in (*n.input, *n.output) if t]
        floats = [t for t in types if np.dtype(t).kind == "f"]
        if floats and all(t == np.float32 for t in floats):
            sites.append(Site(n.name))
    effective = float16_op_types(ctx, sites)
    return [s for s in sites if node_by_name(ctx.proto, s.node).op_type in effective]


def float16_op_types(ctx: FileContext, sites: list[Site]) -> set[str]:
    """Op types among ``sites`` whose first node, put in float16, changes its output.  ONNX Runtime's CPU
    provider has no float16 kernel for many ops (MatMul, Add, ...): it computes them in float32 again and
    removes the Cast pair, so the node would not compute in float16 at all."""
    first: dict[str, str] = {}
    for s in sites:
        first.setdefault(node_by_name(ctx.proto, s.node).op_type, s.node)
    effective = set()
    for op, name in first.items():
        out = in_float16(ctx, name)
        if not ctx.problem(out) and ctx.changes(out, node_by_name(ctx.proto, name).output[0]):
            effective.add(op)
    return effective


def in_float16(ctx: FileContext, name: str) -> onnx.ModelProto:
    """Copy of the file whose node ``name`` computes in float16: Casts to float16 on its float32 inputs,
    back to float32 on its outputs."""
    out = copy(ctx.proto)
    node = node_by_name(out, name)
    before, after = [], []
    for k, t in enumerate(node.input):
        if t and ctx.dtype(t) == np.float32:
            half = unique_name(out, f"{t}_fp16_{name}")
            before.append(helper.make_node("Cast", [t], [half], name=unique_name(out, f"{name}_in{k}_Cast"),
                                           to=TensorProto.FLOAT16))
            node.input[k] = half
    for k, t in enumerate(node.output):
        if t and ctx.dtype(t) == np.float32:
            half = unique_name(out, f"{t}_fp16")
            after.append(helper.make_node("Cast", [half], [t], name=unique_name(out, f"{name}_out{k}_Cast"),
                                          to=TensorProto.FLOAT))
            node.output[k] = half
    insert_nodes(out, name, before, after)
    return out


def plant_node_float16(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The node computes in float16 (Casts around it)."""
    node = node_by_name(ctx.proto, site.node)
    out = in_float16(ctx, site.node)
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(problem)
    if not ctx.changes(out, node.output[0]):
        raise NoVariant(f"{node.op_type} in float16 gives the float32 result")
    return Planted(out, [site.node], "precision", f"{node.op_type} computes in float16 (Casts around it)")


AMPLIFIED_LOCAL_MAX = 0.9
AMPLIFIED_NOISE_TARGET = 0.8
AMPLIFIED_OUTPUT_MIN = 2.0
AMPLIFIED_PROBE_REL = 1e-2


def amplified_sites(ctx: FileContext) -> list[Site]:
    """Weights (for tiny noise) and float32 arithmetic nodes (to compute in float16)."""
    noise = [Site(s.node, ("noise", *s.detail)) for s in weight_sites(ctx)]
    half = [Site(s.node, ("fp16",)) for s in fp16_sites(ctx)]
    return noise + half


def tiny_noise(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Weight noise scaled so that the node's own error is 0.8× the tolerance (local error is linear in the
    noise for MatMul/Gemm/Conv: one probe at 1e-2× the std, then the same pattern rescaled)."""
    weight_site = Site(site.node, site.detail[1:])
    out_tensor = node_by_name(ctx.proto, site.node).output[0]
    state = rng.bit_generator.state
    probe = ctx.local_ratio(perturb_weight(ctx, weight_site, rng, rel=AMPLIFIED_PROBE_REL).model, out_tensor)
    if not probe or not math.isfinite(probe):
        raise NoVariant("weight noise does not change the node's output (quantized weight?)")
    rng.bit_generator.state = state
    return perturb_weight(ctx, weight_site, rng, rel=AMPLIFIED_PROBE_REL * AMPLIFIED_NOISE_TARGET / probe)


def plant_amplified(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A fault whose own error at its node is ≤ 0.9× the tolerance but whose outputs diverge ≥ 2× the tolerance
    (optimizations on and off): tiny weight noise, or a node computing in float16."""
    variant = site.detail[0]
    planted = tiny_noise(ctx, site, rng) if variant == "noise" else plant_node_float16(ctx, site, rng)
    out_tensor = node_by_name(ctx.proto, site.node).output[0]
    local = ctx.local_ratio(planted.model, out_tensor)
    if not local <= AMPLIFIED_LOCAL_MAX:
        raise NoVariant(f"{variant}: local error above {AMPLIFIED_LOCAL_MAX:g}× tolerance")
    outputs = min(ctx.output_ratio(planted.model, opt) for opt in (False, True))
    if not outputs >= AMPLIFIED_OUTPUT_MIN:
        raise NoVariant(f"{variant}: not amplified to {AMPLIFIED_OUTPUT_MIN:g}× tolerance at the outputs")
    return Planted(planted.model, [site.node], planted.expected,
                   f"{planted.description}; local {local:.2f}× tol at {out_tensor}, outputs {outputs:.3g}× tol",
                   {**planted.extra, "local_ratio": local, "variant": variant})


# --------------------------------------------------------------------------- the table

FAULTS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("weight-noise", weight_sites, perturb_weight, "weight-mismatch",
              f"Gaussian noise {NOISE_REL:g}× the weight's std on a MatMul/Gemm/Conv/RNN weight"),
    FaultKind("softmax-axis", softmax_sites, plant_softmax_axis, "attribute-mismatch",
              "Softmax axis set to another axis of size > 1"),
    FaultKind("transpose-perm", transpose_sites, plant_transpose_perm, "attribute-mismatch",
              "two perm entries of equal-size output axes swapped"),
    FaultKind("shape-constant", shape_sites, plant_shape_constant, "attribute-mismatch",
              "a Reshape's constant shape (or constant Concat piece) changed, model still runs"),
    FaultKind("scale-constant", scale_sites, plant_scale_constant, "attribute-mismatch",
              f"a scalar constant of a Mul/Div ×{SCALE_FACTOR:g}"),
    FaultKind("gelu-swap", gelu_sites, plant_gelu_swap, "gelu-approximation",
              "erf GELU ↔ tanh GELU (decomposed, Gelu approximate, com.microsoft Gelu ↔ FastGelu)"),
    FaultKind("norm-epsilon", epsilon_sites, plant_norm_epsilon, "epsilon-mismatch",
              "a norm's epsilon attribute, or the eps constant added before a Sqrt, set to 0.1–1"),
    FaultKind("resize-mode", resize_sites, plant_resize_mode, "resize-mode",
              "Resize mode / coordinate_transformation_mode changed (to one that changes the output)"),
    FaultKind("clip-bounds", clip_sites, plant_clip_bounds, "attribute-mismatch",
              "Clip upper bound halved (ReLU6: 6 → 3), or fused Clip activation params"),
    FaultKind("where-polarity", where_sites, plant_where_polarity, "attribute-mismatch",
              "Where condition inverted (its X and Y swapped)"),
    FaultKind("node-float16", fp16_sites, plant_node_float16, "precision",
              "one float32 node computes in float16 (Casts around it)"),
    FaultKind("amplified", amplified_sites, plant_amplified, "precision / weight-mismatch",
              "a sub-tolerance fault (local ≤ 0.9× tol) that later layers amplify to ≥ 2× tol", max_tries=60),
)}
