"""Adversarial fault sweep: plant one fault into an ONNX file, run onnx-bisect on it, check the verdict.

    python scripts/fault_sweep.py [--archs bert,cnn,...] [--provenances dynamo,fp16,...] [--faults gelu-swap,...]
                                  [--sites 2] [--seed 0] [--workdir /tmp/sweep/work] [--out /tmp/sweep/results.json]
                                  [--jobs 1] [--timeout 300] [--tool-src SRC] [--quick]
                                  [--resume] [--plan-only]
    python scripts/fault_sweep.py --report /tmp/sweep/results.json [--misses]     # re-print, no re-run

For every architecture (scripts/sweep_models.py: tiny transformers configs and
hand-written CNN / RNN / UNet, seeded random weights) and every provenance — the
file a user brings: ``dynamo`` / ``torchscript`` exports, ``onnxsim`` (onnx-simplifier
on a TorchScript export), ``onnxslim`` (on a dynamo export), ``renamed`` (a dynamo
export with every node renamed ``n0…``, every tensor — graph inputs and outputs
included — ``t0…``, every metadata_props and doc_string dropped), ``fp16``
(onnxconverter-common, keep_io_types), ``ort-opt`` (ONNX Runtime ORT_ENABLE_EXTENDED
offline optimization of a TorchScript export), ``qdq-int8`` (quantize_static, QDQ,
seeded random calibration, on a TorchScript export), ``qdq-matmul`` (the same with only
MatMul / Gemm / Conv quantized, weights per channel: the transformer recipe), ``dynamic-int8``
(quantize_dynamic, int8 weights: DynamicQuantizeLinear + MatMulInteger / ConvInteger, the BERT recipe, on a
TorchScript export), ``qop-int8`` (quantize_static in the QOperator format: QLinearConv, QLinearMatMul,
QLinearAdd ..., uint8 tensors between them, seeded random calibration), ``ort-all`` (ONNX Runtime ORT_ENABLE_ALL
offline optimization: NCHWc layout and com.microsoft fused ops), ``torchscript-op14`` (a TorchScript export at
opset 14: LayerNormalization and GELU decomposed), ``slim-shuffled`` (onnxslim, then ``shuffled``'s reorder and
renaming), ``external-data`` (a dynamo export with every initializer in one ``clean.onnx.data`` beside it; the
faulty files planted from it are saved whole), ``int8-weights`` (onnxruntime's MatMulNBitsQuantizer, 8 bits, RTN,
symmetric, block 32: com.microsoft.MatMulNBits, constant-weight Gemms first rewritten as MatMul + Add; at 4 bits
the small random-weight transformers' clean files miss every tolerance of the ladder), ``opset-converted``
(onnx.version_converter to opset 21), ``mixed-fp16`` (float16 with keep_io_types and Add, the norms, Softmax,
ReduceMean, Pow and Sqrt kept in float32: the onnxruntime.transformers recipe); a derived file falls back to
the other exporter when its base export or the conversion fails — the sweep:

1. makes the clean file and picks its tolerance: fp32 files use onnx-bisect's defaults
   (atol 1e-4, rtol 1e-3); fp16 and int8 files the smallest atol = rtol of 1e-3, 1e-2,
   3e-2, 1e-1 (then 3e-1, beyond the issue's ladder) at which the clean file agrees
   with PyTorch in ONNX Runtime, graph optimizations on and off;
2. runs onnx-bisect on the clean file (a *false alarm*: exit ≠ 0 or a layer with status
   ``diverged``; every warning it prints on a clean file is a *false warning*);
3. for every fault kind of scripts/sweep_faults.py, shuffles the places it can go with a
   generator seeded by (seed, arch, provenance, kind) and plants ``--sites`` faults, one
   per file.  A fault *counts* when the faulty file's outputs differ from PyTorch's by at
   least 2× the tolerance (allclose ratio max |a−b|/(atol+rtol·|b|) ≥ 2) with ONNX
   Runtime's optimizations on and off; others are *silent* and not given to the tool;
4. runs ``python -m onnx_bisect MODEL.py --onnx FAULTY.onnx --json OUT.json --atol A
   --rtol R`` in a fresh process (``PYTHONPATH=--tool-src``, ``--timeout`` seconds) for
   every counted fault and scores its ``first_divergence``.

Columns of the tables (per provenance, per fault kind, then kind × provenance):

* ``counted`` — planted faults that count (reach the outputs ≥ 2× tolerance, ORT on and off);
* ``pinpointed`` — of those, the share whose first divergence lists every planted node in
  ``onnx_nodes`` with ``len(onnx_nodes) ≤ 12`` (a run with no first divergence, a timeout
  or an error is a miss);
* ``median seg`` — median ``len(onnx_nodes)`` of the first divergences of counted faults;
* ``right cause`` — share of counted faults whose ``first_divergence.cause`` is the
  expected one (weight-noise → weight-mismatch; softmax-axis, transpose-perm,
  scale-constant, clip-bounds, where-polarity → attribute-mismatch; shape-constant →
  attribute-mismatch (a wrong constant at the file's own input size, not a baked export size);
  gelu-swap → gelu-approximation; norm-epsilon → epsilon-mismatch; resize-mode →
  resize-mode; node-float16 → precision; amplified → precision for a float16 node,
  weight-mismatch for weight noise; transposed-weight, bias-shift → weight-mismatch;
  slice-bounds, reduce-axes, activation-param, gather-index, pad-constant →
  attribute-mismatch; qdq-scale → quantization; concat-order, mask-value, norm-axis,
  gemm-alpha, split-sizes → attribute-mismatch);
* ``confirmed`` — share of counted faults whose diagnosis says it was confirmed by a re-run;
* ``silent`` — planted faults that do not count; ``no site`` — cells (arch × provenance)
  where the kind has no place to go or no variant that still runs;
* ``clean FA`` / ``false warn`` — clean files with a false alarm / with a warning;
* ``not made`` — cells whose file could not be made (reason in the JSON and below the tables).

Every case (arch, provenance, kind, planted nodes, description, expected cause,
tolerance, ORT ratios, tool exit, onnx_nodes, module, cause, confirmed, seconds,
error text, warnings) goes to ``--out``, rewritten after every cell.  ``--resume`` starts
from the cases already in ``--out``: the cells and kinds of this run are planted again
and replace theirs, the others are kept, and onnx-bisect is not run again on a file
whose bytes and tolerance it already judged (so ``--sites 2 --resume`` after a
``--sites 1`` run only runs the second sites, and ``--faults K --resume`` redoes kind K).
The faulty files stay in ``--workdir``.  ``--quick``: one site per kind on bert, llama,
swin, cnn, rnn and unet.  ``--plan-only``: make and plant the files, count, no tool runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import alignment_corpus  # read-only reuse: quiet(), _reason() and the slim / ORT / fp16 / int8 makers
import sweep_faults
import sweep_models

DEFAULT_TOL = (1e-4, 1e-3)
LOWP_LADDER = (1e-3, 1e-2, 3e-2, 1e-1, 3e-1)
MAX_SEGMENT = 12
COUNT_RATIO = 2.0
QUICK_ARCHS = ("bert", "llama", "swin", "cnn", "rnn", "unet")
DEFAULT_TOOL_SRC = str(Path(__file__).resolve().parent.parent / "src")  # this checkout; a frozen copy keeps edits out


# --------------------------------------------------------------------------- records

@dataclass
class Case:
    """One run of the sweep: a clean file (kind 'clean'), a planted fault, or a cell/kind that has none."""

    id: str
    arch: str
    provenance: str
    kind: str
    status: str  # clean | counted | silent | no-site | not-made
    base: str = ""
    site: int = 0
    planted_nodes: list[str] = field(default_factory=list)
    description: str = ""
    expected: str = ""
    atol: float = DEFAULT_TOL[0]
    rtol: float = DEFAULT_TOL[1]
    tolerance_note: str = ""
    ratio_opt_on: float | None = None
    ratio_opt_off: float | None = None
    onnx: str = ""
    digest: str = ""  # of the ONNX file: a tool result is reused (--resume) only for the same bytes
    reason: str = ""
    tool_exit: int | None = None  # None: not run; -1: timed out
    ok: bool | None = None
    onnx_nodes: list[str] | None = None
    module: str | None = None
    cause: str | None = None
    confirmed: bool | None = None
    diverged_layers: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float | None = None
    error: str = ""
    pinpointed: bool | None = None
    right_cause: bool | None = None
    false_alarm: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def needs_tool(self) -> bool:
        return self.status in ("clean", "counted")


def case_from_dict(d: dict) -> Case:
    known = set(Case.__dataclass_fields__)
    return Case(**{k: v for k, v in d.items() if k in known})


# --------------------------------------------------------------------------- making files

def export(model, inputs, exporter: str) -> onnx.ModelProto:
    """``model`` exported by the dynamo exporter (its default opset) or TorchScript (opset 17; ``torchscript-op14``:
    opset 14, LayerNormalization and GELU decomposed into primitive ops); with ``-dynamic``, every input axis
    dynamic (dynamo: ``Dim.AUTO``, the exporter keeps what it can; TorchScript: ``dynamic_axes`` on every axis but a
    channel axis)."""
    import io

    import torch

    dynamic = exporter.endswith("-dynamic")
    if exporter.startswith("dynamo"):
        shapes = tuple({i: torch.export.Dim.AUTO for i in range(t.dim())} for t in inputs) if dynamic else None
        return torch.onnx.export(model, inputs, dynamo=True, dynamic_shapes=shapes, verbose=False,
                                 report=False).model_proto
    names = [f"input_{i}" for i in range(len(inputs))]
    axes = {n: {j: f"{n}_dim{j}" for j in range(t.dim()) if j != 1 or t.dim() == 2}
            for n, t in zip(names, inputs)} if dynamic else None
    buf = io.BytesIO()
    opset = 14 if exporter.startswith("torchscript-op14") else 17
    torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=opset, input_names=names, dynamic_axes=axes)
    return onnx.load_from_string(buf.getvalue())


def simplify(src: Path, dst: Path) -> None:
    """onnx-simplifier, checked."""
    import onnxsim

    model, ok = onnxsim.simplify(onnx.load(src))
    if not ok:
        raise RuntimeError("onnxsim could not validate the simplified model")
    onnx.save(model, dst)


def rename(src: Path, dst: Path) -> None:
    """Every node renamed n0…, every tensor t0… (graph inputs/outputs and initializers included), every
    metadata_props and doc_string dropped."""
    proto = onnx.load(src)
    tensors: dict[str, str] = {}
    counter = iter(range(10 ** 9))

    def t(name: str) -> str:
        if name and name not in tensors:
            tensors[name] = f"t{len(tensors)}"
        return tensors.get(name, name)

    def graph(g: onnx.GraphProto) -> None:
        for vi in (*g.input, *g.initializer, *g.sparse_initializer):
            vi.name = t(vi.name)
        for node in g.node:
            node.name = f"n{next(counter)}"
            node.input[:] = [t(x) for x in node.input]
            node.output[:] = [t(x) for x in node.output]
            del node.metadata_props[:]
            node.doc_string = ""
            for a in node.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    graph(sub)
        for vi in (*g.output, *g.value_info):
            vi.name = t(vi.name)
        del g.metadata_props[:]
        g.doc_string = ""

    graph(proto.graph)
    del proto.metadata_props[:]
    proto.doc_string = ""
    onnx.save(proto, dst)


def shuffle(src: Path, dst: Path) -> None:
    """The nodes put in another valid topological order (a seeded random pick among the ready nodes at each step:
    the order a graph-rewriting tool's own sort may leave), then every node and tensor renamed as ``rename`` does:
    graph order and names both differ from the exporter's."""
    import random

    proto = onnx.load(src)
    nodes = list(proto.graph.node)
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    needs = [{made[x] for x in _node_inputs(n) if x in made} for n in nodes]
    readers_of: dict[int, list[int]] = {}
    for i, deps in enumerate(needs):
        for d in deps:
            readers_of.setdefault(d, []).append(i)
    left = [len(d) for d in needs]
    ready, order, rng = [i for i, d in enumerate(needs) if not d], [], random.Random(0)
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        for r in readers_of.get(i, ()):
            left[r] -= 1
            if not left[r]:
                ready.append(r)
    if len(order) != len(nodes):
        raise RuntimeError("the graph is not a DAG")
    del proto.graph.node[:]
    proto.graph.node.extend(nodes[i] for i in order)
    tmp = dst.with_suffix(".order.onnx")
    onnx.save(proto, tmp)
    rename(tmp, dst)
    tmp.unlink()


def _node_inputs(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and those its subgraphs read from the outer scope."""
    names = {x for x in node.input if x}
    for a in node.attribute:
        for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in sub.node:
                names |= _node_inputs(n)
    return names


def gs_sanitize(src: Path, dst: Path) -> None:
    """What ``polygraphy surgeon sanitize --fold-constants`` does with onnx-graphsurgeon: constants folded
    (ONNX Runtime evaluates every constant subgraph, shape computations included), dead nodes removed, the nodes
    topologically re-sorted."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(onnx.load(src))
    graph.fold_constants().cleanup().toposort()
    onnx.save(gs.export_onnx(graph), dst)


def fp16_io(src: Path, dst: Path) -> None:
    """onnxconverter-common float16 with float16 graph inputs and outputs (``keep_io_types=False``)."""
    from onnxconverter_common import float16

    onnx.save(float16.convert_float_to_float16(onnx.load(src), keep_io_types=False), dst)


def ort_fusion(src: Path, dst: Path) -> None:
    """ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``, model type bert, its Python
    fusions only): Attention, SkipLayerNormalization, BiasGelu, FastGelu ... where its patterns match."""
    from onnxruntime.transformers.optimizer import optimize_model

    model = optimize_model(str(src), model_type="bert", num_heads=0, hidden_size=0, opt_level=0)
    if not any(n.domain == "com.microsoft" for n in model.model.graph.node):
        raise RuntimeError("the transformer optimizer fused nothing")
    model.save_model_to_file(str(dst))


def qdq_int8(arch: str) -> Callable[[Path, Path], None]:
    """onnxruntime.quantization.quantize_static (QDQ) calibrated on seeded random inputs."""
    return alignment_corpus.int8(sweep_models.calibration(arch, 4))


def qdq_matmul(arch: str) -> Callable[[Path, Path], None]:
    """quantize_static (QDQ) the way transformers are usually quantized: only MatMul / Gemm / Conv, weights per
    channel (every op quantized, random-weight transformers disagree with PyTorch beyond 0.3)."""
    return alignment_corpus.int8(sweep_models.calibration(arch, 4), per_channel=True,
                                 op_types=["MatMul", "Gemm", "Conv"])


def dynamic_int8(src: Path, dst: Path) -> None:
    """onnxruntime.quantization.quantize_dynamic, the usual BERT recipe: int8 weights (MatMul / Conv / Gather ... as
    its registry quantizes them: DynamicQuantizeLinear + MatMulInteger / ConvInteger, scales computed at run time);
    uint8 weights where ONNX Runtime's CPU kernels take no int8 ones (ConvInteger)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    reasons = []
    for weight_type in (QuantType.QInt8, QuantType.QUInt8):
        quantize_dynamic(str(src), str(dst), weight_type=weight_type)
        try:
            ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
            return
        except Exception as exc:  # noqa: BLE001 - e.g. ConvInteger has no int8-weight kernel on CPU
            reasons.append(f"{weight_type.name}: {str(exc).splitlines()[0][:160]}")
    raise RuntimeError("; ".join(reasons))


def qop_int8(arch: str) -> Callable[[Path, Path], None]:
    """onnxruntime.quantization.quantize_static in the QOperator format (QLinearConv, QLinearMatMul, QLinearAdd ...,
    the tensors between them uint8), int8 weights, calibrated on seeded random inputs like ``qdq_int8``."""
    return alignment_corpus.int8(sweep_models.calibration(arch, 4), qoperator=True)


def ort_all(src: Path, dst: Path) -> None:
    """ONNX Runtime offline optimization at ORT_ENABLE_ALL, CPU (``optimized_model_filepath``): the extended level's
    com.microsoft fusions plus the layout transforms (NCHWc Conv, ReorderInput / ReorderOutput)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(dst)
    so.intra_op_num_threads = 1
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    if not dst.exists():
        raise RuntimeError("ONNX Runtime wrote no optimized model")


def slim_shuffled(src: Path, dst: Path) -> None:
    """onnxslim, then ``shuffle``: a slimmed file whose node order and names both differ from the exporter's."""
    tmp = dst.with_suffix(".slim.onnx")
    try:
        alignment_corpus.slim(src, tmp)
        shuffle(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def external_data(src: Path, dst: Path) -> None:
    """The export saved with every initializer in one external data file beside it (``<name>.data``,
    ``size_threshold=0``), as large models are shipped."""
    location = f"{dst.name}.data"
    (dst.parent / location).unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(onnx.load(src), dst, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)


def _gemm_to_matmul(proto: onnx.ModelProto) -> None:
    """Every Gemm with a constant weight (alpha = beta = 1, no transA) rewritten in place as MatMul (+ Add of its
    bias), the weight stored [K, N]: the form the exporters give a Linear on a 3-D input, which MatMulNBits takes."""
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    nodes = []
    for node in proto.graph.node:
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in inits or a.get("transA", 0)
                or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        w = inits[node.input[1]]
        if a.get("transB", 0):
            w.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(w).T), w.name))
        bias = len(node.input) > 2 and node.input[2]
        mm_out = f"{node.output[0]}_matmul" if bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", node.input[:2], [mm_out], name=f"{node.name}_MatMul"))
        if bias:
            nodes.append(onnx.helper.make_node("Add", [mm_out, node.input[2]], [node.output[0]],
                                               name=f"{node.name}_Add"))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)


