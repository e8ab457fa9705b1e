"""One framework in memory at a time: the activation store on disk, the PyTorch weights memory-mapped from a
file before ONNX Runtime runs, and the low-memory run giving the same findings as the ordinary one."""
from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import onnx
import pytest
import torch

from conftest import plant_module, run_cli, write_source
from onnx_bisect.capture.modules import capture_activations
from onnx_bisect.pipeline import memory
from onnx_bisect.records import ModelInputs
from onnx_bisect.records.store import ArrayStore
from onnx_bisect.records.weights import file_region
from onnx_bisect.source.load import load_model

#: a LLaMA-style decoder (grouped-query attention, RMSNorm, SwiGLU), 2 layers
LLAMA_SOURCE = """
    import torch
    from transformers import LlamaConfig, LlamaModel

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.model = LlamaModel(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                use_cache=False))

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    def get_model():
        return Decoder().eval()

    def get_inputs():
        return (torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1)),)
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The decoder's source, its export with external data, and that file with one weight of layer 1's MLP
    perturbed by 5 %."""
    folder = tmp_path_factory.mktemp("llama")
    source = write_source(folder / "llama.py", LLAMA_SOURCE)
    loaded, module = load_model(str(source))
    with contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(loaded.module, module.get_inputs(), dynamo=True)
    plant = plant_module()
    proto = program.model_proto
    node = plant.find_node(proto, "MatMul", "model.layers.1.mlp.down_proj")
    bad = folder / "bad" / "llama.onnx"
    bad.parent.mkdir()
    onnx.save_model(plant.perturb_initializer(proto, plant.weight_of(proto, node.name), rel=0.05), str(bad),
                    save_as_external_data=True, location="llama.onnx.data", size_threshold=0)
    return {"source": source, "bad": bad, "node": node.name}


def _rows(report: dict) -> list[tuple]:
    return [(r["module"], r["onnx_tensor"], r["status"], r["max_abs"]) for r in report["layers"]]


def test_a_low_memory_run_finds_what_the_ordinary_run_finds_with_the_own_export(llama, tmp_path):
    ordinary = run_cli(llama["source"], "--json", tmp_path / "a.json")
    low = run_cli(llama["source"], "--low-memory", "--json", tmp_path / "b.json")
    assert ordinary.exit_status == low.exit_status == 0, low.stderr
    assert _rows(low.json) == _rows(ordinary.json) and len(_rows(low.json)) > 50
    assert any(n.startswith("Low-memory run (--low-memory)") for n in low.json["notes"])
    assert "offload" in low.json["timings"] and "offload" not in ordinary.json["timings"]
    assert set(low.json["peak_rss_mb"]) >= {"capture", "export", "offload", "final"}


