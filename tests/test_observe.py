"""Faithful location: bisect with exposures that keep the shipped outputs, skip the ones that change them."""
from __future__ import annotations

import numpy as np

from onnx_bisect.measure.compare import compare_tensors
from onnx_bisect.measure.observe import locate_faithfully
from onnx_bisect.records import Activation, MatchMethod, TensorPair, Tolerance

TOL = Tolerance(1e-4, 1e-3)


def _chain(n: int, first_bad: int, fused: set[int]):
    """``n`` aligned tensors t0..t{n-1}; from ``first_bad`` on the shipped graph is off by 1; exposing a tensor
    in ``fused`` breaks a fusion (the outputs change, as ONNX Runtime does when an inner tensor is exposed)."""
    pairs = []
    for i in range(n):
        act = Activation(index=i, module=f"m{i}", module_type="Linear", call=0, path="",
                         value=np.full((2, 3), float(i), np.float32), is_leaf=i % 4 != 0)
        pairs.append(TensorPair(act, f"t{i}", f"n{i}", "Gemm", MatchMethod.METADATA))
    runs = []

    def observe(tensors):
        runs.append(list(tensors))
        broken = any(int(t[1:]) in fused for t in tensors)
        values = {t: np.full((2, 3), float(int(t[1:])) + (1.0 if int(t[1:]) >= first_bad and not broken else 0.0),
                             np.float32) for t in tensors}
        values["output"] = np.array([0.0 if broken else 1.0])
        return values

    return pairs, observe, runs


def _locate(n, first_bad, fused):
    pairs, observe, runs = _chain(n, first_bad, fused)
    boundaries = frozenset(p.tensor for p in pairs if not p.activation.is_leaf)
    location, observed = locate_faithfully(
        pairs, boundaries, observe, reproduces=lambda v: v["output"][0] == 1.0,
        measure=lambda pair, value: compare_tensors(value, pair.reference(), TOL))
    return location, observed, runs


def test_finds_the_first_bad_tensor_in_logarithmic_runs():
    location, observed, runs = _locate(40, first_bad=23, fused=set())
    assert location.first_bad == "t23" and location.last_good == "t22"
    assert location.boundaries_faithful and not location.unobservable
    assert location.runs == len(runs) <= 1 + 6, "boundaries first, then a bisection between two of them"
    assert all(observed[t].ok == (int(t[1:]) < 23) for t in observed)


def test_exposures_that_change_the_outputs_are_not_trusted():
    location, observed, _ = _locate(40, first_bad=23, fused={22})
    assert "t22" in location.unobservable and "t22" not in observed
    assert location.first_bad == "t23" and location.last_good == "t21"


def test_boundaries_inside_a_fusion_fall_back_to_single_tensors():
    location, _, runs = _locate(16, first_bad=5, fused={4})
    assert not location.boundaries_faithful, "t4 is a boundary and breaks the fusion: that first run is discarded"
    assert location.first_bad == "t5"
    assert all(len(r) == 1 for r in runs[1:]), "afterwards one tensor per run"


def test_no_faithful_divergence_returns_none():
    location, observed, _ = _locate(12, first_bad=99, fused=set())
    assert location is None and all(d.ok for d in observed.values())



def test_the_faithful_bisection_skips_tensors_no_input_reaches():
    """Where exposing tensors changes the outputs, the divergence is bisected over the graph order of the paired
    tensors; a tensor computed from weights alone (BiT's weight standardisation, kept as ops by the exporter)
    agrees wherever the fault is, and counted in the order it made a late weight look like the last agreeing
    tensor (BiT: the last convolution was blamed, 742 nodes, for ONNX Runtime's Pad+MaxPool fusion at the
    stem). Only tensors computed from the graph inputs are bisected."""
    from onnx import TensorProto, helper, numpy_helper

    from onnx_bisect.source.graph import index_graph

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("ReduceMean", ["w"], ["w_mean"], keepdims=1, axes=[1, 2, 3]),
             helper.make_node("Sub", ["w", "w_mean"], ["w_std"]),
             helper.make_node("Conv", ["x", "w_std"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    live = index_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).input_fed
    assert live == {"y", "z"}, live