def nbits_weights(bits: int) -> Callable[[Path, Path], None]:
    """Weight-only quantization as LLMs are shipped for ONNX Runtime: onnxruntime.quantization.matmul_nbits_quantizer
    (MatMulNBitsQuantizer, RTN, symmetric, block size 32) turns every MatMul with a constant weight into a
    com.microsoft MatMulNBits node (packed ``bits``-bit weights, one float scale per block of 32; activations stay
    float32).  A Gemm with a constant weight (a Linear on a 2-D input: CNN classifiers) is first rewritten
    MatMul + Add, as the quantizer takes MatMul only.  The sweep registers bits=8 (``int8-weights``): at 4 bits the
    seeded random-weight transformers (llama, bert, vit) disagree with PyTorch beyond atol=rtol=0.3."""
    def make(src: Path, dst: Path) -> None:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        proto = onnx.load(src)
        _gemm_to_matmul(proto)
        quant = MatMulNBitsQuantizer(proto, bits=bits, block_size=32, is_symmetric=True)
        quant.process()
        out = quant.model.model
        if not any(n.op_type == "MatMulNBits" for n in out.graph.node):
            raise RuntimeError("the MatMulNBits quantizer quantized no MatMul")
        onnx.save(out, dst)
    return make


OPSET_TARGETS = (21, 20, 19, 18)


