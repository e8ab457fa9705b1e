"""Export stage: PyTorch model -> ONNX ModelProto (or load the user's ONNX file)."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import warnings
from pathlib import Path

import onnx
import torch
from torch.utils._pytree import tree_map_only

from ..errors import ExportError, OnnxLoadError
from ..records import Exporter, ExportedModel, LoadedModel, ModelInputs
from .weights import split_weights_from_file


def export_model(
    loaded: LoadedModel, inputs: ModelInputs, exporter: Exporter | None = None, opset: int | None = None,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
) -> ExportedModel:
    """Export with the dynamo exporter, falling back to TorchScript when it fails.

    ``exporter`` forces one path (no fallback).  The model is exported in eval mode.
    ``dynamic_axes`` (``{input name: {axis: dimension name}}``) leaves those
    dimensions free: dynamic shapes for the dynamo exporter, ``dynamic_axes``
    for the TorchScript one.  Export from example sizes of at least 2 there
    (``torch.export`` specializes sizes 0 and 1).
    """
    model = loaded.module
    model.eval()
    # The TorchScript tracer runs the model on the inputs it is given; a forward
    # that modifies its arguments in place would change the tensors that later
    # become the ONNX feeds.
    inputs = ModelInputs(*tree_map_only(torch.Tensor, torch.Tensor.clone, (inputs.args, inputs.kwargs)), inputs.names)
    order = [exporter] if exporter else [Exporter.DYNAMO, Exporter.TORCHSCRIPT]
    failures: list[tuple[Exporter, BaseException]] = []
    for which in order:
        try:
            proto, program = _export_dynamo(model, inputs, opset, dynamic_axes) if which is Exporter.DYNAMO else \
                (_export_torchscript(model, inputs, opset, dynamic_axes), None)
        except Exception as exc:  # exporters raise a zoo of types
            failures.append((which, exc))
            continue
        notes = tuple(
            f"The {w.value} exporter failed ({_summarise(e)}); fell back to the {which.value} exporter."
            for w, e in failures
        )
        return ExportedModel(proto=proto, exporter=which, opset=opset_of(proto), notes=notes, program=program)
    raise ExportError(_export_failure_message(failures) + _triage(loaded, inputs, failures)) from failures[-1][1]


def _triage(loaded: LoadedModel, inputs: ModelInputs, failures) -> str:
    """The coverage triage of the failures: operator, source line, exporter message ("" when it cannot tell)."""
    try:
        from ..coverage.export_triage import explain_export_failures

        lines = explain_export_failures(loaded.module, inputs, [(w.value, e) for w, e in failures], loaded.source)
    except Exception:  # the triage must never hide the export error itself
        return ""
    return f" What could not be exported: {'; '.join(lines)}. Run `onnx-bisect coverage {loaded.source}` for the " \
        "full triage." if lines else ""


def _export_dynamo(model, inputs: ModelInputs, opset: int | None, dynamic_axes=None):
    """``(ONNX model, torch.export ExportedProgram)`` from the dynamo exporter."""
    shapes = None
    if dynamic_axes:
        # keyed by forward parameter name, as torch.export matches them to the signature;
        # every argument given needs an entry (None: static)
        given = list(inputs.names) + list(inputs.kwargs)
        shapes = {name: ({axis: torch.export.Dim.DYNAMIC for axis in dynamic_axes[name]} if name in dynamic_axes
                         else None) for name in given}
    with _quiet():
        program = torch.onnx.export(
            model, tuple(inputs.args), kwargs=dict(inputs.kwargs) or None, dynamo=True,
            opset_version=opset, verbose=False, report=False, dynamic_shapes=shapes,
        )
    return program.model_proto, program.exported_program


class _KeywordAdapter(torch.nn.Module):
    """Calls the wrapped model with keyword arguments.

    The TorchScript tracer passes positional arguments only, which some models
    (transformers' decorated forwards) reject; exporting through this adapter
    prefixes every scope name with ``model/``, which alignment tolerates.
    """

    def __init__(self, model, names):
        super().__init__()
        self.model = model
        self._names = tuple(names)

    def forward(self, *args):
        return self.model(**dict(zip(self._names, args)))


def _export_torchscript(model, inputs: ModelInputs, opset: int | None, dynamic_axes=None) -> onnx.ModelProto:
    args = tuple(inputs.args) + ((dict(inputs.kwargs),) if inputs.kwargs else ())
    naming = {}
    if dynamic_axes:
        if inputs.kwargs or not all(isinstance(a, torch.Tensor) for a in inputs.args):
            raise ExportError("The TorchScript exporter can mark dynamic axes only for plain positional tensor "
                              "inputs; pass the inputs positionally or use the dynamo exporter.")
        # graph inputs named after the forward parameters, so dynamic_axes can name them
        naming = {"input_names": list(inputs.names), "dynamic_axes": {n: dict(a) for n, a in dynamic_axes.items()}}
    try:
        return _trace(model, args, opset, **naming)
    except TypeError:
        if inputs.kwargs:
            raise
        return _trace(_KeywordAdapter(model, inputs.names), tuple(inputs.args), opset, **naming)


def _trace(model, args, opset, **naming):
    buffer = io.BytesIO()
    with _quiet():
        torch.onnx.export(model, args, buffer, dynamo=False, opset_version=opset or 17, **naming)
    return onnx.load_from_string(buffer.getvalue())


@contextlib.contextmanager
def _quiet():
    """Silence the exporters' progress prints and warnings; errors still raise."""
    sink = io.StringIO()
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), _native_stderr_silenced():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


