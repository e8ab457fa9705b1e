"""Attributes and constant inputs: an ONNX node's configuration (Softmax axis, Transpose perm, Conv strides,
pads, dilations and groups, Pad mode, pooling windows, a scale or offset constant, a Reshape target, clip bounds,
a Where's branches …) contradicts the PyTorch module's or op's, or another value reproduces PyTorch exactly."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import numpy as np

from ..support import edits, layout
from ..support.alternative_edits import grouped, grouped_readings, repeated_block
from ..support.alternatives import (SEARCHED_SOURCE, Alternative, alternatives, attribute_change, backed_perms,
                                    boundary_shapes, searched)
from ..support.heads import head_counts
from ..support.block_order import exchanged_blocks, norm_placements, parallel_blocks
from ..support.gating import swapped_gates
from ..support.keys_values import exchanged_keys_values
from ..support.factors import extra_factors
from ..support.kind_alternatives import doubled_removals, extra_runs, kind_alternatives, per_block
from ..support.inserted import inserted_regions, same_removals
from ..support.rewirings import repeated_blocks, rewirings
from ..support.op_alternatives import boundary_swaps
from ...records import Cause, ModuleKind, module_kind
from ...records.nest import informative
from ...records.graph import LAYOUT_OPS
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

PAD_MODES = {"ReflectionPad1d": "reflect", "ReflectionPad2d": "reflect", "ReflectionPad3d": "reflect",
             "ReplicationPad1d": "edge", "ReplicationPad2d": "edge", "ReplicationPad3d": "edge",
             "ZeroPad1d": "constant", "ZeroPad2d": "constant", "ConstantPad1d": "constant",
             "ConstantPad2d": "constant", "ConstantPad3d": "constant", "CircularPad2d": "wrap"}


#: a node found reading a wrong tensor only with PyTorch's value fed in its place (no tensor of the file holds it):
#: below a confirmed reading of the file's own weights (a bias dropped from a layer whose output is split makes a
#: few numbers that another of PyTorch's values, fed, also reproduces)
FED_CONFIDENCE = 0.8


#: a scalar found by searching (a fit, not a closed form): below a reading of equal confidence that names what the
#: segment computes (a GELU written out for a SiLU, whose Erf's scale a search bends into a sigmoid's likeness)
SEARCHED_CONFIDENCE = 0.88


class AttributeMismatch(Rule):
    """Check node attributes against the module's configuration, then try the plausible alternatives."""

    cause = Cause.ATTRIBUTE_MISMATCH

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local):
            return None
        wrong = [attribute_change(node, attr, have, want, source) for p in ctx.segment_protos
                 for node, attr, have, want, rank, source in _expected(ctx, p) if _norm(want, rank) != _norm(have, rank)]
        confirmed_by_search, factor, reference = False, None, None
        if wrong and not _reproduces(ctx, wrong):
            wrong = _grouped_kernel(ctx, wrong)
        if not wrong or not _reproduces(ctx, wrong):
            # an exporter may fold a functional op into the node (F.pad into a Conv's pads): what the module's
            # configuration implies is then no fix, and the alternatives are searched instead
            found, factor, reference = _search(ctx)
            found = [a for a in found if not _baked(ctx, a)]
            wrong, confirmed_by_search = (found, True) if found else (wrong, False)
        if not wrong:
            return _computes_nothing(ctx)
        rows = [{"onnx_node": a.node, "attribute": a.what, "onnx_value": _plain(a.have), "expected": _plain(a.want),
                 "source": a.source} for a in wrong]
        listed = "; ".join(_said(a) for a in wrong)
        summary = f"Node attributes disagree with PyTorch: {listed}."
        if confirmed_by_search and any(a.reference is not None for a in wrong):
            summary += (" With that change the tensors after the blocks hold PyTorch's values, and the divergent "
                        "tensor, now computed in another place, the value PyTorch computes there.")
        elif confirmed_by_search:
            summary += " With that value the segment reproduces PyTorch's output" + (
                f" times {factor:.6g}, a factor the weights of the layer reading it undo (folded by a simplifier)."
                if factor is not None else " with the BatchNorm after it folded in." if reference is not None
                else ".")
        if any(a.what in ("transA", "transB") for a in wrong):
            summary += (" Equivalently, the operand is stored transposed (an exporter, a converter or code copying "
                        "the weights in wrote it in the other layout): the file cannot tell the two apart.")
        fix = ("Set the attribute(s) to the values above, or re-export: the tool or hand edit that produced this "
               "graph changed the node's configuration.")
        confidence = 0.9 if confirmed_by_search else 0.85
        if confirmed_by_search and all(a.source.startswith(SEARCHED_SOURCE) for a in wrong):
            confidence = SEARCHED_CONFIDENCE  # a number fitted to PyTorch: below a reading that names a function
        if any((a.what.startswith("input ") or a.what == "op") and a.feeds for a in wrong):
            confidence = FED_CONFIDENCE  # a value from outside the file: a reading of the file's own numbers first
        if all(a.what in ("transA", "transB") for a in wrong):
            confidence = _trans_confidence(ctx, wrong)
        return Finding(self.cause, confidence, summary, fix, {"attributes": rows},
                       changes=tuple(dict.fromkeys(n for a in wrong for n in (a.node, *a.shows_in))),
                       counterfactual=lambda c: _apply(c, wrong),
                       reference=reference)