def opset_converted(src: Path, dst: Path) -> None:
    """The file upgraded to a newer opset by ``onnx.version_converter.convert_version`` (21, else the highest of
    20 … 18 that converts and passes the checker), the IR version raised to what that opset needs."""
    from onnx import version_converter

    proto = onnx.load(src)
    current = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    reasons = []
    for target in OPSET_TARGETS:
        if target <= current:
            break
        try:
            out = version_converter.convert_version(proto, target)
            out.ir_version = max(out.ir_version, onnx.helper.find_min_ir_version_for(
                [onnx.helper.make_opsetid("", target)], ignore_unknown=True))
            onnx.checker.check_model(out)
        except Exception as exc:  # noqa: BLE001 - try the next lower opset
            reasons.append(f"opset {target}: {alignment_corpus._reason(exc)[:160]}")
            continue
        onnx.save(out, dst)
        return
    raise RuntimeError(f"no opset above {current} converts: " + "; ".join(reasons))


MIXED_FP32_OPS = ("Add", "LayerNormalization", "SimplifiedLayerNormalization", "Softmax", "ReduceMean", "Pow", "Sqrt")


def mixed_fp16(src: Path, dst: Path) -> None:
    """Mixed precision with onnxconverter-common (``convert_float_to_float16``, keep_io_types) and an op block list:
    float16 except the residual Adds and the normalizations, as onnxruntime.transformers' GPT-2 recipe keeps them
    (Add, LayerNormalization, SimplifiedLayerNormalization), plus Softmax and the ops of a decomposed norm
    (ReduceMean, Pow, Sqrt) and the converter's default block list: float32 islands between Cast pairs."""
    from onnxconverter_common import float16

    out = float16.convert_float_to_float16(onnx.load(src), keep_io_types=True,
                                           op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, *MIXED_FP32_OPS])
    kept = {n.op_type for n in out.graph.node} & set(MIXED_FP32_OPS)
    if not kept or not any(t.data_type == onnx.TensorProto.FLOAT16 for t in out.graph.initializer):
        raise RuntimeError("the file is not mixed: no op kept float32 or no float16 weight")
    onnx.save(out, dst)

