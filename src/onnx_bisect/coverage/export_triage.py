"""Export triage: try the dynamo and the TorchScript exporter and say what each could not export."""
from __future__ import annotations

import collections
import contextlib
import io
import logging
import os
import sys
import time
import warnings

import onnx
import torch

from ..records import ModelInputs
from .export_problems import format_problem, problems_from_exception
from .records import ExportAttempt, ExportProblem, ProblemKind, SourceLine

DEFAULT_TORCHSCRIPT_OPSET = 17


def triage_export(model, inputs: ModelInputs, user_file: str | None = None, file_module=None
                  ) -> tuple[tuple[ExportAttempt, ...], dict[str, onnx.ModelProto]]:
    """Export ``model`` with both exporters; return what each did and the ONNX models that came out.

    ``file_module`` is the imported model file: strict torch.export re-imports
    the model's module by name, so it is registered in ``sys.modules`` meanwhile.
    """
    model.eval()
    attempts, protos = [], {}
    for name, export in (("dynamo", _export_dynamo), ("torchscript", _export_torchscript)):
        start = time.perf_counter()
        with _importable(file_module):
            proto, problems = export(model, inputs, user_file)
        attempts.append(ExportAttempt(
            exporter=name, ok=proto is not None, seconds=time.perf_counter() - start, problems=tuple(problems),
            onnx_ops=_op_counts(proto) if proto is not None else (),
            opset=next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
            if proto is not None else None,
        ))
        if proto is not None:
            protos[name] = proto
    return tuple(attempts), protos


def explain_export_failures(model, inputs: ModelInputs, failures, user_file: str | None = None) -> list[str]:
    """One line per problem: the operator, source line and message of each exporter failure in ``failures``.

    ``failures`` holds ``(exporter name, exception)`` pairs as the main job's
    export stage collected them; only a light re-capture runs, to find the
    source line of a dynamo translation failure.
    """
    problems: list[ExportProblem] = []
    for exporter, exc in failures:
        name = getattr(exporter, "value", str(exporter))
        if name == "dynamo" and "translating node" in _text(exc):
            program = _capture(model, inputs)[0]
            listed = _untranslatable(program, user_file) if program is not None else []
            if listed:
                problems.extend(listed)
                continue
        graph = _trace_graph(model, inputs) if name == "torchscript" else None
        problems.extend(problems_from_exception(name, exc, user_file, trace_graph=graph))
    return [format_problem(p) for p in problems]


def _export_dynamo(model, inputs: ModelInputs, user_file: str | None):
    program, exc = _capture(model, inputs)
    if program is None:
        return None, problems_from_exception("dynamo", exc, user_file)
    try:
        with _quiet():
            onnx_program = torch.onnx.export(program, (), dynamo=True, report=False, verbose=False)
        return onnx_program.model_proto, []
    except Exception as exc:  # the exporter raises a zoo of types
        listed = _untranslatable(program, user_file)
        reported = problems_from_exception("dynamo", exc, user_file, program=program)
        seen = {p.operator for p in listed}
        return None, listed + [p for p in reported if p.operator not in seen]


def _capture(model, inputs: ModelInputs):
    """torch.export the model as the dynamo exporter does: non-strict first, then strict."""
    args, kwargs = _cloned(inputs)
    first = None
    for strict in (False, True):
        try:
            with _quiet():
                return torch.export.export(model, args, kwargs=kwargs or None, strict=strict), None
        except Exception as exc:  # capture failures come in many types
            first = first or exc
    return None, first


def _untranslatable(program, user_file: str | None) -> list[ExportProblem]:
    """Every FX node the ONNX registry has no translation for (not just the first the exporter hit).

    Uses the exporter's internal registry and dispatcher; when those move,
    this returns [] and the exporter's own error still names the first failure.
    """
    try:
        from torch.onnx._internal.exporter import _core, _dispatching, _registration

        from .export_problems import source_from_stack

        with _quiet():
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
    except Exception:
        return []


def _export_torchscript(model, inputs: ModelInputs, user_file: str | None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with _quiet():
                proto = _trace_export(model, inputs)
        except Exception as exc:
            return None, problems_from_exception("torchscript", exc, user_file, trace_graph=_trace_graph(model, inputs))
    specialised: dict[tuple[str, int], ExportProblem] = {}
    for w in caught:
        if issubclass(w.category, torch.jit.TracerWarning) and (w.filename, w.lineno) not in specialised:
            text = str(w.message).split(". ")[0].strip()
            specialised[(w.filename, w.lineno)] = ExportProblem(
                "torchscript", ProblemKind.TRACE_SPECIALIZED, None, _source(w.filename, w.lineno),
                f"TracerWarning: {text}: the traced graph keeps the value this sample produced", fatal=False)
    return proto, list(specialised.values())


def _trace_export(model, inputs: ModelInputs) -> onnx.ModelProto:
    args, kwargs = _cloned(inputs)
    buffer = io.BytesIO()
    try:
        torch.onnx.export(model, args + ((kwargs,) if kwargs else ()), buffer, dynamo=False,
                          opset_version=DEFAULT_TORCHSCRIPT_OPSET)
    except TypeError:
        if kwargs:
            raise
        buffer = io.BytesIO()  # positional-only tracing rejected: call through keywords
        torch.onnx.export(_Keywords(model, inputs.names), args, buffer, dynamo=False,
                          opset_version=DEFAULT_TORCHSCRIPT_OPSET)
    return onnx.load_from_string(buffer.getvalue())


def _trace_graph(model, inputs: ModelInputs):
    """The inlined TorchScript trace, to find where an operator came from; None when tracing fails."""
    try:
        args, kwargs = _cloned(inputs)
        with _quiet(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph, _ = torch.jit._get_trace_graph(model, args, kwargs or None)
        return graph
    except Exception:
        return None


class _Keywords(torch.nn.Module):
    """Calls the wrapped model with keyword arguments (TorchScript traces positionally)."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self._names = model, tuple(names)

    def forward(self, *args):
        return self.model(**dict(zip(self._names, args)))


def _cloned(inputs: ModelInputs):
    from torch.utils._pytree import tree_map_only

    args, kwargs = tree_map_only(torch.Tensor, torch.Tensor.clone, (tuple(inputs.args), dict(inputs.kwargs)))
    return tuple(args), kwargs


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


@contextlib.contextmanager
def _importable(module):
    """Make ``module`` importable by its name for the duration (Dynamo looks modules up in sys.modules)."""
    name = getattr(module, "__name__", None)
    if not name or name in sys.modules:
        yield
        return
    sys.modules[name] = module
    try:
        yield
    finally:
        sys.modules.pop(name, None)


@contextlib.contextmanager
def _quiet():
    """Silence the exporters' prints, logs and native stderr; exceptions still propagate."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript",
                                              "torch.fx.experimental.symbolic_shapes")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        route = getattr(torch._C, "_jit_set_onnx_log_output_stream", None)
        if route is not None:
            route("stderr")  # TorchScript's C++ ONNX log would otherwise reach stdout at exit
    except Exception:  # an internal hook that may move
        pass
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
