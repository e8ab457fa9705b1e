"""Training mode: the graph was exported in training mode (active Dropout, BatchNorm on batch statistics),
or PyTorch itself is not deterministic (two runs on the same input differ)."""
from __future__ import annotations

import numpy as np
from onnx import helper

from ..support import edits
from ..support.masks import dropout_probability
from ...records import Cause
from ...records.graph import input_free
from ...records.nest import to_numpy
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

FIX = ("Call model.eval() before exporting (TorchScript exporter: training=torch.onnx.TrainingMode.EVAL), so "
       "Dropout is the identity and BatchNorm uses its running statistics.")


class TrainingMode(Rule):
    """Find Dropout nodes that drop and BatchNormalization nodes that use the batch's statistics."""

    cause = Cause.TRAINING_MODE

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local):
            return None
        dropouts = [p for p in ctx.segment_protos if p.op_type == "Dropout" and _dropout_active(ctx, p)]
        dropouts += [p for p in ctx.segment_protos if p.op_type == "Mul" and _baked_mask(ctx, p) is not None]
        norms = [p for p in ctx.segment_protos if p.op_type == "BatchNormalization" and attribute(p, "training_mode", 0)]
        if norms:  # batch statistics of a weight are the model's own (weight standardisation), not a training export
            weights = input_free(ctx.onnx.skeleton.graph)
            norms = [p for p in norms if p.input[0] not in weights]
        if not dropouts and not norms:
            return None
        evidence = {"active_dropout_nodes": [p.name for p in dropouts],
                    "dropout_ratios": [_ratio(ctx, p) for p in dropouts],
                    "batch_statistics_nodes": [p.name for p in norms], "local_max_abs": ctx.layer.local.max_abs}
        if norms:
            evidence["batch_vs_running_mean_max_abs"] = _batch_vs_running(ctx, norms[0])
        what = []
        if dropouts:
            what.append(f"{len(dropouts)} Dropout node(s) ({', '.join(p.name for p in dropouts)}) drop values "
                        + ("at random" if all(p.op_type == "Dropout" for p in dropouts) else
                           "(a Mul by a mask of zeros and 1/(1−p): a Dropout's mask frozen into the graph)"))
        if norms:
            what.append(f"{len(norms)} BatchNormalization node(s) ({', '.join(p.name for p in norms)}) normalize with "
                        "the batch's own mean and variance (training_mode=1)")
        summary = ("The ONNX graph was exported in training mode: " + " and ".join(what)
                   + "; PyTorch ran in eval mode.")
        # a frozen mask is read from its values alone: unconfirmed, it is a lead, not a cause
        confidence = 0.8 if dropouts and not norms and all(p.op_type == "Mul" for p in dropouts) else 0.9
        return Finding(self.cause, confidence, summary, FIX, evidence,
                       counterfactual=lambda c: _eval_mode(c, dropouts, norms))


