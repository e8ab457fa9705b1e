"""Measure alignment coverage and false divergences over a corpus of architectures × provenances.

    python scripts/alignment_corpus.py [--archs bert,cnn] [--provenances dynamo,slim:dynamo] [--json OUT.json]

Every architecture of scripts/corpus_models.py (tiny, seeded random weights) is
exported with the dynamo exporter and with the TorchScript exporter (opset 17);
each export is also run through ``onnxslim.slim``, saved by ONNX Runtime after
offline optimization (ORT_ENABLE_BASIC and ORT_ENABLE_EXTENDED), converted to
float16 (``onnxconverter_common``, ``keep_io_types=True``) and quantized to QDQ
int8 (``onnxruntime.quantization.quantize_static`` over a few random inputs).
``onnx_bisect.bisect(model, inputs, onnx=FILE)`` then checks every file.

Per cell: leaf-module coverage aligned/(total − absent), the absent count, the
leaf counts by match method, the verdict (ok, or DIVERGED with the number of
diverged layers), the first divergence, and the wall time of ``bisect``.
Per provenance: the pooled coverage and the worst architecture against the
targets (≥ 95 % dynamo, ≥ 90 % TorchScript and simplified/optimized files) and
the false-divergence count (must be 0 on clean files).

float16 and int8 files are compared with a tolerance fit for the dtype
(``--fp16-tol``, ``--int8-tol``); their divergences are not false ones.  They
are also bisected at the default tolerance, where they must diverge, and the
first divergence is called *plausible* when its segment holds a node that runs
in float16 (fp16) or reads a DequantizeLinear output (int8).

A failed export, conversion or bisection is reported with its reason.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_models  # noqa: E402

DEFAULT_TOL = (1e-4, 1e-3)
LOWP_TOL = {"fp16": (1e-2, 1e-2), "int8": (1e-1, 1e-1)}
BASES = ("dynamo", "torchscript")
#: provenance -> (kind, base); the kind says how the file is made from the base export
PROVENANCES = {
    "dynamo": ("export", None),
    "torchscript": ("export", None),
    **{f"{k}:{b}": (k, b) for k in ("slim", "ort-basic", "ort-extended", "fp16", "int8") for b in BASES},
}
DEFAULT_PROVENANCES = tuple(PROVENANCES)
#: architectures measured only on some provenances by default (the eager-attention variants stand in
#: for the dynamo export that fails with SDPA; their TorchScript files would count Swin and T5 twice)
ONLY = {v: tuple(p for p in PROVENANCES if p == "dynamo" or p.endswith(":dynamo")) for v in corpus_models.VARIANTS}
#: coverage target of each kind (None: measured, no target)
TARGETS = {"dynamo": 0.95, "torchscript": 0.90, "slim": 0.90, "ort-basic": 0.90, "ort-extended": 0.90,
           "fp16": None, "int8": None}
CLEAN_KINDS = ("export", "slim", "ort-basic", "ort-extended")


@dataclass
class Cell:
    arch: str
    provenance: str
    kind: str
    status: str = "error"  # ok | diverged | error | skipped
    reason: str = ""
    atol: float = DEFAULT_TOL[0]
    rtol: float = DEFAULT_TOL[1]
    aligned: int = 0
    total: int = 0
    absent: int = 0
    by_method: dict[str, int] = field(default_factory=dict)
    diverged_layers: int = 0
    diverged: list[dict[str, Any]] = field(default_factory=list)  # every DIVERGED layer
    first_divergence: dict[str, Any] | None = None
    output_max_abs: float | None = None
    unaligned: list[dict[str, str]] = field(default_factory=list)
    strict: dict[str, Any] | None = None  # fp16/int8: the run at the default tolerance
    audit: dict[str, Any] = field(default_factory=dict)  # where each unaligned leaf's value is (see audit())
    prepare_s: float = 0.0
    bisect_s: float = 0.0
    nodes: int = 0
    op_types: dict[str, int] = field(default_factory=dict)

    @property
    def denominator(self) -> int:
        return self.total - self.absent

    @property
    def coverage(self) -> float | None:
        return None if self.status in ("error", "skipped") else (self.aligned / self.denominator if self.denominator else 1.0)

    @property
    def audited_coverage(self) -> float | None:
        """Coverage with the absent leaves that the audit contradicts counted as unaligned."""
        if self.coverage is None:
            return None
        wrong = len(self.audit.get("absent_contradicted", ()))
        denom = self.denominator + wrong
        return self.aligned / denom if denom else 1.0

    @property
    def clean(self) -> bool:
        return self.kind in CLEAN_KINDS

    @property
    def target_kind(self) -> str:
        return self.provenance if self.kind == "export" else self.kind


# --------------------------------------------------------------------------- quiet

@contextlib.contextmanager
def quiet(enabled: bool = True):
    """Silence prints, warnings, loggers and native stdout/stderr (exporters, ORT, converters)."""
    if not enabled:
        yield
        return
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript",
                                              "onnxslim", "root", "transformers")]
    levels = [lg.level for lg in loggers]
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            for lg in loggers:
                lg.setLevel(logging.CRITICAL)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def _reason(exc: BaseException) -> str:
    """One line: the exception and, when it wraps another, the root cause (ANSI colours stripped)."""
    import re

    def line(e: BaseException, n: int) -> str:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
        return f"{type(e).__name__}: {' '.join(text.split())[:n]}"

    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    return line(exc, 300) if root is exc else f"{line(exc, 100)} [root cause: {line(root, 300)}]"


# --------------------------------------------------------------------------- making files

def export_dynamo(model, args, path: Path) -> None:
    import torch

    program = torch.onnx.export(model, args, dynamo=True, verbose=False, report=False)
    onnx.save(program.model_proto, path)


def export_torchscript(model, args, path: Path) -> None:
    import torch

    torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17)


def slim(src: Path, dst: Path) -> None:
    import onnxslim

    onnx.save(onnxslim.slim(onnx.load(src)), dst)


def ort_offline(level: str) -> Callable[[Path, Path], None]:
    def make(src: Path, dst: Path) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                       "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
        so.optimized_model_filepath = str(dst)
        so.intra_op_num_threads = 1
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        if not dst.exists():
            raise RuntimeError("ONNX Runtime wrote no optimized model")
    return make


def fp16(src: Path, dst: Path) -> None:
    from onnxconverter_common import float16

    onnx.save(float16.convert_float_to_float16(onnx.load(src), keep_io_types=True), dst)


def int8(calib: list[tuple], per_channel: bool = False, op_types: list[str] | None = None, qoperator: bool = False
         ) -> Callable[[Path, Path], None]:
    """quantize_static (QDQ, uint8 activations, int8 weights) calibrated on ``calib``; ``per_channel`` and
    ``op_types`` (only these ops quantized: the usual recipe for transformers, MatMul / Gemm / Conv) as
    onnxruntime.quantization takes them; ``qoperator``: the QOperator format instead (QLinearConv,
    QLinearMatMul …, the tensors between them uint8)."""
    def make(src: Path, dst: Path) -> None:
        import onnxruntime as ort
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        names = [i.name for i in ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).get_inputs()]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.batches = iter([{n: t.numpy() for n, t in zip(names, batch)} for batch in calib])

            def get_next(self):
                return next(self.batches, None)

        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator if qoperator else
                        QuantFormat.QDQ, per_channel=per_channel,
                        op_types_to_quantize=op_types, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return make


def runnable(path: Path, args: tuple) -> str:
    """Why ONNX Runtime (optimizations off) cannot load or run ``path`` on ``args``; "" when it can."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return f"ONNX Runtime cannot load it ({_reason(exc)})"
    try:
        session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})
    except Exception as exc:
        return f"ONNX Runtime cannot run it ({_reason(exc)})"
    return ""


