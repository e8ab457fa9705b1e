"""Run the diagnosis suite: every cause planted in an MLP, a CNN and a transformer exported three ways,
plus the clean exports, and print the accuracy table.

    python scripts/diagnosis_suite.py [--cause CAUSE ...] [--arch ARCH ...] [--json results.json]

A planted case passes when the report diverges and names the planted cause
with confidence >= 0.5 (for the "unknown" fault, a stray constant no rule
knows, when it diverges and no cause reaches 0.5); a clean case passes when no cause is named with
confidence >= 0.5 (at the default tolerance a clean export does not diverge at
all; at tolerance 1e-9 float32 rounding diverges and must stay "unknown").
Cells: ok, wrong:<cause>, weak (no confident cause), no-loc (the outputs
diverge but no layer does, so there is nothing to diagnose), no-div, error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diagnosis_cases as dc  # noqa: E402
import diagnosis_models as dm  # noqa: E402

import onnx_bisect  # noqa: E402
from onnx_bisect.pipeline import explain as pipeline  # noqa: E402  (the step that calls diagnose)
from onnx_bisect.diagnose import CONFIDENT  # noqa: E402


def bisect_case(case: dc.Case):
    """``(report, DiagnosisContext or None)`` of one case: the context is kept to test rules on their own."""
    opts = dict(case.options)
    seen = {}
    real = pipeline.diagnose

    def spy(ctx):
        seen["ctx"] = ctx
        return real(ctx)

    pipeline.diagnose = spy
    try:
        with dc.quiet():
            report = onnx_bisect.bisect(case.model, case.inputs, onnx=case.proto, atol=opts.pop("atol", 1e-4),
                                        rtol=opts.pop("rtol", 1e-3), **opts)
    finally:
        pipeline.diagnose = real
    return report, seen.get("ctx")


def run_case(case: dc.Case) -> dict:
    """Bisect one case; the row of the results table."""
    started = time.perf_counter()
    report, _ = bisect_case(case)
    seconds = time.perf_counter() - started
    fd = report.first_divergence
    row = {"case": case.name, "expected": case.cause, "arch": case.arch, "provenance": case.provenance,
           "detail": case.detail, "diverged": not report.ok, "seconds": round(seconds, 2),
           "diagnose_seconds": round(report.timings.get("diagnose", 0.0), 3)}
    if fd is not None:
        row.update(cause=fd.cause, confidence=fd.confidence, confirmed=fd.confirmed, module=fd.layer.pair.activation.name,
                   explanation=fd.explanation, evidence=fd.evidence)
    named = fd is not None and fd.confidence >= CONFIDENT and fd.cause != "unknown"
    if case.cause is None:
        row["passed"] = not named
    elif case.cause == "unknown":  # a fault no rule knows: it must diverge and get no confident cause
        row["passed"] = not report.ok and fd is not None and not named
    else:
        row["passed"] = not report.ok and named and fd.cause == case.cause
    return row


def _status(row: dict) -> str:
    """ok; wrong:<cause> (a confident other cause); weak (right or no cause below 0.5); no-loc (outputs diverge,
    no layer does); no-div (the planted fault stays within tolerance); error."""
    if row["passed"]:
        return "ok"
    if "error" in row:
        return "error"
    if not row.get("diverged"):
        return "no-div"
    if "cause" not in row:
        return "no-loc"
    if row["cause"] != row["expected"] and row["confidence"] >= CONFIDENT and row["cause"] != "unknown":
        return f"wrong:{row['cause'][:6]}"
    return "weak"


def table(rows: list[dict]) -> str:
    """Cause × architecture × provenance, ✓/✗ per case, with totals."""
    cells = defaultdict(dict)
    for r in rows:
        label = r["case"].split("/")[0]
        cells[label][(r["arch"], r["provenance"])] = _status(r)
    cols = [(a, p) for a in dm.ARCHS for p in dc.PROVENANCES]
    head = ["cause"] + [f"{a}/{p[:5]}" for a, p in cols]
    lines = [" | ".join(f"{h:<28}" if i == 0 else f"{h:<12}" for i, h in enumerate(head))]
    for label in cells:
        lines.append(" | ".join([f"{label:<28}"] + [f"{cells[label].get(c, '-'):<12}" for c in cols]))
    planted = [r for r in rows if r["expected"]]
    clean = [r for r in rows if not r["expected"]]
    lines.append("")
    lines.append(f"planted: {sum(r['passed'] for r in planted)}/{len(planted)} right cause "
                 f"({100 * sum(r['passed'] for r in planted) / max(len(planted), 1):.0f}%); "
                 f"clean: {sum(r['passed'] for r in clean)}/{len(clean)} without a confident cause")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cause", action="append", help="only this cause (repeatable)")
    parser.add_argument("--arch", action="append", choices=dm.ARCHS)
    parser.add_argument("--no-clean", action="store_true", help="skip the clean models")
    parser.add_argument("--json", help="write every row (with evidence) here")
    args = parser.parse_args(argv)
    archs = tuple(args.arch or dm.ARCHS)
    rows, skipped = [], []
    started = time.perf_counter()
    cases = list(dc.planted_cases(args.cause, archs))
    if not args.no_clean and not args.cause:
        cases += list(dc.clean_cases(archs))
    for case in cases:
        if isinstance(case, tuple):
            skipped.append(case)
            continue
        try:
            row = run_case(case)
        except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
            row = {"case": case.name, "expected": case.cause, "arch": case.arch, "provenance": case.provenance,
                   "passed": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        mark = "ok  " if row["passed"] else "FAIL"
        got = f"{row.get('cause')} {row.get('confidence', 0):.2f} confirmed={row.get('confirmed')}" if "cause" in row else \
            row.get("error", "no divergence")
        print(f"{mark} {case.name:<45} {got}", flush=True)
    print()
    print(table(rows))
    for name, why in skipped:  # not applicable or failed plantings
        print(f"skipped {name}: {why}")
    print(f"\n(suite took {time.perf_counter() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
