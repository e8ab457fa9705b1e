"""The private folder of one run: what onnx-bisect writes for itself (its own export with external data, the
activation store, the PyTorch weights it lets go of), removed when the run ends, however it ends."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """A new private folder under the system's temporary directory, removed at the end: on return, on an
    error, on Ctrl-C and on SIGTERM (the command line's boundary turns SIGTERM into an exception that unwinds
    through here)."""
    folder = Path(tempfile.mkdtemp(prefix="onnx-bisect-work-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
