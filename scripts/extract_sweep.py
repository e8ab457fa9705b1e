"""Extract every planted fault and check the repro: it reproduces the report's error, the fixed segment passes, and
``repro.py`` run in a fresh, isolated process (``python -I``: no PYTHONPATH, no script folder on the path) imports
nothing but onnxruntime, numpy and the standard library and prints the same figure.

    python scripts/extract_sweep.py [--registry-only] [--cause CAUSE ...] [--arch ARCH ...] [--json rows.json]

Faults: every entry of ``fixtures/registry.json`` with a fault, and every planted case of the diagnosis suite
(``scripts/diagnosis_cases.py``).  A case whose outputs do not diverge, or diverge with no aligned tensor doing so,
has nothing to extract and is counted apart.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from onnx_bisect.errors import BisectError  # noqa: E402

#: modules repro.py must not import (the tool, the exporters, the ONNX python package)
FORBIDDEN = {"onnx_bisect", "torch", "onnx", "onnxscript", "onnx_graphsurgeon", "tabulate", "transformers"}
FIGURE = re.compile(r"max abs error (\S+),")


def registry_cases():
    """``(name, thunk)`` per fixture-registry fault; the thunk bisects with the repro kept."""
    from onnx_bisect.pipeline.bisect import run
    from onnx_bisect.pipeline.config import Config

    fixtures = ROOT / "fixtures"
    for entry in json.loads((fixtures / "registry.json").read_text()):
        if entry["fault"] is None:
            continue
        config = Config(model=str(fixtures / entry["model"]), inputs=tuple(str(fixtures / i) for i in entry["inputs"]),
                        onnx=str(fixtures / entry["onnx"]), keep_repro=True)
        yield f"registry/{entry['name']}", entry["fault"]["kind"], lambda c=config: run(c)


def suite_cases(causes, archs):
    """``(name, expected cause, thunk)`` per planted case of the diagnosis suite."""
    import diagnosis_cases as dc
    import diagnosis_models as dm
    import onnx_bisect

    for case in dc.planted_cases(causes, tuple(archs or dm.ARCHS)):
        if isinstance(case, tuple):
            print(f"skipped {case[0]}: {case[1]}", flush=True)
            continue
        opts = dict(case.options)
        atol, rtol = opts.pop("atol", 1e-4), opts.pop("rtol", 1e-3)

        def thunk(case=case, opts=opts, atol=atol, rtol=rtol):
            with dc.quiet():
                return onnx_bisect.bisect(case.model, case.inputs, onnx=case.proto, atol=atol, rtol=rtol, **opts)
        yield f"suite/{case.name}", case.cause, thunk


def run_script(folder: Path, model: str | None) -> tuple[float | None, set[str], str]:
    """``(printed max abs, forbidden modules imported, output)`` of ``python -I repro.py [model]`` in ``folder``."""
    argv = [sys.executable, "-I", "-X", "importtime", "repro.py"] + ([model] if model else [])
    proc = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=120)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    found = FIGURE.search(proc.stdout)
    figure = float(found.group(1)) if found else None
    return figure, imported & FORBIDDEN, proc.stdout.strip() or proc.stderr.strip()[-300:]


def check(name: str, cause: str, thunk) -> dict:
    """One fault: bisect, extract, run the script on each model; the row of the results."""
    row = {"case": name, "expected": cause}
    started = time.perf_counter()
    report = thunk()
    fd = report.first_divergence
    row.update(diverged=not report.ok, cause=fd.cause.value if fd else None, nodes=len(fd.layer.segment) if fd else 0,
               narrowed=bool(fd and fd.within is not None), introduced=bool(fd and fd.introduced))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            x = report.extract(str(Path(tmp) / "repro"))
        except BisectError as exc:
            row.update(extracted=False, why=str(exc)[:200], seconds=round(time.perf_counter() - started, 1))
            return row
        folder = Path(x.folder)
        figure, bad, out = run_script(folder, None)
        row.update(extracted=True, stated=x.stated.max_abs, measured=x.measured.max_abs, reproduces=x.reproduces,
                   script_figure=figure, script_same=_same(figure, x.measured.max_abs), script_imports=sorted(bad),
                   script_output=out, external=x.external_data, fixed=x.fixed is not None,
                   random=list(x.random_ops))
        if x.fixed is not None:
            figure, bad, out = run_script(folder, "fixed.onnx")
            row.update(fixed_passes=x.fixed_passes, fixed_max_abs=x.fixed.max_abs, fixed_script_figure=figure,
                       fixed_script_same=_same(figure, x.fixed.max_abs), fixed_script_imports=sorted(bad),
                       fixed_script_output=out)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _within(row: dict, rel: float) -> bool:
    a, b = row["stated"], row["measured"]
    return a == b or abs(a - b) <= rel * abs(a)


def _same(printed: float | None, value: float) -> bool:
    """The script prints 6 significant digits."""
    if printed is None:
        return False
    if printed == value:
        return True
    return abs(printed - value) <= 1e-5 * max(abs(value), 1e-30)


def summary(rows: list[dict]) -> str:
    extracted = [r for r in rows if r.get("extracted")]
    fixed = [r for r in extracted if r["fixed"]]
    script_ok = [r for r in extracted if r["script_same"] and not r["script_imports"]
                 and (not r["fixed"] or (r["fixed_script_same"] and not r["fixed_script_imports"]))]
    lines = [f"faults: {len(rows)}; extracted: {len(extracted)} (nothing to extract: {len(rows) - len(extracted)})",
             f"reproduce the report's error (1 % or float noise): {sum(r['reproduces'] for r in extracted)}"
             f"/{len(extracted)} (within 1 %: {sum(_within(r, 0.01) for r in extracted)}; only within float noise: "
             f"{sum(r['reproduces'] and not _within(r, 0.01) and not r['random'] for r in extracted)}; random ops, "
             f"the verdict reproduced: {sum(bool(r['random']) for r in extracted)})",
             f"with a confirmed fix: {len(fixed)}; fixed.onnx passes: {sum(r['fixed_passes'] for r in fixed)}"
             f"/{len(fixed)}",
             f"repro.py in a fresh isolated process, onnxruntime+numpy only, same figure: {len(script_ok)}"
             f"/{len(extracted)}"]
    for r in rows:
        if not r.get("extracted"):
            lines.append(f"  not extracted {r['case']}: {r.get('why', r.get('error'))}")
        elif not r["reproduces"] or (r["fixed"] and not r["fixed_passes"]) or r not in script_ok:
            lines.append(f"  {r['case']}: stated {r['stated']:.4g}, measured {r['measured']:.4g}, "
                         f"fixed {'passes' if r.get('fixed_passes') else r.get('fixed_max_abs')}, script "
                         f"{r['script_output'][:160]!r} imports {r['script_imports']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry-only", action="store_true")
    parser.add_argument("--cause", action="append")
    parser.add_argument("--arch", action="append")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    cases = list(registry_cases()) if not args.cause and not args.arch else []
    rows = []
    for name, cause, thunk in cases:
        rows.append(_guarded(name, cause, thunk))
    if not args.registry_only:
        for name, cause, thunk in suite_cases(args.cause, args.arch):
            rows.append(_guarded(name, cause, thunk))
    print()
    print(summary(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


def _guarded(name: str, cause: str, thunk) -> dict:
    try:
        row = check(name, cause, thunk)
    except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
        row = {"case": name, "expected": cause, "extracted": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    status = ("error " + row["error"][:100]) if "error" in row else (
        f"reproduces={row.get('reproduces')} fixed={row.get('fixed_passes')} script={row.get('script_same')}"
        if row.get("extracted") else f"not extracted: {row.get('why', '')[:80]}")
    print(f"{name:<50} {status} ({row.get('seconds', '-')} s)", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
