"""Float32 conditioning: a difference beyond the tolerance that is float32 rounding the model amplifies.

A model whose activations grow large (random weights of a re-parameterisable network, an Inception stem)
turns float32 rounding into differences far beyond a fixed tolerance: PyTorch's float32 result is itself that
far from the exact one.  Comparing ONNX Runtime with PyTorch alone cannot tell this from a fault; a float64
run of the same model can.  Where a tensor differs from PyTorch beyond the tolerance, onnx-bisect measures how
far PyTorch's float32 value and ONNX Runtime's are from the float64 run's: when ONNX Runtime is no farther than
:data:`ENVELOPE` times PyTorch's own distance, the difference is float32 rounding (the model's conditioning at
these inputs), not a fault — an output judged so counts as agreeing, a layer is marked ``conditioned`` — and a
note says by how much.  A fault is judged against that noise: its error is far beyond PyTorch's own.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..capture.modules import capture_float16, capture_float64
from ..capture.ops import capture_ops_float64
from ..records import Capture, ErrorOrigin, LayerResult, ModelInputs, OutputResult, Status, Tolerance
from ..report.progress import Progress
from . import memory
from .prepare import Prepared

#: ONNX Runtime may be this many times farther from a float64 run than PyTorch's float32 is (two float32
#: computations summing in other orders land at distances of one scale, not one value); then PyTorch's own
#: distance is at least a quarter of the difference judged: the tolerance is tighter than float32 allows there
ENVELOPE = 3.0
#: a tensor whose float64 value is farther from PyTorch's float32 one than this share of the model's largest
#: activation is not the same computation (a model that samples, code that branches on the dtype): float32
#: rounding, however amplified, stays far below the largest magnitude the model computes
COMPARABLE = 1e-3
#: a tolerance tighter than this (rtol) asks for float32 rounding itself to be reported: no conditioning
FLOAT32_RESOLUTION = 1e-6
#: a float64 copy of the weights must fit in this share of the available memory
FLOAT64_SHARE = 0.125
#: a file whose float initializers are at least this share float16 (by elements) computes in float16
FLOAT16_FILE = 0.5
#: :data:`COMPARABLE` for a float16 run against the float32 one (float16 rounding is 8,000 times float32's)
COMPARABLE_HALF = 0.1


@dataclasses.dataclass(frozen=True)
class Float64Values:
    """A float64 run's values: of each module call, ``(module, call) -> (float32 value, float64 value)``, and of
    the exported program's ops, by FX node name."""

    modules: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]
    ops: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Conditioning:
    """What a float64 run says of the differences beyond the tolerance."""

    outputs: tuple[OutputResult, ...]
    layers: tuple[LayerResult, ...]
    note: str = ""


def judge(p: Prepared, outputs: tuple[OutputResult, ...], layers: tuple[LayerResult, ...], captured: Capture,
          inputs: ModelInputs, final: dict[str, np.ndarray], probed: dict[str, np.ndarray], tolerance: Tolerance,
          progress: Progress) -> Conditioning | None:
    """Outputs and layers beyond the tolerance re-judged against a float64 run (None: nothing to re-judge, a
    tolerance below float32's resolution, or no comparable float64 run: a large model, a model that will not
    run in float64 or samples)."""
    beyond = [o for o in outputs if not o.diff.ok]
    diverged = [r for r in layers if r.status is Status.DIVERGED]
    if p.index.half_share >= FLOAT16_FILE:
        return judge_half(p, outputs, layers, captured, inputs, probed, progress)
    if not (beyond or diverged) or tolerance.rtol < FLOAT32_RESOLUTION or not _affordable(p):
        return None
    first = min((r for r in diverged if r.diff is not None), key=lambda r: r.order, default=None)
    if not _within_reach([o.diff for o in beyond] + ([first.diff] if first is not None else []), captured):
        return None
    with progress.step("float64", "running PyTorch in float64 (is the difference float32 rounding?)"):
        truth = capture_float64(p.loaded.module, inputs)
    if truth is None or len(truth.outputs) != len(captured.outputs):
        return None
    scale = max((float(np.max(np.abs(a.value))) for a in truth.activations
                 if np.asarray(a.value).dtype.kind == "f" and np.size(a.value)), default=0.0)
    names = {name: i for i, name in enumerate(p.index.graph_outputs)}
    new_outputs, worst = [], None
    for o in outputs:
        i = names.get(o.name)
        ratio = None if o.diff.ok or i is None or o.name not in final else _ratio(
            final[o.name], captured.outputs[i], truth.outputs[i], scale)
        if ratio is not None and ratio[0] <= ENVELOPE:
            o = dataclasses.replace(o, conditioned=True)
            worst = max(worst or ratio, ratio)
        new_outputs.append(o)
    ops = frozenset(r.pair.activation.op for r in layers if r.status is Status.DIVERGED and r.pair.activation.op)
    exact = Float64Values(_module_values(captured, truth), (capture_ops_float64(p.exported.program, inputs, ops)
                                                           or {}) if ops and p.exported.program is not None else {})
    new_layers = tuple(_layer(r, exact, probed, scale) for r in layers)
    conditioned = [r for r in new_layers if r.status is Status.CONDITIONED]
    if worst is None and not conditioned:
        return None
    return Conditioning(tuple(new_outputs), new_layers, _note(new_outputs, conditioned, worst))


