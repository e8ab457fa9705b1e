"""How nested PyTorch values (outputs, arguments) are flattened and named, as every stage sees them.

The paths (``[0]``, ``[logits]``, ``[past_key_values][0][key]``) name
activations and graph inputs alike, in the order the exporters flatten them:
tuples and lists by position, dicts by key, and any container registered as a
``torch.utils._pytree`` node (a ``transformers`` Cache once registered for
``torch.export``) in its registered order.  :func:`canonical` turns such a path,
or an ONNX input or output name in the layouts decoders ship with
(``past_key_values.0.key``, ``present.0.key``,
``input.past_key_values.layers.0.keys``), into one comparable key.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils import _pytree

__all__ = ["canonical", "flatten_outputs", "node_children", "to_numpy"]


def flatten_outputs(value: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(path, tensor)`` for every tensor in a nested output, in exporter order.

    Tuples and lists give ``[i]``, dicts (and transformers' ModelOutput) give
    ``[key]``, registered pytree containers their children (a Cache's layers as
    ``[i][key]`` / ``[i][value]``); ``None`` and other leaves are skipped, as
    the exporters do.
    """
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from flatten_outputs(item, f"{path}[{key}]")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from flatten_outputs(item, f"{path}[{i}]")
    else:
        for key, item in node_children(value) or ():
            yield from flatten_outputs(item, f"{path}[{key}]")


def node_children(value: Any) -> list[tuple[Any, Any]] | None:
    """The named children of a container registered as a pytree node (None for anything else).

    A key/value cache (``layers`` with ``keys``/``values``, or an encoder-decoder
    cache of two such) is named by layer; its names are kept only when they list
    the registered flatten's tensors in the same order, so positions never move.
    """
    node = _pytree.SUPPORTED_NODES.get(type(value))
    named = _cache_children(value)
    if node is None:
        return named
    children, _ = node.flatten_fn(value)
    if named is not None and [id(t) for _, t in flatten_outputs(dict(named))] == \
            [id(t) for _, t in flatten_outputs(list(children))]:
        return named
    return list(enumerate(children))


def _cache_children(value: Any) -> list[tuple[Any, Any]] | None:
    """A transformers cache by layer (``{i: {key, value}}``), or its self- and cross-attention caches."""
    layers = getattr(value, "layers", None)
    if isinstance(layers, list) and layers and all(hasattr(layer, "is_initialized") or hasattr(layer, "keys")
                                                   for layer in layers):
        return [(i, {"key": layer.keys, "value": layer.values}) for i, layer in enumerate(layers)
                if isinstance(getattr(layer, "keys", None), torch.Tensor)
                and isinstance(getattr(layer, "values", None), torch.Tensor)]
    parts = [(n, getattr(value, n)) for n in ("self_attention_cache", "cross_attention_cache") if hasattr(value, n)]
    return parts if len(parts) == 2 else None


#: names of cache parts in each layout, mapped to one spelling
_SYNONYMS = {"keys": "key", "values": "value", "present": "past_key_values", "past": "past_key_values",
             "self_attention_cache": "decoder", "cross_attention_cache": "encoder"}
_PREFIXES = ("input", "output", "inputs", "outputs")


def canonical(name: str) -> tuple[str, ...]:
    """One key for a nested path or an ONNX input/output name, whatever the layout.

    ``past_key_values[0][key]``, ``past_key_values.0.key``, ``present.0.key``
    and ``input.past_key_values.layers.0.keys`` all become
    ``('past_key_values', '0', 'key')``; an encoder-decoder cache's
    ``[self_attention_cache][0][key]`` and optimum's ``past_key_values.0.decoder.key``
    become ``('past_key_values', '0', 'decoder', 'key')``.
    """
    parts = [p for p in re.split(r"[.\[\]]+", name) if p]
    if len(parts) > 1 and parts[0] in _PREFIXES:
        parts = parts[1:]
    parts = [_SYNONYMS.get(p, p) for p in parts]
    if parts[:1] == ["past_key_values"]:
        rest = [p for p in parts[1:] if p != "layers"]
        if rest[:1] in (["decoder"], ["encoder"]) and len(rest) > 1:  # cache part first, then the layer: swap
            rest = [rest[1], rest[0], *rest[2:]]
        parts = ["past_key_values", *rest]
    return tuple(parts)


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


def informative(value: np.ndarray) -> bool:
    """Whether a value holds more than one distinct number (a Softmax over an axis of size 1, a mask of ones,
    zero initial states do not: they equal every op holding that number)."""
    flat = np.asarray(value).reshape(-1)
    return flat.size > 1 and bool(np.any(flat != flat[0]))
