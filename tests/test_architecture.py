"""The shape of the code (CONTRIBUTING.md): one package per stage, no stage importing another, small functions."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "onnx_bisect"
STAGES = ("source", "capture", "run", "align", "measure", "diagnose", "report")
#: packages that may import any stage: they know the order, or they are the command line
ORCHESTRATORS = ("pipeline", "cli")
PACKAGES = STAGES + ORCHESTRATORS + ("coverage", "records")


def _modules():
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _imported_packages(path: Path) -> set[str]:
    """The top-level onnx_bisect packages a module imports (relative imports resolved)."""
    rel = path.relative_to(SRC)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(rel.parts[:-1])
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            target = base + (node.module.split(".") if node.module else [])
            found.update([target[0]] if target else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("onnx_bisect."):
            found.add(node.module.split(".")[1])
    return found


def test_the_top_level_reads_as_the_stages():
    entries = {p.name for p in SRC.iterdir() if p.name != "__pycache__"}
    assert set(PACKAGES) <= entries
    assert len(entries) <= 16, sorted(entries)
    for package in PACKAGES:
        assert ast.get_docstring(ast.parse((SRC / package / "__init__.py").read_text())), package


@pytest.mark.parametrize("path", [p for p in _modules() if p.relative_to(SRC).parts[0] in STAGES + ("coverage",)],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_a_stage_imports_no_other_stage(path):
    own = path.relative_to(SRC).parts[0]
    others = _imported_packages(path) & (set(PACKAGES) - {own, "records"})
    assert not others, f"{path.relative_to(SRC)} imports {sorted(others)}"


def test_no_function_passes_sixty_lines():
    long = [f"{p.relative_to(SRC)}:{n.name} ({n.end_lineno - n.lineno + 1} lines)" for p in _modules()
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long
