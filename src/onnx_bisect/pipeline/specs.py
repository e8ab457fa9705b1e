"""What the user asked to verify, parsed from the command line: axes to vary, providers, session entries.

Kept free of torch and onnxruntime so usage errors answer at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..errors import UsageError


@dataclass(frozen=True)
class AxisSpec:
    """One dimension to vary: ``axis`` of the named inputs (all inputs sharing it when ``inputs`` is empty)."""

    axis: int
    sizes: tuple[int, ...]
    inputs: tuple[str, ...] = ()
    label: str = ""

    @property
    def name(self) -> str:
        """How the axis is shown: ``batch``, ``dim1`` or ``input_ids[1]``."""
        if self.label:
            return self.label
        return f"{','.join(self.inputs)}[{self.axis}]" if self.inputs else f"dim{self.axis}"


def parse_sizes(text: str, option: str) -> tuple[int, ...]:
    """``"1,8,64"`` → ``(1, 8, 64)``; a usage error names the option otherwise."""
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"{option} takes a comma-separated list of positive sizes, e.g. 1,8,64 (got {text!r}).")
    return tuple(dict.fromkeys(sizes))


def parse_vary(text: str) -> AxisSpec:
    """``--vary AXIS=SIZES`` or ``--vary INPUT[,INPUT]:AXIS=SIZES``."""
    spec, sep, sizes = text.partition("=")
    names, _, axis = spec.rpartition(":")
    if not sep or not axis.strip().lstrip("-").isdigit():
        raise UsageError(f"--vary takes AXIS=SIZES or INPUT:AXIS=SIZES, e.g. 1=32,128 or input_ids:1=32,128 "
                         f"(got {text!r}).")
    inputs = tuple(n.strip() for n in names.split(",") if n.strip())
    return AxisSpec(axis=int(axis), sizes=parse_sizes(sizes, "--vary"), inputs=inputs)


def parse_provider(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``NAME`` or ``NAME:key=value,key=value`` (provider options), e.g. ``CUDAExecutionProvider:device_id=0``."""
    name, _, opts = text.partition(":")
    options = []
    for item in (o for o in opts.split(",") if o.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"Provider options take key=value pairs, e.g. CUDAExecutionProvider:device_id=0 "
                             f"(got {text!r}).")
        options.append((key.strip(), value.strip()))
    if not name.strip():
        raise UsageError(f"--provider needs a provider name, e.g. CPUExecutionProvider (got {text!r}).")
    return name.strip(), tuple(options)


def parse_config_entries(items: Iterable[str], option: str) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` strings (also comma-separated within one item) → pairs."""
    pairs = []
    for item in items:
        for kv in (x for x in item.split(",") if x.strip()):
            key, sep, value = kv.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"{option} takes KEY=VALUE, got {kv!r}.")
            pairs.append((key.strip(), value.strip()))
    return tuple(pairs)
