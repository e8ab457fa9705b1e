"""The honest fallback when no rule matches: say what was measured, nothing more."""
from __future__ import annotations

from collections import Counter

from ...records import LayerResult, Tolerance


def explain_unknown(layer: LayerResult, introduced: bool, tol: Tolerance) -> str:
    """Describe ``layer``'s divergence from the measured numbers alone."""
    p = layer.pair
    ops = ", ".join(f"{op}×{n}" if n > 1 else op for op, n in Counter(layer.segment_ops).items()) or p.op_type or "?"
    acc = f"{layer.diff.max_abs:.3g}" if layer.diff else "n/a"
    if introduced and layer.local is not None:
        return (
            f"Fed the exact reference (PyTorch) values at its inputs, the {len(layer.segment)}-node ONNX segment "
            f"computing {p.activation.name} ({ops}) still differs by max abs {layer.local.max_abs:.3g} "
            f"(max rel {layer.local.max_rel:.3g}, {layer.local.tol_ratio:.3g}× the tolerance "
            f"atol={tol.atol:g}, rtol={tol.rtol:g}); the error is introduced here, not inherited "
            f"(accumulated max abs {acc})."
        )
    return (
        f"No single segment exceeds the tolerance on its own, but errors build up: {p.activation.name} "
        f"({ops}) is the first aligned tensor whose accumulated error (max abs {acc}) exceeds "
        f"atol={tol.atol:g}, rtol={tol.rtol:g}. Small per-node differences are being amplified; "
        "consider a looser tolerance or checking for reduced precision upstream."
    )
