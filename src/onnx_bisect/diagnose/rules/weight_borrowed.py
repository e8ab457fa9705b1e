"""A module computed with another module's parameters: the segment's initializers are exactly another module's
numbers (a port calling ``self.norm1`` where ``self.norm2`` was meant, a loader mapping ``ln_1`` / ``ln_2`` or
``attn_norm`` / ``ffn_norm`` keys the wrong way, a shared module where the model has two) while the divergent
module's own parameters of the same name and size hold other numbers.  Equal to a parameter, such an initializer
is no differing weight; with the divergent module's own put back, the segment must reproduce PyTorch."""
from __future__ import annotations

import numpy as np

from ..support import edits
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment
from .weight_params import parameter_holding, segment_initializers, weight_readers


def borrowed(ctx: DiagnosisContext) -> Finding | None:
    """The finding when the divergent module's own parameters in place of the other module's ones its segment
    reads reproduce PyTorch, else None."""
    module = ctx.layer.pair.activation.module
    target = ctx.torch_module(module) if module else None
    if target is None:
        return None
    own = {name: np.asarray(t.detach().double().cpu().numpy()) for name, t in
           [*target.named_parameters(recurse=False), *target.named_buffers(recurse=False)]
           if t is not None and t.is_floating_point()}
    fixes: dict[str, tuple[str, str, np.ndarray]] = {}  # initializer: (other's parameter, own parameter, value)
    for name in segment_initializers(ctx):
        value = ctx.initializer(name)
        if value is None or value.dtype.kind != "f" or value.size < 2 or not np.ptp(value):
            continue  # a constant of one number says nothing of whose it is
        step = float(np.finfo(value.dtype).eps)  # exactly, up to the rounding of the file's type (a float16 file's)
        holder = parameter_holding(ctx, value, rtol=step if step > 1e-6 else 0.0, atol=0.0)
        if holder is None or ctx.owns(module, holder):
            continue
        mine = own.get(holder.rpartition(".")[2])
        if mine is not None and mine.size == value.size and not np.allclose(
                mine.reshape(-1), value.astype(np.float64).reshape(-1), rtol=step if step > 1e-6 else 0.0, atol=0.0):
            fixes[name] = (holder, f"{module}.{holder.rpartition('.')[2]}", mine.reshape(value.shape))
    if not fixes:
        return None
    model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
    for name, (_, _, value) in fixes.items():
        model, weights = edits.replace_array(model, weights, name, value)
    fixed = FixedSegment(model, weights)
    if not ctx.reproduces(fixed):
        return None
    owners = sorted({holder.rpartition(".")[0] for holder, _, _ in fixes.values()})
    listed = "; ".join(f"'{n}' holds {holder} exactly where {module} reads {mine}" for n, (holder, mine, _)
                       in fixes.items())
    summary = (f"The segment computing {module} reads another module's parameters: {listed}. {module} is "
               f"computed with the parameters of {', '.join(owners)} — a port calling one module where another "
               "was meant, or a loader mapping checkpoint keys to the wrong module. With its own parameters back "
               "the segment reproduces PyTorch's output.")
    fix = (f"Load {module}'s own parameters (check the key mapping, or the module the forward calls there), or "
           "re-export from the PyTorch model.")
    rows = [{"initializer": n, "parameter": mine, "layout": f"holds {holder}"}
            for n, (holder, mine, _) in fixes.items()]
    return Finding(Cause.WEIGHT_MISMATCH, 0.9, summary, fix, {"parameters": rows},
                   changes=weight_readers(ctx, list(fixes)), counterfactual=lambda c, f=fixed: f)
