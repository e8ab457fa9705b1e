"""Alternatives of kind and operands: what other op of its family a node of the divergent segment could have
been, or the same op on its operands in the other order.

A converter or a hand edit can pick the wrong member of a family whose members take the same inputs and give
the same shape — a Softmax for a LogSoftmax, a sum for a mean (a missing 1/N), a max pool for an average one,
a strict comparison for a non-strict one (a causal mask's diagonal), the larger for the smaller — or feed a
non-commutative op its operands the other way round (``mean - x``).  Each alternative here is such an edit; the
attribute rule keeps one only when the segment then reproduces PyTorch, so a family is tried whole.  Further:
a Conv's dilation (its padding moved with it so the shape stays), a normalization's scale and bias exchanged,
and an integer constant (a position offset, index arithmetic) one more or one less.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import onnx
from onnx import helper

from ...records import ModuleKind
from ...records.graph import CARRIER_OPS, LAYOUT_OPS
from ..context import attribute
from . import edits
from .form_alternatives import form_alternatives
from .masks import dropout_probability
from .alternative_edits import retyped, rewired, with_attributes, with_inputs
from .value_alternatives import base_name, op_numbers
from ...records.nest import informative, to_numpy

#: families of ops with the same inputs, attributes and output shape, each member tried for the others
FAMILIES = (
    ("Softmax", "LogSoftmax"),
    # strictness only: a comparison turned round (Greater for Less) is a Where's branches swapped, read as such
    ("Less", "LessOrEqual"),
    ("Greater", "GreaterOrEqual"),
    ("Min", "Max"),
    ("Floor", "Ceil", "Round"),
    ("GlobalAveragePool", "GlobalMaxPool"),
    ("ArgMax", "ArgMin"),
    ("Sin", "Cos"),  # a rotary or sinusoidal table's sin for its cos
)
#: arithmetic ops and their inverses, tried on two tensors that are not scalar constants
INVERSES = {"Add": "Sub", "Sub": "Add", "Mul": "Div", "Div": "Mul"}
#: activation families: each member with the attributes PyTorch's default module gives it
ACTIVATIONS = (
    {"Relu": {}, "LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0}, "Selu": {}, "Celu": {"alpha": 1.0},
     "Softplus": {}},
    {"Sigmoid": {}, "HardSigmoid": {"alpha": 1.0 / 6.0, "beta": 0.5}, "HardSwish": {}},
    {"Tanh": {}, "Softsign": {}},
)
#: attributes an activation may carry that another member lacks
ACTIVATION_ATTRS = ("alpha", "beta", "gamma")
#: LayerNorm and RMSNorm (ONNX Runtime's SimplifiedLayerNormalization: no mean, no bias)
NORM_KINDS = {"LayerNormalization": "SimplifiedLayerNormalization",
              "SimplifiedLayerNormalization": "LayerNormalization"}
#: reductions over the same axes tried for each other
REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
#: pooling attributes one kind has and the other lacks
POOL_ONLY = {"MaxPool": ("storage_order", "dilations"), "AveragePool": ("count_include_pad",)}
#: ops whose two operands are tried the other way round
NON_COMMUTATIVE = frozenset({"Sub", "Div"})
#: norms whose scale (input 1) and bias (input 2) are tried exchanged
AFFINE_NORMS = frozenset({"LayerNormalization", "InstanceNormalization", "GroupNormalization",
                          "BatchNormalization"})
#: ops that map a tensor to one of its shape: a node of these kinds that should not be there (an activation emitted
#: twice, a normalization applied again) is tried removed
REMOVABLE = frozenset({"Relu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Neg", "Reciprocal", "Softplus", "Softsign",
                       "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Celu", "Abs", "Erf", "Log", "Sin",
                       "Cos", "Gelu", "Mish", "ThresholdedRelu", "Softmax", "LogSoftmax", "LayerNormalization",
                       "SimplifiedLayerNormalization", "InstanceNormalization"})
#: what an Identity may stand for where a converter dropped an op it did not know: one-input ops with PyTorch's
#: default attributes (a module's own configuration is tried first, see :func:`_module_ops`)
RESTORABLE = (("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Neg", {}), ("Sqrt", {}), ("Exp", {}), ("Log", {}),
              ("Abs", {}), ("Reciprocal", {}), ("Erf", {}), ("Softplus", {}), ("Elu", {"alpha": 1.0}),
              ("LeakyRelu", {"alpha": 0.01}), ("HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5}), ("HardSwish", {}),
              ("Softmax", {"axis": -1}), ("Sin", {}), ("Cos", {}))
#: PyTorch activation modules and the ONNX op (with the module's attributes) computing them
MODULE_OPS = {"ReLU": lambda m: ("Relu", {}), "Sigmoid": lambda m: ("Sigmoid", {}), "Tanh": lambda m: ("Tanh", {}),
              "LeakyReLU": lambda m: ("LeakyRelu", {"alpha": float(m.negative_slope)}),
              "ELU": lambda m: ("Elu", {"alpha": float(m.alpha)}), "CELU": lambda m: ("Celu", {"alpha": float(m.alpha)}),
              "SELU": lambda m: ("Selu", {}), "Softplus": lambda m: ("Softplus", {}) if m.beta == 1 else None,
              "Hardsigmoid": lambda m: ("HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5}),
              "Hardswish": lambda m: ("HardSwish", {}), "Softsign": lambda m: ("Softsign", {}),
              "Softmax": lambda m: ("Softmax", {"axis": -1 if m.dim is None else int(m.dim)}),
              "LogSoftmax": lambda m: ("LogSoftmax", {"axis": -1 if m.dim is None else int(m.dim)}),
              "Mish": lambda m: ("Mish", {})}
#: same-shape tensors before an Identity tried as the operand a dropped Add read (the residual)
MAX_OPERANDS = 6
#: integer constants up to this many entries are tried one more and one less
MAX_INT_CONSTANT = 64


def kind_alternatives(ctx, proto: onnx.NodeProto, shape_of, make) -> Iterator:
    """The kind and operand alternatives of one node; ``make`` builds an Alternative (see op_alternatives)."""
    op = proto.op_type
    family = next((f for f in FAMILIES if op in f), ())
    for other in family:
        if other != op:
            yield make(proto.name, "op", op, other, "the PyTorch output", retyped(proto.name, other, {}, drop=()))
    if op in REDUCTIONS:
        yield from _reductions(ctx, proto, make)
    elif op in POOL_ONLY:
        yield from _pools(proto, make)
    elif op in NON_COMMUTATIVE and len(proto.input) == 2 and not any(_scalar(ctx, t) for t in proto.input):
        yield make(proto.name, "operands", list(proto.input), [proto.input[1], proto.input[0]], "the PyTorch output",
                   rewired(proto.name, [proto.input[1], proto.input[0]]))
    elif op == "Conv":
        yield from _dilations(proto, shape_of, make)
    elif op == "Einsum":
        yield from _einsum_equations(proto, shape_of, make)
    elif op in AFFINE_NORMS and len(proto.input) >= 3 and proto.input[2]:
        inputs = list(proto.input)
        inputs[1], inputs[2] = proto.input[2], proto.input[1]
        yield make(proto.name, "scale, bias", [proto.input[1], proto.input[2]], inputs[1:3], "the PyTorch output",
                   rewired(proto.name, inputs))
    if op in INVERSES and len(proto.input) == 2 and not any(_scalar(ctx, t) for t in proto.input):
        alt = make(proto.name, "op", op, INVERSES[op], "the PyTorch output", retyped(proto.name, INVERSES[op], {}))
        operands = proto.input[::-1] if op == "Mul" else proto.input[1:] if op == "Div" else ()
        chain = next((c for c in (_inverting_chain(ctx.onnx.graph, t) for t in operands) if c), ())
        yield dataclasses.replace(alt, shows_in=chain) if chain and alt is not None else alt
    if op in ("Add", "Sub", "Range"):
        yield from _integer_offsets(ctx, proto, make)
    if op in INVERSES and len(proto.input) == 2:
        yield from _constant_operand_removed(ctx, proto, make)
    yield from _activations(ctx, proto, make)
    if op in ("LSTM", "GRU", "RNN"):
        yield from _rnn_attributes(proto, make)
        have = attribute(proto, "direction", "forward")
        have = have.decode() if isinstance(have, bytes) else have
        if have in ("forward", "reverse"):
            want = "reverse" if have == "forward" else "forward"
            yield make(proto.name, "direction", have, want, "the PyTorch output",
                       with_attributes(proto.name, {"direction": want}))
    if op in NORM_KINDS and proto.domain in ("", "ai.onnx"):
        bias = _layer_norm_bias(ctx, proto) if op == "SimplifiedLayerNormalization" else None
        yield make(proto.name, "op", op, NORM_KINDS[op], "the PyTorch output",
                   _norm_kind(proto.name, NORM_KINDS[op], bias))
    if op == "Transpose":
        yield from _split_order(ctx, proto, make)
    yield from form_alternatives(ctx, proto, shape_of, make)
    if op == "Identity":
        yield from _restored(ctx, proto, make)
    elif op == "Sub" and len(proto.input) == 2 and _one(ctx, proto.input[0]) and proto.domain in ("", "ai.onnx"):
        # ``1 − z``: a gate read in the other convention (a GRU's update gate as (1 − z)·h + z·n, a mask read as
        # the other class's) — the complement the model does not take
        yield make(proto.name, "op", "Sub (1 − x: the complement)", "Identity (x itself)", "the PyTorch output",
                   _identity_of(proto.name, proto.input[1]))
    elif op in REMOVABLE and proto.domain in ("", "ai.onnx") and not _doubled_by_reader(ctx, proto):
        alt = _removal(proto, make)
        chain = _inverting_chain(ctx.onnx.graph, proto.input[0]) if op == "Reciprocal" and proto.input else ()
        yield dataclasses.replace(alt, shows_in=chain) if chain and alt is not None else alt


def _one(ctx, tensor: str) -> bool:
    """Whether ``tensor`` is a constant holding the number one alone."""
    value = ctx.constant(tensor)
    return value is not None and value.size == 1 and float(np.asarray(value).reshape(())) == 1.0


def _scalar(ctx, tensor: str) -> bool:
    return ctx.is_scalar(tensor)


# --------------------------------------------------------------------------- reductions, pools

def _reductions(ctx, proto, make) -> Iterator:
    """The other reductions over the same axes (the axes moved between attribute and input as the opset wants:
    ReduceSum takes them as an input from opset 13, the others from opset 18)."""
    opset = ctx.opset or 13
    as_input = len(proto.input) > 1 and bool(proto.input[1])
    axes = ctx.constant(proto.input[1]) if as_input else attribute(proto, "axes")
    if as_input and axes is None:
        return
    axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    for other in REDUCTIONS:
        if other != proto.op_type:
            wants_input = opset >= 18 or (other == "ReduceSum" and opset >= 13)
            yield make(proto.name, "op", proto.op_type, other, "the PyTorch output",
                       _reduction(proto.name, other, axes, wants_input))


def _reduction(node: str, op_type: str, axes: list[int] | None, as_input: bool):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = op_type
        kept = [a for a in target.attribute if a.name != "axes"]
        del target.attribute[:]
        target.attribute.extend(kept)
        del target.input[1:]
        if axes is not None and as_input:
            target.input.append(edits.add_initializer(model, f"{node}_axes_alternative", np.array(axes, np.int64)))
        elif axes is not None:
            target.attribute.append(helper.make_attribute("axes", axes))
        return model, weights
    return edit


def _pools(proto, make) -> Iterator:
    """An AveragePool that pads counting the padding or not; a max pool for an average one and back."""
    op = proto.op_type
    if op == "AveragePool" and any(attribute(proto, "pads") or ()):
        have = int(attribute(proto, "count_include_pad", 0))
        yield make(proto.name, "count_include_pad", have, 1 - have, "the PyTorch output",
                   with_attributes(proto.name, {"count_include_pad": 1 - have}))
    other = "AveragePool" if op == "MaxPool" else "MaxPool"
    yield make(proto.name, "op", op, other, "the PyTorch output", retyped(proto.name, other, {}, drop=POOL_ONLY[op]))


# --------------------------------------------------------------------------- Conv dilation

def _dilations(proto, shape_of, make) -> Iterator:
    """Each spatial axis at dilation 1 or 2 instead, the padding changed by the receptive field's growth
    (half each side) so the output keeps its shape."""
    kernel = shape_of(proto.input[1]) if len(proto.input) > 1 else None
    if not kernel or len(kernel) < 3 or attribute(proto, "auto_pad", "NOTSET") != "NOTSET":
        return
    rank = len(kernel) - 2
    dilations = list(attribute(proto, "dilations") or [1] * rank)
    pads = list(attribute(proto, "pads") or [0] * (2 * rank))
    for i, k in enumerate(kernel[2:]):
        if k < 2 or dilations[i] > 2:
            continue
        want = 2 if dilations[i] == 1 else 1
        grow = (k - 1) * (want - dilations[i])
        new_pads = list(pads)
        new_pads[i] += grow // 2 if grow > 0 else -((-grow) // 2)
        new_pads[i + rank] += grow - (new_pads[i] - pads[i])
        if min(new_pads) < 0:
            continue
        new = list(dilations)
        new[i] = want
        yield make(proto.name, "dilations, pads", [dilations, pads], [new, new_pads], "the PyTorch output",
                   with_attributes(proto.name, {"dilations": new, "pads": new_pads}))


#: equations tried per Einsum, at most
MAX_EQUATIONS = 24


def _einsum_equations(proto, shape_of, make) -> Iterator:
    """The Einsum's equation with two letters of one term exchanged where their sizes agree (the output keeps its
    shape): a converter or hand-written equation reading an operand's axes in the other order (``bhqd,bhkd`` for
    ``bhqd,bhdk``, a transposed output term)."""
    equation = attribute(proto, "equation", "")
    equation = equation.decode() if isinstance(equation, bytes) else equation
    if "->" not in equation or "." in equation:
        return
    left, out = equation.replace(" ", "").split("->")
    terms = left.split(",") + [out]
    sizes = {}
    for term, tensor in zip(terms, proto.input):
        shape = shape_of(tensor)
        if not shape or len(shape) != len(term):
            return
        sizes.update({letter: int(d) for letter, d in zip(term, shape) if isinstance(d, (int, np.integer))})
    tried = 0
    for k, term in enumerate(terms):
        for i in range(len(term)):
            for j in range(i + 1, len(term)):
                a, b = term[i], term[j]
                if a == b or sizes.get(a) is None or sizes.get(a) != sizes.get(b) or tried >= MAX_EQUATIONS:
                    continue
                swapped = list(term)
                swapped[i], swapped[j] = b, a
                new_terms = terms[:k] + ["".join(swapped)] + terms[k + 1:]
                want = ",".join(new_terms[:-1]) + "->" + new_terms[-1]
                tried += 1
                yield make(proto.name, "equation", equation, want, "the PyTorch output",
                           with_attributes(proto.name, {"equation": want}))


# --------------------------------------------------------------------------- integer constants

def _integer_offsets(ctx, proto, make) -> Iterator:
    """An integer constant operand (a Range's start) one more and one less, where the other operand is not a
    constant (a position offset, index arithmetic; not a folded shape)."""
    positions = [0] if proto.op_type == "Range" else [0, 1]
    for k in positions:
        if k >= len(proto.input):
            continue
        value = ctx.constant(proto.input[k])
        if value is None or value.dtype.kind not in "iu" or not 0 < value.size <= MAX_INT_CONSTANT:
            continue
        if proto.op_type != "Range" and ctx.constant(proto.input[1 - k]) is not None:
            continue
        for step in (1, -1):
            want = (value.astype(np.int64) + step).astype(value.dtype)
            yield make(proto.name, f"integer input {k}", value.reshape(-1)[:4].tolist(),
                       want.reshape(-1)[:4].tolist(), "the PyTorch output", with_inputs(proto.name, {k: want}))


# --------------------------------------------------------------------------- dropped ops

def doubled_removals(ctx, protos, make) -> Iterator:
    """The second application of an op applied twice (a node reading the output of a node of its own op type and
    domain), removed: tried before the segment's other kinds — removing it is what the doubling asks, where
    other edits may only compensate (``1/(1/r)`` undone by a Mul made a Div)."""
    graph = ctx.onnx.graph
    for proto in protos:
        if proto.op_type not in REMOVABLE or proto.domain not in ("", "ai.onnx") or not proto.input:
            continue
        before = graph.node_of(proto.input[0])
        if before is not None and before.op_type == proto.op_type:
            yield _removal(proto, make)


#: ops that keep a tensor's shape and may be applied where PyTorch applies nothing: arithmetic with a constant
#: (a normalisation applied twice), a reversal (a flip the model does not do)
EXTRA_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div"})
EXTRA_OPS = EXTRA_ARITHMETIC | {"Slice", "ReverseSequence"}


def extra_runs(ctx, protos, make) -> Iterator:
    """A run of one to three nodes of the segment that PyTorch does not apply, left out together: each computes
    from one tensor only (a Sub of a mean then a Div by a std; a Slice reversing an axis), keeps its shape and is
    read by the next alone; the last is made an Identity of the first's input.  Arithmetic runs need two nodes
    (one is the single node's readings); a reversal stands alone."""
    graph, inside = ctx.onnx.graph, {p.name for p in protos}
    for proto in protos:
        chain = _extra_run(ctx, proto, inside)
        if not chain:
            continue
        first, last = chain[0], chain[-1]
        source = _computed_input(ctx, first)
        if source is None or (len(chain) == 1 and not _reversal(ctx, first)):
            continue
        if ctx.shape_of(source) != ctx.shape_of(last.output[0]) or ctx.shape_of(source) is None:
            continue
        where = (f" on the graph input '{source}'" if source in graph.graph_inputs else "")
        have = ", ".join(_extra_what(ctx, n) for n in chain) + where
        alt = make(last.name, "op", have, "Identity (not applied: PyTorch reads the tensor as it is)",
                   "the PyTorch output", _identity_of(last.name, source))
        yield dataclasses.replace(alt, shows_in=tuple(n.name for n in chain)) if alt is not None else alt


def per_block(ctx, protos, make) -> Iterator:
    """An op applied to the blocks of a Split and concatenated back along the split axis, where PyTorch applies
    it once to the whole tensor (a chunked softmax or norm that drops the rescaling between blocks): the Concat
    made that op, with the blocks' attributes, of the Split's input."""
    graph = ctx.onnx.graph
    for concat in protos:
        if concat.op_type != "Concat" or len(concat.input) < 2:
            continue
        blocks = [ctx.node(n.name) if (n := graph.node_of(t)) is not None else None for t in concat.input]
        if any(b is None for b in blocks) or len({(b.op_type, b.domain) for b in blocks}) != 1 \
                or len({tuple(a.SerializeToString() for a in b.attribute) for b in blocks}) != 1:
            continue
        split = graph.node_of(blocks[0].input[0]) if blocks[0].input else None
        if split is None or split.op_type != "Split" or list(split.outputs) != [b.input[0] for b in blocks]:
            continue
        split_proto, shape = ctx.node(split.name), ctx.shape_of(split.inputs[0])
        if split_proto is None or shape is None or _axis_of(split_proto) % len(shape) != _axis_of(concat) % len(shape):
            continue
        op = blocks[0].op_type
        alt = make(concat.name, "op", f"{op} per block of Split {split.name} ({len(blocks)} blocks along axis "
                   f"{_axis_of(split_proto)}), concatenated", f"{op} of the whole tensor", "the PyTorch output",
                   _whole(concat.name, blocks[0], split_proto.input[0]))
        yield dataclasses.replace(alt, shows_in=(split.name, *(b.name for b in blocks))) if alt is not None else alt


def _axis_of(proto, default=0):
    return attribute(proto, "axis", default)


def _whole(node: str, block, tensor: str):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type, target.domain = block.op_type, block.domain
        del target.attribute[:]
        target.attribute.extend(block.attribute)
        del target.input[:]
        target.input.extend([tensor, *block.input[1:]])
        return model, weights
    return edit


def _extra_run(ctx, proto, inside: set) -> list:
    """The run of extra-op nodes starting at ``proto`` (at most three, each the next's only reader's input)."""
    graph, chain, node = ctx.onnx.graph, [], proto
    while node is not None and len(chain) < 3 and node.op_type in EXTRA_OPS and node.name in inside \
            and _computed_input(ctx, node) is not None:
        chain.append(node)
        readers = graph.consumers.get(node.output[0], ())
        if len(readers) != 1:
            break
        nxt = ctx.node(graph.nodes[next(iter(readers))].name)
        if nxt is None or _computed_input(ctx, nxt) != node.output[0]:
            break
        node = nxt
    # the longest run that is a candidate: arithmetic ones of two or three nodes, a reversal alone
    while len(chain) > 1 and not all(n.op_type in EXTRA_ARITHMETIC for n in chain):
        chain.pop()
    return chain


def _computed_input(ctx, proto) -> str | None:
    """The one input of ``proto`` computed from the graph's inputs (the others constants), None otherwise."""
    graph = ctx.onnx.graph
    live = [t for t in proto.input[:1 if proto.op_type in ("Slice", "ReverseSequence") else None]
            if t in graph.input_fed or t in graph.graph_inputs]
    rest = [t for t in proto.input[1:] if t] if proto.op_type in ("Slice", "ReverseSequence") else \
        [t for t in proto.input if t not in live]
    if len(live) != 1 or proto.op_type in EXTRA_ARITHMETIC and (len(rest) != 1 or ctx.constant(rest[0]) is None):
        return None
    if proto.op_type == "Slice" and any(ctx.constant(t) is None for t in rest):
        return None
    return live[0]


def _reversal(ctx, proto) -> bool:
    """Whether a Slice steps backwards along an axis (or a ReverseSequence): a flip."""
    if proto.op_type == "ReverseSequence":
        return True
    steps = ctx.constant(proto.input[4]) if proto.op_type == "Slice" and len(proto.input) > 4 and proto.input[4] \
        else None
    return steps is not None and bool(np.any(np.asarray(steps) < 0))


def _extra_what(ctx, proto) -> str:
    if proto.op_type in EXTRA_ARITHMETIC:
        other = next(t for t in proto.input if t != _computed_input(ctx, proto))
        value = np.asarray(ctx.constant(other)).reshape(-1)
        shown = ", ".join(f"{v:.4g}" for v in value[:4]) + (" …" if value.size > 4 else "")
        return f"{proto.op_type} {proto.name} of ({shown})"
    if proto.op_type == "Slice":
        axes = ctx.constant(proto.input[3]) if len(proto.input) > 3 and proto.input[3] else None
        return f"Slice {proto.name} reversing axis {', '.join(str(int(a)) for a in np.asarray(axes).reshape(-1))}" \
            if axes is not None else f"Slice {proto.name} reversing an axis"
    return f"{proto.op_type} {proto.name}"


def _constant_operand_removed(ctx, proto, make) -> Iterator:
    """An Add / Sub / Mul / Div of a computed tensor and a constant tensor (not a scalar: an epsilon, a scale
    are the value readings'; not a parameter's: a LayerNorm's gamma of ones is a weight to compare) made an
    Identity of the computed one: an op PyTorch does not apply — a causal mask added to a bidirectional
    attention's scores, a table of offsets a rewrite inserted."""
    live = _computed_input(ctx, proto)
    if live is None:
        return
    fixed = next(t for t in proto.input if t != live)
    value = ctx.constant(fixed)
    if value.size < MIN_REMOVED_CONSTANT or fixed in ctx.parameter_names and not _applied_elsewhere(ctx, proto, fixed) \
            or proto.op_type == "Mul" and dropout_probability(value) is not None:
        return  # a parameter's value is the weight readings'; a frozen Dropout mask the training-mode rule's
    also = _slot_readers(ctx, proto, fixed)
    again = f", which {also[0].name} ({also[0].op_type}) applies already" if also else ""
    yield make(proto.name, "op", f"{proto.op_type} of the constant '{fixed}'{again}",
               "Identity (the constant operand not applied)", "the PyTorch output", _identity_of(proto.name, live))


def _applied_elsewhere(ctx, proto, tensor: str) -> bool:
    """Whether a node of another op than ``proto`` reads parameter ``tensor`` too (a Gemm's or Conv's bias slot,
    a norm's scale): the parameter is applied in its own place, and ``proto`` applies it again."""
    return bool(_slot_readers(ctx, proto, tensor))


#: ops and the input positions where they apply a parameter themselves (a bias, a norm's scale and shift)
PARAMETER_SLOTS = {"Gemm": (2,), "Conv": (2,), "ConvTranspose": (2,), "LayerNormalization": (1, 2),
                   "SimplifiedLayerNormalization": (1,), "RMSNormalization": (1,), "GroupNormalization": (1, 2),
                   "InstanceNormalization": (1, 2), "BatchNormalization": (1, 2)}


def _slot_readers(ctx, proto, tensor: str) -> list:
    """The nodes other than ``proto`` that read ``tensor`` in a parameter slot of their own (a Gemm's or Conv's
    bias input, a norm's scale or shift)."""
    graph = ctx.onnx.graph
    return [n for n in (graph.nodes[c] for c in graph.consumers.get(tensor, ())) if n.name != proto.name
            and any(i < len(n.inputs) and n.inputs[i] == tensor for i in PARAMETER_SLOTS.get(n.op_type, ()))]


#: a constant operand of at least this many elements is tried left out (smaller ones are scalars' readings)
MIN_REMOVED_CONSTANT = 4


def _identity_of(node: str, tensor: str):
    def edit(model, weights):
        edits.make_identity(model, node, tensor)
        return model, weights
    return edit


def _split_order(ctx, proto, make) -> Iterator:
    """A Transpose exchanging two adjacent axes next to the Reshape that splits or merges them: the split or the
    merge in the other order ((d h) for (h d): heads split column-major).  Merged: the Transpose left out (the
    Reshape merges the axes as they come); split: the Reshape splitting the axis the other way round, the
    Transpose left out — shown in the Reshape too."""
    graph, perm = ctx.onnx.graph, attribute(proto, "perm")
    moved = [i for i, a in enumerate(perm or ()) if a != i]
    if len(moved) != 2 or moved[1] != moved[0] + 1:
        return
    readers = graph.consumers.get(proto.output[0], ())
    if readers and all(graph.nodes[r].op_type == "Reshape" for r in readers):
        yield make(proto.name, "op", "Transpose", "Identity (the axes merged in their own order)",
                   "the PyTorch output", _identity_of(proto.name, proto.input[0]))
    source = graph.node_of(proto.input[0])
    shape = ctx.constant(source.inputs[1]) if source is not None and source.op_type == "Reshape" \
        and len(source.inputs) > 1 else None
    i = moved[0]
    if shape is None or shape.ndim != 1 or len(shape) != len(perm) or 0 in (shape[i], shape[i + 1]):
        return
    swapped = shape.copy()
    swapped[i], swapped[i + 1] = shape[i + 1], shape[i]
    alt = make(source.name, "split order", [int(v) for v in shape], [int(v) for v in swapped],
               "the PyTorch output", _split_swapped(source.name, proto.name, swapped))
    yield dataclasses.replace(alt, shows_in=(proto.name,)) if alt is not None else alt


def _split_swapped(reshape: str, transpose: str, shape: np.ndarray):
    def edit(model, weights):
        target = edits.node(model, reshape)
        target.input[1] = edits.add_initializer(model, f"{reshape}_split_swapped", shape.astype(np.int64))
        _identity_of(transpose, edits.node(model, transpose).input[0])(model, weights)
        return model, weights
    return edit


def _removal(proto, make):
    """The node removed: an Identity of its first input."""
    return make(proto.name, "op", proto.op_type, "Identity (the node removed)", "the PyTorch output",
                retyped(proto.name, "Identity", {}, drop=None, inputs=1))


#: ops computing a power of their input (a reciprocal, a square root, Pow): a Mul made a Div, or a Reciprocal
#: removed, may as well undo one of them computing the wrong power (``Pow(x, -0.5)`` where a Sqrt belongs)
POWERS = frozenset({"Reciprocal", "Sqrt", "Pow"})


def _inverting_chain(graph, tensor: str) -> tuple[str, ...]:
    """The nodes computing a power that hand ``tensor`` on, each read by the next alone (at most two), nearest
    last: an inverse applied downstream equals one of them computing the inverse power."""
    chain, node = [], graph.node_of(tensor)
    while node is not None and len(chain) < 2 and node.inputs and len(graph.consumers.get(node.outputs[0], ())) == 1:
        if node.op_type in POWERS:
            source = node.inputs[0]
        elif node.op_type == "Div" and len(node.inputs) == 2 and graph.is_constant(node.inputs[0]):
            source = node.inputs[1]  # 1 / x: a reciprocal written as a division
        else:
            break
        chain.append(node.name)
        node = graph.node_of(source)
    return tuple(reversed(chain))


def _doubled_by_reader(ctx, proto) -> bool:
    """Whether a node of the same op reads this one's output: of an op applied twice, the second application is
    the one to remove (removing either gives the same numbers)."""
    graph = ctx.onnx.graph
    return any(graph.nodes[c].op_type == proto.op_type for c in graph.consumers.get(proto.output[0], ()))


def _restored(ctx, proto, make) -> Iterator:
    """What an Identity may stand for: the op of the activation module next to it (with its configuration), the
    one-input ops PyTorch models use most (default attributes), or an Add of its input and an earlier tensor of
    its shape (a residual or a branch a converter dropped) — each kept only when it reproduces PyTorch."""
    tried = set()
    opset = ctx.opset
    gelus = [("Gelu", {}), ("Gelu", {"approximate": "tanh"})] if opset >= 20 else []
    for op_type, attrs in [*_module_ops(ctx, opset), *_ran(ctx), *RESTORABLE, *gelus]:
        key = (op_type, tuple(sorted(attrs.items())))
        if key in tried:
            continue
        tried.add(key)
        yield make(proto.name, "op", "Identity", op_type if not attrs else f"{op_type} {attrs}", "the PyTorch output",
                   retyped(proto.name, op_type, attrs, drop=None))
    for other in _earlier_operands(ctx, proto):
        yield make(proto.name, "op", "Identity", f"Add with {other}", "the PyTorch output",
                   _as_add(proto.name, other))
    yield from _norms_restored(ctx, proto, make)


#: norm modules of the model tried in an Identity's place, at most (those nearest the divergent layer first)
MAX_RESTORED_NORMS = 4


def _norms_restored(ctx, proto, make) -> Iterator:
    """A norm of the model over the last axis (a LayerNorm, an RMSNorm: its weight, bias and epsilon) put in an
    Identity's place: a converter that dropped a norm it could not map, a port that forgot ``ln_f`` — the norm's
    modules near the segment first, then those whose width fits nearest the divergent layer."""
    width = (ctx.shape_of(proto.input[0]) or (None,))[-1] if proto.input else None
    if not width:
        return
    here = ctx.layer.pair.activation.index
    by_place = {a.module: abs(a.index - here) for a in ctx.baseline.capture.activations if a.module}
    near = [name for name, _ in ctx.modules_near()]
    norms = [(name, m) for name, m in ctx.torch_modules() if _last_axis_norm(m, width) is not None]
    norms.sort(key=lambda nm: (nm[0] not in near, by_place.get(nm[0], 1 << 30)))
    for name, module in norms[:MAX_RESTORED_NORMS]:
        op_type, weight, bias, eps = _last_axis_norm(module, width)
        yield make(proto.name, "op", "Identity", f"{op_type} (epsilon {eps:g}, the weight{'' if bias is None else ' and bias'}"
                   f" of {name})", "the PyTorch output",
                   _norm_put_back(proto.name, op_type, weight, bias, eps))


def _last_axis_norm(module, width: int):
    """``(op type, weight, bias, epsilon)`` of a norm module over the last axis of ``width`` channels (a LayerNorm,
    an RMSNorm by its class name), else None."""
    weight = getattr(module, "weight", None)
    if not hasattr(weight, "detach") or weight.dim() != 1 or weight.numel() != width:
        return None
    name = type(module).__name__
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if eps is None or "Norm" not in name or any(k in name for k in ("Batch", "Group", "Instance")):
        return None
    bias = getattr(module, "bias", None)
    rms = "RMS" in name.upper()
    return ("SimplifiedLayerNormalization" if rms else "LayerNormalization", to_numpy(weight).astype(np.float32),
            None if rms or not hasattr(bias, "detach") else to_numpy(bias).astype(np.float32), float(eps))


def _norm_put_back(node: str, op_type: str, weight: np.ndarray, bias: np.ndarray | None, eps: float):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type, target.domain = op_type, ""
        del target.input[1:]
        target.input.append(edits.add_initializer(model, f"{node}_restored_weight", weight))
        if bias is not None:
            target.input.append(edits.add_initializer(model, f"{node}_restored_bias", bias))
        del target.attribute[:]
        target.attribute.extend([helper.make_attribute("axis", -1), helper.make_attribute("epsilon", eps)])
        return model, weights
    return edit


#: one-input ONNX ops (default attributes) an ATen op of the same name computes (``aten.sin`` → Sin)
UNARY_OPS = ("Sin", "Cos", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Relu", "Abs", "Neg", "Reciprocal", "Erf",
             "Floor", "Ceil", "Round", "Sign", "Softplus")


def _ran(ctx) -> list[tuple[str, dict]]:
    """The one-input ops PyTorch ran around the segment (its captured ATen ops), in the order it ran them: an
    Identity most likely stands for one of them (a rotary table's ``sin``)."""
    by_name = {op.lower(): op for op in UNARY_OPS}
    names = [by_name.get(base_name(a.module_type)) for a in ctx.ops]
    return [(n, {}) for n in dict.fromkeys(n for n in names if n)]


def _module_ops(ctx, opset: int) -> list[tuple[str, dict]]:
    found = []
    for _, module in ctx.modules_near():
        name = type(module).__name__
        if opset >= 20 and name in ("GELU", "GELUActivation", "GELUTanh", "NewGELUActivation", "PytorchGELUTanh"):
            tanh = getattr(module, "approximate", "none") == "tanh" or "Tanh" in name or name.startswith("New")
            found.append(("Gelu", {"approximate": "tanh"} if tanh else {}))
            continue
        make_op = MODULE_OPS.get(name)
        op = make_op(module) if make_op is not None else None
        if op is not None:
            found.append(op)
    return found


def _earlier_operands(ctx, proto) -> list[str]:
    """Float tensors of the Identity input's shape computed before it, nearest first (the tensors paired with
    PyTorch values — module outputs, where a residual stream runs — before the others)."""
    graph = ctx.onnx.graph
    shape = ctx.shape_of(proto.input[0])
    at = graph.producer.get(proto.output[0])
    if not shape or at is None:
        return []
    paired, others = [], []
    for node in reversed(graph.nodes[:at]):
        for t in node.outputs:
            if t and t != proto.input[0] and _fits(graph.shapes.get(t), shape) and graph.elem_types.get(t) in FLOATS:
                (paired if t in ctx.cut.references else others).append(t)
    return (paired + others)[:MAX_OPERANDS]


#: earlier tensors of an input's shape tried in its place, per input of a node
MAX_REWIRED = 6
#: ... per input of a node of a segment of at most SMALL_REWIRED nodes (few nodes, few inputs: a block-sparse
#: attention gathers a dozen key blocks of one shape, the right one eight tensors back)
MAX_REWIRED_SMALL, SMALL_REWIRED = 16, 3


def rewirings(ctx, proto, make) -> Iterator:
    """Each computed float input of the node read from another tensor of its shape and type computed before the
    node (those paired with PyTorch values first, then the nearest): a graph edit, a fusion or a converter's
    aliasing bug wiring the wrong tensor (the previous block's output for this one's, a sibling branch's) —
    kept only when the segment then reproduces PyTorch.  The node's input must hold a right value (one of
    PyTorch's, more than one number) and the other a value unlike it: a value gone wrong upstream, or one
    rounded, is another fault."""
    graph = ctx.onnx.graph
    at = graph.producer.get(proto.output[0]) if proto.output and proto.output[0] else None
    if at is None:
        return
    inside = {t for n in ctx.segment_nodes for t in n.outputs}
    for i, tensor in enumerate(proto.input):
        if not tensor or graph.is_constant(tensor):
            continue
        kind = graph.elem_types.get(tensor)
        now = ctx.computed([tensor]).get(tensor) if kind in FLOATS or kind is None else None
        if kind is None and now is not None:  # a file shape inference cannot type (ONNX Runtime's fused ops)
            kind = helper.np_dtype_to_tensor_dtype(np.asarray(now).dtype) if now.dtype.kind == "f" else None
        held = _held_by(ctx, now) if kind in FLOATS and now is not None and informative(now) else None
        if held is None:
            continue
        limit = MAX_REWIRED_SMALL if len(ctx.layer.segment) <= SMALL_REWIRED else MAX_REWIRED
        others = _earlier_of(ctx, at, tuple(now.shape), kind, set(proto.input), limit)
        source = graph.node_of(tensor)
        if source is not None and source.op_type in NORM_NODES and source.inputs[0] not in others \
                and _fits(graph.shapes.get(source.inputs[0]), tuple(now.shape), unknown=True):
            # a norm's output read where its input belongs (the residual taken from the normed stream): the input
            # may lie a whole block back
            others = [source.inputs[0], *others]
        values = ctx.computed(others)
        for other in others:
            if other in values and values[other].shape == now.shape and not ctx.compare(values[other], now).ok:
                alt = make(proto.name, f"input {i}", tensor, other, "the PyTorch output",
                           _input_read(proto.name, i, other))
                copy = _repeated_block(ctx, proto, tensor, other)
                yield alt if not copy or alt is None else dataclasses.replace(
                    alt, what=f"input {i} (nodes {copy[0]} … {copy[-1]} repeat the {len(copy)} nodes computing "
                    f"'{tensor}' from '{other}', with the same weights: the block applied twice)", shows_in=copy)
        source = graph.node_of(tensor)
        if source is not None and source.op_type == "Identity" and tensor in inside:
            continue  # an op left as an Identity in the segment: the Identity's readings name it there
        if (proto.output[0] == ctx.tensor or tensor not in inside) and kind != onnx.TensorProto.BFLOAT16:
            yield from _fed_inputs(ctx, proto, i, tensor, now, held, make)


def _fed_inputs(ctx, proto, i: int, tensor: str, now: np.ndarray, held, make) -> Iterator:
    """PyTorch's values the divergent op (or module) is computed from — its inputs, then theirs — fed at the
    node's input: where no tensor tried holds the value the node should read (its producer may be gone from the
    file, and the value may lie several ops before the divergent one: an attention's values before their heads
    are repeated and reshaped for a batched product).  Not when that value is computed directly from the one the
    node reads alone (an op between them missing: another reading — directly only: in a residual network
    everything later is computed from everything earlier), nor when another kind of op computes it from the same
    input (siblings: a max pool where an average pool belongs — the op that computed the value read is wrong, not
    the wiring; a key head split read for the value one is a wiring)."""
    by_index = {a.index: a for a in (*ctx.baseline.capture.activations, *ctx.ops)}
    fed_ops = _op_inputs(ctx.layer.pair.activation, by_index, now.size, ctx.ops)
    for op in fed_ops + _unpaired(ctx, now.size, {a.index for a in fed_ops}):
        fed_value = np.asarray(op.value).reshape(now.shape).astype(now.dtype)
        if ctx.compare(now, fed_value).ok or _one_op_on(by_index, op, held) or _a_sibling(by_index, held, op.index):
            continue
        fed = f"{proto.name}_input_{i}_as_pytorch"
        moved = _norm_elsewhere(ctx, op, proto, tensor, by_index)
        alternative = make(proto.name, f"input {i}", tensor, f"PyTorch's {op.name} value" + (
            f" (the norm's node {moved} applies it to another tensor: the norm moved)" if moved else ""),
                           ctx.layer.pair.activation.name, _input_read(proto.name, i, fed), feeds={fed: fed_value})
        chain = _layout_chain(ctx.onnx.graph, tensor) + ((moved,) if moved else ())
        yield dataclasses.replace(alternative, shows_in=chain) if chain and alternative is not None else alternative
    yield from _product_before_bias(ctx, proto, i, tensor, now, make)


def _feeding_chain(graph, tensor: str) -> list:
    """The node computing ``tensor`` and the layout ops (and Casts) before it back to the first other node."""
    chain, node = [], graph.node_of(tensor)
    while node is not None and len(chain) < 8:
        chain.append(node)
        if node.op_type not in CARRIER_OPS | LAYOUT_OPS or not node.inputs:
            break
        node = graph.node_of(node.inputs[0])
    return chain


#: ONNX normalization ops a norm module is exported as (one node holding its scale)
NORM_NODES = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                        "GroupNormalization", "InstanceNormalization", "BatchNormalization", "SkipLayerNormalization",
                        "SkipSimplifiedLayerNormalization"})


