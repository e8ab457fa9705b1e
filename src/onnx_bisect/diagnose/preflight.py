"""Preflight: what can be checked before any ONNX forward pass.

Warnings with fixes: the ONNX graph exported in training mode, a float64 model
checked against a float32 graph, ``onnx.checker`` errors (full check).  An IR
version or opset the installed ONNX Runtime cannot load is an error.  The
initializers that differ from the PyTorch parameters (a stale checkpoint?) are
returned, to be judged once the layers are measured; a fixed batch size
(:func:`static_batch`) is a note the prepare step makes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import BackendError, OnnxLoadError
from ..records import Capture, LoadedModel, ModelInputs, ModuleKind, module_kind
from .support import layout
from .support.param_layouts import model_rnn_weights
from ..records.graph import checkable_view, input_free
from ..records.nest import to_numpy
from ..records.weights import Weights, release

#: weights shown by name in the stale-checkpoint warning
SHOWN = 5
#: an IR version and an opset every supported ONNX Runtime reads: the probes vary one thing at a time
SAFE_IR, SAFE_OPSET = 7, 13


@dataclass(frozen=True)
class Preflight:
    """What the checks before any run found: warnings with their fixes, and the initializers that differ from
    the parameters they pair with (a claim only once the layers reading them are measured: see
    :func:`stale_weight_warnings`)."""

    warnings: tuple[str, ...] = ()
    weight_differences: tuple["WeightDifference", ...] = ()
    notes: tuple[str, ...] = ()


def check_model(loaded: LoadedModel, inputs: ModelInputs, skeleton: onnx.ModelProto, weights: Weights,
                backend=None, capture: Capture | None = None) -> Preflight:
    """Every preflight check.

    Raises ``OnnxLoadError`` when the backend cannot load a model of this IR
    version and opset at all: nothing after this would run.
    """
    found: list[str] = []
    found += training_mode_nodes(skeleton)
    found += float64_model(loaded, inputs, skeleton)
    own = getattr(backend, "own_ops", lambda: frozenset())()
    found += checker_errors(skeleton, own)
    if backend is not None:
        problem = runtime_support(skeleton, backend)
        if problem:
            raise OnnxLoadError(problem)
    return Preflight(tuple(found), tuple(compare_weights(loaded, skeleton, weights, capture)),
                     notes=tuple(runtime_only_ops(skeleton, own)))


# ---------------------------------------------------------------- training mode

def training_mode_nodes(skeleton: onnx.ModelProto) -> list[str]:
    """Dropout nodes that drop and BatchNormalization nodes on batch statistics."""
    constants = {i.name: i for i in skeleton.graph.initializer}
    dropouts, norms, weights = [], [], input_free(skeleton.graph)
    for node in skeleton.graph.node:
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            flag = constants.get(node.input[2])
            if flag is None or bool(onnx.numpy_helper.to_array(flag).reshape(-1)[0]):
                dropouts.append(node.name)
        elif node.op_type == "BatchNormalization" and any(a.name == "training_mode" and a.i for a in node.attribute) \
                and node.input[0] not in weights:  # batch statistics of a weight: the model standardises it
            norms.append(node.name)
    if not dropouts and not norms:
        return []
    parts = []
    if norms:
        parts.append(f"{len(norms)} BatchNormalization node(s) normalize with the batch's statistics "
                     f"(training_mode=1: {', '.join(norms[:SHOWN])})")
    if dropouts:
        parts.append(f"{len(dropouts)} Dropout node(s) have training_mode on ({', '.join(dropouts[:SHOWN])})")
    return [f"The ONNX graph was exported in training mode: {'; '.join(parts)}. Fix: call model.eval() before "
            "exporting (TorchScript exporter: training=torch.onnx.TrainingMode.EVAL)."]


# ---------------------------------------------------------------- float64

def float64_model(loaded: LoadedModel, inputs: ModelInputs, skeleton: onnx.ModelProto) -> list[str]:
    """PyTorch computes in float64 while the ONNX graph's inputs are float32."""
    tensors = list(loaded.module.named_parameters()) + list(loaded.module.named_buffers())
    params = [n for n, t in tensors if str(t.dtype) == "torch.float64"]
    given = list(zip(inputs.names, inputs.args)) + list(inputs.kwargs.items())
    doubles = [n for n, v in given if str(getattr(v, "dtype", "")) == "torch.float64"]
    floats = [i.name for i in skeleton.graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT]
    if not (params or doubles) or not floats:
        return []
    what = ", ".join(filter(None, [f"inputs {', '.join(doubles)}" if doubles else "",
                                   f"{len(params)} parameter(s)/buffer(s) such as {params[0]}" if params else ""]))
    return [f"PyTorch computes in float64 ({what}) but the ONNX graph takes float32: expect differences of about "
            "1e-7 relative, far more where values cancel (large offsets, variances of nearly equal numbers). "
            "Fix: compare against model.float() with float32 inputs, or export the float64 model (model.double() "
            "and float64 inputs before torch.onnx.export) so ONNX computes in float64 too."]


