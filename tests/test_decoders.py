"""Decoder LLMs as they ship: key/value caches exported with the model, past key/values fed from ONNX-named
arrays, grouped-query attention, and nested arguments in general."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import onnx
import pytest
import torch

from conftest import plant_module, run_cli, write_source
from onnx_bisect.errors import InputError
from onnx_bisect.records.nest import canonical, flatten_outputs
from onnx_bisect.source.load import load_inputs, load_model

#: a Qwen2 decoder with grouped-query attention (4 query heads, 2 key/value heads), one decode step of 2 tokens
#: after 6 cached ones
DECODER_SOURCE = """
    import torch
    from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

    LAYERS, KV_HEADS, HEAD_DIM, PAST = 2, 2, 16, 6

    def get_model():
        torch.manual_seed(0)
        config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                             num_key_value_heads=KV_HEADS, vocab_size=100, max_position_embeddings=128)
        return Qwen2ForCausalLM(config).eval()

    def past(g):
        return DynamicCache(ddp_cache_data=[(torch.randn(1, KV_HEADS, PAST, HEAD_DIM, generator=g),
                                             torch.randn(1, KV_HEADS, PAST, HEAD_DIM, generator=g))
                                            for _ in range(LAYERS)])

    def get_inputs():
        g = torch.Generator().manual_seed(1)
        return {"input_ids": torch.randint(0, 100, (1, 2), generator=g),
                "attention_mask": torch.ones(1, PAST + 2, dtype=torch.long), "past_key_values": past(g)}
"""

OPTIMUM_INPUTS = ["input_ids", "attention_mask"] + [f"past_key_values.{i}.{kv}" for i in range(2)
                                                    for kv in ("key", "value")]
OPTIMUM_OUTPUTS = ["logits"] + [f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """The decoder's source, its inputs as an .npz named after the ONNX inputs, and the model exported in the
    layout of optimum's decoders (past_key_values.N.key in, present.N.key out) with external data, clean and
    with one weight of layer 1's MLP perturbed by 5 %."""
    folder = tmp_path_factory.mktemp("decoder")
    source = write_source(folder / "qwen.py", DECODER_SOURCE)
    loaded, module = load_model(str(source))
    inputs = module.get_inputs()
    with contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(loaded.module, (), kwargs=inputs, dynamo=True, input_names=OPTIMUM_INPUTS,
                                    output_names=OPTIMUM_OUTPUTS)
    clean = folder / "clean" / "decoder.onnx"
    clean.parent.mkdir()
    program.save(str(clean), external_data=True)
    feeds = {"input_ids": inputs["input_ids"].numpy(), "attention_mask": inputs["attention_mask"].numpy()}
    for i, layer in enumerate(inputs["past_key_values"].layers):
        feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = layer.keys.numpy(), layer.values.numpy()
    np.savez(folder / "feeds.npz", **feeds)
    plant = plant_module()
    proto = onnx.load(str(clean))
    node = plant.find_node(proto, "MatMul", "model.layers.1.mlp.down_proj")
    bad = folder / "bad" / "decoder.onnx"
    bad.parent.mkdir()
    onnx.save_model(plant.perturb_initializer(proto, plant.weight_of(proto, node.name), rel=0.05), str(bad),
                    save_as_external_data=True, location="decoder.onnx.data")
    return {"source": source, "npz": folder / "feeds.npz", "clean": clean, "bad": bad, "node": node.name,
            "folder": folder}


def test_past_key_values_from_onnx_named_arrays_become_the_models_cache(decoder):
    loaded, _ = load_model(str(decoder["source"]))
    inputs = load_inputs([str(decoder["npz"])], loaded)
    cache = inputs.kwargs["past_key_values"]
    assert type(cache).__name__ == "DynamicCache" and len(cache.layers) == 2
    assert tuple(cache.layers[1].values.shape) == (1, 2, 6, 16)  # grouped-query attention: 2 key/value heads
    flat = [path for path, _ in flatten_outputs(cache)]
    assert flat == ["[0][key]", "[0][value]", "[1][key]", "[1][value]"]
    assert {canonical("past_key_values" + p) for p in flat} == {canonical(n) for n in OPTIMUM_INPUTS[2:]}


