"""Opset triage: which nodes use an operator definition newer than the ``--opset`` target."""
from __future__ import annotations

from .records import NodeInfo, OpsetNeed
from .schemas import schema_at, versions


def opset_need(node: NodeInfo, target: int) -> OpsetNeed | None:
    """Why ``node`` does not exist as-is at ``target`` (ai.onnx nodes only), or None when it does.

    The node uses the definition introduced at its since-version.  At an older
    opset the op either does not exist yet, or has an earlier definition; when
    that one cannot take the node's inputs, attributes and types, the node must
    be rewritten.
    """
    sig = node.signature
    if sig.domain or sig.since_version is None or sig.since_version <= target:
        return None
    history = versions(sig.domain, sig.op_type)
    older = [v for v in history if v <= target]
    target_version = older[-1] if older else None
    return OpsetNeed(target=target, since_version=sig.since_version, target_version=target_version,
                     introduced=history[0] if history else None,
                     difference=_difference(node, target_version) if target_version is not None else "absent")


def _difference(node: NodeInfo, version: int) -> str | None:
    """What the op's definition at ``version`` cannot express of ``node``; None when the signature fits."""
    old = schema_at(node.signature.domain, node.signature.op_type, version)
    if old is None:
        return None
    used_inputs = max((i + 1 for i, name in enumerate(node.inputs) if name), default=0)
    if used_inputs > old.max_inputs:
        return f"it takes {old.max_inputs} input(s) there, the node uses {used_inputs}"
    unknown = sorted(name for name, _ in node.attributes if name not in old.attributes)
    if unknown:
        return f"no attribute {', '.join(unknown)} there"
    allowed = dict(old.allowed)
    for name, types in node.type_bindings:
        if name in allowed and not set(types) <= allowed[name]:
            bad = ", ".join(t[7:-1] if t.startswith("tensor(") else t for t in sorted(set(types) - allowed[name]))
            return f"{name}={bad} is not allowed there"
    return None


def describe_need(need: OpsetNeed, op_type: str) -> str:
    """One line for the report."""
    if need.target_version is None:
        return f"{op_type} does not exist before opset {need.introduced} (target {need.target}): decompose it"
    head = f"{op_type}-{need.since_version} is newer than opset {need.target}, which has {op_type}-{need.target_version}"
    if need.difference is None:
        return f"{head} with the same inputs, attributes and types: re-exporting at {need.target} should give it " \
               "(check the operator changelog for semantic changes)"
    return f"{head}; {need.difference}: rewrite the node"
