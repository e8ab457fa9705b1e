"""Large initializers kept beside the graph skeleton, shared by every session; and the memory-mapped files
their bytes (and other large arrays: stored activations, released PyTorch weights) come from.

An array mapped from a file costs no memory until it is read, and the pages it
was read into can be handed back at any time (:func:`release`): the next read
brings them back from the file.  :func:`file_region` tells where in its file an
array lies, so that ONNX Runtime can read a weight from the file itself instead
of being handed a copy.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np


@dataclass(frozen=True)
class Weights:
    """Large initializers by name, as read-only numpy arrays."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __contains__(self, name: str) -> bool:
        return name in self.arrays


@dataclass(frozen=True)
class FileRegion:
    """Where an array's bytes lie in a file: ``path`` (absolute), ``offset`` and ``length`` in bytes."""

    path: str
    offset: int
    length: int


_PAGE = mmap.PAGESIZE
_LOCK = threading.Lock()
#: (first address, length, file, the map) of every registered memory map
_MAPS: list[tuple[int, int, str, "weakref.ref[mmap.mmap]"]] = []


def register_mapping(buffer: mmap.mmap, path: str | os.PathLike) -> None:
    """Remember that ``buffer`` maps the file at ``path`` (from its first byte), for :func:`file_region` and
    :func:`release`.  The entry goes with the map."""
    if not len(buffer):
        return
    start = np.frombuffer(buffer, np.uint8).ctypes.data
    with _LOCK:
        _MAPS[:] = [m for m in _MAPS if m[3]() is not None]
        _MAPS.append((start, len(buffer), os.path.abspath(path), weakref.ref(buffer)))


def _containing(address: int, length: int):
    with _LOCK:
        for start, size, path, ref in _MAPS:
            if start <= address and address + length <= start + size:
                buffer = ref()
                if buffer is not None:
                    return start, size, path, buffer
    return None


def file_region(array: np.ndarray) -> FileRegion | None:
    """The file region holding ``array``'s bytes, when it is a contiguous view of a registered map."""
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.nbytes:
        return None
    found = _containing(array.ctypes.data, array.nbytes)
    if found is None:
        return None
    start, _, path, _ = found
    return FileRegion(path, array.ctypes.data - start, array.nbytes)


def release(arrays: Iterable[np.ndarray]) -> None:
    """Hand back the memory pages of memory-mapped arrays (their values stay readable: a read brings them back
    from the file); arrays that are not memory-mapped are left alone."""
    for a in arrays:
        if not isinstance(a, np.ndarray) or not a.nbytes:
            continue
        found = _containing(a.ctypes.data, 1)
        if found is None:
            continue
        start, size, _, buffer = found
        first = (a.ctypes.data - start) // _PAGE * _PAGE
        end = min(size, -(-(a.ctypes.data - start + a.nbytes) // _PAGE) * _PAGE)
        _advise(buffer, first, end - first)


def release_all() -> None:
    """Hand back the pages of every registered map."""
    with _LOCK:
        live = [(ref(), size) for _, size, _, ref in _MAPS]
    for buffer, size in live:
        if buffer is not None:
            _advise(buffer, 0, size)


def _advise(buffer: mmap.mmap, offset: int, length: int) -> None:
    if length > 0 and hasattr(mmap, "MADV_DONTNEED"):
        try:
            buffer.madvise(mmap.MADV_DONTNEED, offset, length)
        except (OSError, ValueError):  # a closed map, or a platform without madvise: nothing to hand back
            pass


def trim_heap() -> None:
    """Give the C heap's free memory back to the system.  glibc keeps freed blocks below its (self-raising)
    mmap threshold for reuse, so the weights a finished ONNX Runtime session had read stay resident without
    this; a no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