@dataclass(frozen=True)
class Provenance:
    """How a provenance file is made: from which exports (in order of preference), by which conversion."""

    bases: tuple[str, ...]
    convert: Callable[[str], Callable[[Path, Path], None]] | None = None  # arch -> maker(src, dst)
    low_precision: bool = False
    external: bool = False  # faulty files saved with external data too


PROVENANCES = {
    "dynamo": Provenance(("dynamo",)),
    "torchscript": Provenance(("torchscript",)),
    "onnxsim": Provenance(("torchscript", "dynamo"), lambda arch: simplify),
    "onnxslim": Provenance(("dynamo", "torchscript"), lambda arch: alignment_corpus.slim),
    "renamed": Provenance(("dynamo", "torchscript"), lambda arch: rename),
    "fp16": Provenance(("dynamo", "torchscript"), lambda arch: alignment_corpus.fp16, low_precision=True),
    "ort-opt": Provenance(("torchscript", "dynamo"), lambda arch: alignment_corpus.ort_offline("extended")),
    "qdq-int8": Provenance(("torchscript", "dynamo"), qdq_int8, low_precision=True),
    # added with the fourth held-out set
    "dynamic": Provenance(("dynamo-dynamic", "torchscript-dynamic")),
    "ort-fusion": Provenance(("torchscript", "dynamo"), lambda arch: ort_fusion),
    "fp16-io": Provenance(("dynamo", "torchscript"), lambda arch: fp16_io, low_precision=True),
    # added with the sixth held-out set
    "qdq-matmul": Provenance(("torchscript", "dynamo"), qdq_matmul, low_precision=True),
    # added with the tenth held-out set
    "shuffled": Provenance(("dynamo", "torchscript"), lambda arch: shuffle),
    "gs-sanitize": Provenance(("torchscript", "dynamo"), lambda arch: gs_sanitize),
    # added with the eleventh held-out set
    "dynamic-int8": Provenance(("torchscript", "dynamo"), lambda arch: dynamic_int8, low_precision=True),
    "qop-int8": Provenance(("torchscript", "dynamo"), qop_int8, low_precision=True),
    "ort-all": Provenance(("torchscript", "dynamo"), lambda arch: ort_all),
    "torchscript-op14": Provenance(("torchscript-op14",)),
    "slim-shuffled": Provenance(("dynamo", "torchscript"), lambda arch: slim_shuffled),
    "external-data": Provenance(("dynamo", "torchscript"), lambda arch: external_data, external=True),
    # added with the twelfth held-out set
    "int8-weights": Provenance(("dynamo", "torchscript"), lambda arch: nbits_weights(8), low_precision=True),
    "opset-converted": Provenance(("torchscript", "dynamo"), lambda arch: opset_converted),
    "mixed-fp16": Provenance(("dynamo", "torchscript"), lambda arch: mixed_fp16, low_precision=True),
}


