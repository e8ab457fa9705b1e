"""Alternatives of kind and operands: what other op of its family a node of the divergent segment could have
been, or the same op on its operands in the other order.

A converter or a hand edit can pick the wrong member of a family whose members take the same inputs and give
the same shape — a Softmax for a LogSoftmax, a sum for a mean (a missing 1/N), a max pool for an average one,
a strict comparison for a non-strict one (a causal mask's diagonal), the larger for the smaller — or feed a
non-commutative op its operands the other way round (``mean - x``).  Each alternative here is such an edit; the
attribute rule keeps one only when the segment then reproduces PyTorch, so a family is tried whole.  Further:
a Conv's dilation (its padding moved with it so the shape stays), a normalization's scale and bias exchanged,
and an integer constant (a position offset, index arithmetic) one more or one less; ops PyTorch does not apply
(an activation, a Clip, a fixed filter, the scaling around a soft cap) removed.  A node reading the wrong tensor,
and a block applied twice, are :mod:`.rewirings`; what an Identity stands for, :mod:`.restored`; a computed
factor PyTorch does not apply, :mod:`.factors`.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import onnx
from onnx import helper

from ..context import attribute
from . import edits
from .form_alternatives import form_alternatives
from .masks import dropout_probability
from .moved_ops import applied_after
from .alternative_edits import (grouped, grouped_readings, identity_of, repeated_block, retyped, rewired,
                                with_attributes, with_inputs)
from .factors import scalar_scaling
from .restored import module_ops, restored
from .value_alternatives import op_numbers
from ...records.nest import to_numpy

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
                       "Cos", "Gelu", "Mish", "ThresholdedRelu", "Softmax", "LogSoftmax", "LayerNormalization", "Clip",
                       "SimplifiedLayerNormalization", "InstanceNormalization"})
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
    if op in ("Gather", "ReduceMean", "ReduceMax"):
        yield from _pooling_conventions(ctx, proto, make)
    elif op in POOL_ONLY:
        yield from _pools(proto, make)
    elif op in NON_COMMUTATIVE and len(proto.input) == 2 and not any(ctx.is_scalar(t) for t in proto.input):
        yield make(proto.name, "operands", list(proto.input), [proto.input[1], proto.input[0]], "the PyTorch output",
                   rewired(proto.name, [proto.input[1], proto.input[0]]))
    elif op == "Conv":
        yield from _dilations(proto, shape_of, make)
        yield from _tiled_groups(ctx, proto, make)
    elif op == "Einsum":
        yield from _einsum_equations(proto, shape_of, make)
    elif op in AFFINE_NORMS and len(proto.input) >= 3 and proto.input[2]:
        inputs = list(proto.input)
        inputs[1], inputs[2] = proto.input[2], proto.input[1]
        yield make(proto.name, "scale, bias", [proto.input[1], proto.input[2]], inputs[1:3], "the PyTorch output",
                   rewired(proto.name, inputs))
    if op in INVERSES and len(proto.input) == 2 and not any(ctx.is_scalar(t) for t in proto.input):
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
    yield from _not_applied(ctx, proto, make)


def _not_applied(ctx, proto, make) -> Iterator:
    """The node's op left out (an Identity restored to the op it stands for, for an Identity)."""
    op = proto.op_type
    if op == "Identity":
        yield from restored(ctx, proto, make)
    elif op == "Sub" and len(proto.input) == 2 and _one(ctx, proto.input[0]) and proto.domain in ("", "ai.onnx"):
        # ``1 − z``: a gate read in the other convention (a GRU's update gate as (1 − z)·h + z·n, a mask read as
        # the other class's) — the complement the model does not take
        yield make(proto.name, "op", "Sub (1 − x: the complement)", "Identity (x itself)", "the PyTorch output",
                   identity_of(proto.name, proto.input[1]))
    elif op == "Mul" and len(proto.input) == 2 and proto.domain in ("", "ai.onnx") and _gate_of_itself(ctx, proto):
        # x·σ(x) (a SiLU written out, as TorchScript and converters write it) PyTorch does not apply
        x, gate = _gate_of_itself(ctx, proto)
        alt = make(proto.name, "op", f"Mul of '{x}' by its own {gate.op_type} (a SiLU / swish)", "Identity (not "
                   "applied: PyTorch reads the tensor as it is)", "the PyTorch output", identity_of(proto.name, x))
        yield dataclasses.replace(alt, shows_in=(gate.name,)) if alt is not None else alt
    elif op == "Conv" and proto.domain in ("", "ai.onnx") and _a_filter(ctx, proto):
        # a fixed filter PyTorch does not apply (an anti-aliasing blur before a strided Conv, a smoothing)
        alt = _removal(proto, make)
        yield dataclasses.replace(alt, have="Conv (a fixed depthwise filter keeping the shape)") if alt else alt
    elif op in REMOVABLE and proto.domain in ("", "ai.onnx") and not _doubled_by_reader(ctx, proto):
        alt = _removal(proto, make)
        chain = _inverting_chain(ctx.onnx.graph, proto.input[0]) if op == "Reciprocal" and proto.input else ()
        around = _scaled_around(ctx, proto)
        if around and alt is not None:  # c·f(x / c) (a soft cap c·tanh(x / c)): the scalings go with the op
            scale, nodes = around
            alt = dataclasses.replace(alt, have=f"{op} between a scaling by 1/{scale:.6g} and one by {scale:.6g} "
                                                f"({scale:.6g}·{op.lower()}(x / {scale:.6g}))", shows_in=nodes)
        moved = applied_after(ctx, proto) if alt is not None and not around else ()
        if moved:  # PyTorch applies it after the layer the file applies it before
            alt = dataclasses.replace(alt, have=f"{op}, applied to the input of the layer {', '.join(moved)} (PyTorch "
                                                f"applies it to that layer's output)", shows_in=moved)
        yield dataclasses.replace(alt, shows_in=chain) if chain and alt is not None else alt


