"""The files of a repro folder (``--extract``): the segment as a standalone ONNX model, the PyTorch values at its
inputs and output, the fixed segment, and ``repro.py`` — a script that needs only onnxruntime and numpy.

Names in the model (tensor, node and module names) are untrusted: they reach the script only inside Python
string literals (``repr``) or comment lines with every non-printable character replaced, never as code.
"""
from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .. import __version__
from ..records import Extraction, Report, Repro, StandaloneSegment
from ..records.matrix import OptLevel
from .text import divergence_where, fmt_num, narrowed_text

SEGMENT = "segment.onnx"
FIXED = "fixed.onnx"
INPUTS = "inputs.npz"
EXPECTED = "expected.npz"
SCRIPT = "repro.py"
#: a model whose initializers pass this many bytes keeps them in a ``.data`` file beside it (ONNX external data)
EXTERNAL_BYTES = 64 << 20

#: ONNX Runtime's name of each graph optimization level
ORT_LEVELS = {OptLevel.DISABLE: "ORT_DISABLE_ALL", OptLevel.BASIC: "ORT_ENABLE_BASIC",
              OptLevel.EXTENDED: "ORT_ENABLE_EXTENDED", OptLevel.ALL: "ORT_ENABLE_ALL"}


def write_files(repro: Repro, folder: Path, header: list[str], external_bytes: int = EXTERNAL_BYTES) -> list[str]:
    """Write every file of the repro into ``folder`` (which exists); return their names.

    ``header`` is what the script's comment says of the divergence (plain text, one item a line)."""
    files = write_model(repro.segment, folder / SEGMENT, external_bytes)
    files += [write_npz(folder / INPUTS, repro.segment.inputs),
              write_npz(folder / EXPECTED, {repro.segment.output: repro.segment.expected})]
    runs = {SEGMENT: _run(repro, repro.segment, INPUTS, EXPECTED)}
    if repro.fixed is not None:
        files += write_model(repro.fixed, folder / FIXED, external_bytes)
        inputs, expected = INPUTS, EXPECTED
        if not _same_arrays(repro.fixed.inputs, repro.segment.inputs):
            inputs = write_npz(folder / "fixed_inputs.npz", repro.fixed.inputs)
            files.append(inputs)
        if not _same_arrays({"": repro.fixed.expected}, {"": repro.segment.expected}):
            expected = write_npz(folder / "fixed_expected.npz", {repro.fixed.output: repro.fixed.expected})
            files.append(expected)
        runs[FIXED] = _run(repro, repro.fixed, inputs, expected)
    (folder / SCRIPT).write_text(repro_script(repro, runs, header))
    return files + [SCRIPT]


def write_model(segment: StandaloneSegment, path: Path, external_bytes: int = EXTERNAL_BYTES) -> list[str]:
    """``segment``'s model with its weights put back, as ``path`` (and ``path.data`` when they exceed
    ``external_bytes``: every initializer then goes there); the names of the files written."""
    model = onnx.ModelProto()
    model.CopyFrom(segment.model)
    model.producer_name = "onnx-bisect"
    for init in model.graph.initializer:
        value = segment.weights.arrays.get(init.name)
        if value is not None:
            _inline(init, np.asarray(value))
    if sum(np.asarray(v).nbytes for v in segment.weights.arrays.values()) <= external_bytes:
        path.write_bytes(model.SerializeToString())
        return [path.name]
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)
    return [path.name, path.name + ".data"]


