"""Fuzz onnx-bisect with mutated ONNX files and input files: "treat every ONNX file and input as untrusted".

Each case is a folder ``CASE/`` holding ``model/`` (model.py, the ONNX file, its external data, the input
files), a canary file *beside* that folder (``CASE/canary.txt``, unique content), ``tmp/`` (the run's
``TMPDIR``) and ``out/`` (the requested ``--json`` / ``--save-onnx`` outputs).  One mutation, chosen and
parametrised by a seeded RNG, is applied to a copy of a small real seed model (an MLP, a Conv-BN CNN, a model
with an ``If`` and one with a ``Loop``, exported by dynamo and by TorchScript, one with external data), then the
command line runs in a fresh process with a time limit, under ``strace`` (reads and writes) when it is
available, else under a Python audit hook.

Outcomes checked per case (the targets: all zero but the exits 0-3):

* exit status: 0/1/2/3 expected (130/143 only for SIGINT/SIGTERM, which the fuzzer never sends); anything
  else, death by a signal, or the time limit (a hang) is a failure;
* ``Traceback (most recent call last)`` on stderr or stdout;
* warnings leaking to stderr (``XWarning:`` lines from Python's ``warnings``, ONNX Runtime's ``[W:onnxruntime``
  log, torch's ``W1124 ...`` logging lines);
* a read of the canary, or of any file outside the model's folder that the mutation pointed at;
* stray writes: anything created, changed or deleted in the case folder other than the requested outputs,
  temp files left in ``TMPDIR``, and files written outside the case folder (a user's home, ...);
* peak RSS of the process tree above ``--mem-limit-mb`` (the run is killed at ``--mem-kill-mb``);
* exit 2 whose stderr is not a one-paragraph ``onnx-bisect: error:`` message (reported, not a target).

Usage::

    python scripts/fuzz_inputs.py --cases 2000 --seed 1 --jobs 2 --out /tmp/fuzz/results.json \\
        --keep-dir /tmp/fuzz/keep --keep-per-pattern 1 [--src /path/to/src] [--mutation NAME,...]
    python scripts/fuzz_inputs.py --seed 1 --case 17 --keep --keep-dir /tmp/fuzz/keep   # re-run one case, kept
    python scripts/fuzz_inputs.py --list                                          # the mutations

``--src`` is the directory put first on ``PYTHONPATH`` (default: this repository's ``src``).  The seed
models are built once into ``--seeds-dir`` (dynamo + TorchScript exports, a few seconds).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ALLOWED_EXITS = {0, 1, 2, 3}
CANARY_SIZE = 64 * 1024  # big enough that any seed initializer "fits" in it: a traversal then runs to the end

# ----------------------------------------------------------------------------------------------------------
# Seed models
# ----------------------------------------------------------------------------------------------------------

MLP_SOURCE = '''
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.fc2(self.act(self.fc1(x))).t(), dim=-1)


def get_model():
    torch.manual_seed(0)
    return MLP().eval()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 8),)
'''

CNN_SOURCE = '''
import torch
from torch import nn


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        h = self.up(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.fc(torch.flatten(self.pool(h), 1))


def get_model():
    torch.manual_seed(0)
    model = CNN()
    with torch.no_grad():
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 1.5)
    return model.eval()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 3, 8, 8),)
'''

COND_SOURCE = '''
import torch


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return torch.cond(h.sum() > 0, lambda t: torch.relu(t), lambda t: t * 0.5, (h,))


def get_model():
    torch.manual_seed(0)
    return Gate().eval()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 4),)
'''

LOOP_SOURCE = '''
import torch


class Repeat(torch.nn.Module):
    """Three steps of x <- 0.5 x + 1 (the ONNX file computes them with a Loop)."""

    def forward(self, x):
        for _ in range(3):
            x = x * 0.5 + 1.0
        return x


def get_model():
    return Repeat().eval()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 4),)
'''

SEED_SOURCES = {"mlp": MLP_SOURCE, "cnn": CNN_SOURCE, "cond": COND_SOURCE, "loop": LOOP_SOURCE}
INPUT_SHAPES = {"mlp": (2, 8), "cnn": (2, 3, 8, 8), "cond": (2, 4), "loop": (2, 4)}
# variant -> (seed model, ONNX file in the seeds folder, external data file or None)
VARIANTS = {
    "mlp.dynamo": ("mlp", "mlp.dynamo.onnx", None),
    "mlp.torchscript": ("mlp", "mlp.torchscript.onnx", None),
    "mlp.ext": ("mlp", "mlp.ext.onnx", "mlp.weights.bin"),
    "cnn.dynamo": ("cnn", "cnn.dynamo.onnx", None),
    "cnn.torchscript": ("cnn", "cnn.torchscript.onnx", None),
    "cnn.ext": ("cnn", "cnn.ext.onnx", "cnn.weights.bin"),
    "cond.dynamo": ("cond", "cond.dynamo.onnx", None),
    "loop.handmade": ("loop", "loop.handmade.onnx", None),
}
# the clean file a case's --reference mode compares with (never a file sharing the case's weights.bin)
CLEAN_TWIN = {"mlp.ext": "mlp.dynamo", "cnn.ext": "cnn.torchscript"}
PT_VARIANTS = ("list_str", "int", "none", "nested_dict", "bf16", "complex", "bool", "int8", "float64", "sparse",
               "qint8", "ndarray", "module", "state_dict", "empty", "meta", "strided_view", "requires_grad",
               "huge_size", "legacy_format", "dict_wrong_key", "tuple3")
SEEDS_VERSION = "3"


def build_seeds(dest: Path) -> None:
    """Write the seed models, their ONNX files and valid inputs into ``dest`` (runs in a child process)."""
    import contextlib
    import importlib.util
    import warnings
    from collections import OrderedDict

    import onnx
    import torch
    from onnx import TensorProto, helper

    warnings.simplefilter("ignore")
    dest.mkdir(parents=True, exist_ok=True)
    for name, source in SEED_SOURCES.items():
        (dest / f"{name}.py").write_text(source.lstrip())

    def module_of(name):
        spec = importlib.util.spec_from_file_location(f"fuzz_seed_{name}", dest / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # torch.export looks the module up
        spec.loader.exec_module(mod)
        return mod

    quiet = contextlib.redirect_stdout(io.StringIO())
    for name in ("mlp", "cnn", "cond"):
        mod = module_of(name)
        model, inputs = mod.get_model(), mod.get_inputs()
        with quiet:
            program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
        program.save(str(dest / f"{name}.dynamo.onnx"))
        if name != "cond":  # torch.cond has no TorchScript export
            with quiet:
                torch.onnx.export(model, inputs, str(dest / f"{name}.torchscript.onnx"), dynamo=False,
                                  input_names=["x"], output_names=["y"], opset_version=17)
    for name, base in (("mlp", "mlp.dynamo.onnx"), ("cnn", "cnn.torchscript.onnx")):
        proto = onnx.load(str(dest / base))
        onnx.save(proto, str(dest / f"{name}.ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{name}.weights.bin", size_threshold=0)
    # A Loop (3 trip count from a constant) computing x <- 0.5 x + 1: a subgraph with outer-scope constants.
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Mul", ["v_in", "half"], ["scaled"], name="body_mul"),
         helper.make_node("Add", ["scaled", "one"], ["v_out"], name="body_add")],
        "loop_body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2, 4])],
    )
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["trip"], name="trip_count",
                          value=helper.make_tensor("trip_v", TensorProto.INT64, [], [3])),
         helper.make_node("Constant", [], ["keep_going"], name="loop_cond",
                          value=helper.make_tensor("cond_v", TensorProto.BOOL, [], [True])),
         helper.make_node("Loop", ["trip", "keep_going", "x"], ["y"], name="repeat", body=body)],
        "loop_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
                     helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    loop = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(loop)
    onnx.save(loop, str(dest / "loop.handmade.onnx"))

    for name, shape in INPUT_SHAPES.items():
        x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
        t = torch.from_numpy(x)
        np.save(dest / f"{name}.x.npy", x)
        np.savez(dest / f"{name}.x.npz", x=x)
        torch.save(t, dest / f"{name}.x.pt")
        pt = dest / "pt" / name
        pt.mkdir(parents=True, exist_ok=True)
        big = torch.randn(shape[0], shape[1] * 2, *shape[2:])
        variants = {
            "list_str": ["x", "y"], "int": 42, "none": None, "nested_dict": {"x": {"inner": t}},
            "bf16": t.bfloat16(), "complex": t.to(torch.complex64), "bool": t > 0, "int8": t.to(torch.int8),
            "float64": t.double(), "sparse": t.to_sparse(), "qint8": torch.quantize_per_tensor(t, 0.1, 0, torch.qint8),
            "ndarray": x, "module": torch.nn.Linear(2, 2),
            "state_dict": OrderedDict(torch.nn.Linear(2, 2).state_dict()),
            "empty": torch.empty(0), "meta": torch.empty(shape, device="meta"),
            "strided_view": big[:, ::2], "requires_grad": torch.nn.Parameter(t.clone()),
            "dict_wrong_key": {"not_a_param": t}, "tuple3": (t, t, t),
        }
        for key, value in variants.items():
            try:
                torch.save(value, pt / f"{key}.pt")
            except Exception as exc:  # noqa: BLE001 - a variant this torch cannot save is skipped
                (pt / f"{key}.skip").write_text(repr(exc))
        torch.save(t, pt / "legacy_format.pt", _use_new_zipfile_serialization=False)
        torch.save(_HugeSize(t), pt / "huge_size.pt")
    (dest / "VERSION").write_text(SEEDS_VERSION)


class _HugeSize:
    """Pickles as a tensor whose declared size is far beyond its storage (torch's own rebuild function)."""

    def __init__(self, t):
        self.t = t

    def __reduce__(self):
        import torch

        storage = torch.storage.TypedStorage(wrap_storage=self.t.untyped_storage(), dtype=self.t.dtype,
                                             _internal=True)
        return torch._utils._rebuild_tensor_v2, (storage, 0, (100000, 100000, 100000), (10 ** 10, 10 ** 5, 1),
                                                  False, __import__("collections").OrderedDict())


def _write_npz_bomb(path: Path, name: str, shape: tuple[int, ...]) -> None:
    header = _npy_header({"descr": "<f4", "fortran_order": False, "shape": shape})
    total = int(np.prod(shape)) * 4
    chunk = bytes(1 << 24)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf, \
            zf.open(f"{name}.npy", "w", force_zip64=True) as member:
        member.write(header)
        left = total
        while left:
            n = min(left, len(chunk))
            member.write(chunk[:n])
            left -= n


def ensure_seeds(dest: Path, python: str) -> Path:
    """Build the seeds into ``dest`` once (in a child process: torch stays out of the fuzzer)."""
    if (dest / "VERSION").is_file() and (dest / "VERSION").read_text() == SEEDS_VERSION:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + f".building-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    proc = subprocess.run([python, str(Path(__file__).resolve()), "--_build-seeds", str(tmp)],
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the seed models failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    tmp.rename(dest)
    return dest


# ----------------------------------------------------------------------------------------------------------
# Byte-level helpers: .npy headers, protobuf wire format
# ----------------------------------------------------------------------------------------------------------

def _npy_header(header: dict | str, version: tuple[int, int] = (1, 0), declared_len: int | None = None) -> bytes:
    text = header if isinstance(header, str) else (
        "{" + ", ".join(f"'{k}': {v!r}" for k, v in header.items()) + ", }")
    text_b = text.encode("latin1")
    prefix = 10 if version == (1, 0) else 12
    pad = (-(prefix + len(text_b) + 1)) % 64
    text_b = text_b + b" " * pad + b"\n"
    n = len(text_b) if declared_len is None else declared_len
    length = struct.pack("<H", n & 0xFFFF) if version == (1, 0) else struct.pack("<I", n & 0xFFFFFFFF)
    return b"\x93NUMPY" + bytes(version) + length + text_b


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_fields(buf: bytes, start: int, end: int, depth: int, path: tuple[int, ...], out: list) -> None:
    """Collect ``(path, len_start, len_end, value_start, value_end)`` of the length-delimited fields of the
    ModelProto (depth 0), GraphProto (field 7) and its nodes / initializers / inputs (depth 2)."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            len_start = pos
            length, pos = _varint(buf, pos)
            out.append((path + (number,), len_start, pos, pos, pos + length))
            if depth == 0 and number == 7 or depth == 1 and number in (1, 5, 11, 12):
                _length_fields(buf, pos, pos + length, depth + 1, path + (number,), out)
            pos += length
        else:
            raise ValueError(f"wire type {wire}")


# ----------------------------------------------------------------------------------------------------------
# Mutations
# ----------------------------------------------------------------------------------------------------------

class NotApplicable(Exception):
    """The mutation has nothing to act on in this seed (e.g. no Conv node): the case picks another."""


@dataclass
class Ctx:
    """What a mutation may touch: the case folder and its files, a seeded RNG and notes for the record."""

    case_dir: Path
    model_dir: Path
    canary: Path
    variant: str
    seed_name: str
    onnx: Path  # the file the case checks (mutated by ONNX mutations)
    ext: Path | None  # its external data file, if any
    inputs: list[Path]  # --input files (mutated by input mutations)
    seeds: Path
    rng: random.Random
    notes: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # regexes of paths outside the folder the tool must not read
    extra_args: list[str] = field(default_factory=list)
    dataset: Path | None = None

    def note(self, text: str) -> None:
        self.notes.append(text)

    def proto(self):
        import onnx

        return onnx.load_model_from_string(self.onnx.read_bytes())  # never loads external data

    def save(self, proto) -> None:
        self.onnx.write_bytes(proto.SerializeToString())

    def pick(self, seq, what="item"):
        if not seq:
            raise NotApplicable(f"no {what}")
        return seq[self.rng.randrange(len(seq))]


@dataclass(frozen=True)
class Mutation:
    name: str
    kind: str  # "onnx" or "input"
    category: str
    fn: Callable[[Ctx], None]
    variants: tuple[str, ...] | None  # seeds it applies to (None: all)
    input_format: str | None = None  # the --input format it mutates (input mutations)
    weight: float = 1.0


MUTATIONS: dict[str, Mutation] = {}


def mutation(kind: str, category: str, variants: tuple[str, ...] | None = None, fmt: str | None = None,
             weight: float = 1.0):
    def deco(fn):
        name = fn.__name__.removeprefix("m_")
        MUTATIONS[name] = Mutation(name, kind, category, fn, variants, fmt, weight)
        return fn
    return deco


EXT = ("mlp.ext", "cnn.ext")
SUBGRAPH = ("cond.dynamo", "loop.handmade")


def _graphs(graph):
    """``graph`` and every subgraph inside it."""
    from onnx import AttributeProto

    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def _nodes(proto, op_type: str | None = None):
    return [n for g in _graphs(proto.graph) for n in g.node if op_type is None or n.op_type == op_type]


def _set_attr(node, name: str, value) -> None:
    from onnx import helper

    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    if isinstance(value, list) and not value:
        from onnx import AttributeProto

        node.attribute.append(helper.make_attribute(name, value, attr_type=AttributeProto.INTS))
    else:
        node.attribute.append(helper.make_attribute(name, value))


# --- control ---------------------------------------------------------------------------------------------

@mutation("onnx", "control", weight=0.5)
def m_none(ctx: Ctx) -> None:
    """No mutation: the clean seed (every check must pass)."""
    ctx.note("clean seed")


@mutation("input", "control", fmt="any", weight=0.5)
def m_clean_input(ctx: Ctx) -> None:
    """No mutation of a valid .npy/.npz/.pt input."""
    ctx.note(f"clean {ctx.inputs[0].suffix}")


# --- bytes -----------------------------------------------------------------------------------------------

@mutation("onnx", "bytes")
def m_truncate(ctx: Ctx) -> None:
    """The file cut at a random offset."""
    data = ctx.onnx.read_bytes()
    cut = ctx.rng.randrange(0, len(data))
    ctx.onnx.write_bytes(data[:cut])
    ctx.note(f"truncated {len(data)} -> {cut} bytes")


@mutation("onnx", "bytes")
def m_bitflip(ctx: Ctx) -> None:
    """1-16 random bits flipped."""
    data = bytearray(ctx.onnx.read_bytes())
    flips = ctx.rng.choice([1, 1, 2, 4, 16])
    where = []
    for _ in range(flips):
        i = ctx.rng.randrange(len(data))
        data[i] ^= 1 << ctx.rng.randrange(8)
        where.append(i)
    ctx.onnx.write_bytes(bytes(data))
    ctx.note(f"flipped bits at {where}")


@mutation("onnx", "bytes")
def m_byte_subst(ctx: Ctx) -> None:
    """Random bytes replaced by 0x00 / 0xFF / 0x80 / 0x7F / newline / random."""
    data = bytearray(ctx.onnx.read_bytes())
    where = []
    for _ in range(ctx.rng.choice([1, 3, 8, 32])):
        i = ctx.rng.randrange(len(data))
        data[i] = ctx.rng.choice([0x00, 0xFF, 0x80, 0x7F, 0x0A, ctx.rng.randrange(256)])
        where.append(i)
    ctx.onnx.write_bytes(bytes(data))
    ctx.note(f"substituted bytes at {where}")


@mutation("onnx", "bytes")
def m_huge_length_prefix(ctx: Ctx) -> None:
    """A length-delimited protobuf field (model, graph, node, initializer, input) claims a huge length."""
    data = ctx.onnx.read_bytes()
    fields: list = []
    _length_fields(data, 0, len(data), 0, (), fields)
    path, ls, le, _, _ = ctx.pick(fields, "length-delimited field")
    huge = ctx.rng.choice([2 ** 31 - 1, 2 ** 32, 2 ** 40, 2 ** 63 - 1, 2 ** 64 - 1, len(data) + 1])
    ctx.onnx.write_bytes(data[:ls] + _encode_varint(huge) + data[le:])
    ctx.note(f"field {'.'.join(map(str, path))} at byte {ls} claims length {huge}")


@mutation("onnx", "bytes")
def m_proto_concat(ctx: Ctx) -> None:
    """The file twice (protobuf merges: every node, initializer, input doubled) or a garbage tail."""
    data = ctx.onnx.read_bytes()
    how = ctx.rng.choice(["twice", "garbage", "zeros"])
    tail = data if how == "twice" else (bytes(ctx.rng.randrange(256) for _ in range(64)) if how == "garbage"
                                        else bytes(4096))
    ctx.onnx.write_bytes(data + tail)
    ctx.note(f"appended {how}")


@mutation("onnx", "bytes", weight=0.5)
def m_not_onnx(ctx: Ctx) -> None:
    """Not an ONNX file at all: empty, text, a .npy, a zip, random bytes."""
    how = ctx.rng.choice(["empty", "text", "npy", "zip", "random", "json"])
    if how == "empty":
        data = b""
    elif how == "text":
        data = b"this is not a model\n" * 10
    elif how == "npy":
        buf = io.BytesIO()
        np.save(buf, np.zeros((2, 2), np.float32))
        data = buf.getvalue()
    elif how == "zip":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("model.onnx", ctx.onnx.read_bytes())
        data = buf.getvalue()
    elif how == "json":
        data = b'{"graph": {"node": []}}'
    else:
        data = bytes(ctx.rng.randrange(256) for _ in range(2048))
    ctx.onnx.write_bytes(data)
    ctx.note(how)


# --- proto: types and dims -------------------------------------------------------------------------------

# undefined, string, bool, int64, fp16, double, complex64, bf16, fp8, no such type
_ODD_ELEM = [0, 8, 9, 7, 10, 11, 14, 16, 17, 99, -1]


def _odd_value_type(ctx: Ctx, values, what: str) -> None:
    """One of ``values`` (graph inputs or outputs) gets an odd elem_type."""
    p = ctx.proto()
    value = ctx.pick(values(p), what)
    et = ctx.rng.choice(_ODD_ELEM)
    value.type.tensor_type.elem_type = et
    ctx.save(p)
    ctx.note(f"{what} {value.name} elem_type {et}")


@mutation("onnx", "types")
def m_input_elem_type(ctx: Ctx) -> None:
    """A graph input's elem_type: undefined, string, bool, int64, fp16, double, complex, bf16, fp8, 99, -1."""
    _odd_value_type(ctx, lambda p: [i for i in p.graph.input if i.name not in {t.name for t in p.graph.initializer}],
                    "input")


@mutation("onnx", "types")
def m_output_elem_type(ctx: Ctx) -> None:
    """A graph output's elem_type changed (as for inputs)."""
    _odd_value_type(ctx, lambda p: list(p.graph.output), "output")


@mutation("onnx", "types")
def m_init_elem_type(ctx: Ctx) -> None:
    """An initializer's data_type changed (its raw_data no longer fits)."""
    p = ctx.proto()
    init = ctx.pick(list(p.graph.initializer), "initializer")
    et = ctx.rng.choice(_ODD_ELEM)
    init.data_type = et
    ctx.save(p)
    ctx.note(f"initializer {init.name} data_type {et}")


_ODD_DIMS = [0, -1, -2 ** 63, 10 ** 12, 2 ** 31, 2 ** 32, 2 ** 62, 2 ** 63 - 1, 3]


@mutation("onnx", "dims")
def m_input_dims(ctx: Ctx) -> None:
    """A graph input's dims: 0, negative, 1e12, 2**62, 40 extra axes, odd dim_params, no shape."""
    p = ctx.proto()
    value = ctx.pick([i for i in p.graph.input if i.type.tensor_type.HasField("shape")], "input")
    dims = value.type.tensor_type.shape.dim
    how = ctx.rng.choice(["value", "value", "rank", "param", "drop"])
    if how == "value" and dims:
        d = ctx.pick(list(dims))
        d.Clear()
        d.dim_value = ctx.rng.choice(_ODD_DIMS)
    elif how == "rank":
        for _ in range(ctx.rng.choice([1, 5, 40])):
            dims.add().dim_value = 1
    elif how == "param" and dims:
        d = ctx.pick(list(dims))
        d.Clear()
        d.dim_param = ctx.rng.choice(["", "?", "batch*2", "a" * 5000, "\x00", "N"])
    else:
        value.type.tensor_type.ClearField("shape")
    ctx.save(p)
    ctx.note(f"input {value.name} dims {how}: {[str(d).strip() for d in dims][:6]}")


def _init_dims(ctx: Ctx, mode: str) -> None:
    p = ctx.proto()
    init = ctx.pick([i for i in p.graph.initializer if len(i.dims)], "initializer with dims")
    old = list(init.dims)
    if mode == "absurd":
        new = ctx.rng.choice([[10 ** 12], [-1] + old[1:], [0] + old[1:], [2 ** 32, 2 ** 32], [2 ** 62, 4],
                              [2 ** 63 - 1], old + [0], [1] * 64])
    else:  # more elements than the data holds
        new = [old[0] * ctx.rng.choice([2, 3, 1000, 10 ** 6])] + old[1:]
    del init.dims[:]
    init.dims.extend(new)
    ctx.save(p)
    ctx.note(f"initializer {init.name} dims {old} -> {new} ({'external' if init.data_location == 1 else 'embedded'})")


@mutation("onnx", "dims")
def m_init_dims_absurd(ctx: Ctx) -> None:
    """An initializer's dims: 1e12, negative, zero, 2**32 x 2**32 (overflows int64), 64 axes."""
    _init_dims(ctx, "absurd")


@mutation("onnx", "dims")
def m_init_dims_exceed_data(ctx: Ctx) -> None:
    """An initializer's dims claim more elements than its raw_data (or external data) holds."""
    _init_dims(ctx, "exceed")


@mutation("onnx", "dims")
def m_init_raw_truncated(ctx: Ctx) -> None:
    """An initializer's raw_data cut short."""
    p = ctx.proto()
    init = ctx.pick([i for i in p.graph.initializer if len(i.raw_data) > 1], "initializer with raw_data")
    n = len(init.raw_data)
    init.raw_data = init.raw_data[: ctx.rng.randrange(0, n)]
    ctx.save(p)
    ctx.note(f"initializer {init.name} raw_data {n} -> {len(init.raw_data)} bytes")


@mutation("onnx", "types")
def m_init_odd_storage(ctx: Ctx) -> None:
    """Both raw_data and float_data, string data on a float tensor, a sparse initializer, segment info."""
    from onnx import TensorProto, helper

    p = ctx.proto()
    how = ctx.rng.choice(["both", "string", "sparse", "segment", "int32_data"])
    if how == "sparse":
        values = helper.make_tensor("sparse_w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
        indices = helper.make_tensor("sparse_i", TensorProto.INT64, [3], [0, 10 ** 9, -5])
        p.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4, 4]))
        node = ctx.pick(_nodes(p), "node")
        node.input.append("sparse_w")
    else:
        init = ctx.pick(list(p.graph.initializer), "initializer")
        if how == "both":
            init.float_data.extend([1.0, 2.0, 3.0])
        elif how == "string":
            init.string_data.extend([b"abc", b"\xff\xfe"])
        elif how == "segment":
            init.segment.begin, init.segment.end = 5, 2 ** 40
        else:
            init.int32_data.extend([1, 2, 3])
        ctx.note(f"initializer {init.name}")
    ctx.save(p)
    ctx.note(how)


