"""The ONNX graph as every stage reads it: nodes in order, producers, consumers, module scopes."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import onnx


#: ONNX element types of half precision (float16, bfloat16)
HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
#: ONNX integer element types (sizes, indices, counts; a value cast through one loses its fractions)
INTEGER_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                           onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                           onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


@dataclass(frozen=True)
class NodeInfo:
    """One ONNX node with the module scope it was exported from (if known)."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    scope: tuple[str, ...] | None  # module path components, () = root, None = unknown
    scope_source: str  # "metadata", "name" or ""
    rewrite_rule: str = ""
    #: the node's plain attributes (ints, floats, strings and their lists) as ``(name, value)`` pairs
    attributes: tuple[tuple[str, object], ...] = field(default=(), compare=False, hash=False)

    def attribute(self, name: str, default=None):
        """The plain attribute ``name`` (``default`` when absent)."""
        return next((v for k, v in self.attributes if k == name), default)


#: ops that order rows by keys and may break ties among equal keys another way than PyTorch's sort
SORTING_OPS = frozenset({"TopK"})

def sorted_upstream(index: "GraphIndex", tensor: str) -> bool:
    """Whether ``tensor`` is computed from the output of a sorting op (:data:`SORTING_OPS`): its rows may come in
    the order that op gives equal keys."""
    frontier, seen = [tensor], set()
    while frontier:
        node = index.node_of(frontier.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type in SORTING_OPS:
            return True
        frontier.extend(t for t in node.inputs if t)
    return False


#: nodes computing with constant weights a simplifier can fold a constant factor into
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
#: nodes computing a product of their input with a weight (ONNX Runtime's fused forms included)
PRODUCT_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "FusedGemm", "FusedConv"})
#: ops that only lay one tensor out (same numbers, another shape or order)
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
#: ops that hand a tensor on unchanged in meaning (a quantizer's pair, a cast, an identity)
CARRIER_OPS = frozenset({"Identity", "Cast", "QuantizeLinear", "DequantizeLinear"})


#: ONNX Runtime's channel-blocked CPU ops (its NCHWc layout transformer)
NCHWC_DOMAIN = "com.microsoft.nchwc"


@dataclass(frozen=True)
class GraphIndex:
    """Topologically ordered nodes and the wiring between them."""

    nodes: tuple[NodeInfo, ...]
    producer: dict[str, int] = field(repr=False)  # tensor -> node index
    consumers: dict[str, tuple[int, ...]] = field(repr=False)
    graph_inputs: tuple[str, ...] = ()
    graph_outputs: tuple[str, ...] = ()
    initializers: frozenset[str] = frozenset()
    elem_types: dict[str, int] = field(default_factory=dict, repr=False)
    shapes: dict[str, tuple] = field(default_factory=dict, repr=False)
    #: float32 tensors computed from float16 data only (cast up from float16, or an op kept in float32
    #: between casts): they carry float16 rounding, and are compared at that resolution
    half_resolution: frozenset[str] = frozenset()
    #: share of the float initializers' elements in float16 (or bfloat16): a file converted to float16
    half_share: float = 0.0

    def downstream(self, tensor: str, limit: int) -> list[NodeInfo]:
        """The nodes computed from ``tensor``, nearest first, at most ``limit`` of them."""
        found, seen, frontier = [], set(), [tensor]
        while frontier and len(found) < limit:
            for i in self.consumers.get(frontier.pop(0), ()):
                if i not in seen and len(found) < limit:
                    seen.add(i)
                    found.append(self.nodes[i])
                    frontier.extend(self.nodes[i].outputs)
        return found

    def node_of(self, tensor: str) -> NodeInfo | None:
        """The node producing ``tensor``, or None for inputs and initializers."""
        i = self.producer.get(tensor)
        return None if i is None else self.nodes[i]

    def carried_from(self, tensor: str, through: frozenset[str] = frozenset({"Cast", "Identity"})) -> str:
        """``tensor`` followed up through the nodes of ``through`` that computed it (a float16 converter's Cast
        before each reader of one input): the tensor they carry."""
        node = self.node_of(tensor)
        while node is not None and node.op_type in through and node.inputs and node.inputs[0]:
            tensor = node.inputs[0]
            node = self.node_of(tensor)
        return tensor

    def blocked_layout(self, tensor: str) -> bool:
        """Whether ``tensor`` is held in a runtime's blocked memory layout (ONNX Runtime's NCHWc: an ORT_ENABLE_ALL
        file saved on CPU, between its ReorderInput and ReorderOutput): it declares the NCHW shape, but its
        memory is channel-blocked, so its numbers cannot be read against PyTorch's, nor can PyTorch's be fed in
        its place."""
        return tensor in self._blocked

    @cached_property
    def _blocked(self) -> frozenset[str]:
        """The outputs of the nchwc ops (ReorderOutput aside) and of every op computing on them: ONNX Runtime runs
        elementwise ops (a Gelu, a residual Add) on the blocked tensors as they are, until a ReorderOutput."""
        found: set[str] = set()
        for node in self.nodes:
            if node.op_type != "ReorderOutput" and (node.domain == NCHWC_DOMAIN or any(i in found for i in node.inputs)):
                found.update(o for o in node.outputs if o)
        return frozenset(found)

    @cached_property
    def input_fed(self) -> frozenset[str]:
        """The tensors computed from a graph input (the inputs themselves aside): the others are constants, or
        computed from constants alone."""
        return frozenset(reached_from(self.graph_inputs, ((n.inputs, n.outputs, False) for n in self.nodes))
                         - set(self.graph_inputs))

    @cached_property
    def output_reaching(self) -> frozenset[str]:
        """The tensors some graph output is computed from (the outputs themselves too): the others no output
        reads — a multi-output node's unused output, a branch nothing downstream consumes."""
        live = set(self.graph_outputs)
        for node in reversed(self.nodes):
            if any(o in live for o in node.outputs if o):
                live.update(i for i in node.inputs if i)
        return frozenset(live)

    def is_constant(self, tensor: str) -> bool:
        """Whether ``tensor`` is an initializer or a Constant node's output (a value no input changes)."""
        node = self.node_of(tensor)
        return tensor in self.initializers or (node is not None and node.op_type == "Constant")

    def has_constant_weights(self, node: NodeInfo) -> bool:
        """Whether ``node`` is a Conv or MatMul whose weights (second input) are constant: where a simplifier folds
        a constant factor before or after it."""
        return node.op_type in WEIGHTED_OPS and len(node.inputs) > 1 and self.is_constant(node.inputs[1])

    def weighted_readers(self, tensor: str) -> tuple[NodeInfo, ...]:
        """The nodes reading ``tensor`` when every one is a Conv or MatMul with constant weights taking it as its
        data input (a factor on ``tensor`` can be folded into them); () otherwise."""
        readers = tuple(self.nodes[c] for c in self.consumers.get(tensor, ()))
        ok = readers and all(self.has_constant_weights(n) and n.inputs[0] == tensor for n in readers)
        return readers if ok else ()

    def readers_through(self, tensor: str, through: frozenset[str], hops: int) -> list[NodeInfo]:
        """The nodes reading ``tensor``, looking through at most ``hops`` nodes of the ``through`` op types (a
        Q/DQ pair, a Transpose) to what reads their outputs."""
        found, frontier = [], [tensor]
        for level in range(hops + 1):
            nxt = []
            for t in frontier:
                for c in self.consumers.get(t, ()):
                    node = self.nodes[c]
                    (nxt.extend(o for o in node.outputs if o) if node.op_type in through and level < hops
                     else found.append(node))
            frontier = nxt
        return found

    def order_of(self, tensor: str) -> int:
        """Topological position of the producer; -1 for graph inputs/initializers."""
        return self.producer.get(tensor, -1)

    def segment(self, tensor: str, stops: frozenset[str] | set[str]) -> tuple[int, ...]:
        """Indices of the nodes computing ``tensor`` back to the ``stops`` tensors.

        The walk also stops at graph inputs and initializers.  The result is in
        topological order.
        """
        seen: set[int] = set()
        stack = [tensor]
        while stack:
            t = stack.pop()
            i = self.producer.get(t)
            if i is None or i in seen:
                continue
            seen.add(i)
            for inp in self.nodes[i].inputs:
                if inp and inp not in stops:
                    stack.append(inp)
        return tuple(sorted(seen))


