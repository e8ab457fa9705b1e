"""Scale benchmark: LLaMA-style decoders of growing size, time and peak memory against the floor.

For each size (``--sizes``) and mode (``--modes``: ``onnx`` = a given external-data file, ``export`` = onnx-bisect
exports itself), in fresh processes:

* the floor: build the model, one PyTorch forward, (export and save with external data,) one ONNX Runtime
  session reading the file and one run;
* onnx-bisect on the clean model (exit 0 expected);
* a planted fault in layer ``L//2``'s ``mlp.down_proj`` weight (5 % noise): with ``--onnx`` written into a copy of the
  data file, when exporting a stale copy the module exports (``LLAMA_FAULT=1``); exit 1 and that module (and with
  ``--onnx`` the planted node) named as the first divergence expected.

Reported: wall time, peak RSS (ru_maxrss), the ratio to the floor, and RSS against one copy of the float32
weights (the issue's targets: RSS <= 1.3 x weights + 2 GB with --onnx, <= 1.6 x weights + 2 GB exporting).

    python scripts/bench_scale.py --sizes 0.1b,0.3b              # minutes, under 5 GB
    python scripts/bench_scale.py --sizes 1.3b --json s13.json   # ~8 min, ~10 GB free (the floor holds two copies)
    python scripts/bench_scale.py --sizes 3b --modes onnx        # ~7 min, ~14 GB free and ~40 GB of disk

Where two copies of the weights do not fit in the memory available (3 B on a 24 GB machine), the given file is
exported in fake mode and the floor is taken one framework at a time (PyTorch, then ONNX Runtime, in two
processes).  The 1.3 B and 3 B sizes need a machine with that memory free; run them alone.  Extra onnx-bisect options go
after ``--`` (e.g. ``-- --low-memory``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = HERE / "bench_models" / "llama_decoder.py"
GB = 2 ** 30

#: name -> LLAMA_SIZE (hidden, intermediate, layers, heads, key/value heads, vocabulary, tokens)
SIZES = {
    "0.1b": "1024,2816,8,16,4,32000,64",  # 0.12 B parameters, 0.49 GB
    "0.3b": "1024,2816,24,16,4,32000,64",  # 0.30 B, 1.2 GB
    "1.3b": "2048,6144,22,32,32,32000,64",  # 1.27 B, 5.1 GB (the hidden 2048, 22 layers)
    "3b": "3200,8640,24,32,32,32000,64",  # 3.1 B, 12.3 GB (open_llama_3b's widths, 24 layers)
}

FLOOR = textwrap.dedent('''
    import importlib.util, resource, sys, time, json, os, contextlib, io, warnings
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    import numpy as np, onnxruntime as ort, torch
    spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    args, path, step = m.get_inputs(), sys.argv[2], sys.argv[3]
    if step != "ort":  # "ort": ONNX Runtime alone (the second half of a floor taken one framework at a time)
        model = m.get_model()
        with torch.no_grad():
            ref = model(*args)
    if step == "export":
        with contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(model, args, dynamo=True, verbose=False).save(path, external_data=True)
    if step == "torch":  # PyTorch alone
        print(json.dumps({"wall": time.perf_counter() - t0,
                          "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        sys.exit(0)
    so = ort.SessionOptions(); so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    out = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
    print(json.dumps({"wall": time.perf_counter() - t0,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
''')

#: a model too large to hold twice exported as its users would (fake mode, as torch.onnx.enable_fake_mode did): traced without
#: weights, then the real weights applied and saved as external data -- one copy of the weights in memory
GIVEN_FAKE = textwrap.dedent('''
    import importlib.util, sys, contextlib, io, warnings, torch
    warnings.filterwarnings("ignore")
    spec = importlib.util.spec_from_file_location("m", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    args = m.get_inputs()
    from torch._subclasses.fake_tensor import FakeTensorMode  # what torch.onnx.enable_fake_mode did
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = m.get_model()
        fake_args = tuple(mode.from_tensor(a) for a in args)
        with contextlib.redirect_stdout(io.StringIO()):
            program = torch.onnx.export(fake, fake_args, dynamo=True, verbose=False, optimize=False)
    del fake
    real = m.get_model()
    program.apply_weights({**dict(real.named_parameters()), **dict(real.named_buffers())})
    program.optimize()  # the default export's optimization, once the weights are real
    program.save(sys.argv[2], external_data=True)
    print("{}")
''')

#: the libraries alone (torch, transformers, ONNX Runtime, onnx-bisect): what no run can go below
IMPORTS = textwrap.dedent('''
    import resource, json, torch, transformers, onnxruntime, onnx, onnx_bisect.cli
    from transformers import LlamaModel
    print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
''')

TOOL = textwrap.dedent('''
    import resource, sys, time, json, contextlib, io
    t0 = time.perf_counter()
    from onnx_bisect.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(sys.argv[1:])
    print(json.dumps({"wall": time.perf_counter() - t0, "status": int(status),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
''')


def run_fresh(code: str, *argv: str, env: dict) -> dict:
    """Run ``code`` in a fresh Python process; the JSON object its last stdout line prints."""
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"benchmark step failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def export_given(env: dict, folder: Path, fake: bool) -> Path:
    """The model exported once (dynamo, external data) as a user would ship it (``fake``: traced in fake mode,
    for a model too large to hold twice)."""
    path = folder / "given" / "model.onnx"
    path.parent.mkdir()
    run_fresh(GIVEN_FAKE if fake else FLOOR, str(MODEL), str(path), "export", env=env)
    return path


def floor_of(env: dict, target: str, mode: str, split: bool) -> dict:
    """The floor: both frameworks in one process, or (``split``: a model too large to hold twice) PyTorch and
    ONNX Runtime in two processes, one after the other (wall times added, the larger peak)."""
    if not split:
        return run_fresh(FLOOR, str(MODEL), target, "export" if mode == "export" else "given", env=env)
    parts = [run_fresh(FLOOR, str(MODEL), target, step, env=env) for step in ("torch", "ort")]
    return {"wall": sum(p["wall"] for p in parts), "rss_mb": max(p["rss_mb"] for p in parts), "split": True}


def available_gb() -> float:
    """Memory available now (Linux's MemAvailable), in GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2 ** 20
    return float("inf")


def plant_fault(given: Path, folder: Path, layer: int) -> tuple[Path, str]:
    """A copy of ``given`` whose ``model.layers.<layer>.mlp.down_proj`` MatMul weight has 5 % noise, written into
    the copied data file; returns the copy and the planted node's name."""
    import onnx

    sys.path.insert(0, str(HERE))
    import plant

    proto = onnx.load(str(given), load_external_data=False)
    node = plant.find_node(proto, "MatMul", f"model.layers.{layer}.mlp.down_proj")
    name = plant.weight_of(proto, node.name)
    init = next(i for i in proto.graph.initializer if i.name == name)
    info = {e.key: e.value for e in init.external_data}
    bad = folder / "bad"
    bad.mkdir()
    shutil.copy(given, bad / given.name)
    shutil.copy(given.parent / info["location"], bad / info["location"])
    weight = np.memmap(bad / info["location"], np.float32, "r+", int(info.get("offset", 0)), tuple(init.dims))
    weight += 0.05 * float(weight.std()) * np.random.default_rng(0).standard_normal(weight.shape).astype(np.float32)
    weight.flush()
    del weight
    return bad / given.name, node.name


def bench_size(label: str, modes: list[str], extra: list[str], folder: Path) -> list[dict]:
    """Every mode's rows for one size."""
    env = {**os.environ, "LLAMA_SIZE": SIZES[label]}
    hidden, inter, layers, heads, kv, vocab, _ = (int(x) for x in SIZES[label].split(","))
    params = vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * hidden * kv // heads + 3 * hidden * inter
                                        + 2 * hidden) + hidden
    rows = []
    imports = run_fresh(IMPORTS, env=env)["rss_mb"]
    # two copies of the weights (PyTorch's and ONNX Runtime's) and the libraries do not fit: the floor is
    # taken one framework at a time and the given file exported in fake mode
    large = 2 * params * 4 / GB + 3 > available_gb()
    if large and "export" in modes:
        print(f"[{label}] two copies of the weights do not fit in this machine's memory: 'export' mode needs "
              "onnx-bisect's own export to hold one; running it without a floor to compare with")
    given = export_given(env, folder, fake=large) if "onnx" in modes else None
    for mode in modes:
        target = str(given) if mode == "onnx" else str(folder / "floor-export.onnx")
        floor = floor_of(env, target, mode, split=large) if mode == "onnx" or not large else \
            {"wall": float("nan"), "rss_mb": float("nan")}
        argv = [str(MODEL), "--json", str(folder / "report.json"), *extra] + (["--onnx", target] if mode == "onnx" else [])
        tool = run_fresh(TOOL, *argv, env=env)
        report = json.loads((folder / "report.json").read_text())
        row = dict(size=label, mode=mode, params=params, weights_gb=params * 4 / GB, floor=floor, tool=tool,
                   imports_mb=imports,
                   steps=report["timings"], peaks=report.get("peak_rss_mb", {}), notes=report["notes"])
        if mode == "onnx":
            bad, node = plant_fault(given, folder, layers // 2)
            faulty = run_fresh(TOOL, *[a if a != target else str(bad) for a in argv], env=env)
        else:  # the module exports a stale copy of that weight (see bench_models/llama_decoder.py)
            node, faulty = None, run_fresh(TOOL, *argv, env={**env, "LLAMA_FAULT": "1"})
        fd = json.loads((folder / "report.json").read_text())["first_divergence"] or {}
        planted = f"model.layers.{layers // 2}.mlp.down_proj"
        row["fault"] = dict(status=faulty["status"], module=fd.get("module"), cause=fd.get("cause"),
                            pinned=fd.get("module") == planted and bool(fd.get("onnx_nodes"))
                            and (node is None or node in fd["onnx_nodes"]),
                            wall=faulty["wall"], rss_mb=faulty["rss_mb"])
        rows.append(row)
    return rows


def show(row: dict) -> None:
    """One size × mode, as text."""
    floor, tool, weights_mb = row["floor"], row["tool"], row["weights_gb"] * 1024
    limit = 1.3 if row["mode"] == "onnx" else 1.6
    print(f"\n[{row['size']} ({row['params'] / 1e9:.2f} B parameters, {row['weights_gb']:.2f} GiB), {row['mode']}]")
    how = " (PyTorch, then ONNX Runtime, in two processes)" if floor.get("split") else ""
    print(f"  floor        {floor['wall']:7.1f} s  peak RSS {floor['rss_mb']:8.0f} MB{how}")
    print(f"  onnx-bisect  {tool['wall']:7.1f} s  peak RSS {tool['rss_mb']:8.0f} MB  (exit {tool['status']})")
    print(f"  ratio to the floor: time {tool['wall'] / floor['wall']:.2f}x, memory {tool['rss_mb'] / floor['rss_mb']:.2f}x;"
          f" (RSS - 2 GB) / weights = {(tool['rss_mb'] - 2048) / weights_mb:.2f} (target <= {limit});"
          f" (RSS - libraries' {row['imports_mb']:.0f} MB) / weights = {(tool['rss_mb'] - row['imports_mb']) / weights_mb:.2f}"
          f" (floor {(floor['rss_mb'] - row['imports_mb']) / weights_mb:.2f})")
    print("  steps: " + ", ".join(f"{k} {v:.1f}s" for k, v in row["steps"].items()))
    print("  peak RSS after each step (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in row["peaks"].items()))
    if "fault" in row:
        f = row["fault"]
        print(f"  planted fault: exit {f['status']}, first divergence {f['module']} (node pinned: {f['pinned']}, cause "
              f"{f['cause']}), {f['wall']:.1f} s, peak RSS {f['rss_mb']:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.1b,0.3b", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--modes", default="onnx,export")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("extra", nargs="*", help="options passed on to onnx-bisect (after --)")
    args = parser.parse_args()
    rows = []
    for label in args.sizes.split(","):
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            for row in bench_size(label, args.modes.split(","), args.extra, Path(tmp)):
                show(row)
                rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s)")