def make_file(arch: str, prov: str, exports: dict[str, Path | str], dst: Path,
              check: Callable[[onnx.ModelProto], str]) -> tuple[str, str]:
    """Write the provenance file to ``dst``; returns ``(base used, notes)``, or raises RuntimeError with every
    reason when no base works."""
    spec, reasons = PROVENANCES[prov], []
    for base in spec.bases:
        src = exports[base]
        if isinstance(src, str):
            reasons.append(f"{base} export failed: {src}")
            continue
        try:
            if spec.convert is None:
                dst.write_bytes(src.read_bytes())
            else:
                with alignment_corpus.quiet():
                    spec.convert(arch)(src, dst)
            problem = check(onnx.load(dst))
        except Exception as exc:  # noqa: BLE001 - a converter that fails is reported
            problem = alignment_corpus._reason(exc)
        if not problem:
            return base, "; ".join(reasons)
        reasons.append(f"from {base}: {problem}")
    raise RuntimeError("; ".join(reasons))


def pick_tolerance(ctx: sweep_faults.FileContext, low_precision: bool) -> tuple[float, float, str]:
    """The tolerance a file is judged at (see the module docstring) and a note on how it was chosen."""
    ratios = {opt: ctx.output_ratio(ctx.proto, opt) for opt in (False, True)}
    if not low_precision:
        worst = max(ratios.values())
        return (*DEFAULT_TOL, f"default; clean file at {worst:.3g}× tolerance")
    for tol in LOWP_LADDER:
        ctx.atol = ctx.rtol = tol
        worst = max(ctx.output_ratio(ctx.proto, opt) for opt in (False, True))
        if worst <= 1.0:
            beyond = " (beyond the issue's ladder)" if tol > 0.1 else ""
            return tol, tol, f"smallest atol=rtol where the clean file agrees{beyond}; clean at {worst:.3g}×"
    raise RuntimeError(f"the clean file disagrees with PyTorch even at atol=rtol={LOWP_LADDER[-1]:g}")


def file_digest(path: Path) -> str:
    """The file's digest, its external data file's (``<name>.data``) included."""
    import hashlib

    data = path.parent / f"{path.name}.data"
    return hashlib.sha256(path.read_bytes() + (data.read_bytes() if data.exists() else b"")).hexdigest()[:16]


def save_like(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """``model`` saved at ``path``; with ``external``, its initializers in ``<name>.data`` beside it (a faulty file
    keeps its provenance's form: the tool then reads external data on every run, not only the clean one)."""
    if not external:
        onnx.save(model, path)
        return
    (path.parent / f"{path.name}.data").unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=0)


def seeded(seed: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


# --------------------------------------------------------------------------- planning a cell

def plant_sites(ctx: sweep_faults.FileContext, kind: sweep_faults.FaultKind, n: int,
                rng: np.random.Generator) -> tuple[list[sweep_faults.Planted], str]:
    """Up to ``n`` planted faults of ``kind`` at shuffled candidate sites; a reason when there are fewer."""
    try:
        candidates = kind.candidates(ctx)
    except Exception as exc:  # noqa: BLE001 - a file ONNX Runtime cannot run with its tensors exposed
        return [], f"no candidates: {alignment_corpus._reason(exc)[:200]}"
    if not candidates:
        return [], "no candidate node"
    order = rng.permutation(len(candidates))
    planted, failures, tried = [], Counter(), 0
    for k in order[:kind.max_tries]:
        if len(planted) == n:
            break
        tried += 1
        try:
            p = kind.plant(ctx, candidates[k], rng)
            problem = ctx.problem(p.model)
        except sweep_faults.NoVariant as exc:
            problem = str(exc)
        except Exception as exc:  # noqa: BLE001 - a planter that fails on a site is counted, not fatal
            problem = f"planter error: {alignment_corpus._reason(exc)}"
        if problem:
            failures[problem[:140]] += 1
            continue
        planted.append(p)
    if len(planted) == n:
        return planted, ""
    why = "; ".join(f"{v}× {k}" for k, v in failures.most_common(3))
    return planted, f"{len(planted)} of {n} planted from {len(candidates)} candidates ({tried} tried): {why}"


def plan_cell(arch: str, prov: str, exports: dict, inputs, reference, args, cell_dir: Path) -> list[Case]:
    """Make the provenance file, plant every fault kind, and return the cases (tool not yet run)."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    clean_path = cell_dir / "clean.onnx"
    base_id = f"{arch}/{prov}"

    def check(proto: onnx.ModelProto) -> str:
        return sweep_faults.FileContext(proto, inputs, reference, *DEFAULT_TOL).problem(proto)

    try:
        base, notes = make_file(arch, prov, exports, clean_path, check)
        ctx = sweep_faults.FileContext(onnx.load(clean_path), inputs, reference, *DEFAULT_TOL)
        atol, rtol, tol_note = pick_tolerance(ctx, PROVENANCES[prov].low_precision)
    except Exception as exc:  # noqa: BLE001 - a cell that cannot be made is reported with its reason
        return [Case(f"{base_id}/not-made", arch, prov, "-", "not-made", reason=str(exc)[:600])]
    ctx.atol, ctx.rtol = atol, rtol
    common = {"arch": arch, "provenance": prov, "base": base, "atol": atol, "rtol": rtol,
              "tolerance_note": tol_note}
    cases = [Case(f"{base_id}/clean", kind="clean", status="clean", onnx=str(clean_path), reason=notes,
                  digest=file_digest(clean_path), extra={"nodes": len(ctx.proto.graph.node)}, **common)]
    for name in args.faults:
        kind = sweep_faults.FAULTS[name]
        with alignment_corpus.quiet():
            planted, reason = plant_sites(ctx, kind, args.sites, seeded(args.seed, arch, prov, name))
        if not planted:
            cases.append(Case(f"{base_id}/{name}/none", kind=name, status="no-site", reason=reason, **common))
            continue
        for k, p in enumerate(planted):
            path = cell_dir / f"{name}.{k}.onnx"
            save_like(p.model, path, PROVENANCES[prov].external)
            on, off = (ctx.output_ratio(p.model, opt) for opt in (True, False))
            counted = min(on, off) >= COUNT_RATIO
            cases.append(Case(f"{base_id}/{name}/{k}", kind=name, site=k, status="counted" if counted else "silent",
                              planted_nodes=p.nodes, description=p.description, expected=p.expected,
                              ratio_opt_on=on, ratio_opt_off=off, onnx=str(path), digest=file_digest(path),
                              extra=p.extra,
                              reason=reason if k == len(planted) - 1 else "", **common))
    return cases


# --------------------------------------------------------------------------- running the tool

def run_tool(case: Case, model_file: Path, args) -> None:
    """Run onnx-bisect on the case's file in a fresh process and record its verdict."""
    out_json = Path(case.onnx).with_suffix(".report.json")
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "onnx_bisect", str(model_file), "--onnx", case.onnx, "--json", str(out_json),
           "--atol", repr(case.atol), "--rtol", repr(case.rtol)]
    env = {**os.environ, "PYTHONPATH": args.tool_src, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.timeout, env=env,
                              cwd=Path(case.onnx).parent)
        case.tool_exit = proc.returncode
        stderr = proc.stderr
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr or b""  # bytes even with text=True
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        case.tool_exit, stderr = -1, f"timed out after {args.timeout}s; {tail[-300:]}"
    case.seconds = round(time.perf_counter() - start, 2)
    read_report(case, out_json, stderr)
    score(case)