def judge_half(p: Prepared, outputs: tuple[OutputResult, ...], layers: tuple[LayerResult, ...], captured: Capture, inputs: ModelInputs,
               probed: dict[str, np.ndarray], progress: Progress) -> Conditioning | None:
    """In a file that computes in float16, the layers beyond the tolerance re-judged against a float16 run of
    PyTorch: where ONNX Runtime is as close to PyTorch's float32 value as that run is, the difference is float16
    rounding — of the op itself (a normalisation of a small-variance input with a large mean) or of everything
    before, which this model amplifies there — and the layer is ``conditioned``.  A fault stays far beyond
    float16's rounding; the outputs are judged as measured (the precision rule explains those).  When outputs
    diverge and no layer would stay diverged, the rounding does not account for them (a weight off by a float16
    step or two, amplified): nothing is re-judged, and the divergence is bisected as measured."""
    judged = [r for r in layers if r.status is Status.DIVERGED]
    if not judged or not _affordable(p):
        return None
    with progress.step("float16", "running PyTorch in float16 (is the difference float16 rounding?)"):
        half = capture_float16(p.loaded.module, inputs)
    if half is None:
        return None
    scale = max((float(np.max(np.abs(a.value))) for a in captured.activations
                 if np.asarray(a.value).dtype.kind == "f" and np.size(a.value)), default=0.0)
    rounding = Float64Values(_module_values(captured, half), {})
    ids = {id(r) for r in judged}
    new_layers = tuple(_layer(r, rounding, probed, scale, half=True) if id(r) in ids else r for r in layers)
    conditioned = [r for r in new_layers if r.status is Status.CONDITIONED]
    left = any(r.status is Status.DIVERGED for r in new_layers)
    if not conditioned or not (left or all(o.agrees for o in outputs)):
        return None
    first = conditioned[0].pair.activation.module or "<model>"
    note = (f"Float16 rounding: {len(conditioned)} layer(s) beyond the tolerance are as close to PyTorch's float32 "
            f"values as a float16 run of PyTorch (first {first}), marked 'conditioned': float16 rounding, which "
            "this model amplifies there, not a fault.")
    return Conditioning(outputs, new_layers, note)


def _within_reach(diffs, captured: Capture) -> bool:
    """Whether any difference could be judged float32 rounding: ONNX Runtime within :data:`ENVELOPE` times
    PyTorch's distance to the float64 run, itself within :data:`COMPARABLE` of the largest activation, puts
    the difference within (1 + ENVELOPE)·COMPARABLE of it (doubled: that activation is read here in float32).
    Differences all beyond it need no float64 run: of the layers, only the first beyond the tolerance in graph
    order is asked (when it stays a divergence, no later layer can be the first)."""
    scale = max((float(np.max(np.abs(a.value))) for a in captured.activations
                 if np.asarray(a.value).dtype.kind == "f" and np.size(a.value)), default=0.0)
    reach = 2 * (1 + ENVELOPE) * COMPARABLE * scale
    return any(d.max_abs <= reach for d in diffs)


def _affordable(p: Prepared) -> bool:
    """Whether a float64 copy of the model's weights fits (never in a low-memory run: weights mapped)."""
    module = p.loaded.module
    if module is None or p.low_memory:
        return False
    available = memory.available_memory()
    return available is None or 2 * memory.weight_bytes(module) <= FLOAT64_SHARE * available


