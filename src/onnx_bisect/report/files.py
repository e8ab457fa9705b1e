"""Writing output files: atomically, so an interrupted run leaves no partial file."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def umask() -> int:
    """The process's file-creation mask (read without changing it for longer than the call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _replacing(target: Path):
    """A binary file to write that replaces ``target`` atomically when the block ends without error (with the
    permissions an ordinary new file gets: mkstemp's are private), and is removed otherwise."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.chmod(tmp, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str, data: bytes | str) -> None:
    """Write ``path`` via a temporary file in the same folder and an atomic rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _replacing(target) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def copy_atomic(source: str, path: str) -> None:
    """Copy the file ``source`` to ``path`` via a temporary file in the target folder and an atomic rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _replacing(target) as out, open(source, "rb") as f:
        shutil.copyfileobj(f, out, 16 << 20)
