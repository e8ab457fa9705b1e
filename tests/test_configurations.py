"""Input cases and runtime settings: resizing along dynamic axes, datasets, edge cases, settings parsing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from onnx_bisect.pipeline import configurations as cf
from onnx_bisect.errors import InputError, UsageError
from onnx_bisect.source.load import read_input, to_model_inputs
from onnx_bisect.pipeline.bisect import loaded_from_module
from onnx_bisect.records import CaseKind, ModelInputs, RuntimeSettings
from onnx_bisect.pipeline.specs import AxisSpec, parse_config_entries, parse_provider, parse_sizes, parse_vary


class TwoInputs(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        return input_ids * attention_mask


def _bert_like(batch=1, seq=6) -> ModelInputs:
    ids = torch.arange(batch * seq).reshape(batch, seq) + 100
    return ModelInputs(args=(ids, torch.ones(batch, seq, dtype=torch.int64)), names=("input_ids", "attention_mask"))


def test_batch_resize_keeps_inputs_aligned_and_rows_distinct():
    inputs = _bert_like()
    grown = cf.resize(inputs, AxisSpec(axis=0, sizes=(4,)), 4)
    ids, mask = grown.args
    assert ids.shape == (4, 6) and mask.shape == (4, 6)
    assert torch.equal(ids[0], inputs.args[0][0]), "the first row is the sample itself"
    assert len({tuple(r.tolist()) for r in ids}) == 4, "added rows are rolled, so a batch-mixing fault cannot hide"
    assert sorted(ids[2].tolist()) == sorted(inputs.args[0][0].tolist()), "rows are resampled, not invented"
    shrunk = cf.resize(grown, AxisSpec(axis=0, sizes=(2,)), 2)
    assert torch.equal(shrunk.args[0], ids[:2])


def test_vary_picks_inputs_sharing_the_axis_and_cross_product():
    inputs = _bert_like(batch=2, seq=6)
    specs = [AxisSpec(axis=0, sizes=(1, 3), label="batch"), parse_vary("1=4,8")]
    cases = cf.shape_cases(inputs, specs)
    assert [c.label for c in cases] == ["batch=1 dim1=4", "batch=1 dim1=8", "batch=3 dim1=4", "batch=3 dim1=8"]
    last = cases[-1].inputs
    assert [tuple(t.shape) for t in last.args] == [(3, 8), (3, 8)]
    assert all(c.kind is CaseKind.SHAPE for c in cases)
    assert cf.dynamic_axes(inputs, specs) == {"input_ids": {0: "batch", 1: "dim1"},
                                               "attention_mask": {0: "batch", 1: "dim1"}}
    only_ids = parse_vary("input_ids:1=3")
    assert cf.axis_members(inputs, only_ids) == ["input_ids"]
    with pytest.raises(UsageError, match="no_such"):
        cf.axis_members(inputs, parse_vary("no_such:1=3"))


def test_export_example_avoids_size_one_specialisation():
    inputs = _bert_like(batch=1)
    example = cf.export_example(inputs, [AxisSpec(axis=0, sizes=(1, 8))])
    assert example.args[0].shape[0] == 2


def test_edge_cases_scale_floats_and_keep_token_ids_valid():
    x = torch.tensor([[-2.0, 0.5, 3.0]])
    cases, notes = cf.edge_cases(ModelInputs(args=(x,), names=("x",)))
    by = {c.label: c.inputs.args[0] for c in cases}
    assert set(by) == {"edge:zeros", "edge:large", "edge:tiny", "edge:min", "edge:max", "edge:extremes"} and not notes
    assert torch.equal(by["edge:large"], x * cf.LARGE_SCALE) and torch.equal(by["edge:tiny"], x * cf.TINY_SCALE)
    assert by["edge:min"].unique().tolist() == [-2.0] and by["edge:max"].unique().tolist() == [3.0]
    assert set(by["edge:extremes"].unique().tolist()) <= {-2.0, 3.0}
    ids_cases, ids_notes = cf.edge_cases(_bert_like())
    labels = {c.label for c in ids_cases}
    assert "edge:large" not in labels and ids_notes, "integer inputs are not scaled (ids must stay valid)"


def _dataset_model():
    return loaded_from_module(TwoInputs())


def test_dataset_from_npz_rows_and_stacks(tmp_path: Path):
    loaded = _dataset_model()
    ids = np.arange(5 * 4).reshape(5, 4)
    np.savez(tmp_path / "rows.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    cases = cf.dataset_cases(str(tmp_path / "rows.npz"), loaded, read_input, to_model_inputs)
    assert len(cases) == 5 and [c.sample for c in cases] == list(range(5))
    assert tuple(cases[3].inputs.kwargs["input_ids"].shape) == (1, 4)
    assert cases[3].inputs.kwargs["input_ids"].tolist() == [ids[3].tolist()]
    sample = _bert_like(batch=2, seq=4)
    stacked = np.arange(3 * 2 * 4).reshape(3, 2, 4)
    np.savez(tmp_path / "stack.npz", input_ids=stacked, attention_mask=np.ones_like(stacked))
    cases = cf.dataset_cases(str(tmp_path / "stack.npz"), loaded, read_input, to_model_inputs, sample)
    assert tuple(cases[1].inputs.kwargs["input_ids"].shape) == (2, 4), "one more axis than the sample: x[i]"


def test_dataset_from_directory_and_errors(tmp_path: Path):
    loaded = _dataset_model()
    folder = tmp_path / "samples"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"s{i}.npz", input_ids=np.full((1, 4), i), attention_mask=np.ones((1, 4), np.int64))
    (folder / "README.txt").write_text("not a sample")
    cases = cf.dataset_cases(str(folder), loaded, read_input, to_model_inputs)
    assert [c.label for c in cases] == ["sample 0 (s0.npz)", "sample 1 (s1.npz)", "sample 2 (s2.npz)"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no"):
        cf.dataset_cases(str(empty), loaded, read_input, to_model_inputs)
    np.savez(tmp_path / "ragged.npz", input_ids=np.zeros((3, 4)), attention_mask=np.zeros((2, 4)))
    with pytest.raises(InputError, match="same number"):
        cf.dataset_cases(str(tmp_path / "ragged.npz"), loaded, read_input, to_model_inputs)


def test_runtime_settings_cross_providers_levels_and_variants():
    settings = cf.runtime_settings(["CPUExecutionProvider", "CUDAExecutionProvider:device_id=1"], ["all", "basic"],
                                   (("session.intra_op.allow_spinning", "0"),),
                                   [(("optimization.enable_gelu_approximation", "1"),)])
    assert len(settings) == 8
    assert settings[0] == RuntimeSettings("CPUExecutionProvider", (), "all", (("session.intra_op.allow_spinning", "0"),))
    assert settings[1].label == "CPU/all+session.intra_op.allow_spinning=0+optimization.enable_gelu_approximation=1"
    assert settings[4].provider_options == (("device_id", "1"),) and settings[4].label.startswith("CUDA(device_id=1)/all")


def test_option_parsing_errors_name_the_option():
    assert parse_sizes("1, 8,8,64", "--batch-sizes") == (1, 8, 64)
    with pytest.raises(UsageError, match="--batch-sizes"):
        parse_sizes("1,x", "--batch-sizes")
    with pytest.raises(UsageError, match="--batch-sizes"):
        parse_sizes("0", "--batch-sizes")
    with pytest.raises(UsageError, match="--vary"):
        parse_vary("seq=32")
    assert parse_vary("input_ids,attention_mask:1=32,128") == AxisSpec(1, (32, 128), ("input_ids", "attention_mask"))
    assert parse_provider("CUDAExecutionProvider:device_id=0,gpu_mem_limit=1") == (
        "CUDAExecutionProvider", (("device_id", "0"), ("gpu_mem_limit", "1")))
    with pytest.raises(UsageError):
        parse_provider("CUDAExecutionProvider:device_id")
    assert parse_config_entries(["a=1,b=2", "c=x=y"], "--ort-config") == (("a", "1"), ("b", "2"), ("c", "x=y"))
    with pytest.raises(UsageError, match="--ort-variant"):
        parse_config_entries(["novalue"], "--ort-variant")
