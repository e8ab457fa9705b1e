"""The coverage job: the only module that knows the order of the triage stages.

source (.py: load + both exporters; .onnx: open) -> validate -> inventory ->
kernels -> placement -> opset -> risks -> classify -> CoverageReport.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import onnx
import onnx.inliner

from ..coverage.classify import classify_node
from ..coverage.export_problems import problems_from_exception
from ..coverage.export_triage import (attempt, is_translation_failure, specialisations, translation_problems,
                                      untranslatable)
from ..coverage.inventory import take_inventory
from ..coverage.kernels import check_kernel
from ..coverage.opset import opset_need
from ..coverage.placement import confirm_placement
from ..coverage.providers import resolve_providers
from ..coverage.records import CoverageConfig, CoverageReport, ExportProblem, ProviderInfo, RegistryState
from ..coverage.risks import assess_risks
from ..coverage.validate import validate_model
from ..errors import OnnxLoadError, UsageError
from ..records import ModelInputs
from ..source import export, onnx_file
from ..source.weights import split_weights


def triage(target: str, inputs: tuple[str, ...] = (), providers: tuple[str, ...] = ("CPUExecutionProvider",),
           opset: int | None = None, confirm: bool = True) -> CoverageReport:
    """Triage a .py model (exported with both exporters) or an .onnx file; see ``CoverageReport``."""
    return run_coverage(CoverageConfig(target=target, inputs=tuple(inputs), providers=tuple(providers),
                                       opset=opset, confirm=confirm))


def run_coverage(config: CoverageConfig) -> CoverageReport:
    """Triage ``config.target`` (a .py model or an .onnx file) against the requested providers."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    providers = resolve_providers(config.providers)
    if config.opset is not None and not 1 <= config.opset <= onnx.defs.onnx_opset_version():
        raise UsageError(f"--opset {config.opset} is not an ONNX opset; onnx {onnx.__version__} knows 1 to "
                         f"{onnx.defs.onnx_opset_version()}.")
    path = Path(config.target.split(":")[0] if not Path(config.target).exists() else config.target)
    if path.suffix.lower() == ".onnx":
        if config.inputs:
            raise UsageError("--input applies to a .py model; an ONNX file's triage needs no inputs.")
        opened = onnx_file.load_onnx(str(path), check="the path")
        skeleton, weights = opened.proto, opened.weights
        exports, source = (), "the given file"
    elif path.suffix.lower() == ".py":
        exports, proto, source = _export(config)
        timings["export"] = round(time.perf_counter() - start, 4)
        if proto is None:
            return CoverageReport(target=config.target, exports=exports, onnx_source="", validation=None,
                                  providers=providers, placement=None, findings=(), opset_target=config.opset,
                                  versions=_versions(), timings=timings)
        skeleton, weights = split_weights(proto)
    else:
        raise UsageError(f"'{config.target}' is neither a .py model nor an .onnx file. Pass MODEL.py[:NAME] or "
                         "MODEL.onnx.")
    report = triage_onnx(skeleton, weights, providers, config, timings)
    return CoverageReport(target=config.target, exports=exports, onnx_source=source, versions=_versions(), **report)


def triage_onnx(skeleton: onnx.ModelProto, weights, providers: tuple[ProviderInfo, ...], config: CoverageConfig,
                timings: dict[str, float]) -> dict:
    """The ONNX side: the report's fields from validation on."""
    tick = time.perf_counter()
    if skeleton.functions:
        try:  # as ONNX Runtime does before placing nodes
            skeleton = onnx.inliner.inline_local_functions(skeleton)
        except (onnx.checker.ValidationError, RecursionError, ValueError) as exc:  # a function that calls itself
            raise OnnxLoadError(f"The model's local functions cannot be inlined ({str(exc).splitlines()[0][:200]}): "
                                "a function calls itself or is malformed. Re-export the model.") from exc
    validation, inferred = validate_model(skeleton)
    tick = _lap(timings, "validate", tick)
    inventory = take_inventory(inferred, original=skeleton)
    cache: dict[tuple, tuple] = {}
    verdicts = []
    for node in inventory.nodes:
        key = (node.signature, node.type_bindings, node.has_function)
        if key not in cache:
            cache[key] = tuple(check_kernel(node, p) for p in providers)
        verdicts.append(cache[key])
    tick = _lap(timings, "kernels", tick)
    # Nodes the registry says nothing can run are cut out of the full-model session and probed alone;
    # a provider without a static registry may still claim them, so those stay in.
    undecided = {p.name for p in providers if p.state is RegistryState.NO_STATIC_REGISTRY}
    suspects = {n.key for n, ks in zip(inventory.nodes, verdicts)
                if not any(k.verdict.runs or k.provider in undecided for k in ks)}
    placement = confirm_placement(skeleton, weights, inventory, providers, suspects) if config.confirm else None
    tick = _lap(timings, "placement", tick)
    findings = tuple(
        classify_node(node, ks, providers, placement,
                      opset_need(node, config.opset) if config.opset is not None else None,
                      assess_risks(node, inventory))
        for node, ks in zip(inventory.nodes, verdicts))
    _lap(timings, "classify", tick)
    return dict(validation=validation, providers=providers, placement=placement, findings=findings,
                opset_target=config.opset, timings=timings)