def _said(a: Alternative) -> str:
    if a.what.startswith("input ") and a.feeds:  # the value no tensor of the file holds
        return (f"{a.node} reads '{a.have}' as its {a.what} (one of PyTorch's values, in the wrong place) where "
                f"{a.source} is computed from {a.want}, which none of the earlier tensors tried holds: the node is "
                "wired to a wrong tensor, and the right one may no longer be computed")
    if a.what.startswith("input ") and isinstance(a.want, str):  # a rewiring: tensors, not values
        return (f"{a.node} reads '{a.have}' as its {a.what} where {a.source} implies the tensor '{a.want}' (a "
                "wrong tensor wired in: a graph edit, a fusion or an exporter's aliasing)")
    if a.what == "window":  # two Slices of one tensor exchanged
        return (f"{a.node} and {a.have} take each other's window of '{a.want}' (two Slices of one tensor exchanged: "
                "its chunks or halves read in another order)")
    return f"{a.node}.{a.what} = {_plain(a.have)} where {a.source} implies {_plain(a.want)}"


def _trans_confidence(ctx: DiagnosisContext, wrong: list[Alternative]) -> float:
    """A Gemm's transA/transB flip gives the same numbers as its weight stored transposed (the weight rule's
    reading, at 0.85): the flip ranks above it (0.9) when the node reads its operand otherwise than the file's
    other Gemms with a constant operand do (or there are none), below it (0.8) when it reads it as they do."""
    return 0.8 if any(gemm_conforms(ctx, a.node, a.what) for a in wrong) else 0.9


def gemm_conforms(ctx: DiagnosisContext, node: str, what: str = "transB") -> bool:
    """Whether Gemm ``node`` has the ``what`` (transA / transB) most of the file's other Gemms with a constant
    second operand have (False when there are none)."""
    own = ctx.node(node)
    have = int(attribute(own, what, 0)) if own is not None else 0
    others = [int(attribute(n, what, 0)) for n in ctx.onnx.skeleton.graph.node
              if n.op_type in ("Gemm", "FusedGemm") and n.name != node and len(n.input) > 1
              and ctx.constant(n.input[1]) is not None]
    return bool(others) and sum(v == have for v in others) > len(others) / 2


def _computes_nothing(ctx: DiagnosisContext) -> Finding | None:
    """The divergent tensor comes out of an Identity that hands on a tensor PyTorch agrees with, where PyTorch
    computes something else: the file lacks a computation (a converter dropped an op, a residual Add lost the
    branch it adds, which the file no longer has).  Unconfirmed: nothing in the file can redo what is missing."""
    graph = ctx.onnx.graph
    identities = [graph.node_of(p.output[0]) for p in ctx.segment_protos if p.op_type == "Identity"]
    node = next((n for n in identities if n is not None and _agrees(ctx, n.inputs[0])), None)
    if node is None or len(identities) > 1:
        return None
    summary = (f"Node {node.name} is an Identity: it hands on '{node.inputs[0]}', which agrees with PyTorch, while "
               f"PyTorch computes other values here (max abs {ctx.layer.local.max_abs:.3g} apart). The file lacks a "
               "computation PyTorch does at this point — an op a converter dropped, or the branch of an Add that "
               "was removed with it; none of the ops tried in its place reproduces PyTorch.")
    fix = ("Find the step that replaced this node by an Identity (a converter or optimizer that skips an op it does "
           "not know, a graph edit) and re-export or convert without it.")
    return Finding(Cause.ATTRIBUTE_MISMATCH, 0.6, summary, fix, {"attributes": [
        {"onnx_node": node.name, "attribute": "op", "onnx_value": "Identity", "expected": "a computation",
         "source": "the PyTorch output"}]}, changes=(node.name,))


