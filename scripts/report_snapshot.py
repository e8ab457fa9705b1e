"""Snapshot what onnx-bisect reports on every bundled fixture, to compare two versions of the tool byte for byte.

    python scripts/report_snapshot.py --out before.json            # the tool on PYTHONPATH / installed
    PYTHONPATH=/other/checkout/src python scripts/report_snapshot.py --out after.json
    python scripts/report_snapshot.py --compare before.json after.json

Walks ``fixtures/registry.json`` (main job), ``fixtures/configurations/registry.json`` (verification matrices)
and ``fixtures/coverage/registry.json`` (coverage triage) through the real command line and keeps, per entry,
the exit status, the text report and the JSON report with every timing removed (``timings``, ``seconds`` and
wall-clock fields): a refactoring that keeps behaviour leaves the snapshot unchanged.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
#: keys whose values are measured times, not findings
TIMING_KEYS = {"timings", "seconds", "wall_s"}
_TIME = re.compile(r"\b\d+\.\d+s\b")


def _commands() -> list[tuple[str, list[str]]]:
    """``(name, argv)`` for every registry entry."""
    out = []
    for e in json.loads((FIXTURES / "registry.json").read_text()):
        argv = [str(FIXTURES / e["model"]), "--onnx", str(FIXTURES / e["onnx"])]
        for inp in e["inputs"]:
            argv += ["--input", str(FIXTURES / inp)]
        out.append((f"main:{e['name']}", argv))
    conf = FIXTURES / "configurations"
    for e in json.loads((conf / "registry.json").read_text()):
        out.append((f"matrix:{e['name']}", [str(conf / e["model"]), "--onnx", str(conf / e["onnx"]), *e["args"]]))
    cov = FIXTURES / "coverage"
    for e in json.loads((cov / "registry.json").read_text()):
        out.append((f"coverage:{e['name']}", ["coverage", str(cov / e["file"]), *e["args"]]))
    return out


def _scrub(value: Any) -> Any:
    """``value`` without timing fields (recursively)."""
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _text(stdout: str) -> str:
    """The text report without the times it shows (``1.8s``) and without lines that carry timings."""
    lines = (line for line in stdout.splitlines() if " s)" not in line and "seconds" not in line)
    return "\n".join(_TIME.sub("<t>s", line) for line in lines)


def snapshot(names: list[str] | None = None) -> dict[str, Any]:
    """Run every (or the named) registry entry; return ``{name: {exit, text, json}}``."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in _commands():
            if names and name not in names:
                continue
            report = Path(tmp) / "r.json"
            report.unlink(missing_ok=True)
            proc = subprocess.run([sys.executable, "-m", "onnx_bisect", *argv, "--json", str(report)],
                                  capture_output=True, text=True, timeout=900, cwd=ROOT)
            data = json.loads(report.read_text()) if report.is_file() else None
            out[name] = {"exit": proc.returncode, "text": _text(proc.stdout), "json": _scrub(data)}
            print(f"{name}: exit {proc.returncode}", file=sys.stderr)
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Print the entries that differ; 0 when none does."""
    differing = 0
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            differing += 1
            print(f"DIFFERS: {name}")
            for key in ("exit", "text", "json"):
                if (a.get(name) or {}).get(key) != (b.get(name) or {}).get(key):
                    print(f"  {key}")
    print(f"{len(set(a) | set(b)) - differing} same, {differing} differ")
    return 1 if differing else 0


def main() -> int:
    """Command line; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the snapshot here")
    p.add_argument("--only", nargs="*", help="entry names (e.g. main:mlp.dynamo)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two snapshots")
    a = p.parse_args()
    if a.compare:
        return compare(*(json.loads(Path(x).read_text()) for x in a.compare))
    data = snapshot(a.only)
    text = json.dumps(data, indent=1, sort_keys=True)
    if a.out:
        Path(a.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
