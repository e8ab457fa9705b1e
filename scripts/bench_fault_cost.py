"""What a fault inside attention costs on top of a clean run: bert-base, counted and timed in one run.

    python scripts/bench_fault_cost.py [--model scripts/bench_models/bert_base.py] [--repeat 2]

Exports the model once (dynamo) and derives two faulty files: the Softmax of a middle layer's attention
over the wrong axis, and that attention's score scale constant ×1.5.  ``onnx-bisect MODEL --onnx FILE``
runs on the clean file and on each faulty one in fresh processes (the fastest of ``--repeat`` counts), with
counters patched in: PyTorch forwards of the model (calls of a module while no other module runs: the
capture, the targeted op-level forward, a float64 conditioning run), ONNX Runtime sessions created and their
``run`` calls.  Printed per file: wall time and its ratio to the clean run's, the counts and what the fault
added to them, the aligned cut points and log2 of their number (the issue's budget for a fault inside
attention: at most one extra forward and log2(cut points) runs), and the first divergence found.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench import _export_once, run_fresh  # noqa: E402  (one export helper, one fresh-process runner)

TOOL = textwrap.dedent('''
    import json, sys, time, contextlib, io
    t0 = time.perf_counter()
    import onnxruntime as ort, torch
    counts = {"forwards": 0, "sessions": 0, "runs": 0}
    depth = [0]
    def pre(module, args):
        if depth[0] == 0:
            counts["forwards"] += 1
        depth[0] += 1
    def post(module, args, out):
        depth[0] -= 1
    torch.nn.modules.module.register_module_forward_pre_hook(pre)
    torch.nn.modules.module.register_module_forward_hook(post, always_call=True)
    def counted(method, key):
        def call(self, *a, **k):
            counts[key] += 1
            return method(self, *a, **k)
        return call
    cls = ort.InferenceSession
    cls.__init__ = counted(cls.__init__, "sessions")
    cls.run, cls.run_with_ort_values = counted(cls.run, "runs"), counted(cls.run_with_ort_values, "runs")
    from onnx_bisect.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        status = main([sys.argv[1], "--onnx", sys.argv[2], "--json", sys.argv[3]])
    print(json.dumps({"wall": time.perf_counter() - t0, "status": int(status), **counts}))
''')


def _middle(nodes: list, op: str) -> onnx.NodeProto:
    found = [n for n in nodes if n.op_type == op]
    if not found:
        raise SystemExit(f"the export has no {op} node")
    return found[len(found) // 2]


def softmax_axis(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The middle Softmax over the sequence axis of the queries (axis 2 of (batch, heads, q, k)), not keys."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    node = _middle(list(model.graph.node), "Softmax")
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute("axis", 2))
    return model, node.name


def scale_constant(model: onnx.ModelProto, softmax: str) -> tuple[onnx.ModelProto, str]:
    """The scalar Mul/Div nearest before the middle Softmax (the attention scale) reads its constant ×1.5 from
    an initializer of its own (exporters share one scale constant among all layers)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = list(model.graph.node)
    scalars = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    scalars.update((n.output[0], numpy_helper.to_array(n.attribute[0].t)) for n in nodes
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value")
    at = next(i for i, n in enumerate(nodes) if n.name == softmax)
    for node in reversed(nodes[:at]):
        index = next((i for i, name in enumerate(node.input) if name in scalars and scalars[name].size == 1), None)
        if node.op_type in ("Mul", "Div") and index is not None:
            value = scalars[node.input[index]]
            name = f"{node.name}_scale_x1.5"
            model.graph.initializer.append(numpy_helper.from_array((value * 1.5).astype(value.dtype), name))
            node.input[index] = name
            return model, node.name
    raise SystemExit("no scalar Mul/Div before the middle Softmax")


def measure(model_file: str, onnx_file: str, report: str, repeat: int) -> dict:
    runs = [run_fresh(TOOL, model_file, onnx_file, report) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["wall"])
    doc = json.loads(Path(report).read_text())
    best["cut_points"] = sum(1 for r in doc["layers"] if r.get("status") in ("matched", "diverged", "conditioned"))
    fd = doc.get("first_divergence") or {}
    best["found"] = (f"{fd.get('module')} {fd.get('onnx_nodes')} {fd.get('cause')} op={fd.get('op')}"
                     if fd else "no divergence")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(HERE / "bench_models" / "bert_base.py"))
    parser.add_argument("--repeat", type=int, default=2, help="runs of each file; the fastest counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        clean = os.path.join(tmp, "clean.onnx")
        _export_once(args.model, clean)
        base = onnx.load(clean)
        files = {"clean": (clean, "-")}
        axis_model, softmax = softmax_axis(base)
        for label, (faulty, node) in (("softmax-axis", (axis_model, softmax)),
                                      ("scale-constant", scale_constant(base, softmax))):
            path = os.path.join(tmp, f"{label}.onnx")
            onnx.save(faulty, path, save_as_external_data=True, location=f"{label}.onnx.data")
            files[label] = (path, node)
        report = os.path.join(tmp, "report.json")
        results = {label: measure(args.model, path, report, args.repeat) for label, (path, _) in files.items()}
    c = results["clean"]
    print(f"model: {args.model}")
    for label, r in results.items():
        extra = "" if label == "clean" else (
            f"  (+{r['forwards'] - c['forwards']} forwards, +{r['runs'] - c['runs']} runs, "
            f"+{r['sessions'] - c['sessions']} sessions; budget 1 forward, "
            f"log2({r['cut_points']}) = {math.log2(max(r['cut_points'], 1)):.1f} runs)")
        print(f"\n[{label}] planted in {files[label][1]}" if label != "clean" else "\n[clean]")
        print(f"  wall {r['wall']:6.2f} s ({r['wall'] / c['wall']:.2f}x clean), exit {r['status']}")
        print(f"  forwards {r['forwards']}, sessions {r['sessions']}, runs {r['runs']}{extra}")
        print(f"  first divergence: {r['found']}")


if __name__ == "__main__":
    started = time.perf_counter()
    np.seterr(all="ignore")
    main()
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s)")
