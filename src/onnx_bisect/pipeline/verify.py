"""Verify: one model over the configurations that ship — input cases × runtime settings — as one matrix.

The model is exported once (dynamic axes marked for the dimensions that vary),
the graph is indexed and aligned once, on the template case (the sample), and
every runtime setting keeps its ONNX Runtime sessions across all input cases.
Each configuration is then one PyTorch capture (shared by the runtime
settings) and one run of the unmodified model plus one instrumented run; the
local run and the diagnosis are paid only where a configuration diverges.
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import BackendError, InputError, UsageError
from ..measure import compare
from ..report.progress import Progress
from ..run.backend import available_providers, make_backend
from ..source import feeds, load
from . import configurations
from .case import CaseRun, bisect_case, paired_tensors
from .verdict import compare_outputs
from .config import CasePolicy, Config, DiagnosisMemo
from .prepare import Prepared, capture_case, loaded_from_module, obtain_onnx, prepare, weight_warnings
from .workspace import workspace
from .runner import Runner
from ..records import (OptLevel, CaseKind, ConfigResult, ConfigStatus, Exporter, InputCase, LayerAggregate, LayerError,
                      LoadedModel, MatrixReport, ModelInputs, ProviderAgreement, RuntimeSettings, Status, Tolerance)
from .specs import AxisSpec, parse_vary

#: the per-layer percentile reported over a dataset's samples
PERCENTILE = 99.0


@dataclass(frozen=True)
class Plan:
    """What a verification runs: the input cases, the runtime settings, and which are unavailable."""

    cases: tuple[InputCase, ...]
    runtimes: tuple[RuntimeSettings, ...]
    unavailable: dict[RuntimeSettings, str]  # runtime → why it cannot run here
    notes: tuple[str, ...] = ()


def run(config: Config, progress: Progress | None = None) -> MatrixReport:
    """Load the model, its sample and dataset named in ``config``, and verify every configuration."""
    progress = progress or Progress(enabled=False)
    with progress.step("load", "loading the model and the inputs"):
        loaded, file_module = load.load_model(config.model)
        sample = _sample(config, loaded, file_module)
        dataset = configurations.dataset_cases(config.dataset, loaded, load.read_input, load.to_model_inputs,
                                               sample) if config.dataset else []
        if sample is None:
            sample = dataset[0].inputs
    return verify_loaded(loaded, sample, config, dataset=dataset, progress=progress)


def verify(
    model: Any,
    inputs: Any,
    onnx: str | Any | None = None,
    *,
    batch_sizes: Sequence[int] = (),
    vary: Sequence[str] = (),
    dataset: str | Sequence[Any] | None = None,
    edge_cases: bool = False,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    opt_levels: Sequence[str | OptLevel] = (OptLevel.ALL,),
    ort_config: dict[str, str] | None = None,
    ort_variants: Sequence[dict[str, str]] = (),
    atol: float = 1e-4,
    rtol: float = 1e-3,
    exporter: str | None = None,
    opset: int | None = None,
) -> MatrixReport:
    """Verify a PyTorch ``model`` against its ONNX export (or the given ONNX file or proto) in every
    configuration asked for; returns the :class:`MatrixReport` (``report.ok``, ``report.results``).

    ``inputs`` is the sample (a tensor, a tuple of them, or a dict); ``batch_sizes`` re-runs it at those sizes
    along axis 0, ``vary`` takes ``"[INPUT:]AXIS=N,N"`` strings for other dynamic dimensions; ``dataset`` is a
    path (as ``--dataset``) or a list of samples; ``ort_variants`` adds one runtime setting per dict of session
    entries, beside the one without.
    """
    loaded = loaded_from_module(model)
    sample = load.to_model_inputs(inputs, loaded)
    axes = ((AxisSpec(axis=0, sizes=tuple(batch_sizes), label="batch"),) if batch_sizes else ()) \
        + tuple(parse_vary(v) for v in vary)
    config = Config(
        model=loaded.name, onnx=onnx, exporter=Exporter(exporter) if exporter else None, opset=opset,
        tolerance=Tolerance(atol, rtol), providers=tuple(providers), opt_levels=tuple(OptLevel.parse(o) for o in opt_levels),
        ort_config=tuple((ort_config or {}).items()), ort_variants=tuple(tuple(v.items()) for v in ort_variants),
        axes=axes, edge_cases=edge_cases,
    )
    if isinstance(dataset, str):
        cases = configurations.dataset_cases(dataset, loaded, load.read_input, load.to_model_inputs, sample)
    else:
        cases = [InputCase(label=f"sample {i}", kind=CaseKind.DATASET, inputs=load.to_model_inputs(x, loaded),
                           sample=i) for i, x in enumerate(dataset or ())]
    return verify_loaded(loaded, sample, config, dataset=cases)


def _sample(config: Config, loaded: LoadedModel, file_module) -> ModelInputs | None:
    """The ``--input`` files or ``get_inputs()``; None when only a dataset is given."""
    if not config.inputs and config.dataset and not callable(getattr(file_module, "get_inputs", None)):
        return None
    return load.load_inputs(config.inputs, loaded, file_module)


def verify_loaded(loaded: LoadedModel, sample: ModelInputs, config: Config, *,
                  dataset: Sequence[InputCase] = (), progress: Progress | None = None) -> MatrixReport:
    """Verify an already loaded model on ``sample`` (resized, plus edge cases) and ``dataset``."""
    with workspace() as folder:
        return _verify_in(folder, loaded, sample, config, dataset, progress or Progress(enabled=False))


def _verify_in(folder, loaded: LoadedModel, sample: ModelInputs, config: Config, dataset: Sequence[InputCase],
               progress: Progress) -> MatrixReport:
    specs = tuple(config.axes)
    exporting = config.onnx is None
    dynamic = configurations.dynamic_axes(sample, specs) if specs and exporting else None
    example = configurations.export_example(sample, specs) if dynamic else sample
    exported = obtain_onnx(loaded, example, config.onnx, config.exporter, config.opset, progress, dynamic, folder)
    plan = make_plan(sample, specs, dataset, config)
    untestable = _untestable(plan.cases, exported.proto, loaded)
    template = _template(plan.cases, sample, untestable)
    notes = list(plan.notes) + _untestable_notes(plan.cases, untestable, exporting)
    runnable = [rt for rt in plan.runtimes if rt not in plan.unavailable]
    warnings: tuple[str, ...] = ()
    if template is not None and runnable:
        with progress.step("capture", "running PyTorch with forward hooks"):
            captured = capture_case(loaded, template.inputs)
        prepared = prepare(loaded, template.inputs, captured, exported,
                                    backend=make_backend(runnable[0]), save_onnx=config.save_onnx, progress=progress)
        results, agreements, weights_stale = _run_cases(prepared, plan, untestable, template, captured,
                                                        config.tolerance, progress)
        warnings = prepared.warnings + tuple(weights_stale)
    else:
        results = [_skipped(case, rt, plan, untestable) for case in plan.cases for rt in plan.runtimes]
        agreements = []
    order = {case: i for i, case in enumerate(plan.cases)}
    results.sort(key=lambda r: (plan.runtimes.index(r.runtime), order[r.case]))
    return MatrixReport(
        model_name=loaded.name, exporter=exported.exporter, opset=exported.opset, tolerance=config.tolerance,
        results=tuple(results), dataset=tuple(aggregate_dataset(results)), agreements=tuple(agreements),
        dynamic_axes=tuple(free_dimensions(exported.proto)), warnings=tuple(dict.fromkeys(warnings)),
        notes=tuple(dict.fromkeys(notes + list(exported.notes))), timings=dict(progress.timings),
        peaks=dict(progress.peaks),
    )


def make_plan(sample: ModelInputs, specs: Sequence[configurations.AxisSpec], dataset: Sequence[InputCase],
              config: Config) -> Plan:
    """The input cases and runtime settings ``config`` asks for."""
    notes: list[str] = []
    cases = configurations.shape_cases(sample, specs) if specs else [] if dataset else [
        InputCase(label="sample", kind=CaseKind.SAMPLE, inputs=sample)]
    cases += list(dataset)
    if config.edge_cases:
        edge, edge_notes = configurations.edge_cases(sample)
        cases += edge
        notes += edge_notes
    runtimes = configurations.runtime_settings(config.providers, config.opt_levels, config.ort_config,
                                               config.ort_variants)
    return Plan(tuple(cases), tuple(runtimes), unavailable_runtimes(runtimes), tuple(notes))


def unavailable_runtimes(runtimes: Sequence[RuntimeSettings]) -> dict[RuntimeSettings, str]:
    """The runtime settings whose provider this onnxruntime build lacks, with the reason.

    A name onnxruntime does not know at all is a usage error (a typo), not an
    unavailable provider.
    """
    import onnxruntime as ort

    known, built = set(ort.get_all_providers()), set(available_providers())
    out = {}
    for rt in runtimes:
        if rt.provider not in known:
            raise UsageError(f"Unknown execution provider '{rt.provider}'. onnxruntime knows "
                             f"{', '.join(sorted(known))}; this build has {', '.join(sorted(built))}.")
        if rt.provider not in built:
            out[rt] = (f"{rt.provider} is not in this onnxruntime build (available: {', '.join(sorted(built))}); "
                       "install the onnxruntime package built for it (e.g. onnxruntime-gpu) on a machine that has it")
    return out


def _untestable(cases, proto, loaded: LoadedModel) -> dict[InputCase, tuple[tuple[str, int, int, int], ...]]:
    """Cases whose inputs need a size the graph fixes: ``{case: ((graph input, axis, fixed, needed), ...)}``."""
    out = {}
    for case in cases:
        conflicts = feeds.fixed_dimension_conflicts(case.inputs, proto, loaded.forward_params)
        if conflicts:
            out[case] = tuple(conflicts)
    return out


def _conflicts_text(conflicts) -> str:
    return "; ".join(f"'{name}' axis {axis} is fixed to {fixed} (needs {needed})"
                     for name, axis, fixed, needed in conflicts)


def _untestable_notes(cases, untestable, exporting: bool) -> list[str]:
    if not untestable:
        return []
    fixed = sorted({f"'{name}' axis {axis} is fixed to {size}"
                    for conflicts in untestable.values() for name, axis, size, _ in conflicts})
    labels = ", ".join(c.label for c in cases if c in untestable)
    if exporting:
        fix = ("The exporter specialised those dimensions: the model's code turns them into constants "
               "(a Python int taken from a shape, a view to a fixed size). Make the code shape-generic.")
    else:
        fix = ("Re-export with those dimensions dynamic (dynamic_shapes for the dynamo exporter, dynamic_axes "
               "for the TorchScript one), or verify only the sizes the file was made for.")
    return [f"In the ONNX graph {', '.join(fixed)}, so these configurations cannot be tested: {labels}. {fix}"]


def _template(cases: Sequence[InputCase], sample: ModelInputs, untestable) -> InputCase | None:
    """The case the alignment is made on: the sample itself where it is among the cases, else the first
    testable natural case (never a generated edge case: value matching on zeros means nothing)."""
    natural = [c for c in cases if c.kind is not CaseKind.EDGE and c not in untestable]
    shapes = _shapes(sample)
    return next((c for c in natural if _shapes(c.inputs) == shapes), natural[0] if natural else None)


def _shapes(inputs: ModelInputs) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(t.shape)) for n, t in configurations.named_tensors(inputs)]


def _run_cases(prepared: Prepared, plan: Plan, untestable, template: InputCase, captured, tolerance: Tolerance,
               progress: Progress) -> tuple[list[ConfigResult], list[ProviderAgreement], list[str]]:
    """Every case under every runtime setting, the template case first (it makes the alignment); and the
    stale-weight warnings its layers support."""
    cases = _CaseRunner(prepared, plan, untestable, tolerance, progress)
    results: list[ConfigResult] = []
    agreements: list[ProviderAgreement] = []
    for case in [template] + [c for c in plan.cases if c is not template]:
        case_results, case_agreements = cases.run(case, captured if case is template else None)
        results += case_results
        agreements += case_agreements
    return results, agreements, cases.weight_warnings


class _CaseRunner:
    """Runs one input case under every runtime setting, each setting's sessions kept across cases.

    A case's PyTorch capture and ONNX values live only while its own call
    runs: the next case, which may be much larger, then reuses that memory
    instead of growing the process (fresh pages cost as much as the compute).
    """

    def __init__(self, prepared: Prepared, plan: Plan, untestable, tolerance: Tolerance, progress: Progress):
        self.prepared, self.plan, self.untestable = prepared, plan, untestable
        self.tolerance, self.progress = tolerance, progress
        self.runners = {rt: Runner(prepared, make_backend(rt), keep=True) for rt in plan.runtimes
                        if rt not in plan.unavailable}
        self.memos: dict[RuntimeSettings, DiagnosisMemo] = defaultdict(DiagnosisMemo)
        self.pairs: tuple | None = None  # the alignment, made on the first case that runs
        self.weight_warnings: list[str] = []  # judged on the layers of that first case

    def run(self, case: InputCase, captured=None) -> tuple[list[ConfigResult], list[ProviderAgreement]]:
        """The case's matrix cells and the runtime settings' agreement on it."""
        plan = self.plan
        if case in self.untestable:
            return [_skipped(case, rt, plan, self.untestable) for rt in plan.runtimes], []
        if captured is None and self.pairs is not None and case.kind is not CaseKind.DATASET:
            try:
                agreed = self.outputs_only(case)
            except InputError as exc:
                return [_skipped(case, rt, plan, self.untestable, str(exc)) for rt in plan.runtimes], []
            if agreed is not None:
                return agreed
        try:
            captured = captured or _capture(self.prepared, case, self.progress)
        except InputError as exc:
            return [_skipped(case, rt, plan, self.untestable, str(exc)) for rt in plan.runtimes], []
        results, runs = [], {}
        for rt in plan.runtimes:
            if rt in plan.unavailable:
                results.append(_skipped(case, rt, plan, self.untestable))
                continue
            started = time.perf_counter()
            try:
                policy = CasePolicy(self.tolerance, template=self.pairs, thorough=False,
                                    memo=self.memos[rt] if case.kind is CaseKind.DATASET else None)
                run = bisect_case(self.prepared, self.runners[rt], case.inputs, captured, policy=policy,
                                  progress=self.progress)
            except BackendError as exc:
                results.append(ConfigResult(case, rt, ConfigStatus.ERROR, message=str(exc),
                                            seconds=time.perf_counter() - started))
                continue
            if self.pairs is None:
                self.pairs = run.pairs
                self.weight_warnings = weight_warnings(self.prepared, run.report.layers)
                for runner in self.runners.values():
                    runner.narrow(paired_tensors(self.pairs, self.prepared.index))
            results.append(config_result(case, rt, run, time.perf_counter() - started))
            if len(self.runners) > 1:
                runs[rt] = run
            del run  # before the next runtime's run: its values need the memory
        return results, agree(case, runs, self.tolerance)

    def outputs_only(self, case: InputCase) -> tuple[list[ConfigResult], list[ProviderAgreement]] | None:
        """The cells of a case whose final outputs agree everywhere, from a plain forward and the unmodified
        model alone; None when some runtime setting diverges, fails or disagrees with another (the case then
        runs in full: activations, instrumented run, localisation).

        Per-layer numbers are kept only for datasets (their per-layer aggregate); elsewhere an agreeing
        configuration needs nothing but its outputs.
        """
        started = time.perf_counter()
        with self.progress.step("capture", "running PyTorch"):
            reference = capture_case(self.prepared.loaded, case.inputs, outputs_only=True)
        model_feeds, _ = feeds.make_feeds(case.inputs, self.prepared.skeleton, self.prepared.loaded.forward_params)
        finals, results = {}, []
        for rt in self.plan.runtimes:
            if rt in self.plan.unavailable:
                results.append(_skipped(case, rt, self.plan, self.untestable))
                continue
            try:
                with self.progress.step("final", "running the unmodified ONNX model"):
                    finals[rt] = self.runners[rt].final(model_feeds)
            except BackendError:
                return None
            outputs = compare_outputs(reference, self.prepared.index, finals[rt], self.tolerance)
            if not outputs or not all(o.diff.ok for o in outputs):
                return None
            results.append(ConfigResult(case, rt, ConfigStatus.OK, outputs=outputs,
                                        seconds=time.perf_counter() - started))
        agreements = [agreement for _, _, agreement in _agree_outputs(case, finals, self.tolerance)]
        if not all(a.ok for a in agreements):
            return None
        return results, agreements


def _capture(prepared: Prepared, case: InputCase, progress: Progress):
    with progress.step("capture", "running PyTorch with forward hooks"):
        return capture_case(prepared.loaded, case.inputs)


def _skipped(case: InputCase, rt: RuntimeSettings, plan: Plan, untestable, message: str = "") -> ConfigResult:
    """A configuration that did not run: unavailable provider, fixed dimension, or PyTorch failed."""
    if rt in plan.unavailable:
        return ConfigResult(case, rt, ConfigStatus.UNAVAILABLE, message=plan.unavailable[rt])
    if case in untestable:
        return ConfigResult(case, rt, ConfigStatus.UNTESTABLE, message=_conflicts_text(untestable[case]))
    return ConfigResult(case, rt, ConfigStatus.ERROR,
                        message=message or "no input case could be aligned (every case is untestable)")


def config_result(case: InputCase, rt: RuntimeSettings, run: CaseRun, seconds: float) -> ConfigResult:
    """The matrix cell of one bisected case: verdict, output errors, first divergence, per-layer errors."""
    report = run.report
    layers = tuple(
        LayerError(name=r.pair.activation.name, module_type=r.pair.activation.module_type, tensor=r.pair.tensor,
                   node=r.pair.node, max_abs=r.diff.max_abs, tol_ratio=r.diff.tol_ratio, ok=r.diff.ok,
                   order=r.order)
        for r in report.layers if r.diff is not None and r.status is not Status.UNMATCHED
    )
    return ConfigResult(
        case=case, runtime=rt, status=ConfigStatus.OK if report.ok else ConfigStatus.DIVERGED,
        outputs=report.outputs, first_divergence=report.first_divergence, layer_errors=layers,
        reproduction=report.reproduction, faithful=report.faithful, seconds=seconds,
    )


def agree(case: InputCase, runs: dict[RuntimeSettings, CaseRun], tolerance: Tolerance) -> list[ProviderAgreement]:
    """Each pair of runtime settings compared with each other on one case (the first as the reference).

    The final outputs of the unmodified runs are compared; where they differ,
    the earliest paired tensor (graph order) whose instrumented values differ
    beyond tolerance names where the two runtimes part.
    """
    out = []
    for a, b, agreement in _agree_outputs(case, {rt: run.final for rt, run in runs.items()}, tolerance):
        first = None if agreement.ok else (_first_difference(runs[a], runs[b], tolerance)
                                           or _first_divergence(runs[a], runs[b]))
        if first is not None:
            agreement = dataclasses.replace(agreement, first_tensor=first.tensor, first_node=first.node,
                                            first_module=first.activation.name)
        out.append(agreement)
    return out


def _agree_outputs(case: InputCase, finals: dict[RuntimeSettings, dict], tolerance: Tolerance):
    """``[(a, b, agreement)]``: each pair of runtime settings' unmodified outputs compared (``a`` the reference)."""
    out = []
    settings = list(finals)
    for i, a in enumerate(settings):
        for b in settings[i + 1:]:
            diffs = [compare.compare_tensors(finals[b][name], ref, tolerance)
                     for name, ref in finals[a].items() if name in finals[b]]
            out.append((a, b, ProviderAgreement(case=case.label, a=a.label, b=b.label,
                                                max_abs=max((d.max_abs for d in diffs), default=0.0),
                                                ok=all(d.ok for d in diffs))))
    return out