def read_report(case: Case, path: Path, stderr: str) -> None:
    """Fill the case from onnx-bisect's JSON report (or the error text when there is none)."""
    if not path.exists():
        case.error = " ".join(stderr.strip().splitlines()[-3:])[-600:] or f"no report (exit {case.tool_exit})"
        return
    doc = json.loads(path.read_text())
    case.ok = doc.get("ok")
    fd = doc.get("first_divergence") or {}
    if fd:
        case.onnx_nodes, case.module = list(fd.get("onnx_nodes") or []), fd.get("module")
        case.cause, case.confirmed = fd.get("cause"), fd.get("confirmed")
    case.diverged_layers = [layer.get("module") or layer.get("onnx_node") or "?" for layer in doc.get("layers", [])
                            if layer.get("status") == "diverged"]
    case.warnings = [str(w) for w in doc.get("warnings", [])]
    if case.tool_exit not in (0, 1):
        case.error = " ".join(stderr.strip().splitlines()[-3:])[-600:]


def score(case: Case) -> None:
    if case.status == "clean":
        case.false_alarm = case.tool_exit != 0 or bool(case.diverged_layers)
        return
    nodes = case.onnx_nodes or []
    case.pinpointed = bool(nodes) and set(case.planted_nodes) <= set(nodes) and len(nodes) <= MAX_SEGMENT
    case.right_cause = case.cause == case.expected


# --------------------------------------------------------------------------- the sweep

TOOL_FIELDS = ("tool_exit", "ok", "onnx_nodes", "module", "cause", "confirmed", "diverged_layers", "warnings",
               "seconds", "error")


def reuse(case: Case, old: Case | None) -> bool:
    """Copy the tool's verdict from an earlier run of the very same file and tolerance (``--resume``)."""
    if old is None or old.tool_exit is None or not case.digest or (old.digest, old.atol, old.rtol) != (
            case.digest, case.atol, case.rtol):
        return False
    for key in TOOL_FIELDS:
        setattr(case, key, getattr(old, key))
    score(case)
    return True


def sweep_arch(arch: str, args, results: dict[str, Case], save: Callable[[], None], start: float) -> None:
    """Every provenance × fault kind of one architecture.  ``results`` (by id) may hold an earlier run's cases
    (``--resume``): the kinds planned here replace theirs for each cell, and their tool verdicts are reused
    for identical files."""
    import torch

    with alignment_corpus.quiet():
        model, inputs = sweep_models.build(arch)
        with torch.no_grad():
            ref = model(*inputs)
    reference = [t.detach().numpy() for t in (ref if isinstance(ref, (tuple, list)) else (ref,))]
    arrays = tuple(t.numpy() for t in inputs)
    arch_dir = args.workdir / arch
    arch_dir.mkdir(parents=True, exist_ok=True)
    # not "<arch>.py": a file named after a package the model imports would shadow it (xlstm)
    model_file = args.workdir / "models" / f"{arch}_model.py"
    model_file.parent.mkdir(parents=True, exist_ok=True)
    model_file.write_text(sweep_models.model_file_text(arch, str(HERE)))
    exports = make_exports(model, inputs, arch_dir, args.provenances)
    replaced = {"clean", "-", *args.faults}
    for prov in args.provenances:
        cases = plan_cell(arch, prov, exports, arrays, reference, args, arch_dir / prov)
        earlier = {k: results.pop(k) for k, c in list(results.items())
                   if (c.arch, c.provenance) == (arch, prov) and c.kind in replaced}
        todo = [c for c in cases if c.needs_tool and not reuse(c, earlier.get(c.id)) and not args.plan_only]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda c: run_tool(c, model_file, args), todo))
        results.update((c.id, c) for c in cases)
        save()
        print(f"[{time.perf_counter() - start:7.0f}s] {arch:10s} {prov:11s} {cell_line(cases)}", flush=True)


