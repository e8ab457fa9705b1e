"""How nested PyTorch values (outputs, arguments) are flattened and named, as every stage sees them.

The paths (``[0]``, ``[logits]``) name activations and graph inputs alike, in
the order the exporters flatten them.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch


def flatten_outputs(value: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(path, tensor)`` for every tensor in a nested output, in exporter order.

    Tuples and lists give ``[i]``, dicts (and transformers' ModelOutput) give
    ``[key]``; ``None`` and non-tensor leaves are skipped, as the exporters do.
    """
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from flatten_outputs(item, f"{path}[{key}]")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from flatten_outputs(item, f"{path}[{i}]")


def to_numpy(tensor: torch.Tensor, copy: bool = False) -> np.ndarray:
    """A CPU numpy array of ``tensor``; bfloat16 becomes float32, which numpy lacks."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    elif copy:
        t = t.clone()
    if t.is_conj():
        t = t.resolve_conj()
    return t.cpu().numpy()
