"""Match the model's forward arguments to the ONNX graph inputs, checking shape and dtype."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..errors import OnnxLoadError
from ..records.nest import canonical, flatten_outputs, to_numpy
from ..records import ModelInputs


def make_feeds(inputs: ModelInputs, model: onnx.ModelProto, forward_params: tuple[str, ...]) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """Return ``(feeds, warnings)`` for the graph's inputs.

    Arguments are matched by name when the graph's input names are forward
    parameter names, otherwise by position (the exporters keep argument order
    and drop ``None``).  A float argument of another precision than the graph
    expects is cast with a warning; any other mismatch is an error.
    """
    feeds: dict[str, np.ndarray] = {}
    warnings: list[str] = []
    for info, value, given in _match(inputs, model, forward_params):
        feeds[info.name], note = _check(info, value, given)
        if note and _lossy(value, feeds[info.name]):
            warnings.append(note)
    return feeds, tuple(warnings)


def cast_notes(inputs: ModelInputs, model: onnx.ModelProto, forward_params: tuple[str, ...]) -> list[str]:
    """The float inputs cast to the precision the graph declares that only rounded (no value overflowed or
    vanished): what a caller of this file does too, a fact to note rather than a problem."""
    notes = []
    for info, value, given in _match(inputs, model, forward_params):
        cast, note = _check(info, value, given)
        if note and not _lossy(value, cast):
            notes.append(note)
    return notes


def _loss(value: np.ndarray, cast: np.ndarray) -> str:
    """What the cast changed: overflowed and vanished values, else the largest change."""
    finite, nonzero = np.isfinite(value), value != 0
    over, under = int(np.sum(finite & ~np.isfinite(cast))), int(np.sum(nonzero & (cast == 0)))
    if over or under:
        return (f" ({over} value(s) overflowed to infinity, {under} non-zero value(s) became 0: export the model "
                f"to take {value.dtype} inputs, or scale them into {cast.dtype}'s range)")
    change = np.abs(cast.astype(np.float64) - value.astype(np.float64))
    return f" (rounded: largest change {float(np.max(change)) if change.size else 0.0:.3g})"


def _lossy(value: np.ndarray, cast: np.ndarray) -> bool:
    """Whether casting ``value`` lost more than rounding: finite values that overflowed, non-zero ones that
    became zero."""
    if value.dtype == cast.dtype or value.dtype.kind != "f":
        return False
    finite, nonzero = np.isfinite(value), value != 0
    return bool(np.any(finite & ~np.isfinite(cast)) or np.any(nonzero & (cast == 0)))


def _match(inputs: ModelInputs, model: onnx.ModelProto, forward_params: tuple[str, ...]):
    """``[(graph input, value, given name)]``: by name when the graph's input names are forward
    parameter names, else by position."""
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    by_name = dict(zip(inputs.names, inputs.args)) | dict(inputs.kwargs)
    ordered = [(name, by_name[name]) for name in forward_params if name in by_name] or list(by_name.items())
    flat = [(f"{n}{path}", to_numpy(t)) for n, v in ordered for path, t in flatten_outputs(v)]
    names = {i.name for i in graph_inputs}
    if names and names <= {n for n, _ in flat}:
        return [(i, dict(flat)[i.name], i.name) for i in graph_inputs]
    by_key = {canonical(n): (n, v) for n, v in flat}
    if graph_inputs and len(by_key) == len(flat) and all(canonical(i.name) in by_key for i in graph_inputs):
        # nested arguments named as the ONNX inputs they became (past_key_values[0][key] ~ past_key_values.0.key)
        return [(i, by_key[canonical(i.name)][1], by_key[canonical(i.name)][0]) for i in graph_inputs]
    if len(flat) == len(graph_inputs):
        return [(i, value, given) for i, (given, value) in zip(graph_inputs, flat)]
    raise OnnxLoadError(
        f"The ONNX model takes {len(graph_inputs)} input(s) ({_describe(graph_inputs)}) but "
        f"{len(flat)} tensor(s) were given ({', '.join(f'{n} {v.dtype}{list(v.shape)}' for n, v in flat)}). "
        "Pass one --input per ONNX input, in order."
    )


def nested_inputs(inputs: ModelInputs, model: onnx.ModelProto, forward_params: tuple[str, ...]) -> list[str]:
    """One line per nested argument (a list, tuple, dict or key/value cache): the ONNX inputs its tensors
    became, in the order the exporters flatten them."""
    args = dict(zip(inputs.names, inputs.args)) | dict(inputs.kwargs)
    became: dict[str, list[str]] = {}
    for info, _, given in _match(inputs, model, forward_params):
        top = next((n for n in args if given == n or given.startswith(n + "[")), None)
        if top is not None and given != top:
            became.setdefault(top, []).append(info.name if info.name == given else f"{info.name} ← {given}")
    return [f"Argument '{name}' ({_kind(args[name])}) became ONNX inputs {', '.join(names)}."
            for name, names in became.items()]


def _kind(value) -> str:
    count = sum(1 for _ in flatten_outputs(value))
    return f"{type(value).__name__} of {count} tensor{'s' if count != 1 else ''}"


def fixed_dimension_conflicts(inputs: ModelInputs, model: onnx.ModelProto,
                              forward_params: tuple[str, ...]) -> list[tuple[str, int, int, int]]:
    """Where ``inputs`` need a size the graph fixes: ``[(graph input, axis, fixed size, needed size)]``."""
    conflicts = []
    for info, value, _ in _match(inputs, model, forward_params):
        dims = _dims(info)
        if dims is None or len(dims) != value.ndim:
            continue
        conflicts += [(info.name, axis, d, s) for axis, (d, s) in enumerate(zip(dims, value.shape))
                      if d is not None and d != s]
    return conflicts


def _dims(info: onnx.ValueInfoProto) -> list[int | None] | None:
    tt = info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]


def _check(info: onnx.ValueInfoProto, value: np.ndarray, given: str) -> tuple[np.ndarray, str]:
    tt = info.type.tensor_type
    try:
        want = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else value.dtype
    except (KeyError, ValueError) as exc:
        raise OnnxLoadError(f"The ONNX input '{info.name}' has element type {tt.elem_type}, which has no numpy "
                            "equivalent (or ONNX does not define it). Re-export the model.") from exc
    note = ""
    if value.dtype != want:
        if value.dtype.kind == "f" and np.dtype(want).kind == "f":
            cast = value.astype(want)
            note = (f"Input '{given}' is {value.dtype} but the ONNX input '{info.name}' is {np.dtype(want)}: "
                    f"it was cast for ONNX Runtime while PyTorch ran on the {value.dtype} values"
                    f"{_loss(value, cast)}.")
            value = cast
        else:
            raise OnnxLoadError(
                f"Input '{given}' has dtype {value.dtype} but the ONNX input '{info.name}' expects "
                f"{np.dtype(want)}. Save the input with dtype {np.dtype(want)}."
            )
    dims = _dims(info)
    if dims is not None and (len(dims) != value.ndim or any(d is not None and d != s for d, s in zip(dims, value.shape))):
        shown = ["?" if d is None else d for d in dims]
        raise OnnxLoadError(
            f"Input '{given}' has shape {list(value.shape)} but the ONNX input '{info.name}' expects {shown}. "
            "Pass an input of that shape, or re-export the model with dynamic axes."
        )
    return np.ascontiguousarray(value), note


def _describe(graph_inputs) -> str:
    return ", ".join(i.name for i in graph_inputs) or "none"