def test_a_planted_weight_fault_is_pinned_in_a_low_memory_run(llama, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    os.environ["TMPDIR"], before = str(scratch), os.environ.get("TMPDIR")
    try:
        bad = run_cli(llama["source"], "--onnx", llama["bad"], "--low-memory", "--json", tmp_path / "bad.json")
    finally:
        os.environ.pop("TMPDIR") if before is None else os.environ.__setitem__("TMPDIR", before)
    assert bad.exit_status == 1, bad.stderr
    fd = bad.json["first_divergence"]
    assert fd["module"] == "model.layers.1.mlp.down_proj" and llama["node"] in fd["onnx_nodes"]
    assert fd["cause"] == "weight-mismatch" and fd["confirmed"] is True
    assert "offload" in bad.json["timings"], "a low-memory run (the store was made under TMPDIR)"
    assert not list(scratch.iterdir()), "the activation store and the offloaded weights are removed"


def test_the_store_hands_back_read_only_copies_across_chunks(tmp_path):
    store = ArrayStore(tmp_path, chunk_bytes=1 << 16)
    arrays = [np.arange(n, dtype=np.float32).reshape(-1, 2) for n in (2, 6000, 20000, 40000)] + \
        [np.array([True, False]), np.zeros((0, 3))]
    kept = [store.put(a) for a in arrays]
    for a, k in zip(arrays, kept):
        np.testing.assert_array_equal(k, a)
        assert k.dtype == a.dtype and not k.flags.writeable
    assert file_region(kept[2]) is not None and len(list(tmp_path.iterdir())) >= 2, "a new chunk when one is full"
    assert store.bytes_written == sum(a.nbytes for a in arrays)


class _Recycling(torch.nn.Module):
    """Modules whose outputs die at once (their ids come back on new tensors), and an in-place change."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(6))
        self.act = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        for fc in self.fc:
            x = self.act(fc(x)) + 0  # fc's output dies after the add
        x.mul_(3)
        return x


def test_a_capture_into_the_store_equals_the_capture_in_memory(tmp_path):
    torch.manual_seed(0)
    model, inputs = _Recycling().eval(), ModelInputs(args=(torch.randn(4, 8),), names=("x",))
    in_memory = capture_activations(model, inputs)
    stored = capture_activations(model, inputs, ArrayStore(tmp_path))
    assert [(a.module, a.call, a.inputs, a.passthrough) for a in stored.activations] == \
        [(a.module, a.call, a.inputs, a.passthrough) for a in in_memory.activations]
    for a, b in zip(stored.activations, in_memory.activations):
        np.testing.assert_array_equal(a.value, b.value)
        assert file_region(a.value) is not None
    np.testing.assert_array_equal(stored.outputs[0], in_memory.outputs[0])


def test_offloaded_weights_are_mapped_from_a_file_keep_their_ties_and_compute_the_same(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10), torch.nn.BatchNorm1d(12)).eval()
    model[1].weight = model[0].weight  # 10x8: tied, as a language model's head is to its embedding
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        before = model[1](model[0](ids))
    written = memory.offload_weights(model, tmp_path)
    assert written >= 10 * 8 * 4 and (tmp_path / memory.WEIGHTS_FILE).is_file()
    assert model[1].weight is model[0].weight, "a tie stays a tie"
    assert isinstance(model[1].weight, torch.nn.Parameter)
    assert file_region(model[1].bias.detach().numpy()) is not None
    assert file_region(model[2].running_mean.numpy()) is not None
    with torch.no_grad():
        np.testing.assert_array_equal(model[1](model[0](ids)), before)


def test_low_memory_is_automatic_when_the_weights_take_a_quarter_of_the_available_memory(monkeypatch):
    model = torch.nn.Linear(100, 100)  # 40,400 bytes
    monkeypatch.setattr(memory, "available_memory", lambda: 100_000)
    assert memory.wants_low_memory(model, None) and not memory.wants_low_memory(model, False)
    monkeypatch.setattr(memory, "available_memory", lambda: 1_000_000)
    assert not memory.wants_low_memory(model, None) and memory.wants_low_memory(model, True)


def _count_windows(monkeypatch) -> list[int]:
    """The number of windows of each windowed run from now on (filled as they run)."""
    from onnx_bisect.run import windows

    runs: list[int] = []
    real = windows.run_windowed

    def counting(backend, model, plan, *args, **kwargs):
        runs.append(len(plan))
        return real(backend, model, plan, *args, **kwargs)

    monkeypatch.setattr(windows, "run_windowed", counting)
    return runs


def test_windows_expose_the_same_values_as_one_run(llama, monkeypatch):
    import onnx_bisect

    runs = _count_windows(monkeypatch)
    loaded, module = load_model(str(llama["source"]))
    whole = onnx_bisect.bisect(loaded.module, module.get_inputs(), onnx=str(llama["bad"]))
    assert not runs
    windowed = onnx_bisect.bisect(loaded.module, module.get_inputs(), onnx=str(llama["bad"]), window_mb=0.01)
    assert len(runs) == 2 and min(runs) > 5, "the probe and the local run, each in several windows"
    assert [(r.pair.tensor, r.status, r.diff.max_abs if r.diff else None, r.local.max_abs if r.local else None) for r in windowed.layers] \
        == [(r.pair.tensor, r.status, r.diff.max_abs if r.diff else None, r.local.max_abs if r.local else None) for r in whole.layers]
    assert windowed.first_divergence.layer.pair.tensor == whole.first_divergence.layer.pair.tensor


def test_a_window_model_holds_only_its_nodes_and_the_weights_they_read():
    from onnx import TensorProto, helper

    from onnx_bisect.run.windows import plan_windows, window_model
    from onnx_bisect.source.graph import index_graph

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["c"]), helper.make_node("Neg", ["c"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w]))
    index = index_graph(model)
    plan = plan_windows(index, ["a", "b", "c", "y"], {t: 32 for t in "abcy"}, budget=64)
    assert [(p.start, p.stop, p.inputs, p.exposed) for p in plan] == \
        [(0, 2, ("x",), ("a", "b")), (2, 4, ("b", "x"), ("c", "y"))]
    assert plan[0].outputs == ("a", "b")  # b is exposed and carried on
    second = window_model(model, plan[1], {"b": np.zeros((2, 4), np.float32), "x": np.zeros((2, 4), np.float32)})
    assert [n.op_type for n in second.graph.node] == ["Add", "Neg"] and not second.graph.initializer
    assert len(model.graph.node) == 4, "the model is not modified"


def test_a_low_memory_run_keeps_its_activations_in_the_store(llama, monkeypatch):
    """``low_memory=True`` streams the captured activations into the on-disk store (not only the weights
    offloaded): the store receives the values, and the finding is the ordinary run's."""
    import onnx_bisect

    puts = []
    real = ArrayStore.put
    monkeypatch.setattr(ArrayStore, "put", lambda store, array: puts.append(array.nbytes) or real(store, array))
    loaded, module = load_model(str(llama["source"]))
    report = onnx_bisect.bisect(loaded.module, module.get_inputs(), onnx=str(llama["bad"]), low_memory=True)
    assert len(puts) > 10 and sum(puts) > 0
    fd = report.first_divergence
    assert fd is not None and fd.layer.pair.activation.module == "model.layers.1.mlp.down_proj"


def test_the_local_run_of_a_file_with_a_free_batch_dimension_is_windowed_too(monkeypatch):
    """The cut graph's own index keeps the file's free dimensions open; sized from it every tensor counted as
    nothing and the local run went into one window. Its windows are sized from the shapes the sample pins."""
    import onnx_bisect

    path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "onnx", "cnn.bn_eps.dynamo.onnx")
    free = [d.dim_param for i in onnx.load(path, load_external_data=False).graph.input
            for d in i.type.tensor_type.shape.dim if d.dim_param]
    assert free, "the fixture has a free dimension"
    runs = _count_windows(monkeypatch)
    loaded, module = load_model(os.path.join(os.path.dirname(__file__), "..", "fixtures", "models", "cnn.py"))
    report = onnx_bisect.bisect(loaded.module, module.get_inputs(), onnx=path, window_mb=0.005)
    assert len(runs) == 2 and min(runs) > 1, runs
    assert report.first_divergence is not None and report.first_divergence.cause.value == "batchnorm-fold"
