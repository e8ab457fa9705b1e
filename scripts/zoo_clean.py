"""Clean-model sweep: onnx-bisect on 54 timm / torchvision architectures that nothing was planted in.

A warning is a claim. On a clean export (random weights, eval mode, the tool's own export) onnx-bisect must
exit 0, print no warning and mark no layer ``diverged``. This script runs the tool on every model of the zoo
below, one at a time, and measures how often that promise is broken, and why:

* per model: exit status, ``ok``, the outputs' max abs / max rel error and the error relative to the output
  magnitude, the ``diverged`` rows (first few with module / ONNX node / local error), ``first_divergence``
  (module, cause), every warning (classified into patterns), leaf coverage, wall time, peak RSS;
* for every stale-weight / refold warning: a diagnosis of WHY the initializers differ (a BatchNorm fold that
  differs only by float rounding, the fold of a BatchNorm whose weight is zero, a weight-standardised conv
  weight the exporter folded into a constant, a constant folded from something else ...), by loading the
  exported ONNX (kept with ``--save-onnx``) next to the PyTorch model and re-doing the tool's comparison;
* for a clean model that diverges: the magnitude of every aligned tensor (ONNX Runtime run with the tensors
  exposed), so the diverged rows' error can be read relative to their own activation magnitude, and whether
  the error grows with the magnitude (float32 conditioning) rather than pointing at one faulty node.

Run (the orchestrator needs only the standard library; the tool and the diagnosis run in /work/venv-zoo, which
has torch (CPU) + timm + torchvision + the tool's dependencies; the tool comes from the frozen copy):

    nice -n 15 python3 scripts/zoo_clean.py --out /tmp/zoo/results.json            # every model (54)
    nice -n 15 python3 scripts/zoo_clean.py --models timm/resnet50,tv/vit_b_16     # some of them
    python3 scripts/zoo_clean.py --report /tmp/zoo/results.json                    # re-print, no re-run
    python3 scripts/zoo_clean.py --list                                             # the zoo

    nice -n 15 python3 scripts/zoo_clean.py --init trained-like --out /tmp/zoo/results_trained.json

Options: ``--timeout S`` per tool run (600), ``--size N`` overrides every model's input size, ``--init
{default,trained-like}`` (the library's random init, or BatchNorm statistics / affine parameters like a trained
network's and no all-zero heads, so every BatchNorm fold is a real rescale and no output is identically zero),
``--exporter
{default,dynamo,torchscript}`` (repeatable; default: the tool's own choice, dynamo with TorchScript fallback),
``--tool-src`` (this checkout's ``src``; a frozen copy keeps edits out of a run), ``--python`` (``/work/venv-zoo/bin/python``), ``--workdir``
(``/tmp/zoo``), ``--mem-limit-gb`` (8: a run whose RSS exceeds it is killed and reported), ``--no-diagnose``.
With ``--out`` the results file is rewritten after every model, so an interrupted sweep keeps what it measured
(``--resume`` skips the models already in it); ``--rediagnose RESULTS.json`` re-runs only the diagnosis.

Every model file imports ``/work/shared/tools/torchvision_cpu_shim.py`` first (torchvision's CUDA wheel against
the CPU torch), builds the model with ``torch.manual_seed`` in ``get_model()`` and returns a seeded
``1×3×S×S`` normal input from ``get_inputs()``. No weights are downloaded (``pretrained=False`` /
``weights=None``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOL_SRC = str(Path(__file__).resolve().parent.parent / "src")  # this checkout's tool (--tool-src: a frozen copy)
VENV_PYTHON = "/work/venv-zoo/bin/python"  # a Python with torch (CPU), timm and torchvision (--python)
SHIM_DIR = "/work/shared/tools"
WORKDIR = "/tmp/zoo"
F32_EPS = 1.1920929e-07

# ------------------------------------------------------------------------------------------------ the zoo
# (key, library, constructor name, input size, constructor kwargs, post-processing, what it exercises)
# size: the smallest convenient input the model accepts; 224 only where the architecture fixes it.
ZOO: list[tuple[str, str, str, int, dict, str, str]] = [
    # --- timm CNNs
    ("timm/resnet18", "timm", "resnet18", 64, {}, "", "plain ResNet, BN folds"),
    ("timm/resnet50", "timm", "resnet50", 64, {}, "", "bottleneck, zero-init last BN (zero_init_last)"),
    ("timm/resnetv2_50", "timm", "resnetv2_50", 64, {}, "", "pre-activation ResNet (BN before conv)"),
    ("timm/resnetv2_50x1_bit", "timm", "resnetv2_50x1_bit", 64, {}, "", "BiT: StdConv2d (weight standardisation) + GroupNorm"),
    ("timm/regnety_002", "timm", "regnety_002", 64, {}, "", "RegNetY, squeeze-excite"),
    ("timm/efficientnet_b0", "timm", "efficientnet_b0", 64, {}, "", "MBConv, SiLU, SE"),
    ("timm/mobilenetv3_small_100", "timm", "mobilenetv3_small_100", 64, {}, "", "hard-swish, SE"),
    ("timm/convnext_atto", "timm", "convnext_atto", 64, {}, "", "LayerNorm2d, layer scale"),
    ("timm/repvgg_a0", "timm", "repvgg_a0", 64, {}, "", "re-parameterisable, train-time branches (identity BN)"),
    ("timm/repvgg_a0_reparam", "timm", "repvgg_a0", 64, {}, "reparam", "re-parameterised (timm.utils.reparameterize_model)"),
    ("timm/mobileone_s0", "timm", "mobileone_s0", 64, {}, "", "MobileOne, multi-branch re-param blocks"),
    ("timm/ghostnet_100", "timm", "ghostnet_100", 64, {}, "", "ghost modules, concat"),
    ("timm/densenet121", "timm", "densenet121", 64, {}, "", "dense concat, BN-ReLU-Conv"),
    ("timm/inception_v3", "timm", "inception_v3", 96, {}, "", "Inception (needs ≥ 75 px)"),
    ("timm/dla34", "timm", "dla34", 64, {}, "", "deep layer aggregation"),
    ("timm/hrnet_w18_small", "timm", "hrnet_w18_small", 64, {}, "", "multi-resolution, upsampling"),
    ("timm/nf_resnet26", "timm", "nf_resnet26", 64, {}, "", "normalizer-free, ScaledStdConv2d"),
    ("timm/dm_nfnet_f0", "timm", "dm_nfnet_f0", 64, {}, "", "NFNet-F0, ScaledStdConv2dSame, GELU"),
    ("timm/cspresnet50", "timm", "cspresnet50", 64, {}, "", "cross-stage partial"),
    ("timm/tresnet_m", "timm", "tresnet_m", 64, {}, "", "space-to-depth, anti-alias, leaky-ReLU BN"),
    ("timm/rexnet_100", "timm", "rexnet_100", 64, {}, "", "ReXNet"),
    ("timm/lcnet_050", "timm", "lcnet_050", 64, {}, "", "PP-LCNet, hard-swish"),
    ("timm/fastvit_t8", "timm", "fastvit_t8", 64, {}, "", "FastViT, RepMixer (re-param)"),
    ("timm/tf_efficientnetv2_b0", "timm", "tf_efficientnetv2_b0", 64, {}, "", "TF 'same' padding"),
    # --- timm transformers / hybrids / MLPs
    ("timm/vit_tiny_patch16_224", "timm", "vit_tiny_patch16_224", 224, {}, "", "ViT at its own 224 px"),
    ("timm/deit_tiny_patch16_224@64", "timm", "deit_tiny_patch16_224", 64, {"img_size": 64}, "", "DeiT, 4×4 tokens"),
    ("timm/swin_tiny_patch4_window7_224@64", "timm", "swin_tiny_patch4_window7_224", 64,
     {"img_size": 64, "window_size": 4}, "", "Swin, relative position bias, shifted windows"),
    ("timm/maxvit_nano_rw_256@64", "timm", "maxvit_nano_rw_256", 64, {"img_size": 64}, "", "MaxViT block/grid attention"),
    ("timm/coatnet_nano_rw_224@64", "timm", "coatnet_nano_rw_224", 64, {"img_size": 64}, "", "CoAtNet"),
    ("timm/mixer_s16_224@64", "timm", "mixer_s16_224", 64, {"img_size": 64}, "", "MLP-Mixer"),
    ("timm/poolformer_s12", "timm", "poolformer_s12", 64, {}, "", "MetaFormer pooling, GroupNorm"),
    ("timm/levit_128s@64", "timm", "levit_128s", 64, {"img_size": 64}, "", "LeViT, attention bias, BN-Linear"),
    ("timm/pvt_v2_b0", "timm", "pvt_v2_b0", 64, {}, "", "PVTv2, spatial-reduction attention"),
    ("timm/efficientformer_l1", "timm", "efficientformer_l1", 224, {}, "", "EfficientFormer (fixed 7×7 attention)"),
    ("timm/mobilevit_xxs", "timm", "mobilevit_xxs", 64, {}, "", "MobileViT, unfold/fold"),
    ("timm/edgenext_xx_small", "timm", "edgenext_xx_small", 64, {}, "", "EdgeNeXt, split depthwise transposed attention"),
    ("timm/eva02_tiny_patch14_224@70", "timm", "eva02_tiny_patch14_224", 70, {"img_size": 70}, "", "EVA-02, RoPE, SwiGLU"),
    ("timm/xcit_nano_12_p16_224", "timm", "xcit_nano_12_p16_224", 64, {}, "", "cross-covariance attention, Fourier pos-enc"),
    ("timm/cait_xxs24_224@64", "timm", "cait_xxs24_224", 64, {"img_size": 64}, "", "CaiT, talking heads, layer scale"),
    # --- torchvision
    ("tv/resnet18", "tv", "resnet18", 64, {}, "", "torchvision ResNet"),
    ("tv/mobilenet_v2", "tv", "mobilenet_v2", 64, {}, "", "ReLU6"),
    ("tv/mobilenet_v3_small", "tv", "mobilenet_v3_small", 64, {}, "", "hard-swish, SE"),
    ("tv/efficientnet_b0", "tv", "efficientnet_b0", 64, {}, "", "torchvision EfficientNet, stochastic depth"),
    ("tv/regnet_y_400mf", "tv", "regnet_y_400mf", 64, {}, "", "RegNetY"),
    ("tv/convnext_tiny", "tv", "convnext_tiny", 64, {}, "", "permute + LayerNorm, layer scale"),
    ("tv/squeezenet1_1", "tv", "squeezenet1_1", 64, {}, "", "fire modules, no BN"),
    ("tv/shufflenet_v2_x0_5", "tv", "shufflenet_v2_x0_5", 64, {}, "", "channel shuffle"),
    ("tv/mnasnet0_5", "tv", "mnasnet0_5", 64, {}, "", "MNASNet"),
    ("tv/googlenet", "tv", "googlenet", 64, {"aux_logits": False, "init_weights": True}, "", "GoogLeNet"),
    ("tv/densenet121", "tv", "densenet121", 64, {}, "", "torchvision DenseNet"),
    ("tv/vgg11_bn", "tv", "vgg11_bn", 64, {}, "", "VGG with BN, big Linear"),
    ("tv/vit_b_16@64", "tv", "vit_b_16", 64, {"image_size": 64}, "", "torchvision ViT-B/16"),
    ("tv/swin_t", "tv", "swin_t", 64, {}, "", "torchvision Swin (padding to windows)"),
    ("tv/maxvit_t", "tv", "maxvit_t", 224, {}, "", "torchvision MaxViT (224 fixed)"),
]

# ------------------------------------------------------------------------------------------------ warnings
PATTERNS = [  # (pattern, regex on the warning text); first match wins
    ("stale-weights", r"initializer\(s\) differ from the PyTorch parameters"),
    ("bn-refold", r"hold a Conv/Linear with a BatchNorm folded in"),
    ("fixed-batch", r"fixed batch size"),
    ("checker", r"onnx\.checker"),
    ("training-mode", r"exported in training mode|came in training mode"),
    ("float64", r"computes in float64"),
    ("hidden-divergence", r"The outputs agree, but .* introduce error beyond tolerance"),
    ("instrumented-differs", r"instrumented run disagrees"),
    ("output-count", r"PyTorch returned .* output tensor"),
    ("no-aligned-tensor", r"no aligned tensor does"),
    ("input-cast", r"was cast for ONNX Runtime"),
]
PATTERN_ORDER = [p for p, _ in PATTERNS] + ["other"]


def classify_warning(text: str) -> str:
    for name, rx in PATTERNS:
        if re.search(rx, text, re.DOTALL):
            return name
    return "other"


# ------------------------------------------------------------------------------------------------ model files
MODEL_FILE = '''"""zoo_clean model file: {key} ({note}). Random weights (seed {seed}), init {init}, eval mode."""
import sys

sys.path.insert(0, {shim_dir!r})
import torchvision_cpu_shim  # noqa: F401,E402  (first: torchvision's CUDA wheel against the CPU torch)
import torch  # noqa: E402


def _trained_like(model, seed):
    """BatchNorm statistics and affine parameters like a trained network's (mean ~ N(0, 0.2), var ~ U(0.5, 2),
    gamma ~ U(0.5, 1.5) also where the init zeroes it, beta ~ N(0, 0.1)), and zero-initialised weights (classifier
    heads) drawn from N(0, 0.02): every BatchNorm fold is then a real rescale and the outputs are not zero."""
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                if m.running_mean is not None:
                    m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                    m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                if m.weight is not None:
                    m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(n, generator=g) * 0.1)
            elif isinstance(m, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) and not m.weight.any():
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.02)
    return model


def get_model():
    torch.manual_seed({seed})
{build}
    return model.eval()


def get_inputs():
    return torch.randn(1, 3, {size}, {size}, generator=torch.Generator().manual_seed({seed} + 1))
'''


def model_source(spec, size: int, seed: int = 0, init: str = "default") -> str:
    key, lib, name, _, kwargs, post, note = spec
    if lib == "timm":
        build = f"    import timm\n    model = timm.create_model({name!r}, pretrained=False, **{kwargs!r})"
    else:
        build = (f"    import torchvision\n    model = torchvision.models.get_model({name!r}, weights=None, "
                 f"**{kwargs!r})")
    if init == "trained-like":
        build += f"\n    model = _trained_like(model, {seed})"
    if post == "reparam":
        build += ("\n    from timm.utils.model import reparameterize_model\n"
                  "    model = reparameterize_model(model.eval())")
    return MODEL_FILE.format(key=key, note=note, seed=seed, shim_dir=SHIM_DIR, build=build, size=size, init=init)


def slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", key)


# ------------------------------------------------------------------------------------------------ running
def run_limited(cmd: list[str], *, cwd: str, env: dict, stdout: str, stderr: str, timeout: float,
                mem_limit_kb: int) -> dict:
    """Run ``cmd`` in its own process group; kill it on timeout or when its RSS exceeds the limit.
    Returns exit code, wall time, peak RSS (of the child, from wait4) and why it was killed (if it was)."""
    start = time.monotonic()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
    killed, peak_seen = None, 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        rss = _rss_kb(proc.pid)
        peak_seen = max(peak_seen, rss)
        if killed is None and time.monotonic() - start > timeout:
            killed = "timeout"
        elif killed is None and rss > mem_limit_kb:
            killed = "memory"
        if killed:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.25)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"exit": proc.returncode, "wall_s": round(time.monotonic() - start, 2),
            "peak_rss_mb": round(max(usage.ru_maxrss, peak_seen) / 1024, 1), "killed": killed}


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tool_env(args) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = args.tool_src
    env.setdefault("OMP_NUM_THREADS", "2")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_model(spec, exporter: str, args) -> dict:
    key = spec[0]
    size = args.size or spec[3]
    tag = slug(key) + ("" if exporter == "default" else f".{exporter}") + ("" if args.init == "default" else f".{args.init}")
    d = Path(args.workdir) / tag
    d.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", "model.onnx", "diagnosis.json"):
        (d / stale).unlink(missing_ok=True)
    model_py = d / "model.py"
    model_py.write_text(model_source(spec, size, init=args.init))
    cmd = [args.python, "-m", "onnx_bisect", str(model_py), "--json", str(d / "report.json"),
           "--save-onnx", str(d / "model.onnx")]
    if exporter != "default":
        cmd += ["--exporter", exporter]
    rec = {"key": key, "lib": spec[1], "name": spec[2], "size": size, "kwargs": spec[4], "post": spec[5],
           "what": spec[6], "exporter_arg": exporter, "init": args.init, "dir": str(d)}
    run = run_limited(cmd, cwd=str(d), env=tool_env(args), stdout=str(d / "stdout.txt"),
                      stderr=str(d / "stderr.txt"), timeout=args.timeout, mem_limit_kb=int(args.mem_limit_gb * 2**20))
    rec.update(run)
    report_path = d / "report.json"
    stderr_text = (d / "stderr.txt").read_text(errors="replace")
    if run["killed"]:
        rec["status"] = "timeout" if run["killed"] == "timeout" else "out-of-memory"
        return rec
    if not report_path.exists():
        rec["error"] = _error_text(stderr_text)
        if run["exit"] == 2 and "Exporting the model to ONNX failed" in stderr_text:
            rec["status"] = "export-failed"
        elif run["exit"] == 2 and re.search(r"Calling '.*' failed|cannot be imported|ModelLoadError", stderr_text):
            rec["status"] = "build-failed"
        else:
            rec["status"] = "tool-error"  # a crash or a usage error on a clean model: the tool's fault
        return rec
    rec["status"] = "ran"
    rec.update(summarise_report(json.loads(report_path.read_text())))
    if not args.no_diagnose:
        rec["diagnosis"] = run_diagnosis(d, rec, args)
        mag = (rec["diagnosis"] or {}).get("output_magnitude")
        if mag:
            rec["out_magnitude"] = mag
            rec["out_err_ratio"] = (rec["out_max_abs"] or 0) / mag if mag else None
    return rec


def _error_text(stderr_text: str) -> str:
    lines = [ln for ln in stderr_text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("onnx-bisect: error")]
    return (errs[-1] if errs else " | ".join(lines[-3:]))[:600]


def summarise_report(r: dict) -> dict:
    outs = r.get("outputs") or []
    num = lambda v: float(v) if isinstance(v, (int, float)) else (math.inf if v in ("inf", "nan") else None)
    max_abs = max((num(o.get("max_abs")) or 0 for o in outs), default=None)
    max_rel = max((num(o.get("max_rel")) or 0 for o in outs), default=None)
    layers = r.get("layers") or []
    diverged = [lay for lay in layers if str(lay.get("status", "")).startswith("diverged")]
    fd = r.get("first_divergence")
    cov = r.get("coverage") or {}
    warnings = list(r.get("warnings") or [])
    return {
        "ok": r.get("ok"), "exporter": r.get("exporter"), "opset": r.get("opset"),
        "out_max_abs": max_abs, "out_max_rel": max_rel,
        "outputs": [{k: o.get(k) for k in ("name", "max_abs", "max_rel", "cosine", "ok")} for o in outs],
        "layers_total": len(layers),
        "diverged_rows": len(diverged),
        "introduced_rows": sum(1 for lay in diverged if "introduced" in str(lay.get("origin", "")) or
                               "introduced" in str(lay.get("status", ""))),
        "diverged_first": [{k: lay.get(k) for k in ("name", "module_type", "onnx_node", "onnx_tensor", "op_type", "match",
                                                    "max_abs", "max_rel", "local_max_abs", "status", "shape")}
                           for lay in diverged[:5]],
        "first_divergence": None if not fd else {
            "module": fd.get("module"), "cause": fd.get("cause"), "confidence": fd.get("confidence"),
            "confirmed": fd.get("confirmed"), "onnx_nodes": (fd.get("onnx_nodes") or [])[:4],
            "op_types": fd.get("op_types"), "max_abs": fd.get("max_abs"), "local_max_abs": fd.get("local_max_abs"),
            "introduced": fd.get("introduced"), "explanation": (fd.get("explanation") or "")[:500]},
        "warnings": warnings,
        "warning_patterns": [classify_warning(w) for w in warnings],
        "notes": list(r.get("notes") or []),
        "coverage": {k: cov.get(k) for k in ("leaf_activations", "aligned", "absent_from_graph", "fraction")},
        "reproduction": (r.get("reproduction") or {}).get("verdict"),
        "timings": r.get("timings"),
    }


def run_diagnosis(d: Path, rec: dict, args) -> dict | None:
    cmd = [args.python, os.path.abspath(__file__), "--_diagnose", str(d)]
    run = run_limited(cmd, cwd=str(d), env=tool_env(args), stdout=str(d / "diag_stdout.txt"),
                      stderr=str(d / "diag_stderr.txt"), timeout=args.timeout, mem_limit_kb=int(args.mem_limit_gb * 2**20))
    path = d / "diagnosis.json"
    if not path.exists():
        return {"error": f"diagnosis failed (exit {run['exit']}, {run['killed'] or 'no result'}): "
                         + _error_text((d / "diag_stderr.txt").read_text(errors="replace"))}
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------------ diagnosis worker
# Runs inside /work/venv-zoo with the frozen tool on PYTHONPATH: `zoo_clean.py --_diagnose DIR`.

def diagnose_dir(d: Path) -> None:
    import numpy as np
    import torch

    sys.path.insert(0, SHIM_DIR)
    import torchvision_cpu_shim  # noqa: F401
    from onnx_bisect.capture import modules as cap
    from onnx_bisect.diagnose import preflight
    from onnx_bisect.source.load import load_inputs, load_model
    from onnx_bisect.source.weights import split_weights_from_file

    report = json.loads((d / "report.json").read_text())
    out: dict = {}
    loaded, file_module = load_model(str(d / "model.py"))
    loaded.module.eval()
    inputs = load_inputs([], loaded, file_module)
    with torch.no_grad():
        captured = cap.capture_activations(loaded.module, inputs)
    out["output_magnitude"] = max(float(np.max(np.abs(o))) for o in captured.outputs if o.size)
    onnx_path = d / "model.onnx"
    if not onnx_path.exists():
        out["error"] = "no saved ONNX"
        _write(d / "diagnosis.json", out)
        return
    skeleton, weights = split_weights_from_file(str(onnx_path))
    patterns = [classify_warning(w) for w in report.get("warnings") or []]
    if "stale-weights" in patterns or "bn-refold" in patterns:
        diffs = preflight.compare_weights(loaded, skeleton, weights, captured)
        out["weight_differences"] = explain_weights(diffs, loaded, skeleton, weights, captured)
    diverged = [lay for lay in report.get("layers") or [] if str(lay.get("status", "")).startswith("diverged")]
    if diverged or not report.get("ok", True):
        out["magnitudes"] = magnitude_analysis(report, skeleton, weights, inputs, loaded, captured)
        out["truth"] = truth_test(loaded, inputs, captured, str(onnx_path), report.get("tolerance") or {})
    _write(d / "diagnosis.json", out)


def _write(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=_json_default))
    tmp.replace(path)


def _json_default(o):
    try:
        return float(o)
    except Exception:  # noqa: BLE001
        return str(o)


def explain_weights(diffs, loaded, skeleton, weights, captured) -> list[dict]:
    """For each initializer the tool flags, what it really is."""
    import numpy as np
    import onnx

    modules = dict(loaded.module.named_modules())
    params = {n: t.detach().cpu().double().numpy() for n, t in
              list(loaded.module.named_parameters()) + list(loaded.module.named_buffers()) if t.is_floating_point()}
    acts = captured.activations
    bn_of = {}  # conv module -> bn module, as the tool pairs them (capture data flow)
    for act in acts:
        if act.module_type in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"):
            for i in act.inputs:
                if acts[i].module_type in ("Conv1d", "Conv2d", "Conv3d", "Linear"):
                    bn_of[acts[i].module] = act.module
    # every BatchNorm (any subclass, e.g. timm's BatchNormAct2d) fed by a conv / linear (any subclass, e.g.
    # Conv2dSame), by data flow: what an exporter may fold although the tool does not pair it by class name
    import torch
    followers = {}
    for act in acts:
        mod = modules.get(act.module)
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            for i in act.inputs:
                src = modules.get(acts[i].module)
                if isinstance(src, (torch.nn.modules.conv._ConvNd, torch.nn.Linear)) and acts[i].module not in followers:
                    followers[acts[i].module] = act.module
    inits = {i.name: i for i in skeleton.graph.initializer}
    consumers: dict[str, list[str]] = {}
    for node in skeleton.graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(f"{node.op_type}:{node.name}")
    out = []
    for diff in diffs:
        init = inits.get(diff.initializer)
        value = weights.arrays.get(diff.initializer)
        if value is None and init is not None:
            value = onnx.numpy_helper.to_array(init)
        value = np.asarray(value, dtype=np.float64)
        entry = {"initializer": diff.initializer, "parameter": diff.parameter, "max_abs": diff.max_abs,
                 "rel_l2": diff.rel_l2, "refold": diff.refold, "shape": list(value.shape),
                 "used_by": consumers.get(diff.initializer, [])[:3]}
        folded = diff.parameter.endswith(" (+ folded BatchNorm)")
        pname = diff.parameter.replace(" (+ folded BatchNorm)", "")
        mod_name, _, leaf = pname.rpartition(".")
        module = modules.get(mod_name)
        entry["module_type"] = type(module).__name__ if module is not None else None
        try:
            if folded:
                entry.update(_explain_fold(value, mod_name, leaf, modules, bn_of, params))
            else:
                entry.update(_explain_plain(value, pname, module, params, modules, followers.get(mod_name)))
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not stop the sweep
            entry.update(kind="undiagnosed", detail=f"{type(exc).__name__}: {exc}")
        out.append(entry)
    return out


def _layout(value, ref):
    import numpy as np
    if ref.shape == value.shape:
        return ref
    if ref.ndim == 2 and ref.T.shape == value.shape:
        return ref.T
    return np.reshape(ref, value.shape)


def _rel(value, ref) -> float:
    import numpy as np
    return float(np.linalg.norm(value - ref) / (np.linalg.norm(ref) or 1.0))


def _ulps(value, ref) -> float:
    """Largest difference in float32 rounding steps at the tensor's scale: max |value - ref| / (eps32 · max |ref|)."""
    import numpy as np
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(value - ref)) / (F32_EPS * scale))