def test_a_shipped_decoder_is_clean_and_a_planted_fault_is_pinned_inside_its_layer(decoder, tmp_path):
    clean = run_cli(decoder["source"], "--onnx", decoder["clean"], "--input", decoder["npz"], "--json",
                    tmp_path / "clean.json")
    assert clean.exit_status == 0, clean.stderr
    assert [o["name"] for o in clean.json["outputs"]] == OPTIMUM_OUTPUTS  # logits and every present key/value
    assert any("'past_key_values' (DynamicCache of 4 tensors) became ONNX inputs past_key_values.0.key" in n
               for n in clean.json["notes"])
    bad = run_cli(decoder["source"], "--onnx", decoder["bad"], "--input", decoder["npz"], "--json",
                  tmp_path / "bad.json")
    assert bad.exit_status == 1, bad.stderr
    fd = bad.json["first_divergence"]
    assert fd["module"] == "model.layers.1.mlp.down_proj" and decoder["node"] in fd["onnx_nodes"]
    assert fd["cause"] == "weight-mismatch" and fd["confirmed"] is True
    assert [o["ok"] for o in bad.json["outputs"]] == [False, True, True, True, True]  # layer 1's MLP comes last


def test_own_export_keeps_the_cache_as_inputs_and_outputs(decoder):
    import onnx_bisect

    loaded, module = load_model(str(decoder["source"]))
    report = onnx_bisect.bisect(loaded.module, module.get_inputs())
    assert report.ok and len(report.outputs) == 5
    assert any("returns a key/value cache (DynamicCache)" in n and "takes a key/value cache" in n
               for n in report.notes)
    assert any("became ONNX inputs past_key_values_0 ← past_key_values[0][key]" in n for n in report.notes)


def test_nested_arguments_of_any_shape(tmp_path):
    """A list of images (a detection model's input), from get_inputs() and from a .pt file."""
    source = write_source(tmp_path / "det.py", """
        import torch

        class Det(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.conv = torch.nn.Conv2d(3, 4, 3)

            def forward(self, images: list, scale: dict):
                return [self.conv(im.unsqueeze(0)).mean((2, 3)) * scale["gain"] for im in images]

        def get_inputs():
            return ([torch.randn(3, 16, 16), torch.randn(3, 12, 20)], {"gain": torch.tensor(2.0)})
    """)
    result = run_cli(source, "--json", tmp_path / "r.json")
    assert result.exit_status == 0, result.stderr
    assert "Argument 'images' (list of 2 tensors) became ONNX inputs images_0 ← images[0], images_1 ← images[1]." \
        in result.json["notes"]
    loaded, module = load_model(str(source))
    torch.save(tuple(module.get_inputs()), tmp_path / "args.pt")
    inputs = load_inputs([str(tmp_path / "args.pt")], loaded)
    assert [tuple(t.shape) for t in inputs.args[0]] == [(3, 16, 16), (3, 12, 20)]
    assert float(inputs.args[1]["gain"]) == 2.0


def test_bad_nested_inputs_are_one_line_errors(decoder, tmp_path):
    loaded, _ = load_model(str(decoder["source"]))
    arrays = dict(np.load(decoder["npz"]))
    del arrays["past_key_values.1.value"]
    np.savez(tmp_path / "partial.npz", **arrays)
    with pytest.raises(InputError, match="layer 1 need a 'key' and a 'value'"):
        load_inputs([str(tmp_path / "partial.npz")], loaded)
    result = run_cli(decoder["source"], "--input", tmp_path / "partial.npz")
    assert result.exit_status == 2 and result.stderr.startswith("onnx-bisect: error:")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(InputError, match="is a set; expected a tensor"):
        load_inputs([], loaded, type("M", (), {"get_inputs": staticmethod(lambda: ({torch.ones(1)},))}))