def _norm_elsewhere(ctx, op, proto, tensor: str, by_index) -> str | None:
    """The node of a norm whose output ``proto`` should read (PyTorch's ``op`` is a norm module's output or op) when the
    file applies that norm — a normalization node reading exactly the module's scale — to another tensor than
    ``proto``'s input comes from: the norm moved (pre-norm written as post-norm, or back); None otherwise."""
    module = ctx.torch_module(_behind_views(op, by_index).module)  # a norm module's output or op, or a view of it
    scale = getattr(module, "weight", None) if module is not None else None
    if not hasattr(scale, "detach") or scale.dim() != 1:
        return None
    want = to_numpy(scale).astype(np.float64)
    feeding = {n.name for n in _feeding_chain(ctx.onnx.graph, tensor)}
    for node in ctx.onnx.graph.nodes:
        if node.op_type not in NORM_NODES or node.name == proto.name or len(node.inputs) < 2 or node.name in feeding:
            continue  # the norm in place (its output is what the node reads, through layout ops): not moved
        held = ctx.constant(node.inputs[1])
        if held is not None and held.size == want.size and np.allclose(np.asarray(held, np.float64).reshape(-1),
                                                                        want, rtol=1e-6, atol=0):
            return node.name
    return None


#: ATen ops that only lay a value out (a Linear's input viewed as 2-D before its addmm)
VIEW_OPS = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.clone", "aten.contiguous",
            "aten.t.", "aten.transpose", "aten.permute", "aten.unsqueeze", "aten.squeeze")


