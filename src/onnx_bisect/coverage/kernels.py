"""Kernel matching against ONNX Runtime's own kernel registry (``get_all_opkernel_def``).

A kernel def names a provider, a domain, an op, an inclusive since-version
range and, per type constraint, the types it was registered for.  ONNX Runtime
looks a node up by its schema's since-version and the types bound to each
constraint; this module does the same, so the answer comes from the installed
build, not from a table.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .records import KernelCheck, KernelVerdict, NodeInfo, ProviderInfo, RegistryState

CPU = "CPUExecutionProvider"
_OPEN_END = 2**31 - 1


@dataclass(frozen=True)
class _Kernel:
    start: int
    end: int
    constraints: tuple[tuple[str, frozenset[str]], ...]

    def accepts(self, bindings: dict[str, set[str]]) -> bool:
        return all(name not in bindings or bindings[name] <= allowed for name, allowed in self.constraints)


@functools.lru_cache(maxsize=1)
def _registry() -> dict[tuple[str, str, str], tuple[_Kernel, ...]]:
    from onnxruntime.capi import _pybind_state as ort_c

    table: dict[tuple[str, str, str], list[_Kernel]] = {}
    for d in ort_c.get_all_opkernel_def():
        start, end = d.version_range
        constraints = tuple((k, frozenset(v)) for k, v in d.type_constraints.items())
        table.setdefault((d.provider, "" if d.domain == "ai.onnx" else d.domain, d.op_name), []).append(
            _Kernel(int(start), int(end), constraints))
    return {k: tuple(v) for k, v in table.items()}


@functools.lru_cache(maxsize=1)
def _kernel_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for (provider, _, _), kernels in _registry().items():
        counts[provider] = counts.get(provider, 0) + len(kernels)
    return counts


def known_providers() -> tuple[str, ...]:
    """Every execution provider name onnxruntime knows, built in or not."""
    import onnxruntime as ort

    return tuple(ort.get_all_providers())


def describe_provider(name: str, implicit: bool = False) -> ProviderInfo:
    """Whether this build has ``name`` and a kernel registry for it (``name`` must be a known provider)."""
    import onnxruntime as ort

    if name not in ort.get_available_providers():
        return ProviderInfo(name, RegistryState.NOT_IN_BUILD, 0, implicit)
    count = _kernel_counts().get(name, 0)
    return ProviderInfo(name, RegistryState.KERNELS if count else RegistryState.NO_STATIC_REGISTRY, count, implicit)


def check_kernel(node: NodeInfo, provider: ProviderInfo) -> KernelCheck:
    """Can ``provider`` run ``node``?  The registry's answer, with the reason when it cannot."""
    sig = node.signature
    if provider.state is not RegistryState.KERNELS:
        return KernelCheck(provider.name, KernelVerdict.NOT_ASSESSED, provider.state.value)
    if sig.op_type == "Constant" and sig.domain == "":
        return KernelCheck(provider.name, KernelVerdict.SUPPORTED, "becomes an initializer when the model loads")
    kernels = _registry().get((provider.name, sig.domain, sig.op_type), ())
    if sig.since_version is None:
        what = "no schema in onnx or onnxruntime"
        if not kernels:
            return KernelCheck(provider.name, KernelVerdict.NO_KERNEL, f"{what} and no kernel: a custom op")
        in_range = kernels  # a custom-op library's kernel: nothing to check the version against
    else:
        in_range = tuple(k for k in kernels if k.start <= sig.since_version <= k.end)
    bindings = {name: set(types) for name, types in node.type_bindings}
    if any(k.accepts(bindings) for k in in_range):
        return KernelCheck(provider.name, KernelVerdict.SUPPORTED)
    if node.has_function:
        # ONNX Runtime inlines a function-bodied op that no provider has a kernel for.
        return KernelCheck(provider.name, KernelVerdict.EXPANDED, "no kernel; ONNX Runtime inlines its function body")
    if provider.name == CPU and _any_float16(bindings):
        widened = {k: {_widen(t) for t in v} for k, v in bindings.items()}
        if any(k.accepts(widened) for k in in_range):
            # InsertCastTransformer: float16 nodes without a CPU kernel get Casts to float32 around them.
            return KernelCheck(provider.name, KernelVerdict.FLOAT32_VIA_CAST,
                               "no float16 kernel; ONNX Runtime inserts Casts and computes in float32")
    if not kernels:
        return KernelCheck(provider.name, KernelVerdict.NO_KERNEL, f"no {sig.op_type} kernel at all")
    if not in_range:
        ranges = ", ".join(sorted({_range(k) for k in kernels}))
        return KernelCheck(provider.name, KernelVerdict.NO_KERNEL_FOR_VERSION,
                           f"no kernel for version {sig.since_version} (kernels cover {ranges})")
    return KernelCheck(provider.name, KernelVerdict.NO_KERNEL_FOR_TYPES, _type_gap(bindings, in_range))


def _any_float16(bindings: dict[str, set[str]]) -> bool:
    return any("float16)" in t and "bfloat16" not in t for types in bindings.values() for t in types)


def _widen(type_str: str) -> str:
    return type_str.replace("(float16)", "(float)") if "bfloat16" not in type_str else type_str


def _range(k: _Kernel) -> str:
    return f"{k.start}+" if k.end >= _OPEN_END else (f"{k.start}" if k.start == k.end else f"{k.start}-{k.end}")


def _type_gap(bindings: dict[str, set[str]], kernels: tuple[_Kernel, ...]) -> str:
    """Name the constraint whose bound type no kernel accepts, and what is available."""
    for name, types in sorted(bindings.items()):
        available: set[str] = set()
        constrained = False
        for k in kernels:
            for cname, allowed in k.constraints:
                if cname == name:
                    constrained = True
                    available |= allowed
        if constrained and not types <= available:
            have = ", ".join(sorted(_short(t) for t in available))
            want = ", ".join(sorted(_short(t) for t in types))
            return f"no kernel for {name}={want} (kernels for {have})"
    return "no kernel for this combination of input types"


def _short(type_str: str) -> str:
    return type_str[7:-1] if type_str.startswith("tensor(") else type_str
