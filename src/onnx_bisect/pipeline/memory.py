"""One framework in memory at a time: when a run is low-memory, and how the PyTorch model lets go of its weights.

A low-memory run (``--low-memory``, or automatic when the model's weights take
more than :data:`AUTO_SHARE` of the memory available when the run starts) does
the PyTorch pass first, with its activations streamed to the run's store on disk;
then the module's parameters and buffers are written to one file in the run's
private folder and replaced by memory-mapped tensors of that file
(:func:`offload_weights`).  From then on the module still runs (the diagnosis
re-runs parts of it, the weight rule reads its parameters), but its weights cost
memory only while they are read, and their pages are handed back before ONNX
Runtime loads the model: PyTorch's copy and ONNX Runtime's are never both held.
"""
from __future__ import annotations

import dataclasses
import gc
import mmap
import os
from pathlib import Path

import numpy as np
import torch

from ..records.weights import register_mapping, release, release_all, trim_heap
from ..report.progress import Progress
from .prepare import Prepared

#: a run becomes low-memory when the weights take more than this share of the memory available at its start:
#: two copies (one per framework) and the activations would then take more than about half of it
AUTO_SHARE = 0.25
WEIGHTS_FILE = "torch-weights.bin"
#: in a low-memory run, the tensors one window exposes (see run.windows) take at most this share of the
#: weights' size (so ONNX Runtime's phase holds little beyond the weights), never more than this share of the
#: memory available once the PyTorch weights are let go of, and never less than WINDOW_MIN bytes
WINDOW_SHARE = 0.125
WINDOW_MIN = 64 << 20


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``, else the physical memory), or
    None when the platform does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's parameters and buffers (tied tensors counted once)."""
    seen = {id(t): t for t in list(module.parameters()) + list(module.buffers())}
    return sum(t.numel() * t.element_size() for t in seen.values())


def wants_low_memory(module: torch.nn.Module, forced: bool | None) -> bool:
    """``forced`` when given; else whether the weights exceed :data:`AUTO_SHARE` of the available memory."""
    return forced if forced is not None else too_large(weight_bytes(module))


def too_large(size: int) -> bool:
    """Whether ``size`` bytes of weights exceed :data:`AUTO_SHARE` of the available memory (a low-memory run)."""
    available = available_memory()
    return available is not None and size > AUTO_SHARE * available


def release_pytorch(prepared: Prepared, folder: str | os.PathLike, progress: Progress, forced: bool) -> Prepared:
    """The PyTorch side done: the module's weights memory-mapped from ``folder`` (:func:`offload_weights`),
    every mapped page handed back; ``prepared`` with a note saying so.  Nothing else may hold the weights by
    then (the exported program: drop it from the :class:`ExportedModel` before :func:`.prepare.prepare`)."""
    module = prepared.loaded.module
    size = weight_bytes(module)
    with progress.step("offload", "writing the PyTorch weights to disk before ONNX Runtime loads the model"):
        offload_weights(module, folder)
        release_all()
    why = "--low-memory" if forced else (f"the weights, {size / 2**30:.1f} GiB, take more than a quarter of the "
                                         "memory available")
    note = (f"Low-memory run ({why}): PyTorch ran first, its activations kept on disk; its weights were memory-"
            "mapped from a temporary file while ONNX Runtime ran.")
    return dataclasses.replace(prepared, notes=prepared.notes + (note,), low_memory=True)


def window_budget(window_mb: float | None, low: bool, weights: int = 0) -> int | None:
    """The bytes one window of exposed tensors may take: ``window_mb`` when given (``--window-mb``), else in a
    low-memory run :data:`WINDOW_SHARE` of the ``weights`` bytes within [:data:`WINDOW_MIN`,
    :data:`WINDOW_SHARE` of the memory available now]; None (no windows) otherwise."""
    if window_mb is not None:
        return max(1, int(window_mb * 2**20))
    if not low:
        return None
    available = available_memory() or 0
    return max(WINDOW_MIN, int(min(weights, available) * WINDOW_SHARE))


def offload_weights(module: torch.nn.Module, folder: str | os.PathLike) -> int:
    """Write the module's parameters and buffers to :data:`WEIGHTS_FILE` in ``folder`` and put memory-mapped
    tensors of that file in their place (ties kept: a tensor shared by two modules stays shared); the pages are
    handed back.  Returns the bytes written."""
    tensors = _unique_tensors(module)
    if not tensors:
        return 0
    path = Path(folder) / WEIGHTS_FILE
    offsets, end = {}, 0
    with open(path, "wb") as f:
        for key, t in tensors.items():
            end = -(-end // mmap.PAGESIZE) * mmap.PAGESIZE
            f.seek(end)
            offsets[key] = end
            f.write(memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))
            end += t.numel() * t.element_size()
        f.truncate(max(end, 1))
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: the module may write, the file stays
    register_mapping(buffer, path)
    mapped = {key: _mapped(buffer, offsets[key], t) for key, t in tensors.items()}
    _replace(module, mapped)
    del tensors
    gc.collect()
    trim_heap()
    release([np.frombuffer(buffer, np.uint8)])
    return end


def _unique_tensors(module: torch.nn.Module) -> dict[int, torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    for m in module.modules():
        for t in list(m._parameters.values()) + list(m._buffers.values()):
            if t is not None and t.device.type == "cpu" and not t.is_sparse and t.layout == torch.strided:
                out.setdefault(id(t), t)
    return out


def _mapped(buffer: mmap.mmap, offset: int, like: torch.Tensor) -> torch.Tensor:
    if not like.numel():
        value = torch.empty(like.shape, dtype=like.dtype)
    else:
        value = torch.frombuffer(buffer, dtype=like.dtype, count=like.numel(), offset=offset).view(like.shape)
    return torch.nn.Parameter(value, requires_grad=like.requires_grad) if isinstance(like, torch.nn.Parameter) \
        else value


def _replace(module: torch.nn.Module, mapped: dict[int, torch.Tensor]) -> None:
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, t in list(table.items()):
                if t is not None and id(t) in mapped:
                    table[name] = mapped[id(t)]