def _behind_views(op, by_index):
    """The op whose value ``op`` lays out, through at most three view-like ops (``op`` itself otherwise)."""
    for _ in range(3):
        if not op.op or not op.module_type.startswith(VIEW_OPS) or len(op.inputs) != 1 or op.inputs[0] not in by_index:
            break
        op = by_index[op.inputs[0]]
    return op


def _product_before_bias(ctx, proto, i: int, tensor: str, now: np.ndarray, make) -> Iterator:
    """The bias Add of the divergent Linear / Conv (it adds the module's bias) reading another tensor than the
    product: fed PyTorch's output less the bias (the product no op of PyTorch's holds: ``addmm`` adds the bias in
    one op) — the product's MatMul gone from the file, its Add wired to an earlier tensor."""
    activation = ctx.layer.pair.activation
    bias = activation.bias
    if proto.op_type != "Add" or bias is None or activation.op or proto.output[0] != ctx.tensor:
        return
    other = proto.input[1 - i] if len(proto.input) == 2 else None
    value = ctx.constant(other) if other else None
    if value is None or value.size != bias.size or not np.allclose(value.reshape(-1), bias.reshape(-1), rtol=1e-5,
                                                                      atol=1e-6):
        return
    product = (np.asarray(activation.value, np.float64).reshape(now.shape) - value.astype(np.float64)).astype(now.dtype)
    if ctx.compare(now, product).ok:
        return
    fed = f"{proto.name}_input_{i}_as_pytorch"
    yield make(proto.name, f"input {i}", tensor, f"PyTorch's {activation.name} product before its bias",
               activation.name, _input_read(proto.name, i, fed), feeds={fed: product})


