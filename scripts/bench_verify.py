"""Benchmark a verification matrix against the sum of its per-configuration floors, in one run.

    python scripts/bench_verify.py [--model scripts/bench_models/bert_base.py] [--batch-sizes 1,4,16]
                                   [--samples 32] [--repeat 1]

Floor, in a fresh process: build the model, export it once (dynamo, dynamic batch
axis), one ONNX Runtime session, then for every configuration one PyTorch forward
and one ONNX Runtime run — the least any tool that checks these configurations
must pay.  onnx-bisect then runs the same configurations (``--batch-sizes`` and a
``--dataset`` of ``--samples`` samples drawn like the model's sample) in a fresh
process.  Wall time and peak RSS are reported with their ratios (target: time
at most 1.5x), with onnx-bisect's own step timings.
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
sys.path.insert(0, str(HERE))
from bench import run_fresh  # noqa: E402

DATASET = textwrap.dedent('''
    import importlib.util, sys, numpy as np, torch
    spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    sample = m.get_inputs()[0]
    g = torch.Generator().manual_seed(7)
    n = int(sys.argv[3])
    if sample.dtype.is_floating_point:
        rows = torch.randn((n,) + tuple(sample.shape[1:]), generator=g, dtype=sample.dtype)
    else:
        rows = torch.randint(0, int(sample.max()) + 1, (n,) + tuple(sample.shape[1:]), generator=g, dtype=sample.dtype)
    params = list(__import__("inspect").signature(m.get_model().forward).parameters)
    np.savez(sys.argv[2], **{params[0]: rows.numpy()})
''')

FLOOR = textwrap.dedent('''
    import importlib.util, resource, sys, time, json, warnings, contextlib, io
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    import numpy as np, onnxruntime as ort, torch
    spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    model, (sample,) = m.get_model(), m.get_inputs()
    sizes = [int(s) for s in sys.argv[2].split(",")]
    data = np.load(sys.argv[3])
    rows = torch.from_numpy(data[data.files[0]])
    example = sample.repeat(2, *([1] * (sample.dim() - 1))) if sample.shape[0] < 2 else sample
    with contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(model, (example,), dynamo=True, verbose=False,
                                    dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    t_export = time.perf_counter()
    so = ort.SessionOptions(); so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(program.model_proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    cases = [sample.repeat(s, *([1] * (sample.dim() - 1)))[:s] for s in sizes] + [rows[i:i + 1] for i in range(len(rows))]
    for x in cases:
        with torch.no_grad():
            model(x)
        sess.run(None, {name: x.numpy()})
    print(json.dumps({"wall": time.perf_counter() - t0, "export": t_export - t0, "configurations": len(cases),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
''')

TOOL = textwrap.dedent('''
    import resource, sys, time, json, contextlib, io
    t0 = time.perf_counter()
    from onnx_bisect.cli import main
    argv = [sys.argv[1], "--batch-sizes", sys.argv[2], "--dataset", sys.argv[3], "--json", sys.argv[4]]
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    print(json.dumps({"wall": time.perf_counter() - t0, "status": int(status),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
''')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(HERE / "bench_models" / "bert_base.py"))
    parser.add_argument("--batch-sizes", default="1,4,16")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the fastest counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.npz")
        report = os.path.join(tmp, "matrix.json")
        subprocess.run([sys.executable, "-c", DATASET, args.model, data, str(args.samples)], check=True)
        floors, tools = [], []
        for _ in range(args.repeat):
            floors.append(run_fresh(FLOOR, args.model, args.batch_sizes, data))
            tools.append(run_fresh(TOOL, args.model, args.batch_sizes, data, report))
        floor = min(floors, key=lambda r: r["wall"])
        tool = min(tools, key=lambda r: r["wall"])
        matrix = json.loads(Path(report).read_text())
    print(f"model: {args.model}; batch sizes {args.batch_sizes} + {args.samples}-sample dataset "
          f"= {floor['configurations']} configurations")
    print(f"  floor       {floor['wall']:7.2f} s  (export {floor['export']:.2f} s)  peak RSS {floor['rss_mb']:7.0f} MB")
    print(f"  onnx-bisect {tool['wall']:7.2f} s  peak RSS {tool['rss_mb']:7.0f} MB  (exit {tool['status']}; "
          f"{matrix['summary']})")
    print(f"  ratio: time {tool['wall'] / floor['wall']:.2f}x (target <= 1.5x), memory "
          f"{tool['rss_mb'] / floor['rss_mb']:.2f}x")
    print("  onnx-bisect steps: " + ", ".join(f"{k} {v:.2f}s" for k, v in matrix["timings"].items()))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s)")
