"""Input dtype: PyTorch computes in float64 but the ONNX segment in float32 (inputs or parameters cast)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..support import edits, layout
from ..support.rewirings import FLOATS
from ...records import Cause
from ...records.graph import INTEGER_TYPES
from ..context import DiagnosisContext, Finding, FixedSegment, Rule


class Float64Cast(Rule):
    """Measure what casting the segment's float64 inputs and parameters to float32 costs; re-run it in float64."""

    cause = Cause.DTYPE

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if ctx.onnx.graph.elem_types.get(ctx.tensor) != TensorProto.FLOAT or not ctx.significant(ctx.layer.local):
            return None
        inputs = {t: v for t, v in _float64_inputs(ctx).items()}
        params = _float64_params(ctx)
        if not inputs and not params and ctx.reference.dtype != np.float64:
            return None
        rounding = {t: float(np.max(np.abs(v - v.astype(np.float32).astype(np.float64)))) for t, v in inputs.items()}
        rounding.update({n: float(np.max(np.abs(v - v.astype(np.float32).astype(np.float64)))) for n, (_, v) in params.items()})
        if not rounding:
            return None
        fixed = _float64(ctx, inputs, params)
        try:
            after = ctx.compare(ctx.run_segment(fixed.model, fixed.weights, feeds=fixed.feeds)[ctx.tensor], ctx.reference)
        except Exception:  # noqa: BLE001 - e.g. an op without a float64 kernel: the finding stays a hypothesis
            after = None
        evidence = {"float64_inputs": sorted(inputs), "float64_parameters": sorted(params),
                    "float32_rounding_max_abs": rounding, "local_max_abs": ctx.layer.local.max_abs,
                    "local_max_abs_in_float64": after.max_abs if after else None}
        worst = max(rounding, key=rounding.get)
        rerun = ("re-run in float64 the segment agrees with PyTorch" if after is not None and after.ok else
                 "the segment could not be re-run in float64" if after is None else
                 f"re-run in float64 it still differs by {after.max_abs:.2g}")
        summary = (f"PyTorch computes {ctx.layer.pair.activation.name} in float64 but the ONNX segment in float32: "
                   f"casting {', '.join(sorted(rounding))} to float32 changes them by up to {rounding[worst]:.2g} "
                   f"('{worst}'), and the segment differs by {ctx.layer.local.max_abs:.2g}; {rerun}.")
        fix = ("Compare like with like: export and run the model in float64 (model.double() before export, float64 "
               "inputs), or make the PyTorch model float32; if the values need float64 (large offsets, "
               "cancellation), subtract the offset before the model.")
        if after is None:
            confidence = 0.55
        else:
            confidence = 0.85 if after.ok else 0.3
        return Finding(self.cause, confidence, summary, fix, evidence, counterfactual=lambda c: _float64(c, inputs, params))


def _float64_inputs(ctx: DiagnosisContext) -> dict[str, np.ndarray]:
    """Segment inputs whose PyTorch value is float64 (cut tensors and graph inputs)."""
    out = {}
    for t in ctx.segment_feeds():
        value = ctx.torch_value(t) if t in ctx.cut.references else ctx.torch_input(t)
        if value is not None and value.dtype == np.float64:
            out[t] = value
    return out


def _float64_params(ctx: DiagnosisContext) -> dict[str, tuple[str, np.ndarray]]:
    """Segment initializers that are float32 copies of float64 PyTorch parameters or buffers."""
    tensors = {}
    for qualname, module in ctx.modules_near():
        for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if t is not None and t.dtype.is_floating_point and str(t.dtype) == "torch.float64":
                tensors[f"{qualname}.{name}" if qualname else name] = t.detach().cpu().numpy()
    out = {}
    names = {t for p in ctx.segment_protos for t in p.input if t in ctx.onnx.graph.initializers}
    for init in names:
        value = ctx.initializer(init)
        if value is None or value.dtype != np.float32:
            continue
        for pname, tensor in tensors.items():
            rel = layout.relate(value, tensor)
            if rel is not None and rel.rel_l2 < 1e-6:
                out[init] = (pname, rel.layout.apply(tensor, value.shape))
                break
    return out


def _float64(ctx: DiagnosisContext, inputs: dict, params: dict) -> FixedSegment:
    """The segment in float64, fed PyTorch's float64 values and parameters."""
    model, weights = edits.convert_float_type(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights, set(ctx.layer.segment),
                                              {TensorProto.FLOAT}, TensorProto.DOUBLE)
    for init, (_, value) in params.items():
        model, weights = edits.replace_array(model, weights, init, value)
    feeds = {t: v.astype(np.float64) for t, v in ctx.segment_feeds().items() if v.dtype == np.float32}
    feeds.update(inputs)
    return FixedSegment(model, weights, feeds)