def make_exports(model, inputs, arch_dir: Path, provenances) -> dict[str, Path | str]:
    """The exports the provenances start from, saved under ``arch_dir``: exporter -> path, or the reason it
    failed."""
    exports: dict[str, Path | str] = {}
    for exporter in dict.fromkeys(b for prov in provenances for b in PROVENANCES[prov].bases):
        path = arch_dir / f"export.{exporter}.onnx"
        try:
            with alignment_corpus.quiet():
                onnx.save(export(model, inputs, exporter), path)
            exports[exporter] = path
        except Exception as exc:  # noqa: BLE001 - reported as the reason a cell is not made
            exports[exporter] = alignment_corpus._reason(exc)[:300]
    return exports


def cell_line(cases: list[Case]) -> str:
    """One progress line for a cell."""
    if cases[0].status == "not-made":
        return f"NOT MADE: {cases[0].reason[:150]}"
    clean = cases[0]
    counted = [c for c in cases if c.status == "counted"]
    return (f"tol {clean.atol:g}; clean {'FALSE ALARM' if clean.false_alarm else 'ok'}"
            f"{f' ({len(clean.warnings)} warning)' if clean.warnings else ''}; counted {len(counted)}: pinpointed "
            f"{sum(bool(c.pinpointed) for c in counted)}, right cause {sum(bool(c.right_cause) for c in counted)}; "
            f"silent {sum(c.status == 'silent' for c in cases)}; no site: "
            f"{','.join(c.kind for c in cases if c.status == 'no-site') or '-'}")


# --------------------------------------------------------------------------- tables

def _pct(num: int, den: int) -> str:
    return "-" if not den else f"{100 * num / den:.0f}% ({num}/{den})"


def summarize(cases: list[Case]) -> dict[str, Any]:
    """The numbers of one table row."""
    counted = [c for c in cases if c.status == "counted"]
    clean = [c for c in cases if c.status == "clean"]
    segs = [len(c.onnx_nodes) for c in counted if c.onnx_nodes]
    tols = sorted({c.atol for c in clean})
    return {
        "cells": len(clean), "not_made": sum(c.status == "not-made" for c in cases),
        "tolerance": "-" if not tols else (f"{tols[0]:g}" if len(tols) == 1 else f"{tols[0]:g}–{tols[-1]:g}"),
        "clean_fa": sum(bool(c.false_alarm) for c in clean), "false_warn": sum(bool(c.warnings) for c in clean),
        "counted": len(counted), "pinpointed": sum(bool(c.pinpointed) for c in counted),
        "median_seg": statistics.median(segs) if segs else None,
        "right_cause": sum(bool(c.right_cause) for c in counted),
        "confirmed": sum(bool(c.confirmed) for c in counted),
        "silent": sum(c.status == "silent" for c in cases), "no_site": sum(c.status == "no-site" for c in cases),
        "tool_errors": sum(c.tool_exit not in (None, 0, 1) for c in cases),
    }


def row(label: str, s: dict[str, Any], clean_columns: bool) -> list:
    seg = "-" if s["median_seg"] is None else f"{s['median_seg']:g}"
    base = [label, s["counted"], _pct(s["pinpointed"], s["counted"]), seg, _pct(s["right_cause"], s["counted"]),
            _pct(s["confirmed"], s["counted"]), s["silent"], s["no_site"], s["tool_errors"]]
    if clean_columns:
        base[1:1] = [s["cells"], s["not_made"], s["tolerance"], f"{s['clean_fa']}/{s['cells']}",
                     f"{s['false_warn']}/{s['cells']}"]
    return base


def render(cases: list[Case], show_misses: bool) -> str:
    from tabulate import tabulate

    by_prov, by_kind, by_pair = defaultdict(list), defaultdict(list), defaultdict(list)
    for c in cases:
        by_prov[c.provenance].append(c)
        if c.kind not in ("clean", "-"):
            by_kind[c.kind].append(c)
            by_pair[c.kind, c.provenance].append(c)
    heads = ["counted", "pinpointed", "median seg", "right cause", "confirmed", "silent", "no site", "tool err"]
    provs = [p for p in PROVENANCES if p in by_prov]
    parts = ["Per provenance:", tabulate(
        [row(p, summarize(by_prov[p]), True) for p in provs] + [row("ALL", summarize(cases), True)],
        headers=["provenance", "cells", "not made", "tolerance", "clean FA", "false warn", *heads],
        disable_numparse=True)]
    kinds = [k for k in sweep_faults.FAULTS if k in by_kind]
    parts += ["", "Per fault kind:", tabulate([row(k, summarize(by_kind[k]), False) for k in kinds],
                                             headers=["fault kind", *heads], disable_numparse=True)]
    matrix = []
    for k in kinds:
        cells = []
        for p in provs:
            s = summarize(by_pair[k, p])
            cells.append("·" if not by_pair[k, p] else (f"{s['pinpointed']}/{s['right_cause']}/{s['counted']}"
                                                        + (f" s{s['silent']}" if s["silent"] else "")))
        matrix.append([k, *cells])
    parts += ["", "Kind × provenance: pinpointed/right cause/counted (sN: N silent):",
              tabulate(matrix, headers=["fault kind", *provs], disable_numparse=True)]
    parts += ["", overall(cases)]
    not_made = [c for c in cases if c.status == "not-made"]
    if not_made:
        parts += ["", "Not made:"] + [f"  {c.arch} {c.provenance}: {c.reason[:220]}" for c in not_made]
    notes = [c for c in cases if c.status == "clean" and c.reason]
    if notes:
        parts += ["", "Made from the other exporter:"] + [f"  {c.arch} {c.provenance} (from {c.base}): {c.reason[:200]}"
                                                           for c in notes]
    warnings = Counter(w for c in cases if c.status == "clean" for w in c.warnings)
    if warnings:
        parts += ["", "Warnings on clean files (count: text):"]
        parts += [f"  {n}: {w[:300]}" for w, n in warnings.most_common()]
    alarms = [c for c in cases if c.false_alarm]
    if alarms:
        parts += ["", "False alarms on clean files:"] + [
            f"  {c.arch} {c.provenance}: exit {c.tool_exit}, diverged {c.diverged_layers[:4]}, first "
            f"{c.module} {c.cause} {c.error[:120]}" for c in alarms]
    if show_misses:
        parts += ["", "Misses (counted faults not pinpointed or with another cause):"]
        for c in cases:
            if c.status == "counted" and not (c.pinpointed and c.right_cause):
                nodes = c.onnx_nodes or []
                shown = ",".join(nodes[:6]) + (f"…(+{len(nodes) - 6})" if len(nodes) > 6 else "")
                parts.append(f"  {c.id}: planted {c.planted_nodes[:3]} [{c.description[:70]}] → "
                             f"{len(nodes)} nodes [{shown}] module={c.module} cause={c.cause} "
                             f"(expected {c.expected}){' ERROR ' + c.error[:100] if c.error else ''}")
    return "\n".join(parts)


