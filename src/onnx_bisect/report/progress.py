"""Progress lines on stderr for long steps, shown only when stderr is a terminal."""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

try:
    import resource
except ImportError:  # Windows
    resource = None


def peak_rss_mb() -> float | None:
    """The process's peak resident memory so far, in MiB (None where the platform does not say)."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _own_copy(stream):
    """A stream on a copy of ``stream``'s file descriptor: while the exporters run, descriptor 2 points at
    /dev/null (their native output is silenced), and the export's progress must still reach the terminal."""
    try:
        return os.fdopen(os.dup(stream.fileno()), "w", buffering=1, encoding=stream.encoding, errors="replace")
    except (OSError, AttributeError, ValueError):  # no descriptor (a wrapped stream): write where we were told
        return stream


class Progress:
    """Prints ``[onnx-bisect] step… done (1.2 s)`` when enabled; records step timings and the peak memory at
    the end of each step (``peaks``: the process's peak so far, so the step that raised it shows) always."""

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        if stream is None and self.enabled:
            self.stream = _own_copy(sys.stderr)
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self._current: tuple[str, float] | None = None
        self._shown = 0.0  # when advance last wrote
        self._part: str | None = None  # the phase of the current step advance last heard of
        self._part_start = 0.0
        self._width = 0  # the length of the last progress line (a shorter one pads over it)

    @contextmanager
    def step(self, key: str, label: str):
        """Time one pipeline step under ``key``; announce it as ``label``."""
        if self.enabled:
            self.stream.write(f"[onnx-bisect] {label}…")
            self.stream.flush()
        start = time.perf_counter()
        self._current, self._part, self._width = (label, start), None, 0
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.timings[key] = self.timings.get(key, 0.0) + elapsed
            peak = peak_rss_mb()
            if peak is not None:
                self.peaks[key] = max(self.peaks.get(key, 0.0), peak)
            if self.enabled:
                self.stream.write(f" {elapsed:.1f} s\n")
                self.stream.flush()

    def advance(self, done: int, total: int, part: str | None = None) -> None:
        """Within the current step, ``done`` of ``total`` parts (windows, module calls) are finished: on a
        terminal, the step's line says so with an estimate of the time left (the mean time of a part so far,
        times the parts left), at most twice a second.  ``part`` names a phase of the step (the export's
        tracing, then its translation): a new phase restarts the clock its estimate is taken from, and the
        line says which phase the estimate is for.  ``total`` 0: the count is not known yet (no estimate)."""
        if not self.enabled or self._current is None:
            return
        now = time.perf_counter()
        if part != self._part:
            self._part, self._part_start, self._shown = part, now, 0.0
            if not done:  # a phase without counts: name it at once
                self._show(f"{part}…")
                return
        if not done or (total and done > total) or (done != total and now - self._shown < 0.5):
            return  # at most two lines a second; past the total there is nothing new to say
        self._shown = now
        start = self._current[1] if part is None else self._part_start
        count = f"{min(done, total)}/{total}" if total else f"{done}"
        left = f", about {(now - start) / done * (total - done):.0f} s left" if 0 < done <= total else ""
        self._show(f"{part}: {count}{left}" if part else f"{count}{left}")

    def _show(self, text: str) -> None:
        line = f"\r[onnx-bisect] {self._current[0]}… {text} "
        self.stream.write(line + " " * max(0, self._width - len(line)))  # clear what a longer line left
        self._width = len(line)
        self.stream.flush()