# ---------------------------------------------------------------- onnx.checker

def checker_errors(skeleton: onnx.ModelProto, runtime_ops: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """``onnx.checker`` with ``full_check`` (strict shape inference), on a view whose split-off weights are inputs;
    nodes of ``runtime_ops`` (ops the runtime defines in the ONNX domain, which the onnx package has no schema
    for) are checked as the runtime's own (:func:`runtime_only_ops` notes them)."""
    view = checkable_view(skeleton)
    view.graph.ClearField("value_info")
    own = [n for n in view.graph.node if (n.domain, n.op_type) in runtime_ops and n.domain in ("", "ai.onnx")]
    for node in own:
        node.domain = RUNTIME_DOMAIN
    if own and not any(o.domain == RUNTIME_DOMAIN for o in view.opset_import):
        view.opset_import.append(helper.make_opsetid(RUNTIME_DOMAIN, 1))
    try:
        onnx.checker.check_model(view, full_check=True)
    except Exception as exc:  # noqa: BLE001 - ValidationError, InferenceError and friends
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return [f"onnx.checker (full check, strict shape inference) reports: {first}. ONNX Runtime may still run "
                "the model, but other runtimes and tools may not. Fix: repair the named node or re-export."]
    return []


#: where a view checked by onnx.checker puts the runtime's own ops (a domain the checker does not know)
RUNTIME_DOMAIN = "com.microsoft"


def runtime_only_ops(skeleton: onnx.ModelProto, runtime_ops: frozenset[tuple[str, str]]) -> list[str]:
    """A note when the ONNX domain holds ops only the runtime defines (its graph optimizer writes them there)."""
    ops = sorted({n.op_type for n in skeleton.graph.node
                  if n.domain in ("", "ai.onnx") and (n.domain, n.op_type) in runtime_ops})
    if not ops:
        return []
    return [f"The graph uses {', '.join(ops)} in the ONNX domain: ONNX Runtime's own op(s), as its graph optimizer "
            "writes them (an offline-optimized file). It runs on ONNX Runtime; other runtimes and onnx.checker do "
            "not know them, so keep the unoptimized file for those."]


# ---------------------------------------------------------------- runtime support

def runtime_support(skeleton: onnx.ModelProto, backend) -> str | None:
    """A message when the backend cannot load this IR version / opsets (probed with one-node models)."""
    if _loads(backend, skeleton.ir_version, list(skeleton.opset_import)):
        return None
    name = getattr(backend, "name", "the backend")
    problems = []
    if not _loads(backend, skeleton.ir_version, [helper.make_opsetid("", SAFE_OPSET)]):
        best = _highest(lambda v: _loads(backend, v, [helper.make_opsetid("", SAFE_OPSET)]), skeleton.ir_version)
        problems.append(f"IR version {skeleton.ir_version} (it reads up to {best})")
    for entry in skeleton.opset_import:
        if _loads(backend, SAFE_IR, [entry]):
            continue
        domain = entry.domain if entry.domain not in ("", "ai.onnx") else ""
        best = _highest(lambda v: _loads(backend, SAFE_IR, [helper.make_opsetid(domain, v)]), entry.version)
        problems.append(f"opset {entry.version}{' of ' + domain if domain else ''} (it supports up to {best})")
    return (f"{name} cannot load this model: {'; '.join(problems) or 'its IR version and opsets'}. Fix: upgrade "
            "onnxruntime, or re-export with an older opset (torch.onnx.export(..., opset_version=N)) and save with "
            "the onnx package matching your runtime.")


def _loads(backend, ir_version: int, opsets) -> bool:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "preflight",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    try:
        backend.run(model, {"x": np.zeros(1, np.float32)}, ["y"], None, one_shot=True)
    except BackendError:
        return False
    return True


def _highest(loads, above: int) -> int | None:
    """The highest version below ``above`` that ``loads`` (binary search), None if none does."""
    lo, hi = 1, above - 1
    if hi < lo or not loads(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if loads(mid) else (lo, mid - 1)
    return lo


# ---------------------------------------------------------------- dynamic batch axis

def static_batch(skeleton: onnx.ModelProto) -> list[str]:
    """Graph inputs whose first dimension is a fixed number: a note (many files are meant for one batch size;
    the configuration matrix says whether another batch would run)."""
    inits = {i.name for i in skeleton.graph.initializer}
    fixed = []
    for inp in skeleton.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if inp.name not in inits and len(dims) >= 2 and dims[0].HasField("dim_value"):
            fixed.append(f"'{inp.name}' (batch {dims[0].dim_value})")
    if not fixed:
        return []
    names = [f.split("'")[1] for f in fixed]
    return [f"Input(s) {', '.join(fixed)} have a fixed batch size: the model only runs on that batch. Fix: export "
            f"with dynamic_shapes={{'{names[0]}': {{0: torch.export.Dim('batch')}}}} (dynamo) or dynamic_axes="
            f"{{'{names[0]}': {{0: 'batch'}}}} (TorchScript)."]


# ---------------------------------------------------------------- stale weights

@dataclass(frozen=True)
class WeightDifference:
    """An ONNX initializer paired with a PyTorch tensor it should equal, and how far apart they are."""

    initializer: str
    parameter: str
    max_abs: float
    rel_l2: float
    refold: bool = False  # a per-channel rescale of the conv weight: a BatchNorm folded with other statistics


def stale_weight_warnings(diffs) -> list[str]:
    """The warnings for initializers that differ from the PyTorch parameters they come from (by name, else by
    value) — pass only those whose difference shows in what the graph computes (a folded BatchNorm, a
    standardised or re-parameterised weight is a transformed copy, not a stale one)."""
    found = []
    refolds = [d for d in diffs if d.refold]
    stale = [d for d in diffs if not d.refold]
    if refolds:
        found.append(f"{len(refolds)} ONNX weight(s) hold a Conv/Linear with a BatchNorm folded in, but not with the "
                     f"BatchNorm's parameters: {', '.join(repr(d.initializer) for d in refolds[:SHOWN])} "
                     f"(max abs {max(d.max_abs for d in refolds):.3g}). Fix: refold from the modules in eval mode "
                     "with their own eps and running statistics.")
    if stale:
        shown = "; ".join(f"'{d.initializer}' vs {d.parameter}: max abs {d.max_abs:.3g}, relative {d.rel_l2:.2g}"
                          for d in stale[:SHOWN])
        more = f" (and {len(stale) - SHOWN} more)" if len(stale) > SHOWN else ""
        found.append(f"{len(stale)} ONNX initializer(s) differ from the PyTorch parameters they were exported from: "
                     f"{shown}{more}. The ONNX file may come from another (stale) checkpoint. Fix: re-export from the "
                     "weights PyTorch runs, or load the checkpoint the file was made from.")
    return found


def compare_weights(loaded: LoadedModel, skeleton: onnx.ModelProto, weights: Weights,
                    capture: Capture | None = None) -> list[WeightDifference]:
    """Pair every float initializer with a PyTorch parameter/buffer (by name, else by value, allowing a transpose
    and a folded BatchNorm) and return the pairs that are not equal."""
    torch_arrays = {n: to_numpy(t) for n, t in
                    list(loaded.module.named_parameters()) + list(loaded.module.named_buffers())
                    if t.is_floating_point()}
    torch_arrays.update({n: a.astype(np.float32) for n, a in model_rnn_weights(loaded.module).items()})
    folded = _fold_pairs(loaded, capture)
    called = frozenset() if capture is None else frozenset(a.module for a in capture.activations)
    inits = _float_initializers(skeleton, weights)
    diffs, unmatched = [], {}
    used: set[str] = set()
    for name, value in one_at_a_time(inits.items()):
        ref = torch_arrays.get(name)
        if ref is None or ref.size != value.size:
            unmatched[name] = value
            continue
        used.add(name)
        if _equal(value, ref):
            continue
        fold = folded.get(name)
        if fold is not None and _equal(value, fold):
            continue  # the exporter kept the conv's name for the folded weight
        if fold is None and layout.reparameterised(value, ref, torch_arrays, layout.read_as_is(loaded.module, name,
                                                                                                called)):
            continue  # a layer scale folded into the named weight (a simplifier), a standardised weight
        diff = _difference(name, name if fold is None else f"{name} (+ folded BatchNorm)", value,
                           ref if fold is None else fold)
        if fold is not None and _per_channel_rescale(value, ref):
            diff = WeightDifference(diff.initializer, diff.parameter, diff.max_abs, diff.rel_l2, refold=True)
        diffs.append(diff)
    if unmatched:
        diffs += _match_by_value(unmatched, {n: a for n, a in torch_arrays.items() if n not in used}, folded,
                                 torch_arrays, loaded.module, called)
    return diffs


def one_at_a_time(items):
    """Each ``(name, array)`` in turn, the memory pages of the one before handed back: the memory-mapped weights
    of a large model are read once, never all held at once."""
    for name, value in items:
        yield name, value
        release([value])


def _float_initializers(skeleton: onnx.ModelProto, weights: Weights) -> dict[str, np.ndarray]:
    out = {}
    for init in skeleton.graph.initializer:
        value = weights.arrays.get(init.name)
        if value is None and init.data_location != TensorProto.EXTERNAL:
            try:
                value = onnx.numpy_helper.to_array(init)
            except (ValueError, TypeError, KeyError):  # an initializer numpy cannot read: nothing to compare
                continue
        if value is not None and np.issubdtype(value.dtype, np.floating) and value.size >= 2:
            out[init.name] = value
    return out


def _fold_pairs(loaded: LoadedModel, capture: Capture | None) -> dict[str, np.ndarray]:
    """Conv/Linear weights and biases with the following BatchNorm folded in, by the conv's parameter names.

    Which BatchNorm follows which conv comes from the capture's data flow; without
    a capture, a BatchNorm registered right after a conv of as many channels.
    """
    modules = dict(loaded.module.named_modules(remove_duplicate=False))  # a shared module under each name
    pairs = []
    if capture is not None:
        acts = capture.activations
        pairs = [(acts[i].module, act.module) for act in acts if act.kind is ModuleKind.BATCHNORM
                 for i in act.inputs if acts[i].kind.folds_batchnorm]
    else:
        named = list(modules.items())
        pairs = [(a, b) for (a, m), (b, n) in zip(named, named[1:])
                 if module_kind(m).folds_batchnorm and module_kind(n) is ModuleKind.BATCHNORM
                 and getattr(n, "num_features", None) == layout.out_channels(m)]
    out = {}
    for conv_name, bn_name in pairs:
        w, b = layout.fold_arrays(modules[conv_name], modules[bn_name])
        out[f"{conv_name}.weight"], out[f"{conv_name}.bias"] = w, b
    return out


def _equal(value: np.ndarray, ref: np.ndarray) -> bool:
    """Equal up to the initializer dtype's rounding, as stored, transposed or reshaped."""
    layouts = list(_layouts(value, ref))
    if any(value.dtype == c.dtype and np.array_equal(value, c) for c in layouts):
        return True  # the usual case, and the cheap one
    for candidate in layouts:
        rounded = candidate.astype(value.dtype)
        scale = float(np.max(np.abs(rounded))) or 1.0
        if np.max(np.abs(value.astype(np.float64) - rounded)) <= 4 * float(np.finfo(value.dtype).eps) * scale:
            return True
    return False


def _sample_equal(value: np.ndarray, ref: np.ndarray, n: int = 4096) -> bool:
    """:func:`_equal` on a fixed random sample of elements (the fingerprints already agree)."""
    index = np.unravel_index(np.random.default_rng(0).integers(0, value.size, min(n, value.size)), value.shape)
    for candidate in _layouts(value, ref):
        a, b = value[index].astype(np.float64), candidate[index].astype(value.dtype).astype(np.float64)
        if np.max(np.abs(a - b)) <= 4 * float(np.finfo(value.dtype).eps) * (float(np.max(np.abs(b))) or 1.0):
            return True
    return False


def _layouts(value: np.ndarray, ref: np.ndarray):
    if ref.shape == value.shape:
        yield ref
    if ref.ndim == 2 and ref.T.shape == value.shape:
        yield ref.T
    if ref.shape != value.shape and ref.size == value.size:
        yield ref.reshape(value.shape)


def _difference(name: str, parameter: str, value: np.ndarray, ref: np.ndarray) -> WeightDifference:
    best = None
    for candidate in _layouts(value, ref):
        d = value.astype(np.float64) - candidate
        rel = float(np.linalg.norm(d) / (np.linalg.norm(candidate) or 1.0))
        if best is None or rel < best.rel_l2:
            best = WeightDifference(name, parameter, float(np.max(np.abs(d))), rel)
    return best


def _match_by_value(unmatched: dict[str, np.ndarray], free: dict[str, np.ndarray],
                    folded: dict[str, np.ndarray], every: dict[str, np.ndarray], model=None,
                    called: frozenset[str] = frozenset()) -> list[WeightDifference]:
    """Pair initializers exporters renamed (e.g. transposed Linear weights) by value; report close-but-unequal ones
    (not a parameter times a layer scale of the model's ``every`` array, which a simplifier folded into it, nor a
    standardised copy of a weight ``model``'s layer standardises: :func:`layout.read_as_is`, of the ``called``
    modules)."""
    pool = dict(free)
    pool.update({f"{n} (+ folded BatchNorm)": a for n, a in folded.items()})
    by_size: dict[int, list[str]] = {}
    for n, a in pool.items():
        by_size.setdefault(a.size, []).append(n)
    sums: dict[str, np.ndarray] = {}
    leftover = {}
    for name, value in one_at_a_time(unmatched.items()):  # first every exact pairing, so renamed equal weights leave the pool
        candidates = [c for c in by_size.get(value.size, ()) if c in pool]
        for c in candidates:
            if c not in sums:
                sums[c] = _fingerprint(pool[c])
        key = _fingerprint(value) if candidates else None
        exact = [c for c in candidates if _same_fingerprint(key, sums[c], value) and _sample_equal(value, pool[c])]
        if exact:
            pool.pop(exact[0])
        elif candidates and value.ndim >= 2:
            leftover[name] = value
    diffs = []
    for name, value in one_at_a_time(leftover.items()):  # then the close but unequal ones: same layer, other values
        candidates = [c for c in by_size.get(value.size, ()) if c in pool]
        if not candidates:
            continue
        best = max(candidates, key=lambda c: _correlation(value, pool[c]))
        if _correlation(value, pool[best]) > 0.9 and not layout.reparameterised(
                value, pool[best], every, layout.read_as_is(model, best, called)):
            diff = _difference(name, best, value, pool[best])
            raw = best.replace(" (+ folded BatchNorm)", "")
            if raw in folded and raw in pool and _per_channel_rescale(value, pool[raw]):
                diff = WeightDifference(name, f"{raw} (+ folded BatchNorm)", diff.max_abs, diff.rel_l2, refold=True)
            pool.pop(best)
            diffs.append(diff)
    return diffs


def _per_channel_rescale(value: np.ndarray, ref: np.ndarray) -> bool:
    if value.shape != ref.shape or value.ndim < 2:
        return False
    return bool(layout.channel_ratios(value, ref)[1].max() <= 1e-3)


def _fingerprint(a: np.ndarray) -> np.ndarray:
    """Layout-independent summary (sum, sum of squares, min, max), computed without float64 copies."""
    flat = a.reshape(-1)
    return np.array([float(flat.sum()), float(np.dot(flat, flat)), flat.min(), flat.max()], np.float64)


def _same_fingerprint(key: np.ndarray, other: np.ndarray, value: np.ndarray) -> bool:
    """Fingerprints equal up to the rounding of ``value``'s dtype: a float16 copy of a float32 weight moves
    its sums by about √n rounding steps (a screen only: :func:`_sample_equal` decides)."""
    if value.dtype.itemsize >= 4:
        return bool(np.allclose(other, key, rtol=1e-4, atol=1e-6))
    eps = float(np.finfo(value.dtype).eps)
    top = max(abs(float(key[2])), abs(float(key[3])), 1e-30)
    slack = np.array([np.sqrt(value.size) * top, np.sqrt(value.size) * top * top, top, top]) * 4 * eps
    return bool(np.all(np.abs(other - key) <= slack + 8 * eps * np.abs(other)))


def _correlation(value: np.ndarray, ref: np.ndarray) -> float:
    best = -1.0
    for candidate in _layouts(value, ref):
        v, r = value.astype(np.float64).ravel(), candidate.astype(np.float64).ravel()
        v, r = v - v.mean(), r - r.mean()
        denom = float(np.linalg.norm(v) * np.linalg.norm(r))
        best = max(best, float(v @ r / denom) if denom > 0 else -1.0)
    return best
