"""Writing output files: atomically, so an interrupted run leaves no partial file."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_atomic(path: str, data: bytes | str) -> None:
    """Write ``path`` via a temporary file in the same folder and an atomic rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_atomic(source: str, path: str) -> None:
    """Copy the file ``source`` to ``path`` via a temporary file in the target folder and an atomic rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as f:
            shutil.copyfileobj(f, out, 16 << 20)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
