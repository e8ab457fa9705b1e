"""Alignment's own share of a run on bert-base, for files from several pipelines.

    python scripts/align_overhead.py [--model scripts/bench_models/bert_base.py] [--repeat 2] [--cases a,b]

Exports the model once (dynamo) and derives the files a user brings: the
export as is (scope metadata), the export simplified by onnxslim (no scopes:
structural matching only), that file with a weight of a middle layer perturbed
(the outputs diverge: loose pairs), and the export saved by ONNX Runtime's
offline optimizer (ORT_ENABLE_EXTENDED).  Each file is bisected by
``onnx-bisect MODEL --onnx FILE`` in fresh processes; the fastest run counts.
Printed per file: the wall time of the run, the ``align`` step
(``report.timings["align"]``), its share of the wall time (target < 10 %), the
share of the other steps, the verdict and the first divergence.
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
CASES = ("dynamo", "slim", "slim+fault", "ort-extended")

RUN = textwrap.dedent('''
    import contextlib, io, json, sys, time
    t0 = time.perf_counter()
    from onnx_bisect.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        status = main([sys.argv[1], "--onnx", sys.argv[2], "--json", sys.argv[3]])
    report = json.load(open(sys.argv[3]))
    fd = report["first_divergence"]
    print(json.dumps({"wall": time.perf_counter() - t0, "status": int(status), "timings": report["timings"],
                      "coverage": report["coverage"]["fraction"],
                      "first": None if fd is None else [fd.get("module_name") or fd.get("module"), fd["onnx_nodes"]]}))
''')

MAKE = textwrap.dedent('''
    import contextlib, importlib.util, io, os, sys
    import numpy as np, onnx, onnxruntime as ort, onnxslim, torch
    from onnx import numpy_helper
    spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    out = sys.argv[2]
    with contextlib.redirect_stdout(io.StringIO()):
        proto = torch.onnx.export(m.get_model(), m.get_inputs(), dynamo=True, verbose=False).model_proto
    onnx.save(proto, os.path.join(out, "dynamo.onnx"))
    slim = onnxslim.slim(proto)
    onnx.save(slim, os.path.join(out, "slim.onnx"))
    matmuls = [n for n in slim.graph.node if n.op_type in ("MatMul", "Gemm")]
    inits = {i.name: i for i in slim.graph.initializer}
    node = next(n for n in matmuls[len(matmuls) // 2:] if n.input[1] in inits)
    w = numpy_helper.to_array(inits[node.input[1]])
    w = w + np.random.default_rng(0).normal(0, 0.05 * w.std(), w.shape).astype(w.dtype)
    inits[node.input[1]].CopyFrom(numpy_helper.from_array(w, node.input[1]))
    onnx.save(slim, os.path.join(out, "slim+fault.onnx"))
    print("planted in", node.name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = os.path.join(out, "ort-extended.onnx")
    ort.InferenceSession(os.path.join(out, "dynamo.onnx"), so, providers=["CPUExecutionProvider"])
''')


def _fresh(code: str, *argv: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"step failed:\n{out.stderr[-3000:]}")
    return out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(HERE / "bench_models" / "bert_base.py"))
    parser.add_argument("--repeat", type=int, default=2, help="runs of each file; the fastest counts")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {','.join(CASES)}")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        print(_fresh(MAKE, args.model, tmp).strip())
        report = os.path.join(tmp, "report.json")
        for case in cases:
            runs = [json.loads(_fresh(RUN, args.model, os.path.join(tmp, f"{case}.onnx"), report).splitlines()[-1])
                    for _ in range(args.repeat)]
            rows.append((case, min(runs, key=lambda r: r["wall"])))
    print(f"model: {args.model}")
    for case, r in rows:
        steps = r["timings"]
        align = steps.get("align", 0.0)
        print(f"\n[{case}] wall {r['wall']:.2f} s, align {align:.3f} s = {align / r['wall']:.1%} of the run "
              f"({align / sum(steps.values()):.1%} of the steps); coverage {r['coverage']:.1%}; exit {r['status']}; "
              f"first divergence {r['first']}")
        print("  steps: " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()))


if __name__ == "__main__":
    main()