#: layout ops walked back from a rewired input to the node that read the wrong tensor, at most
MAX_CHAIN = 4
#: ops that lay a value out without computing: a wrong tensor read before them is carried through them
CHAIN_OPS = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Identity"})


#: ops selecting part of a tensor: a wrong value in the right place may be the wrong part selected
SELECTING = frozenset({"Slice", "Gather", "Split"})


def _layout_chain(graph, tensor: str) -> tuple[str, ...]:
    """The layout nodes (Reshape, Transpose ...) that hand ``tensor`` on from the tensor they read first, nearest
    last: where a node is wired to a wrong tensor through them, the first of them read it (a head split reading
    the keys for the values, its transpose carrying them on) — or, where it is a Slice, Gather or Split, selected
    the wrong part of it (a block-sparse attention's gathered block one off)."""
    chain, node = [], graph.node_of(tensor)
    while node is not None and len(chain) < MAX_CHAIN and (node.op_type in CHAIN_OPS or node.op_type in SELECTING):
        chain.append(node.name)
        if node.op_type in SELECTING:
            break
        node = graph.node_of(node.inputs[0]) if node.inputs else None
    return tuple(reversed(chain))


#: leaf modules no tensor of the file holds, tried as a node's input, at most
MAX_UNPAIRED = 3


