"""Key/value caches of ``transformers`` decoders, as their users export and feed them.

A decoder built with ``use_cache=True`` returns a ``DynamicCache`` (an
encoder-decoder an ``EncoderDecoderCache``), which ``torch.export`` cannot
flatten until the cache classes are registered as pytree nodes; once they are
(:func:`register_caches`, transformers' own registration for ``torch.export``),
the cache's key/value tensors become graph outputs after the logits (the
*present* key/values of optimum's and onnxruntime-genai's decoders) and, given
as ``past_key_values``, graph inputs.  :func:`cache_from_arrays` builds the
PyTorch ``past_key_values`` from arrays named like those ONNX inputs.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError


def register_caches(model: Any) -> str | None:
    """Register the transformers cache classes as pytree nodes for ``torch.export`` (as transformers' own
    exporter does); return how, or None when ``model`` is no transformers model or nothing can register them."""
    if not _is_transformers(model):
        return None
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:
        register_cache_pytrees_for_model = None
    if register_cache_pytrees_for_model is not None:
        for m in _transformers_modules(model):
            register_cache_pytrees_for_model(m)
        return "transformers.exporters.exporter_dynamo.register_cache_pytrees_for_model"
    try:  # transformers 4.x
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:
        return None
    register_dynamic_cache_export_support()
    return "transformers.integrations.executorch.register_dynamic_cache_export_support"


def _is_transformers(model: Any) -> bool:
    return isinstance(model, torch.nn.Module) and any(True for _ in _transformers_modules(model))


def _transformers_modules(model: torch.nn.Module):
    """The transformers models inside ``model`` (itself included), outermost first, one per class."""
    seen = set()
    for m in model.modules():
        if type(m).__module__.startswith("transformers.") and hasattr(m, "config") and type(m) not in seen:
            seen.add(type(m))
            yield m


def is_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers key/value cache."""
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers.") for c in type(value).__mro__)


def cache_from_arrays(model: Any, layers: dict, where: str) -> Any:
    """A ``past_key_values`` for ``model`` from ``{layer: {key, value}}`` (a decoder) or
    ``{layer: {decoder: {key, value}, encoder: {key, value}}}`` (an encoder-decoder), as read from the ONNX
    input names ``past_key_values.<layer>.[decoder.|encoder.]key|value``: a ``DynamicCache`` (an
    ``EncoderDecoderCache``) for a transformers model, else a tuple of per-layer tuples."""
    order = _layer_order(layers, where)
    two_part = all(set(layers[i]) == {"decoder", "encoder"} for i in order)
    parts = ("decoder", "encoder") if two_part else (None,)
    data = []
    for i in order:
        entry = []
        for part in parts:
            kv = layers[i][part] if part else layers[i]
            if not isinstance(kv, dict) or set(kv) != {"key", "value"}:
                raise InputError(f"{where}: past key/values of layer {i} need a 'key' and a 'value' array (ONNX "
                                 f"inputs past_key_values.{i}.{part + '.' if part else ''}key / .value); found "
                                 f"{sorted(kv) if isinstance(kv, dict) else type(kv).__name__}.")
            entry.append((kv["key"], kv["value"]))
        data.append(entry)
    if not _is_transformers(model):
        return tuple(tuple(t for kv in entry for t in kv) for entry in data)
    from transformers import DynamicCache

    config = _text_config(model)
    if not two_part:
        return DynamicCache(ddp_cache_data=[e[0] for e in data], config=config)
    from transformers import EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(ddp_cache_data=[e[0] for e in data], config=config),
                               DynamicCache(ddp_cache_data=[e[1] for e in data], config=config))


def _layer_order(layers: dict, where: str) -> list:
    try:
        order = sorted(layers, key=int)
    except (TypeError, ValueError):
        raise InputError(f"{where}: past key/values are named by layer number (past_key_values.0.key, ...); found "
                         f"{sorted(map(str, layers))}.") from None
    if [int(i) for i in order] != list(range(len(order))):
        raise InputError(f"{where}: past key/values are given for layers {[int(i) for i in order]}; give every "
                         f"layer from 0 to {max(int(i) for i in order)}.")
    return order


def _text_config(model: torch.nn.Module):
    """The config a ``DynamicCache`` takes to lay out its layers (sliding windows), or None."""
    for m in _transformers_modules(model):
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "get_text_config"):
            return config
    return None
