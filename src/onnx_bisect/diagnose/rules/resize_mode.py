"""Resize: the ONNX Resize's mode / coordinate_transformation_mode / nearest_mode (a cubic one's cubic_coeff_a and
exclude_outside) do not compute what F.interpolate's mode and align_corners compute."""
from __future__ import annotations

from ..support import edits
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST_MODES = ("floor", "round_prefer_floor", "round_prefer_ceil", "ceil")
#: PyTorch's bicubic kernel: ``A = -0.75``, every tap kept (``exclude_outside=0``)
TORCH_CUBIC = (-0.75, 0)
UPSAMPLE_TYPES = {"Upsample": None, "UpsamplingBilinear2d": ("bilinear", True), "UpsamplingNearest2d": ("nearest", None)}


class ResizeMode(Rule):
    """Compare each Resize with the upsampling module, then find the Resize setting that reproduces PyTorch."""

    cause = Cause.RESIZE_MODE

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        resizes = [p for p in ctx.segment_protos if p.op_type == "Resize"]
        if not resizes or not ctx.significant(ctx.layer.local):
            return None
        torch_cfg = _torch_config(ctx)
        for proto in resizes:
            have = _config(proto)
            found = _search(ctx, proto, _preferred(torch_cfg))
            if found is None or found == have:
                continue
            as_torch = _as_interpolate(found)
            evidence = {"onnx_node": proto.name, "onnx_config": dict(zip(CONFIG_NAMES, have)),
                        "matching_config": dict(zip(CONFIG_NAMES, found)),
                        "pytorch": torch_cfg or "functional interpolate (no module configuration)",
                        "local_max_abs": ctx.layer.local.max_abs}
            summary = (f"Resize {proto.name} uses {_described(have)}, but PyTorch computes F.interpolate({as_torch}): "
                       f"the segment reproduces PyTorch only with {_described(found)}.")
            fix = (f"Set the Resize's attributes to {_described(found)}, or re-export with the same "
                   f"F.interpolate({as_torch}) the model uses.")
            return Finding(self.cause, 0.9, summary, fix, evidence, changes=(proto.name,),
                           counterfactual=lambda c, n=proto.name, f=found: FixedSegment(_set(c.onnx.skeleton, n, f),
                                                                                      c.onnx.weights))
        return None


#: the attributes a configuration tuple holds, in order
CONFIG_NAMES = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside")


def _config(proto) -> tuple:
    mode = attribute(proto, "mode", "nearest")
    cubic = (round(float(attribute(proto, "cubic_coeff_a", -0.75)), 6), int(attribute(proto, "exclude_outside", 0))) \
        if mode == "cubic" else (None, None)
    return (mode, attribute(proto, "coordinate_transformation_mode", "half_pixel"),
            attribute(proto, "nearest_mode", "round_prefer_floor") if mode == "nearest" else None, *cubic)


def _described(config: tuple) -> str:
    """``mode=..., coordinate_transformation_mode=...`` with the attributes that matter for the mode."""
    return ", ".join(f"{k}={v}" for k, v in zip(CONFIG_NAMES, config) if v is not None)


def _torch_config(ctx: DiagnosisContext) -> dict | None:
    for _, module in ctx.modules_near():
        kind = type(module).__name__
        if kind in UPSAMPLE_TYPES:
            fixed = UPSAMPLE_TYPES[kind]
            mode, align = fixed if fixed else (module.mode, module.align_corners)
            return {"module": kind, "mode": mode, "align_corners": align}
    return None


def _preferred(cfg: dict | None) -> list[tuple]:
    """Resize settings to try, the ones matching the module's configuration first."""
    combos = [("nearest", t, n, None, None) for t in TRANSFORMS for n in NEAREST_MODES]
    combos += [("linear", t, None, None, None) for t in TRANSFORMS]
    combos += [("cubic", t, None, *TORCH_CUBIC) for t in TRANSFORMS]
    if cfg:
        mode = {"nearest": "nearest", "nearest-exact": "nearest", "bicubic": "cubic"}.get(cfg["mode"], "linear")
        align = "align_corners" if cfg.get("align_corners") else None
        combos.sort(key=lambda c: (c[0] != mode, align is not None and c[1] != align))
    return combos


def _search(ctx: DiagnosisContext, proto, combos: list[tuple]) -> tuple | None:
    for combo in combos:
        try:
            values = ctx.run_segment(_set(ctx.onnx.skeleton, proto.name, combo), ctx.onnx.weights)
        except Exception:  # noqa: BLE001 - a setting the runtime rejects is simply not the answer
            continue
        if ctx.compare(values[ctx.tensor], ctx.reference).ok:
            return combo
    return None


def _set(skeleton, node: str, combo: tuple):
    model = edits.copy_model(skeleton)
    edits.set_attribute(model, node, "mode", combo[0])
    edits.set_attribute(model, node, "coordinate_transformation_mode", combo[1])
    for name, value in zip(CONFIG_NAMES[2:], combo[2:]):
        if value is not None:
            edits.set_attribute(model, node, name, value)
    return model


def _as_interpolate(combo: tuple) -> str:
    mode, transform = combo[:2]
    if mode == "nearest":
        return "mode='nearest'" if transform == "asymmetric" else "mode='nearest-exact'"
    name = "bilinear / linear / trilinear" if mode == "linear" else "bicubic"
    return f"mode='{name}', align_corners={transform == 'align_corners'}"