@mutation("onnx", "types")
def m_init_values(ctx: Ctx) -> None:
    """Weights set to NaN / inf / 1e38 / denormals (a valid file computing garbage)."""
    p = ctx.proto()
    init = ctx.pick([i for i in p.graph.initializer if i.data_type == 1 and len(i.raw_data) >= 4], "float raw init")
    arr = np.frombuffer(init.raw_data, np.float32).copy()
    value = ctx.rng.choice([np.nan, np.inf, -np.inf, 1e38, -3e38, 1e-45, 0.0])
    if ctx.rng.random() < 0.5:
        arr[:] = value
    else:
        arr[ctx.rng.randrange(arr.size)] = value
    init.raw_data = arr.tobytes()
    ctx.save(p)
    ctx.note(f"initializer {init.name} <- {value}")


# --- graph structure -------------------------------------------------------------------------------------

@mutation("onnx", "graph")
def m_dangling_input(ctx: Ctx) -> None:
    """A node input names no tensor (or the empty name)."""
    p = ctx.proto()
    node = ctx.pick([n for n in _nodes(p) if n.input], "node with inputs")
    i = ctx.rng.randrange(len(node.input))
    old = node.input[i]
    node.input[i] = ctx.rng.choice(["does_not_exist", "", old + "_missing"])
    ctx.save(p)
    ctx.note(f"node {node.name} input {i} {old!r} -> {node.input[i]!r}")


@mutation("onnx", "graph")
def m_dangling_output(ctx: Ctx) -> None:
    """A graph output names no tensor."""
    p = ctx.proto()
    out = ctx.pick(list(p.graph.output), "output")
    old, out.name = out.name, ctx.rng.choice(["nowhere", "", "x"])
    ctx.save(p)
    ctx.note(f"graph output {old!r} -> {out.name!r}")


@mutation("onnx", "graph")
def m_dup_node_name(ctx: Ctx) -> None:
    """Two nodes with the same name."""
    p = ctx.proto()
    nodes = list(p.graph.node)
    if len(nodes) < 2:
        raise NotApplicable("one node")
    a, b = ctx.rng.sample(range(len(nodes)), 2)
    nodes[b].name = nodes[a].name
    ctx.save(p)
    ctx.note(f"node {b} renamed {nodes[a].name!r}")


@mutation("onnx", "graph")
def m_dup_tensor_name(ctx: Ctx) -> None:
    """Two nodes write the same tensor (not SSA)."""
    p = ctx.proto()
    nodes = [n for n in p.graph.node if n.output]
    if len(nodes) < 2:
        raise NotApplicable("one node")
    a, b = sorted(ctx.rng.sample(range(len(nodes)), 2))
    nodes[b].output[0] = nodes[a].output[0]
    ctx.save(p)
    ctx.note(f"node {nodes[b].name} output -> {nodes[a].output[0]!r}")