def _a_filter(ctx, proto) -> bool:
    """Whether a Conv filters each channel apart and keeps its input's shape: depthwise (one group per channel),
    a constant kernel, no bias, the output of the input's shape."""
    kernel = ctx.initializer(proto.input[1]) if len(proto.input) > 1 else None
    shape = ctx.shape_of(proto.input[0])
    return (kernel is not None and kernel.ndim >= 3 and kernel.shape[1] == 1 and len(proto.input) < 3 and bool(shape)
            and len(shape) == kernel.ndim and attribute(proto, "group", 1) == shape[1] == kernel.shape[0]
            and ctx.shape_of(proto.output[0]) == shape)


def _scaled_around(ctx, proto) -> tuple[float, tuple[str, str]] | None:
    """``(c, (the node before, the node after))`` when ``proto`` reads ``x / c`` (a Div or Mul by a scalar
    constant that only it reads) and only a scaling by ``c`` reads its output: ``c · f(x / c)``, which is ``x``
    again once ``f`` is removed."""
    graph = ctx.onnx.graph
    before = graph.node_of(proto.input[0]) if proto.input else None
    readers = graph.consumers.get(proto.output[0], ()) if proto.output else ()
    after = graph.nodes[readers[0]] if len(readers) == 1 else None
    if before is None or after is None or len(graph.consumers.get(before.outputs[0], ())) != 1:
        return None
    inner, outer = scalar_scaling(ctx, before), scalar_scaling(ctx, after, proto.output[0])
    if inner is None or outer is None or inner == 0 or not np.isclose(inner * outer, 1.0, rtol=1e-4):
        return None
    return outer, (before.name, after.name)


def _gate_of_itself(ctx, proto):
    """``(x, gate node)`` for a Mul of x by Sigmoid(x) / HardSigmoid(x) that only this Mul reads, else None."""
    graph = ctx.onnx.graph
    for k in (0, 1):
        gate = graph.node_of(proto.input[1 - k])
        if gate is not None and gate.op_type in ("Sigmoid", "HardSigmoid") \
                and tuple(gate.inputs[:1]) == (proto.input[k],) and len(graph.consumers.get(gate.outputs[0], ())) == 1:
            return proto.input[k], gate
    return None


def _one(ctx, tensor: str) -> bool:
    """Whether ``tensor`` is a constant holding the number one alone."""
    value = ctx.constant(tensor)
    return value is not None and value.size == 1 and float(np.asarray(value).reshape(())) == 1.0


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


def _pooling_conventions(ctx, proto, make) -> Iterator:
    """A sequence pooled in the other convention (CLS ↔ mean pooling, timm's ``global_pool='token'`` ↔
    ``'avg'``, a decoder's last token): one position (a Gather of a scalar index) of a computed tensor taken as
    the mean, then the max, over that axis; a mean or max over one axis taken as its first, then its last,
    position."""
    opset = ctx.opset or 13
    data = ctx.shape_of(proto.input[0]) if proto.input and not ctx.onnx.graph.is_constant(proto.input[0]) else None
    if not data or len(data) < 2:
        return
    if proto.op_type == "Gather":
        index = ctx.constant(proto.input[1]) if len(proto.input) > 1 else None
        axis = attribute(proto, "axis", 0) % len(data)
        if index is None or index.ndim != 0 or index.dtype.kind not in "iu" or axis == 0 or data[axis] < 2:
            return
        for other in ("ReduceMean", "ReduceMax"):
            yield make(proto.name, "op", f"Gather of position {int(index)} on axis {axis}", f"{other} over axis "
                       f"{axis}", "the PyTorch output", _pooled(proto.name, other, axis, opset >= 18))
        return
    as_input = len(proto.input) > 1 and bool(proto.input[1])
    axes = ctx.constant(proto.input[1]) if as_input else attribute(proto, "axes")
    axes = [int(a) % len(data) for a in np.asarray(axes).reshape(-1)] if axes is not None else []
    if len(axes) != 1 or axes[0] == 0 or data[axes[0]] < 2:
        return
    keep = bool(attribute(proto, "keepdims", 1))
    for position in (0, data[axes[0]] - 1):
        index = np.array([position] if keep else position, np.int64)
        yield make(proto.name, "op", f"{proto.op_type} over axis {axes[0]}", f"Gather of position {position} on "
                   f"axis {axes[0]}", "the PyTorch output", _taken(proto.name, axes[0], index))


def _pooled(node: str, op_type: str, axis: int, as_input: bool):
    """The Gather made a reduction over its axis, the axis dropped."""
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = op_type
        del target.attribute[:], target.input[1:]
        target.attribute.append(helper.make_attribute("keepdims", 0))
        if as_input:
            target.input.append(edits.add_initializer(model, f"{node}_axes_alternative", np.array([axis], np.int64)))
        else:
            target.attribute.append(helper.make_attribute("axes", [axis]))
        return model, weights
    return edit


def _taken(node: str, axis: int, index: np.ndarray):
    """The reduction made a Gather of ``index`` on its axis (a one-element index keeps the axis)."""
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = "Gather"
        del target.attribute[:], target.input[1:]
        target.input.append(edits.add_initializer(model, f"{node}_index_alternative", index))
        target.attribute.append(helper.make_attribute("axis", axis))
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


def _tiled_groups(ctx, proto, make) -> Iterator:
    """A dense Conv whose kernel repeats one block along its input channels (:func:`repeated_block`): run grouped,
    the block its kernel, as is and times the group count — the largest such group count first (a depthwise
    convolution run dense)."""
    kernel = ctx.initializer(proto.input[1]) if len(proto.input) > 1 else None
    if kernel is None or kernel.ndim < 3 or kernel.dtype.kind != "f" or attribute(proto, "group", 1) != 1:
        return
    for groups in sorted((g for g in range(2, kernel.shape[1] + 1) if kernel.shape[1] % g == 0), reverse=True):
        block = repeated_block(kernel, groups)
        if block is None:
            continue
        for said, kernel in grouped_readings(groups, block):
            yield make(proto.name, "group", 1, said, "the PyTorch output", grouped(proto.name, groups, kernel))
        return


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
                   "the PyTorch output", identity_of(last.name, source))
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
               "Identity (the constant operand not applied)", "the PyTorch output", identity_of(proto.name, live))


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
                   "the PyTorch output", identity_of(proto.name, proto.input[0]))
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
        identity_of(transpose, edits.node(model, transpose).input[0])(model, weights)
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
    for other, attrs in module_ops(ctx, ctx.opset):  # the activation module's own op first (nn.Hardswish's)
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
