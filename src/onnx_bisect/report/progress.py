"""Progress lines on stderr for long steps, shown only when stderr is a terminal."""
from __future__ import annotations

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


class Progress:
    """Prints ``[onnx-bisect] step… done (1.2 s)`` when enabled; records step timings and the peak memory at
    the end of each step (``peaks``: the process's peak so far, so the step that raised it shows) always."""

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self._current: tuple[str, float] | None = None
        self._shown = 0.0  # when advance last wrote

    @contextmanager
    def step(self, key: str, label: str):
        """Time one pipeline step under ``key``; announce it as ``label``."""
        if self.enabled:
            self.stream.write(f"[onnx-bisect] {label}…")
            self.stream.flush()
        start = time.perf_counter()
        self._current = (label, start)
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

    def advance(self, done: int, total: int) -> None:
        """Within the current step, ``done`` of ``total`` parts (windows, module calls) are finished: on a
        terminal, the step's line says so with an estimate of the time left (the mean time of a part so far,
        times the parts left), at most twice a second."""
        if not self.enabled or self._current is None or not done:
            return
        now = time.perf_counter()
        if done < total and now - self._shown < 0.5:  # at most two lines a second
            return
        self._shown = now
        label, start = self._current
        left = f", about {(now - start) / done * (total - done):.0f} s left" if done <= total else ""
        self.stream.write(f"\r[onnx-bisect] {label}… {min(done, total)}/{total}{left} ")
        self.stream.flush()