def _agrees(ctx: DiagnosisContext, tensor: str) -> bool:
    """Whether ``tensor`` is a cut tensor (a PyTorch value), or laid out from one by layout ops alone — or, computed
    inside the segment from the exact values at its inputs, holds the value of an op PyTorch ran there (a residual
    sum before the Add that lost its branch)."""
    for _ in range(4):
        if tensor in ctx.cut.references:
            return True
        node = ctx.onnx.graph.node_of(tensor)
        if node is None or node.op_type not in LAYOUT_OPS and node.op_type != "Identity":
            return _holds_an_op(ctx, tensor)  # a layout of a tensor PyTorch agrees with agrees too
        tensor = node.inputs[0]
    return False


def _holds_an_op(ctx: DiagnosisContext, tensor: str) -> bool:
    """Whether ``tensor``, computed in the segment from the exact values at its inputs, holds within the tolerance
    the value of one of PyTorch's ops or modules around the divergence (of the same shape)."""
    try:
        value = ctx.run_segment(outputs=[tensor]).get(tensor)
    except Exception:  # noqa: BLE001 - a tensor the segment cannot compute agrees with nothing
        return False
    if value is None or value.dtype.kind != "f" or not value.size:
        return False
    if not informative(value):
        return False  # one number repeated (a mask of ones, a zero state) agrees with too much to say so
    near = {name for name, _ in ctx.modules_near()}
    known = list(ctx.ops) + [a for a in ctx.baseline.capture.activations if not a.op and a.module in near]
    return any(np.shape(a.value) == value.shape and ctx.compare(value, np.asarray(a.value)).ok for a in known
               if a.value is not None and np.asarray(a.value).dtype.kind == "f")


