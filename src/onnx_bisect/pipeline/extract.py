"""``--extract FOLDER``: write the first divergence's repro, run it from the written files, then publish the folder.

The folder is built in a hidden temporary sibling and renamed into place only once the written segment has run
(so an interrupted or failed extraction leaves nothing behind), and never over a folder that holds anything.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..diagnose.context import NOISE_ULPS
from ..errors import UsageError
from ..measure import compare
from ..records import Extraction, Report, Repro, StandaloneSegment, TensorDiff
from ..report import repro as files
from ..report.files import umask
from ..run.backend import make_backend

#: the written segment reproduces the report's error when their max abs differ by at most this fraction
SAME_ERROR = 0.01


def check_folder(folder: str) -> Path:
    """``folder`` as a path that may be created: refuse a file, a folder holding anything, or a place that cannot
    be written (before any work is done)."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"--extract {folder}: a file of that name exists; name a new or empty folder.")
    if path.is_dir() and any(path.iterdir()):
        raise UsageError(f"--extract {folder}: the folder exists and is not empty; onnx-bisect does not overwrite "
                         "it. Name a new or empty folder (or remove this one).")
    existing = next(p for p in [path.absolute(), *path.absolute().parents] if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--extract {folder}: '{existing}' is not writable; name a folder in a writable place.")
    return path


def extract(report: Report, folder: str, external_bytes: int = files.EXTERNAL_BYTES) -> Extraction:
    """Write ``report``'s repro into ``folder`` (created; an existing one must be empty) and say whether the
    written segment reproduces the report's error and whether the fixed one passes."""
    repro = _repro_of(report)
    target = check_folder(folder)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        staging.chmod(0o777 & ~umask())  # mkdtemp's folder is private; the repro is an ordinary folder
    except OSError as exc:
        raise UsageError(f"--extract {folder}: cannot create it ({exc.strerror or exc}).") from exc
    try:
        written = files.write_files(repro, staging, files.script_header(report), external_bytes)
        measured = _run(repro, repro.segment, staging / files.SEGMENT)
        fixed = None if repro.fixed is None else _run(repro, repro.fixed, staging / files.FIXED)
        _publish(staging, target, folder)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UsageError(f"--extract {folder}: writing the repro failed ({exc.strerror or exc}).") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    segment = repro.segment
    return Extraction(
        folder=str(target), files=tuple(written), stated=repro.error, measured=measured,
        reproduces=_diverges(measured) == _diverges(repro.error) and (bool(repro.random_ops) or reproduces(
            repro.error, measured, segment.expected, repro.low_precision)),
        nodes=tuple(n.name or n.op_type for n in segment.model.graph.node), inputs=tuple(segment.inputs),
        output=segment.output, fixed=fixed, external_data=any(f.endswith(".data") for f in written),
        random_ops=repro.random_ops,
    )


def _repro_of(report: Report) -> Repro:
    """The report's repro, or a UsageError saying why there is none."""
    if report.ok:
        raise UsageError("--extract: the outputs agree with the reference, so nothing diverged and there is no "
                         "segment to extract.")
    if report.first_divergence is None:
        raise UsageError("--extract: the outputs diverge, but no aligned tensor does (the divergence lies after the "
                         "last aligned tensor), so there is no segment to extract.")
    if report.repro is None:
        raise UsageError("--extract: this report keeps no segment to extract; bisect with extractable=True (the "
                         "default of onnx_bisect.bisect) or run the command line with --extract.")
    return report.repro


def _run(repro: Repro, segment: StandaloneSegment, path: Path) -> TensorDiff:
    """The written model, loaded from its file and run on the segment's inputs, against its expected value."""
    backend = make_backend(repro.runtime)
    values = backend.run(str(path), segment.inputs, [segment.output], one_shot=True, optimize=segment.optimize)
    marked = compare.at_resolution(values, {segment.output} if repro.half_resolution else set())
    return compare.compare_tensors(marked[segment.output], segment.expected, repro.tolerance)


def reproduces(stated: TensorDiff, measured: TensorDiff, expected: np.ndarray, low_precision: bool = False) -> bool:
    """Whether two errors are the same figure: equal within ``SAME_ERROR`` relative, or within what re-ordering the
    arithmetic explains at the scale of ``expected`` (float32's rounding, or float16's when the tensor is computed
    at half precision, as the comparison allows it); both infinite counts as the same."""
    a, b = stated.max_abs, measured.max_abs
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b or (math.isnan(a) and math.isnan(b))
    finite = np.abs(expected[np.isfinite(expected)]) if expected.size else np.zeros(0)
    ulps, eps = (compare.LOW_PRECISION_ULPS, np.finfo(np.float16).eps) if low_precision else \
        (NOISE_ULPS, np.finfo(np.float32).eps)
    noise = ulps * float(eps) * (1.0 + (float(finite.max()) if finite.size else 0.0))
    return abs(a - b) <= max(SAME_ERROR * abs(a), noise)


def _diverges(diff: TensorDiff) -> bool:
    """Beyond the tolerance by allclose (what ``repro.py`` prints), float16's rounding allowance aside."""
    return not diff.tol_ratio <= 1.0


def _publish(staging: Path, target: Path, folder: str) -> None:
    """Move the finished folder into place: rename (atomic), over an empty folder at most."""
    if target.is_dir():
        if any(target.iterdir()):
            raise UsageError(f"--extract {folder}: the folder was filled while the repro was being written; "
                             "onnx-bisect does not overwrite it.")
        target.rmdir()
    os.rename(staging, target)

