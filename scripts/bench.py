"""Benchmark onnx-bisect against the floor any such tool must pay, in one run.

Floor (with export): build the model, export it (dynamo), one PyTorch forward,
one ONNX Runtime session and one run.  Floor (--onnx): the same without the
export, the session reading the file.  Each measurement runs in a fresh
process; wall time and peak RSS (ru_maxrss) are reported with their ratios.

    python scripts/bench.py [--model scripts/bench_models/bert_base.py] [--repeat 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

FLOOR = textwrap.dedent('''
    import importlib.util, resource, sys, time, json, warnings
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    import numpy as np, onnxruntime as ort, torch
    spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    model, args = m.get_model(), m.get_inputs()
    with torch.no_grad():
        ref = model(*args)
    onnx_path = sys.argv[2]
    if onnx_path == "-":
        import contextlib, io
        with contextlib.redirect_stdout(io.StringIO()):
            program = torch.onnx.export(model, args, dynamo=True, verbose=False)
        source = program.model_proto.SerializeToString()
    else:
        source = onnx_path
    so = ort.SessionOptions(); so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    out = sess.run(None, feeds)
    print(json.dumps({"wall": time.perf_counter() - t0,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
''')

TOOL = textwrap.dedent('''
    import resource, sys, time, json
    t0 = time.perf_counter()
    from onnx_bisect.cli import main
    import contextlib, io
    argv = [sys.argv[1], "--json", sys.argv[3]] + (["--onnx", sys.argv[2]] if sys.argv[2] != "-" else [])
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    print(json.dumps({"wall": time.perf_counter() - t0, "status": int(status),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
''')


def run_fresh(code: str, *argv: str) -> dict:
    """Run ``code`` in a fresh Python process; return the JSON object its last stdout line prints."""
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark step failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _export_once(model_file: str, path: str) -> None:
    code = textwrap.dedent('''
        import importlib.util, sys, contextlib, io, torch
        spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
        with contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(m.get_model(), m.get_inputs(), dynamo=True, verbose=False).save(sys.argv[2])
    ''')
    subprocess.run([sys.executable, "-c", code, model_file, path], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(HERE / "bench_models" / "bert_base.py"))
    parser.add_argument("--repeat", type=int, default=2, help="runs of each; the fastest counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_file = os.path.join(tmp, "model.onnx")
        _export_once(args.model, onnx_file)
        report = os.path.join(tmp, "report.json")
        rows = []
        for label, onnx_arg in (("with export", "-"), ("with --onnx", onnx_file)):
            floors, tools = [], []
            for _ in range(args.repeat):
                floors.append(run_fresh(FLOOR, args.model, onnx_arg))
                tools.append(run_fresh(TOOL, args.model, onnx_arg, report))
            floor = min(floors, key=lambda r: r["wall"])
            tool = min(tools, key=lambda r: r["wall"])
            timings = json.loads(Path(report).read_text())["timings"]
            rows.append((label, floor, tool, timings))
    print(f"model: {args.model}")
    for label, floor, tool, timings in rows:
        print(f"\n[{label}]")
        print(f"  floor      {floor['wall']:7.2f} s  peak RSS {floor['rss_mb']:7.0f} MB")
        print(f"  onnx-bisect {tool['wall']:6.2f} s  peak RSS {tool['rss_mb']:7.0f} MB  (exit {tool['status']})")
        print(f"  ratio: time {tool['wall'] / floor['wall']:.2f}x, memory {tool['rss_mb'] / floor['rss_mb']:.2f}x")
        print("  onnx-bisect steps: " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s)")
