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
    prune(proto, dead_before)


def prune(proto: onnx.ModelProto, dead_before: set[str]) -> None:
    """Drop (in place) the nodes that became dead, other than ``dead_before`` (nodes are told apart by name:
    an unnamed one stays), then the initializers nothing reads (one also listed as a graph input stays)."""
    while True:
        dead = dead_nodes(proto) - dead_before - {""}
        if not dead:
            break
        kept = [n for n in proto.graph.node if n.name not in dead]
        proto.graph.ClearField("node")
        proto.graph.node.extend(kept)
    used = {t for n in proto.graph.node for t in n.input}
    used |= {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}
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


# --------------------------------------------------------------------------- weight layout, stale bias

#: nodes whose square weight ``transposed-weight`` transposes (a Conv's [Cout, Cin] block, group 1)
TRANSPOSE_WEIGHT_OPS = ("MatMul", "Gemm", "FusedMatMul", "FusedGemm", "Conv", "ConvTranspose", "FusedConv")
#: below this ‖W − Wᵀ‖ / ‖W‖ a weight counts as symmetric: its transpose is (nearly) a no-op
SYMMETRY_MIN = 0.1
BIAS_SHIFT = 0.5  # the stale bias: noise NOISE_REL × its scale plus a shift of BIAS_SHIFT × its scale


def with_own_constant(proto: onnx.ModelProto, node_name: str, index: int, value: np.ndarray,
                      suffix: str = "planted") -> onnx.ModelProto:
    """Copy of ``proto`` whose node ``node_name`` reads ``value`` at input ``index``: the constant is changed
    where it is (same name) when this node alone reads it, else the node gets a private copy."""
    tensor = node_by_name(proto, node_name).input[index]
    outputs = {o.name for o in proto.graph.output}
    if len(readers(proto, tensor)) == 1 and tensor not in outputs:
        return with_initializer(proto, tensor, np.asarray(value))
    return with_input_constant(proto, node_name, index, value, suffix)


def quantized_source(proto: onnx.ModelProto, node: onnx.NodeProto, k: int) -> str | None:
    """The integer initializer behind the DequantizeLinear feeding input ``k``, when that DequantizeLinear
    feeds only this node and is the only reader of its integer constant; else None."""
    dq = producer(proto, node.input[k])
    if dq is None or dq.op_type != "DequantizeLinear" or len(readers(proto, node.input[k])) != 1:
        return None
    q = constant(proto, dq.input[0])
    if q is None or q.dtype.kind not in "iu" or len(readers(proto, dq.input[0])) != 1:
        return None
    return dq.input[0]


def layout_swap(value: np.ndarray) -> np.ndarray:
    """The weight with its two leading axes swapped: a MatMul/Gemm matrix transposed, a Conv kernel's
    [Cout, Cin] block (ConvTranspose: [Cin, Cout]) transposed at every kernel position."""
    return np.ascontiguousarray(np.swapaxes(value, 0, 1))


def asymmetric(value: np.ndarray) -> bool:
    """Whether ‖W − swap(W)‖ / ‖W‖ > ``SYMMETRY_MIN`` (the swap is not a near no-op)."""
    v = value.astype(np.float64)
    norm = np.linalg.norm(v)
    return bool(norm) and np.linalg.norm(v - layout_swap(v)) / norm > SYMMETRY_MIN


def transposed_weight_sites(ctx: FileContext) -> list[Site]:
    """Square 2-D MatMul/Gemm weights, and Conv kernels with Cout = Cin (group 1), float or behind a
    DequantizeLinear, that are not (nearly) symmetric."""
    sites = []
    for n in top_nodes(ctx, TRANSPOSE_WEIGHT_OPS):
        conv = "Conv" in n.op_type
        if conv and attribute(n, "group", 1) != 1:
            continue
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if (conv or value.ndim == 2) and value.shape[0] == value.shape[1] > 1 and asymmetric(value):
                sites.append(Site(n.name, (k, src)))
    return sites


def plant_transposed_weight(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    _, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    out = with_initializer(ctx.proto, source, layout_swap(value))
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(problem)
    if not ctx.changes(out, node.output[0]):
        raise NoVariant("the transposed weight gives the same output")
    block = "[Cout, Cin] block" if "Conv" in node.op_type else "matrix"
    return Planted(out, [site.node], "weight-mismatch",
                   f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}): {block} transposed",
                   {"weight": source})