def _ratio(onnx_value: np.ndarray, float32: np.ndarray, float64: np.ndarray, scale: float,
           comparable: float = COMPARABLE) -> tuple[float, float, float] | None:
    """``(ONNX Runtime's distance to the float64 value over PyTorch float32's, the first, the second)``
    (max abs), or None where shapes differ, PyTorch float32 is exact, or PyTorch's float32 is farther from the
    float64 value than :data:`COMPARABLE` of the largest activation, ``scale``: not the same computation."""
    a, p, t = (np.asarray(x) for x in (onnx_value, float32, float64))
    if a.size != t.size or p.size != t.size or a.dtype.kind != "f" or t.dtype.kind != "f":
        return None
    t = t.astype(np.float64).reshape(-1)
    with np.errstate(all="ignore"):
        theirs = float(np.max(np.abs(p.astype(np.float64).reshape(-1) - t)))
        ours = float(np.max(np.abs(a.astype(np.float64).reshape(-1) - t)))
    if not (np.isfinite(theirs) and np.isfinite(ours)) or theirs <= 0 or theirs > comparable * scale:
        return None
    return ours / theirs, ours, theirs


def _module_values(captured: Capture, truth: Capture) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """``(float32 value, float64 value)`` of each captured module call, by ``(module, call)``."""
    wide = {(a.module, a.call): a.value for a in truth.activations}
    return {(a.module, a.call): (a.value, wide[(a.module, a.call)]) for a in captured.activations
            if not a.op and (a.module, a.call) in wide and np.shape(a.value) == np.shape(wide[(a.module, a.call)])}


def _float64_of(a, exact: Float64Values) -> np.ndarray | None:
    """The float64 value of activation ``a``: its module call's; for an op, the exported program's float64 run
    of it, else that of the module call in its module whose float32 value is the op's."""
    if not a.op:
        found = exact.modules.get((a.module, a.call))
        return None if found is None else found[1]
    if a.op in exact.ops:
        return exact.ops[a.op]
    value = np.asarray(a.value)
    return next((wide for (module, _), (narrow, wide) in exact.modules.items()
                 if module.startswith(a.module) and np.shape(narrow) == value.shape and _same(narrow, value)), None)


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal up to float32 rounding of the largest element (the exported program's ops and the eager module
    compute one value with other kernels)."""
    with np.errstate(all="ignore"):
        scale = float(np.max(np.abs(x))) if x.size else 0.0
        return bool(np.max(np.abs(x.astype(np.float64) - y)) <= 1e-5 * scale) if x.size else True


def _layer(r: LayerResult, exact: Float64Values, probed, scale: float, half: bool = False) -> LayerResult:
    """``r`` marked ``conditioned`` when it diverged and ONNX Runtime's value is as close to the float64 run's
    as PyTorch's float32 value is (``half``: as close to PyTorch's float32 value as a float16 run of PyTorch,
    whose values ``exact`` then holds)."""
    a = r.pair.activation
    if r.status is not Status.DIVERGED or r.pair.tensor not in probed:
        return r
    wide_value = _float64_of(a, exact)
    if wide_value is None:
        return r
    wide = dataclasses.replace(r.pair, activation=dataclasses.replace(a, value=wide_value))
    try:
        narrow, truth = (wide.reference(), r.pair.reference()) if half else (r.pair.reference(), wide.reference())
        ratio = _ratio(probed[r.pair.tensor], narrow, truth, scale, COMPARABLE_HALF if half else COMPARABLE)
    except (ValueError, TypeError):  # a layout the float64 value cannot take
        return r
    if ratio is None or ratio[0] > ENVELOPE:
        return r
    return dataclasses.replace(r, status=Status.CONDITIONED, origin=ErrorOrigin.NONE)


def _note(outputs, conditioned: list[LayerResult], worst) -> str:
    judged = [o.name for o in outputs if o.conditioned]
    parts = []
    if judged:
        parts.append(f"output(s) {', '.join(judged)} differ from PyTorch beyond the tolerance, but ONNX Runtime is "
                     f"as close to a float64 run of the model as PyTorch's float32 is (max abs {worst[1]:.3g} "
                     f"against PyTorch's own {worst[2]:.3g}, {worst[0]:.2f}x)")
    if conditioned:
        parts.append(f"{len(conditioned)} layer(s) beyond the tolerance are as close to the float64 run as "
                     f"PyTorch's float32 (first {conditioned[0].pair.activation.module or '<model>'}), marked "
                     "'conditioned'")
    return ("Float32 conditioning: " + "; ".join(parts) + ". This model amplifies float32 rounding at these "
            "inputs (its activations grow large): judged against that, they agree. Use a looser tolerance "
            "here, or inputs and weights of realistic scale.")