def _unpaired(ctx, size: int, tried: set[int]) -> list:
    """PyTorch's outputs of ``size`` elements of leaf modules that no tensor of the file holds (their computation
    gone, another tensor read in its place: a value projection pruned where its head split reads the keys), the
    nearest the divergent layer first."""
    from ...records import Status

    at = ctx.layer.pair.activation.index
    found = [r.pair.activation for r in ctx.layers if r.status is Status.UNMATCHED and r.pair.absent is None
             and r.pair.activation.is_leaf and not r.pair.activation.op and r.pair.activation.index not in tried
             and r.pair.activation.index < at
             and r.pair.activation.value.size == size and r.pair.activation.value.dtype.kind == "f"]
    return sorted(found, key=lambda a: abs(a.index - at))[:MAX_UNPAIRED]


def _one_op_on(by_index, op, held: int) -> bool:
    """Whether PyTorch's ``op`` computes from the value the node reads (``held``) and no other activation: one op
    missing between them (an activation left out, a scale by a parameter), another reading.  An op combining it
    with a value computed elsewhere (a gated MLP's ``act(gate) * up`` where the file's down projection reads ``up``,
    the gate branch gone) is a wiring: no single op restores it."""
    return held in op.inputs and not any(i != held and i in by_index for i in op.inputs)