def overall(cases: list[Case]) -> str:
    s = summarize(cases)
    return (f"Overall: {s['counted']} counted faults, pinpointed {_pct(s['pinpointed'], s['counted'])}, right cause "
            f"{_pct(s['right_cause'], s['counted'])}, median segment {s['median_seg']}; {s['silent']} silent; "
            f"clean files: {s['clean_fa']}/{s['cells']} false alarms, {s['false_warn']}/{s['cells']} with warnings; "
            f"{s['not_made']} cells not made; {s['tool_errors']} tool errors/timeouts.")


# --------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", help=f"comma-separated, from {','.join(sweep_models.ARCHS)}; 'core' the twelve "
                                   "tuned on (the default), 'heldout' ... 'heldout21' the held-out sets")
    p.add_argument("--provenances", default=",".join(PROVENANCES), help="comma-separated")
    p.add_argument("--faults", default=",".join(sweep_faults.FAULTS), help="comma-separated fault kinds")
    p.add_argument("--sites", type=int, default=2, help="faults planted per kind and file (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/sweep/work"))
    p.add_argument("--out", type=Path, default=Path("/tmp/sweep/results.json"))
    p.add_argument("--jobs", type=int, default=1, help="onnx-bisect processes at a time")
    p.add_argument("--timeout", type=int, default=300, help="seconds per onnx-bisect run")
    p.add_argument("--tool-src", default=DEFAULT_TOOL_SRC, help="PYTHONPATH of the onnx_bisect to measure")
    p.add_argument("--quick", action="store_true", help=f"one site per kind on {','.join(QUICK_ARCHS)}")
    p.add_argument("--resume", action="store_true",
                   help="start from the cases in --out: re-plant the kinds asked for, keep the others, reuse the "
                        "tool's verdict on identical files")
    p.add_argument("--plan-only", action="store_true", help="make and plant the files, do not run onnx-bisect")
    p.add_argument("--report", type=Path, metavar="RESULTS.json", help="re-print the tables of a results file")
    p.add_argument("--misses", action="store_true", help="list every miss under the tables")
    a = p.parse_args(argv)
    groups = {"core": sweep_models.CORE, "heldout": sweep_models.HELDOUT, "heldout2": sweep_models.HELDOUT2,
              "heldout3": sweep_models.HELDOUT3, "heldout4": sweep_models.HELDOUT4, "heldout5": sweep_models.HELDOUT5,
              "heldout6": sweep_models.HELDOUT6, "heldout7": sweep_models.HELDOUT7,
              "heldout8": sweep_models.HELDOUT8, "heldout9": sweep_models.HELDOUT9,
              "heldout10": sweep_models.HELDOUT10, "heldout11": sweep_models.HELDOUT11,
              "heldout12": sweep_models.HELDOUT12, "heldout13": sweep_models.HELDOUT13,
              "heldout14": sweep_models.HELDOUT14, "heldout15": sweep_models.HELDOUT15,
              "heldout16": sweep_models.HELDOUT16, "heldout17": sweep_models.HELDOUT17,
              "heldout18": sweep_models.HELDOUT18, "heldout19": sweep_models.HELDOUT19,
              "heldout20": sweep_models.HELDOUT20, "heldout21": sweep_models.HELDOUT21}
    a.archs = ([x for name in a.archs.split(",") for x in groups.get(name, (name,))] if a.archs
               else list(QUICK_ARCHS if a.quick else sweep_models.CORE))
    a.provenances, a.faults = a.provenances.split(","), a.faults.split(",")
    if a.quick:
        a.sites = 1
    bad = ([x for x in a.archs if x not in sweep_models.ARCHS] + [x for x in a.provenances if x not in PROVENANCES]
           + [x for x in a.faults if x not in sweep_faults.FAULTS])
    if bad:
        p.error(f"unknown architecture, provenance or fault kind: {', '.join(bad)}")
    return a


def save_results(path: Path, results: dict[str, Case], meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    doc = {"meta": meta, "cases": [asdict(c) for c in results.values()]}
    tmp.write_text(json.dumps(doc, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x)
                              else str(x)) + "\n")
    tmp.replace(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        doc = json.loads(args.report.read_text())
        print(render([case_from_dict(d) for d in doc["cases"]], args.misses))
        return 0
    import logging
    import warnings

    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    args.workdir.mkdir(parents=True, exist_ok=True)
    meta = {"argv": sys.argv[1:], "tool_src": args.tool_src, "seed": args.seed, "sites": args.sites,
            "archs": args.archs, "provenances": args.provenances, "faults": args.faults,
            "versions": versions(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    results: dict[str, Case] = {}
    if args.resume and args.out.exists():
        results = {d["id"]: case_from_dict(d) for d in json.loads(args.out.read_text())["cases"]}
    start = time.perf_counter()

    def save() -> None:
        meta["wall_s"] = round(time.perf_counter() - start, 1)
        save_results(args.out, results, meta)

    for arch in args.archs:
        sweep_arch(arch, args, results, save, start)
    print()
    print(render(list(results.values()), args.misses))
    print(f"\nWall time {time.perf_counter() - start:.0f}s; results in {args.out}; files in {args.workdir}.")
    return 0


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "onnx", "onnxruntime", "onnxslim", "onnxsim", "onnxconverter-common", "transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "absent"
    return out


if __name__ == "__main__":
    raise SystemExit(main())
