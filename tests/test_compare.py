import numpy as np
import pytest

from onnx_bisect.measure.compare import check_tensors, compare_tensors
from onnx_bisect.records import Tolerance


@pytest.mark.parametrize("seed", range(20))
def test_pass_fail_matches_numpy_allclose(seed):
    rng = np.random.default_rng(seed)
    b = rng.normal(size=(7, 5)).astype(np.float32)
    a = b + rng.normal(scale=10 ** rng.uniform(-7, -2), size=b.shape).astype(np.float32)
    tol = Tolerance(atol=1e-4, rtol=1e-3)
    d = compare_tensors(a, b, tol)
    assert d.ok == np.allclose(a.astype(np.float64), b.astype(np.float64), atol=tol.atol, rtol=tol.rtol)
    assert d.max_abs == pytest.approx(np.abs(a.astype(np.float64) - b).max())
    assert (d.tol_ratio <= 1.0) == d.ok


def test_metrics_are_measured_not_fixed():
    b = np.array([1.0, 2.0, -4.0], dtype=np.float32)
    a = np.array([1.0, 2.5, -4.0], dtype=np.float32)
    d = compare_tensors(a, b, Tolerance())
    assert d.max_abs == pytest.approx(0.5)
    assert d.max_rel == pytest.approx(0.25)
    assert d.mean_abs == pytest.approx(0.5 / 3)
    assert 0.98 < d.cosine < 1.0
    assert not d.ok


def test_nan_only_in_onnx_fails_and_matching_nan_passes():
    ref = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    assert compare_tensors(ref.copy(), ref, Tolerance()).ok
    bad = np.array([np.nan, np.nan, np.inf], dtype=np.float32)
    d = compare_tensors(bad, ref, Tolerance())
    assert not d.ok and d.nonfinite == 1 and d.max_abs == float("inf")


def test_zero_tolerance_means_exact():
    a = np.array([1.0, 2.0], dtype=np.float32)
    assert compare_tensors(a, a.copy(), Tolerance(0.0, 0.0)).ok
    assert not compare_tensors(a + np.float32(1e-7), a, Tolerance(0.0, 0.0)).ok


def test_shape_mismatch_is_a_failure_unless_only_a_reshape():
    a = np.ones((2, 3), np.float32)
    assert compare_tensors(a.reshape(3, 2), a, Tolerance()).ok
    assert not compare_tensors(np.ones((4,), np.float32), a, Tolerance()).ok


def test_integer_and_bool_tensors_compare_exactly():
    ids = np.array([1, 2, 3], dtype=np.int64)
    assert compare_tensors(ids, ids.copy(), Tolerance()).ok
    assert not compare_tensors(np.array([1, 2, 4]), ids, Tolerance()).ok
    mask = np.array([True, False])
    assert compare_tensors(mask, mask.copy(), Tolerance()).ok


def test_sqnr_is_measured():
    b = np.ones(100, np.float32)
    a = b + np.float32(0.1)
    d = compare_tensors(a, b, Tolerance())
    assert d.sqnr_db == pytest.approx(20.0, abs=0.01)  # signal 1, noise 0.01 per element


def test_float16_tensor_passes_within_its_resolution_and_reports_ulps():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=1000).astype(np.float32)
    half = ref.astype(np.float16)  # exact rounding: at most half a step off
    d = compare_tensors(half, ref, Tolerance(1e-5, 1e-5))
    assert d.ok and d.ulps is not None and d.ulps <= 0.5 + 1e-6
    assert d.tol_ratio > 1  # the raw error alone would fail this tolerance
    wrong = (ref * 1.05).astype(np.float16)
    assert not compare_tensors(wrong, ref, Tolerance(1e-5, 1e-5)).ok
    assert compare_tensors(ref.copy(), ref, Tolerance()).ulps is None  # float32: plain allclose


@pytest.mark.parametrize("seed", range(12))
def test_float32_path_agrees_with_the_float64_definition(seed):
    """Finite float32/float16 tensors are compared in float32 scratch memory; every number and the verdict must
    equal the float64 computation (float64 inputs take that path)."""
    rng = np.random.default_rng(seed)
    b = rng.normal(size=(3, 50, 7)).astype(np.float32)
    b[0, 0, :2] = 0.0  # zeros in the reference: max_rel skips them
    noise = rng.normal(scale=10 ** rng.uniform(-7, -2), size=b.shape)
    a = (b + noise).astype(np.float16 if seed % 4 == 0 else np.float32)
    tol = Tolerance(atol=float(10 ** rng.uniform(-6, -3)), rtol=float(10 ** rng.uniform(-5, -2)))
    fast = compare_tensors(a, b.transpose(0, 2, 1).transpose(0, 2, 1), tol)  # a non-contiguous reference too
    slow = compare_tensors(a.astype(np.float64), b.astype(np.float64), tol)
    assert fast.ok == slow.ok or seed % 4 == 0  # float16: the ulps rule only applies to the float16 tensor
    for key in ("max_abs", "max_rel", "mean_abs", "tol_ratio", "sqnr_db"):
        assert getattr(fast, key) == pytest.approx(getattr(slow, key), rel=1e-4, abs=1e-12), key
    assert fast.cosine == pytest.approx(slow.cosine, abs=1e-9)
    edge = b.copy()
    edge.flat[5] += np.float32((tol.atol + tol.rtol * abs(float(b.flat[5]))) * 0.999999)
    assert compare_tensors(edge, b, tol).ok == np.allclose(edge.astype(np.float64), b.astype(np.float64),
                                                          atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("seed", range(6))
def test_check_keeps_the_verdict_max_abs_and_ratio_of_the_full_comparison(seed):
    rng = np.random.default_rng(seed)
    b = rng.normal(size=(4, 33)).astype(np.float32)
    a = (b + rng.normal(scale=10 ** rng.uniform(-6, -2), size=b.shape)).astype(np.float32)
    tol = Tolerance(1e-4, 1e-3)
    light, full = check_tensors(a, b, tol), compare_tensors(a, b, tol)
    assert (light.ok, light.max_abs, light.shape) == (full.ok, full.max_abs, full.shape)
    assert light.tol_ratio == pytest.approx(full.tol_ratio, rel=1e-6)
    assert np.isnan(light.cosine) and np.isnan(light.max_rel), "not measured, so not reported as a number"
    half = check_tensors(a.astype(np.float16), b, tol)
    assert half.ulps is not None, "float16 verdicts need the rounding steps: the full comparison runs"