#: ops walked back to tell siblings: two values computed from one source within this many ops
SIBLING_STEPS = 3


#: ATen ops that only lay out or select numbers: looked through to the op that computed them
LAYOUT_ATEN = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.transpose", "aten.permute",
                         "aten.expand", "aten.unsqueeze", "aten.squeeze", "aten.clone", "aten.contiguous", "aten.t",
                         "aten.slice", "aten.select", "aten.alias", "aten.flatten"})


def _op_kind(by_index, index: int) -> str:
    """The ATen op (``aten.max_pool2d_with_indices``, overload dropped) that computed activation ``index``'s numbers,
    looking through layout ops (a view of a projection is the projection's); a module's type for a module."""
    activation = by_index[index]
    for _ in range(SIBLING_STEPS + 3):
        kind = ".".join(activation.module_type.split(".")[:2])
        sources = [by_index[i] for i in activation.inputs if i in by_index]
        if kind not in LAYOUT_ATEN or len(sources) != 1:
            return kind
        activation = sources[0]
    return kind


def _a_sibling(by_index, held: int, index: int) -> bool:
    """Whether PyTorch's activation ``index`` is a sibling of ``held`` (a cut reference, -1, has none): another
    kind of op computing from the same numbers within ``SIBLING_STEPS`` ops."""
    if held < 0 or _op_kind(by_index, held) == _op_kind(by_index, index):
        return False
    return _share_a_source(by_index, _near_sources(by_index, index), _near_sources(by_index, held))