@mutation("onnx", "graph")
def m_dup_initializer(ctx: Ctx) -> None:
    """An initializer twice (same data, other dims, or named like the graph input)."""
    from onnx import TensorProto

    p = ctx.proto()
    init = ctx.pick(list(p.graph.initializer), "initializer")
    copy = TensorProto()
    copy.CopyFrom(init)
    how = ctx.rng.choice(["same", "other-dims", "shadow-input"])
    if how == "other-dims" and copy.dims:
        copy.dims[0] += 1
    if how == "shadow-input":
        copy.name = p.graph.input[0].name
    p.graph.initializer.append(copy)
    ctx.save(p)
    ctx.note(f"{how}: {copy.name}")


@mutation("onnx", "graph")
def m_dup_graph_input(ctx: Ctx) -> None:
    """A graph input (and output) declared twice."""
    from onnx import ValueInfoProto

    p = ctx.proto()
    copy = ValueInfoProto()
    copy.CopyFrom(p.graph.input[0])
    p.graph.input.append(copy)
    if ctx.rng.random() < 0.5:
        p.graph.output.append(p.graph.output[0])
        ctx.note("and output")
    ctx.save(p)
    ctx.note(f"input {copy.name} twice")


@mutation("onnx", "graph")
def m_cycle(ctx: Ctx) -> None:
    """A node consumes the output of itself or of a later node."""
    p = ctx.proto()
    nodes = [n for n in p.graph.node if n.input and n.output]
    if not nodes:
        raise NotApplicable("no node")
    i = ctx.rng.randrange(len(nodes))
    j = ctx.rng.randrange(i, len(nodes))
    k = ctx.rng.randrange(len(nodes[i].input))
    old = nodes[i].input[k]
    nodes[i].input[k] = nodes[j].output[0]
    ctx.save(p)
    ctx.note(f"node {nodes[i].name} input {old!r} -> output of {nodes[j].name} ({'self' if i == j else 'later'})")


@mutation("onnx", "graph")
def m_inputs_outputs(ctx: Ctx) -> None:
    """Graph inputs or outputs removed, renamed, or added."""
    from onnx import TensorProto, helper

    p = ctx.proto()
    how = ctx.rng.choice(["no-outputs", "no-inputs", "rename-input", "extra-input", "empty-graph", "output-is-input"])
    if how == "no-outputs":
        del p.graph.output[:]
    elif how == "no-inputs":
        del p.graph.input[:]
    elif how == "rename-input":
        p.graph.input[0].name = ctx.rng.choice(["renamed", "", "x" * 300, "../x", "a\x00b"])
    elif how == "extra-input":
        p.graph.input.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1, 3]))
    elif how == "empty-graph":
        del p.graph.node[:]
    else:
        p.graph.output[0].name = p.graph.input[0].name
    ctx.save(p)
    ctx.note(how)


@mutation("onnx", "graph")
def m_unknown_op(ctx: Ctx) -> None:
    """An op that does not exist: in the default domain, a custom domain, a domain without opset."""
    from onnx import helper

    p = ctx.proto()
    node = ctx.pick(_nodes(p), "node")
    how = ctx.rng.choice(["bogus-default", "custom-domain", "no-opset-for-domain", "empty-op"])
    old = node.op_type
    if how == "bogus-default":
        node.op_type = "Bogus"
    elif how == "custom-domain":
        node.domain, node.op_type = "com.evil", "Mystery"
        p.opset_import.append(helper.make_opsetid("com.evil", 1))
    elif how == "no-opset-for-domain":
        node.domain = "com.microsoft.nope"
    else:
        node.op_type = ""
    ctx.save(p)
    ctx.note(f"{how}: {old} node {node.name}")


