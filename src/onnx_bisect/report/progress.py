"""Progress lines on stderr for long steps, shown only when stderr is a terminal."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Progress:
    """Prints ``[onnx-bisect] step… done (1.2 s)`` when enabled; records step timings always."""

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.timings: dict[str, float] = {}

    @contextmanager
    def step(self, key: str, label: str):
        """Time one pipeline step under ``key``; announce it as ``label``."""
        if self.enabled:
            self.stream.write(f"[onnx-bisect] {label}…")
            self.stream.flush()
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.timings[key] = self.timings.get(key, 0.0) + elapsed
            if self.enabled:
                self.stream.write(f" {elapsed:.1f} s\n")
                self.stream.flush()
