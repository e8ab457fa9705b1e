"""Read an exporter's exception: which operator failed, where in the user's code, and in the exporter's words."""
from __future__ import annotations

import linecache
import re
import traceback
from pathlib import Path

from .records import ExportProblem, ProblemKind, SourceLine

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OVERLOAD = re.compile(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)")
_OPERATOR = re.compile(r"(aten::\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?|torch\.ops\.[\w.]+|prim::PythonOp)")
_PY_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]+(?:\n[ \t]+([^\n]+))?')
_TS_FRAME = re.compile(r"^\s*(\S.*?)\((\d+)\): (\S+)\s*$", re.M)
_FX_NODE = re.compile(r"Error when translating node %(\w+)")
_DATA_DEPENDENT = ("data-dependent", "GuardOnDataDependentSymNode", "Could not guard on",
                   "Could not extract specialized integer", "Dynamic control flow is not supported",
                   "data dependent")


def problems_from_exception(exporter: str, exc: BaseException, user_file: str | None = None,
                            program=None, trace_graph=None) -> list[ExportProblem]:
    """The failures one exporter exception describes (usually one).

    ``program`` (a torch.export ExportedProgram) lets a dynamo translation
    error be traced back to the FX node's stack trace; ``trace_graph`` (a
    TorchScript graph) does the same for an operator the TorchScript exporter
    names without a location.
    """
    chain = _chain(exc)
    text = "\n".join(_ANSI.sub("", str(e)) for e in chain)
    kind = _kind(text, chain)
    operator = _operator(text)
    source = (_from_program(text, program, user_file) or _from_text(text, user_file)
              or _from_trace_graph(operator, trace_graph, user_file) or _from_traceback(chain, user_file))
    return [ExportProblem(exporter=exporter, kind=kind, operator=operator, source=source, message=_message(chain))]


def source_from_stack(stack: str, user_file: str | None = None) -> SourceLine | None:
    """The innermost user frame of a Python-style stack trace (torch's own frames skipped)."""
    frames = [(f, int(n), (code or "").strip()) for f, n, code in _PY_FRAME.findall(stack)]
    return _pick(frames, user_file)


def _chain(exc: BaseException) -> list[BaseException]:
    chain = [exc]
    while len(chain) < 20:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt is None or nxt in chain:
            break
        chain.append(nxt)
    return chain


def _kind(text: str, chain: list[BaseException]) -> ProblemKind:
    names = " ".join(type(e).__name__ for e in chain)
    frames = " ".join(f.filename for e in chain for f in traceback.extract_tb(e.__traceback__))
    if "torch/autograd/function.py" in frames.replace("\\", "/"):
        return ProblemKind.PYTHON_OP
    if any(s in text or s in names for s in _DATA_DEPENDENT):
        return ProblemKind.DATA_DEPENDENT
    if "PythonOp" in text or "autograd/function.py" in text or "autograd.Function" in text:
        return ProblemKind.PYTHON_OP
    if ("No ONNX function found" in text or "DispatchError" in names or "UnsupportedOperatorError" in names
            or "is not supported" in text or "Couldn't export operator" in text):
        return ProblemKind.NO_LOWERING
    if "Failed to decompose" in text:
        return ProblemKind.DECOMPOSITION_FAILED
    if "TorchExportError" in names or "Failed to export the model with torch.export" in text or "Unsupported" in names:
        return ProblemKind.CAPTURE_FAILED
    return ProblemKind.OTHER


def _operator(text: str) -> str | None:
    found = _OVERLOAD.search(text)
    if found:
        return f"{found.group(1)}.{found.group(2)}"
    found = re.search(r"Python operator (\w+)", text)
    if found:
        return f"prim::PythonOp {found.group(1)}"
    found = _OPERATOR.search(text)
    return found.group(1) if found else None


def _message(chain: list[BaseException]) -> str:
    """The innermost exception's first meaningful line (the outer ones are generic next-steps text)."""
    for exc in reversed(chain):
        for line in _ANSI.sub("", str(exc)).splitlines():
            line = line.strip()
            if line and not line.startswith(("Failed to ", "Error when translating")):
                return f"{type(exc).__name__}: {line}"[:300]
    return type(chain[-1]).__name__


def _from_program(text: str, program, user_file: str | None) -> SourceLine | None:
    found = _FX_NODE.search(text)
    if program is None or not found:
        return None
    for node in program.graph.nodes:
        if node.name == found.group(1):
            return source_from_stack(node.meta.get("stack_trace") or "", user_file)
    return None


def _from_text(text: str, user_file: str | None) -> SourceLine | None:
    frames = [(f, int(n), (code or "").strip()) for f, n, code in _PY_FRAME.findall(text)]
    frames += [(f, int(n), "") for f, n, _ in _TS_FRAME.findall(text)][::-1]  # TorchScript lists innermost first
    return _pick(frames, user_file)


def _from_trace_graph(operator: str | None, graph, user_file: str | None) -> SourceLine | None:
    if graph is None or not operator or "::" not in operator:
        return None
    kind = operator.split()[0]
    for node in graph.nodes():
        if node.kind() == kind:
            frames = [(f, int(n), "") for f, n, _ in _TS_FRAME.findall(str(node.sourceRange()))][::-1]
            found = _pick(frames, user_file)
            if found:
                return found
    return None


def _from_traceback(chain: list[BaseException], user_file: str | None) -> SourceLine | None:
    frames = []
    for exc in reversed(chain):
        frames += [(f.filename, f.lineno or 0, (f.line or "").strip()) for f in traceback.extract_tb(exc.__traceback__)]
    return _pick(frames, user_file, strict=True)


def _pick(frames: list[tuple[str, int, str]], user_file: str | None, strict: bool = False) -> SourceLine | None:
    """The innermost frame in the user's file, else (unless ``strict``) the innermost outside torch."""
    if user_file:
        target = str(Path(user_file).resolve())
        mine = [f for f in frames if _resolve(f[0]) == target]
        if mine:
            return _line(*mine[-1])
    if strict:
        return None
    outside = [f for f in frames if not _is_library(f[0])]
    return _line(*outside[-1]) if outside else None


def _line(file: str, line: int, code: str) -> SourceLine:
    code = "" if code.startswith('File "') else code
    return SourceLine(file, line, code or linecache.getline(file, line).strip())


def _resolve(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except (OSError, ValueError):
        return path


def _is_library(path: str) -> bool:
    p = path.replace("\\", "/")
    return ("/torch/" in p or "/onnxscript/" in p or "/onnx_bisect/" in p or p.startswith("<")
            or "/contextlib.py" in p or "/functools.py" in p)


def format_problem(problem: ExportProblem) -> str:
    """One line: exporter, what failed, where, and the exporter's message."""
    where = f" at {problem.source}" if problem.source else ""
    code = f" `{problem.source.code}`" if problem.source and problem.source.code else ""
    op = f" {problem.operator}" if problem.operator else ""
    return f"{problem.exporter}: {problem.kind.value}{op}{where}{code} — {problem.message}"