@mutation("onnx", "graph")
def m_function_recursion(ctx: Ctx) -> None:
    """A local function that calls itself (or two that call each other), used by the graph."""
    from onnx import helper

    p = ctx.proto()
    node = ctx.pick([n for n in p.graph.node if len(n.input) >= 1 and len(n.output) == 1 and n.op_type != "Constant"],
                    "unary-ish node")
    mutual = ctx.rng.random() < 0.5
    f = helper.make_function("local", "f", ["a"], ["b"],
                             [helper.make_node("g" if mutual else "f", ["a"], ["b"], domain="local")],
                             [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    p.functions.append(f)
    if mutual:
        p.functions.append(helper.make_function("local", "g", ["a"], ["b"],
                                                [helper.make_node("f", ["a"], ["b"], domain="local")],
                                                [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    node.op_type, node.domain = "f", "local"
    del node.input[1:]
    del node.attribute[:]
    p.opset_import.append(helper.make_opsetid("local", 1))
    ctx.save(p)
    ctx.note(f"{'mutual' if mutual else 'self'} recursion at {node.name}")


@mutation("onnx", "graph", weight=0.7)
def m_many_nodes(ctx: Ctx) -> None:
    """A long chain of Identity nodes (or many unused inputs / initializers): size is still small."""
    from onnx import TensorProto, helper

    p = ctx.proto()
    n = ctx.rng.choice([5_000, 20_000, 60_000])
    how = ctx.rng.choice(["chain", "inputs", "initializers", "long-names"])
    if how == "chain":
        out = p.graph.output[0]
        prod = next(nd for nd in p.graph.node if out.name in nd.output)
        prev = out.name + "_c0"
        prod.output[list(prod.output).index(out.name)] = prev
        for i in range(n):
            nxt = out.name if i == n - 1 else f"{out.name}_c{i + 1}"
            p.graph.node.append(helper.make_node("Identity", [prev], [nxt], name=f"chain_{i}"))
            prev = nxt
    elif how == "inputs":
        for i in range(n):
            p.graph.input.append(helper.make_tensor_value_info(f"unused_{i}", TensorProto.FLOAT, [1]))
    elif how == "initializers":
        for i in range(n):
            p.graph.initializer.append(helper.make_tensor(f"w_{i}", TensorProto.FLOAT, [1], [float(i)]))
    else:
        for nd in p.graph.node:
            nd.name = nd.name + "n" * 100_000
    ctx.save(p)
    ctx.note(f"{how} x{n}")


@mutation("onnx", "graph")
def m_metadata_garbage(ctx: Ctx) -> None:
    """Malformed dynamo metadata (name scopes, class hierarchy) and model metadata."""
    p = ctx.proto()
    values = ["", "[", "]", "['a', 'b'", "[1, 2, 3]", "None", "{'a': 1}", "a/b/c" * 2000, "\x00\x01",
              "['', '']", "['L__self__', 'L__self__']", "[" + "'x', " * 5000 + "]", "é∂ƒ", "[[[[[[[[]]]]]]]]"]
    keys = ["pkg.torch.onnx.name_scopes", "pkg.torch.onnx.class_hierarchy", "pkg.torch.onnx.fx_node",
            "pkg.torch.onnx.stack_trace", "namespace"]
    nodes = _nodes(p)
    for node in ctx.rng.sample(nodes, min(len(nodes), ctx.rng.choice([1, 3, len(nodes)]))):
        prop = node.metadata_props.add()
        prop.key, prop.value = ctx.rng.choice(keys), ctx.rng.choice(values)
        if ctx.rng.random() < 0.3:
            node.ClearField("name")
    for _ in range(ctx.rng.choice([0, 2])):
        prop = p.metadata_props.add()
        prop.key, prop.value = "dup", ctx.rng.choice(values)
    ctx.save(p)
    ctx.note("metadata")


@mutation("onnx", "graph")
def m_value_info_garbage(ctx: Ctx) -> None:
    """value_info that contradicts the graph: wrong types, absurd shapes, names of nothing."""
    from onnx import helper

    p = ctx.proto()
    names = [o for n in p.graph.node for o in n.output] or ["ghost"]
    for _ in range(ctx.rng.choice([1, 4])):
        name = ctx.rng.choice(names + ["ghost"])
        p.graph.value_info.append(helper.make_tensor_value_info(
            name, ctx.rng.choice([1, 7, 8, 9, 99]), ctx.rng.choice([[10 ** 12], [-1, 3], [0], [], [1] * 30])))
    ctx.save(p)
    ctx.note("value_info")


# --- attributes ------------------------------------------------------------------------------------------

def _attr_case(ctx: Ctx, op: str, choices: list[tuple[str, Any]]) -> None:
    p = ctx.proto()
    node = ctx.pick(_nodes(p, op), f"{op} node")
    name, value = ctx.rng.choice(choices)
    _set_attr(node, name, value)
    ctx.save(p)
    ctx.note(f"{op} {node.name}: {name}={value!r}"[:300])


@mutation("onnx", "attributes", variants=("mlp.dynamo", "mlp.torchscript", "mlp.ext"))
def m_attr_softmax_axis(ctx: Ctx) -> None:
    """Softmax axis 99 / -99 / 2**62."""
    _attr_case(ctx, "Softmax", [("axis", 99), ("axis", -99), ("axis", 2 ** 62), ("axis", -2 ** 63)])


@mutation("onnx", "attributes", variants=("cnn.dynamo", "cnn.torchscript", "cnn.ext"))
def m_attr_conv(ctx: Ctx) -> None:
    """Conv group 0 / -1 / 3 / 2**40, strides 0, negative pads, kernel 99x99, auto_pad BOGUS."""
    _attr_case(ctx, "Conv", [("group", 0), ("group", -1), ("group", 3), ("group", 2 ** 40),
                             ("strides", [0, 0]), ("strides", [-1, 1]), ("dilations", [0, 1]),
                             ("pads", [-5, -5, -5, -5]), ("pads", [1, 1]), ("kernel_shape", [99, 99]),
                             ("kernel_shape", [3]), ("auto_pad", "BOGUS"), ("strides", [2 ** 40, 1])])


@mutation("onnx", "attributes", variants=("mlp.dynamo", "mlp.torchscript", "mlp.ext"))
def m_attr_transpose_perm(ctx: Ctx) -> None:
    """Transpose perm with duplicates, out of range, wrong length, empty."""
    _attr_case(ctx, "Transpose", [("perm", [0, 0]), ("perm", [5, 0]), ("perm", [0]), ("perm", [1, 0, 2]),
                                  ("perm", [-1, 0]), ("perm", [])])


@mutation("onnx", "attributes", variants=("cnn.dynamo", "cnn.torchscript", "cnn.ext"))
def m_attr_resize(ctx: Ctx) -> None:
    """Resize mode "bogus", coordinate_transformation_mode "bogus", NaN cubic_coeff_a."""
    _attr_case(ctx, "Resize", [("mode", "bogus"), ("coordinate_transformation_mode", "bogus"),
                               ("nearest_mode", "bogus"), ("cubic_coeff_a", float("nan")),
                               ("exclude_outside", 7), ("antialias", 5), ("mode", "")])


def _claimed_tensor(dims: list[int]):
    """A float TensorProto that claims ``dims`` but holds no data (helper.make_tensor refuses to build it)."""
    from onnx import TensorProto

    t = TensorProto()
    t.name, t.data_type = "t", TensorProto.FLOAT
    t.dims.extend(dims)
    return t


@mutation("onnx", "attributes")
def m_attr_random(ctx: Ctx) -> None:
    """Any attribute of any node: absurd ints, NaN floats, odd strings, or the wrong attribute type."""
    from onnx import AttributeProto

    p = ctx.proto()
    nodes = [n for n in _nodes(p) if n.attribute]
    node = ctx.pick(nodes, "node with attributes")
    attr = ctx.pick([a for a in node.attribute if a.type not in (AttributeProto.GRAPH, AttributeProto.GRAPHS)]
                    or list(node.attribute), "attribute")
    choice = ctx.rng.choice(["int", "float", "ints", "string", "retype", "drop", "tensor"])
    name = attr.name
    if choice == "drop":
        node.attribute.remove(attr)
        ctx.note(f"{node.op_type} {node.name}: dropped {name}")
    else:
        value = {"int": lambda: ctx.rng.choice([-2 ** 63, -1, 0, 99, 2 ** 31, 2 ** 63 - 1]),
                 "float": lambda: ctx.rng.choice([float("nan"), float("inf"), -1e38, 0.0]),
                 "ints": lambda: ctx.rng.choice([[], [0] * 100, [-1, -1], [2 ** 62] * 3]),
                 "string": lambda: ctx.rng.choice(["bogus", "", "\x00", "a" * 10000]),
                 "retype": lambda: ctx.rng.choice(["7", 7.5, [1.5, 2.5]]),
                 "tensor": lambda: _claimed_tensor([10 ** 12])}[choice]()
        _set_attr(node, name, value)
        ctx.note(f"{node.op_type} {node.name}: {name} <- {choice} {str(value)[:60]!r}")
    ctx.save(p)


@mutation("onnx", "attributes")
def m_huge_constant(ctx: Ctx) -> None:
    """A Reshape/Expand/ConstantOfShape that asks the runtime for an enormous tensor."""
    from onnx import TensorProto, helper

    p = ctx.proto()
    out = p.graph.output[0]
    prod = next(nd for nd in p.graph.node if out.name in nd.output)
    inner = out.name + "_pre"
    prod.output[list(prod.output).index(out.name)] = inner
    shape = ctx.rng.choice([[30000, 30000], [10 ** 6, 10 ** 6], [2 ** 31, 2 ** 31], [-1, 10 ** 12]])
    p.graph.initializer.append(helper.make_tensor("huge_shape", TensorProto.INT64, [len(shape)], shape))
    how = ctx.rng.choice(["ConstantOfShape", "Expand"])
    if how == "Expand":
        p.graph.node.append(helper.make_node("ReduceMax", [inner], ["pre_scalar"], keepdims=0, name="fuzz_rmax"))
        p.graph.node.append(helper.make_node("Expand", ["pre_scalar", "huge_shape"], ["big"], name="fuzz_expand"))
    else:
        p.graph.node.append(helper.make_node("ConstantOfShape", ["huge_shape"], ["big"], name="fuzz_cos",
                                             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])))
    p.graph.node.append(helper.make_node("ReduceSum", ["big"], ["big_sum"], keepdims=0, name="fuzz_rsum"))
    p.graph.node.append(helper.make_node("Add", [inner, "big_sum"], [out.name], name="fuzz_add"))
    ctx.save(p)
    ctx.note(f"{how} {shape}")


# --- subgraphs -------------------------------------------------------------------------------------------

def _subgraph_node(p):
    from onnx import AttributeProto

    return [n for n in _nodes(p) if any(a.type == AttributeProto.GRAPH for a in n.attribute)]


@mutation("onnx", "subgraph", variants=SUBGRAPH, weight=2.0)
def m_subgraph_broken(ctx: Ctx) -> None:
    """If/Loop bodies with dropped outputs, renamed inputs, outer references to nothing, mismatched types,
    a branch removed, a cycle inside."""
    from onnx import AttributeProto

    p = ctx.proto()
    node = ctx.pick(_subgraph_node(p), "node with a subgraph")
    attrs = [a for a in node.attribute if a.type == AttributeProto.GRAPH]
    attr = ctx.pick(attrs, "graph attribute")
    g = attr.g
    options = ["remove-branch", "extra-output", "empty-body"]
    options += ["drop-output", "output-type"] if g.output else []
    options += ["rename-input"] if g.input else []
    options += ["outer-ref", "cycle"] if g.node and g.node[0].input else []
    how = ctx.rng.choice(sorted(options))
    if how == "drop-output":
        del g.output[-1]
    elif how == "rename-input":
        g.input[0].name = "renamed_" + g.input[0].name
    elif how == "outer-ref":
        g.node[0].input[0] = "no_such_outer_value"
    elif how == "output-type":
        g.output[0].type.tensor_type.elem_type = ctx.rng.choice([7, 9, 11])
    elif how == "remove-branch":
        node.attribute.remove(attr)
    elif how == "cycle":
        g.node[0].input[0] = g.node[-1].output[0]
    elif how == "extra-output":
        g.output.append(g.output[0])
    else:
        del g.node[:]
    ctx.save(p)
    ctx.note(f"{node.op_type}.{attr.name}: {how}")


def _ld(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _deep_if_node(depth: int, inner: str, out_name: str) -> bytes:
    """The wire bytes of an If node whose then_branch nests ``depth`` Ifs (built as bytes: the protobuf
    library itself refuses to build messages deeper than its recursion limit)."""
    from onnx import TensorProto, helper

    def leaf(out, name):
        return helper.make_graph([helper.make_node("Identity", [inner], [out])], name, [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]).SerializeToString()

    then = leaf("deep_0", "g0")
    for d in range(1, depth + 1):
        name = out_name if d == depth else f"deep_{d}"
        node = helper.make_node("If", ["fuzz_true"], [name], name=f"if_{d}").SerializeToString()
        node += _ld(5, _ld(1, b"then_branch") + _encode_varint(20 << 3) + _encode_varint(5) + _ld(6, then))
        node += _ld(5, _ld(1, b"else_branch") + _encode_varint(20 << 3) + _encode_varint(5)
                    + _ld(6, leaf(f"e_{d}", f"e{d}")))
        if d == depth:
            return node
        then = _ld(1, node) + _ld(2, f"g{d}".encode()) + _ld(
            12, helper.make_tensor_value_info(name, TensorProto.FLOAT, None).SerializeToString())
    raise ValueError(depth)


@mutation("onnx", "subgraph")
def m_subgraph_deep(ctx: Ctx) -> None:
    """If nodes nested 20 to 2000 deep (beyond protobuf's recursion limit of 100) before the output."""
    from onnx import TensorProto, helper

    p = ctx.proto()
    depth = ctx.rng.choice([20, 60, 120, 400, 2000])
    out = p.graph.output[0]
    prod = next(nd for nd in p.graph.node if out.name in nd.output)
    inner = out.name + "_pre"
    prod.output[list(prod.output).index(out.name)] = inner
    p.graph.node.append(helper.make_node("Constant", [], ["fuzz_true"], name="fuzz_true",
                                         value=helper.make_tensor("t", TensorProto.BOOL, [], [True])))
    # protobuf merges a repeated field: the appended graph field adds the deep If to graph.node
    ctx.onnx.write_bytes(p.SerializeToString() + _ld(7, _ld(1, _deep_if_node(depth, inner, out.name))))
    ctx.note(f"nested If depth {depth}")


@mutation("onnx", "subgraph", variants=("loop.handmade",))
def m_loop_trip_count(ctx: Ctx) -> None:
    """The Loop runs 2**62 times, forever (no trip count, condition always true), or a negative count."""
    from onnx import TensorProto, helper

    p = ctx.proto()
    trip = next(n for n in p.graph.node if n.name == "trip_count")
    how = ctx.rng.choice(["huge", "forever", "negative", "1e7"])
    loop = next(n for n in p.graph.node if n.op_type == "Loop")
    if how == "forever":
        loop.input[0] = ""
    else:
        count = {"huge": 2 ** 62, "negative": -5, "1e7": 10 ** 7}[how]
        _set_attr(trip, "value", helper.make_tensor("trip_v", TensorProto.INT64, [], [count]))
    ctx.save(p)
    ctx.note(how)


# --- versions --------------------------------------------------------------------------------------------

@mutation("onnx", "versions")
def m_opset_absurd(ctx: Ctx) -> None:
    """Default-domain opset 0 / 1 / 99 / 10000 / 2**62 / -5, missing, or imported twice."""
    from onnx import helper

    p = ctx.proto()
    how = ctx.rng.choice(["value", "value", "missing", "duplicate"])
    default = [o for o in p.opset_import if o.domain in ("", "ai.onnx")]
    if how == "value" and default:
        default[0].version = ctx.rng.choice([0, 1, 6, 99, 10000, 2 ** 62, -5])
        ctx.note(f"opset {default[0].version}")
    elif how == "missing":
        for o in default:
            p.opset_import.remove(o)
    else:
        p.opset_import.append(helper.make_opsetid("", ctx.rng.choice([7, 18, 99])))
    ctx.save(p)
    ctx.note(how)


@mutation("onnx", "versions")
def m_ir_version_absurd(ctx: Ctx) -> None:
    """ir_version 0 / 1 / 2 / 3 / 99 / 2**62 / -1."""
    p = ctx.proto()
    p.ir_version = ctx.rng.choice([0, 1, 2, 3, 99, 2 ** 62, -1])
    ctx.save(p)
    ctx.note(f"ir_version {p.ir_version}")


# --- external data ---------------------------------------------------------------------------------------

def _retarget(ctx: Ctx, location: str | None, *, offset: str | None = None, length: str | None = None,
              all_inits: bool | None = None, dtype: int | None = None, extra: dict | None = None) -> None:
    """Point one (or every) external initializer at ``location`` / ``offset`` / ``length``."""
    p = ctx.proto()
    inits = [i for i in p.graph.initializer if i.data_location == 1]
    if not inits:
        raise NotApplicable("no external initializer")
    every = ctx.rng.random() < 0.3 if all_inits is None else all_inits
    chosen = inits if every else [ctx.pick(inits)]
    for init in chosen:
        info = {e.key: e.value for e in init.external_data}
        if location is not None:
            info["location"] = location
        if offset is not None:
            info["offset"] = offset
        if length is not None:
            info["length"] = length
        info.update(extra or {})
        if dtype is not None:
            init.data_type = dtype
        del init.external_data[:]
        for k, v in info.items():
            if v is not None:
                init.external_data.add(key=k, value=v)
    ctx.save(p)
    ctx.note(f"{'all' if every else chosen[0].name}: location={location!r} offset={offset} length={length}"
             + (f" data_type={dtype}" if dtype is not None else ""))


def _odd_dtype(ctx: Ctx) -> int | None:
    """Sometimes a dtype the tool's own weight reader skips (bfloat16, float8): ONNX Runtime reads the file then."""
    return ctx.rng.choice([None] * 6 + [16, 17])


@mutation("onnx", "external-data", variants=EXT, weight=1.5)
def m_ext_traversal_relative(ctx: Ctx) -> None:
    """location ``../canary.txt`` or ``../../CASE/canary.txt``: outside the model's folder."""
    loc = ctx.rng.choice(["../canary.txt", f"../../{ctx.case_dir.name}/canary.txt", "./../canary.txt",
                          "sub/../../canary.txt"])
    _retarget(ctx, loc, offset="0", dtype=_odd_dtype(ctx))


@mutation("onnx", "external-data", variants=EXT, weight=1.5)
def m_ext_traversal_absolute(ctx: Ctx) -> None:
    """location is the canary's absolute path."""
    _retarget(ctx, str(ctx.canary.resolve()), offset="0", dtype=_odd_dtype(ctx))


@mutation("onnx", "external-data", variants=EXT, weight=1.5)
def m_ext_symlink(ctx: Ctx) -> None:
    """A symlink inside the folder pointing outside (a file link to the canary, or a directory link)."""
    how = ctx.rng.choice(["file", "dir", "abs-file"])
    if how == "file":
        (ctx.model_dir / "link.bin").symlink_to("../canary.txt")
        loc = "link.bin"
    elif how == "abs-file":
        (ctx.model_dir / "link.bin").symlink_to(ctx.canary.resolve())
        loc = "link.bin"
    else:
        (ctx.model_dir / "up").symlink_to("..", target_is_directory=True)
        loc = "up/canary.txt"
    _retarget(ctx, loc, offset="0", dtype=_odd_dtype(ctx))
    ctx.note(f"symlink {how}")


@mutation("onnx", "external-data", variants=EXT)
def m_ext_system_file(ctx: Ctx) -> None:
    """location names a system file outside the folder (/etc/hostname, /proc/self/environ, /dev/zero)."""
    target = ctx.rng.choice(["/etc/hostname", "/etc/passwd", "/proc/self/environ", "/dev/zero",
                             "../../../../../../../../etc/passwd"])
    ctx.outside.append({"/proc/self/environ": r"^/proc/(self|\d+)/environ$"}.get(
        target, "^" + re.escape(os.path.normpath(os.path.join("/", target.lstrip("./")))) + "$"))
    _retarget(ctx, target, offset="0", dtype=_odd_dtype(ctx))


@mutation("onnx", "external-data", variants=EXT)
def m_ext_offset_length(ctx: Ctx) -> None:
    """offset / length beyond the file, negative, not numbers, or not matching dims x dtype."""
    size = ctx.ext.stat().st_size if ctx.ext and ctx.ext.exists() else 0
    offset, length = ctx.rng.choice([
        (str(size + 4096), None), (str(2 ** 62), None), ("-4", None), ("abc", None), ("", None), ("1e3", None),
        ("0", str(size * 100)), ("0", "3"), ("0", "-1"), ("0", "0"), (str(size - 2), "8"), ("7", None),
        ("0", str(2 ** 63)), (" 0", None)])
    _retarget(ctx, None, offset=offset, length=length)


@mutation("onnx", "external-data", variants=EXT)
def m_ext_location_odd(ctx: Ctx) -> None:
    """location is a directory, a missing file, empty, very long, has a NUL, or is missing."""
    how = ctx.rng.choice(["dir", "dot", "missing", "empty", "long", "nul", "no-key", "no-entries", "url"])
    if how == "dir":
        (ctx.model_dir / "sub").mkdir()
        _retarget(ctx, "sub")
    elif how == "dot":
        _retarget(ctx, ".")
    elif how == "missing":
        _retarget(ctx, "nope.bin")
    elif how == "empty":
        _retarget(ctx, "")
    elif how == "long":
        _retarget(ctx, "a" * 5000 + ".bin")
    elif how == "nul":
        _retarget(ctx, ctx.ext.name + "\x00../canary.txt")
    elif how == "url":
        _retarget(ctx, "file:///" + str(ctx.canary.resolve()))
    elif how == "no-key":
        p = ctx.proto()
        init = ctx.pick([i for i in p.graph.initializer if i.data_location == 1])
        keep = [(e.key, e.value) for e in init.external_data if e.key != "location"]
        del init.external_data[:]
        for k, v in keep:
            init.external_data.add(key=k, value=v)
        ctx.save(p)
    else:
        p = ctx.proto()
        init = ctx.pick([i for i in p.graph.initializer if i.data_location == 1])
        del init.external_data[:]
        ctx.save(p)
    ctx.note(how)


@mutation("onnx", "external-data", variants=EXT, weight=0.5)
def m_ext_fifo(ctx: Ctx) -> None:
    """location is a FIFO inside the folder: opening it blocks until a writer comes."""
    os.mkfifo(ctx.model_dir / "pipe.bin")
    _retarget(ctx, "pipe.bin", offset="0")


@mutation("onnx", "external-data", variants=EXT)
def m_ext_weights_file(ctx: Ctx) -> None:
    """The external data file truncated, emptied, deleted, or replaced by a directory."""
    how = ctx.rng.choice(["truncate", "empty", "delete", "directory", "bitflip"])
    data = ctx.ext.read_bytes()
    if how == "truncate":
        ctx.ext.write_bytes(data[: ctx.rng.randrange(len(data))])
    elif how == "empty":
        ctx.ext.write_bytes(b"")
    elif how == "delete":
        ctx.ext.unlink()
    elif how == "directory":
        ctx.ext.unlink()
        ctx.ext.mkdir()
    else:
        arr = bytearray(data)
        for _ in range(8):
            arr[ctx.rng.randrange(len(arr))] ^= 0xFF
        ctx.ext.write_bytes(bytes(arr))
    ctx.note(how)


@mutation("onnx", "external-data", variants=("mlp.dynamo", "mlp.torchscript", "cnn.dynamo", "cnn.torchscript"))
def m_ext_marked_embedded(ctx: Ctx) -> None:
    """An embedded initializer flagged EXTERNAL (with its raw_data, or pointing at the canary)."""
    p = ctx.proto()
    init = ctx.pick(list(p.graph.initializer), "initializer")
    init.data_location = 1
    how = ctx.rng.choice(["no-entries", "canary", "keep-raw"])
    if how == "canary":
        init.ClearField("raw_data")
        init.external_data.add(key="location", value="../canary.txt")
    elif how == "keep-raw":
        init.external_data.add(key="location", value="weights.bin")
    ctx.save(p)
    ctx.note(f"{init.name}: {how}")


# --- inputs: .npy ----------------------------------------------------------------------------------------

def _seed_array(ctx: Ctx) -> np.ndarray:
    return np.load(ctx.seeds / f"{ctx.seed_name}.x.npy")


def _write_npy_raw(ctx: Ctx, header: dict | str, body: bytes, **kw) -> None:
    ctx.inputs[0].write_bytes(_npy_header(header, **kw) + body)


def _malicious_pickle(ctx: Ctx) -> bytes:
    """A pickle that reads the canary (``open``) or runs a shell reading it, if anything ever unpickles it."""
    canary = str(ctx.canary.resolve()).encode()
    if ctx.rng.random() < 0.5:
        return b"cbuiltins\nopen\n(V" + canary + b"\ntR."
    return b"cposix\nsystem\n(Vcat " + canary + b" > /dev/null; touch " + canary + b".pwned\ntR."


@mutation("input", "npy", fmt="npy")
def m_npy_dtype(ctx: Ctx) -> None:
    """A valid .npy of another dtype: float64/16, ints, bool, complex, big-endian, datetime, str, void, struct."""
    x = _seed_array(ctx)
    dtype = ctx.rng.choice(["float64", "float16", "int64", "int8", "uint8", "bool", "complex64", ">f4",
                            "datetime64[s]", "timedelta64[ms]", "U5", "S3", "V8",
                            [("a", "<f4"), ("b", "<i4")]])
    try:
        y = x.astype(dtype)
    except (TypeError, ValueError):
        y = np.zeros(x.shape, dtype=dtype)
    np.save(ctx.inputs[0], y)
    ctx.note(f"dtype {dtype}")


@mutation("input", "npy", fmt="npy")
def m_npy_shape(ctx: Ctx) -> None:
    """A valid .npy of another shape: transposed, extra axis, scalar, rank 8, flat, batch 1 / 64, Fortran order."""
    x = _seed_array(ctx)
    how = ctx.rng.choice(["transpose", "extra-dim", "scalar", "rank8", "flat", "batch1", "batch64", "fortran"])
    y = {"transpose": lambda: np.ascontiguousarray(x.T), "extra-dim": lambda: x[None],
         "scalar": lambda: np.float32(3.0).reshape(()), "rank8": lambda: x.reshape(x.shape + (1,) * (8 - x.ndim)),
         "flat": lambda: x.reshape(-1), "batch1": lambda: x[:1],
         "batch64": lambda: np.repeat(x, 32, axis=0), "fortran": lambda: np.asfortranarray(x)}[how]()
    np.save(ctx.inputs[0], y)
    ctx.note(f"{how} {y.shape}")


@mutation("input", "npy", fmt="npy", weight=1.5)
def m_npy_values(ctx: Ctx) -> None:
    """NaN / inf / 1e38 / denormal / -0 / 65504 values (sometimes with --edge-cases)."""
    x = _seed_array(ctx).copy()
    value = ctx.rng.choice([np.nan, np.inf, -np.inf, 1e38, -3.4e38, 1e-45, -0.0, 65504.0, 1e20])
    if ctx.rng.random() < 0.5:
        x[...] = value
    else:
        x.flat[ctx.rng.randrange(x.size)] = value
    np.save(ctx.inputs[0], x)
    if ctx.rng.random() < 0.3:
        ctx.extra_args += ["--edge-cases"]
    ctx.note(f"value {value}")


@mutation("input", "npy", fmt="npy")
def m_npy_empty(ctx: Ctx) -> None:
    """Zero-size arrays: (0,), a zero batch, a zero inner axis, rank 0."""
    x = _seed_array(ctx)
    shape = ctx.rng.choice([(0,), (0,) + x.shape[1:], x.shape[:1] + (0,) + x.shape[2:], (0, 0), ()])
    np.save(ctx.inputs[0], np.zeros(shape, np.float32))
    ctx.note(f"shape {shape}")


@mutation("input", "npy", fmt="npy")
def m_npy_header_shape(ctx: Ctx) -> None:
    """The header declares a huge / negative / odd shape; the data is the seed's few bytes."""
    x = _seed_array(ctx)
    shape = ctx.rng.choice([(10 ** 12,), (2 ** 31, 2 ** 31), (2 ** 62, 8), (100000, 100000, 100000), (-1, 8),
                            (2, -8), (1 << 28, 4), "'a'", (1.5, 8), (2 ** 63 - 1,), (0, 2 ** 62)])
    shape_text = shape if isinstance(shape, str) else repr(shape)
    _write_npy_raw(ctx, "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }", x.tobytes())
    ctx.note(f"declared shape {shape_text}")


@mutation("input", "npy", fmt="npy")
def m_npy_header_garbage(ctx: Ctx) -> None:
    """Header damage: bad descr, object descr, extra keys, not a dict, code, wrong lengths, version 9."""
    x = _seed_array(ctx)
    how = ctx.rng.choice(["descr-bad", "descr-object", "extra-key", "not-dict", "code", "len-huge", "len-zero",
                          "version", "fortran-string", "descr-nested"])
    body = x.tobytes()
    if how == "descr-bad":
        _write_npy_raw(ctx, "{'descr': '<q9', 'fortran_order': False, 'shape': (2, 8), }", body)
    elif how == "descr-object":
        _write_npy_raw(ctx, {"descr": "|O", "fortran_order": False, "shape": x.shape}, body)
    elif how == "extra-key":
        _write_npy_raw(ctx, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8), 'evil': 1, }", body)
    elif how == "not-dict":
        _write_npy_raw(ctx, "[1, 2, 3]", body)
    elif how == "code":
        _write_npy_raw(ctx, "__import__('os').system('touch pwned')", body)
    elif how == "len-huge":
        _write_npy_raw(ctx, {"descr": "<f4", "fortran_order": False, "shape": x.shape}, body, declared_len=0xFFFF)
    elif how == "len-zero":
        _write_npy_raw(ctx, {"descr": "<f4", "fortran_order": False, "shape": x.shape}, body, declared_len=0)
    elif how == "version":
        ctx.inputs[0].write_bytes(b"\x93NUMPY\x09\x00" + _npy_header(
            {"descr": "<f4", "fortran_order": False, "shape": x.shape})[8:] + body)
    elif how == "fortran-string":
        _write_npy_raw(ctx, "{'descr': '<f4', 'fortran_order': 'yes', 'shape': (2, 8), }", body)
    else:
        _write_npy_raw(ctx, {"descr": [("a", [("b", "<f4")] * 3)], "fortran_order": False, "shape": (2,)}, body)
    ctx.note(how)


@mutation("input", "npy", fmt="npy")
def m_npy_v2_huge_header(ctx: Ctx) -> None:
    """Format 2.0/3.0 headers with a 4-byte length: huge declared header, or a real 200 KB header."""
    x = _seed_array(ctx)
    how = ctx.rng.choice(["declared", "real"])
    if how == "declared":
        _write_npy_raw(ctx, {"descr": "<f4", "fortran_order": False, "shape": x.shape}, x.tobytes(), version=(2, 0),
                       declared_len=0xFFFFFFF0)
    else:
        text = "{'descr': '<f4', 'fortran_order': False, 'shape': " + repr(x.shape) + ", }" + " " * 200_000
        _write_npy_raw(ctx, text, x.tobytes(), version=(2, 0))
    ctx.note(how)


@mutation("input", "input-bytes", fmt="any")
def m_input_truncated(ctx: Ctx) -> None:
    """The input file (.npy/.npz/.pt) cut at a random offset."""
    data = ctx.inputs[0].read_bytes()
    cut = ctx.rng.randrange(0, len(data))
    ctx.inputs[0].write_bytes(data[:cut])
    ctx.note(f"{ctx.inputs[0].suffix} truncated {len(data)} -> {cut}")


@mutation("input", "input-bytes", fmt="any")
def m_input_bitflip(ctx: Ctx) -> None:
    """1-16 random bits of the input file flipped."""
    data = bytearray(ctx.inputs[0].read_bytes())
    where = []
    for _ in range(ctx.rng.choice([1, 4, 16])):
        i = ctx.rng.randrange(len(data))
        data[i] ^= 1 << ctx.rng.randrange(8)
        where.append(i)
    ctx.inputs[0].write_bytes(bytes(data))
    ctx.note(f"{ctx.inputs[0].suffix} bits flipped at {where}")


@mutation("input", "npy", fmt="npy", weight=1.5)
def m_npy_object_pickle(ctx: Ctx) -> None:
    """An object array: the payload is a pickle that reads the canary when unpickled."""
    x = _seed_array(ctx)
    _write_npy_raw(ctx, {"descr": "|O", "fortran_order": False, "shape": x.shape}, _malicious_pickle(ctx))
    ctx.note("object array with pickle payload")


@mutation("input", "input-bytes", fmt="any")
def m_input_wrong_format(ctx: Ctx) -> None:
    """The file's content is another format than its extension, an unknown extension, or a directory/FIFO."""
    how = ctx.rng.choice(["onnx-bytes", "text", "empty", "other-format", "ext-bin", "ext-none", "directory", "fifo",
                          "ext-upper"])
    target = ctx.inputs[0]
    if how == "onnx-bytes":
        target.write_bytes(ctx.onnx.read_bytes())
    elif how == "text":
        target.write_text("1.0 2.0 3.0\n")
    elif how == "empty":
        target.write_bytes(b"")
    elif how == "other-format":
        others = {".npy": f"{ctx.seed_name}.x.npz", ".npz": f"{ctx.seed_name}.x.pt", ".pt": f"{ctx.seed_name}.x.npy"}
        shutil.copyfile(ctx.seeds / others[target.suffix], target)
    elif how in ("ext-bin", "ext-none", "ext-upper"):
        new = target.with_suffix({"ext-bin": ".bin", "ext-none": "", "ext-upper": target.suffix.upper()}[how])
        target.rename(new)
        ctx.inputs[0] = new
    elif how == "directory":
        target.unlink()
        target.mkdir()
    else:
        target.unlink()
        os.mkfifo(target)
    ctx.note(how)


@mutation("input", "input-bytes", fmt="npy")
def m_input_count(ctx: Ctx) -> None:
    """Too many --input files, the same file twice, or an input that is a dataset folder of bad samples."""
    how = ctx.rng.choice(["twice", "three", "dataset-mixed"])
    if how == "twice":
        ctx.inputs.append(ctx.inputs[0])
    elif how == "three":
        for i in range(2):
            extra = ctx.model_dir / f"extra{i}.npy"
            shutil.copyfile(ctx.inputs[0], extra)
            ctx.inputs.append(extra)
    else:
        data = ctx.model_dir / "samples"
        data.mkdir()
        shutil.copyfile(ctx.inputs[0], data / "a.npy")
        np.save(data / "b.npy", np.zeros((3, 3), np.float64))
        (data / "c.npy").write_bytes(b"\x93NUMPY garbage")
        (data / "d.txt").write_text("hello")
        (data / "e.npz").write_bytes(b"PK\x03\x04")
        ctx.dataset = data
    ctx.note(how)


# --- inputs: .npz ----------------------------------------------------------------------------------------

def _write_npz(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@mutation("input", "npz", fmt="npz", weight=1.5)
def m_npz_names(ctx: Ctx) -> None:
    """Arrays named after nothing, extra arrays, no arrays, odd member names."""
    x = _seed_array(ctx)
    how = ctx.rng.choice(["wrong", "extra", "empty", "arr_0", "traversal-name", "dup-member", "no-npy-suffix",
                          "unicode"])
    members = {"wrong": {"y.npy": _npy_bytes(x)}, "extra": {"x.npy": _npy_bytes(x), "bonus.npy": _npy_bytes(x)},
               "empty": {}, "arr_0": {"arr_0.npy": _npy_bytes(x)}, "traversal-name": {"../../x.npy": _npy_bytes(x)},
               "no-npy-suffix": {"x": _npy_bytes(x), "readme.txt": b"hi"}, "unicode": {"x\u202e.npy": _npy_bytes(x)},
               "dup-member": None}[how]
    if members is None:
        with zipfile.ZipFile(ctx.inputs[0], "w") as zf:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                zf.writestr("x.npy", _npy_bytes(x))
                zf.writestr("x.npy", _npy_bytes(np.zeros((9, 9), np.float64)))
    else:
        _write_npz(ctx.inputs[0], members)
    ctx.note(how)


@mutation("input", "npz", fmt="npz")
def m_npz_member_garbage(ctx: Ctx) -> None:
    """The member is an object array (pickle payload), a bad header, a huge declared shape, wrong dtype."""
    x = _seed_array(ctx)
    how = ctx.rng.choice(["pickle", "huge-shape", "dtype", "not-npy", "empty"])
    if how == "pickle":
        data = _npy_header({"descr": "|O", "fortran_order": False, "shape": x.shape}) + _malicious_pickle(ctx)
    elif how == "huge-shape":
        data = _npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000, 100000), }") \
            + x.tobytes()
    elif how == "dtype":
        data = _npy_bytes(x.astype(ctx.rng.choice(["complex128", "U3", "bool", "int16"])))
    elif how == "not-npy":
        data = b"not an npy at all"
    else:
        data = b""
    _write_npz(ctx.inputs[0], {"x.npy": data})
    ctx.note(how)


_BOMB_LOCK = threading.Lock()


@mutation("input", "npz", fmt="npz", weight=0.7)
def m_npz_bomb(ctx: Ctx) -> None:
    """A 4 GiB float32 array compressed to a few MB (honestly declared)."""
    bomb = ctx.seeds / "bomb.npz"
    with _BOMB_LOCK:  # built on first use (about 20 s), then copied per case
        if not bomb.is_file():
            _write_npz_bomb(bomb.with_suffix(".part"), "x", (4, 1 << 28))
            bomb.with_suffix(".part").rename(bomb)
    shutil.copyfile(bomb, ctx.inputs[0])
    ctx.note("4 GiB of zeros, deflated")


@mutation("input", "npz", fmt="npz")
def m_npz_zip_odd(ctx: Ctx) -> None:
    """Zip-level damage: a wrong CRC, a member declaring a huge size, an encrypted-flag member."""
    x = _seed_array(ctx)
    _write_npz(ctx.inputs[0], {"x.npy": _npy_bytes(x)})
    data = bytearray(ctx.inputs[0].read_bytes())
    how = ctx.rng.choice(["crc", "size", "encrypted", "comment"])
    if how == "crc":
        data[14:18] = b"\xde\xad\xbe\xef"  # local header CRC
        cd = data.rfind(b"PK\x01\x02")
        data[cd + 16: cd + 20] = b"\xde\xad\xbe\xef"
    elif how == "size":
        cd = data.rfind(b"PK\x01\x02")
        data[cd + 24: cd + 28] = b"\xff\xff\xff\x7f"  # uncompressed size
        data[22:26] = b"\xff\xff\xff\x7f"
    elif how == "encrypted":
        data[6] |= 1
        cd = data.rfind(b"PK\x01\x02")
        data[cd + 8] |= 1
    else:
        data += b"x" * 70000
    ctx.inputs[0].write_bytes(bytes(data))
    ctx.note(how)


# --- inputs: .pt -----------------------------------------------------------------------------------------

@mutation("input", "pt", fmt="pt", weight=2.0)
def m_pt_content(ctx: Ctx) -> None:
    """Not a plain tensor: strings, ints, None, nested dicts, a module, a numpy array, odd dtypes and layouts."""
    folder = ctx.seeds / "pt" / ctx.seed_name
    have = [v for v in PT_VARIANTS if (folder / f"{v}.pt").is_file()]
    variant = ctx.pick(have, ".pt variant")
    shutil.copyfile(folder / f"{variant}.pt", ctx.inputs[0])
    ctx.note(variant)


@mutation("input", "pt", fmt="pt", weight=1.5)
def m_pt_malicious_pickle(ctx: Ctx) -> None:
    """A torch zip whose data.pkl (or a legacy non-zip file) is a pickle reading the canary when unpickled."""
    payload = _malicious_pickle(ctx)
    how = ctx.rng.choice(["zip", "zip", "raw-pickle", "global-torch"])
    if how == "raw-pickle":
        ctx.inputs[0].write_bytes(payload)
    else:
        if how == "global-torch":  # a GLOBAL the weights-only unpickler might allow, called with odd args
            payload = b"ctorch._utils\n_rebuild_tensor_v2\n(I1\nI2\ntR."
        src = zipfile.ZipFile(ctx.seeds / f"{ctx.seed_name}.x.pt")
        with src, zipfile.ZipFile(ctx.inputs[0], "w") as out:
            for info in src.infolist():
                data = payload if info.filename.endswith("data.pkl") else src.read(info.filename)
                out.writestr(info, data)
    ctx.note(how)


# ----------------------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------------------

ONNX_MODES = (("main", 0.45), ("coverage", 0.25), ("reference", 0.2), ("reference-rev", 0.1))
INPUT_MODES = (("main", 0.45), ("main-save", 0.15), ("reference", 0.15), ("matrix", 0.1), ("dataset", 0.1),
               ("coverage-py", 0.05))
OUTPUTS = {"json": "out/report.json", "coverage": "out/coverage.json", "save": "out/saved.onnx"}
TRAVERSAL = {"ext_traversal_relative", "ext_traversal_absolute", "ext_symlink", "ext_system_file"}


@dataclass(frozen=True)
class CaseSpec:
    """Everything that makes a case: replaying a spec rebuilds the same files and command."""

    index: int
    seed: int  # the case's own RNG seed
    mutation: str
    variant: str
    mode: str
    input_format: str  # npy / npz / pt


def _weighted(rng: random.Random, items):
    total = sum(w for _, w in items)
    r = rng.random() * total
    for item, w in items:
        r -= w
        if r <= 0:
            return item
    return items[-1][0]


def make_spec(master_seed: int, index: int, only: list[str] | None = None) -> CaseSpec:
    """The ``index``-th case of the run seeded ``master_seed``."""
    seed = int.from_bytes(hashlib.sha256(f"{master_seed}/{index}".encode()).digest()[:4], "little")
    rng = random.Random(seed)
    pool = [m for m in MUTATIONS.values() if not only or m.name in only]
    mut = _weighted(rng, [(m, m.weight) for m in pool])
    variant = rng.choice(mut.variants or tuple(VARIANTS))
    mode = _weighted(rng, ONNX_MODES if mut.kind == "onnx" else INPUT_MODES)
    fmt = mut.input_format if mut.input_format not in (None, "any") else (
        rng.choice(["npy", "npz", "pt"]) if mut.input_format == "any" else
        _weighted(rng, (("npy", 0.7), ("npz", 0.15), ("pt", 0.15))))
    return CaseSpec(index, seed, mut.name, variant, mode, fmt)


@dataclass
class Case:
    spec: CaseSpec
    dir: Path
    argv: list[str]
    outputs: list[str]  # requested outputs, relative to the case folder
    detail: str
    outside: list[str]
    canary: Path
    skipped: str = ""


def _canary_text(seed: int) -> bytes:
    head = f"FUZZ-CANARY-{seed:08x}-{hashlib.sha1(str(seed).encode()).hexdigest()}\n".encode()
    return (head * (CANARY_SIZE // len(head) + 1))[:CANARY_SIZE]


def build_case(spec: CaseSpec, root: Path, seeds: Path) -> Case:
    """Create ``root/case-SEED-INDEX/`` for ``spec`` and apply its mutation."""
    case_dir = root / f"case-{spec.index:05d}-{spec.seed:08x}"
    if case_dir.exists():
        shutil.rmtree(case_dir)
    mut = MUTATIONS[spec.mutation]
    rng = random.Random(spec.seed ^ 0x5EED)
    seed_name, onnx_file, ext_file = VARIANTS[spec.variant]
    model_dir = case_dir / "model"
    for sub in ("model", "tmp", "out", ".fuzz"):
        (case_dir / sub).mkdir(parents=True)
    canary = case_dir / "canary.txt"
    canary.write_bytes(_canary_text(spec.seed))
    shutil.copyfile(seeds / f"{seed_name}.py", model_dir / "model.py")
    onnx_path = model_dir / "model.onnx"
    shutil.copyfile(seeds / onnx_file, onnx_path)
    ext = None
    if ext_file:
        ext = model_dir / ext_file
        shutil.copyfile(seeds / ext_file, ext)
    twin_variant = CLEAN_TWIN.get(spec.variant, spec.variant)
    shutil.copyfile(seeds / VARIANTS[twin_variant][1], model_dir / "ref.onnx")
    inp = model_dir / f"x.{spec.input_format}"
    shutil.copyfile(seeds / f"{seed_name}.x.{spec.input_format}", inp)
    ctx = Ctx(case_dir=case_dir, model_dir=model_dir, canary=canary, variant=spec.variant, seed_name=seed_name,
              onnx=onnx_path, ext=ext, inputs=[inp], seeds=seeds, rng=rng)
    skipped = ""
    try:
        mut.fn(ctx)
    except NotApplicable as exc:
        skipped = f"not applicable: {exc}"
    mode = spec.mode
    if mode == "dataset" and ctx.dataset is None:
        data = model_dir / "samples"
        data.mkdir()
        for i, p in enumerate(ctx.inputs):
            if p.exists() or p.is_symlink():
                os.replace(p, data / f"s{i}{p.suffix}")
        shutil.copyfile(seeds / f"{seed_name}.x.{spec.input_format}", data / f"clean.{spec.input_format}")
        ctx.dataset, ctx.inputs = data, []
    rel = lambda p: os.path.relpath(p, case_dir)
    inputs = [a for p in ctx.inputs for a in ("--input", rel(p))]
    if ctx.dataset is not None:
        inputs = ["--dataset", rel(ctx.dataset)]
    outputs = [OUTPUTS["json"]]
    if mode == "main" or mode == "dataset":
        argv = ["model/model.py", "--onnx", "model/model.onnx", *inputs, "--json", OUTPUTS["json"]]
    elif mode == "main-save":
        argv = ["model/model.py", *inputs, "--save-onnx", OUTPUTS["save"], "--json", OUTPUTS["json"]]
        outputs.append(OUTPUTS["save"])
    elif mode == "matrix":
        extra = rng.choice([["--batch-sizes", "1,3"], ["--edge-cases"], ["--ort-opt-level", "disable",
                                                                          "--ort-opt-level", "all"]])
        argv = ["model/model.py", "--onnx", "model/model.onnx", *inputs, *extra, "--json", OUTPUTS["json"]]
    elif mode == "coverage":
        argv = ["coverage", "model/model.onnx", "--json", OUTPUTS["coverage"]]
        outputs = [OUTPUTS["coverage"]]
    elif mode == "coverage-py":
        argv = ["coverage", "model/model.py", *inputs, "--json", OUTPUTS["coverage"]]
        outputs = [OUTPUTS["coverage"]]
    elif mode == "reference":
        argv = ["model/model.onnx", "--reference", "model/ref.onnx", *inputs, "--json", OUTPUTS["json"]]
    elif mode == "reference-rev":
        argv = ["model/ref.onnx", "--reference", "model/model.onnx", *inputs, "--json", OUTPUTS["json"]]
    else:
        raise ValueError(mode)
    if mode in ("main", "main-save", "matrix", "dataset"):  # the options only the main job takes
        argv += [a for a in ctx.extra_args if a not in argv]
    detail = "; ".join(ctx.notes)
    case = Case(spec, case_dir, argv, outputs, detail, ctx.outside, canary, skipped)
    (case_dir / ".fuzz" / "case.json").write_text(json.dumps(
        {"spec": asdict(spec), "argv": argv, "outputs": outputs, "detail": detail, "skipped": skipped}, indent=1))
    return case


# ----------------------------------------------------------------------------------------------------------
# Running and judging one case
# ----------------------------------------------------------------------------------------------------------

@dataclass
class RunConfig:
    python: str = sys.executable
    src: str = str(REPO / "src")
    timeout: float = 60.0
    mem_limit: int = 3 << 30  # peak RSS flagged above this
    mem_kill: int = 6 << 30  # the run is killed above this (protects a shared machine)
    tracer: str = "auto"  # "strace", "audit", or "auto"

    def resolved_tracer(self) -> str:
        if self.tracer != "auto":
            return self.tracer
        return "strace" if _strace_works() else "audit"


_STRACE_OK: bool | None = None


def _strace_works() -> bool:
    global _STRACE_OK
    if _STRACE_OK is None:
        exe = shutil.which("strace")
        _STRACE_OK = bool(exe) and subprocess.run(
            [exe, "-f", "--seccomp-bpf", "-qq", "-o", os.devnull, "-e", "trace=openat", "true"],
            capture_output=True, check=False).returncode == 0
    return _STRACE_OK


AUDIT_WRAPPER = r'''
import os, sys
_log = open(os.environ.pop("FUZZ_AUDIT_LOG"), "w", buffering=1)
_cwd = os.getcwd()
def _hook(event, args):
    try:
        if event == "open" and not isinstance(args[0], int) and args[0] is not None:
            path, mode, flags = args
            w = (mode and any(c in str(mode) for c in "wax+")) or \
                (flags and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            _log.write(("W" if w else "R") + "\t" + os.path.join(_cwd, os.fsdecode(path)) + "\n")
        elif event in ("os.rename", "os.replace", "os.link", "os.symlink"):
            _log.write("W\t" + os.path.join(_cwd, os.fsdecode(args[1])) + "\n")
        elif event == "os.mkdir" and not os.path.exists(args[0]):
            _log.write("W\t" + os.path.join(_cwd, os.fsdecode(args[0])) + "\n")
        elif event in ("os.remove", "os.rmdir", "os.truncate"):
            _log.write("W\t" + os.path.join(_cwd, os.fsdecode(args[0])) + "\n")
    except Exception:
        pass
sys.addaudithook(_hook)
sys.argv[0] = "onnx-bisect"
from onnx_bisect.cli import main
sys.exit(main())
'''

_STRACE_CALLS = "open,openat,openat2,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,rmdir," \
                "symlink,symlinkat,link,linkat,truncate"
_WRITE_FLAGS = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC")
_SYSCALL = re.compile(r"^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(?:<(.*)>)?")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _unescape(s: str) -> str:
    try:
        return s.encode("latin1", "backslashreplace").decode("unicode_escape").encode("latin1").decode(
            "utf8", "surrogateescape")
    except (UnicodeError, ValueError):
        return s


def _resolver(base: Path) -> Callable[[str], str]:
    return lambda p: os.path.realpath(os.path.join(base, p))


def parse_strace(text: str, cwd: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(R|W, resolved path)], [signals that killed a traced process])`` from an ``strace -y`` log."""
    events, killed = [], []
    pending: dict[str, str] = {}
    for line in text.splitlines():
        if "<unfinished ...>" in line:
            pid = line.split(None, 1)[0]
            pending[pid] = line.split("<unfinished ...>")[0]
            continue
        m = re.match(r"^(\d+)\s+<\.\.\. \w+ resumed>(.*)$", line)
        if m and m.group(1) in pending:
            line = pending.pop(m.group(1)) + m.group(2)
        if "+++ killed by" in line:
            killed.append(line.split("+++ killed by", 1)[1].split("+++")[0].strip())
            continue
        m = _SYSCALL.match(line)
        if not m or m.group(4) == "?" or int(m.group(4)) < 0:
            continue
        call, args, annotated = m.group(2), m.group(3), m.group(5)
        strings = [_unescape(s) for s in _QUOTED.findall(args)]
        if not strings:
            continue
        dir_m = re.match(r"^(?:AT_FDCWD|\d+)<([^>]*)>", args)
        resolve = _resolver(Path(_unescape(dir_m.group(1))) if dir_m else cwd)

        if call in ("open", "openat", "openat2", "creat"):
            if "O_DIRECTORY" in args:
                continue
            write = call == "creat" or bool(_WRITE_FLAGS.search(args))
            path = _unescape(annotated) if annotated and annotated.startswith("/") else resolve(strings[0])
            events.append(("W" if write else "R", path))
        elif call.startswith(("rename", "link", "symlink")):
            events.append(("W", resolve(strings[-1])))
        else:  # mkdir, unlink, rmdir, truncate
            events.append(("W", resolve(strings[0])))
    return events, killed


def parse_audit(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        kind, _, path = line.partition("\t")
        if kind in ("R", "W") and path:
            out.append((kind, os.path.realpath(path)))
    return out


def snapshot(case_dir: Path) -> dict[str, tuple]:
    """Every entry of the case folder but ``.fuzz``: type, size, mtime and a content hash of small files."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(case_dir):
        rel_dir = os.path.relpath(dirpath, case_dir)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != ".fuzz"]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if os.path.islink(path):
                out[rel] = ("l", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("d",)
            elif os.path.isfile(path):
                digest = ""
                if st.st_size <= 16 << 20:
                    with open(path, "rb") as f:
                        digest = hashlib.sha1(f.read()).hexdigest()
                out[rel] = ("f", st.st_size, st.st_mtime_ns, digest)
            else:
                out[rel] = ("o", st.st_mode)
    return out


def _norm_name(text: str) -> str:
    """A path with its random parts replaced, so that stray files group into patterns."""
    text = re.sub(r"case-\d{5}-[0-9a-f]{8}", "CASE", text)
    home = os.path.expanduser("~")
    if home and home != "/":
        text = text.replace(home, "~")
    text = re.sub(r"(?<=[._-])[A-Za-z0-9_]{6,10}$", "*", text)
    text = re.sub(r"(^|/)tmp[A-Za-z0-9_]{6,10}(?=/|$)", r"\1tmp*", text)
    text = re.sub(r"(?<=/)[A-Za-z0-9_]{8}(?=$|/)", "*", text) if "/tmp/" in text else text
    text = re.sub(r"\d{3,}", "#", text)
    return text


_PY_WARNING = re.compile(r"^(?P<file>\S.*?):(?P<line>\d+): (?P<cat>[A-Z]\w*Warning): (?P<msg>.*)$")
_TORCH_LOG = re.compile(r"^(?P<lvl>[WE])\d{4} \d\d:\d\d:\d\d\.\d+ \d+ (?P<file>\S+):\d+\] (?P<msg>.*)$")
_ORT_LOG = re.compile(r"\[(?P<lvl>[WE]):onnxruntime:[^\]]*\]\s*(?P<msg>.*)$")


def _module_of(path: str) -> str:
    for marker in ("site-packages/", "/src/", "lib/python3"):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "lib/python3" and "/" in tail else tail
    return path


def find_warnings(stderr: str) -> list[str]:
    """Pattern keys of warnings that leaked to stderr."""
    found = []
    for line in stderr.splitlines():
        m = _PY_WARNING.match(line)
        if m:
            msg = re.sub(r"\d+(\.\d+)?", "#", m.group("msg"))[:90]
            found.append(f"{m.group('cat')} from {_module_of(m.group('file'))}: {msg}")
            continue
        m = _TORCH_LOG.match(line)
        if m:
            found.append(f"torch logging {m.group('lvl')} from {_module_of(m.group('file'))}: "
                         f"{re.sub(r'[0-9]+', '#', m.group('msg'))[:90]}")
            continue
        m = _ORT_LOG.search(line)
        if m:
            found.append(f"onnxruntime log [{m.group('lvl')}]: {re.sub(r'[0-9]+', '#', m.group('msg'))[:90]}")
            continue
        if not line[:1].isspace() and re.search(
                r"\bWarning:|RuntimeWarning|UserWarning|DeprecationWarning|FutureWarning", line):
            found.append(f"warning line: {re.sub(r'[0-9]+', '#', line.strip())[:100]}")
    return list(dict.fromkeys(found))


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def find_tracebacks(text: str) -> list[str]:
    """``ExceptionType @ where`` for each traceback: where = the innermost onnx_bisect frame (else innermost)."""
    keys = []
    blocks = text.split("Traceback (most recent call last):")[1:]
    for block in blocks:
        frames, exc = [], "?"
        for line in block.splitlines():
            fm = _FRAME.match(line)
            if fm:
                frames.append(fm)
            elif line and not line.startswith(" ") and frames:
                exc = re.split(r":\s|:$", line.strip(), maxsplit=1)[0][:80]
                break
        own = [f for f in frames if "onnx_bisect" in f.group("file")]
        pick = (own or frames or [None])[-1]
        where = f"{_module_of(pick.group('file'))}:{pick.group('line')} {pick.group('func')}" if pick else "?"
        inner = frames[-1] if frames else None
        if inner is not None and own and inner is not own[-1]:
            where += f" (raised in {_module_of(inner.group('file'))} {inner.group('func')})"
        keys.append(f"{exc} @ {where}")
    return keys


def one_paragraph_error(stderr: str) -> bool:
    """stderr is exactly one ``onnx-bisect: error:`` paragraph."""
    text = stderr.strip()
    return text.startswith("onnx-bisect: error:") and "\n\n" not in text and "Traceback" not in text


def _tree_rss(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (psutil when installed, else /proc)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:  # a child that just exited
                continue
        return total
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(kids)
        frontier += kids
    total = 0
    for p in tree:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def run_case(case: Case, cfg: RunConfig) -> dict:
    """Run the case's command and judge it; the record lists the outcomes and failure patterns."""
    meta = case.dir / ".fuzz"
    tracer = cfg.resolved_tracer()
    env = dict(os.environ)
    env["PYTHONPATH"] = cfg.src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TMPDIR"] = str(case.dir / "tmp")
    for var in ("PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE"):
        env.pop(var, None)
    tool = [cfg.python, "-m", "onnx_bisect", *case.argv]
    if tracer == "strace":
        cmd = ["strace", "-f", "--seccomp-bpf", "-qq", "-y", "-e", f"trace={_STRACE_CALLS}",
               "-o", str(meta / "trace.log"), *tool]
    else:
        env["FUZZ_AUDIT_LOG"] = str(meta / "trace.log")
        cmd = [cfg.python, "-c", AUDIT_WRAPPER, *case.argv]
    before = snapshot(case.dir)
    t0 = time.monotonic()
    peak, hung, mem_killed = 0, False, False
    with open(meta / "stdout.txt", "wb") as out, open(meta / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=case.dir, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            if peak > cfg.mem_kill:
                mem_killed = True
            elif time.monotonic() - t0 > cfg.timeout:
                hung = True
            if hung or mem_killed:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                break
            time.sleep(0.1)
    duration = time.monotonic() - t0
    rc = proc.returncode
    after = snapshot(case.dir)
    stdout = (meta / "stdout.txt").read_bytes().decode("utf8", "replace")
    stderr = (meta / "stderr.txt").read_bytes().decode("utf8", "replace")
    trace = (meta / "trace.log").read_text("utf8", "replace") if (meta / "trace.log").exists() else ""
    if tracer == "strace":
        events, killed = parse_strace(trace, case.dir)
    else:
        events, killed = parse_audit(trace), []

    outcomes: list[str] = []
    patterns: list[tuple[str, str]] = []
    mname = case.spec.mutation
    if hung:
        outcomes.append("hang")
        patterns.append(("hang", f"{mname} [{case.spec.mode}]"))
    elif mem_killed:
        outcomes.append("memory")
        patterns.append(("memory", f"{mname} [{case.spec.mode}] killed above {cfg.mem_kill >> 20} MiB"))
    elif rc < 0 or killed:
        name = signal.Signals(-rc).name if rc < 0 and -rc in signal.Signals._value2member_map_ else str(killed[:1])
        outcomes.append("signal")
        patterns.append(("signal", f"{name} {mname}"))
    elif rc in ALLOWED_EXITS:
        outcomes.append(f"exit{rc}")
    else:
        outcomes.append("exit-other")
        last = (stderr.strip().splitlines() or [""])[-1][:120]
        patterns.append(("exit-other", f"exit {rc}: {re.sub(r'[0-9]+', '#', last)}"))
    if peak > cfg.mem_limit and not mem_killed:
        outcomes.append("memory")
        patterns.append(("memory", f"{mname} [{case.spec.mode}] peak {peak >> 20} MiB"))
    tbs = find_tracebacks(stderr + "\n" + stdout)
    if tbs:
        outcomes.append("traceback")
        patterns += [("traceback", k) for k in dict.fromkeys(tbs)]
    warns = find_warnings(stderr)
    if warns:
        outcomes.append("warning-leak")
        patterns += [("warning", w) for w in warns]
    matrix_quiet = case.spec.mode in ("matrix", "dataset") and not stderr.strip()  # its verdict is on stdout
    if rc == 2 and not hung and not matrix_quiet and not one_paragraph_error(stderr):
        outcomes.append("unclear-exit2")
        patterns.append(("unclear-exit2", f"{mname}: " + re.sub(r"[0-9]+", "#",
                                                                  (stderr.strip().splitlines() or [""])[0][:80])))

    case_real = os.path.realpath(case.dir)
    canary_real = os.path.realpath(case.canary)
    inside = {k: os.path.join(case_real, k) for k in ("model", "out", "tmp", ".fuzz")}
    outside_res = [re.compile(r) for r in case.outside]
    canary_hits, outside_hits, outside_writes, stray_writes = set(), set(), set(), set()
    for kind, path in events:
        in_case = path == case_real or path.startswith(case_real + os.sep)
        if kind == "R":
            if path == canary_real or path.startswith(canary_real + "."):
                canary_hits.add(path)
            elif (in_case and not any(path == d or path.startswith(d + os.sep) for d in inside.values())) \
                    or (any(r.search(path) for r in outside_res)
                        and re.sub(r"^/proc/\d+/", "/proc/self/", path) not in AMBIENT_READS):
                outside_hits.add(path)
        elif in_case:
            beside = os.path.dirname(path) == case_real  # the canary, or anything new beside the model folder
            if beside or path == inside["model"] or path.startswith(inside["model"] + os.sep):
                stray_writes.add(path)
        elif not _allowed_outside_write(path):
            outside_writes.add(path)
    if canary_hits:
        outcomes.append("canary-read")
        patterns.append(("canary-read", f"{mname}"))
    if outside_hits:
        outcomes.append("outside-read")
        patterns += [("outside-read", f"{mname}: {_norm_name(p)}") for p in sorted(outside_hits)]
    # the snapshot: leftovers and changes in the case folder
    temp_left, strays = [], []
    for rel in sorted(set(before) | set(after)):
        if rel in case.outputs:
            continue
        if before.get(rel) == after.get(rel):
            continue
        if rel in before and rel in after and before[rel][0] == "d" and after[rel][0] == "d":
            continue
        change = "new" if rel not in before else ("deleted" if rel not in after else "modified")
        if rel == "tmp" or rel.startswith("tmp" + os.sep):
            if rel.count(os.sep) == 1:  # a top-level entry of TMPDIR (what is inside a new folder goes with it)
                temp_left.append(f"{change} TMPDIR/{_norm_name(rel[4:])}")
        else:
            strays.append(f"{change} {_norm_name(rel)}")
    for path in stray_writes:
        rel = os.path.relpath(path, case_real)
        strays.append(f"written {_norm_name(rel)}")
    if strays:
        outcomes.append("stray-write")
        patterns += [("stray-write", s) for s in dict.fromkeys(strays)]
    if temp_left:
        outcomes.append("temp-leftover")
        patterns += [("temp-leftover", s) for s in dict.fromkeys(temp_left)]
    if outside_writes:
        outcomes.append("outside-write")
        patterns += [("outside-write", _norm_name(p)) for p in sorted(outside_writes)]
    # the --json report of a run that says it finished must exist and be strict JSON
    if rc in (0, 1) and not hung and not tbs:  # (a traceback's exit 1 writes no report: counted above)
        for out in case.outputs:
            if out.endswith(".json"):
                p = case.dir / out
                try:
                    json.loads(p.read_text(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
                except (OSError, ValueError) as exc:
                    outcomes.append("bad-json")
                    patterns.append(("bad-json", f"{type(exc).__name__}: {str(exc)[:60]}"))
    return {
        "index": case.spec.index, "seed": case.spec.seed, "mutation": mname,
        "category": MUTATIONS[mname].category, "variant": case.spec.variant, "mode": case.spec.mode,
        "input_format": case.spec.input_format, "detail": case.detail[:300], "skipped": case.skipped,
        "exit": rc, "duration": round(duration, 2), "peak_rss_mib": peak >> 20, "outcomes": outcomes,
        "patterns": patterns, "command": repro_command(case, cfg), "tracer": tracer,
        "stderr_tail": "\n".join(stderr.strip().splitlines()[-6:])[-1500:],
    }


def _allowed_outside_write(path: str) -> bool:
    if path in (os.devnull, "/dev/tty") or path.startswith(("/dev/pts/", "/proc/", "/dev/shm/sem.")):
        return True
    return "__pycache__" in path  # the interpreter's own bytecode cache of installed code


def check_source(cfg: RunConfig) -> str:
    """The ``onnx_bisect`` that runs must be the one under ``cfg.src`` (an editable install elsewhere could win)."""
    env = dict(os.environ, PYTHONPATH=cfg.src + (os.pathsep + os.environ["PYTHONPATH"]
                                                  if os.environ.get("PYTHONPATH") else ""))
    out = subprocess.run([cfg.python, "-c", "import onnx_bisect; print(onnx_bisect.__file__)"], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    path = out.stdout.strip()
    if out.returncode != 0 or not os.path.realpath(path).startswith(os.path.realpath(cfg.src) + os.sep):
        raise SystemExit(f"fuzz: onnx_bisect imports from {path or out.stderr.strip()[-300:]!r}, not from {cfg.src}")
    return path


def repro_command(case: Case, cfg: RunConfig) -> str:
    return (f"cd {shlex.quote(str(case.dir))} && TMPDIR=$PWD/tmp PYTHONPATH={shlex.quote(cfg.src)} "
            f"{shlex.quote(cfg.python)} -m onnx_bisect {' '.join(shlex.quote(a) for a in case.argv)}")


#: files the interpreter and its libraries read in every run, whatever the model says (libtorch reads its own
#: environment when it loads): a mutation pointing external data at one of them cannot be told from that by
#: the reads alone (the canary and /etc files test the confinement)
AMBIENT_READS = frozenset({"/proc/self/environ", "/proc/cpuinfo", "/dev/urandom", "/proc/self/maps",
                           "/proc/self/status", "/proc/self/stat"})

BAD_OUTCOMES = ("traceback", "hang", "signal", "exit-other", "canary-read", "outside-read", "stray-write",
                "temp-leftover", "outside-write", "warning-leak", "memory")
SOFT_OUTCOMES = ("unclear-exit2", "bad-json")


def is_bad(record: dict) -> bool:
    return any(o in BAD_OUTCOMES for o in record["outcomes"])


# ----------------------------------------------------------------------------------------------------------
# A run: many cases, the table, the patterns
# ----------------------------------------------------------------------------------------------------------

def build_applicable(spec: CaseSpec, root: Path, seeds: Path) -> Case:
    """``build_case``, moving to another seed variant when the mutation finds nothing to act on."""
    case = build_case(spec, root, seeds)
    if not case.skipped:
        return case
    mut = MUTATIONS[spec.mutation]
    others = [v for v in sorted(mut.variants or VARIANTS) if v != spec.variant]
    random.Random(spec.seed).shuffle(others)
    for variant in others:
        shutil.rmtree(case.dir, ignore_errors=True)
        case = build_case(CaseSpec(spec.index, spec.seed, spec.mutation, variant, spec.mode, spec.input_format),
                          root, seeds)
        if not case.skipped:
            return case
    return case


def execute(spec: CaseSpec, root: Path, seeds: Path, cfg: RunConfig) -> tuple[dict, Case]:
    """Build and run one case; the record and the case (its folder still on disk)."""
    case = build_applicable(spec, root, seeds)
    if case.skipped:
        return {"index": spec.index, "seed": spec.seed, "mutation": spec.mutation, "variant": case.spec.variant,
                "category": MUTATIONS[spec.mutation].category, "mode": spec.mode, "outcomes": ["skipped"],
                "patterns": [], "detail": case.skipped, "exit": None}, case
    return run_case(case, cfg), case


COLUMNS = (("n", None), ("e0", "exit0"), ("e1", "exit1"), ("e2", "exit2"), ("e3", "exit3"),
           ("other", "exit-other"), ("tb", "traceback"), ("hang", "hang"), ("sig", "signal"),
           ("canary", "canary-read"), ("outrd", "outside-read"), ("stray", "stray-write"),
           ("tmp", "temp-leftover"), ("outwr", "outside-write"), ("warn", "warning-leak"), ("mem", "memory"),
           ("unclr2", "unclear-exit2"), ("badjs", "bad-json"), ("skip", "skipped"), ("ferr", "fuzzer-error"))


def summarize(records: list[dict]) -> dict:
    table: dict[str, Counter] = defaultdict(Counter)
    by_category: dict[str, Counter] = defaultdict(Counter)
    total: Counter = Counter()
    for r in records:
        for c in (table[r["mutation"]], by_category[r["category"]], total):
            c["n"] += 1
            c.update(set(r["outcomes"]))
    patterns: dict[tuple[str, str], dict] = {}
    for r in records:
        for cat, key in r["patterns"]:
            entry = patterns.setdefault((cat, key), {"category": cat, "key": key, "count": 0,
                                                     "mutations": Counter(), "modes": Counter(), "examples": []})
            entry["count"] += 1
            entry["mutations"][r["mutation"]] += 1
            entry["modes"][r["mode"]] += 1
            if len(entry["examples"]) < 2:
                entry["examples"].append({k: r.get(k) for k in ("index", "seed", "mutation", "variant", "mode",
                                                                 "detail", "exit", "command", "stderr_tail",
                                                                 "kept")})
    order = {c: i for i, c in enumerate(("traceback", "hang", "signal", "exit-other", "memory", "canary-read",
                                         "outside-read", "stray-write", "temp-leftover", "outside-write",
                                         "warning", "unclear-exit2", "bad-json"))}
    plist = sorted(patterns.values(), key=lambda e: (order.get(e["category"], 99), -e["count"], e["key"]))
    for e in plist:
        e["mutations"], e["modes"] = dict(e["mutations"].most_common()), dict(e["modes"].most_common())
    return {"total": dict(total), "by_mutation": {k: dict(v) for k, v in sorted(table.items())},
            "by_category": {k: dict(v) for k, v in sorted(by_category.items())}, "patterns": plist,
            "bad_cases": sum(1 for r in records if "outcomes" in r and is_bad(r))}


def render_table(summary: dict) -> str:
    head = f"{'mutation':<26}" + "".join(f"{h:>7}" for h, _ in COLUMNS)
    lines = [head, "-" * len(head)]

    def row(name, c):
        return f"{name:<26}" + "".join(f"{c.get(key or 'n', 0) or '.':>7}" for _, key in COLUMNS)

    for name, c in summary["by_mutation"].items():
        lines.append(row(name, c))
    lines.append("-" * len(head))
    for name, c in summary["by_category"].items():
        lines.append(row(f"[{name}]", c))
    lines.append(row("TOTAL", summary["total"]))
    return "\n".join(lines)


def render_patterns(summary: dict, limit: int = 200) -> str:
    lines = []
    for e in summary["patterns"][:limit]:
        muts = ", ".join(f"{k}:{v}" for k, v in list(e["mutations"].items())[:6])
        lines.append(f"[{e['category']}] x{e['count']}  {e['key']}\n    mutations: {muts}")
        for ex in e["examples"][:1]:
            lines.append(f"    e.g. case {ex['index']} ({ex['variant']}, {ex['mode']}; {ex['detail'][:120]}) "
                         f"exit {ex['exit']}")
            lines.append(f"    $ {ex['command']}")
    return "\n".join(lines)


def sample_specs() -> list[CaseSpec]:
    """The fixed sample of the test suite (18 cases, about 45 s with two at a time): every category once, the
    path traversals in their five forms (``../``, ``../../CASE/``, absolute, a file symlink, a directory symlink)
    and a system file."""
    rows = [  # mutation, variant, mode, input format, case seed (the seed picks the mutation's parameters)
        ("none", "mlp.dynamo", "main", "npy", 1000),
        ("huge_length_prefix", "cnn.dynamo", "coverage", "npy", 1014),  # graph.output claims 2 GiB
        ("cycle", "cnn.torchscript", "main", "npy", 1004),  # Gemm reads its own output
        ("attr_softmax_axis", "mlp.dynamo", "main", "npy", 1000),  # axis -99
        ("subgraph_broken", "cond.dynamo", "coverage", "npy", 1010),  # else_branch loses its output
        ("ext_offset_length", "mlp.ext", "main", "npy", 1005),  # offset 2**62
        ("ext_traversal_relative", "mlp.ext", "main", "npy", 1005),  # ../canary.txt
        ("ext_traversal_relative", "cnn.ext", "coverage", "npy", 1001),  # ../../CASE/canary.txt
        ("ext_traversal_absolute", "cnn.ext", "reference", "npy", 1001),  # /abs/CASE/canary.txt, every weight
        ("ext_symlink", "mlp.ext", "coverage", "npy", 1001),  # model/link.bin -> ../canary.txt
        ("ext_symlink", "cnn.ext", "main", "npy", 1000),  # model/up -> .., location up/canary.txt
        ("ext_system_file", "mlp.ext", "main", "npy", 1001),  # /etc/passwd
        ("input_elem_type", "mlp.dynamo", "main", "npy", 1009),  # graph input x declares elem_type 99
        ("npy_values", "mlp.dynamo", "main", "npy", 1015),  # an input of 1e20s: the statistics overflow
        ("npy_header_shape", "mlp.dynamo", "main", "npy", 1012),  # header claims (10**12,)
        ("npy_object_pickle", "mlp.dynamo", "main", "npy", 1001),
        ("pt_malicious_pickle", "cnn.dynamo", "main", "pt", 1000),  # data.pkl replaced by a payload
        ("npz_names", "mlp.dynamo", "reference", "npz", 1012),  # array named y, the input is x
    ]
    return [CaseSpec(900 + i, seed, m, v, mode, fmt) for i, (m, v, mode, fmt, seed) in enumerate(rows)]


def _keep(spec: CaseSpec, keep_dir: Path, seeds: Path, ran: Case, record: dict, cfg: RunConfig) -> str:
    """Rebuild the case, unrun, under ``keep_dir`` (same files, same absolute canary path), with the run's logs."""
    case = build_applicable(spec, keep_dir, seeds)
    logs = case.dir / ".fuzz" / "run"
    shutil.copytree(ran.dir / ".fuzz", logs, ignore=shutil.ignore_patterns("run"), dirs_exist_ok=True)
    (logs / "record.json").write_text(json.dumps(record, indent=1, default=str))
    repro = case.dir / ".fuzz" / "repro.sh"
    repro.write_text("#!/bin/sh\n# re-runs the case from its pristine files (outputs go to out/, TMPDIR to tmp/)\n"
                     f"cd \"$(dirname \"$0\")/..\" && TMPDIR=$PWD/tmp PYTHONPATH={shlex.quote(cfg.src)} "
                     f"exec {shlex.quote(cfg.python)} -m onnx_bisect "
                     + " ".join(shlex.quote(a) for a in case.argv) + "\n")
    repro.chmod(0o755)
    return str(case.dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", type=int, default=200, help="number of cases (default 200)")
    p.add_argument("--seed", type=int, default=0, help="master seed: case i of seed s is always the same case")
    p.add_argument("--start", type=int, default=0, help="index of the first case")
    p.add_argument("--case", type=int, action="append", help="run only this case index (repeatable)")
    p.add_argument("--sample", action="store_true", help="run the fixed sample of the test suite instead")
    p.add_argument("--mutation", action="append", help="only these mutations (comma-separated, repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    p.add_argument("--out", default="fuzz-results.json", help="results JSON (default fuzz-results.json)")
    p.add_argument("--work-dir", default="/tmp/fuzz/work", help="where cases are built and run")
    p.add_argument("--seeds-dir", default="/tmp/fuzz/seeds", help="where the seed models are built (once)")
    p.add_argument("--keep", action="store_true", help="keep every failing case (rebuilt unrun in --keep-dir)")
    p.add_argument("--keep-per-pattern", type=int, default=0, metavar="N",
                   help="keep at most N failing cases per failure pattern")
    p.add_argument("--keep-dir", default="/tmp/fuzz/keep", help="folder of kept cases (default /tmp/fuzz/keep)")
    p.add_argument("--src", default=str(REPO / "src"), help="onnx_bisect source dir put first on PYTHONPATH")
    p.add_argument("--python", default=sys.executable, help="interpreter running the tool")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    p.add_argument("--mem-limit-mb", type=int, default=3072, help="peak RSS flagged above this (MiB)")
    p.add_argument("--mem-kill-mb", type=int, default=6144, help="the case is killed above this (MiB)")
    p.add_argument("--tracer", choices=["auto", "strace", "audit"], default="auto")
    p.add_argument("--list", action="store_true", help="list the mutations and exit")
    p.add_argument("--_build-seeds", dest="build_seeds", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.build_seeds:
        build_seeds(Path(args.build_seeds))
        return 0
    if args.list:
        for m in MUTATIONS.values():
            doc = (m.fn.__doc__ or "").strip().splitlines()
            print(f"{m.name:<26} {m.kind:<6} {m.category:<15} {doc[0] if doc else ''}")
        return 0
    only = [n for group in args.mutation or [] for n in group.split(",") if n]
    unknown = [n for n in only if n not in MUTATIONS]
    if unknown:
        p.error(f"unknown mutation(s) {unknown}; see --list")
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = 2 << 30  # no case may write a file over 2 GiB (disk is shared)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    cfg = RunConfig(python=args.python, src=str(Path(args.src).resolve()), timeout=args.timeout,
                    mem_limit=args.mem_limit_mb << 20, mem_kill=args.mem_kill_mb << 20, tracer=args.tracer)
    check_source(cfg)
    seeds = ensure_seeds(Path(args.seeds_dir), args.python)
    work, keep_dir = Path(args.work_dir), Path(args.keep_dir)
    work.mkdir(parents=True, exist_ok=True)
    if args.sample:
        specs = sample_specs()
    else:
        indices = args.case or range(args.start, args.start + args.cases)
        specs = [make_spec(args.seed, i, only or None) for i in indices]
    print(f"fuzz: {len(specs)} cases, seed {args.seed}, {args.jobs} job(s), tracer {cfg.resolved_tracer()}, "
          f"src {cfg.src}", file=sys.stderr)
    records: list[dict] = []
    kept: Counter = Counter()
    lock = threading.Lock()
    started = time.monotonic()

    def one(spec: CaseSpec) -> None:
        try:
            record, case = execute(spec, work, seeds, cfg)
        except Exception as exc:  # noqa: BLE001 - a fuzzer bug must not stop the run; it is counted
            import traceback

            record = {"index": spec.index, "seed": spec.seed, "mutation": spec.mutation, "variant": spec.variant,
                      "category": MUTATIONS[spec.mutation].category, "mode": spec.mode,
                      "outcomes": ["fuzzer-error"],
                      "patterns": [("fuzzer-error", f"{type(exc).__name__}: {exc}"[:200])],
                      "detail": traceback.format_exc()[-1500:], "exit": None}
            with lock:
                records.append(record)
            return
        try:
            keep = False
            with lock:
                if "skipped" not in record["outcomes"] and is_bad(record):
                    keys = [tuple(pt) for pt in record["patterns"]]
                    if args.keep or any(kept[k] < args.keep_per_pattern for k in keys):
                        keep = True
                        for k in keys:
                            kept[k] += 1
            if keep:
                record["kept"] = _keep(case.spec, keep_dir, seeds, case, record, cfg)
                record["command"] = repro_command(Case(case.spec, Path(record["kept"]), case.argv, case.outputs,
                                                       case.detail, case.outside, case.canary), cfg)
        finally:
            shutil.rmtree(case.dir, ignore_errors=True)
        with lock:
            records.append(record)
            done = len(records)
            if done % 25 == 0 or done == len(specs):
                bad = sum(1 for r in records if "outcomes" in r and is_bad(r))
                print(f"fuzz: {done}/{len(specs)} cases, {bad} with a bad outcome, "
                      f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for f in [pool.submit(one, s) for s in specs]:
            f.result()
    records.sort(key=lambda r: r["index"])
    summary = summarize(records)
    result = {"meta": {"seed": args.seed, "cases": len(records), "jobs": args.jobs, "src": cfg.src,
                       "python": cfg.python, "timeout": cfg.timeout, "tracer": cfg.resolved_tracer(),
                       "mem_limit_mb": args.mem_limit_mb, "seconds": round(time.monotonic() - started, 1)},
              "summary": summary, "cases": records}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(render_table(summary))
    print()
    print(render_patterns(summary))
    print(f"\nfuzz: {summary['bad_cases']} of {len(records)} cases with a bad outcome; results in {args.out}")
    return 1 if summary["bad_cases"] else 0


if __name__ == "__main__":
    sys.exit(main())
