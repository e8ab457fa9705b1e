"""Load stage: which model a file provides, and how input files become forward arguments."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import MLP_SOURCE, write_source
from onnx_bisect.errors import InputError, ModelLoadError
from onnx_bisect.source.load import load_inputs, load_model

TWO_ARGUMENT_SOURCE = """
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        def forward(self, input_ids, attention_mask=None):
            return self.emb(input_ids)
"""


def test_get_model_is_preferred_to_classes(tmp_path):
    loaded, _ = load_model(str(write_source(tmp_path / "m.py", MLP_SOURCE)))
    assert loaded.name == "m.py:get_model"
    assert type(loaded.module).__name__ == "TinyMLP"
    assert loaded.forward_params == ("x",)
    assert loaded.was_training is False  # get_model() returned it in eval mode


def test_module_level_model(tmp_path):
    path = write_source(tmp_path / "m.py", """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
    """)
    loaded, _ = load_model(str(path))
    assert loaded.name == "m.py:model"
    assert isinstance(loaded.module, torch.nn.Sequential)


def test_exactly_one_class_is_instantiated_and_imported_classes_do_not_count(tmp_path):
    path = write_source(tmp_path / "m.py", """
        import torch
        from torch.nn import Linear, ReLU

        class Only(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = Linear(2, 2)

            def forward(self, x):
                return self.fc(x)
    """)
    loaded, _ = load_model(str(path))
    assert loaded.name == "m.py:Only"
    assert type(loaded.module).__name__ == "Only"


def test_training_mode_model_is_reported(tmp_path):
    loaded, _ = load_model(str(write_source(tmp_path / "m.py", TWO_ARGUMENT_SOURCE)))
    assert loaded.was_training is True  # a freshly built nn.Module is in training mode


def test_file_colon_name_picks_one_of_several_classes(tmp_path):
    path = write_source(tmp_path / "m.py", """
        import torch

        class Encoder(torch.nn.Module):
            def forward(self, x):
                return x + 1

        class Decoder(torch.nn.Module):
            def forward(self, x):
                return x * 2
    """)
    with pytest.raises(ModelLoadError, match="several nn.Module classes"):
        load_model(str(path))
    loaded, _ = load_model(f"{path}:Decoder")
    assert loaded.name == "m.py:Decoder"
    assert type(loaded.module).__name__ == "Decoder"
    with pytest.raises(ModelLoadError, match="Candidates found in the file: Decoder, Encoder"):
        load_model(f"{path}:Nope")


def test_script_code_at_import_becomes_a_model_load_error(tmp_path):
    path = write_source(tmp_path / "m.py", "import sys\nsys.exit(3)\n")
    with pytest.raises(ModelLoadError, match="sys.exit"):
        load_model(str(path))


def test_get_inputs(tmp_path):
    loaded, module = load_model(str(write_source(tmp_path / "m.py", MLP_SOURCE)))
    inputs = load_inputs([], loaded, module)
    assert inputs.names == ("x",)
    assert len(inputs.args) == 1 and inputs.args[0].shape == (2, 4)
    assert inputs.kwargs == {}


def test_npy_int64_ids(tmp_path):
    loaded, module = load_model(str(write_source(tmp_path / "m.py", TWO_ARGUMENT_SOURCE)))
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3]], dtype=np.int64))
    inputs = load_inputs([str(tmp_path / "ids.npy")], loaded, module)
    assert inputs.names == ("input_ids",)
    (ids,) = inputs.args
    assert ids.dtype == torch.int64
    assert ids.tolist() == [[1, 2, 3]]


def test_npz_is_matched_by_forward_parameter_names(tmp_path):
    loaded, module = load_model(str(write_source(tmp_path / "m.py", TWO_ARGUMENT_SOURCE)))
    ids, mask = np.array([[4, 5]], dtype=np.int64), np.array([[1, 0]], dtype=np.int64)
    np.savez(tmp_path / "in.npz", attention_mask=mask, input_ids=ids)  # not in forward order
    inputs = load_inputs([str(tmp_path / "in.npz")], loaded, module)
    assert inputs.args == ()
    assert set(inputs.kwargs) == {"input_ids", "attention_mask"}
    assert inputs.kwargs["input_ids"].tolist() == [[4, 5]]
    assert inputs.kwargs["attention_mask"].tolist() == [[1, 0]]

    np.savez(tmp_path / "bad.npz", ids=ids)
    with pytest.raises(InputError, match=r"\['ids'\] match none"):
        load_inputs([str(tmp_path / "bad.npz")], loaded, module)


@pytest.mark.parametrize("saved, expect_args, expect_kwargs", [
    (torch.tensor([[1, 2]]), [[[1, 2]]], {}),
    ((torch.tensor([[1, 2]]), torch.tensor([[1, 1]])), [[[1, 2]], [[1, 1]]], {}),
    ({"input_ids": torch.tensor([[3]]), "attention_mask": torch.tensor([[1]])}, [],
     {"input_ids": [[3]], "attention_mask": [[1]]}),
], ids=["tensor", "tuple", "dict"])
def test_pt_tensor_tuple_and_dict(tmp_path, saved, expect_args, expect_kwargs):
    loaded, module = load_model(str(write_source(tmp_path / "m.py", TWO_ARGUMENT_SOURCE)))
    torch.save(saved, tmp_path / "in.pt")
    inputs = load_inputs([str(tmp_path / "in.pt")], loaded, module)
    assert [a.tolist() for a in inputs.args] == expect_args
    assert {k: v.tolist() for k, v in inputs.kwargs.items()} == expect_kwargs
    assert inputs.names == ("input_ids", "attention_mask")[: len(expect_args)]


def test_missing_required_argument_is_an_input_error(tmp_path):
    loaded, module = load_model(str(write_source(tmp_path / "m.py", TWO_ARGUMENT_SOURCE)))
    torch.save({"attention_mask": torch.tensor([[1]])}, tmp_path / "mask.pt")
    with pytest.raises(InputError, match="no value was given for input_ids"):
        load_inputs([str(tmp_path / "mask.pt")], loaded, module)
