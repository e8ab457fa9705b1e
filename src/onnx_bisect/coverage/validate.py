"""Validation: onnx.checker, shape inference, and the model's IR and opset versions against the installed libraries."""
from __future__ import annotations

import functools
import re

import onnx

from .records import Validation, VersionCheck
from .schemas import normalise_domain
from ..records.graph import checkable_view

_OFFICIAL_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")


def validate_model(skeleton: onnx.ModelProto) -> tuple[Validation, onnx.ModelProto]:
    """Check ``skeleton`` (weights split off); return the findings and a copy carrying inferred types.

    Nothing here raises on a bad model: every failure becomes a finding, and the
    copy carries whatever types non-strict inference could still work out.
    """
    view = checkable_view(skeleton)
    checker_error = _first_line(_try(lambda: onnx.checker.check_model(view)))
    inference_error = None
    try:
        inferred = onnx.shape_inference.infer_shapes(view, check_type=True, strict_mode=True)
    except Exception as exc:
        inference_error = _first_line(exc)
        try:
            inferred = onnx.shape_inference.infer_shapes(view, strict_mode=False)
        except Exception:
            inferred = view
    versions, issues = _versions(skeleton), _name_issues(skeleton)
    too_new = any(v.ort_max is not None and v.version > v.ort_max for v in versions)
    return Validation(
        checker_error=checker_error, inference_error=inference_error, versions=tuple(versions),
        issues=tuple(issues), runtime_refuses=bool(issues) or too_new,
    ), inferred


def _versions(model: onnx.ModelProto) -> list[VersionCheck]:
    checks = [VersionCheck("IR", int(model.ir_version), onnx.IR_VERSION, ort_max_ir_version())]
    for entry in model.opset_import:
        domain = normalise_domain(entry.domain)
        if domain not in _OFFICIAL_DOMAINS:
            continue  # contrib and custom domains have no release-wide limit
        checks.append(VersionCheck(domain or "ai.onnx", int(entry.version), _onnx_max_opset(domain),
                                   ort_max_opset(domain)))
    return checks


def _name_issues(model: onnx.ModelProto) -> list[str]:
    seen: dict[str, int] = {}
    for node in model.graph.node:
        if node.name:
            seen[node.name] = seen.get(node.name, 0) + 1
    duplicates = sorted(name for name, n in seen.items() if n > 1)
    if not duplicates:
        return []
    shown = ", ".join(duplicates[:5]) + (f" (+{len(duplicates) - 5} more)" if len(duplicates) > 5 else "")
    return [f"duplicate node names ({shown}): onnx.checker accepts them but ONNX Runtime refuses to load the "
            "model; give every node a unique name."]


@functools.lru_cache(maxsize=None)
def _onnx_max_opset(domain: str) -> int | None:
    if domain == "":
        return onnx.defs.onnx_opset_version()
    found = [s.since_version for s in onnx.defs.get_all_schemas_with_history() if normalise_domain(s.domain) == domain]
    return max(found) if found else None


@functools.lru_cache(maxsize=1)
def ort_max_ir_version() -> int | None:
    """The highest model IR version onnxruntime loads, read from its own refusal of a newer one."""
    message = _ort_refusal(ir_version=10_000, domain="", opset=1)
    found = re.search(r"max supported IR version: (\d+)", message or "")
    return int(found.group(1)) if found else None


@functools.lru_cache(maxsize=None)
def ort_max_opset(domain: str) -> int | None:
    """The highest official opset of ``domain`` onnxruntime supports, read from its refusal of a newer one."""
    message = _ort_refusal(ir_version=7, domain=domain, opset=10_000)
    found = re.search(r"support for domain \S+ is till opset (\d+)", message or "")
    return int(found.group(1)) if found else None


def _ort_refusal(ir_version: int, domain: str, opset: int) -> str | None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    imports = [helper.make_opsetid("", opset if domain == "" else 13)]
    if domain:
        imports.append(helper.make_opsetid(domain, opset))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = ir_version
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return str(exc)
    return None


def _try(fn) -> Exception | None:
    try:
        fn()
    except Exception as exc:  # the checker and inference raise several types
        return exc
    return None


def _first_line(exc: Exception | None) -> str | None:
    if exc is None:
        return None
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
