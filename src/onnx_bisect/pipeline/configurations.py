"""Configurations stage: the input cases and runtime settings a verification runs over.

Input cases come from the sample: resized along dynamic axes (batch sizes,
sequence lengths …), one per sample of a dataset, or generated edge cases
(zeros, large and tiny magnitudes, the extremes of the sample's range).
Runtime settings come from the providers, optimization levels and session
entries asked for.  Nothing here runs a model.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import InputError, UsageError
from ..records import CaseKind, InputCase, LoadedModel, ModelInputs, OptLevel, RuntimeSettings
from .specs import AxisSpec, parse_provider

#: seeds the generated edge cases, so every run builds the same inputs
SEED = 20261123


# ---------------------------------------------------------------- named tensors


def named_tensors(inputs: ModelInputs) -> list[tuple[str, torch.Tensor]]:
    """The top-level tensor arguments by forward parameter name (positional first)."""
    named = list(zip(inputs.names, inputs.args)) + list(inputs.kwargs.items())
    return [(n, v) for n, v in named if isinstance(v, torch.Tensor)]


def _replace(inputs: ModelInputs, new: dict[str, torch.Tensor]) -> ModelInputs:
    args = tuple(new.get(n, v) for n, v in zip(inputs.names, inputs.args)) + tuple(inputs.args[len(inputs.names):])
    kwargs = {k: new.get(k, v) for k, v in inputs.kwargs.items()}
    return ModelInputs(args=args, kwargs=kwargs, names=inputs.names)


def axis_members(inputs: ModelInputs, spec: AxisSpec) -> list[str]:
    """The inputs ``spec`` resizes: those named, else every input whose ``axis`` has the first one's size."""
    tensors = named_tensors(inputs)
    if spec.inputs:
        known = {n for n, _ in tensors}
        missing = [n for n in spec.inputs if n not in known]
        if missing:
            raise UsageError(f"--vary names input(s) {missing} but the forward's tensor inputs are "
                             f"{sorted(known)}.")
        chosen = [(n, t) for n, t in tensors if n in spec.inputs]
    else:
        chosen = tensors
    ranked = [(n, t) for n, t in chosen if t.dim() > spec.axis >= -t.dim()]
    if not ranked:
        raise UsageError(f"No tensor input has an axis {spec.axis} to vary ({spec.name}); the inputs are "
                         + ", ".join(f"{n}{list(t.shape)}" for n, t in tensors) + ".")
    size = ranked[0][1].shape[spec.axis]
    return [n for n, t in ranked if t.shape[spec.axis] == size]


def resize(inputs: ModelInputs, spec: AxisSpec, size: int) -> ModelInputs:
    """``inputs`` with ``spec.axis`` of its member inputs made ``size`` long.

    Shorter: the first ``size`` slices.  Longer: the slices are repeated; along
    the batch axis (0) each added row is also rolled (flattened) by its own
    offset, spread evenly over the row and the same for every input, so token
    ids and their mask stay aligned and rows differ: a fault that mixes rows (a
    reduction over the batch) cannot hide behind identical rows.
    """
    new = {}
    for name in axis_members(inputs, spec):
        value = dict(named_tensors(inputs))[name]
        if value.shape[spec.axis % value.dim()] == 0 and size > 0:
            raise InputError(
                f"Input '{name}' is empty along axis {spec.axis % value.dim()} (shape {list(value.shape)}), so "
                f"onnx-bisect has no values to make the {spec.name} sizes {list(spec.sizes)} from. Pass a sample "
                "with at least one entry along that axis.")
        new[name] = _resized(value, spec.axis % value.dim(), size)
    return _replace(inputs, new)


