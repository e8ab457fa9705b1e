"""Capture stage: forward hooks record every module call, in order, as it happened."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from onnx_bisect.capture.modules import capture_activations
from onnx_bisect.records import ModelInputs


def _inputs(*args: torch.Tensor) -> ModelInputs:
    return ModelInputs(args=args, names=tuple(f"x{i}" for i in range(len(args))))


def _by_module(capture, module: str):
    return [a for a in capture.activations if a.module == module]


def _hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


class _Twice(torch.nn.Module):
    """One Linear applied twice: two calls of the same module."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(torch.tanh(self.fc(x)))


def test_hooks_are_removed_even_when_forward_raises():
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            self.fc(x)
            raise RuntimeError("boom")

    model = Broken()
    with pytest.raises(RuntimeError, match="boom"):
        capture_activations(model, _inputs(torch.randn(1, 3)))
    assert _hook_count(model) == 0

    ok = _Twice()
    capture_activations(ok, _inputs(torch.randn(1, 3)))
    assert _hook_count(ok) == 0


def test_a_module_called_twice_is_recorded_per_call_in_order():
    torch.manual_seed(0)
    model, x = _Twice(), torch.randn(2, 3)
    capture = capture_activations(model, _inputs(x))
    calls = _by_module(capture, "fc")
    assert [a.call for a in calls] == [0, 1]
    assert calls[0].index < calls[1].index
    assert [a.name for a in calls] == ["fc", "fc#2"]
    with torch.no_grad():
        first = model.fc(x)
        second = model.fc(torch.tanh(first))
    np.testing.assert_allclose(calls[0].value, first.numpy(), rtol=1e-6)
    np.testing.assert_allclose(calls[1].value, second.numpy(), rtol=1e-6)


def test_tuple_and_dict_outputs_get_stable_paths():
    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = _Pair()

        def forward(self, x):
            a, b = self.pair(x)
            return {"logits": a, "hidden": b}

    class _Pair(torch.nn.Module):
        def forward(self, x):
            return x + 1, x * 2

    capture = capture_activations(Heads(), _inputs(torch.ones(1, 2)))
    assert [a.path for a in _by_module(capture, "pair")] == ["[0]", "[1]"]
    assert [a.path for a in _by_module(capture, "")] == ["[logits]", "[hidden]"]
    assert capture.output_names == ("[logits]", "[hidden]")
    np.testing.assert_array_equal(capture.outputs[0], np.full((1, 2), 2.0, np.float32))
    np.testing.assert_array_equal(capture.outputs[1], np.full((1, 2), 2.0, np.float32))


def test_in_place_ops_after_a_module_do_not_change_its_recorded_value():
    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)
            self.act = torch.nn.ReLU(inplace=True)
            self.head = torch.nn.Linear(3, 3)

        def forward(self, x):
            y = self.head(self.act(self.fc(x)))
            y.add_(100)
            return y

    torch.manual_seed(0)
    model, x = InPlace(), torch.randn(4, 3)
    capture = capture_activations(model, _inputs(x))
    with torch.no_grad():
        fc = model.fc(x)
    (fc_act,) = _by_module(capture, "fc")
    (relu,) = _by_module(capture, "act")
    (head,) = _by_module(capture, "head")
    assert (fc_act.value < 0).any()  # recorded before ReLU(inplace=True) clamped it
    np.testing.assert_allclose(fc_act.value, fc.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(relu.value, np.maximum(fc_act.value, 0))
    assert not relu.passthrough  # an in-place ReLU changes its input; it is not an identity
    assert head.value.max() < 50  # recorded before add_(100)
    np.testing.assert_allclose(capture.outputs[0], head.value + 100, rtol=1e-6)


def test_a_forward_that_modifies_its_input_leaves_the_callers_tensor_alone():
    class Scales(torch.nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x

    x = torch.ones(2)
    capture = capture_activations(Scales(), _inputs(x))
    assert x.tolist() == [1.0, 1.0]  # the ONNX feeds are made from this tensor later
    np.testing.assert_array_equal(capture.outputs[0], [2.0, 2.0])


def test_dropout_in_eval_is_a_passthrough():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5), torch.nn.GELU())
    model.train()
    capture = capture_activations(model, _inputs(torch.randn(2, 3)))
    linear, dropout, gelu = (_by_module(capture, str(i))[0] for i in range(3))
    assert dropout.module_type == "Dropout" and dropout.passthrough
    assert dropout.inputs == (linear.index,)
    np.testing.assert_array_equal(dropout.value, linear.value)
    assert not linear.passthrough and not gelu.passthrough


class _Tagger(torch.nn.Module):
    """Uses the LSTM's sequence output and discards its final states; the GRU's final state is used."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 6, num_layers=2, batch_first=True)
        self.gru = torch.nn.GRU(6, 5, batch_first=True)

    def forward(self, x):
        y, _ = self.lstm(x)
        _, h = self.gru(y)
        return h.squeeze(0) * 2


def test_unused_outputs_are_the_ones_the_model_outputs_do_not_depend_on():
    from onnx_bisect.capture.modules import unused_outputs
    from onnx_bisect.records import ModelInputs

    torch.manual_seed(0)
    model = _Tagger().eval()
    inputs = ModelInputs(args=(torch.randn(2, 3, 4),), kwargs={}, names=("x",))
    wanted = frozenset({("lstm", 0, "[0]"), ("lstm", 0, "[1][0]"), ("lstm", 0, "[1][1]"),
                        ("gru", 0, "[0]"), ("gru", 0, "[1]")})
    assert unused_outputs(model, inputs, wanted) == {("lstm", 0, "[1][0]"), ("lstm", 0, "[1][1]"), ("gru", 0, "[0]")}
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())  # nothing was back-propagated
