"""Bad input of every kind ends in exit status 2 and one actionable line, never a traceback."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from conftest import make_tiny_model_dir, run_cli, run_cli_in_process, tiny_onnx, write_source

EMBEDDING_SOURCE = """
    import torch

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        def forward(self, input_ids):
            return self.emb(input_ids)
"""

TWO_CLASSES_SOURCE = """
    import torch

    class Encoder(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class Decoder(torch.nn.Module):
        def forward(self, x):
            return x * 2
"""

# torch.linalg.svdvals has no ONNX lowering in either exporter (torch 2.13):
# dynamo finds no ONNX function for aten._linalg_svd, TorchScript has no symbolic.
UNEXPORTABLE_SOURCE = """
    import torch

    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.svdvals(x)

    def get_inputs():
        return (torch.randn(3, 3),)
"""


def _duplicated_attribute_onnx(d: Path) -> Path:
    node = helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky", alpha=0.1)
    node.attribute.append(helper.make_attribute("alpha", 0.2))
    onnx.save(tiny_onnx(node), d / "dup.onnx")
    return d / "dup.onnx"


def _npy(d: Path, name: str, array: np.ndarray) -> Path:
    np.save(d / name, array)
    return d / name


def _savez(d: Path, name: str, **arrays) -> Path:
    np.savez(d / name, **arrays)
    return d / name


def _file(d: Path, name: str, data: bytes) -> Path:
    (d / name).write_bytes(data)
    return d / name


def _external(d: Path, location: str, offset: int | None = None, length: int | None = None,
              target: Path | None = None) -> Path:
    """``model/ext.onnx`` (Gemm + Relu on x[2,4]) whose weight is external data at ``location``; a canary file
    with plausible weight bytes sits beside the model's folder (``target``: make ``location`` a symbolic link to
    it)."""
    folder = d / "model"
    folder.mkdir(exist_ok=True)
    w = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    (d / "canary.bin").write_bytes(w.tobytes() * 4)
    (folder / "weights.bin").write_bytes(w.tobytes())
    if target is not None:
        os.symlink(target, folder / location)
    init = numpy_helper.from_array(w, "W")
    init.ClearField("raw_data")
    init.data_location = onnx.TensorProto.EXTERNAL
    init.external_data.add(key="location", value=location)
    for key, value in (("offset", offset), ("length", length)):
        if value is not None:
            init.external_data.add(key=key, value=str(value))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W"], ["g"], transB=1, name="gemm"), helper.make_node("Relu", ["g"], ["y"])],
        "ext", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "ext.onnx")
    return folder / "ext.onnx"


def _dims_beyond_data(d: Path) -> Path:
    model = tiny_onnx(helper.make_node("Add", ["x", "b"], ["y"]))
    bias = numpy_helper.from_array(np.ones((2, 4), np.float32), "b")
    bias.dims[0] = 10 ** 12  # claims 4e12 elements, holds 8
    model.graph.initializer.append(bias)
    onnx.save(model, d / "dims.onnx")
    return d / "dims.onnx"


def _absurd_intermediate(d: Path) -> Path:
    shape = numpy_helper.from_array(np.array([10 ** 6, 10 ** 6], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                              value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0), helper.make_node("Add", ["x", "total"], ["y"])]
    model = tiny_onnx(nodes[-1])
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    model.graph.initializer.append(shape)
    onnx.save(model, d / "absurd.onnx")
    return d / "absurd.onnx"


def _npy_claiming(d: Path, shape: tuple[int, ...]) -> Path:
    """An .npy whose header declares ``shape`` (float32) over 16 bytes of data."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (shape,)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return _file(d, "claims.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
                 + b"\0" * 16)