def _expected(ctx: DiagnosisContext, proto):
    """``(node, attribute, onnx value, expected value, rank, source)`` from the emitting module's configuration."""
    info = next(n for n in ctx.segment_nodes if n.name == proto.name)
    qualname, module = ctx.module_of(info)
    if proto.op_type in ("MaxPool", "AveragePool") and type(module).__name__ in ADAPTIVE_POOLS:
        yield from _adaptive_pool(ctx, proto, qualname, module)
        return
    if proto.op_type in ("MaxPool", "AveragePool") and type(module).__name__ not in PLAIN_POOLS:
        yield from _pool_from_op(ctx, proto)  # a functional pool, a pool subclass: its ATen op's arguments
        return
    if module is None:
        return
    kind = type(module).__name__
    if proto.op_type == "Conv" and module_kind(module) is ModuleKind.BATCHNORM:  # dynamo scopes a folded Conv
        pair = layout.conv_bn_pair(ctx)                                          # to its BatchNorm
        qualname, module = (pair[0], pair[1]) if pair is not None else (qualname, module)
        kind = type(module).__name__
    source = f"{qualname} ({kind})"
    rank = len(ctx.onnx.graph.shapes.get(proto.input[0], ()) or ()) if proto.input else 0
    if proto.op_type in ("Softmax", "LogSoftmax") and kind in ("Softmax", "LogSoftmax") and module.dim is not None:
        default = -1 if _opset(ctx) >= 13 else 1
        yield proto.name, "axis", attribute(proto, "axis", default), module.dim, rank, f"{source} dim"
    elif proto.op_type == "Conv" and module_kind(module) is ModuleKind.CONV:
        yield proto.name, "strides", list(attribute(proto, "strides", [1] * len(module.stride))), list(module.stride), 0, source
        yield proto.name, "dilations", list(attribute(proto, "dilations", [1] * len(module.dilation))), list(module.dilation), 0, source
        yield proto.name, "group", attribute(proto, "group", 1), module.groups, 0, source
        # a subclass may pad on its own (timm's Conv2dSame pads in forward): only the plain classes' padding is known
        if (kind in ("Conv1d", "Conv2d", "Conv3d") and isinstance(module.padding, tuple)
                and module.padding_mode == "zeros" and attribute(proto, "auto_pad", "NOTSET") == "NOTSET"):
            yield proto.name, "pads", list(attribute(proto, "pads", [0] * 2 * len(module.padding))), list(module.padding) * 2, 0, source
    elif proto.op_type == "Pad" and kind in PAD_MODES:
        yield proto.name, "mode", attribute(proto, "mode", "constant"), PAD_MODES[kind], 0, source
    elif proto.op_type in ("MaxPool", "AveragePool") and kind in PLAIN_POOLS:
        n = len(attribute(proto, "kernel_shape", []))
        as_list = (lambda v: [v] * n if isinstance(v, int) else list(v))
        yield proto.name, "kernel_shape", list(attribute(proto, "kernel_shape", [])), as_list(module.kernel_size), 0, source
        yield proto.name, "strides", list(attribute(proto, "strides", [1] * n)), as_list(module.stride or module.kernel_size), 0, source
        yield proto.name, "ceil_mode", attribute(proto, "ceil_mode", 0), int(module.ceil_mode), 0, source
        yield proto.name, "pads", list(attribute(proto, "pads", [0] * 2 * n)), as_list(module.padding) * 2, 0, source
    elif proto.op_type in RNN_OPS and kind == proto.op_type:
        yield from _rnn_expected(proto, source)
    elif proto.op_type == "LeakyRelu" and kind == "LeakyReLU":
        yield proto.name, "alpha", round(attribute(proto, "alpha", 0.01), 6), round(module.negative_slope, 6), 0, source
    elif proto.op_type == "Elu" and kind == "ELU":
        yield proto.name, "alpha", round(attribute(proto, "alpha", 1.0), 6), round(module.alpha, 6), 0, source


def _grouped_kernel(ctx: DiagnosisContext, wrong: list[Alternative]) -> list[Alternative]:
    """``wrong`` with a Conv's group change also cutting its kernel to the grouped shape, where the file's dense
    kernel repeats one block along its input channels once per group (:func:`repeated_block`): the block as it
    is, or times the group count (a converter dividing the tiled kernel by it) — the first with which the
    segment reproduces PyTorch; else ``wrong`` as it was."""
    for k, alt in enumerate(wrong):
        proto = ctx.node(alt.node) if alt.what == "group" and isinstance(alt.want, int) else None
        block = repeated_block(ctx.initializer(proto.input[1]), alt.want) if proto is not None \
            and len(proto.input) > 1 else None
        for said, kernel in (grouped_readings(alt.want, block) if block is not None else ()):
            changed = list(wrong)
            changed[k] = dataclasses.replace(alt, edit=grouped(alt.node, alt.want, kernel), want=said)
            if _reproduces(ctx, changed):
                return changed
    return wrong


#: PyTorch's adaptive pools: exported as a fixed pool where each output size divides the input's
ADAPTIVE_POOLS = frozenset({"AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
                            "AdaptiveMaxPool2d", "AdaptiveMaxPool3d"})