class IntegerRoundTrip(Rule):
    """A float value cast to an integer type and straight back to float inside the segment (an exporter's or a
    converter's integer cast where PyTorch kept the float, a ``.long()`` on a value that was not an index): every
    fraction is cut off.  Measured on the segment's own values; the fix keeps the value in float."""

    cause = Cause.DTYPE

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local):
            return None
        trips = [down for down in _round_trips(ctx) if not _pytorch_truncates(ctx, down)]
        values = ctx.computed([down.input[0] for down in trips])
        lost = {down.name: float(np.max(np.abs(v - np.trunc(v)))) for down in trips
                if (v := values.get(down.input[0])) is not None and v.size and np.isfinite(v).all()}
        lossy = [down for down in trips if lost.get(down.name, 0.0) > 0]
        if not lossy:
            return None
        worst = max(lossy, key=lambda d: lost[d.name])
        kind = TensorProto.DataType.Name(int(next(a.i for a in worst.attribute if a.name == "to"))).lower()
        summary = (f"{worst.name} casts the float value {worst.input[0]} to {kind} and the segment casts it back to "
                   f"float: its fractions are cut off (up to {lost[worst.name]:.3g}), where PyTorch keeps the value in "
                   f"float. The segment differs by {ctx.layer.local.max_abs:.2g}.")
        fix = (f"Keep {worst.input[0]} in float: remove the Cast pair around it (or make {worst.name} cast to the "
               "float type), and in PyTorch look for an integer cast (.long(), .int(), torch.floor_divide) the export "
               "kept where the model does not.")
        evidence = {"casts_to_integer": [d.name for d in lossy], "fraction_lost_max": lost,
                    "local_max_abs": ctx.layer.local.max_abs}
        names = [d.name for d in lossy]
        return Finding(self.cause, 0.9, summary, fix, evidence, changes=tuple(names),
                       counterfactual=lambda c: _kept_in_float(c, names))


def _round_trips(ctx: DiagnosisContext) -> list:
    """The segment's Casts from a float type to an integer type whose every reader is a Cast back to a float type."""
    graph, found = ctx.onnx.graph, []
    for down in ctx.segment_protos:
        to = next((a.i for a in down.attribute if a.name == "to"), None)
        if down.op_type != "Cast" or to not in INTEGER_TYPES or graph.elem_types.get(down.input[0]) not in FLOATS:
            continue
        readers = [graph.nodes[i] for i in graph.consumers.get(down.output[0], ())]
        if readers and all(r.op_type == "Cast" and graph.elem_types.get(r.outputs[0]) in FLOATS for r in readers):
            found.append(down)
    return found


def _pytorch_truncates(ctx: DiagnosisContext, down) -> bool:
    """Whether the value cast back to float is one of PyTorch's too (``.long().float()`` in the model, a
    division with ``rounding_mode="trunc"``): the truncation is the model's.  Where the value cast is one of
    PyTorch's as well, the truncated one must come after it (PyTorch truncates that value): an integer PyTorch
    computed before it (the grid cell a fractional offset was added to) only equals the truncation."""
    graph = ctx.onnx.graph
    backs = [graph.nodes[i].outputs[0] for i in graph.consumers.get(down.output[0], ())]
    values = ctx.computed([*backs, down.input[0]])
    before = [op.index for op in _holding(ctx, values.get(down.input[0]))]
    return any(op.index > min(before, default=-1) for t in backs for op in _holding(ctx, values.get(t)))


def _holding(ctx: DiagnosisContext, value) -> list:
    """PyTorch's float ops whose value ``value`` holds (allclose)."""
    if value is None or not value.size:
        return []
    return [op for op in ctx.ops if op.value.size == value.size and op.value.dtype.kind == "f"
            and ctx.compare(value, np.asarray(op.value).reshape(value.shape)).ok]


def _kept_in_float(ctx: DiagnosisContext, names: list[str]) -> FixedSegment:
    """The segment with each of the named casts to an integer type an Identity (its readers, Casts to float, then
    cast a float)."""
    model = edits.copy_model(ctx.onnx.skeleton)
    for name in names:
        node = edits.node(model, name)
        node.op_type = "Identity"
        del node.attribute[:]
    return FixedSegment(model, ctx.onnx.weights)
