"""Re-judge the planted faults of an earlier ``fault_sweep.py`` run with another version of onnx-bisect.

``fault_sweep.py`` plants faults and runs the tool in one go (minutes per architecture). To measure a change
of the tool on the same files — and on a held-out sample of architectures the change was not tuned to — this
re-runs the CLI on the counted cases of its results JSON, without planting again::

    python scripts/sweep_rerun.py --results /tmp/sweep/results.json --per 2 \\
        --skip-archs bert,vit,distilbert,llama --src src --out heldout.json --misses

``--per N`` keeps N cases per (architecture, fault kind), chosen by a seeded shuffle; ``--src`` puts an
onnx_bisect source folder first on PYTHONPATH (a frozen copy, so that editing the tree does not change a run
under way). A case is pinpointed when every planted node is in ``onnx_nodes`` and there are at most 12; the
right cause is the sweep's expected one (a shape constant is always ``attribute-mismatch``: a wrong constant
at the file's own input size is the op's argument, not a shape baked for another size). Prints the rates per
kind, provenance and architecture, and with ``--misses`` every miss.  ``--clean`` re-judges the clean files
instead: a false alarm is an exit other than 0 or a diverged layer; a warning is counted apart.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fault_sweep  # noqa: E402  (its scoring: one definition of "pinpointed" and "right cause")



def _model_file(models: Path, arch: str) -> Path:
    """The sweep's model file for ``arch`` (``<arch>_model.py``; ``<arch>.py`` in older work folders)."""
    new = models / f"{arch}_model.py"
    return new if new.exists() else models / f"{arch}.py"

def select(cases: list[dict], args: argparse.Namespace) -> list[dict]:
    """The counted cases the filters keep, at most ``--per`` of each (architecture, kind)."""
    def wanted(value: str, option: str | None) -> bool:
        return not option or value in option.split(",")

    status = "clean" if args.clean else "counted"
    kept = [c for c in cases if c["status"] == status and wanted(c["kind"], args.kinds)
            and wanted(c["arch"], args.archs) and wanted(c["provenance"], args.provs)
            and c["arch"] not in (args.skip_archs or "").split(",")
            and (not args.missed or not (c.get("pinpointed") and c.get("right_cause")))]
    if not args.per:
        return kept
    random.Random(args.seed).shuffle(kept)
    seen: collections.Counter = collections.Counter()
    out = []
    for c in kept:
        if seen[(c["arch"], c["kind"])] < args.per:
            seen[(c["arch"], c["kind"])] += 1
            out.append(c)
    return out


def judge(case: dict, args: argparse.Namespace, runs: Path) -> dict:
    """Run the CLI on one case's file and judge its first divergence."""
    report = runs / f"{case['id'].replace('/', '_')}.json"
    models = Path(case["onnx"]).parents[2] / "models"
    argv = [sys.executable, "-m", "onnx_bisect", str(_model_file(models, case['arch'])), "--onnx", case["onnx"],
            "--json", str(report), "--atol", str(case["atol"]), "--rtol", str(case["rtol"])]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve())
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, env=env, check=False)
    result = json.loads(report.read_text()) if report.exists() and proc.returncode in (0, 1) else {}
    fd = result.get("first_divergence") or {}
    nodes = fd.get("onnx_nodes") or []
    if case["status"] == "clean":  # fault_sweep's verdict on a clean file: a false alarm, a warning
        diverged = [layer.get("module") for layer in result.get("layers", []) if layer.get("status") == "diverged"]
        return dict(id=case["id"], kind="clean", arch=case["arch"], prov=case["provenance"], exit=proc.returncode,
                    false_alarm=proc.returncode != 0 or bool(diverged), diverged=diverged[:4],
                    warnings=[str(w)[:200] for w in result.get("warnings", [])],
                    error=proc.stderr[-300:] if proc.returncode > 1 else "")
    scored = fault_sweep.case_from_dict(case)
    if case["kind"] == "shape-constant":  # results planted before the planter said so (see sweep_faults)
        scored.expected = "attribute-mismatch"
    scored.onnx_nodes, scored.cause, scored.tool_exit = nodes, fd.get("cause"), proc.returncode
    fault_sweep.score(scored)
    return dict(id=case["id"], kind=case["kind"], arch=case["arch"], prov=case["provenance"], exit=proc.returncode,
                pin=scored.pinpointed, right=scored.right_cause, size=len(nodes), cause=scored.cause,
                expected=scored.expected, op=fd.get("op"), planted=case["planted_nodes"], nodes=nodes[:8],
                error=proc.stderr[-300:] if proc.returncode > 1 else "")


def summary(rows: list[dict], misses: bool) -> None:
    if rows and rows[0]["kind"] == "clean":
        alarms, warned = [r for r in rows if r["false_alarm"]], [r for r in rows if r["warnings"]]
        print(f"clean files: {len(rows)}; false alarms {len(alarms)}; with warnings {len(warned)}")
        for r in alarms + warned:
            print("CLEAN", r["id"], r["exit"], r["diverged"], r["warnings"][:1], r["error"])
        return
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for r in rows:
        for key in ("ALL", r["kind"], "prov:" + r["prov"], "arch:" + r["arch"]):
            groups[key].append(r)
    for key, rs in sorted(groups.items()):
        print(f"{key:18s} n={len(rs):3d} pinpointed={sum(r['pin'] for r in rs) / len(rs):4.0%} "
              f"right cause={sum(r['right'] for r in rs) / len(rs):4.0%} "
              f"median segment={statistics.median([r['size'] for r in rs])}")
    for r in rows if misses else ():
        if not (r["pin"] and r["right"]):
            print("MISS", r["id"], r["exit"], r["cause"], "expected", r["expected"], r["size"], r["planted"],
                  r["nodes"][:4], r["error"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="/tmp/sweep/results.json", help="fault_sweep.py's results JSON")
    p.add_argument("--kinds"), p.add_argument("--archs"), p.add_argument("--provs"), p.add_argument("--skip-archs")
    p.add_argument("--per", type=int, default=0, help="at most N cases per (architecture, kind)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--src", default="", help="onnx_bisect source folder to run (default: the installed one)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default="sweep-rerun.json")
    p.add_argument("--misses", action="store_true")
    p.add_argument("--missed", action="store_true", help="only the cases the results file judged misses")
    p.add_argument("--clean", action="store_true", help="re-judge the clean files instead (false alarms, warnings)")
    args = p.parse_args()
    cases = select(json.loads(Path(args.results).read_text())["cases"], args)
    print(f"{len(cases)} cases", flush=True)
    runs = Path(args.out).with_suffix(".runs")
    runs.mkdir(exist_ok=True)
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda c: judge(c, args, runs), cases))
    Path(args.out).write_text(json.dumps(rows, indent=1))
    summary(rows, args.misses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