def _explain_fold(value, conv_name, leaf, modules, bn_of, params) -> dict:
    """An initializer the tool compared with its own (float64) fold of conv + BatchNorm."""
    import numpy as np
    import torch

    conv = modules[conv_name]
    bn_name = bn_of.get(conv_name)
    bn = modules.get(bn_name) if bn_name else None
    res = {"conv": conv_name, "batchnorm": bn_name}
    if bn is None:
        return dict(res, kind="fold-without-batchnorm", detail="the tool's fold pairs no BatchNorm here")
    gamma = bn.weight.detach().double().numpy() if bn.weight is not None else np.ones(bn.num_features)
    zero = gamma == 0
    res["bn_gamma_zero_channels"] = int(zero.sum())
    res["bn_channels"] = int(gamma.size)
    var, mean = bn.running_var.detach().double().numpy(), bn.running_mean.detach().double().numpy()
    beta = bn.bias.detach().double().numpy() if bn.bias is not None else np.zeros_like(gamma)
    w64 = conv.weight.detach().double().numpy()
    b64 = conv.bias.detach().double().numpy() if conv.bias is not None else np.zeros(w64.shape[0])
    scale64 = gamma / np.sqrt(var + bn.eps)
    # the float32 computations an exporter may have constant-folded
    w32, g32 = conv.weight.detach().float(), (bn.weight.detach().float() if bn.weight is not None else None)
    v32, m32 = bn.running_var.detach().float(), bn.running_mean.detach().float()
    g32 = g32 if g32 is not None else torch.ones_like(v32)
    b32 = (bn.bias.detach().float() if bn.bias is not None else torch.zeros_like(v32))
    bc = lambda t: t.reshape(-1, *[1] * (w32.dim() - 1))
    if leaf == "weight":
        fold64 = w64 * scale64.reshape(-1, *[1] * (w64.ndim - 1))
        candidates = {
            "fp32: w * (gamma / sqrt(var + eps))": (w32 * bc(g32 / torch.sqrt(v32 + bn.eps))).double().numpy(),
            "fp32: w * gamma * rsqrt(var + eps)": (w32 * bc(g32 * torch.rsqrt(v32 + bn.eps))).double().numpy(),
            "fp32: w * gamma / sqrt(var + eps)": (w32 * bc(g32) / bc(torch.sqrt(v32 + bn.eps))).double().numpy(),
            "raw conv weight (not folded)": w64,
        }
    else:
        fold64 = (b64 - mean) * scale64 + beta
        cb = conv.bias.detach().float() if conv.bias is not None else torch.zeros_like(v32)
        candidates = {
            "fp32: (b - mean) * gamma / sqrt(var + eps) + beta":
                ((cb - m32) * (g32 / torch.sqrt(v32 + bn.eps)) + b32).double().numpy(),
            "fp32: beta - mean * gamma * rsqrt(var + eps) (+ b * scale)":
                (b32 - m32 * g32 * torch.rsqrt(v32 + bn.eps) + cb * g32 * torch.rsqrt(v32 + bn.eps)).double().numpy(),
            "raw conv bias (not folded)": b64,
        }
    fold64 = _layout(value, fold64)
    res["rel_l2_vs_fold64"] = _rel(value, fold64)
    res["max_abs_vs_fold64"] = float(np.max(np.abs(value - fold64)))
    res["max_ulps_vs_fold64"] = _ulps(value, fold64)
    res["fold_max_abs"] = float(np.max(np.abs(fold64)))
    res["value_max_abs"] = float(np.max(np.abs(value)))
    exact = [n for n, c in candidates.items() if np.array_equal(value, _layout(value, c))]
    close = {n: _rel(value, _layout(value, c)) for n, c in candidates.items()}
    res["equals"] = exact
    res["rel_l2_vs"] = close
    # where is the difference? channels with gamma == 0 vs the others
    per_ch = np.abs(value - fold64).reshape(value.shape[0], -1).max(axis=1) if value.ndim >= 1 and \
        value.shape[0] == gamma.size else None
    if per_ch is not None:
        res["max_abs_in_zero_gamma_channels"] = float(per_ch[zero].max()) if zero.any() else None
        res["max_abs_in_other_channels"] = float(per_ch[~zero].max()) if (~zero).any() else None
    if exact and exact[0].startswith("raw"):
        kind = "unfolded-conv-paired-with-fold"
    elif zero.any() and (per_ch is None or not (~zero).any() or res["max_abs_in_other_channels"] <= 4 * F32_EPS *
                         max(res["fold_max_abs"], 1e-30)):
        kind = "zero-gamma-batchnorm-fold"
    elif res["rel_l2_vs_fold64"] < 1e-4:
        kind = "batchnorm-fold-rounding"
    else:
        kind = "batchnorm-fold-other"
    res["kind"] = kind
    return res