def _first_difference(ra: CaseRun, rb: CaseRun, tolerance: Tolerance):
    """The earliest pair whose tensor differs between the two instrumented runs."""
    order = {r.pair.tensor: r.order for r in ra.report.layers if r.pair.tensor}
    for pair in sorted((p for p in ra.pairs if p.tensor in ra.probed and p.tensor in rb.probed),
                       key=lambda p: order.get(p.tensor, float("inf"))):
        if not compare.compare_tensors(rb.probed[pair.tensor], ra.probed[pair.tensor], tolerance).ok:
            return pair
    return None


def _first_divergence(ra: CaseRun, rb: CaseRun):
    """Where the runtimes part when their instrumented runs cannot show it (exposure changed what ONNX Runtime
    computes): the first divergence from PyTorch of the one that diverges while the other agrees."""
    diverged = [r for r in (ra, rb) if r.report.first_divergence is not None]
    if len(diverged) == 1 and all(r.report.ok for r in (ra, rb) if r is not diverged[0]):
        return diverged[0].report.first_divergence.layer.pair
    return None


def aggregate_dataset(results: Sequence[ConfigResult]) -> list[LayerAggregate]:
    """Per runtime setting and layer, over the dataset's samples: worst error (which sample), 99th percentile,
    how many samples diverge there."""
    grouped: dict[tuple[str, str], list[tuple[int, LayerError]]] = defaultdict(list)
    for r in results:
        if r.case.kind is CaseKind.DATASET and r.layer_errors:
            for layer in r.layer_errors:
                grouped[(r.runtime.label, layer.name)].append((r.case.sample, layer))
    out = []
    for (runtime, name), rows in grouped.items():
        errors = np.array([layer.max_abs for _, layer in rows], dtype=np.float64)
        worst = int(np.argmax(np.nan_to_num(errors, nan=np.inf)))
        first = rows[0][1]
        out.append(LayerAggregate(
            runtime=runtime, name=name, module_type=first.module_type, node=first.node,
            worst_max_abs=float(errors[worst]), worst_sample=rows[worst][0],
            p99_max_abs=float(np.percentile(np.nan_to_num(errors, nan=np.inf), PERCENTILE, method="higher")),
            diverged_samples=sum(1 for _, layer in rows if not layer.ok), samples=len(rows), order=first.order,
        ))
    return sorted(out, key=lambda a: (a.runtime, a.order))


def free_dimensions(proto) -> list[str]:
    """Graph-input dimensions the ONNX model leaves free: ``"input_ids[0] (batch)"``."""
    inits = {i.name for i in proto.graph.initializer}
    out = []
    for inp in proto.graph.input:
        if inp.name in inits or not inp.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(inp.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                out.append(f"{inp.name}[{axis}]" + (f" ({dim.dim_param})" if dim.dim_param else ""))
    return out