# --------------------------------------------------------------------------- measuring

def limit_threads(n: int) -> None:
    """One thread for torch and for every ONNX Runtime session onnx-bisect opens (others share the cores)."""
    import torch

    torch.set_num_threads(n)
    from onnx_bisect.run import onnxruntime as backend

    original = backend.OnnxRuntimeBackend._options

    def _options(self, *args, **kwargs):
        so = original(self, *args, **kwargs)
        so.intra_op_num_threads = n
        so.inter_op_num_threads = 1
        return so

    backend.OnnxRuntimeBackend._options = _options


def low_precision_nodes(path: Path, kind: str) -> set[str]:
    """Nodes that compute in float16 (fp16) or read a dequantized tensor (int8)."""
    proto = onnx.load(path)
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:
        pass
    g = proto.graph
    nodes = set()
    if kind == "fp16":
        types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output)}
        types.update({i.name: i.data_type for i in g.initializer})
        for n in g.node:
            if n.op_type != "Cast" and any(types.get(t) == onnx.TensorProto.FLOAT16 for t in list(n.output) + list(n.input)):
                nodes.add(n.name)
    else:
        dq = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
        for n in g.node:
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") or any(i in dq for i in n.input):
                nodes.add(n.name)
    return nodes


AUDIT_MAX_REL = 1e-4