class NondeterministicReference(Rule):
    """Run PyTorch again on the same input: a reference that changes between runs cannot be matched."""

    cause = Cause.TRAINING_MODE
    expensive = True  # one more PyTorch forward pass

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if ctx.baseline.inputs is None or ctx.baseline.loaded.module is None or not ctx.significant(ctx.layer.local):
            return None
        import torch  # noqa: PLC0415 - only this rule runs PyTorch

        module = ctx.torch_module()
        seen = []
        # a copy: the model may change the output in place after the hook (OLMo clamps q/k/v with clamp_)
        handle = module.register_forward_hook(lambda m, args, out: seen.append(_copy(_first_tensor(out)))) \
            if module is not None else None
        clone = (lambda v: v.clone() if isinstance(v, torch.Tensor) else v)
        try:
            with torch.no_grad():
                ctx.baseline.loaded.module(*[clone(a) for a in ctx.baseline.inputs.args], **{k: clone(v) for k, v in ctx.baseline.inputs.kwargs.items()})
        finally:
            if handle is not None:
                handle.remove()
        # The module's own output on the same call (an op-level layer is compared through its module).
        act = ctx.layer.pair.activation
        if act.op:
            act = ctx.activation_of(act.module)
        if act is None or len(seen) <= act.call or seen[act.call] is None:
            return None
        again = to_numpy(seen[act.call])
        first = act.value
        if again.shape != first.shape:
            return None
        diff = ctx.compare(again, first)
        if diff.ok:
            return None
        name = ctx.layer.pair.activation.name
        summary = (f"PyTorch is not deterministic here: running the model twice on the same input changes "
                   f"{name}'s output by up to {diff.max_abs:.2g}, so no ONNX graph can match it (an active Dropout, "
                   "a module left in training mode or a random op in forward).")
        fix = ("Make the reference deterministic: model.eval(), no F.dropout(..., training=True) or random ops in "
               "forward; seed and fix the randomness if it is intended.")
        return Finding(self.cause, 0.8, summary, fix, {"pytorch_run_to_run_max_abs": diff.max_abs, "module": name})


def _dropout_active(ctx: DiagnosisContext, p) -> bool:
    if len(p.input) > 2 and p.input[2]:
        flag = ctx.constant(p.input[2])
        return flag is None or bool(np.asarray(flag).reshape(-1)[0])  # a runtime flag: assume it may be on
    return attribute(p, "is_test", 1) == 0  # opset < 7


def _baked_mask(ctx: DiagnosisContext, p) -> tuple[str, float] | None:
    """``(the input the Mul scales, the drop probability)`` when ``p`` multiplies a computed tensor by a constant
    mask of zeros and 1/(1−p) (:func:`~..support.masks.dropout_probability`); None otherwise."""
    if len(p.input) != 2:
        return None
    for i in (0, 1):
        drop = dropout_probability(ctx.constant(p.input[i]))
        if drop is not None and ctx.constant(p.input[1 - i]) is None:
            return p.input[1 - i], drop
    return None


def _ratio(ctx: DiagnosisContext, p) -> float | None:
    if p.op_type == "Mul":
        return round(_baked_mask(ctx, p)[1], 4)
    if len(p.input) > 1 and p.input[1]:
        value = ctx.constant(p.input[1])
        return None if value is None else float(np.asarray(value).reshape(-1)[0])
    return float(attribute(p, "ratio", 0.5))


def _batch_vs_running(ctx: DiagnosisContext, bn) -> float | None:
    x = ctx.run_segment(outputs=[bn.input[0]]).get(bn.input[0])
    mean = ctx.constant(bn.input[3])
    if x is None or mean is None or x.ndim < 2:
        return None
    batch = x.astype(np.float64).mean(axis=tuple(i for i in range(x.ndim) if i != 1))
    return float(np.max(np.abs(batch - mean)))


def _eval_mode(ctx: DiagnosisContext, dropouts, norms) -> FixedSegment:
    model = edits.copy_model(ctx.onnx.skeleton)
    for p in dropouts:
        node = edits.node(model, p.name)
        kept = _baked_mask(ctx, p)[0] if p.op_type == "Mul" else node.input[0]
        identity = helper.make_node("Identity", [kept], [node.output[0]], name=node.name)
        node.CopyFrom(identity)
    for p in norms:
        node = edits.node(model, p.name)
        edits.set_attribute(model, p.name, "training_mode", 0)
        del node.output[1:]
    return FixedSegment(model, ctx.onnx.weights)


def _copy(tensor):
    return None if tensor is None else tensor.detach().clone()


def _first_tensor(out):
    if hasattr(out, "detach"):
        return out
    if isinstance(out, (tuple, list)):
        return next((o for o in out if hasattr(o, "detach")), None)
    if isinstance(out, dict):
        return next((o for o in out.values() if hasattr(o, "detach")), None)
    return None