def after_matmul(proto: onnx.ModelProto, tensor: str) -> bool:
    """Whether ``tensor`` is a MatMul's output (or that output through a QuantizeLinear/DequantizeLinear pair)."""
    node = producer(proto, tensor)
    if node is not None and node.op_type == "DequantizeLinear":
        q = producer(proto, node.input[0])
        node = producer(proto, q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
    return node is not None and node.op_type in ("MatMul", "FusedMatMul")


def bias_sites(ctx: FileContext) -> list[Site]:
    """The constant bias of a Gemm (input C) or Conv (input B), and the 1-D float constant of an Add right
    after a MatMul (a Linear's bias); float, or an integer constant behind a DequantizeLinear (QDQ files)."""
    proto = ctx.proto

    def bias(n: onnx.NodeProto, k: int) -> Site | None:
        value = constant(proto, n.input[k])
        source = "float" if is_float_array(value) else quantized_source(proto, n, k) if value is None else None
        value = constant(proto, source) if source not in (None, "float") else value
        if source is None or value.size < 2 or (n.op_type == "Add" and value.ndim != 1):
            return None
        return Site(n.name, (k, source))

    sites = [bias(n, 2) for n in top_nodes(ctx, ("Gemm", "FusedGemm", "Conv", "ConvTranspose", "FusedConv"))
             if len(n.input) > 2 and n.input[2]]
    sites += [bias(n, k) for n in top_nodes(ctx, ("Add",)) for k in (0, 1) if after_matmul(proto, n.input[1 - k])]
    return [s for s in sites if s is not None]


def stale_bias(value: np.ndarray, fallback_scale: float, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """A stale-looking bias: zeroed (half the time, when it is not zero already), else Gaussian noise
    ``NOISE_REL`` × its scale plus a shift of ``BIAS_SHIFT`` × its scale (its std, or ``fallback_scale`` when it
    is constant)."""
    v = value.astype(np.float64)
    if np.any(v) and rng.random() < 0.5:
        return np.zeros_like(value), "zeroed"
    scale = float(v.std()) or float(np.abs(v).mean()) or fallback_scale
    new = v + scale * (NOISE_REL * rng.standard_normal(v.shape) + BIAS_SHIFT)
    if value.dtype.kind in "iu":
        info = np.iinfo(value.dtype)
        new = np.clip(np.round(new), info.min, info.max)
    return new.astype(value.dtype), f"noise {NOISE_REL:g}× + shift {BIAS_SHIFT:g}× its scale ({scale:.3g})"


def plant_bias_shift(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    k, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    reference = ctx.values.get(node.output[0])
    spread = float(reference.astype(np.float64).std()) if reference is not None and reference.size else 0.0
    if source == "float":  # a constant bias: a fallback scale of 0.3× the node's output spread
        value = constant(ctx.proto, node.input[k])
        new, how = stale_bias(value, 0.3 * spread or 0.1, rng)
        out = with_own_constant(ctx.proto, site.node, k, new, "stale")
        name = node.input[k]
    else:  # integer bias behind a DequantizeLinear: in its own units (fallback: 16 steps)
        value = constant(ctx.proto, source)
        new, how = stale_bias(value, 16.0, rng)
        out = with_initializer(ctx.proto, source, new)
        name = source
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(problem)
    if not ctx.changes(out, node.output[0]):
        raise NoVariant("the stale bias does not change the node's output")
    return Planted(out, [site.node], "weight-mismatch", f"{node.op_type} bias {name} {list(value.shape)} "
                   f"({value.dtype}) replaced by a stale one: {how}", {"weight": name})


# --------------------------------------------------------------------------- index arguments: slice, reduce, gather

def shape_of(ctx: FileContext, tensor: str) -> tuple[int, ...] | None:
    """Shape of a tensor of the clean file (node output, initializer or graph input), None if unknown."""
    if tensor in ctx.values:
        return ctx.values[tensor].shape
    if tensor in ctx.feeds:
        return ctx.feeds[tensor].shape
    value = constant(ctx.proto, tensor)
    return None if value is None else value.shape


def is_float_tensor(ctx: FileContext, tensor: str) -> bool:
    try:
        return np.dtype(ctx.dtype(tensor)).kind == "f"
    except KeyError:
        return False


def folded(ctx: FileContext, tensor: str) -> np.ndarray | None:
    """Value of ``tensor`` when it is a constant or computed from constants alone (an exporter's unfolded
    constant arithmetic, e.g. TorchScript's pads: ConstantOfShape, Concat, Slice, Cast), else None; a Shape
    makes it depend on the input."""
    value = constant(ctx.proto, tensor)
    if value is not None or not tensor:
        return value
    made = {o: n for n in ctx.proto.graph.node for o in n.output}
    seen, stack = set(), [tensor]
    while stack:
        t = stack.pop()
        if not t or t in seen:
            continue
        seen.add(t)
        node = made.get(t)
        if node is None:
            if constant(ctx.proto, t) is None:
                return None  # a graph input
            continue
        if node.op_type in ("Shape", "Size") or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type != "Constant":
            stack += list(node.input)
    return ctx.values.get(tensor)


def with_argument(ctx: FileContext, node_name: str, index: int, value: np.ndarray) -> onnx.ModelProto:
    """Copy of the file whose node ``node_name`` reads the constant ``value`` at input ``index`` (a private
    initializer), the constant nodes that computed the old one dropped when nothing else reads them."""
    out = with_input_constant(ctx.proto, node_name, index, value)
    prune(out, dead_nodes(ctx.proto))
    return out


def slice_args(ctx: FileContext, node: onnx.NodeProto, rank: int):
    """``(starts, ends, axes, steps)`` of a Slice as int lists (constant inputs from opset 10, attributes
    before), or None when one of them is not a constant (see :func:`folded`)."""
    if len(node.input) == 1:  # opset < 10: attributes
        starts, ends = attribute(node, "starts"), attribute(node, "ends")
        axes = attribute(node, "axes", list(range(len(starts or []))))
        return (list(starts), list(ends), [a % rank for a in axes], [1] * len(starts)) if starts and ends else None
    values = []
    for k in range(1, 5):
        if len(node.input) > k and node.input[k]:
            value = folded(ctx, node.input[k])
            if value is None:
                return None
            values.append([int(x) for x in value.reshape(-1)])
        else:
            values.append(None)
    starts, ends, axes, steps = values
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    return starts, ends, [a % rank for a in axes], steps


def window(start: int, end: int, d: int) -> tuple[int, int]:
    """The [s, e) a step-1 slice takes of an axis of size ``d``."""
    s, e = start + d if start < 0 else start, end + d if end < 0 else end
    return min(max(s, 0), d), min(max(e, 0), d)


def in_form(old: int, new: int, d: int) -> int:
    """``new`` (in [0, d]) written like ``old``: negative when ``old`` was, ``old`` kept when both mean the end."""
    if new == d and old >= d:
        return old
    return new - d if old < 0 and new < d else new


def slice_sites(ctx: FileContext) -> list[Site]:
    """Slices of a float tensor with constant starts/ends and, on an axis of size > 2 taken with step 1, a
    non-empty window (one site per such axis)."""
    sites = []
    for n in top_nodes(ctx, ("Slice",)):
        shape = shape_of(ctx, n.input[0])
        if shape is None or not is_float_tensor(ctx, n.input[0]):
            continue
        args = slice_args(ctx, n, len(shape))
        if args is None:
            continue
        for j, (start, end, axis, step) in enumerate(zip(*args)):
            d = shape[axis]
            s, e = window(start, end, d)
            if step == 1 and d > 2 and e > s:
                sites.append(Site(n.name, (j,)))
    return sites


def slice_variants(s: int, e: int, d: int) -> list[tuple[int, int]]:
    """Windows shifted by ±1 (same length) first, then one end moved (another length)."""
    same = [(s + 1, e + 1)] * (e + 1 <= d) + [(s - 1, e - 1)] * (s >= 1)
    other = [(s + 1, e)] * (e - s > 1) + [(s, e - 1)] * (e - s > 1) + [(s - 1, e)] * (s >= 1) + [(s, e + 1)] * (e < d)
    return same + other


def plant_slice_bounds(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    (j,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    shape = shape_of(ctx, node.input[0])
    starts, ends, axes, _ = slice_args(ctx, node, len(shape))
    d = shape[axes[j]]
    s, e = window(starts[j], ends[j], d)
    variants = slice_variants(s, e, d)
    same = sum(1 for a, b in variants if b - a == e - s)
    head, tail = variants[:same], variants[same:]
    rng.shuffle(head)
    rng.shuffle(tail)
    dtypes = [folded(ctx, node.input[k]).dtype for k in (1, 2)] if len(node.input) > 1 else None
    for ns, ne in head + tail:
        new_starts, new_ends = list(starts), list(ends)
        new_starts[j], new_ends[j] = in_form(starts[j], ns, d), in_form(ends[j], ne, d)
        if dtypes is None:  # opset < 10: attributes
            out = copy(ctx.proto)
            set_attr(node_by_name(out, site.node), "starts", new_starts)
            set_attr(node_by_name(out, site.node), "ends", new_ends)
        else:
            out = with_input_constant(ctx.proto, site.node, 1, np.array(new_starts, dtypes[0]))
            out = with_input_constant(out, site.node, 2, np.array(new_ends, dtypes[1]))
            prune(out, dead_nodes(ctx.proto))
        if ctx.problem(out):
            continue
        out = drop_stale_value_info(ctx, out)
        if not ctx.changes(out, node.output[0]):
            continue
        length = "same length" if ne - ns == e - s else f"length {e - s} → {ne - ns}"
        return Planted(out, [site.node], "attribute-mismatch",
                       f"Slice axis {axes[j]} (size {d}) window [{s}:{e}] → [{ns}:{ne}] ({length})")
    raise NoVariant(f"no shifted window of [{s}:{e}] (axis size {d}) runs and changes the output")


REDUCE_OPS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp")
REDUCE_TRIES = 8


def reduce_axes(ctx: FileContext, node: onnx.NodeProto) -> tuple[list[int], str] | None:
    """The constant axes of a Reduce node and where they are ('attr' or 'input'); None when it reduces every
    axis or its axes depend on the input."""
    if len(node.input) > 1 and node.input[1]:
        value = folded(ctx, node.input[1])
        return None if value is None or not value.size else ([int(x) for x in value.reshape(-1)], "input")
    axes = attribute(node, "axes")
    return (list(axes), "attr") if axes else None


def reduce_sites(ctx: FileContext) -> list[Site]:
    """Reduce nodes over constant axes of a float tensor with another axis of size > 1 to reduce over (not the
    leading one: reducing over the batch would be batch mixing)."""
    sites = []
    for n in top_nodes(ctx, REDUCE_OPS):
        shape, found = shape_of(ctx, n.input[0]), reduce_axes(ctx, n)
        if shape is None or found is None or not is_float_tensor(ctx, n.input[0]):
            continue
        axes = {a % len(shape) for a in found[0]}
        if any(shape[b] > 1 for b in range(1, len(shape)) if b not in axes):
            sites.append(Site(n.name))
    return sites


def plant_reduce_axes(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """One reduced axis replaced by another one (never the leading, batch axis): one of the same size first
    (the output keeps its shape without keepdims), then any other of size > 1 whose result still broadcasts
    downstream."""
    node = node_by_name(ctx.proto, site.node)
    shape = shape_of(ctx, node.input[0])
    old, where = reduce_axes(ctx, node)
    rank = len(shape)
    norm = [a % rank for a in old]
    same, other = [], []
    for j, a in enumerate(norm):
        for b in range(1, rank):
            if b not in norm and shape[b] > 1:
                new = list(old)
                new[j] = b - rank if old[j] < 0 else b
                (same if shape[b] == shape[a] else other).append(new)
    rng.shuffle(same)
    rng.shuffle(other)
    for new in (same + other)[:REDUCE_TRIES]:
        if where == "attr":
            out = copy(ctx.proto)
            set_attr(node_by_name(out, site.node), "axes", new)
        else:
            out = with_argument(ctx, site.node, 1, np.array(new, folded(ctx, node.input[1]).dtype))
        if ctx.problem(out):
            continue
        out = drop_stale_value_info(ctx, out)
        if not ctx.changes(out, node.output[0]):
            continue
        return Planted(out, [site.node], "attribute-mismatch",
                       f"{node.op_type} axes {old} → {new} (input {list(shape)}, keepdims "
                       f"{attribute(node, 'keepdims', 1)})")
    raise NoVariant("no other reduction axis runs and changes the output")


GATHER_MAX_INDICES = 64


def gather_sites(ctx: FileContext) -> list[Site]:
    """Gathers of a float tensor (an activation, or a table such as position embeddings) by a constant
    scalar or small index array (at most ``GATHER_MAX_INDICES``: a class token, a head, position ids), along
    an axis of size > 1."""
    sites = []
    for n in top_nodes(ctx, ("Gather",)):
        idx, shape = folded(ctx, n.input[1]), shape_of(ctx, n.input[0])
        if idx is None or idx.dtype.kind not in "iu" or not 0 < idx.size <= GATHER_MAX_INDICES:
            continue
        if not shape or not is_float_tensor(ctx, n.input[0]):
            continue
        if shape[attribute(n, "axis", 0) % len(shape)] > 1:
            sites.append(Site(n.name))
    return sites


def plant_gather_index(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    node = node_by_name(ctx.proto, site.node)
    idx = folded(ctx, node.input[1])
    shape = shape_of(ctx, node.input[0])
    d = shape[attribute(node, "axis", 0) % len(shape)]
    flat = idx.reshape(-1).astype(np.int64)
    for j in rng.permutation(flat.size)[:4]:
        old = int(flat[j])
        choices = [v for v in range(d) if v != old % d]
        v = int(rng.choice(choices))
        new = flat.copy()
        new[j] = v - d if old < 0 else v
        out = with_argument(ctx, site.node, 1, new.astype(idx.dtype).reshape(idx.shape))
        if ctx.problem(out) or not ctx.changes(out, node.output[0]):
            continue
        return Planted(out, [site.node], "attribute-mismatch",
                       f"Gather index {old} → {int(new[j])} (entry {j} of {idx.size}; axis size {d})")
    raise NoVariant("no other index runs and changes the Gather's output")


# --------------------------------------------------------------------------- padding, activation parameters

PAD_ATTR_OPS = ("Conv", "ConvTranspose", "FusedConv", "AveragePool", "MaxPool", "LpPool")


def pad_values(ctx: FileContext, node: onnx.NodeProto) -> tuple[list[int], str] | None:
    """A Pad's constant pads (input 1 from opset 11, attribute before), or the ``pads`` attribute of a
    Conv/pool with auto_pad NOTSET; None when they depend on the input, are absent or all 0."""
    if node.op_type == "Pad":
        if len(node.input) > 1 and node.input[1]:
            value = folded(ctx, node.input[1])
            found = None if value is None else ([int(x) for x in value.reshape(-1)], "input")
        else:
            pads = attribute(node, "pads")
            found = (list(pads), "attr") if pads else None
    else:
        pads = attribute(node, "pads")
        found = (list(pads), "attr") if pads and attribute(node, "auto_pad", "NOTSET") == "NOTSET" else None
    return found if found and any(found[0]) else None


def pad_sites(ctx: FileContext) -> list[Site]:
    """Pads with constant pads and Conv/pool ``pads`` attributes: one site per axis padded on some side."""
    sites = []
    for n in top_nodes(ctx, ("Pad", *PAD_ATTR_OPS)):
        found = pad_values(ctx, n)
        if found is None:
            continue
        pads, half = found[0], len(found[0]) // 2
        sites += [Site(n.name, (i,)) for i in range(half) if pads[i] + pads[i + half] > 0 and pads[i] >= 0
                  and pads[i + half] >= 0]
    return sites


def plant_pad_constant(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The padding of one axis made asymmetric, its total kept (the output keeps its shape): one pixel moved
    from one side to the other."""
    (i,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    pads, where = pad_values(ctx, node)
    half = len(pads) // 2
    moves = [m for m in (1, -1) if pads[i] - m >= 0 and pads[i + half] + m >= 0]  # m: from the start to the end
    rng.shuffle(moves)
    for m in moves:
        new = list(pads)
        new[i], new[i + half] = pads[i] - m, pads[i + half] + m
        if where == "attr":
            out = copy(ctx.proto)
            set_attr(node_by_name(out, site.node), "pads", new)
        else:
            out = with_argument(ctx, site.node, 1, np.array(new, folded(ctx, node.input[1]).dtype))
        if ctx.problem(out) or not ctx.changes(out, node.output[0]):
            continue
        return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} pads {pads} → {new} (total kept)")
    raise NoVariant("no asymmetric padding runs and changes the output")


HARD_SIGMOID_TORCH = (1 / 6, 0.5)  # PyTorch's hardsigmoid: relu6(x + 3) / 6
HARD_SIGMOID_ONNX = (0.2, 0.5)  # ONNX HardSigmoid's defaults (Keras' hard_sigmoid)
#: activation op -> (attribute, its ONNX default, the wrong value given it: a function of the old one)
ACTIVATION_PARAMS = {
    "LeakyRelu": ("alpha", 0.01, lambda a: 0.2 if abs(a - 0.2) > 1e-6 else 0.01),
    "Elu": ("alpha", 1.0, lambda a: a / 2 if a else 1.0),
    "Celu": ("alpha", 1.0, lambda a: a * 2 if a else 1.0),
    "Selu": ("alpha", 1.67326319217681884765625, lambda a: a / 2 if a else 1.0),
    "ThresholdedRelu": ("alpha", 1.0, lambda a: a / 2 if a else 1.0),
    "HardSigmoid": ("alpha", 0.2, lambda a: HARD_SIGMOID_ONNX[0] if abs(a - HARD_SIGMOID_ONNX[0]) > 1e-6
                    else HARD_SIGMOID_TORCH[0]),
}
FUSED_ACTIVATIONS = ("LeakyRelu", "HardSigmoid")  # fused activations whose activation_params change


def activation_sites(ctx: FileContext) -> list[Site]:
    """Activations with a parameter (LeakyRelu, Elu, Celu, Selu, ThresholdedRelu, HardSigmoid, and a fused
    LeakyRelu/HardSigmoid of a FusedConv/FusedGemm), HardSwish (to x·HardSigmoid with ONNX's defaults) and
    Sigmoid (to HardSigmoid with PyTorch's hardsigmoid parameters)."""
    sites = [Site(n.name, ("param",)) for n in top_nodes(ctx, tuple(ACTIVATION_PARAMS), lambda d: d in ("", "ai.onnx"))]
    sites += [Site(n.name, ("fused",)) for n in top_nodes(ctx, ("FusedConv", "FusedGemm"))
              if attribute(n, "activation") in FUSED_ACTIVATIONS]
    sites += [Site(n.name, ("hardswish",)) for n in top_nodes(ctx, ("HardSwish",))]
    sites += [Site(n.name, ("sigmoid",)) for n in top_nodes(ctx, ("Sigmoid",))]
    return sites


def plant_activation_param(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    kind = site.detail[0]
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    nodes = [site.node]
    if kind == "param":
        name, default, wrong = ACTIVATION_PARAMS[node.op_type]
        old = attribute(node, name, default)
        new = wrong(old)
        set_attr(target, name, float(new))
        change = f"{node.op_type} {name} {old:.6g} → {new:.6g}"
    elif kind == "fused":
        act = attribute(node, "activation")
        params = list(attribute(node, "activation_params", []))
        name, default, wrong = ACTIVATION_PARAMS[act]
        old = params[0] if params else default
        new_params = [float(wrong(old))] + ([float(p) for p in params[1:]] or
                                            ([HARD_SIGMOID_ONNX[1]] if act == "HardSigmoid" else []))
        set_attr(target, "activation_params", new_params)
        change = f"{node.op_type} fused {act} params {params} → {new_params}"
    elif kind == "hardswish":
        x, y = node.input[0], node.output[0]
        gate = unique_name(out, f"{y}_hardsigmoid")
        new_nodes = [helper.make_node("HardSigmoid", [x], [gate], name=unique_name(out, f"{site.node}_hardsigmoid"),
                                      alpha=HARD_SIGMOID_ONNX[0], beta=HARD_SIGMOID_ONNX[1]),
                     helper.make_node("Mul", [x, gate], [y], name=unique_name(out, f"{site.node}_mul"))]
        replace_node(out, site.node, new_nodes)
        nodes = [n.name for n in new_nodes]
        change = (f"HardSwish → x·HardSigmoid(alpha={HARD_SIGMOID_ONNX[0]:g}, beta={HARD_SIGMOID_ONNX[1]:g}) "
                  f"(ONNX's defaults, not PyTorch's 1/6)")
    else:
        target.op_type = "HardSigmoid"
        set_attr(target, "alpha", HARD_SIGMOID_TORCH[0])
        set_attr(target, "beta", HARD_SIGMOID_TORCH[1])
        change = "Sigmoid → HardSigmoid(alpha=1/6, beta=0.5) (a hard approximation swapped in)"
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(problem)
    if not ctx.changes(out, node.output[0]):
        raise NoVariant("the changed activation gives the same output")
    return Planted(out, nodes, "attribute-mismatch", change)


# --------------------------------------------------------------------------- quantization: clipping scale

QDQ_SCALE_DIVISORS = (4, 5, 6, 8)


def qdq_sites(ctx: FileContext) -> list[Site]:
    """QuantizeLinear nodes of activations (input not a constant) with a constant scale, read by a
    DequantizeLinear."""
    sites = []
    for n in top_nodes(ctx, ("QuantizeLinear",)):
        if constant(ctx.proto, n.input[0]) is not None or not is_float_array(constant(ctx.proto, n.input[1])):
            continue
        if any(r.op_type == "DequantizeLinear" for r in readers(ctx.proto, n.output[0])):
            sites.append(Site(n.name))
    return sites


def plant_qdq_scale(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The activation QuantizeLinear's scale, and its DequantizeLinears' (one private copy for the pair when
    they share it), divided by 4–8: values beyond the int8 range clip."""
    q = node_by_name(ctx.proto, site.node)
    dqs = [r for r in readers(ctx.proto, q.output[0]) if r.op_type == "DequantizeLinear"]
    divisor = int(rng.choice(QDQ_SCALE_DIVISORS))
    old = constant(ctx.proto, q.input[1])
    out = copy(ctx.proto)
    scaled = {}  # old scale tensor -> its new private copy
    for node in (q, *dqs):
        src = node.input[1]
        if src not in scaled:
            value = constant(ctx.proto, src)
            scaled[src] = unique_name(out, f"{src}_clipping")
            new = (value.astype(np.float64) / divisor).astype(value.dtype)
            out.graph.initializer.append(numpy_helper.from_array(new, scaled[src]))
        node_by_name(out, node.name).input[1] = scaled[src]
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(problem)
    if not any(ctx.changes(out, dq.output[0]) for dq in dqs):
        raise NoVariant("the smaller scale does not change the dequantized output")
    before, after = saturated(ctx, ctx.proto, q), saturated(ctx, out, q)
    if not after > before:
        raise NoVariant("the smaller scale clips nothing more")
    return Planted(out, [q.name, *(dq.name for dq in dqs)], "quantization",
                   f"QuantizeLinear scale {float(old.reshape(-1)[0]):.4g} ÷{divisor} (and its "
                   f"{len(dqs)} DequantizeLinear{'s' if len(dqs) > 1 else ''}): {after:.1%} of the values clip "
                   f"at the integer range (was {before:.1%})", {"divisor": divisor, "saturated": after})


def saturated(ctx: FileContext, proto: onnx.ModelProto, q: onnx.NodeProto) -> float:
    """Share of the QuantizeLinear's outputs at its integer type's limits (not at the zero point)."""
    value = ctx.tensor(proto, q.output[0])
    if value.dtype.kind not in "iu" or not value.size:
        return 0.0
    info = np.iinfo(value.dtype)
    zp = constant(ctx.proto, q.input[2]) if len(q.input) > 2 and q.input[2] else None
    at_limit = (value == info.min) | (value == info.max)
    if zp is not None:
        at_limit &= value != zp
    return float(at_limit.mean())


# --------------------------------------------------------------------------- concat, masks, norm axis, gemm, split

def concat_sites(ctx: FileContext) -> list[Site]:
    """Concats of float tensors with two inputs of the same shape and different values (a rotate_half's
    ``cat([-x2, x1])``, chunks put back together): one site per Concat, the swappable pairs as detail."""
    sites = []
    for n in top_nodes(ctx, ("Concat",)):
        if n.output[0] not in ctx.values or not is_float_tensor(ctx, n.output[0]):
            continue
        values = [ctx.values.get(t, constant(ctx.proto, t)) if t else None for t in n.input]
        pairs = tuple((i, j) for i in range(len(values)) for j in range(i + 1, len(values))
                      if values[i] is not None and values[j] is not None and values[i].shape == values[j].shape
                      and values[i].size and not np.array_equal(values[i], values[j], equal_nan=True))
        if pairs:
            sites.append(Site(n.name, pairs))
    return sites


def plant_concat_order(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Two same-shape inputs of the Concat swapped (the pieces put together in the wrong order)."""
    node = node_by_name(ctx.proto, site.node)
    axis = attribute(node, "axis")
    for p in rng.permutation(len(site.detail))[:4]:
        i, j = site.detail[int(p)]
        out = copy(ctx.proto)
        target = node_by_name(out, site.node)
        target.input[i], target.input[j] = node.input[j], node.input[i]
        if ctx.problem(out) or not ctx.changes(out, node.output[0]):
            continue
        shape = list(ctx.values[node.output[0]].shape)
        return Planted(out, [site.node], "attribute-mismatch",
                       f"Concat inputs {i} and {j} of {len(node.input)} swapped (axis {axis}, output {shape})")
    raise NoVariant("no swap of same-shape inputs runs and changes the Concat's output")


MASK_MIN = -1e4  # a masking constant: every entry at or below it (-1e4, -1e9, finfo.min, -inf)
MASK_WEAK = (-1.0, 0.0)  # the weak value it is given: masked positions leak into the softmax
#: ops between a mask fill (ConstantOfShape, a constant) and the Where reading it
FILL_PASS_OPS = ("Expand", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Tile")


def fill_source(ctx: FileContext, tensor: str) -> str:
    """Where a Where's branch comes from: 'constant' (a constant or a value folded from constants), 'fill' (a
    ConstantOfShape, or a constant, through Expand/Cast/Reshape/... of an input-dependent shape), else ''."""
    if folded(ctx, tensor) is not None:
        return "constant"
    node = producer(ctx.proto, tensor)
    for _ in range(8):
        if node is None:
            return ""
        if node.op_type == "ConstantOfShape":
            return "fill"
        if node.op_type not in FILL_PASS_OPS:
            return ""
        if constant(ctx.proto, node.input[0]) is not None:
            return "fill"
        node = producer(ctx.proto, node.input[0])
    return ""


def masking(value: np.ndarray | None) -> bool:
    """Whether a float value holds masking constants (entries ≤ ``MASK_MIN``, -inf included)."""
    if value is None or value.dtype.kind != "f" or not value.size:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.any(value <= MASK_MIN))


def mask_sites(ctx: FileContext) -> list[Site]:
    """The large-magnitude masking constant of a mask: a Where branch that is all ≤ -1e4 (a constant, or a
    ConstantOfShape / Expand fill) where the condition selects it; the constant (or constant-folded) mask
    an Add adds to an activation; the scalar ≤ -1e4 a Mul scales a mask by (``(1 - mask) · finfo.min``)
    where the mask is not all zero."""
    sites = []
    for n in top_nodes(ctx, ("Where",)):
        cond = ctx.values.get(n.input[0], constant(ctx.proto, n.input[0]))
        if cond is None or n.output[0] not in ctx.values:
            continue
        for k in (1, 2):
            value = ctx.values.get(n.input[k], constant(ctx.proto, n.input[k]))
            source = fill_source(ctx, n.input[k]) if masking(value) else ""
            with np.errstate(invalid="ignore"):
                full = source and bool(np.all(value <= MASK_MIN))
            if full and (cond.any() if k == 1 else not cond.all()):
                sites.append(Site(n.name, ("where", k, source)))
    for n in top_nodes(ctx, ("Add", "Mul")):
        if n.output[0] not in ctx.values or len(n.input) != 2:
            continue
        for k in (0, 1):
            value, other = folded(ctx, n.input[k]), n.input[1 - k]
            if not masking(value) or folded(ctx, other) is not None:
                continue
            if n.op_type == "Add":
                sites.append(Site(n.name, ("add", k, "constant")))
            elif value.size == 1 and np.any(ctx.values.get(other, np.zeros(1)) != 0):
                sites.append(Site(n.name, ("mul", k, "constant")))
    return sites


def plant_mask_value(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The masking constant set to -1 (else 0): the node reads a private constant (the fill it came from
    dropped when nothing else reads it); a Where branch becomes a scalar where the output keeps its shape."""
    op, k, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    if op == "where":
        value = ctx.values.get(node.input[k], constant(ctx.proto, node.input[k]))
        others = [shape_of(ctx, node.input[i]) for i in (0, 3 - k)]
        out_shape = ctx.values[node.output[0]].shape
        scalar = source == "fill" and np.broadcast_shapes(*others) == out_shape
    else:
        value = folded(ctx, node.input[k])
        scalar = False
    old = float(np.min(value))
    for weak in MASK_WEAK:
        if scalar:
            new = np.array(weak, value.dtype)
        else:
            with np.errstate(invalid="ignore"):
                new = np.where(value <= MASK_MIN, weak, value).astype(value.dtype)
        out = with_argument(ctx, site.node, k, new)
        if ctx.problem(out) or not ctx.changes(out, node.output[0]):
            continue
        what = {"where": f"Where {'X' if k == 1 else 'Y'} branch", "add": "Add mask", "mul": "Mul mask scale"}[op]
        share = "" if op != "add" else f" ({float(np.mean(value <= MASK_MIN)):.0%} of {list(value.shape)} masked)"
        via = " (a ConstantOfShape/Expand fill, now a constant)" if source == "fill" else ""
        return Planted(out, [site.node], "attribute-mismatch",
                       f"{what} masking constant {old:.4g} → {weak:g}{via}{share}", {"mask_value": old})
    raise NoVariant("a weak masking constant does not change the node's output")


NORM_AXIS_OPS = ("LayerNormalization", "SimplifiedLayerNormalization")


def optimized_changes(ctx: FileContext, proto: onnx.ModelProto) -> bool:
    """Whether some graph output of ``proto`` differs from the clean file's with ONNX Runtime's optimizations
    on (a fused kernel may ignore the changed attribute)."""
    return any(a.shape != b.shape or not np.array_equal(a, b, equal_nan=True)
               for a, b in zip(ctx.run(proto, True), ctx.run(ctx.proto, True)))


def norm_axis_sites(ctx: FileContext) -> list[Site]:
    """LayerNormalizations (and com.microsoft SimplifiedLayerNormalization) of a float input with another
    non-batch axis to start normalizing at (input rank ≥ 3)."""
    sites = []
    for n in top_nodes(ctx, NORM_AXIS_OPS):
        shape = shape_of(ctx, n.input[0])
        if shape is None or not is_float_tensor(ctx, n.input[0]):
            continue
        axis = attribute(n, "axis", -1) % len(shape)
        if any(a != axis and shape[a] > 1 for a in range(1, len(shape))):
            sites.append(Site(n.name))
    return sites


def plant_norm_axis(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The norm's ``axis`` moved to another non-batch axis (the nearest first: -1 → -2): it normalizes over
    more (or fewer) axes; the scale and bias still broadcast."""
    node = node_by_name(ctx.proto, site.node)
    shape = shape_of(ctx, node.input[0])
    rank = len(shape)
    old = attribute(node, "axis", -1)
    axis = old % rank
    options = sorted((a for a in range(1, rank) if a != axis and shape[a] > 1), key=lambda a: abs(a - axis))
    for a in options[:3]:
        new = a - rank if old < 0 else a
        out = copy(ctx.proto)
        set_attr(node_by_name(out, site.node), "axis", new)
        if ctx.problem(out) or not ctx.changes(out, node.output[0]):
            continue
        if not optimized_changes(ctx, out):
            raise NoVariant("ONNX Runtime's optimized run is unchanged (a fused kernel ignores the axis: the "
                            "SkipLayerNormalization fusion of an Add before the norm)")
        return Planted(out, [site.node], "attribute-mismatch",
                       f"{node.op_type} axis {old} → {new} (input {list(shape)}: normalizes over "
                       f"{list(shape[a:])} instead of {list(shape[axis:])})")
    raise NoVariant("no other normalization axis runs and changes the output")


GEMM_FACTORS = (0.5, 2.0)


def gemm_sites(ctx: FileContext) -> list[Site]:
    """Gemm / FusedGemm nodes: ``alpha`` always, ``beta`` where there is a C input that is not all zero."""
    sites = []
    for n in top_nodes(ctx, ("Gemm", "FusedGemm")):
        if n.output[0] not in ctx.values or not is_float_tensor(ctx, n.output[0]):
            continue
        sites.append(Site(n.name, ("alpha",)))
        if len(n.input) > 2 and n.input[2]:
            c = ctx.values.get(n.input[2], constant(ctx.proto, n.input[2]))
            if c is None or np.any(c != 0):
                sites.append(Site(n.name, ("beta",)))
    return sites


def plant_gemm_alpha(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Gemm ``alpha`` (the product's scale) or ``beta`` (C's): 1 → 0.5 or 2, another value halved."""
    (name,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    old = float(attribute(node, name, 1.0))
    new = float(rng.choice(GEMM_FACTORS)) if old == 1.0 else old / 2
    out = copy(ctx.proto)
    set_attr(node_by_name(out, site.node), name, new)
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(problem)
    if not ctx.changes(out, node.output[0]):
        raise NoVariant(f"{name} {old:g} → {new:g} does not change the output")
    return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} {name} {old:g} → {new:g}")


SPLIT_MOVES = 6  # boundary moves tried before the order variant


def split_sizes(ctx: FileContext, node: onnx.NodeProto) -> tuple[list[int], str] | None:
    """The Split's sizes and where they are: 'input' (opset ≥ 13), 'attr' (opset < 13), 'equal' (none given,
    no ``num_outputs``: equal parts, a sizes input or attribute can be added); None with ``num_outputs``
    (opset ≥ 18, left alone) or when the sizes depend on the input."""
    shape = shape_of(ctx, node.input[0])
    if shape is None:
        return None
    d = shape[attribute(node, "axis", 0) % len(shape)]
    if len(node.input) > 1 and node.input[1]:
        value = folded(ctx, node.input[1])
        return None if value is None else ([int(x) for x in value.reshape(-1)], "input")
    if attribute(node, "split"):
        return list(attribute(node, "split")), "attr"
    if attribute(node, "num_outputs") is not None or d % len(node.output):
        return None
    return [d // len(node.output)] * len(node.output), "equal"


def split_pairs(ctx: FileContext, node: onnx.NodeProto) -> tuple[list, list]:
    """(adjacent output pairs whose boundary can move, same-shape output pairs of different values)."""
    found = split_sizes(ctx, node)
    moves = [] if found is None else [(j, m) for j in range(len(found[0]) - 1) for m in (1, -1)
                                      if node.output[j] and node.output[j + 1]
                                      and found[0][j] + m >= 1 and found[0][j + 1] - m >= 1]
    values = [ctx.values.get(t) if t else None for t in node.output]
    swaps = [(i, j) for i in range(len(values)) for j in range(i + 1, len(values))
             if values[i] is not None and values[j] is not None and values[i].shape == values[j].shape
             and values[i].size and not np.array_equal(values[i], values[j], equal_nan=True)]
    return moves, swaps


def split_sites(ctx: FileContext) -> list[Site]:
    """Splits of a float tensor with a boundary to move or two same-shape outputs to exchange."""
    return [Site(n.name) for n in top_nodes(ctx, ("Split",))
            if is_float_tensor(ctx, n.input[0]) and any(split_pairs(ctx, n))]


def with_split_sizes(ctx: FileContext, node: onnx.NodeProto, sizes: list[int], where: str) -> onnx.ModelProto:
    opset = next((o.version for o in ctx.proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    if where == "input" or (where == "equal" and opset >= 13):
        value = folded(ctx, node.input[1]) if where == "input" else None
        if where == "equal":
            out = copy(ctx.proto)
            target = node_by_name(out, node.name)
            name = unique_name(out, f"{node.name}_split")
            out.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), name))
            target.input.append(name)
            return out
        return with_argument(ctx, node.name, 1, np.array(sizes, value.dtype).reshape(value.shape))
    out = copy(ctx.proto)
    set_attr(node_by_name(out, node.name), "split", sizes)
    return out


def plant_split_sizes(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A boundary between two outputs moved by one element (one output longer, the next shorter) where the
    consumers still run; else two same-shape outputs exchanged (the chunks taken in the wrong order)."""
    node = node_by_name(ctx.proto, site.node)
    moves, swaps = split_pairs(ctx, node)
    axis = attribute(node, "axis", 0)
    if moves:
        sizes, where = split_sizes(ctx, node)
        for p in rng.permutation(len(moves))[:SPLIT_MOVES]:
            j, m = moves[int(p)]
            new = list(sizes)
            new[j], new[j + 1] = sizes[j] + m, sizes[j + 1] - m
            out = with_split_sizes(ctx, node, new, where)
            if ctx.problem(out):
                continue
            out = drop_stale_value_info(ctx, out)
            if not any(ctx.changes(out, t) for t in node.output if t):
                continue
            return Planted(out, [site.node], "attribute-mismatch",
                           f"Split axis {axis} sizes {sizes} → {new} (boundary {j}|{j + 1} moved by {m:+d})",
                           {"variant": "boundary"})
    for p in rng.permutation(len(swaps))[:4]:
        i, j = swaps[int(p)]
        out = copy(ctx.proto)
        target = node_by_name(out, site.node)
        target.output[i], target.output[j] = node.output[j], node.output[i]
        if ctx.problem(out) or not ctx.changes(out, node.output[i]):
            continue
        shape = list(ctx.values[node.output[i]].shape)
        return Planted(out, [site.node], "attribute-mismatch",
                       f"Split axis {axis}: outputs {i} and {j} ({shape}) exchanged (no boundary move runs)",
                       {"variant": "order"})
    raise NoVariant("no moved boundary keeps the consumers running, and no exchange of outputs changes them")


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
    # kinds the tool was not tuned on: layouts, biases, index arguments, padding, activation parameters, QDQ
    FaultKind("transposed-weight", transposed_weight_sites, plant_transposed_weight, "weight-mismatch",
              "a square MatMul/Gemm weight, or a Conv kernel's [Cout, Cin] block (Cout = Cin), transposed"),
    FaultKind("bias-shift", bias_sites, plant_bias_shift, "weight-mismatch",
              f"a Gemm/Conv bias or a Linear's bias Add constant zeroed, or noise {NOISE_REL:g}× plus a shift "
              f"{BIAS_SHIFT:g}× its scale"),
    FaultKind("slice-bounds", slice_sites, plant_slice_bounds, "attribute-mismatch",
              "a Slice's constant window on one axis shifted by ±1 (same length where possible)"),
    FaultKind("reduce-axes", reduce_sites, plant_reduce_axes, "attribute-mismatch",
              "a Reduce node over another axis (of the same size where possible), model still runs"),
    FaultKind("activation-param", activation_sites, plant_activation_param, "attribute-mismatch",
              "LeakyRelu/Elu/Celu/Selu/ThresholdedRelu/HardSigmoid parameter changed (HardSigmoid 1/6 ↔ 0.2), "
              "HardSwish → x·HardSigmoid(0.2, 0.5), or Sigmoid → HardSigmoid(1/6, 0.5)"),
    FaultKind("gather-index", gather_sites, plant_gather_index, "attribute-mismatch",
              "one constant index of a Gather on an activation changed to another valid one"),
    FaultKind("pad-constant", pad_sites, plant_pad_constant, "attribute-mismatch",
              "a Pad's pads or a Conv/pool pads attribute made asymmetric on one axis, total kept"),
    FaultKind("qdq-scale", qdq_sites, plant_qdq_scale, "quantization",
              f"an activation QuantizeLinear's scale (and its DequantizeLinear's) ÷{QDQ_SCALE_DIVISORS[0]}–"
              f"{QDQ_SCALE_DIVISORS[-1]}: values clip at the integer range"),
    # op arguments the tool was never tested on: piece order, mask constants, norm axis, Gemm scales, splits
    FaultKind("concat-order", concat_sites, plant_concat_order, "attribute-mismatch",
              "two same-shape inputs of a float Concat swapped (rotate_half's cat([-x2, x1]) → cat([x1, -x2]))"),
    FaultKind("mask-value", mask_sites, plant_mask_value, "attribute-mismatch",
              f"a masking constant (≤ {MASK_MIN:g}, -inf, finfo.min) of a Where branch (constant or ConstantOfShape/"
              f"Expand fill), a constant mask Add or a mask-scaling Mul set to -1 (else 0): masked positions leak"),
    FaultKind("norm-axis", norm_axis_sites, plant_norm_axis, "attribute-mismatch",
              "a LayerNormalization's axis moved to another non-batch axis (-1 → -2), scale and bias broadcast"),
    FaultKind("gemm-alpha", gemm_sites, plant_gemm_alpha, "attribute-mismatch",
              "a Gemm's alpha, or beta with a non-zero C, 1 → 0.5 or 2 (another value halved)"),
    FaultKind("split-sizes", split_sites, plant_split_sizes, "attribute-mismatch",
              "a Split boundary moved by one element where the consumers still run (rare: head reshapes and gates "
              "reject it), else two same-shape outputs exchanged"),
)}

# the sixth set (op types and operands), in a module of its own; imported here, after every name it uses exists
import sweep_faults_ops  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_ops.KINDS})
# the seventh set (scripts/sweep_faults_seven.py)
import sweep_faults_seven  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_seven.KINDS})
# the eighth set (scripts/sweep_faults_eight.py)
import sweep_faults_eight  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_eight.KINDS})
# the ninth set (scripts/sweep_faults_nine.py)
import sweep_faults_nine  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_nine.KINDS})
# the tenth set (scripts/sweep_faults_ten.py)
import sweep_faults_ten  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_ten.KINDS})
# the eleventh set (scripts/sweep_faults_eleven.py)
import sweep_faults_eleven  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_eleven.KINDS})
# the twelfth set (scripts/sweep_faults_twelve.py)
import sweep_faults_twelve  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_twelve.KINDS})
# the thirteenth set (scripts/sweep_faults_thirteen.py)
import sweep_faults_thirteen  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_thirteen.KINDS})
# the fourteenth set (scripts/sweep_faults_fourteen.py)
import sweep_faults_fourteen  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_fourteen.KINDS})
# the fifteenth set (scripts/sweep_faults_fifteen.py)
import sweep_faults_fifteen  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_fifteen.KINDS})
# the sixteenth set (scripts/sweep_faults_sixteen.py)
import sweep_faults_sixteen  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_sixteen.KINDS})
# the seventeenth set (scripts/sweep_faults_seventeen.py)
import sweep_faults_seventeen  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_seventeen.KINDS})
# the eighteenth set (scripts/sweep_faults_eighteen.py)
import sweep_faults_eighteen  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_eighteen.KINDS})
# the nineteenth set (scripts/sweep_faults_nineteen.py)
import sweep_faults_nineteen  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_nineteen.KINDS})
# the twentieth set (scripts/sweep_faults_twenty.py)
import sweep_faults_twenty  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_twenty.KINDS})
# the twenty-first set (scripts/sweep_faults_twentyone.py)
import sweep_faults_twentyone  # noqa: E402

FAULTS.update({k.name: k for k in sweep_faults_twentyone.KINDS})
