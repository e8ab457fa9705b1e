"""Classify: one status per node from the registry's verdicts, the session's placement, opset and risks."""
from __future__ import annotations

import re

from .opset import describe_need
from .records import (KernelCheck, KernelVerdict, NodeFinding, NodeInfo, OpsetNeed, Placement, ProviderInfo,
                      RegistryState, RiskFlag, Status)


def classify_node(node: NodeInfo, kernels: tuple[KernelCheck, ...], providers: tuple[ProviderInfo, ...],
                  placement: Placement | None, need: OpsetNeed | None, risks: tuple[RiskFlag, ...]) -> NodeFinding:
    """Most severe first: unsupported, falls back, needs newer opset, risky, ok.

    ``kernels`` follows ``providers`` (session priority order, the implicit CPU
    fallback last).  A session's placement, when there is one, overrides the
    registry's prediction: it is what ONNX Runtime actually did.
    """
    preferred = next((p.name for p in providers if p.state is not RegistryState.NOT_IN_BUILD), None)
    predicted = next((k for k in kernels if k.verdict.runs), None)
    runs_on, confirmed = (predicted.provider if predicted else None), None
    if placement is not None and placement.attempted:
        if node.key in placement.failed:
            runs_on, confirmed = None, predicted is None
        elif node.key in placement.assigned:
            actual = placement.assigned[node.key]
            confirmed = (predicted is not None and predicted.provider == actual
                         and predicted.verdict is not KernelVerdict.EXPANDED)  # an inlined node keeps no name
            runs_on = actual
        elif node.key in placement.expanded:
            confirmed = predicted is not None
    common = dict(node=node, kernels=kernels, runs_on=runs_on, confirmed=confirmed, opset=need, risks=risks)
    if runs_on is None:
        return NodeFinding(status=Status.UNSUPPORTED, reason=_unsupported_reason(kernels, placement, node), **common)
    verdict = next((k for k in kernels if k.provider == runs_on), None)
    why = next((k for k in kernels if k.provider == preferred), None)
    unassessed = why is not None and why.verdict is KernelVerdict.NOT_ASSESSED and confirmed is None
    if runs_on != preferred and not unassessed:
        if why is None or why.verdict is KernelVerdict.NOT_ASSESSED:
            gap = f"the session did not place it on {preferred}"
        elif why.verdict.runs:  # e.g. CUDA keeps shape computations on the CPU on purpose
            gap = f"{preferred} has a kernel but the session did not give it the node"
        else:
            gap = f"{preferred}: {why.detail or why.verdict.value}"
        return NodeFinding(status=Status.FALLS_BACK, reason=f"{gap}; runs on {runs_on}", **common)
    if verdict is not None and verdict.verdict is KernelVerdict.FLOAT32_VIA_CAST:
        return NodeFinding(status=Status.FALLS_BACK, reason=f"{runs_on}: {verdict.detail}", **common)
    if need is not None:
        return NodeFinding(status=Status.NEEDS_NEWER_OPSET, reason=describe_need(need, node.signature.op_type),
                           **common)
    if risks:
        slugs = sorted({s.value for r in risks for s in r.slugs})
        return NodeFinding(status=Status.RISKY, reason=f"[{', '.join(slugs)}] " + "; ".join(r.reason for r in risks),
                           **common)
    how = verdict.detail if verdict is not None and verdict.verdict is not KernelVerdict.SUPPORTED else "kernel"
    caveat = f"; placement on {preferred} not assessed ({why.detail})" if unassessed and runs_on != preferred else ""
    return NodeFinding(status=Status.OK, reason=f"{runs_on}: {how}{caveat}", **common)


def _unsupported_reason(kernels: tuple[KernelCheck, ...], placement: Placement | None, node: NodeInfo) -> str:
    refused = placement is not None and node.key in placement.failed
    predicted = next((k for k in kernels if k.verdict.runs), None)
    if refused and predicted is not None:
        return (f"ONNX Runtime refused it ({_short(placement.failed[node.key])}) although the registry suggests "
                f"{predicted.provider}: {predicted.detail or predicted.verdict.value}")
    assessed = [k for k in kernels if k.verdict is not KernelVerdict.NOT_ASSESSED]
    parts = [f"{k.provider}: {k.detail or k.verdict.value}" for k in assessed]
    if not assessed:
        parts = ["no requested provider's registry is available in this build"]
    if refused:
        parts.append("confirmed by an ONNX Runtime session")
    return "; ".join(parts)


def _short(error: str) -> str:
    found = re.search(r"(Could not find an implementation for \S+|\S+ is not a registered function/op)", error)
    return found.group(1) if found else error[:120]
