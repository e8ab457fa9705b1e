"""The one error boundary of the command line: every way a run can end becomes one line and an exit status.

* a problem with the input or usage: ``onnx-bisect: error: …`` and 2;
* a tool or runtime failure on input that is fine (an exporter or ONNX Runtime
  crashing, a bug in onnx-bisect): ``onnx-bisect: failure: …`` with what to
  report, and 3;
* Ctrl-C: 130; SIGTERM: 143 — after every temporary file and folder is removed
  and no output file is left half-written (outputs are written atomically).

``--debug`` re-raises instead, with the traceback.  Library warnings (numpy's
overflow in a comparison, a deprecation in a dependency) stay off stderr unless
``--debug`` is given: the report is what the tool says.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import warnings
from typing import Callable

from ..errors import BisectError
from ..records import ExitStatus


class Terminated(BaseException):
    """SIGTERM arrived: unwind like Ctrl-C (temporary files are removed on the way out)."""


def _on_sigterm(signum, frame):  # noqa: ARG001 - the signal module's handler signature
    raise Terminated()


def guarded(job: Callable[[], int], debug: bool) -> int:
    """Run ``job`` (which returns an exit status) and turn whatever ends it into one line and a status."""
    previous = _install(signal.SIGTERM, _on_sigterm)
    try:
        with _quiet_libraries(debug), _private_caches():
            return job()
    except BisectError as exc:
        if debug:
            raise
        kind = "error" if exc.exit_status == ExitStatus.USAGE else "failure"
        print(f"onnx-bisect: {kind}: {exc}", file=sys.stderr)
        return ExitStatus(exc.exit_status)
    except KeyboardInterrupt:
        print("onnx-bisect: interrupted; no partial output was left behind.", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except Terminated:
        print("onnx-bisect: terminated (SIGTERM); no partial output was left behind.", file=sys.stderr)
        return ExitStatus.TERMINATED
    except Exception as exc:  # noqa: BLE001 - the boundary: anything unforeseen is a failure, said in one line
        if debug:
            raise
        print(f"onnx-bisect: failure: {_unexpected(exc)}", file=sys.stderr)
        return ExitStatus.FAILURE
    finally:
        if previous is not None:
            _install(signal.SIGTERM, previous)


def _unexpected(exc: BaseException) -> str:
    """One paragraph for an exception nobody raised on purpose."""
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if isinstance(exc, MemoryError):
        return ("the machine ran out of memory (MemoryError). Run on a machine with more memory, or with "
                "smaller inputs.")
    return (f"an unexpected {type(exc).__name__}{': ' + text if text else ''}. This is a failure of onnx-bisect "
            "or of a library it calls, not a problem with your input: please report it with the output of the "
            "same command with --debug.")


def _install(signum, handler):
    """Set a signal handler where that is allowed (the main thread); return the previous one."""
    try:
        return signal.signal(signum, handler)
    except ValueError:  # not the main thread (the API called from a worker): leave signals alone
        return None


#: caches torch keeps under $TMPDIR (torch.export's inductor and triton caches): a run leaves none behind
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


@contextlib.contextmanager
def _private_caches():
    """Point torch's on-disk caches at a private folder removed at the end (a value the user set is kept)."""
    unset = [name for name in CACHE_VARIABLES if name not in os.environ]
    if not unset:
        yield
        return
    folder = tempfile.mkdtemp(prefix="onnx-bisect-cache-")
    for name in unset:
        os.environ[name] = os.path.join(folder, name.split("_")[0].lower())
    try:
        yield
    finally:
        for name in unset:
            os.environ.pop(name, None)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _quiet_libraries(debug: bool):
    """Keep library warnings and numpy's floating-point warnings off stderr (``--debug`` shows them)."""
    if debug:
        yield
        return
    import numpy as np
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # its errors reach onnx-bisect as exceptions; the log lines are noise
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield
