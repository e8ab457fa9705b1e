"""Operator schemas: onnx's own, and onnxruntime's for the domains onnx does not define (com.microsoft ...)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx.defs

VARIADIC = "variadic"


@dataclass(frozen=True)
class Schema:
    """The parts of an operator schema the triage needs."""

    domain: str
    op_type: str
    since_version: int
    inputs: tuple[tuple[str, str], ...]  # (type string or constraint name, option) per formal input
    outputs: tuple[tuple[str, str], ...]
    constraints: frozenset[str]
    has_function: bool  # a context-dependent function body (built for any opset)
    allowed: tuple[tuple[str, frozenset[str]], ...] = ()  # constraint -> allowed type strings
    attributes: frozenset[str] = frozenset()
    max_inputs: int = 2**31 - 1
    function_opsets: tuple[int, ...] = ()  # opsets for which onnx defines a fixed function body

    def inlinable_at(self, opset: int) -> bool:
        """Whether a runtime can replace the op by its function body in a model importing ``opset``."""
        return self.has_function or any(v <= opset for v in self.function_opsets)


def normalise_domain(domain: str) -> str:
    """``ai.onnx`` and ``""`` are the same domain."""
    return "" if domain == "ai.onnx" else domain


@functools.lru_cache(maxsize=1)
def _onnx_history() -> dict[tuple[str, str], tuple]:
    table: dict[tuple[str, str], list] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        table.setdefault((normalise_domain(schema.domain), schema.name), []).append(schema)
    return {key: tuple(sorted(value, key=lambda s: s.since_version)) for key, value in table.items()}


@functools.lru_cache(maxsize=1)
def _ort_schemas() -> dict[tuple[str, str], object]:
    """onnxruntime's contrib schemas (latest version of each op only)."""
    try:
        from onnxruntime.capi import _pybind_state as ort_c

        schemas = ort_c.get_all_operator_schema()
    except Exception:  # a minimal build without schema introspection
        return {}
    return {(normalise_domain(s.domain), s.name): s for s in schemas}


def versions(domain: str, op_type: str) -> tuple[int, ...]:
    """Every opset version in which onnx (re)defined the op, ascending; () when onnx does not know it."""
    return tuple(s.since_version for s in _onnx_history().get((normalise_domain(domain), op_type), ()))


def schema_at(domain: str, op_type: str, version: int) -> Schema | None:
    """onnx's schema of the op as defined at exactly ``version`` (a since-version), if any."""
    for s in _onnx_history().get((normalise_domain(domain), op_type), ()):
        if s.since_version == version:
            return _from_onnx(s)
    return None


def find_schema(domain: str, op_type: str, opset: int | None) -> Schema | None:
    """The schema in force at ``opset`` of ``domain``; None for unknown (custom) ops."""
    domain = normalise_domain(domain)
    if opset is None:
        return None
    history = _onnx_history().get((domain, op_type))
    if history:
        chosen = [s for s in history if s.since_version <= opset]
        return _from_onnx(chosen[-1]) if chosen else None
    ort_schema = _ort_schemas().get((domain, op_type))
    if ort_schema is not None and ort_schema.since_version <= opset:
        return _from_ort(ort_schema)
    return None


def _option(opt) -> str:
    return VARIADIC if getattr(opt, "name", str(opt)).lower().endswith("variadic") else "single"


@functools.lru_cache(maxsize=None)
def _from_onnx(s) -> Schema:
    return Schema(
        domain=normalise_domain(s.domain), op_type=s.name, since_version=s.since_version,
        inputs=tuple((p.type_str, _option(p.option)) for p in s.inputs),
        outputs=tuple((p.type_str, _option(p.option)) for p in s.outputs),
        constraints=frozenset(c.type_param_str for c in s.type_constraints),
        has_function=bool(s.has_context_dependent_function),
        function_opsets=tuple(getattr(s, "function_opset_versions", ()) or ((s.since_version,) if s.has_function else ())),
        allowed=tuple((c.type_param_str, frozenset(c.allowed_type_strs)) for c in s.type_constraints),
        attributes=frozenset(s.attributes), max_inputs=int(s.max_input),
    )


@functools.lru_cache(maxsize=None)
def _from_ort(s) -> Schema:
    return Schema(
        domain=normalise_domain(s.domain), op_type=s.name, since_version=s.since_version,
        inputs=tuple((p.typeStr, _option(p.option)) for p in s.inputs),
        outputs=tuple((p.typeStr, _option(p.option)) for p in s.outputs),
        constraints=frozenset(c.type_param_str for c in s.type_constraints),
        has_function=False,
    )


def bind_types(schema: Schema, input_types: list[str | None], output_types: list[str | None]) -> dict[str, set[str]]:
    """Which concrete types the node binds to each type constraint (``T`` -> {"tensor(float16)"})."""
    bound: dict[str, set[str]] = {}
    for formals, actual in ((schema.inputs, input_types), (schema.outputs, output_types)):
        for i, type_str in enumerate(actual):
            if type_str is None or not formals:
                continue
            if i < len(formals):
                name = formals[i][0]
            elif formals[-1][1] == VARIADIC:
                name = formals[-1][0]
            else:
                continue
            if name in schema.constraints:
                bound.setdefault(name, set()).add(type_str)
    return bound
