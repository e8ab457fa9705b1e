"""The activation store: arrays written to memory-mapped files in the run's private folder.

In low-memory runs the PyTorch pass writes each activation here as it is
computed and keeps only a read-only view of the file, so the values the later
stages compare (align, measure, diagnose, report) cost no memory until they are
read, and the pages a read brought in can be handed back
(:func:`.weights.release`).  The files go with the folder at the end of the run.
"""
from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import numpy as np

from .weights import register_mapping, release

#: arrays are written at offsets aligned to this (a page: one array's pages can be handed back alone)
ALIGN = mmap.PAGESIZE


class ArrayStore:
    """Arrays copied into sparse files of ``chunk_bytes`` in ``folder``, memory-mapped; :meth:`put` returns a
    read-only view of the copy.  ``bytes_written`` counts what the store holds."""

    def __init__(self, folder: str | os.PathLike, chunk_bytes: int = 1 << 30, prefix: str = "activations"):
        self.folder = Path(folder)
        self.chunk_bytes = chunk_bytes
        self.prefix = prefix
        self.bytes_written = 0
        self._chunks: list[mmap.mmap] = []
        self._used = 0
        self._lock = threading.Lock()

    def put(self, array: np.ndarray) -> np.ndarray:
        """A read-only view, in the store's file, of a copy of ``array`` (its pages handed back once written)."""
        array = np.asarray(array)
        if array.dtype.hasobject:
            raise TypeError("the activation store holds numeric arrays only")
        if not array.nbytes:
            empty = np.empty(array.shape, array.dtype)
            empty.flags.writeable = False
            return empty
        with self._lock:
            buffer, offset = self._room(array.nbytes)
        view = np.frombuffer(buffer, dtype=array.dtype, count=array.size, offset=offset).reshape(array.shape)
        view[...] = array
        view.flags.writeable = False
        release([view])  # written: the data lives on in the file (page cache), not in this process
        self.bytes_written += array.nbytes
        return view

    def _room(self, nbytes: int) -> tuple[mmap.mmap, int]:
        """The chunk and offset where ``nbytes`` go, opening a new chunk when the current one is full."""
        start = -(-self._used // ALIGN) * ALIGN
        if not self._chunks or start + nbytes > len(self._chunks[-1]):
            size = max(self.chunk_bytes, -(-nbytes // ALIGN) * ALIGN)
            path = self.folder / f"{self.prefix}-{len(self._chunks)}.bin"
            with open(path, "w+b") as f:
                f.truncate(size)  # sparse: no disk is used until a page is written
                self._chunks.append(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_WRITE))
            register_mapping(self._chunks[-1], path)
            start = 0
        self._used = start + nbytes
        return self._chunks[-1], start
