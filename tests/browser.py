"""Headless Chromium for the HTML report's tests: the DOM after scripts ran, the console, a screenshot's pixels.

Tests that need it skip (with the reason) where no Chromium is installed.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Chromium's own log lines that say nothing about the page (no D-Bus, no GPU in a container)
NOISE = ("dbus", "D-Bus", "vaapi", "sandbox_linux", "unexpected operator", "Fontconfig", "gpu_init")


def chromium() -> str:
    """The Chromium executable, or skip the test."""
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (apt-get install chromium)")


@dataclass(frozen=True)
class Rendered:
    """What Chromium made of a page: the DOM after its scripts ran, and every console message."""

    dom: str
    console: list[str]


def render(page: Path, tmp: Path) -> Rendered:
    """Load ``page`` in headless Chromium: its DOM (after scripts) and the console messages (errors, CSP
    violations, logs: Chromium prints each as an ``INFO:CONSOLE`` line)."""
    proc = _run(["--dump-dom", page.resolve().as_uri()], tmp)
    return Rendered(proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line])


def screenshot(page: Path, png: Path, tmp: Path, size=(1280, 1000)) -> np.ndarray:
    """Screenshot ``page`` into ``png``; return its pixels (height × width × rgb)."""
    proc = _run([f"--screenshot={png}", f"--window-size={size[0]},{size[1]}", page.resolve().as_uri()], tmp)
    assert png.is_file(), proc.stderr[-2000:]
    return read_png(png)


def _run(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
            f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def read_png(path: Path) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) without a library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw, stride = np.frombuffer(zlib.decompress(idat), dtype=np.uint8), width * channels
    image = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        image[y] = previous = _unfilter(int(kind), line, previous, channels)
    return image.reshape(height, width, channels)[:, :, :3]


def _unfilter(kind: int, line: np.ndarray, previous: np.ndarray, bpp: int) -> np.ndarray:
    """One scanline with its PNG filter undone (None, Sub, Up vectorised; Average and Paeth pixel by pixel)."""
    if kind == 0:
        return line
    if kind == 1:
        return (np.cumsum(line.reshape(-1, bpp).astype(np.int64), axis=0) & 255).astype(np.uint8).ravel()
    if kind == 2:
        return line + previous
    out, up = bytearray(line.tobytes()), previous.tobytes()
    for i in range(len(out)):
        left = out[i - bpp] if i >= bpp else 0
        if kind == 3:
            out[i] = (out[i] + (left + up[i]) // 2) & 255
            continue
        corner = up[i - bpp] if i >= bpp else 0
        p = left + up[i] - corner
        pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - corner)
        out[i] = (out[i] + (left if pa <= pb and pa <= pc else up[i] if pb <= pc else corner)) & 255
    return np.frombuffer(bytes(out), dtype=np.uint8)


def count_near(pixels: np.ndarray, colour: tuple[int, int, int], within: int = 24) -> int:
    """How many pixels are within ``within`` per channel of ``colour``."""
    return int((np.abs(pixels.astype(np.int16) - np.array(colour, dtype=np.int16)) <= within).all(axis=-1).sum())