def _resized(value: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    have = value.shape[axis]
    if size <= have:
        return value.narrow(axis, 0, size).clone()
    index = torch.arange(size) % have
    out = value.index_select(axis, index).clone()
    if axis == 0:
        added = size - have
        for j, row in enumerate(range(have, size)):
            flat = out[row].reshape(-1)
            if flat.numel() > 1:
                shift = 1 + (j * max(1, (flat.numel() - 1) // added)) % (flat.numel() - 1)
                out[row] = torch.roll(flat, shift).reshape(out[row].shape)
    return out


def shape_cases(inputs: ModelInputs, specs: Sequence[AxisSpec]) -> list[InputCase]:
    """One case per combination of the specs' sizes (the cross product), in the order given."""
    cases = []
    for combo in itertools.product(*(spec.sizes for spec in specs)):
        current = inputs
        for spec, size in zip(specs, combo):
            current = resize(current, spec, size)
        sizes = tuple((spec.name, size) for spec, size in zip(specs, combo))
        label = " ".join(f"{n}={s}" for n, s in sizes)
        cases.append(InputCase(label=label, kind=CaseKind.SHAPE, inputs=current, sizes=sizes))
    return cases


def dynamic_axes(inputs: ModelInputs, specs: Sequence[AxisSpec]) -> dict[str, dict[int, str]]:
    """``{input name: {axis: dimension name}}`` the export must leave free for ``specs``."""
    axes: dict[str, dict[int, str]] = {}
    for spec in specs:
        label = spec.name.replace("[", "_").replace("]", "").replace(",", "_")
        for name in axis_members(inputs, spec):
            rank = dict(named_tensors(inputs))[name].dim()
            axes.setdefault(name, {})[spec.axis % rank] = label
    return axes


def export_example(inputs: ModelInputs, specs: Sequence[AxisSpec]) -> ModelInputs:
    """The sample with every varied dimension at least 2 long.

    ``torch.export`` specializes a dimension whose example size is 0 or 1 to
    that constant, so a dynamic batch axis must be exported from two rows.
    """
    for spec in specs:
        members = axis_members(inputs, spec)
        size = dict(named_tensors(inputs))[members[0]].shape[spec.axis]
        if size < 2:
            inputs = resize(inputs, spec, 2)
    return inputs


# ---------------------------------------------------------------- datasets


def dataset_cases(path: str, loaded: LoadedModel, read_file: Callable[[Path, LoadedModel], Any],
                  to_inputs: Callable[[Any, LoadedModel], ModelInputs],
                  sample: ModelInputs | None = None) -> list[InputCase]:
    """The samples of a dataset, one case each.

    ``path`` is a directory (each ``.npy``/``.npz``/``.pt`` file is one sample,
    read like an ``--input`` file, in name order) or one ``.npz``/``.npy``/``.pt``
    file whose arrays hold the samples along axis 0.  Sample ``i`` is row ``i``
    kept as a batch of one (``x[i:i+1]``), or, when the arrays have one more
    axis than the ``sample`` inputs, ``x[i]`` itself (a stack of whole inputs).
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in (".npy", ".npz", ".pt") and f.is_file())
        if not files:
            raise InputError(f"Dataset directory '{p}' holds no .npy, .npz or .pt file. Put one sample per file.")
        samples = [to_inputs(read_file(f, loaded), loaded) for f in files]
        return [InputCase(label=f"sample {i} ({f.name})", kind=CaseKind.DATASET, inputs=s, sample=i)
                for i, (f, s) in enumerate(zip(files, samples))]
    if not p.is_file():
        raise InputError(f"Dataset '{p}' does not exist. Pass a directory of samples or an .npz/.npy/.pt file "
                         "whose arrays hold the samples along axis 0.")
    rows = to_inputs(read_file(p, loaded), loaded)
    tensors = named_tensors(rows)
    counts = {t.shape[0] if t.dim() else 0 for _, t in tensors}
    if len(counts) != 1 or 0 in counts:
        raise InputError(
            f"Dataset '{p}' must hold the samples along axis 0 of every array, the same number in each; got "
            + ", ".join(f"{n}{list(t.shape)}" for n, t in tensors) + "."
        )
    ranks = dict((n, t.dim()) for n, t in named_tensors(sample)) if sample is not None else {}
    stacked = bool(ranks) and all(ranks.get(n) == t.dim() - 1 for n, t in tensors)
    count = counts.pop()
    cases = []
    for i in range(count):
        row = {n: (t[i] if stacked else t[i:i + 1]).clone() for n, t in tensors}
        cases.append(InputCase(label=f"sample {i}", kind=CaseKind.DATASET, inputs=_replace(rows, row), sample=i))
    return cases


# ---------------------------------------------------------------- edge cases

#: how far the magnitude cases scale the sample's floating-point inputs
LARGE_SCALE = 1e4
TINY_SCALE = 1e-6


def edge_cases(inputs: ModelInputs) -> tuple[list[InputCase], list[str]]:
    """Generated inputs that stress numerics, and notes on the cases that do not apply.

    ``zeros``; ``large`` (floats × 1e4) and ``tiny`` (floats × 1e-6); ``min`` and
    ``max`` (every element at the sample's smallest / largest value, per input);
    ``extremes`` (each element at the sample's minimum or maximum, seeded).
    Integer inputs (token ids, masks) keep the sample's values in the magnitude
    cases, so ids stay valid; boolean inputs are never changed.
    """
    tensors = named_tensors(inputs)
    floats = [n for n, t in tensors if t.is_floating_point()]
    rng = np.random.default_rng(SEED)
    makers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "zeros": torch.zeros_like,
        "large": lambda t: t * LARGE_SCALE if t.is_floating_point() else t.clone(),
        "tiny": lambda t: t * TINY_SCALE if t.is_floating_point() else t.clone(),
        "min": lambda t: torch.full_like(t, t.min().item()) if t.numel() else t.clone(),
        "max": lambda t: torch.full_like(t, t.max().item()) if t.numel() else t.clone(),
        "extremes": lambda t: _extremes(t, rng),
    }
    notes = []
    if not floats:
        makers.pop("large")
        makers.pop("tiny")
        notes.append("Edge cases 'large' and 'tiny' were skipped: the model has no floating-point input to scale.")
    cases = []
    for label, make in makers.items():
        new = {n: (t.clone() if t.dtype == torch.bool else make(t)) for n, t in tensors}
        cases.append(InputCase(label=f"edge:{label}", kind=CaseKind.EDGE, inputs=_replace(inputs, new)))
    return cases, notes


def _extremes(t: torch.Tensor, rng) -> torch.Tensor:
    if not t.numel():
        return t.clone()
    pick = torch.from_numpy(rng.integers(0, 2, size=tuple(t.shape)).astype(bool))
    return torch.where(pick, t.max(), t.min()).to(t.dtype)


# ---------------------------------------------------------------- runtime settings


def runtime_settings(providers: Sequence[str], opt_levels: Sequence[OptLevel], base_config: Sequence[tuple[str, str]],
                     variants: Sequence[Sequence[tuple[str, str]]] = ()) -> list[RuntimeSettings]:
    """Every provider × optimization level × (the base session entries, then each variant on top)."""
    out = []
    for provider in providers or ["CPUExecutionProvider"]:
        name, options = parse_provider(provider)
        for level in opt_levels or [OptLevel.ALL]:
            for extra in [(), *variants]:
                config = tuple(dict([*base_config, *extra]).items())
                out.append(RuntimeSettings(provider=name, provider_options=options, opt_level=level,
                                           session_config=config))
    return list(dict.fromkeys(out))