def _inline(init: onnx.TensorProto, value: np.ndarray) -> None:
    """Put ``value`` back into ``init`` (a stub whose data was split off), keeping its type and dims."""
    init.ClearField("external_data")
    init.data_location = onnx.TensorProto.DEFAULT
    if np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize == value.dtype.itemsize:
        init.raw_data = np.ascontiguousarray(value).tobytes()
    else:
        init.CopyFrom(onnx.numpy_helper.from_array(value, init.name))


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> str:
    """Arrays by name as an ``.npz`` that ``np.load`` reads (written member by member: a tensor may be named
    ``file`` or ``allow_pickle``, which ``np.savez`` would take for its own arguments)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(value), allow_pickle=False)
    return path.name


def _same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                        and np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind in "fc") for k in a)


#: session entries onnx-bisect measures every segment with: weights are not pre-packed for one run (pre-packed
#: int8 kernels may round differently, so the repro keeps the setting its figure was measured with)
MEASURED_WITH = {"session.disable_prepacking": "1"}


def _run(repro: Repro, segment: StandaloneSegment, inputs: str, expected: str) -> tuple:
    """``(inputs file, expected file, optimization level, session entries)`` of one model in the script."""
    level = ORT_LEVELS[repro.runtime.opt_level] if segment.optimize else "ORT_DISABLE_ALL"
    return inputs, expected, level, {**dict(repro.runtime.session_config), **MEASURED_WITH}


SCRIPT_BODY = '''
model = sys.argv[1] if len(sys.argv) > 1 else "segment.onnx"
inputs, expected, level, config = RUNS[model]
options = ort.SessionOptions()
options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
for key, value in config.items():
    options.add_session_config_entry(key, value)
session = ort.InferenceSession(model, options, providers=[PROVIDER])
(actual,) = session.run(None, dict(np.load(inputs)))
(reference,) = np.load(expected).values()
if actual.size != reference.size:
    print(f"{model}: max abs error inf: ONNX computes shape {actual.shape}, PyTorch {reference.shape}: DIVERGES")
    sys.exit(1)
a, b = actual.astype(np.float64).reshape(reference.shape), reference.astype(np.float64)
err = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.nan_to_num(np.abs(a - b), nan=np.inf))
with np.errstate(divide="ignore", invalid="ignore"):
    ratio = np.max(np.where(err > 0, err / (ATOL + RTOL * np.abs(np.nan_to_num(b))), 0.0), initial=0.0)
verdict = "DIVERGES" if ratio > 1 else "within tolerance"
print(f"{model}: max abs error {np.max(err, initial=0.0):.6g}, {ratio:.4g}x the tolerance "
      f"(atol {ATOL:g}, rtol {RTOL:g}): {verdict}")
sys.exit(1 if ratio > 1 else 0)
'''


def repro_script(repro: Repro, runs: dict[str, tuple], header: list[str]) -> str:
    """The text of ``repro.py``: run one model of the folder and print its error against the tolerance, with
    numpy ``allclose`` semantics (``|a - b| <= atol + rtol * |b|``, NaN equal to NaN)."""
    provider = (repro.runtime.provider, dict(repro.runtime.provider_options))
    comments = "\n".join(f"# {line}" for item in header for line in textwrap.wrap(_printable(item), 100) or [""])
    table = ",\n".join(f"    {name!r}: {values!r}" for name, values in runs.items())
    return (
        '"""Repro of a divergence found by onnx-bisect: run a model of this folder in ONNX Runtime and print its\n'
        'error against PyTorch\'s output, in units of the tolerance (numpy allclose semantics). Needs only\n'
        'onnxruntime and numpy.\n\n'
        '    python repro.py              # segment.onnx, fed inputs.npz: the divergence\n'
        + ('    python repro.py fixed.onnx   # the diagnosis\' fix applied: within tolerance\n'
           if FIXED in runs else '')
        + '"""\n'
        f"{comments}\n"
        "import sys\n\nimport numpy as np\nimport onnxruntime as ort\n\n"
        f"ATOL, RTOL = {repro.tolerance.atol!r}, {repro.tolerance.rtol!r}\n"
        f"PROVIDER = {provider!r}\n"
        "# model: (inputs, PyTorch's output, graph optimization level, session config entries); onnx-bisect\n"
        "# measures with session.disable_prepacking=1 (without it ONNX Runtime pre-packs weights, and int8\n"
        "# kernels may then round differently)\n"
        "RUNS = {\n"
        f"{table},\n}}\n" + SCRIPT_BODY
    )


def _printable(text: str) -> str:
    """``text`` safe for a comment line: every character that is not printable (line breaks included) a space."""
    return "".join(c if c.isprintable() else " " for c in text)


def script_header(report: Report) -> list[str]:
    """What the script's comment says of the divergence: where, its error as the report states it, the cause."""
    fd, repro = report.first_divergence, report.repro
    kind = "local error (the segment fed PyTorch's values)" if repro.introduced else \
        "accumulated error (no single segment exceeds the tolerance: everything upstream, from the graph inputs)"
    lines = [f"onnx-bisect {__version__}: {report.model_name}, the first divergence: "
             f"{divergence_where(fd).replace('→', '->')}.",
             f"The report's {kind}: max abs {fmt_num(repro.error.max_abs)}, {fmt_num(repro.error.tol_ratio)}x the "
             "tolerance."]
    if fd.within is not None:
        text = narrowed_text(fd).strip()[1:-1]  # "narrowed from the N-node segment computing X"
        lines.append(text[0].upper() + text[1:] + ".")
    if repro.random_ops:
        lines.append(f"Random ops ({', '.join(repro.random_ops)}) are seeded here (seed 0): the error differs from the "
                     "report's run, which drew its own numbers, but it diverges the same way.")
    lines.append(f"Cause: {fd.cause.value} ({fd.confidence:.0%})." + (f" Fix ({FIXED}): {fd.fix}" if repro.fixed else ""))
    return lines


def render_extraction(x: Extraction) -> str:
    """What the command line says once the repro folder is written."""
    nodes = ", ".join(x.nodes[:6]) + (f" … (+{len(x.nodes) - 6})" if len(x.nodes) > 6 else "")
    if x.random_ops:
        same = (f"diverges again ({', '.join(x.random_ops)} draw random numbers, so the figure differs from run to "
                "run; seeded in the repro)" if x.reproduces else "does NOT diverge again")
    else:
        same = ("reproduces the report's error" if x.reproduces else
                "does NOT reproduce the report's error (ONNX Runtime optimises the segment alone differently)")
    text = (f"Extracted the divergent segment ({len(x.nodes)} node(s): {nodes}; inputs "
            f"{', '.join(x.inputs)}; output {x.output}) to {x.folder}: run alone from its files it {same}: max abs "
            f"{fmt_num(x.measured.max_abs)} against {fmt_num(x.stated.max_abs)} in the report, "
            f"{fmt_num(x.measured.tol_ratio)}x the tolerance.")
    if x.fixed is not None:
        text += (f" {FIXED} (the diagnosis' fix) " + ("passes" if x.fixed.ok else "does NOT pass")
                 + f": max abs {fmt_num(x.fixed.max_abs)}, {fmt_num(x.fixed.tol_ratio)}x the tolerance.")
    else:
        text += " No fixed.onnx: the diagnosis has no confirmed fix to apply."
    return text + f" Run it: cd {x.folder} && python {SCRIPT}" + (f" [{FIXED}]" if x.fixed is not None else "")