def _share_a_source(by_index, mine: set[int], theirs: set[int]) -> bool:
    """Whether two sets of PyTorch activations share one, or two hold the very same numbers (the same tensor
    unsqueezed twice for two pools)."""
    if mine & theirs:
        return True
    values = [np.asarray(by_index[i].value) for i in theirs if i in by_index]
    return any(np.asarray(by_index[i].value).shape == v.shape and np.array_equal(by_index[i].value, v)
               for i in mine if i in by_index for v in values)


def _near_sources(by_index, index: int) -> set[int]:
    """What PyTorch's activation ``index`` is computed from within ``SIBLING_STEPS`` ops (its inputs, theirs…)."""
    found, frontier = set(), [index]
    for _ in range(SIBLING_STEPS):
        frontier = [i for j in frontier if j in by_index for i in by_index[j].inputs if i not in found]
        found.update(frontier)
    return found


#: PyTorch values compared with a node's input to tell a right value in the wrong place, at most
MAX_HELD_COMPARED = 256


def _held_by(ctx, value: np.ndarray) -> int | None:
    """The index of the PyTorch op (or -1 for a cut reference) whose value the tensor holds, None when it holds
    none: a right value in the wrong place, where a node is wired to a wrong tensor — not a value gone wrong
    upstream."""
    refs = [(a.index, a.value) for a in ctx.ops] + [(-1, r) for r in ctx.cut.references.values()]
    same = [(k, np.asarray(r)) for k, r in refs if np.asarray(r).size == value.size and np.asarray(r).dtype.kind == "f"]
    found = next((k for k, r in same[:MAX_HELD_COMPARED] if ctx.compare(value, r.reshape(value.shape)).ok), None)
    return found if found is not None else _product_held(ctx, value)


def _product_held(ctx, value: np.ndarray) -> int | None:
    """The index of the Linear whose product before its bias the tensor holds (a MatMul of a MatMul + Add pair:
    PyTorch's ``addmm`` keeps no such value), or None."""
    if value.ndim == 0 or value.dtype.kind != "f":
        return None
    here = ctx.layer.pair.activation.index
    biased = sorted((a for a in ctx.baseline.capture.activations if a.bias is not None and a.value.size == value.size
                     and a.bias.size == value.shape[-1] and a.kind is ModuleKind.LINEAR),
                    key=lambda a: abs(a.index - here))  # the Linears nearest the divergent layer
    for a in biased[:MAX_PRODUCTS]:
        with_bias = value + a.bias.astype(value.dtype)
        if ctx.compare(with_bias, np.asarray(a.value).reshape(value.shape)).ok:
            return a.index
    return None


#: Linears (nearest the divergent layer first) whose product before the bias an input is compared with
MAX_PRODUCTS = 8


#: PyTorch ops walked back from the divergent op for values to feed: at most this many steps (views, expands
#: and reshapes take one each)
MAX_FED_DEPTH = 8


def _op_inputs(activation, by_index, size: int, ops=()) -> list:
    """The values of ``size`` elements PyTorch's op or module ``activation`` (the divergent one) is computed from,
    up to ``MAX_FED_DEPTH`` steps back, nearest first.  A module's output recorded with no inputs (it read an op's
    value, not another module's) is computed from what its own ops (``ops``: the narrowing's) read outside it."""
    frontier = [activation]
    if not activation.inputs and not activation.op:
        frontier = [o for o in ops if o.module == activation.module] or frontier
    found, seen = [], {activation.index, *(a.index for a in frontier)}
    for _ in range(MAX_FED_DEPTH):
        frontier = [by_index[i] for i in dict.fromkeys(i for a in frontier for i in a.inputs)
                    if i in by_index and i not in seen]
        seen.update(a.index for a in frontier)
        found += [a for a in frontier if a.value.size == size and a.value.dtype.kind == "f"]
        if len(found) >= MAX_REWIRED:
            break
    return found[:MAX_REWIRED]


#: nodes walked back from a node for tensors of its input's shape, at most
MAX_WALKED = 500


def _earlier_of(ctx, at: int, shape: tuple, kind: int, exclude: set[str], limit: int = MAX_REWIRED) -> list[str]:
    """Tensors of ``shape`` and element type ``kind`` computed by the nodes before position ``at`` (a
    topological order: none is computed from the node), nearest first: half of them paired with PyTorch values
    (module outputs), half not (a split's chunk, an op's output inside a module)."""
    graph = ctx.onnx.graph
    paired, others, half = [], [], limit // 2
    for node in reversed(graph.nodes[max(0, at - MAX_WALKED):at]):
        for t in node.outputs:
            if t and t not in exclude and graph.elem_types.get(t, kind) == kind \
                    and _fits(graph.shapes.get(t), shape, unknown=t not in graph.elem_types):
                (paired if t in ctx.cut.references else others).append(t)
        if len(paired) >= half and len(others) >= half:
            break
    return paired[:max(half, limit - len(others))] + others[:max(half, limit - len(paired))]


def _fits(known: tuple | None, shape: tuple, unknown: bool = False) -> bool:
    """Whether a file's shape (a dimension it leaves symbolic: None) can be ``shape``; a tensor shape inference
    could not reach (``unknown``: no shape at all) can be any (its computed value decides)."""
    if known is None:
        return unknown
    return len(known) == len(shape) and all(k is None or k == d for k, d in zip(known, shape))


#: nodes a block applied twice may hold, at most (a copy longer than a segment names nothing)
MAX_REPEATED = 12


def repeated_blocks(ctx, protos, make) -> Iterator:
    """A block applied twice, removed: a node of the segment that starts a copy of the block computing the tensor
    it reads (:func:`_repeated_block`: an earlier twin of its op, attributes and weights reads the block's input)
    — the copy's last node's readers made to read the block's own output, so the block runs once.  Where the
    divergent tensor lies past the copy (a norm after it); a tensor inside the copy is the rewiring's."""
    graph = ctx.onnx.graph
    by_name = {n.name: n for n in graph.nodes}
    for proto in protos:
        node = by_name.get(proto.name)
        if node is None:
            continue
        for tensor in dict.fromkeys(t for t in proto.input if t and not graph.is_constant(t)):
            end = graph.node_of(tensor)
            twins = [] if end is None else [n for n in graph.nodes[max(0, end.index - MAX_WALKED):end.index + 1]
                                             if n.name != node.name and _signature(ctx, n) == _signature(ctx, node)]
            for twin in twins[-2:]:
                other = next((t for t in twin.inputs if t and not graph.is_constant(t)), None)
                copy = _repeated_block(ctx, proto, tensor, other) if other else ()
                last = by_name[copy[-1]] if copy else None
                inside = {t for name in copy for t in by_name[name].outputs} - set(last.outputs[:1] if last else ())
                if not copy or ctx.tensor in inside:
                    continue  # the divergent tensor computed inside the copy: the rewiring names it
                yield dataclasses.replace(make(
                    proto.name, "op", f"nodes {copy[0]} … {copy[-1]} (a copy of the {len(copy)} nodes computing "
                    f"'{tensor}' from '{other}', with the same weights, run again on its output)",
                    "the block applied once (the copy left out)", "the PyTorch output",
                    _identity_of(last.name, tensor)), shows_in=copy)
                break


