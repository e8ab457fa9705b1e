"""Signatures of the PyTorch layers' weights, for anchoring them in a graph whose names say nothing.

A Linear's or a convolution's weight is copied into the ONNX file as an initializer (transposed, perhaps rounded
to float16): its size and the sum and sum of squares of its elements survive both, so a layer can be found by
its weight alone — in a file whose every name was replaced, and downstream of a fault, where no activation
value equals its tensor (:mod:`..align.anchors` uses them)."""
from __future__ import annotations

import numpy as np
import torch

from ..records import ModuleKind, module_kind


def weight_signatures(model: torch.nn.Module) -> dict[str, tuple[int, float, float]]:
    """``{module name: (elements, sum, sum of squares)}`` of each Linear's and convolution's weight (float64
    sums), modules sharing one weight left out (their weight anchors no single layer)."""
    found: dict[str, tuple[int, float, float]] = {}
    owners: dict[int, list[str]] = {}
    for name, m in model.named_modules():
        weight = getattr(m, "weight", None)
        if not name or module_kind(m) not in (ModuleKind.LINEAR, ModuleKind.CONV) or not isinstance(
                weight, torch.Tensor) or not weight.is_floating_point() or weight.is_meta:
            continue
        owners.setdefault(id(weight), []).append(name)
        w = weight.detach().to(torch.float64)
        found[name] = (int(w.numel()), float(w.sum()), float((w * w).sum()))
    shared = {n for names in owners.values() if len(names) > 1 for n in names}
    return {n: s for n, s in found.items() if n not in shared}


def signature_of(value: np.ndarray) -> tuple[int, float, float]:
    """The same signature of an ONNX initializer's value."""
    v = np.asarray(value, dtype=np.float64)
    return int(v.size), float(v.sum()), float((v * v).sum())
