"""Time the coverage triage of a 5,000-node ONNX file (target: under 5 seconds).

    python scripts/coverage_bench.py [--nodes 5000] [--hidden 256] [--opset 13]

Builds a transformer-like graph (MatMul/Add/LayerNormalization, attention
with Reshape/Transpose/Softmax, the exporters' erf GELU) with real weights,
then times, in fresh processes: ``onnx-bisect coverage FILE`` end to end
(load, validation, inventory, kernel matching, placement sessions, report),
and the same with --no-session.  Exit 1 when the full run misses the target.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

TARGET_SECONDS = 5.0


class GraphBuilder:
    """Appends uniquely named nodes and initializers."""

    def __init__(self, hidden: int, seed: int = 0):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.hidden = hidden
        self.rng = np.random.default_rng(seed)

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        name = f"{op_type.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def weight(self, shape, scale: float = 0.02) -> str:
        name = f"w_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(self, value, dtype=np.int64) -> str:
        name = f"c_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def block(self, x: str, heads: int = 4) -> str:
        """One encoder layer: about 30 nodes."""
        h, d = self.hidden, self.hidden // heads
        ln = self.op("LayerNormalization", [x, self.weight([h], 1.0), self.weight([h])], axis=-1, epsilon=1e-5)
        qkv = []
        for _ in range(3):
            proj = self.op("Add", [self.op("MatMul", [ln, self.weight([h, h])]), self.weight([h])])
            split = self.op("Reshape", [proj, self.const([1, -1, heads, d])])
            qkv.append(self.op("Transpose", [split], perm=[0, 2, 1, 3]))
        scores = self.op("MatMul", [qkv[0], self.op("Transpose", [qkv[1]], perm=[0, 1, 3, 2])])
        probs = self.op("Softmax", [self.op("Mul", [scores, self.const(1 / np.sqrt(d), np.float32)])], axis=-1)
        ctx = self.op("Transpose", [self.op("MatMul", [probs, qkv[2]])], perm=[0, 2, 1, 3])
        attn = self.op("Add", [self.op("MatMul", [self.op("Reshape", [ctx, self.const([1, -1, h])]),
                                                   self.weight([h, h])]), self.weight([h])])
        x = self.op("Add", [x, attn])
        ln2 = self.op("LayerNormalization", [x, self.weight([h], 1.0), self.weight([h])], axis=-1, epsilon=1e-5)
        up = self.op("Add", [self.op("MatMul", [ln2, self.weight([h, 4 * h])]), self.weight([4 * h])])
        erf = self.op("Erf", [self.op("Div", [up, self.const(np.sqrt(2.0), np.float32)])])
        gelu = self.op("Mul", [self.op("Mul", [up, self.op("Add", [erf, self.const(1.0, np.float32)])]),
                               self.const(0.5, np.float32)])
        down = self.op("Add", [self.op("MatMul", [gelu, self.weight([4 * h, h])]), self.weight([h])])
        return self.op("Add", [x, down])


def build_model(nodes: int, hidden: int) -> onnx.ModelProto:
    """A model with exactly ``nodes`` nodes (transformer layers, topped up with Relu)."""
    g = GraphBuilder(hidden)
    x = "x"
    while len(g.nodes) + 40 <= nodes:
        x = g.block(x)
    while len(g.nodes) < nodes:
        x = g.op("Relu", [x])
    graph = helper.make_graph(g.nodes, "bench", [helper.make_tensor_value_info("x", T.FLOAT, [1, 16, hidden])],
                              [helper.make_tensor_value_info(x, T.FLOAT, [1, 16, hidden])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def timed(argv: list[str]) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "onnx_bisect", *argv], capture_output=True, text=True)
    return time.perf_counter() - start, proc.returncode, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--opset", type=int, default=13, help="also triage against this opset (0: skip)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "bench.onnx")
        model = build_model(args.nodes, args.hidden)
        onnx.save(model, path)
        size_mb = path.stat().st_size / 1e6
        print(f"model: {len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers, {size_mb:.0f} MB")
        runs = {"full (sessions)": [], "--no-session": []}
        extra = ["--opset", str(args.opset)] if args.opset else []
        for _ in range(args.repeat):
            seconds, code, out = timed(["coverage", str(path), *extra])
            runs["full (sessions)"].append(seconds)
            assert code == 0, out
            runs["--no-session"].append(timed(["coverage", str(path), "--no-session", *extra])[0])
        summary_line = out.strip().splitlines()[-1]
        timed(["coverage", str(path), *extra, "--json", str(Path(tmp, "c.json"))])
        stages = json.loads(Path(tmp, "c.json").read_text())["timings"]
        print("stages (one run, seconds): " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        ok = True
        for label, times in runs.items():
            best, worst = min(times), max(times)
            print(f"{label:>16}: best {best:.2f}s, worst {worst:.2f}s over {len(times)} fresh processes "
                  f"(includes Python start-up and imports)")
            ok &= label != "full (sessions)" or worst < TARGET_SECONDS
        print(summary_line)
        print(f"target: under {TARGET_SECONDS:.0f} s for the full run -> {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