def _fold64(conv, bn, leaf: str):
    """conv.weight / conv.bias with ``bn`` folded in, in float64."""
    import numpy as np
    d = lambda t: t.detach().double().cpu().numpy()
    w = d(conv.weight)
    gamma = d(bn.weight) if bn.weight is not None else np.ones(w.shape[0])
    beta = d(bn.bias) if bn.bias is not None else np.zeros(w.shape[0])
    scale = gamma / np.sqrt(d(bn.running_var) + bn.eps)
    if leaf == "weight":
        return w * scale.reshape(-1, *[1] * (w.ndim - 1)), scale, gamma
    b = d(conv.bias) if conv.bias is not None else np.zeros(w.shape[0])
    return (b - d(bn.running_mean)) * scale + beta, scale, gamma


def _explain_plain(value, pname, module, params, modules, follower) -> dict:
    """An initializer the tool compared with a PyTorch parameter directly (by name or by value)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    ref = params.get(pname)
    if ref is None:
        return {"kind": "undiagnosed", "detail": f"no PyTorch tensor {pname}"}
    ref = _layout(value, ref)
    res = {"param_max_abs": float(np.max(np.abs(ref))), "value_max_abs": float(np.max(np.abs(value)))}
    leaf = pname.rpartition(".")[2]
    if follower is not None and leaf in ("weight", "bias") and module is not None:
        bn = modules[follower]
        fold, scale, gamma = _fold64(module, bn, leaf)
        fold = _layout(value, fold)
        res.update(batchnorm=follower, bn_class=type(bn).__name__, conv_class=type(module).__name__,
                   rel_l2_vs_fold64=_rel(value, fold), max_eps_vs_fold64=_ulps(value, fold),
                   bn_gamma_zero_channels=int(np.sum(gamma == 0)), bn_channels=int(gamma.size),
                   bn_eps=float(bn.eps), bn_scale_range=[float(scale.min()), float(scale.max())],
                   rel_if_default_bn=float(1 - 1 / np.sqrt(1 + bn.eps)))
        if res["rel_l2_vs_fold64"] < 1e-5 or res["max_eps_vs_fold64"] < 64:
            res["kind"] = ("fold-of-unpaired-zero-gamma-batchnorm" if np.all(gamma == 0)
                           else "fold-of-unpaired-batchnorm")
            res["detail"] = (f"the exporter folded {follower} ({type(bn).__name__}) into {pname} "
                             f"({type(module).__name__}); the tool pairs only BatchNorm1d/2d/3d/SyncBatchNorm after "
                             f"Conv1d/2d/3d/Linear by class name, so it compared the fold with the raw parameter")
            return res
    # per-output-channel affine fit: value[c] ≈ a_c * ref[c] + b_c (weight standardisation, a folded scale)
    v2, r2 = value.reshape(value.shape[0], -1), ref.reshape(ref.shape[0], -1)
    rc = r2 - r2.mean(axis=1, keepdims=True)
    a = np.sum((v2 - v2.mean(axis=1, keepdims=True)) * rc, axis=1) / np.maximum(np.sum(rc * rc, axis=1), 1e-300)
    b = v2.mean(axis=1) - a * r2.mean(axis=1)
    resid = np.linalg.norm(v2 - (a[:, None] * r2 + b[:, None])) / (np.linalg.norm(v2) or 1.0)
    res["per_channel_affine_residual"] = float(resid)
    res["per_channel_scale_range"] = [float(a.min()), float(a.max())]
    # the module's own standardised weight, when it is a weight-standardised conv (timm StdConv2d family)
    std = None
    if module is not None and pname.endswith(".weight") and hasattr(module, "eps") and \
            "std" in type(module).__name__.lower():
        w = module.weight.detach()
        gain = None
        if hasattr(module, "gain") and module.gain is not None:
            gain = (module.gain.detach() * getattr(module, "scale", 1.0)).reshape(-1)
        with torch.no_grad():
            std = F.batch_norm(w.reshape(1, w.shape[0], -1), None, None, weight=gain, training=True, momentum=0.,
                               eps=module.eps).reshape_as(w)
        s64 = std.double().numpy().reshape(value.shape)
        res["rel_l2_vs_standardised"] = _rel(value, s64)
        res["max_ulps_vs_standardised"] = _ulps(value, s64)
        res["equals_standardised_fp32"] = bool(np.array_equal(value, s64))
        res["module_eps"] = float(module.eps)
        res["has_gain"] = gain is not None
        # the same in float64, to see whether the fp32 rounding is what differs
        w64 = w.double()
        g64 = gain.double() if gain is not None else None
        s64b = F.batch_norm(w64.reshape(1, w.shape[0], -1), None, None, weight=g64, training=True, momentum=0.,
                            eps=module.eps).reshape_as(w64).numpy().reshape(value.shape)
        res["rel_l2_vs_standardised_fp64"] = _rel(value, s64b)
    if std is not None and res["rel_l2_vs_standardised"] < 1e-3:
        res["kind"] = "weight-standardised-conv-folded"
    elif resid < 1e-4:
        res["kind"] = "per-channel-affine-of-parameter"
    elif diff_is_rounding(value, ref):
        res["kind"] = "rounding-of-parameter"
    else:
        res["kind"] = "constant-from-other-computation"
    return res


def diff_is_rounding(value, ref) -> bool:
    return _rel(value, ref) < 1e-5


def truth_test(loaded, inputs, captured, onnx_path: str, tolerance: dict) -> dict:
    """Who is right? PyTorch float32 and ONNX Runtime (every optimization level) against PyTorch in float64.

    Float32 conditioning: PyTorch float32 is about as far from float64 as ONNX Runtime is. A real divergence:
    ONNX Runtime is far from float64 while PyTorch float32 is not (e.g. only with the optimizer on)."""
    import copy

    import numpy as np
    import onnxruntime as ort
    import torch

    from onnx_bisect.records.nest import flatten_outputs

    atol, rtol = float(tolerance.get("atol", 1e-4)), float(tolerance.get("rtol", 1e-3))
    res: dict = {}
    t32 = [np.asarray(o, dtype=np.float64) for o in captured.outputs]
    try:
        m64 = copy.deepcopy(loaded.module).double().eval()
        cast = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        with torch.no_grad():
            y = m64(*[cast(a) for a in inputs.args], **{k: cast(v) for k, v in inputs.kwargs.items()})
        t64 = [t.detach().numpy().astype(np.float64) for _, t in flatten_outputs(y)]
        res["torch32_vs_torch64_max_abs"] = max(float(np.max(np.abs(a - b))) for a, b in zip(t32, t64))
    except Exception as exc:  # noqa: BLE001 - some models cannot run in float64
        t64 = None
        res["torch64_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    feeds_np = [a.detach().cpu().numpy() for a in inputs.args]
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"):
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.intra_op_num_threads = 2
        sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], feeds_np)))
        outs = [np.asarray(o, dtype=np.float64) for o in outs]
        entry = {"vs_torch32_max_abs": max(float(np.max(np.abs(a - b))) for a, b in zip(outs, t32)),
                 "allclose_torch32": all(bool(np.allclose(a, b, atol=atol, rtol=rtol)) for a, b in zip(outs, t32))}
        if t64 is not None:
            entry["vs_torch64_max_abs"] = max(float(np.max(np.abs(a - b))) for a, b in zip(outs, t64))
        res[level.replace("ORT_", "").lower()] = entry
    if t64 is not None:
        ref = res["torch32_vs_torch64_max_abs"]
        shipped = res["enable_all"]["vs_torch64_max_abs"]
        plain = res["disable_all"]["vs_torch64_max_abs"]
        if shipped > 10 * max(ref, 1e-12) and plain <= 10 * max(ref, 1e-12):
            res["verdict"] = "real: ONNX Runtime's graph optimizations change the result (float64 truth)"
        elif shipped > 10 * max(ref, 1e-12):
            res["verdict"] = "real: the ONNX graph itself computes something else (float64 truth)"
        else:
            res["verdict"] = "float32 conditioning: ONNX Runtime is as close to float64 as PyTorch float32 is"
    return res


def magnitude_analysis(report, skeleton, weights, inputs, loaded, captured) -> dict:
    """Run the ONNX model with every reported tensor exposed; per layer max |x| and error / magnitude."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper
    from onnx_bisect.source.weights import join_weights

    layers = report.get("layers") or []
    tensors = {}
    dtypes = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}
    existing = {o.name for o in skeleton.graph.output}
    produced = {t for n in skeleton.graph.node for t in n.output}
    for lay in layers:
        t = lay.get("onnx_tensor")
        if t and t in produced and t not in existing and lay.get("dtype") in dtypes:
            tensors[t] = dtypes[lay["dtype"]]
    model = join_weights(skeleton, weights)
    model.graph.output.extend(helper.make_tensor_value_info(t, dt, None) for t, dt in tensors.items())
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {}
    names = [i.name for i in sess.get_inputs()]
    for name, arg in zip(names, inputs.args):
        feeds[name] = arg.detach().cpu().numpy()
    outs = sess.run(None, feeds)
    mags = {}
    for meta, val in zip(sess.get_outputs(), outs):
        v = np.asarray(val, dtype=np.float64)
        mags[meta.name] = (float(np.max(np.abs(v))) if v.size else 0.0, float(np.sqrt(np.mean(v * v))) if v.size else 0.0)
    torch_mag = {}
    for act in captured.activations:
        v = np.asarray(act.value)
        if v.size and np.issubdtype(v.dtype, np.floating):
            torch_mag[act.name] = float(np.max(np.abs(v)))
    rows, ratio_all = [], []
    for lay in layers:
        t = lay.get("onnx_tensor")
        if t not in mags or not isinstance(lay.get("max_abs"), (int, float)):
            continue
        mx, rms = mags[t]
        err = float(lay["max_abs"])
        local = lay.get("local_max_abs") if isinstance(lay.get("local_max_abs"), (int, float)) else None
        row = {"name": lay.get("name"), "onnx_node": lay.get("onnx_node"), "op_type": lay.get("op_type"),
               "status": lay.get("status"), "max_abs": err, "local_max_abs": local, "max_rel": lay.get("max_rel"),
               "magnitude": mx, "rms": rms, "match": lay.get("match"),
               "torch_magnitude": torch_mag.get(lay.get("name")),
               "err_over_mag": err / mx if mx else None,
               "err_in_f32_eps_of_mag": err / (F32_EPS * mx) if mx else None,
               # what the element-wise tolerance allows at the tensor's largest value, vs atol alone
               "atol_share": 1e-4 / (1e-4 + 1e-3 * mx)}
        rows.append(row)
        if mx and err > 0:
            ratio_all.append((math.log10(mx), math.log10(err), row["status"]))
    res = {"layers_measured": len(rows)}
    if len(ratio_all) >= 3:
        xs, ys = np.array([r[0] for r in ratio_all]), np.array([r[1] for r in ratio_all])
        res["corr_log_err_vs_log_mag"] = float(np.corrcoef(xs, ys)[0, 1])
        slope, icpt = np.polyfit(xs, ys, 1)
        res["fit_log_err_vs_log_mag"] = {"slope": float(slope), "intercept": float(icpt)}
        eps_units = np.array([r["err_in_f32_eps_of_mag"] for r in rows if r["err_in_f32_eps_of_mag"]])
        res["err_in_f32_eps_of_mag_percentiles"] = {p: float(np.percentile(eps_units, p)) for p in (50, 90, 99)}
    for r in rows:  # the paired ONNX tensor is not the PyTorch activation's value at all: a misalignment
        tm = r["torch_magnitude"]
        r["misaligned"] = bool(tm is not None and abs(tm - r["magnitude"]) > 1e-3 * max(tm, r["magnitude"]) + 1e-4
                               and r["max_abs"] > 1e-2 * max(tm, r["magnitude"]))
    div = [r for r in rows if str(r["status"]).startswith("diverged")]
    res["diverged"] = div[:8]
    fd = report.get("first_divergence") or {}
    at = [r for r in rows if fd and r["name"] in (fd.get("module_name"), fd.get("module"))]
    if at:
        res["first_divergence_row"] = at[0]
    res["diverged_count"] = len(div)
    res["diverged_misaligned"] = sum(r["misaligned"] for r in div)
    rest = [r["err_in_f32_eps_of_mag"] for r in div if not r["misaligned"] and r["err_in_f32_eps_of_mag"]]
    if rest:
        res["diverged_aligned_err_in_f32_eps"] = {"n": len(rest), "median": float(np.median(rest)),
                                                  "max": float(np.max(rest))}
    res["diverged_by_match"] = {}
    for r in div:
        res["diverged_by_match"][r["match"]] = res["diverged_by_match"].get(r["match"], 0) + 1
    if div:
        ok_rows = [r for r in rows if r["status"] in ("matched", "fused") and r["err_in_f32_eps_of_mag"]]
        res["matched_err_in_f32_eps_of_mag_max"] = max((r["err_in_f32_eps_of_mag"] for r in ok_rows), default=None)
        res["matched_max_magnitude"] = max((r["magnitude"] for r in ok_rows), default=None)
        res["diverged_min_magnitude"] = min(r["magnitude"] for r in div)
    res["largest_magnitude_layers"] = sorted(rows, key=lambda r: -r["magnitude"])[:5]
    return res


