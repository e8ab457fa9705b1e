"""Providers: resolve the requested execution-provider names into what this build can tell about each."""
from __future__ import annotations

import difflib

from ..errors import UsageError
from .kernels import CPU, describe_provider, known_providers
from .records import ProviderInfo


def resolve_providers(names: tuple[str, ...]) -> tuple[ProviderInfo, ...]:
    """Requested providers in priority order, plus ONNX Runtime's implicit CPU fallback when CPU is not listed.

    Raises UsageError for a name onnxruntime does not know at all.
    """
    known = known_providers()
    ordered: list[str] = []
    for name in names or (CPU,):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise UsageError(f"Unknown execution provider '{name}'.{hint} onnxruntime knows: {', '.join(known)}.")
        if name not in ordered:
            ordered.append(name)
    infos = [describe_provider(name) for name in ordered]
    if CPU not in ordered:
        infos.append(describe_provider(CPU, implicit=True))
    return tuple(infos)