def _loop(d: Path, trip: int | None) -> Path:
    """y = Loop(x): no trip count and a condition the body passes through from a true start (``trip`` None),
    else a constant trip count of ``trip``."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["v_in"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", onnx.TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", onnx.TensorProto.FLOAT, [2, 4])])
    model = tiny_onnx(helper.make_node("Loop", ["" if trip is None else "trip", "go", "x"], ["y"], name="spin",
                                       body=body))
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "go"))
    if trip is not None:
        model.graph.initializer.append(numpy_helper.from_array(np.array(trip, np.int64), "trip"))
    onnx.save(model, d / "loop.onnx")
    return d / "loop.onnx"


def _npz_bomb(d: Path) -> Path:
    """An .npz whose member says it decompresses to 2 GiB from a few hundred bytes (the sizes in the zip's
    headers are what a bomb declares; nothing that large is written)."""
    import struct
    import zipfile

    target = d / "bomb.npz"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (268435456,), }"
        header += " " * (63 - (10 + len(header)) % 64) + "\n"
        archive.writestr("x.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
                         + b"\0" * 4096)
    data = bytearray(target.read_bytes())
    claimed = struct.pack("<I", 2 ** 31)
    local = data.find(b"PK\x03\x04")
    data[local + 22:local + 26] = claimed  # local file header: uncompressed size
    central = data.find(b"PK\x01\x02")
    data[central + 24:central + 28] = claimed  # central directory: uncompressed size
    target.write_bytes(bytes(data))
    return target


def _pt(d: Path, name: str, make) -> Path:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated, which is not this test's business
        torch.save(make(torch), d / name)
    return d / name


def _unknown_input_type(d: Path) -> Path:
    model = tiny_onnx()
    model.graph.input[0].type.tensor_type.elem_type = 99
    onnx.save(model, d / "odd.onnx")
    return d / "odd.onnx"


def _softmax_axis_99(d: Path) -> Path:
    """A file ONNX Runtime refuses to load (Softmax axis out of range) though the protobuf is well formed."""
    model = tiny_onnx(helper.make_node("Softmax", ["x"], ["y"], name="soft", axis=99))
    model.ir_version = 10  # one ONNX Runtime reads: only the axis is wrong
    onnx.save(model, d / "soft99.onnx")
    return d / "soft99.onnx"


def _relu_runnable(d: Path) -> Path:
    model = tiny_onnx()
    model.ir_version = 10
    onnx.save(model, d / "relu10.onnx")
    return d / "relu10.onnx"


# case id: (argv builder given a tiny_model_dir folder, phrases the error line must contain)
CASES = {
    "missing-model-file": (lambda d: [d / "nope.py"], ("nope.py' does not exist", "get_model()")),
    "model-syntax-error": (lambda d: [write_source(d / "bad.py", "def forward(:\n")], "SyntaxError"),
    "model-import-raises": (
        lambda d: [write_source(d / "bad.py", "raise RuntimeError('no GPU here')\n")], "no GPU here"),
    "model-file-defines-no-model": (lambda d: [write_source(d / "empty.py", "x = 1\n")], "defines no model"),
    "several-classes-no-get-model": (
        lambda d: [write_source(d / "two.py", TWO_CLASSES_SOURCE)], "several nn.Module classes"),
    "name-missing": (lambda d: [f"{d / 'mlp.py'}:Nope"], "has no attribute 'Nope'"),
    "get-model-raises": (
        lambda d: [write_source(d / "gm.py", "def get_model():\n    raise ValueError('checkpoint missing')\n")],
        ("checkpoint missing", "Fix get_model()")),
    "missing-input-file": (lambda d: [d / "mlp.py", "--input", d / "nope.npy"], "Check the --input path"),
    "corrupt-npy": (
        lambda d: [d / "mlp.py", "--input", _file(d, "bad.npy", b"\x93NUMPY garbage")], "Could not read input file"),
    "too-many-inputs": (
        lambda d: [d / "mlp.py", "--input", d / "x.npy", "--input", d / "x.npy"], "2 inputs given but forward() takes 1"),
    "wrong-shape": (
        lambda d: [d / "mlp.py", "--input", _npy(d, "x5.npy", np.zeros((2, 5), np.float32))],
        ("Running the PyTorch model on the given inputs failed", "x: torch.float32[2, 5]")),
    "wrong-dtype": (
        lambda d: [write_source(d / "emb.py", EMBEDDING_SOURCE), "--input",
                   _npy(d, "ids.npy", np.array([[1.0, 2.0]], np.float32))],
        ("Running the PyTorch model on the given inputs failed", "'indices'", "input_ids: torch.float32")),
    "npz-keys-match-no-parameter": (
        lambda d: [d / "mlp.py", "--input", _savez(d, "in.npz", tokens=np.zeros((2, 4), np.float32))],
        ("['tokens'] match none", "numpy.savez(path, x=...)")),
    "no-input-no-get-inputs": (lambda d: [write_source(d / "emb.py", EMBEDDING_SOURCE)], "no get_inputs()"),
    "onnx-missing": (lambda d: [d / "mlp.py", "--onnx", d / "nope.onnx"], "Check the --onnx path"),
    "onnx-garbage": (
        lambda d: [d / "mlp.py", "--onnx", _file(d, "junk.onnx", b"\xff\xfenot a protobuf\x00" * 8)],
        "is not a loadable ONNX model"),
    "onnx-fails-checker": (
        lambda d: [d / "mlp.py", "--onnx", _duplicated_attribute_onnx(d)],
        ("does not pass onnx.checker", "Attribute 'alpha' appeared multiple times")),
    "onnx-input-shape-mismatch": (
        lambda d: [d / "mlp.py", "--onnx", d / "relu.onnx", "--input", _npy(d, "x3.npy", np.zeros((3, 4), np.float32))],
        "has shape [3, 4] but the ONNX input 'x' expects [2, 4]"),
    "export-fails-both-exporters": (
        lambda d: [write_source(d / "svd.py", UNEXPORTABLE_SOURCE)],
        ("Exporting the model to ONNX failed", "dynamo: DispatchError", "torchscript: UnsupportedOperatorError",
         "linalg_svd")),
    "unknown-provider": (lambda d: [d / "mlp.py", "--provider", "NopeExecutionProvider"],
        ("Unknown execution provider 'NopeExecutionProvider'", "CPUExecutionProvider")),
    "negative-atol": (lambda d: [d / "mlp.py", "--atol", "-1"], "must be non-negative (got --atol -1"),
    "json-is-the-model-file": (lambda d: [d / "mlp.py", "--json", d / "mlp.py"], "Refusing to overwrite"),
    "json-is-a-directory": (lambda d: [d / "mlp.py", "--json", d], "is a directory"),
    "low-memory-with-a-matrix": (lambda d: [d / "mlp.py", "--low-memory", "--batch-sizes", "1,2"],
                                 "--low-memory and --window-mb apply to a single bisection"),
    # untrusted files: refused before anything is read or allocated
    "external-data-climbs-out": (
        lambda d: [d / "mlp.py", "--onnx", _external(d, "../canary.bin")], ("'../canary.bin'", "climbs out")),
    "external-data-absolute-path": (
        lambda d: [d / "mlp.py", "--onnx", _external(d, str(d / "canary.bin"))], ("an absolute path",)),
    "external-data-symlink-out": (
        lambda d: [d / "mlp.py", "--onnx", _external(d, "w.bin", target=d / "canary.bin")],
        ("'w.bin'", "outside the model's folder", "symbolic link")),
    "external-data-beyond-file": (
        lambda d: [d / "mlp.py", "--onnx", _external(d, "weights.bin", offset=40)], "beyond the end of that file"),
    "external-data-wrong-length": (
        lambda d: [d / "mlp.py", "--onnx", _external(d, "weights.bin", length=4)], "with length 4, but its dims"),
    "coverage-external-data-climbs-out": (
        lambda d: ["coverage", _external(d, "../canary.bin")], ("'../canary.bin'", "climbs out")),
    "initializer-dims-beyond-data": (
        lambda d: [d / "mlp.py", "--onnx", _dims_beyond_data(d)], ("does not pass onnx.checker", "bytes required")),
    "absurd-intermediate-size": (
        lambda d: [d / "mlp.py", "--onnx", _absurd_intermediate(d)],
        ("computes tensor 'big' of shape [1000000, 1000000]", "of this machine's memory")),
    "loop-never-ends": (
        lambda d: [d / "mlp.py", "--onnx", _loop(d, None)], ("Loop 'spin' has no trip count", "never ends")),
    "loop-absurd-trip-count": (
        lambda d: [d / "mlp.py", "--onnx", _loop(d, 2 ** 62)], ("Loop 'spin' runs 4611686018427387904 times",)),
    "onnx-input-undefined-type": (
        lambda d: [d / "mlp.py", "--onnx", _unknown_input_type(d)], ("tensor 'x' has element type 99",)),
    "npz-decompression-bomb": (
        lambda d: [d / "mlp.py", "--input", _npz_bomb(d)], ("decompresses", "into 2147483648", "expand more than")),
    "pt-quantized-tensor": (
        lambda d: [d / "mlp.py", "--input",
                   _pt(d, "q.pt", lambda t: t.quantize_per_tensor(t.zeros(2, 4), 0.1, 0, t.qint8))],
        ("is a quantized tensor", "dequantize()")),
    "pt-holds-objects": (
        lambda d: [d / "mlp.py", "--input", _pt(d, "obj.pt", lambda t: {"x": __import__("argparse").Namespace()})],
        ("holds Python objects other than tensors", "weights_only")),
    "reference-candidate-does-not-run": (
        lambda d: [_softmax_axis_99(d), "--reference", _relu_runnable(d), "--input", d / "x.npy"],
        ("ONNX Runtime", "axis")),
    "reference-file-does-not-run": (
        lambda d: [_relu_runnable(d), "--reference", _softmax_axis_99(d), "--input", d / "x.npy"],
        ("The --reference model", "axis")),
    "empty-sample-for-batch-sizes": (
        lambda d: [d / "mlp.py", "--input", _npy(d, "empty.npy", np.zeros((0, 4), np.float32)), "--batch-sizes", "1,3"],
        ("is empty along axis 0", "at least one entry")),
    "npy-header-claims-more-than-file": (
        lambda d: [d / "mlp.py", "--input", _npy_claiming(d, (10 ** 6, 10 ** 6))],
        ("Could not read input file", "mmap length is greater than file size")),
}


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Each case's (result, files before, files after), every case in its own folder.

    The cases run the command line's ``main`` in this process (a subprocess each spent ~2 s importing torch);
    the first one runs as a real ``python -m onnx_bisect`` process, so the exit status and streams of the
    installed entry point are checked too.
    """
    def run_case(case_id, folder, runner):
        try:
            argv = CASES[case_id][0](folder)
            before = _snapshot(folder)
            result = runner(*argv)
            return _Done((result, before, _snapshot(folder)))
        except Exception as exc:  # noqa: BLE001 - one case's failure is that case's, raised by its test
            return _Done(error=exc)

    folders = {case_id: make_tiny_model_dir(tmp_path_factory.mktemp(case_id)) for case_id in CASES}
    return {case_id: run_case(case_id, folders[case_id], run_cli if i == 0 else run_cli_in_process)
            for i, case_id in enumerate(CASES)}