def outer_inputs(node: onnx.NodeProto) -> tuple[str, ...]:
    """Outer-scope tensors read by the subgraphs of If/Loop/Scan nodes."""
    names: list[str] = []
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            defined = {i.name for i in sub.input} | {i.name for i in sub.initializer}
            for n in sub.node:
                defined.update(n.output)
            for n in sub.node:
                names.extend(i for i in list(n.input) + list(outer_inputs(n)) if i and i not in defined)
            names.extend(o.name for o in sub.output if o.name not in defined)
    return tuple(dict.fromkeys(names))


def reached_from(start, steps) -> set[str]:
    """The tensors computed from ``start`` (and ``start``): ``steps`` are ``(reads, writes, source)`` in
    topological order — a step whose reads meet what is reached, or a ``source`` (a random op), reaches its
    writes."""
    live = set(start)
    for reads, writes, source in steps:
        if source or any(r in live for r in reads):
            live.update(w for w in writes if w)
    return live


def input_free(graph: onnx.GraphProto) -> frozenset[str]:
    """The tensors of ``graph`` (top level) that no graph input reaches: computed from initializers and
    constants alone (a weight standardised in the graph, a shape built from constants).  Nodes are taken in
    file order; a node reading a tensor produced later (a graph out of order) counts it as input-fed."""
    fed = {i.name for i in graph.input} - {i.name for i in graph.initializer}
    produced = {o for n in graph.node for o in n.output if o}
    steps = ((list(n.input) + list(outer_inputs(n)), n.output, n.op_type in RANDOM_OPS) for n in graph.node)
    live = reached_from(fed, steps)
    ordered: set[str] = set()
    for n in graph.node:  # a read of a tensor not yet produced: fed as far as this walk can tell
        if any(i and i in produced and i not in ordered for i in n.input):
            live.update(o for o in n.output if o)
        ordered.update(n.output)
    return frozenset(({i.name for i in graph.initializer} | produced) - live)


#: ops whose output changes from run to run though their inputs do not
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})


def checkable_view(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy in which initializers whose data lives elsewhere are typed graph inputs.

    ``onnx.checker`` insists that external data files exist; a split-off
    initializer (see ``weights``) has none, but as a typed input it checks and
    infers exactly the same.
    """
    view = onnx.ModelProto()
    view.CopyFrom(proto)
    external = [i for i in view.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return view
    keep = [i for i in view.graph.initializer if i.data_location != onnx.TensorProto.EXTERNAL]
    declared = {i.name for i in view.graph.input}
    for init in external:
        if init.name not in declared:
            view.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    view.graph.ClearField("initializer")
    view.graph.initializer.extend(keep)
    return view