def scope_paths(proto: onnx.ModelProto) -> set[str]:
    """Every module path the graph names: dynamo name scopes, and TorchScript-style ``/a/b.0/Op`` node and
    tensor names with a Sequential's doubled component collapsed (``layer/layer.0`` → ``layer.0``)."""
    import ast
    import re

    paths: set[str] = set()
    pattern = re.compile(r"^/(.+)/[^/]+$")
    for n in proto.graph.node:
        for prop in n.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                try:
                    paths.update(x for x in ast.literal_eval(prop.value)[:-1] if x)
                except (ValueError, SyntaxError):
                    pass
        for text in (n.name, *n.output):
            m = pattern.match(text or "")
            if not m:
                continue
            parts: list[str] = []
            for comp in m.group(1).split("/"):
                if parts and comp.startswith(parts[-1] + "."):
                    parts[-1] = comp
                else:
                    parts.append(comp)
            dotted = ".".join(parts).split(".")
            paths.update(".".join(dotted[:k]) for k in range(1, len(dotted) + 1))
    return paths


def audit(report, proto: onnx.ModelProto, args: tuple) -> dict[str, Any]:
    """Where the value of every unaligned leaf is: in a graph tensor (alignment missed it), in an
    initializer (folded into a constant), or nowhere (fused away); and which "absent" leaves the graph
    does name or compute (so their exclusion from the coverage denominator is wrong)."""
    import onnxruntime as ort
    from onnx import numpy_helper
    from onnx_bisect.records import Status

    leaves = [r for r in report.layers if r.pair.activation.is_leaf and r.pair.activation.module
              and r.status is Status.UNMATCHED]
    out: dict[str, Any] = {"in_graph": [], "constant": [], "nowhere": [], "absent_contradicted": []}
    if not leaves:
        return out
    exposed = onnx.ModelProto()
    exposed.CopyFrom(proto)
    have = {o.name for o in exposed.graph.output}
    for n in exposed.graph.node:
        for o in n.output:
            if o and o not in have:
                exposed.graph.output.append(onnx.helper.make_empty_tensor_value_info(o))
                have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    session = ort.InferenceSession(exposed.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})))
    constants = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    constants.update({n.output[0]: numpy_helper.to_array(a.t) for n in proto.graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value"})
    paths = scope_paths(proto)

    def find(ref: np.ndarray, pool: dict[str, np.ndarray]) -> tuple[str, float] | None:
        best = None
        r = ref.astype(np.float64).ravel()
        norm = np.linalg.norm(r) + 1e-12
        for name, v in pool.items():
            if not isinstance(v, np.ndarray) or v.size != ref.size or v.dtype.kind not in "fc" or not ref.size:
                continue
            d = float(np.linalg.norm(v.astype(np.float64).ravel() - r) / norm)
            if best is None or d < best[1]:
                best = (name, d)
        return best

    for r in leaves:
        a = r.pair.activation
        entry = {"module": a.name, "module_type": a.module_type, "shape": list(a.value.shape),
                 "absent": r.pair.absent is not None}
        hit = find(a.value, values)
        const = find(a.value, constants)
        if hit and hit[1] <= AUDIT_MAX_REL:
            node = next((n for n in proto.graph.node if hit[0] in n.output), None)
            entry.update(tensor=hit[0], op_type=node.op_type if node is not None else None, rel=hit[1])
            out["in_graph"].append(entry)
        elif const and const[1] <= AUDIT_MAX_REL:
            entry.update(tensor=const[0], rel=const[1])
            out["constant"].append(entry)
        else:
            entry.update(closest=hit[0] if hit else None, rel=hit[1] if hit else None)
            out["nowhere"].append(entry)
        # An output the model never uses is pruned from a module the graph still computes: its scope being
        # named is expected; only a graph tensor holding its value contradicts that claim.
        unused = "do not use this value" in r.pair.note
        if entry["absent"] and ((a.module in paths and not unused) or "tensor" in entry and entry in out["in_graph"]):
            out["absent_contradicted"].append(
                {"module": a.name, "why": "value computed by " + entry["tensor"] if entry in out["in_graph"]
                 else "the graph names this module's scope"})
    return out


def summarize(report, lowp: set[str] | None = None) -> dict[str, Any]:
    from onnx_bisect.records import Status
    from onnx_bisect.report.text import leaf_coverage, to_json

    doc = to_json(report)
    aligned, total, absent = leaf_coverage(report.layers)
    fd = doc["first_divergence"]
    first = None
    if fd is not None:
        first = {"module": fd["module_name"], "module_type": fd["module_type"], "onnx_node": fd["onnx_node"],
                 "op_types": fd["op_types"], "introduced": fd["introduced"], "max_abs": fd["max_abs"],
                 "local_max_abs": fd["local_max_abs"], "cause": fd["cause"]}
        if lowp is not None:
            first["plausible"] = bool(set(fd["onnx_nodes"]) & lowp)
    worst = max((o["max_abs"] for o in doc["outputs"] if isinstance(o["max_abs"], float)), default=None)
    return {
        "ok": report.ok, "aligned": aligned, "total": total, "absent": absent,
        "by_method": doc["coverage"]["by_method"], "unaligned": doc["coverage"]["unaligned"],
        "diverged_layers": sum(1 for r in report.layers if r.status is Status.DIVERGED),
        "diverged": [{"module": r.pair.activation.name, "module_type": r.pair.activation.module_type,
                      "onnx_node": r.pair.node, "op_type": r.pair.op_type, "match": r.pair.method.value,
                      "max_abs": r.diff.max_abs if r.diff else None, "local_max_abs": r.local.max_abs if r.local else None,
                      "origin": r.origin.value}
                     for r in report.layers if r.status is Status.DIVERGED],
        "first_divergence": first, "output_max_abs": worst,
    }


def measure(cell: Cell, model, args, path: Path, verbose: bool) -> None:
    from onnx_bisect import bisect

    lowp = low_precision_nodes(path, cell.kind) if cell.kind in LOWP_TOL else None
    proto = onnx.load(path, load_external_data=False)
    cell.nodes = len(proto.graph.node)
    cell.op_types = dict(Counter(f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in proto.graph.node))
    t0 = time.perf_counter()
    with quiet(not verbose):
        report = bisect(model, args, onnx=str(path), atol=cell.atol, rtol=cell.rtol)
    cell.bisect_s = time.perf_counter() - t0
    try:
        cell.audit = audit(report, proto, args)
    except Exception as exc:
        cell.audit = {"error": _reason(exc)}
    s = summarize(report, lowp)
    cell.status = "ok" if s["ok"] and not s["diverged_layers"] else "diverged"
    for k in ("aligned", "total", "absent", "by_method", "unaligned", "diverged_layers", "diverged", "first_divergence",
              "output_max_abs"):
        setattr(cell, k, s[k])
    if cell.kind in LOWP_TOL and (cell.atol, cell.rtol) != DEFAULT_TOL:
        with quiet(not verbose):
            strict = bisect(model, args, onnx=str(path), atol=DEFAULT_TOL[0], rtol=DEFAULT_TOL[1])
        s = summarize(strict, lowp)
        cell.strict = {"ok": s["ok"], "diverged_layers": s["diverged_layers"], "first_divergence": s["first_divergence"]}


def run_arch(arch: str, provenances: list[str], workdir: Path, tols: dict, verbose: bool) -> list[Cell]:
    cells: list[Cell] = []
    try:
        with quiet(not verbose):
            model, args = corpus_models.build(arch)
    except Exception as exc:
        return [Cell(arch, p, PROVENANCES[p][0], "error", f"build failed: {_reason(exc)}") for p in provenances]
    calib = corpus_models.calibration(arch)
    makers: dict[str, Callable[[Path, Path], None]] = {
        "slim": slim, "ort-basic": ort_offline("basic"), "ort-extended": ort_offline("extended"),
        "fp16": fp16, "int8": int8(calib),
    }
    files: dict[str, Path | str] = {}  # provenance -> file, or the reason there is none
    needed_bases = {PROVENANCES[p][1] or p for p in provenances}
    for base in BASES:
        if base not in needed_bases:
            continue
        path = workdir / f"{arch}.{base}.onnx"
        t0 = time.perf_counter()
        try:
            with quiet(not verbose):
                (export_dynamo if base == "dynamo" else export_torchscript)(model, args, path)
            files[base] = path
        except Exception as exc:
            files[base] = f"export failed: {_reason(exc)}"
        files[base + "@s"] = time.perf_counter() - t0  # type: ignore[assignment]
    for prov in provenances:
        kind, base = PROVENANCES[prov]
        cell = Cell(arch, prov, kind)
        atol, rtol = tols.get(kind, DEFAULT_TOL)
        cell.atol, cell.rtol = atol, rtol
        cells.append(cell)
        t0 = time.perf_counter()
        if kind == "export":
            src = files[prov]
            cell.prepare_s = float(files[prov + "@s"])  # type: ignore[arg-type]
        else:
            base_file = files[base]
            if isinstance(base_file, str):
                cell.status, cell.reason = "skipped", f"no {base} export ({base_file})"
                continue
            src = workdir / f"{arch}.{prov.replace(':', '.')}.onnx"
            try:
                with quiet(not verbose):
                    makers[kind](base_file, src)
            except Exception as exc:
                cell.status, cell.reason = "error", f"{kind} conversion failed: {_reason(exc)}"
                continue
            cell.prepare_s = time.perf_counter() - t0
            problem = runnable(src, args)
            if problem:
                cell.status, cell.reason = "error", f"{kind} output is not runnable: {problem}"
                continue
        if isinstance(src, str):
            cell.status, cell.reason = "error", src
            continue
        try:
            measure(cell, model, args, src, verbose)
        except Exception as exc:
            cell.status, cell.reason = "error", f"bisect failed: {_reason(exc)}"
            if verbose:
                traceback.print_exc()
    return cells


# --------------------------------------------------------------------------- output

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _methods(by_method: dict[str, int]) -> str:
    short = {"metadata": "meta", "scope-name": "name", "structure": "struct", "identity": "ident", "fused": "fused",
             "graph-output": "out"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in sorted(by_method.items(), key=lambda kv: -kv[1]))


def _clip(text: str, width: int = 44) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _first(fd: dict | None) -> str:
    if not fd:
        return "-"
    text = f"{_clip(fd['module'])} ({'/'.join(fd['op_types'][:3])})"
    if "plausible" in fd:
        text += "" if fd["plausible"] else " IMPLAUSIBLE"
    return text


def render(cells: list[Cell]) -> str:
    from tabulate import tabulate

    rows = []
    for c in cells:
        if c.status in ("error", "skipped"):
            reason = c.reason
            if "[root cause: " in reason:  # the root cause says more than the exporter's wrapper
                reason = reason.split(":")[0] + ": " + reason.split("[root cause: ", 1)[1].rstrip("]")
            rows.append([c.arch, c.provenance, "-", "-", "-", "-", "-", "-", c.status.upper(),
                         reason if len(reason) <= 110 else reason[:109] + "…", "", "-", f"{c.prepare_s:.2f}"])
            continue
        verdict = "ok" if c.status == "ok" else ("DIVERGED" if c.first_divergence else "ok, layers DIVERGED")
        verdict += f" ({c.diverged_layers})" if c.diverged_layers else ""
        if c.kind in LOWP_TOL:
            verdict += f" @{c.atol:g}"
        first = _first(c.first_divergence)
        if first == "-" and c.diverged:
            d = c.diverged[0]
            first = f"{_clip(d['module'])} ({d['op_type']}, {d['match']}, {d['max_abs']:.3g})"
        strict = "" if c.strict is None else _first(c.strict["first_divergence"])
        au = c.audit
        where = "-" if "error" in au else "/".join(str(len(au.get(k, ()))) for k in ("in_graph", "constant", "nowhere"))
        absent = f"{c.absent}" + (f" ({len(au['absent_contradicted'])}✗)" if au.get("absent_contradicted") else "")
        rows.append([c.arch, c.provenance, _pct(c.coverage), f"{c.aligned}/{c.denominator}", absent,
                     _pct(c.audited_coverage), where, _methods(c.by_method), verdict, first, strict,
                     f"{c.bisect_s:.2f}", f"{c.prepare_s:.2f}"])
    return tabulate(rows, headers=["arch", "provenance", "cov %", "aligned", "absent", "audited %",
                                   "unal. g/c/n", "by method", "verdict",
                                   "first divergence (or diverged layer)", "first div. @default tol", "bisect s",
                                   "make s"], tablefmt="simple", disable_numparse=True)


def totals(cells: list[Cell], provenances: list[str]) -> list[dict[str, Any]]:
    out = []
    for prov in provenances:
        group = [c for c in cells if c.provenance == prov]
        if not group:
            continue
        measured = [c for c in group if c.coverage is not None]
        failed = [c for c in group if c.coverage is None]
        aligned = sum(c.aligned for c in measured)
        denom = sum(c.denominator for c in measured)
        pooled = aligned / denom if denom else None
        audited_denom = denom + sum(len(c.audit.get("absent_contradicted", ())) for c in measured)
        audited = aligned / audited_denom if audited_denom else None
        worst = min(measured, key=lambda c: c.coverage, default=None)
        target = TARGETS[group[0].target_kind]
        below = [c.arch for c in measured if target is not None and c.coverage < target]
        clean = group[0].clean
        false_div = [c.arch for c in measured if clean and c.status != "ok"]
        entry = {
            "provenance": prov, "cells": len(group), "measured": len(measured),
            "failed": {c.arch: c.reason for c in failed},
            "aligned": aligned, "denominator": denom, "pooled_coverage": pooled, "audited_coverage": audited,
            "audited_pass": None if target is None else (audited is not None and audited >= target),
            "worst": None if worst is None else {"arch": worst.arch, "coverage": worst.coverage},
            "target": target, "below_target": below,
            "coverage_pass": None if target is None else (pooled is not None and pooled >= target),
            "per_arch_pass": None if target is None else (not below and not failed),
            "false_divergences": false_div if clean else None,
            "false_divergence_pass": (not false_div) if clean else None,
            "bisect_s": sum(c.bisect_s for c in group),
        }
        if not clean:
            entry["diverged_at_dtype_tol"] = [c.arch for c in measured if c.status != "ok"]
            entry["implausible_first_divergence"] = [
                c.arch for c in measured for fd in (c.first_divergence, (c.strict or {}).get("first_divergence"))
                if fd and not fd.get("plausible", True)]
        out.append(entry)
    return out


def render_totals(rows: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    def verdict(x):
        return "-" if x is None else ("PASS" if x else "FAIL")

    body = []
    for r in rows:
        target = "-" if r["target"] is None else f"≥{100 * r['target']:.0f}"
        worst = "-" if r["worst"] is None else f"{_pct(r['worst']['coverage'])} ({r['worst']['arch']})"
        if r["false_divergence_pass"] is not None:
            fdv = f"{verdict(r['false_divergence_pass'])} ({len(r['false_divergences'])})"
        else:
            fdv = (f"n/a; diverged@tol: {','.join(r['diverged_at_dtype_tol']) or 'none'}; "
                   f"implausible: {','.join(sorted(set(r['implausible_first_divergence']))) or 'none'}")
        errs = ",".join(r["failed"]) or "-"
        body.append([r["provenance"], f"{r['measured']}/{r['cells']}", target,
                     f"{_pct(r['pooled_coverage'])} {verdict(r['coverage_pass'])}", worst, verdict(r["per_arch_pass"]),
                     f"{_pct(r['audited_coverage'])} {verdict(r['audited_pass'])}", fdv, errs, f"{r['bisect_s']:.1f}"])
    return tabulate(body, headers=["provenance", "measured", "target", "pooled cov %", "worst arch %", "every arch",
                                   "audited pooled %", "false divergences", "failed cells", "bisect s"],
                    tablefmt="simple", disable_numparse=True)


def render_unaligned(cells: list[Cell], limit: int) -> str:
    lines = []
    for c in cells:
        if c.unaligned and (c.coverage or 0) < 1:
            shown = "; ".join(f"{u['module']} ({u['module_type']}): {u['reason']}" for u in c.unaligned[:limit])
            more = f"; … +{len(c.unaligned) - limit}" if len(c.unaligned) > limit else ""
            lines.append(f"{c.arch} / {c.provenance}: {shown}{more}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default=",".join(corpus_models.ARCHS),
                        help=f"comma-separated, from {','.join(corpus_models.ARCHS)}")
    parser.add_argument("--provenances", default=",".join(DEFAULT_PROVENANCES),
                        help=f"comma-separated, from {','.join(PROVENANCES)}")
    parser.add_argument("--json", metavar="FILE", help="write cells and totals as JSON")
    parser.add_argument("--keep", metavar="DIR", help="keep the ONNX files in DIR (default: a temporary folder)")
    parser.add_argument("--fp16-tol", type=float, default=LOWP_TOL["fp16"][0], help="atol = rtol for fp16 files")
    parser.add_argument("--int8-tol", type=float, default=LOWP_TOL["int8"][0], help="atol = rtol for int8 files")
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime intra-op threads (default 1)")
    parser.add_argument("--unaligned", type=int, default=6, help="unaligned leaves listed per cell (0: none)")
    parser.add_argument("--all-provenances", action="store_true",
                        help=f"also measure {', '.join(ONLY)} on TorchScript-based provenances")
    parser.add_argument("--head", action="store_true",
                        help="measure the committed onnx_bisect (git HEAD, extracted to a temporary folder) instead "
                             "of the working tree, which other work may leave half-edited")
    parser.add_argument("--verbose", action="store_true", help="show exporter/converter output and tracebacks")
    a = parser.parse_args(argv)
    archs = [x for x in a.archs.split(",") if x]
    provenances = [x for x in a.provenances.split(",") if x]
    bad = [x for x in archs if x not in corpus_models.ARCHS] + [x for x in provenances if x not in PROVENANCES]
    if bad:
        parser.error(f"unknown architecture or provenance: {', '.join(bad)}")
    with contextlib.ExitStack() as snapshot:
        source = use_snapshot(snapshot) if a.head else "working tree"
        return _run(a, archs, provenances, source)


def use_snapshot(stack: contextlib.ExitStack) -> str:
    """Import onnx_bisect from ``git archive HEAD`` of this checkout; returns a description."""
    import subprocess

    if "onnx_bisect" in sys.modules:
        raise RuntimeError("onnx_bisect is already imported")
    repo = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onnx_bisect_head.")))
    archive = subprocess.run(["git", "-C", str(repo), "archive", "HEAD", "src/onnx_bisect"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    sys.path.insert(0, str(tmp / "src"))
    return f"git HEAD {commit}"


def _run(a, archs: list[str], provenances: list[str], source: str) -> int:
    limit_threads(a.threads)
    import onnx_bisect

    print(f"onnx_bisect from {source} ({Path(onnx_bisect.__file__).parent})", file=sys.stderr)
    tols = {"fp16": (a.fp16_tol, a.fp16_tol), "int8": (a.int8_tol, a.int8_tol)}
    cells: list[Cell] = []
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        workdir = Path(a.keep) if a.keep else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="corpus.")))
        workdir.mkdir(parents=True, exist_ok=True)
        for arch in archs:
            t0 = time.perf_counter()
            wanted = [p for p in provenances if a.all_provenances or p in ONLY.get(arch, provenances)]
            if not wanted:
                continue
            arch_cells = run_arch(arch, wanted, workdir, tols, a.verbose)
            cells.extend(arch_cells)
            print(f"[{time.perf_counter() - start:6.1f}s] {arch}: "
                  + ", ".join(f"{c.provenance}={_pct(c.coverage) if c.coverage is not None else c.status}"
                              + ("" if c.status != "diverged" else "!") for c in arch_cells)
                  + f" ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)
    summary = totals(cells, provenances)
    print(render(cells))
    print()
    print(render_totals(summary))
    unaligned = render_unaligned(cells, a.unaligned) if a.unaligned else ""
    if unaligned:
        print("\nUnaligned leaf modules (first per cell):\n" + unaligned)
    print("\nColumns: cov % = aligned/(total - absent) leaf modules; absent (n✗) = leaves onnx-bisect calls absent "
          "(excluded from the denominator), n of them contradicted by the graph (it names their scope or computes "
          "their value); audited % = coverage with those counted as unaligned; unal. g/c/n = unaligned leaves whose "
          "value is in a graph tensor (missed) / in an initializer or Constant (folded) / nowhere (fused or "
          "rewritten); by method over leaves.")
    print(f"\nTolerances: clean files atol={DEFAULT_TOL[0]:g} rtol={DEFAULT_TOL[1]:g}; fp16 atol=rtol={a.fp16_tol:g}; "
          f"int8 atol=rtol={a.int8_tol:g} (fp16/int8 also bisected at the default tolerance: '@default').")
    print(f"onnx_bisect measured: {source}. Total wall time {time.perf_counter() - start:.1f}s.")
    if a.json:
        doc = {
            "onnx_bisect": source,
            "tolerances": {"default": DEFAULT_TOL, "fp16": tols["fp16"], "int8": tols["int8"]},
            "targets": TARGETS,
            "cells": [{**c.__dict__, "coverage": c.coverage, "denominator": c.denominator} for c in cells],
            "totals": summary,
            "wall_s": time.perf_counter() - start,
        }
        Path(a.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    ok = all(r["coverage_pass"] is not False and r["false_divergence_pass"] is not False for r in summary)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
