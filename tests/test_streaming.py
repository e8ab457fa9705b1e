"""Streaming comparison statistics: a large tensor compared block by block gives the numbers of the whole."""
from __future__ import annotations

import math

import numpy as np
import pytest

from onnx_bisect.measure import compare, streaming
from onnx_bisect.records import Tolerance


def _pair(kind: str):
    rng = np.random.default_rng(0)
    b = rng.standard_normal((3, 50, 40)).astype(np.float32)
    a = (b + 1e-4 * rng.standard_normal(b.shape)).astype(np.float32)
    if kind == "nonfinite":
        a[0, 1, 2], b[0, 1, 2] = -np.inf, -np.inf  # a masked score on both sides: equal
        a[2, 3, 4] = np.nan  # one side only: counted
    if kind == "float16":
        a = b.astype(np.float16)
        return a, b, True
    if kind == "transposed":
        return a.transpose(2, 1, 0), b.transpose(2, 1, 0), False
    return a, b, False


@pytest.mark.parametrize("kind", ["finite", "nonfinite", "float16", "transposed"])
def test_block_by_block_equals_the_whole(kind, monkeypatch):
    a, b, half = _pair(kind)
    tol = Tolerance(1e-4, 1e-3)
    whole = compare.compare_tensors(a, b, tol)
    monkeypatch.setattr(streaming, "BLOCK", 97)  # many blocks, rows split across none
    monkeypatch.setattr(compare, "FAST_MAX", 97)  # the float32 fast path too gives way to the blocks
    assert len(list(streaming.blocks(a, b))) > 10
    blocked = compare.compare_tensors(a, b, tol)
    assert blocked.ok == whole.ok and blocked.nonfinite == whole.nonfinite and blocked.shape == whole.shape
    for field in ("max_abs", "max_rel", "tol_ratio", "mean_abs", "cosine", "sqnr_db"):
        x, y = getattr(blocked, field), getattr(whole, field)
        assert (x == y) if math.isinf(y) else math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12), field
    if half:
        assert math.isclose(blocked.ulps, whole.ulps, rel_tol=1e-6)


def test_blocks_are_views_of_leading_rows_and_cover_every_element(monkeypatch):
    monkeypatch.setattr(streaming, "BLOCK", 1000)
    a = np.arange(1 * 1 * 30 * 70, dtype=np.float32).reshape(1, 1, 30, 70)
    parts = list(streaming.blocks(a, a))
    assert [p[0].size for p in parts] == [980, 980, 140] and all(p[0].dtype == np.float64 for p in parts)
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), a.ravel())
