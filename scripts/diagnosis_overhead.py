"""What the diagnosis (preflight + diagnose) adds to a run: bert-base with a planted GELU fault.

    python scripts/diagnosis_overhead.py [--model scripts/bench_models/bert_base.py] [--repeat 3]

Exports the model once (dynamo), switches its first GELU to the tanh form, then
runs ``onnx-bisect MODEL --onnx planted.onnx`` in fresh processes, alternately
as is and with the preflight and the diagnosis stubbed out, and prints the
fastest wall time of each and their per-step timings.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

RUN = textwrap.dedent('''
    import contextlib, io, json, sys, time
    t0 = time.perf_counter()
    from onnx_bisect.pipeline import explain as pipeline, prepare
    from onnx_bisect.cli import main
    from onnx_bisect.records import Cause, Divergence
    if sys.argv[4] == "off":
        prepare.preflight.check_model = lambda *a, **k: ()
        pipeline.diagnose = lambda ctx: Divergence(layer=ctx.layer, introduced=ctx.introduced, cause=Cause.UNKNOWN,
                                                   explanation="diagnosis off")
    with contextlib.redirect_stdout(io.StringIO()):
        status = main([sys.argv[1], "--onnx", sys.argv[2], "--json", sys.argv[3]])
    report = json.load(open(sys.argv[3]))
    print(json.dumps({"wall": time.perf_counter() - t0, "status": int(status), "timings": report["timings"],
                      "cause": report["first_divergence"]["cause"] if report["first_divergence"] else None}))
''')

PLANT = textwrap.dedent('''
    import contextlib, importlib.util, io, sys
    import onnx, torch
    sys.path.insert(0, sys.argv[3])
    import plant
    spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    with contextlib.redirect_stdout(io.StringIO()):
        proto = torch.onnx.export(m.get_model(), m.get_inputs(), dynamo=True, verbose=False).model_proto
    gelu = next(n for n in proto.graph.node if n.op_type == "Gelu")
    onnx.save(plant.set_gelu_tanh(proto, gelu.name), sys.argv[2])
''')


def _run(*argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(HERE / "bench_models" / "bert_base.py"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        planted = os.path.join(tmp, "planted.onnx")
        subprocess.run([sys.executable, "-c", PLANT, args.model, planted, str(HERE)], check=True, capture_output=True)
        report = os.path.join(tmp, "report.json")
        runs = {"on": [], "off": []}
        _run(args.model, planted, report, "on")  # warm the page cache and the import caches
        for _ in range(args.repeat):
            for mode in ("off", "on"):
                runs[mode].append(_run(args.model, planted, report, mode))
    best = {mode: min(rs, key=lambda r: r["wall"]) for mode, rs in runs.items()}
    for mode in ("off", "on"):
        r = best[mode]
        print(f"diagnosis {mode:<3}: {r['wall']:6.2f} s (fastest of {args.repeat}), cause {r['cause']}, steps: "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["timings"].items()))
    on, off = best["on"]["wall"], best["off"]["wall"]
    steps = best["on"]["timings"]
    own = steps.get("preflight", 0.0) + steps.get("diagnose", 0.0)
    print(f"\nwall-time overhead: {on - off:+.2f} s ({(on - off) / off:+.1%}); preflight + diagnose steps: "
          f"{own:.2f} s = {own / (sum(steps.values()) - own):.1%} of the other steps")


if __name__ == "__main__":
    main()