class _Done:
    """A finished outcome (or the exception that ended it), read as a future is."""

    def __init__(self, value=None, error: Exception | None = None):
        self.value, self.error = value, error

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


@pytest.mark.parametrize("case_id", CASES)
def test_bad_input_is_one_clear_error(outcomes, case_id):
    result, before, after = outcomes[case_id].result()
    assert result.exit_status == 2, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("onnx-bisect: error:")
    phrases = CASES[case_id][1]
    for phrase in (phrases,) if isinstance(phrases, str) else phrases:
        assert phrase in lines[0]
    # The user's files (model, inputs, ONNX) are read, never written; nothing new appears beside them.
    assert after == before


def test_json_pointing_at_the_model_leaves_it_intact(outcomes):
    result, before, after = outcomes["json-is-the-model-file"].result()
    assert result.exit_status == 2 and result.json is None
    assert after["mlp.py"] == before["mlp.py"]


def test_script_code_run_at_import_is_named(tmp_path):
    model = write_source(tmp_path / "train.py", """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, required=True)
        args = parser.parse_args()
    """)
    result = run_cli(model)
    assert result.exit_status == 2
    assert "Traceback" not in result.stderr
    # argparse prints its own usage first; our line comes last and names the fix.
    assert result.stderr.strip().splitlines()[-1].startswith("onnx-bisect: error: Importing")
    assert '__name__ == "__main__"' in result.stderr


def test_debug_reraises_with_traceback(tiny_model_dir):
    result = run_cli(tiny_model_dir / "nope.py", "--debug")
    assert result.exit_status == 1  # an uncaught exception
    assert "Traceback" in result.stderr
    assert "ModelLoadError" in result.stderr
