"""Export triage: what each exporter could not export, read from its failure (the exports themselves are
the source stage's)."""
from __future__ import annotations

import collections

import onnx
import torch

from .export_problems import problems_from_exception, source_from_stack
from .records import ExportAttempt, ExportProblem, ProblemKind, SourceLine


def attempt(exporter: str, proto: onnx.ModelProto | None, problems, seconds: float) -> ExportAttempt:
    """The record of one exporter's attempt: whether it produced a model, its problems, the ops it produced."""
    return ExportAttempt(
        exporter=exporter, ok=proto is not None, seconds=seconds, problems=tuple(problems),
        onnx_ops=_op_counts(proto) if proto is not None else (),
        opset=next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
        if proto is not None else None,
    )


def translation_problems(program, exc: BaseException, user_file: str | None) -> list[ExportProblem]:
    """A dynamo translation failure: every FX node without an ONNX translation, then what the exception adds."""
    listed = untranslatable(program, user_file)
    reported = problems_from_exception("dynamo", exc, user_file, program=program)
    seen = {p.operator for p in listed}
    return listed + [p for p in reported if p.operator not in seen]


def is_translation_failure(exc: BaseException) -> bool:
    """Whether a dynamo export failed while translating an FX node (not while capturing the program)."""
    return "translating node" in _text(exc)


def untranslatable(program, user_file: str | None) -> list[ExportProblem]:
    """Every FX node the ONNX registry has no translation for (not just the first the exporter hit).

    Uses the exporter's internal registry and dispatcher; when those move,
    this returns [] and the exporter's own error still names the first failure.
    """
    try:
        from torch.onnx._internal.exporter import _core, _dispatching, _registration

        registry = _registration.ONNXRegistry.from_torchlib()
        decomposed = _core._prepare_exported_program_for_export(program, registry=registry)
        problems, seen = [], set()
        for node in decomposed.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            function, message = _dispatching.dispatch(node, registry)
            if function is not None:
                continue
            source = source_from_stack(node.meta.get("stack_trace") or "", user_file)
            key = (str(node.target), source)
            if key in seen:
                continue
            seen.add(key)
            problems.append(ExportProblem("dynamo", ProblemKind.NO_LOWERING, str(node.target), source,
                                          f"No ONNX function found for {node.target}. {message.strip()}"[:300]))
        return problems
    except Exception:  # noqa: BLE001 - an internal API that may move: the exporter's own message remains
        return []


def specialisations(caught) -> list[ExportProblem]:
    """The TorchScript tracer's warnings that a Python value was baked into the trace, one per source line."""
    specialised: dict[tuple[str, int], ExportProblem] = {}
    for w in caught:
        if issubclass(w.category, torch.jit.TracerWarning) and (w.filename, w.lineno) not in specialised:
            text = str(w.message).split(". ")[0].strip()
            specialised[(w.filename, w.lineno)] = ExportProblem(
                "torchscript", ProblemKind.TRACE_SPECIALIZED, None, _source(w.filename, w.lineno),
                f"TracerWarning: {text}: the traced graph keeps the value this sample produced", fatal=False)
    return list(specialised.values())


def _op_counts(proto: onnx.ModelProto) -> tuple[tuple[str, int], ...]:
    counts = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in proto.graph.node)
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _source(file: str, line: int) -> SourceLine:
    import linecache

    return SourceLine(file, line, linecache.getline(file, line).strip())


def _text(exc: BaseException) -> str:
    parts, seen = [], 0
    while exc is not None and seen < 20:
        parts.append(str(exc))
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return "\n".join(parts)