def _adaptive_pool(ctx: DiagnosisContext, proto, qualname: str, module):
    """The window, strides and pads of the fixed pool an adaptive pool is where each output size divides the
    input's (the exporters write it so): window = stride = input / output, no padding."""
    shape = ctx.shape_of(proto.input[0]) if proto.input else None
    n = len(attribute(proto, "kernel_shape", []))
    wanted = module.output_size if isinstance(module.output_size, (tuple, list)) else (module.output_size,) * n
    if not shape or len(shape) != n + 2 or len(wanted) != n or any(w is None for w in wanted):
        return
    size = shape[2:]
    if any(not w or s % w for s, w in zip(size, wanted)):
        return
    window = [s // w for s, w in zip(size, wanted)]
    source = f"{qualname} ({type(module).__name__}, output size {list(wanted)} of {list(size)})"
    yield proto.name, "kernel_shape", list(attribute(proto, "kernel_shape", [])), window, 0, source
    yield proto.name, "strides", list(attribute(proto, "strides", [1] * n)), window, 0, source
    yield proto.name, "pads", list(attribute(proto, "pads", [0] * 2 * n)), [0] * 2 * n, 0, source


#: PyTorch's pool modules whose configuration is the op's (a subclass may pad on its own: timm's, BiT's)
PLAIN_POOLS = ("MaxPool2d", "AvgPool2d", "MaxPool1d", "AvgPool1d")
#: ATen pools and the position of their ceil_mode argument (kernel_size, stride, padding are 1, 2, 3)
ATEN_POOLS = {"aten.max_pool": 5, "aten.avg_pool": 4}


def _pool_from_op(ctx: DiagnosisContext, proto):
    """The kernel, strides, pads and ceil mode of a MaxPool / AveragePool from the arguments of PyTorch's pool op
    of that kind and rank around the divergence (``F.max_pool2d`` called by a module's forward) — when exactly one
    set of arguments is there; the arguments PyTorch leaves at their defaults (stride = kernel, no padding) as
    ATen reads them."""
    n = len(attribute(proto, "kernel_shape", []))
    prefix = "aten.max_pool" if proto.op_type == "MaxPool" else "aten.avg_pool"
    found = {a.args for a in (*ctx.ops, ctx.layer.pair.activation) if a.op and a.module_type.startswith(
        f"{prefix}{n}d")}
    if n == 0 or len(found) != 1:
        return
    args = dict(next(iter(found)))
    as_list = (lambda v: [int(v)] * n if isinstance(v, (int, np.integer)) else [int(x) for x in v] * (
        n if len(v) == 1 else 1))  # one number for every axis, as ATen reads a one-element list
    kernel = args.get("1")
    if kernel is None:
        return
    kernel = as_list(kernel)
    stride = as_list(args["2"]) if args.get("2") else kernel
    padding = as_list(args.get("3", 0))
    source = f"PyTorch's {prefix[5:]}{n}d"
    yield proto.name, "kernel_shape", list(attribute(proto, "kernel_shape", [])), kernel, 0, source
    yield proto.name, "strides", list(attribute(proto, "strides", [1] * n)), stride, 0, source
    yield proto.name, "pads", list(attribute(proto, "pads", [0] * 2 * n)), padding * 2, 0, source
    ceil = args.get(str(ATEN_POOLS[prefix]), False)
    yield proto.name, "ceil_mode", attribute(proto, "ceil_mode", 0), int(bool(ceil)), 0, source


RNN_OPS = ("GRU", "LSTM", "RNN")


def _rnn_expected(proto, source: str):
    """What PyTorch's recurrent modules compute, as ONNX attributes: a GRU applies the hidden state's linear
    transformation before the reset gate (``linear_before_reset=1``), an LSTM keeps its input and forget gates
    apart (``input_forget=0``), and no cell clips its pre-activations (no ``clip``)."""
    if proto.op_type == "GRU":
        yield proto.name, "linear_before_reset", int(attribute(proto, "linear_before_reset", 0)), 1, 0, source
    if proto.op_type == "LSTM":
        yield proto.name, "input_forget", int(attribute(proto, "input_forget", 0)), 0, 0, source
    yield proto.name, "clip", attribute(proto, "clip", None), None, 0, source


#: segment runs one search may spend
MAX_TRIALS = 48


def _baked(ctx: DiagnosisContext, alt: Alternative) -> bool:
    """Whether a Reshape's shape constant is a size baked in at export (the baked-shape rule's case): tensors
    of the model change size at this input size (a wrong constant at the file's own size keeps every size)."""
    return alt.what.startswith("shape input") and any(
        r.diff is not None and r.diff.actual_shape is not None
        and int(np.prod(r.diff.actual_shape)) != int(np.prod(r.diff.shape)) for r in ctx.layers)


def _search(ctx: DiagnosisContext) -> tuple[list[Alternative], float | None, Callable | None]:
    """Try each plausible alternative of each segment node; keep one with which the segment reproduces PyTorch
    (times a factor the layer reading it undoes, when :func:`_folded_factor` finds one; or the output of the
    BatchNorm folded into the Conv computing the divergent tensor, aligned with the convolution alone):
    ``(alternatives, factor, reference)``.  A scalar fitted to PyTorch's output absorbs any error of scale
    before it (a mean made a sum): found first, it is kept only if no discrete alternative tried after it
    reproduces PyTorch too."""
    folded, seen, scalar, held = _FoldedFactor(ctx), set(), None, None
    with_bn = _folded_batchnorm(ctx)
    for number, phase in enumerate(_candidates(ctx)):  # each phase has a budget of its own: a large segment's
        trials = 0                                      # own alternatives must not use up the families' turn
        for alt in phase:
            key = (alt.node, alt.what, repr(alt.want))
            if key in seen or scalar is not None and (_is_scalar(alt) or alt.what.startswith("input ")):
                # a rewiring absorbs any fault upstream of the input: it does not displace a fitted scalar
                continue
            seen.add(key)
            trials += 1
            if trials > MAX_TRIALS:
                break
            found = _try(ctx, alt, folded, with_bn)
            if found is not None and scalar is None and _is_scalar(alt):
                scalar = found
            elif found is not None and held is None and number == 0 and _saturated(ctx, alt):
                held = found  # a node's own alternative that makes it compute a constant: the families next
            elif found is not None:
                return found
        if held is not None and number >= 1:
            return held
    return scalar or ([], None, None)


def _saturated(ctx: DiagnosisContext, alt: Alternative) -> bool:
    """Whether ``alt`` makes its node compute one number everywhere where the file's node does not (a Sigmoid
    made a HardSigmoid whose every input is past its knee): the node's inputs then no longer count, so the
    alternative only says that what it computes should not act — a factor not applied, a branch not taken, which
    the second phase names with the nodes computing it (:func:`extra_factors`)."""
    proto = ctx.node(alt.node)
    if proto is None or len(proto.output) != 1 or proto.op_type in ("Constant", "ConstantOfShape"):
        return False
    tensor = proto.output[0]
    try:
        model, weights = alt.apply(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights)
        after = ctx.run_segment(model, weights, outputs=[tensor], feeds=alt.feeds).get(tensor)
        before = ctx.run_segment(outputs=[tensor]).get(tensor)
    except Exception:  # noqa: BLE001 - a tensor the segment does not compute: nothing to judge
        return False
    return (after is not None and before is not None and after.dtype.kind == "f" and after.size > 1
            and np.ptp(after) == 0 and np.ptp(before) > 0)


def _candidates(ctx: DiagnosisContext):
    """The alternatives in the order they are tried, in three phases: each node's own (layouts, attributes,
    fitted values) and the segment's boundary shapes and swaps; another op of the family or operands the other
    way round (a Transpose of the coordinates a Sub differences is that Sub's operands exchanged: the Transpose
    is the reading); values found by searching."""
    protos = ctx.protos_by_focus()
    return (itertools.chain((alt for proto in protos for alt in backed_perms(ctx, proto, ctx.shape_of)),
                            (alt for proto in protos for alt in alternatives(ctx, proto, ctx.shape_of)),
                            boundary_shapes(ctx), boundary_swaps(ctx, lambda *a: Alternative(*a[:6], feeds=a[6]))),
            itertools.chain(norm_placements(ctx, protos, Alternative), extra_factors(ctx, protos, Alternative),
                            doubled_removals(ctx, protos, Alternative), same_removals(ctx, protos, Alternative),
                            (alt for proto in protos for alt in kind_alternatives(ctx, proto, ctx.shape_of, Alternative)),
                            per_block(ctx, protos, Alternative), extra_runs(ctx, protos, Alternative),
                            repeated_blocks(ctx, protos, Alternative), exchanged_blocks(ctx, protos, Alternative),
                            parallel_blocks(ctx, protos, Alternative),
                            swapped_gates(ctx, protos, Alternative), exchanged_keys_values(ctx, protos, Alternative),
                            head_counts(ctx, protos, Alternative), inserted_regions(ctx, protos, Alternative)),
            (alt for proto in protos for alt in searched(ctx, proto)),
            (alt for proto in protos for alt in rewirings(ctx, proto, Alternative)))


def _is_scalar(alt: Alternative) -> bool:
    return alt.what.startswith("constant input")


def _try(ctx: DiagnosisContext, alt: Alternative, folded, with_bn: Callable | None) -> tuple | None:
    """``(alternatives, factor, reference)`` when the segment with ``alt`` reproduces PyTorch, else None."""
    model, weights = alt.apply(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights)
    try:
        values = ctx.run_segment(model, weights, feeds=alt.feeds)
    except Exception:  # noqa: BLE001 - an alternative the runtime rejects is simply not the answer
        return None
    if alt.reference is not None:  # the alternative moves the tensor's role: judged against what it stands for
        return ([alt], None, lambda c, r=alt.reference: r) if ctx.agrees(values[ctx.tensor], alt.reference) else None
    if ctx.compare(values[ctx.tensor], ctx.reference).ok:
        return [alt], None, None
    if with_bn is not None and ctx.compare(values[ctx.tensor], with_bn(ctx)).ok:
        return [alt], None, with_bn
    factor = folded(values[ctx.tensor])
    if factor is not None:
        return [alt], factor, (lambda c, f=factor: c.reference * np.float32(f))
    return None


def _folded_batchnorm(ctx: DiagnosisContext) -> Callable | None:
    """The BatchNorm's output where the divergent tensor, aligned with a convolution, is a Conv node that may
    carry the BatchNorm after it folded (a simplified file: the pair was made by nearness downstream of a fault)."""
    producer = ctx.onnx.graph.node_of(ctx.tensor)
    if producer is None or producer.op_type not in ("Conv", "Gemm", "MatMul"):
        return None
    pair = layout.conv_bn_pair(ctx)
    if pair is None or pair[0] != ctx.layer.pair.activation.module:
        return None
    bn = ctx.activation_of(pair[2])
    if bn is None or np.size(bn.value) != ctx.reference.size:
        return None
    return lambda c: np.asarray(bn.value).reshape(c.reference.shape)


class _FoldedFactor:
    """The factor a divergent tensor holds PyTorch's value times when only Convs / MatMuls with constant weights
    read it — a simplifier folded the module's last scale into them (GELU's ×0.5) — asked only when the file's
    own segment output is no scaled copy (else the scale is the fault)."""

    def __init__(self, ctx: DiagnosisContext):
        self.ctx = ctx
        self.open = bool(ctx.onnx.graph.weighted_readers(ctx.tensor))
        self.checked = False

    def __call__(self, value: np.ndarray) -> float | None:
        if self.open and not self.checked:
            self.checked = True
            self.open = self._scaled(self.ctx.local_value) is None
        return self._scaled(value) if self.open else None

    def _scaled(self, value: np.ndarray) -> float | None:
        ref = self.ctx.reference
        r, v = ref.astype(np.float64).ravel(), value.astype(np.float64).ravel()
        den = float(r @ r)
        factor = float(v @ r) / den if den > 0 and v.size == r.size else float("nan")
        if not np.isfinite(factor) or abs(factor) < 1e-6 or abs(factor - 1.0) < 1e-6:
            return None
        return factor if self.ctx.compare(value, ref * np.float32(factor)).ok else None


def _reproduces(ctx: DiagnosisContext, wrong: list[Alternative]) -> bool:
    """Whether the segment with these alternatives applied reproduces PyTorch's output."""
    fixed = _apply(ctx, wrong)
    try:
        values = ctx.run_segment(fixed.model, fixed.weights, feeds=fixed.feeds)
    except Exception:  # noqa: BLE001 - a configuration the runtime rejects reproduces nothing
        return False
    return bool(ctx.compare(values[ctx.tensor], ctx.reference).ok)


def _apply(ctx: DiagnosisContext, wrong: list[Alternative]) -> FixedSegment:
    model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
    feeds: dict = {}
    for alt in wrong:
        model, weights = alt.apply(model, weights)
        feeds.update(alt.feeds or {})
    return FixedSegment(model, weights, feeds or None)


def _norm(value, rank: int):
    return value % rank if rank and isinstance(value, int) else value


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def _opset(ctx: DiagnosisContext) -> int:
    return ctx.opset
