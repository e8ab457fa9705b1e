"""The coverage pipeline; the only module that knows the order of the triage stages.

source (.py: load + export triage; .onnx: load) -> validate -> inventory ->
kernels -> placement -> opset -> risks -> classify -> CoverageReport.
"""
from __future__ import annotations

import time
from pathlib import Path

import onnx
import onnx.inliner

from ..errors import OnnxLoadError, UsageError
from ..source.weights import split_weights, split_weights_from_file
from .classify import classify_node
from .inventory import take_inventory
from .kernels import check_kernel
from .opset import opset_need
from .placement import confirm_placement
from .providers import resolve_providers
from .records import CoverageConfig, CoverageReport, ProviderInfo, RegistryState
from .risks import assess_risks
from .validate import validate_model


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
        skeleton, weights = open_onnx(str(path))
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


def open_onnx(path: str):
    """The file's graph skeleton and memory-mapped weights; OnnxLoadError when it is not a loadable model."""
    p = Path(path)
    if not p.is_file():
        raise OnnxLoadError(f"ONNX file '{p}' does not exist. Check the path.")
    try:
        skeleton, weights = split_weights_from_file(str(p))
    except Exception as exc:
        raise OnnxLoadError(
            f"'{p}' is not a loadable ONNX model ({type(exc).__name__}: {str(exc).strip()[:200]}). "
            "Check that the file is complete and that its external data files sit beside it."
        ) from exc
    if not skeleton.graph.node:
        raise OnnxLoadError(f"'{p}' loads but its graph has no nodes. Pass the exported model file.")
    return skeleton, weights


def triage_onnx(skeleton: onnx.ModelProto, weights, providers: tuple[ProviderInfo, ...], config: CoverageConfig,
                timings: dict[str, float]) -> dict:
    """The ONNX side: the report's fields from validation on."""
    tick = time.perf_counter()
    if skeleton.functions:
        skeleton = onnx.inliner.inline_local_functions(skeleton)  # as ONNX Runtime does before placing nodes
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
    from .export_triage import triage_export

    loaded, module = load_model(config.target)
    inputs = load_inputs(config.inputs, loaded, module)
    exports, protos = triage_export(loaded.module, inputs, loaded.source, file_module=module)
    for name in ("dynamo", "torchscript"):
        if name in protos:
            return exports, protos[name], f"the {name} export"
    return exports, None, ""


def _versions() -> tuple[tuple[str, str], ...]:
    import onnxruntime

    return (("onnx", onnx.__version__), ("onnxruntime", onnxruntime.__version__))


def _lap(timings: dict[str, float], stage: str, since: float) -> float:
    now = time.perf_counter()
    timings[stage] = round(now - since, 4)
    return now