def _repeated_block(ctx, proto, tensor: str, other: str) -> tuple[str, ...]:
    """The nodes of a block applied again, when ``proto`` (reading ``tensor``, where PyTorch's value implies
    ``other``) starts a copy of the nodes computing ``tensor`` from ``other``: an earlier node of its op, attributes
    and constant inputs reads ``other``, and each node from it to ``tensor``'s producer has such a twin among the
    nodes computed from ``proto`` — the copy's nodes in graph order, or () (an unrolled loop one step too many, a
    block repeated by a graph edit)."""
    graph = ctx.onnx.graph
    node = graph.node_of(proto.output[0]) if proto.output else None
    end = graph.node_of(tensor)
    if node is None or end is None:
        return ()
    twin = next((graph.nodes[c] for c in graph.consumers.get(other, ())
                 if graph.nodes[c].index < node.index and _signature(ctx, graph.nodes[c]) == _signature(ctx, node)),
                None)
    if twin is None or twin.index > end.index:
        return ()
    block = _between(graph, twin, end)
    if not 2 <= len(block) <= MAX_REPEATED or not any(_signature(ctx, n)[3] for n in block):
        return ()  # one node, or no weights to tell a copy from another op of the kind: no block
    after = graph.downstream(node.outputs[0], 3 * len(block)) if node.outputs else []
    copy, used = [node], {node.name}
    for original in block[1:]:
        match = next((n for n in after if n.name not in used and _signature(ctx, n) == _signature(ctx, original)),
                     None)
        if match is None:
            return ()
        copy.append(match)
        used.add(match.name)
    return tuple(n.name for n in sorted(copy, key=lambda n: n.index))


def _signature(ctx, node) -> tuple:
    """What makes two nodes the same computation on other data: op, attributes and constant inputs by name."""
    return (node.op_type, node.domain, node.attributes,
            tuple(t for t in node.inputs if t and ctx.onnx.graph.is_constant(t)))


def _between(graph, first, last) -> list:
    """The nodes on the paths from ``first`` to ``last`` (both included), in graph order."""
    down = {first.name: first}
    for n in graph.nodes[first.index + 1:last.index + 1]:
        if any((p := graph.node_of(t)) is not None and p.name in down for t in n.inputs):
            down[n.name] = n
    if last.name not in down:
        return []
    up, frontier = {last.name}, [last]
    while frontier:
        for t in frontier.pop().inputs:
            p = graph.node_of(t)
            if p is not None and p.name in down and p.name not in up:
                up.add(p.name)
                frontier.append(p)
    return [n for n in down.values() if n.name in up]


def _input_read(node: str, index: int, tensor: str):
    def edit(model, weights):
        edits.node(model, node).input[index] = tensor
        return model, weights
    return edit


#: ONNX float element types
FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                    onnx.TensorProto.BFLOAT16})


def _as_add(node: str, other: str):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = "Add"
        del target.attribute[:]
        del target.input[1:]
        target.input.append(other)
        return model, weights
    return edit


# --------------------------------------------------------------------------- RNN attributes

def _rnn_attributes(proto, make) -> Iterator:
    """A GRU with the other ``linear_before_reset`` (PyTorch's is 1, the ONNX default 0), an LSTM with its input and
    forget gates apart, a cell without a ``clip`` — where the file names no module to read them from."""
    if proto.op_type == "GRU":
        have = int(attribute(proto, "linear_before_reset", 0))
        yield make(proto.name, "linear_before_reset", have, 1 - have, "the PyTorch output",
                   with_attributes(proto.name, {"linear_before_reset": 1 - have}))
    if proto.op_type == "LSTM" and attribute(proto, "input_forget", 0):
        yield make(proto.name, "input_forget", 1, 0, "the PyTorch output",
                   with_attributes(proto.name, {"input_forget": 0}))
    if attribute(proto, "clip", None) is not None:
        yield make(proto.name, "clip", attribute(proto, "clip"), None, "the PyTorch output",
                   with_attributes(proto.name, {"clip": None}))


# --------------------------------------------------------------------------- activations, norms

def _activations(ctx, proto, make) -> Iterator:
    """The op of the activation module next to it (with its configuration), then the other members of the
    activation's family; a rectifier where PyTorch ran a PReLU: the PReLU with the module's slope."""
    op = proto.op_type
    family = next((f for f in ACTIVATIONS if op in f), None)
    if family is None and op != "PRelu":
        return
    for other, attrs in _module_ops(ctx, ctx.opset):  # the activation module's own op first (nn.Hardswish's)
        if other != op and len(proto.input) == 1:
            yield make(proto.name, "op", op, other if not attrs else f"{other} {attrs}", "the PyTorch module",
                       _activation(proto.name, other, attrs, drop_inputs=False))
    for other, attrs in (family or {"Relu": {}}).items():
        if other != op:
            yield make(proto.name, "op", op, other, "the PyTorch output",
                       _activation(proto.name, other, attrs, drop_inputs=op == "PRelu"))
            for alpha in (op_numbers(ctx, other) if "alpha" in attrs else []):  # the slope PyTorch's op ran with
                if not np.isclose(alpha, attrs["alpha"]):
                    yield make(proto.name, "op", op, f"{other} {{'alpha': {alpha:.6g}}}", "PyTorch's op arguments",
                               _activation(proto.name, other, {**attrs, "alpha": alpha}, drop_inputs=op == "PRelu"))
    if family is ACTIVATIONS[0]:
        for qualname, slope in _prelu_slopes(ctx, proto):
            yield make(proto.name, "op", op, f"PRelu (slope {qualname}.weight)", f"the PReLU {qualname}",
                       _prelu(proto.name, slope))


def _activation(node: str, op_type: str, attributes: dict, drop_inputs: bool):
    retype = retyped(node, op_type, attributes, drop=ACTIVATION_ATTRS)

    def edit(model, weights):
        model, weights = retype(model, weights)
        if drop_inputs:
            del edits.node(model, node).input[1:]
        return model, weights
    return edit


#: PReLU modules of the whole model tried where none is near the divergence (a file without scopes)
MAX_PRELUS = 4


def _prelu_slopes(ctx, proto) -> list[tuple[str, np.ndarray]]:
    """The weights of the PReLU modules nearest the divergence — else, in a file whose nodes name no module,
    of the model's PReLUs whose size fits (at most ``MAX_PRELUS``) — shaped to broadcast over the node's input
    (channels on axis 1), in its dtype."""
    shape = ctx.shape_of(proto.input[0])
    if not shape:
        return []
    elem = ctx.onnx.graph.elem_types.get(proto.input[0])
    dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else np.float32
    near = [(n, m) for n, m in ctx.modules_near() if type(m).__name__ == "PReLU"]
    every = [(n, m) for n, m in ctx.torch_modules() if type(m).__name__ == "PReLU"] if not near else []
    found = []
    for qualname, module in (near or every):
        slope = to_numpy(module.weight).astype(dtype).reshape(-1)
        if slope.size > 1 and (len(shape) < 2 or shape[1] != slope.size):
            continue
        found.append((qualname, slope.reshape((-1,) + (1,) * (len(shape) - 2)) if slope.size > 1 else slope))
    return found[:1] if near else found[:MAX_PRELUS]


def _prelu(node: str, slope: np.ndarray):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = "PRelu"
        kept = [a for a in target.attribute if a.name not in ACTIVATION_ATTRS]
        del target.attribute[:]
        target.attribute.extend(kept)
        del target.input[1:]
        target.input.append(edits.add_initializer(model, f"{node}_slope_alternative", slope))
        return model, weights
    return edit


def _layer_norm_bias(ctx, proto) -> np.ndarray | None:
    """The bias of the LayerNorm module nearest the divergence whose size is the node's scale's (an RMSNorm
    node computing a LayerNorm lost it), in the node's dtype."""
    scale = ctx.shape_of(proto.input[1]) if len(proto.input) > 1 else None
    size = int(np.prod(scale)) if scale else None
    for _, module in ctx.modules_near():
        bias = getattr(module, "bias", None)
        is_layer_norm = any(c.__name__ == "LayerNorm" for c in type(module).__mro__)  # subclasses: LayerNorm1P
        if is_layer_norm and bias is not None and bias.numel() == size:
            elem = ctx.onnx.graph.elem_types.get(proto.input[0])
            dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else np.float32
            return to_numpy(bias).astype(dtype).reshape(scale)
    return None


def _norm_kind(node: str, op_type: str, bias: np.ndarray | None):
    """A LayerNormalization computed as an RMSNorm (its bias dropped) or back (with ``bias`` when given); one
    output."""
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = op_type
        if op_type == "SimplifiedLayerNormalization":
            del target.input[2:]
        elif bias is not None:
            del target.input[2:]
            target.input.append(edits.add_initializer(model, f"{node}_bias_alternative", bias))
        del target.output[1:]
        return model, weights
    return edit