# ------------------------------------------------------------------------------------------------ report
def fmt(v, spec=".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec)


def false_alarm(rec: dict) -> bool:
    if rec["status"] == "tool-error":
        return True
    return rec["status"] == "ran" and (rec.get("exit") != 0 or rec.get("diverged_rows", 0) > 0)


def print_report(results: list[dict], clip: int = 70) -> None:
    rows = []
    for r in results:
        label = r["key"] + ("" if r.get("exporter_arg", "default") == "default" else f" [{r['exporter_arg']}]") \
            + ("" if r.get("init", "default") == "default" else f" [{r['init']}]")
        if r["status"] != "ran":
            rows.append((label, str(r.get("exit")), r["status"], "-", "-", "-", "-",
                         f"{r.get('wall_s', 0):.0f}", f"{r.get('peak_rss_mb', 0):.0f}",
                         (r.get("error") or "")[:clip]))
            continue
        warns = r.get("warnings") or []
        first = warns[0] if warns else ""
        rows.append((label, str(r["exit"]), fmt(r.get("out_max_abs")), fmt(r.get("out_magnitude")),
                     str(r.get("diverged_rows", 0)), str(len(warns)),
                     fmt((r.get("coverage") or {}).get("fraction"), ".2f"),
                     f"{r['wall_s']:.0f}", f"{r['peak_rss_mb']:.0f}",
                     (f"[{r['warning_patterns'][0]}] " + first)[:clip] if warns else ""))
    head = ("model", "exit", "max abs", "|out|", "div", "#w", "cov", "s", "MB", "first warning (clipped)")
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    print(line(head))
    print(line(["-" * w for w in widths]))
    for row in rows:
        print(line(row))

    ran = [r for r in results if r["status"] == "ran"]
    skipped = [r for r in results if r["status"] not in ("ran", "tool-error")]
    alarms = [r for r in results if false_alarm(r)]
    warned = [r for r in ran if r.get("warnings")]
    print()
    print(f"models run: {len(ran)} of {len(results)}"
          + (f"; skipped {len(skipped)}: " + ", ".join(f"{r['key']} ({r['status']})" for r in skipped) if skipped else ""))
    print(f"false alarms (exit ≠ 0, a diverged row, or a tool error on a clean model): {len(alarms)}"
          + (": " + ", ".join(f"{r['key']} (exit {r.get('exit')}, {r.get('diverged_rows', 0)} diverged"
                              + (f", first {r['first_divergence']['module']} cause {r['first_divergence']['cause']}"
                                 if r.get("first_divergence") else "") + ")" for r in alarms) if alarms else ""))
    print(f"false warnings (models with ≥ 1 warning): {len(warned)}"
          + (": " + ", ".join(f"{r['key']} ({len(r['warnings'])})" for r in warned) if warned else ""))
    by = {}
    for r in ran:
        for p in set(r.get("warning_patterns") or []):
            by.setdefault(p, []).append(r["key"])
    for p in PATTERN_ORDER:
        if p in by:
            print(f"  {p:22s} {len(by[p]):3d} model(s): {', '.join(by[p])}")
    tiny = [r for r in ran if r.get("out_magnitude") is not None and r["out_magnitude"] < 1e-3]
    if tiny:
        print(f"outputs below 1e-3 everywhere (the output check is nearly vacuous at atol 1e-4): {len(tiny)}: "
              + ", ".join(f"{r['key']} ({fmt(r['out_magnitude'])})" for r in tiny))
    zero = [r for r in ran if r.get("out_magnitude") is None and (r.get("diagnosis") or {}).get("output_magnitude") == 0]
    if zero:
        print(f"outputs identically zero (zero-initialised head): {', '.join(r['key'] for r in zero)}")
    tot_wall = sum(r.get("wall_s", 0) for r in results)
    peak = max((r.get("peak_rss_mb", 0) for r in results), default=0)
    print(f"total tool wall time {tot_wall / 60:.1f} min; largest peak RSS {peak:.0f} MB")
    print_diagnoses(results)


def print_diagnoses(results: list[dict]) -> None:
    kinds: dict[str, list[tuple[str, dict]]] = {}
    for r in results:
        for e in ((r.get("diagnosis") or {}).get("weight_differences") or []):
            kinds.setdefault(e.get("kind", "undiagnosed"), []).append((r["key"], e))
    if kinds:
        print("\nWhy the flagged initializers differ (every initializer the tool's comparison flags, by kind):")
        for kind, items in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
            models = sorted({k for k, _ in items})
            print(f"  {kind}: {len(items)} initializer(s) in {len(models)} model(s): {', '.join(models)}")
            for key, e in _examples(items):
                print(f"    e.g. {key}: {_describe(e)}")
    for r in results:
        diag = r.get("diagnosis") or {}
        if diag.get("error"):
            print(f"  ({r['key']}: {diag['error'][:200]})")
    div = [r for r in results if (r.get("diagnosis") or {}).get("magnitudes")]
    if div:
        print("\nDiverging / failing clean models, error against the tensors' own magnitude:")
    for r in div:
        m = r["diagnosis"]["magnitudes"]
        fd = r.get("first_divergence") or {}
        mis = m.get("diverged_misaligned")
        print(f"  {r['key']}: outputs max abs {fmt(r.get('out_max_abs'))} on |out| ≤ {fmt(r.get('out_magnitude'))} "
              f"(max rel {fmt(r.get('out_max_rel'))}); first divergence {fd.get('module')} cause {fd.get('cause')}")
        if m.get("diverged_count"):
            print(f"    {m['diverged_count']} diverged row(s), by match: {m.get('diverged_by_match')}; "
                  f"{mis} of the measured ones pair a PyTorch activation with an ONNX tensor of another magnitude "
                  "(misaligned)" + (f"; the {m['diverged_aligned_err_in_f32_eps']['n']} others err ≤ "
                                    f"{m['diverged_aligned_err_in_f32_eps']['max']:.0f} float32 eps of their |x| "
                                    f"(median {m['diverged_aligned_err_in_f32_eps']['median']:.0f})"
                                    if m.get("diverged_aligned_err_in_f32_eps") else ""))
        shown = ([m["first_divergence_row"]] if m.get("first_divergence_row") else []) + \
            [d for d in m.get("diverged", []) if d["name"] != (m.get("first_divergence_row") or {}).get("name")][:3]
        for d in shown:
            if d is shown[0] and m.get("first_divergence_row"):
                print("    at the first divergence:")
            tm = f", PyTorch |x| ≤ {fmt(d.get('torch_magnitude'))}" if d.get("torch_magnitude") is not None else ""
            print(f"    {d['name']} ({d['op_type']} {d['onnx_node']}, match {d.get('match')}{tm}"
                  f"{', MISALIGNED' if d.get('misaligned') else ''}): max abs {fmt(d['max_abs'])}, local "
                  f"{fmt(d['local_max_abs'])}, |x| ≤ {fmt(d['magnitude'])} → err/|x| {fmt(d['err_over_mag'])} "
                  f"= {fmt(d['err_in_f32_eps_of_mag'], '.0f')} float32 eps of |x|; atol share of tol at |x|max "
                  f"{fmt(d['atol_share'], '.2f')}")
        if "corr_log_err_vs_log_mag" in m:
            fit = m["fit_log_err_vs_log_mag"]
            pct = m["err_in_f32_eps_of_mag_percentiles"]
            print(f"    all {m['layers_measured']} aligned tensors: corr(log err, log |x|) "
                  f"{m['corr_log_err_vs_log_mag']:.2f}, slope {fit['slope']:.2f}; err in float32 eps of |x|: "
                  f"median {pct['50'] if '50' in pct else pct.get(50):.0f}, p99 "
                  f"{pct['99'] if '99' in pct else pct.get(99):.0f}; matched rows up to "
                  f"{fmt(m.get('matched_err_in_f32_eps_of_mag_max'), '.0f')} eps "
                  f"(|x| up to {fmt(m.get('matched_max_magnitude'))})")
        t = r["diagnosis"].get("truth") or {}
        if t:
            lv = " ".join(f"{k}={fmt((t.get(k) or {}).get('vs_torch64_max_abs'))}"
                          for k in ("disable_all", "enable_basic", "enable_extended", "enable_all"))
            print(f"    float64 truth: PyTorch fp32 off by {fmt(t.get('torch32_vs_torch64_max_abs'))}; ONNX Runtime off by "
                  f"{lv} → {t.get('verdict', t.get('torch64_error'))}")


def _examples(items, n: int = 2):
    """One or two examples, from different models where possible."""
    seen, out = set(), []
    for key, e in items:
        if key not in seen:
            out.append((key, e))
            seen.add(key)
        if len(out) == n:
            break
    return out


def _describe(e: dict) -> str:
    base = f"'{e['initializer']}' vs {e['parameter']} {tuple(e.get('shape') or ())}: tool says max abs " \
           f"{fmt(e['max_abs'])}, relative {fmt(e['rel_l2'], '.2g')}"
    kind = e.get("kind")
    if kind in ("batchnorm-fold-rounding", "batchnorm-fold-other", "zero-gamma-batchnorm-fold",
                "unfolded-conv-paired-with-fold"):
        best = min((e.get("rel_l2_vs") or {}).items(), key=lambda kv: kv[1], default=(None, None))
        extra = (f"; BN {e.get('batchnorm')} gamma == 0 in {e.get('bn_gamma_zero_channels')}/{e.get('bn_channels')} "
                 f"channels; |fold| ≤ {fmt(e.get('fold_max_abs'))}, |value| ≤ {fmt(e.get('value_max_abs'))}; "
                 f"max diff {fmt(e.get('max_ulps_vs_fold64'), '.1f')} float32 eps of its scale from the float64 fold")
        if e.get("equals"):
            extra += f"; equals exactly: {e['equals'][0]}"
        elif best[0]:
            extra += f"; closest: {best[0]} (relative {fmt(best[1], '.2g')})"
        if e.get("max_abs_in_zero_gamma_channels") is not None:
            extra += (f"; diff in zero-gamma channels {fmt(e['max_abs_in_zero_gamma_channels'])}, in the others "
                      f"{fmt(e.get('max_abs_in_other_channels'))}")
        return base + extra
    if kind in ("fold-of-unpaired-batchnorm", "fold-of-unpaired-zero-gamma-batchnorm"):
        return (base + f"; it is {e.get('conv_class')} {e['parameter']} with {e.get('batchnorm')} ({e.get('bn_class')}, "
                f"eps {e.get('bn_eps'):g}, gamma == 0 in {e.get('bn_gamma_zero_channels')}/{e.get('bn_channels')} channels, "
                f"scale gamma/sqrt(var+eps) in {fmt(e['bn_scale_range'][0], '.7g')}..{fmt(e['bn_scale_range'][1], '.7g')}) "
                f"folded in: relative {fmt(e.get('rel_l2_vs_fold64'), '.2g')} from the float64 fold "
                f"(max {fmt(e.get('max_eps_vs_fold64'), '.1f')} float32 eps of its scale); 1 - 1/sqrt(1 + eps) = "
                f"{fmt(e.get('rel_if_default_bn'), '.3g')}")
    if kind == "weight-standardised-conv-folded":
        return (base + f"; {e.get('module_type')} (eps {e.get('module_eps')}, gain {e.get('has_gain')}): the value is "
                f"the module's standardised weight, relative {fmt(e.get('rel_l2_vs_standardised'), '.2g')} from it "
                f"(fp32 exact: {e.get('equals_standardised_fp32')}, max diff {fmt(e.get('max_ulps_vs_standardised'), '.1f')}"
                f" float32 eps of its scale); per-channel scales {fmt(e['per_channel_scale_range'][0])}..{fmt(e['per_channel_scale_range'][1])}")
    if "per_channel_affine_residual" in e:
        return (base + f"; {e.get('module_type')}; per-channel affine of the parameter: residual "
                f"{fmt(e['per_channel_affine_residual'], '.2g')}, scales {fmt(e['per_channel_scale_range'][0])}.."
                f"{fmt(e['per_channel_scale_range'][1])}; used by {', '.join(e.get('used_by') or [])}")
    return base + (f"; {e.get('detail')}" if e.get("detail") else "")


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", help="comma-separated keys (or substrings of keys) from the zoo; default all")
    p.add_argument("--out", help="write the results here (rewritten after every model)")
    p.add_argument("--report", metavar="RESULTS.json", help="re-print a results file without running anything")
    p.add_argument("--resume", action="store_true", help="with --out: keep the models already measured there")
    p.add_argument("--timeout", type=float, default=600, help="seconds per tool run (default 600)")
    p.add_argument("--size", type=int, help="input size for every model (default: each model's own)")
    p.add_argument("--init", choices=["default", "trained-like"], default="default",
                   help="weights: the library's random init (default), or trained-like BatchNorm statistics / affine "
                        "parameters and no all-zero weights (every fold a real rescale, outputs not zero)")
    p.add_argument("--exporter", action="append", choices=["default", "dynamo", "torchscript"],
                   help="exporter(s) to run (repeatable; default: the tool's default)")
    p.add_argument("--tool-src", default=TOOL_SRC)
    p.add_argument("--python", default=VENV_PYTHON)
    p.add_argument("--workdir", default=WORKDIR)
    p.add_argument("--mem-limit-gb", type=float, default=8.0)
    p.add_argument("--no-diagnose", action="store_true", help="skip the weight / magnitude diagnosis")
    p.add_argument("--list", action="store_true", help="list the zoo and exit")
    p.add_argument("--rediagnose", metavar="RESULTS.json",
                   help="re-run only the diagnosis for the models in RESULTS.json (their directories must still "
                        "hold report.json, model.py, model.onnx), rewrite the file and print the report")
    p.add_argument("--_diagnose", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args._diagnose:
        diagnose_dir(Path(args._diagnose))
        return 0
    if args.list:
        for spec in ZOO:
            print(f"{spec[0]:40s} {spec[3]:4d}px  {spec[6]}")
        return 0
    if args.report:
        print_report(json.loads(Path(args.report).read_text())["results"])
        return 0
    if args.rediagnose:
        doc = json.loads(Path(args.rediagnose).read_text())
        wanted = [w.strip() for w in (args.models or "").split(",") if w.strip()]
        for rec in doc["results"]:
            if rec["status"] != "ran" or (wanted and not any(w in rec["key"] for w in wanted)):
                continue
            print(f"[{time.strftime('%H:%M:%S')}] diagnosing {rec['key']} ...", file=sys.stderr, flush=True)
            (Path(rec["dir"]) / "diagnosis.json").unlink(missing_ok=True)
            rec["diagnosis"] = run_diagnosis(Path(rec["dir"]), rec, args)
            mag = (rec["diagnosis"] or {}).get("output_magnitude")
            if mag:
                rec["out_magnitude"] = mag
                rec["out_err_ratio"] = (rec["out_max_abs"] or 0) / mag
            tmp = Path(args.rediagnose + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1, default=_json_default))
            tmp.replace(args.rediagnose)
        print_report(doc["results"])
        return 0
    specs = ZOO
    if args.models:
        wanted = [w.strip() for w in args.models.split(",") if w.strip()]
        specs = [s for s in ZOO if any(w == s[0] or w in s[0] for w in wanted)]
        if not specs:
            p.error(f"no zoo model matches {args.models!r} (see --list)")
    exporters = args.exporter or ["default"]
    results: list[dict] = []
    if args.out and args.resume and Path(args.out).exists():
        results = json.loads(Path(args.out).read_text())["results"]
    done = {(r["key"], r.get("exporter_arg", "default")) for r in results}
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    for spec in specs:
        for exporter in exporters:
            if (spec[0], exporter) in done:
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {spec[0]} ({exporter}) ...", file=sys.stderr, flush=True)
            rec = run_model(spec, exporter, args)
            print(f"    {rec['status']}, exit {rec.get('exit')}, {rec.get('wall_s')} s, {rec.get('peak_rss_mb')} MB, "
                  f"{len(rec.get('warnings') or [])} warning(s), {rec.get('diverged_rows', '-')} diverged",
                  file=sys.stderr, flush=True)
            results.append(rec)
            if args.out:
                tmp = Path(args.out + ".tmp")
                tmp.write_text(json.dumps({"tool_src": args.tool_src, "python": args.python,
                                           "results": results}, indent=1, default=_json_default))
                tmp.replace(args.out)
    print_report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