def _export(config: CoverageConfig):
    from ..source.load import load_inputs, load_model

    loaded, module = load_model(config.target)
    inputs = load_inputs(config.inputs, loaded, module)
    exports, protos = triage_export(loaded.module, inputs, loaded.source, file_module=module)
    for name in ("dynamo", "torchscript"):
        if name in protos:
            return exports, protos[name], f"the {name} export"
    return exports, None, ""


def triage_export(model, inputs: ModelInputs, user_file: str | None = None, file_module=None):
    """Export ``model`` with both exporters; return what each did (``ExportAttempt``s) and the ONNX models
    that came out, by exporter name.

    ``file_module`` is the imported model file: strict torch.export re-imports
    the model's module by name, so it is registered in ``sys.modules`` meanwhile.
    """
    model.eval()
    attempts, protos = [], {}
    for name, run in (("dynamo", _try_dynamo), ("torchscript", _try_torchscript)):
        start = time.perf_counter()
        with export.importable(file_module):
            proto, problems = run(model, inputs, user_file)
        attempts.append(attempt(name, proto, problems, time.perf_counter() - start))
        if proto is not None:
            protos[name] = proto
    return tuple(attempts), protos


def _try_dynamo(model, inputs: ModelInputs, user_file: str | None):
    program, exc = export.capture_program(model, inputs)
    if program is None:
        return None, problems_from_exception("dynamo", exc, user_file)
    try:
        return export.translate_program(program), []
    except Exception as exc:  # the exporter raises a zoo of types
        with export.quiet():
            return None, translation_problems(program, exc, user_file)


def _try_torchscript(model, inputs: ModelInputs, user_file: str | None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            proto = export.export_torchscript(model, inputs, silence_warnings=False)
        except Exception as exc:  # noqa: BLE001 - every failure is triaged
            return None, problems_from_exception("torchscript", exc, user_file,
                                                 trace_graph=export.trace_graph(model, inputs))
    return proto, specialisations(caught)


def explain_export_failures(model, inputs: ModelInputs, failures, user_file: str | None = None
                            ) -> list[ExportProblem]:
    """The problems behind each exporter failure in ``failures``: operator, source line, message.

    ``failures`` holds ``(Exporter, exception)`` pairs as the main job's
    export stage collected them; only a light re-capture runs, to find the
    source line of a dynamo translation failure.
    """
    problems: list[ExportProblem] = []
    for exporter, exc in failures:
        name = getattr(exporter, "value", str(exporter))
        if name == "dynamo" and is_translation_failure(exc):
            program = export.capture_program(model, inputs)[0]
            with export.quiet():
                listed = untranslatable(program, user_file) if program is not None else []
            if listed:
                problems.extend(listed)
                continue
        graph = export.trace_graph(model, inputs) if name == "torchscript" else None
        problems.extend(problems_from_exception(name, exc, user_file, trace_graph=graph))
    return problems


def _versions() -> tuple[tuple[str, str], ...]:
    import onnxruntime

    return (("onnx", onnx.__version__), ("onnxruntime", onnxruntime.__version__))


def _lap(timings: dict[str, float], stage: str, since: float) -> float:
    now = time.perf_counter()
    timings[stage] = round(now - since, 4)
    return now