@contextlib.contextmanager
def _native_stderr_silenced():
    """Point file descriptor 2 at /dev/null for the duration.

    torch 2.x's TorchScript exporter leaves its C++ ONNX log switched on
    (``setup_onnx_logging`` tests the function ``_jit_is_onnx_log_enabled``
    instead of calling it) and, when an operator fails to convert, dumps the
    whole TorchScript graph to the buffered C++ ``std::cout``, which reaches our
    stdout at exit.  Route that log to the unbuffered C++ stderr and silence it
    here; Python-level redirection cannot catch either stream.
    """
    route_log = getattr(torch._C, "_jit_set_onnx_log_output_stream", None)
    if route_log is not None:
        route_log("stderr")
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (some embedded interpreters)
        yield
        return
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OPERATOR = re.compile(r"(aten::\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?|torch\.ops\.[\w.]+)")


def _summarise(exc: BaseException) -> str:
    """One line: the innermost cause (the exporters wrap it in generic "next steps" text) and the operator."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    root = chain[-1]
    text = _ANSI.sub("", str(root)).strip() or type(root).__name__
    first = text.splitlines()[0][:300]
    op = _OPERATOR.search(" ".join(_ANSI.sub("", str(e)) for e in chain))
    return f"{type(root).__name__}: {first}" + (f" [operator {op.group(1)}]" if op and op.group(1) not in first else "")


def _export_failure_message(failures) -> str:
    parts = "; ".join(f"{w.value}: {_summarise(e)}" for w, e in failures)
    return (
        f"Exporting the model to ONNX failed ({parts}). Rewrite the failing operator with "
        "exportable PyTorch ops, register a custom symbolic/translation for it, or export "
        "the model yourself and pass the file with --onnx."
    )


def opset_of(proto: onnx.ModelProto) -> int:
    """The default-domain opset a model imports (0 when none)."""
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def load_onnx(path: str) -> ExportedModel:
    """Load the user's ONNX file read-only, its weights memory-mapped (see ``weights``)."""
    p = Path(path)
    if not p.is_file():
        raise OnnxLoadError(f"ONNX file '{p}' does not exist. Check the --onnx path.")
    try:
        skeleton, store = split_weights_from_file(str(p))
    except Exception as exc:
        raise OnnxLoadError(
            f"'{p}' is not a loadable ONNX model ({type(exc).__name__}: {str(exc).strip()[:200]}). "
            "Check that the file is complete and that its external data files sit beside it."
        ) from exc
    if not skeleton.graph.node:
        raise OnnxLoadError(f"'{p}' loads but its graph has no nodes. Pass the exported model file.")
    return ExportedModel(proto=skeleton, exporter=Exporter.GIVEN, opset=opset_of(skeleton), path=str(p),
                         weights=store)


def validate_onnx(proto: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """Run ``onnx.checker`` and shape inference; return a copy carrying the inferred types.

    Dimensions the graph leaves free stay symbolic, so the copy runs at any
    size the graph allows (see :func:`pin_shapes` for concrete shapes).
    Pass a model whose large initializers were split off (see ``weights``): the
    checker and shape inference then run in milliseconds instead of seconds.
    """
    view = checkable_view(proto)
    try:
        onnx.checker.check_model(view)
    except onnx.checker.ValidationError as exc:
        # An op the onnx package has no schema for is the runtime's business: ONNX Runtime
        # writes its own fused ops (SimplifiedLayerNormalization, in the default domain) into
        # the files it optimizes offline.  The session decides whether it loads; preflight
        # reports the checker's complaint as a warning.
        if not _unknown_op(exc):
            raise OnnxLoadError(
                f"{where} does not pass onnx.checker: {str(exc).strip().splitlines()[0][:300].rstrip('.')}. "
                "Re-export the model or repair the reported node."
            ) from exc
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.graph.ClearField("value_info")
    out.graph.value_info.extend(_infer(view, where).graph.value_info)
    return out


def _unknown_op(exc: Exception) -> bool:
    """Whether a checker error only says that some node's op has no schema in the onnx package."""
    return str(exc).strip().startswith("No Op registered for")


def pin_shapes(skeleton: onnx.ModelProto, input_shapes: dict, where: str) -> onnx.ModelProto:
    """A copy of ``skeleton`` whose value infos are inferred with the inputs' free dimensions
    pinned to ``input_shapes``, so intermediate shapes are concrete (for indexing, not for running)."""
    view = checkable_view(skeleton)
    for inp in view.graph.input:
        shape = input_shapes.get(inp.name)
        if shape is not None and len(shape) == len(inp.type.tensor_type.shape.dim):
            for dim, size in zip(inp.type.tensor_type.shape.dim, shape):
                dim.Clear()
                dim.dim_value = int(size)
    out = onnx.ModelProto()
    out.CopyFrom(skeleton)
    out.graph.ClearField("value_info")
    out.graph.value_info.extend(_infer(view, where).graph.value_info)
    return out


def _infer(view: onnx.ModelProto, where: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(view, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise OnnxLoadError(f"Shape inference failed on {where}: {str(exc)[:300]}.") from exc


def checkable_view(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy in which initializers whose data lives elsewhere are typed graph inputs.

    ``onnx.checker`` insists that external data files exist; a split-off
    initializer (see ``weights``) has none, but as a typed input it checks and
    infers exactly the same.
    """
    view = onnx.ModelProto()
    view.CopyFrom(proto)
    external = [i for i in view.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return view
    keep = [i for i in view.graph.initializer if i.data_location != onnx.TensorProto.EXTERNAL]
    declared = {i.name for i in view.graph.input}
    for init in external:
        if init.name not in declared:
            view.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    view.graph.ClearField("initializer")
    view.graph.initializer.extend(keep)
    return view
