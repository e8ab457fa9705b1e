"""Two layers' weights exchanged in a file whose every node and tensor was renamed: no name or scope tells which
layer a MatMul computes, and the exchanged weight itself points at the other layer.  The first faulty node must
still be found, owned by the layer whose input it reads (PyTorch's data flow from the segment's inputs), and the
weight named as the other layer's."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from fault_sweep import rename  # noqa: E402


class _Block(torch.nn.Module):
    """A LayerNorm, three projections of one input (query, key, value) mixed without a softmax, an output one."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x, memory=None):
        h = self.norm(x)
        kv = h if memory is None else memory  # a decoder's keys and values: the encoder's output
        return x + self.o(torch.tanh(self.q(h)) * self.k(kv) + self.v(kv))


class _TwoStacks(torch.nn.Module):
    """An encoder block on one input, a decoder block on the other reading the encoder's output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(71)
        self.encoder, self.decoder = _Block(), _Block()
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x, y):
        return self.head(self.decoder(y, self.encoder(x)))


def _weight_of(proto: onnx.ModelProto, model: torch.nn.Module, parameter: str) -> str:
    """The initializer holding ``parameter`` (any layout), by value."""
    want = dict(model.named_parameters())[parameter].detach().numpy()
    for init in proto.graph.initializer:
        value = numpy_helper.to_array(init)
        if value.shape == want.shape[::-1] and np.array_equal(value, want.T) or np.array_equal(value, want):
            return init.name
    raise AssertionError(parameter)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_weights_exchanged_between_far_layers_of_a_renamed_file_are_found(exporter, tmp_path):
    model = _TwoStacks().eval()
    g = torch.Generator().manual_seed(72)
    inputs = (torch.randn(1, 5, 8, generator=g), torch.randn(1, 5, 8, generator=g))
    _exchanged_and_found(model, inputs, dc.export(model, inputs, exporter), tmp_path, "encoder.v.weight",
                         "decoder.k.weight")


def _exchanged_and_found(model, inputs, proto: onnx.ModelProto, tmp_path, first: str, second: str):
    """The file renamed, the weights of parameters ``first`` and ``second`` exchanged, onnx-bisect run: the first
    divergence, asserted at the node reading ``first``'s initializer, the other parameter named."""
    onnx.save(proto, tmp_path / "clean.onnx")
    rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
    proto = onnx.load(tmp_path / "renamed.onnx")
    a, b = _weight_of(proto, model, first), _weight_of(proto, model, second)
    _exchange(proto, a, b)
    reader = next(n.name for n in proto.graph.node if a in n.input)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert reader in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    assert second in fd.explanation, fd.explanation
    return fd


def _exchange(proto: onnx.ModelProto, a: str, b: str) -> None:
    """The numbers of initializers ``a`` and ``b`` exchanged (in place), their names kept."""
    inits = {i.name: i for i in proto.graph.initializer}
    data_a, data_b = onnx.TensorProto(), onnx.TensorProto()
    data_a.CopyFrom(inits[a])
    data_b.CopyFrom(inits[b])
    inits[a].CopyFrom(data_b)
    inits[a].name = a
    inits[b].CopyFrom(data_a)
    inits[b].name = b


def test_an_encoder_weight_exchanged_with_a_decoder_one_is_owned_by_the_encoder_layer(tmp_path):
    """Pegasus (the fault sweep's tiny config, renamed dynamo file): the encoder's value projection computes with
    the decoder's key projection weight and the reverse.  Both faults lie in one diverging segment; the first
    is named at the encoder's projection — the layer whose input (the encoder's LayerNorm output, PyTorch's value
    fed at the segment's input) the node reads — not at the decoder layer its weight belongs to."""
    import sweep_models

    model, inputs = sweep_models.build("pegasus")
    fd = _exchanged_and_found(model, inputs, dc.export(model, inputs, "dynamo"), tmp_path,
                              "model.encoder.layers.0.self_attn.v_proj.weight",
                              "model.decoder.layers.0.self_attn.k_proj.weight")
    assert fd.layer.pair.activation.module == "model.encoder.layers.0.self_attn.v_proj", fd.layer.pair.activation
