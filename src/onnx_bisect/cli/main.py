"""Command line: argparse → Config → pipeline.run → renderer → exit status."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .. import __version__
from ..errors import UsageError
from ..report.progress import Progress
from ..records import Exporter, OptLevel, Tolerance
from .boundary import guarded


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``onnx-bisect``."""
    p = argparse.ArgumentParser(
        prog="onnx-bisect",
        description="Find the first ONNX node whose output diverges from the PyTorch model, and say why.",
    )
    p.add_argument("model", help="Python file defining the model: get_model(), `model`, or one nn.Module "
                                 "class; FILE.py:NAME picks one")
    p.add_argument("--input", "-i", action="append", default=[], metavar="FILE",
                   help="forward argument as .npy/.npz/.pt; repeat once per positional argument, in order "
                        "(default: the file's get_inputs())")
    p.add_argument("--onnx", metavar="FILE", help="debug this ONNX file instead of exporting the model")
    p.add_argument("--reference", metavar="REF.onnx",
                   help="compare against this ONNX model instead of PyTorch; MODEL is then the ONNX file to check "
                        "(e.g. its float16 or int8 version)")
    p.add_argument("--exporter", choices=[e.value for e in (Exporter.DYNAMO, Exporter.TORCHSCRIPT)],
                   help="exporter to use (default: dynamo, falling back to torchscript)")
    p.add_argument("--opset", type=int, metavar="N", help="ONNX opset for the export")
    p.add_argument("--save-onnx", metavar="PATH", help="also write the exported ONNX model here")
    p.add_argument("--provider", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                   help="ONNX Runtime execution provider, with provider options after a colon; repeat to verify "
                        "several and compare them with each other (default CPUExecutionProvider)")
    p.add_argument("--ort-opt-level", action="append", default=[], choices=[o.value for o in OptLevel],
                   help="ONNX Runtime graph optimization level (default all, as ONNX Runtime); repeat to verify "
                        "several")
    p.add_argument("--ort-config", action="append", default=[], metavar="KEY=VALUE",
                   help="ONNX Runtime session config entry for every run, e.g. "
                        "optimization.enable_gelu_approximation=1")
    p.add_argument("--ort-variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="also verify with these session config entries added (one runtime setting per "
                        "--ort-variant, beside the one without)")
    g = p.add_argument_group("configurations (several make a verification matrix)")
    g.add_argument("--batch-sizes", metavar="N,N,...", help="re-run at these batch sizes (axis 0), built from "
                                                            "the sample by tiling and resampling its rows")
    g.add_argument("--vary", action="append", default=[], metavar="[INPUT[,INPUT]:]AXIS=N,N,...",
                   help="re-run with another dynamic dimension at these sizes, e.g. input_ids,attention_mask:1=32,128 "
                        "(without INPUT: every input whose AXIS has the first input's size)")
    g.add_argument("--dataset", metavar="PATH", help="run every sample: a directory of .npy/.npz/.pt files (one "
                                                     "sample each) or one .npz/.npy/.pt with the samples along axis 0")
    g.add_argument("--edge-cases", action="store_true",
                   help="add generated inputs: zeros, large and tiny magnitudes, the extremes of the sample's range")
    p.add_argument("--low-memory", action="store_const", const=True, default=None,
                   help="hold one framework's weights at a time: PyTorch runs first, its activations kept on disk and "
                        "its weights memory-mapped, then ONNX Runtime (automatic when the weights take more than a "
                        "quarter of the available memory)")
    p.add_argument("--window-mb", type=float, metavar="N",
                   help="run the instrumented graphs in windows of nodes whose exposed tensors take at most N MiB "
                        "(automatic in low-memory runs: an eighth of the weights' size)")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4)")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (default 1e-3)")
    _output_options(p)
    p.add_argument("--all", action="store_true", help="list every layer, not just the neighbourhood")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version", version=f"onnx-bisect {__version__}")
    return p


def _output_options(p: argparse.ArgumentParser) -> None:
    """The files a run writes besides the terminal report."""
    p.add_argument("--json", metavar="FILE", help="write the machine-readable report here")
    p.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page (error plot, "
                                                   "cause and fix, sortable layer table; opens offline)")
    p.add_argument("--node-data", metavar="FILE.json",
                   help="write Model Explorer node data: FILE.json (accumulated error per ONNX node, in units of "
                        "the tolerance), FILE.local.json (local error), FILE.status.json (status)")
    p.add_argument("--extract", metavar="DIR",
                   help="write the first divergent segment as a standalone repro into DIR (a new or empty folder): "
                        "segment.onnx, inputs.npz, expected.npz, repro.py and, with a confirmed fix, fixed.onnx")


def config_from_args(args: argparse.Namespace):
    """Validate the parsed arguments into a Config."""
    if args.atol < 0 or args.rtol < 0:
        raise UsageError(f"--atol and --rtol must be non-negative (got --atol {args.atol:g} --rtol {args.rtol:g}).")
    if args.opset is not None and not 7 <= args.opset <= 30:
        raise UsageError(f"--opset {args.opset} is not a valid ONNX opset; use a value such as 17 or 18.")
    _check_outputs(args)
    if args.reference:
        if not args.model.lower().endswith(".onnx"):
            raise UsageError(f"With --reference, MODEL is the ONNX file to check against it (got '{args.model}'): "
                             "onnx-bisect CANDIDATE.onnx --reference REFERENCE.onnx [--input ...].")
        if args.onnx or args.save_onnx or args.exporter or args.opset:
            raise UsageError("--reference compares two ONNX files: --onnx, --save-onnx, --exporter and --opset do "
                             "not apply.")
    if args.onnx and args.save_onnx:
        raise UsageError("--save-onnx writes the exported model; it cannot be combined with --onnx.")
    from ..pipeline.specs import AxisSpec, parse_config_entries, parse_sizes, parse_vary

    inputs = [x for x in args.input if not Path(x).is_dir()]
    folders = [x for x in args.input if Path(x).is_dir()]
    if len(folders) > 1 or (folders and args.dataset):
        raise UsageError("Give one dataset: one --dataset PATH or one --input DIRECTORY, not several.")
    axes = [AxisSpec(axis=0, sizes=parse_sizes(args.batch_sizes, "--batch-sizes"), label="batch")] \
        if args.batch_sizes else []
    axes += [parse_vary(v) for v in args.vary]
    from ..pipeline.config import Config

    config = Config(
        model=args.model, inputs=tuple(inputs), onnx=args.onnx,
        exporter=Exporter(args.exporter) if args.exporter else None, opset=args.opset,
        tolerance=Tolerance(args.atol, args.rtol), save_onnx=args.save_onnx,
        providers=tuple(args.provider) or ("CPUExecutionProvider",),
        opt_levels=tuple(OptLevel(x) for x in dict.fromkeys(args.ort_opt_level)) or (OptLevel.ALL,),
        ort_config=parse_config_entries(args.ort_config, "--ort-config"),
        ort_variants=tuple(parse_config_entries([v], "--ort-variant") for v in args.ort_variant),
        axes=tuple(axes), dataset=args.dataset or (folders[0] if folders else None), edge_cases=args.edge_cases,
        reference=args.reference, keep_repro=bool(args.extract), low_memory=args.low_memory,
        window_mb=args.window_mb,
    )
    if args.window_mb is not None and not args.window_mb > 0:
        raise UsageError(f"--window-mb must be a positive number of MiB (got {args.window_mb:g}).")
    if (config.low_memory or config.window_mb) and config.is_matrix:
        raise UsageError("--low-memory and --window-mb apply to a single bisection (one input case, one runtime "
                         "setting), not to the configuration matrix, which keeps a session per runtime setting; drop "
                         "them, or the configuration options and --dataset.")
    return config


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that would overwrite an input or cannot be written where named."""
    from ..report.node_data import node_data_paths

    protected = {Path(x).resolve() for x in [args.model.split(":")[0], *args.input, args.onnx, args.dataset,
                                             args.reference] if x}
    files = [args.json, args.save_onnx, args.html, *(node_data_paths(args.node_data) if args.node_data else [])]
    for out in filter(None, files):
        if Path(out).resolve() in protected:
            raise UsageError(f"Refusing to overwrite input file '{out}'; choose another output path.")
        if Path(out).is_dir():
            raise UsageError(f"Output path '{out}' is a directory; name a file in it instead.")
    if args.extract:
        from ..pipeline.extract import check_folder

        if Path(args.extract).resolve() in protected:
            raise UsageError(f"--extract {args.extract}: that is an input file; name a new or empty folder.")
        check_folder(args.extract)


def _write_report(report, path: str, writer, what: str = "the JSON report") -> None:
    try:
        writer(report, path)
    except OSError as exc:
        raise UsageError(
            f"Could not write {what} to '{path}': {exc.strerror or exc}. Choose a writable path."
        ) from exc


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 agree, 1 diverged, 2 bad input, 3 tool or runtime failure,
    130 interrupted, 143 terminated)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["coverage"]:
        from .coverage import main as coverage_main

        return coverage_main(argv[1:])
    args = build_parser().parse_args(argv)
    return guarded(lambda: _bisect(args), args.debug)


def _bisect(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if config.is_matrix and (args.extract or args.node_data):
        raise UsageError(f"{'--extract' if args.extract else '--node-data'} works on a single bisection, not on a "
                         "verification of several configurations: rerun with the one configuration that diverges.")
    run, render, write = _job(config)
    report = run(config, Progress())
    if args.json:
        _write_report(report, args.json, write)
    if args.html:
        from ..report.files import write_atomic

        _write_report(report, args.html, lambda r, path: write_atomic(path, r.to_html()), "the HTML report")
    if args.node_data:
        from ..report.node_data import write_node_data

        _write_report(report, args.node_data, write_node_data, "the Model Explorer node data")
    sys.stdout.write(render(report, show_all=args.all))
    if args.extract:
        from ..report.repro import render_extraction

        sys.stdout.flush()
        sys.stdout.write("\n" + render_extraction(report.extract(args.extract)) + "\n")
    return report.exit_status


def _job(config):
    """``(run, renderer, JSON writer)`` of what ``config`` asks for: a bisection against PyTorch or another ONNX
    model, or a verification matrix (several configurations, or a provider this build lacks, which the matrix
    then reports as unavailable)."""
    from ..report.text import render_text, write_json

    if config.reference:
        if config.is_matrix:
            raise UsageError("--reference checks one configuration; drop the matrix options (batch sizes, "
                             "datasets, edge cases, several providers or settings).")
        from ..pipeline.reference import run

        return run, render_text, write_json
    from ..pipeline.verify import unavailable_runtimes

    if config.is_matrix or unavailable_runtimes([config.runtime]):
        from ..report.matrix import render_matrix, write_matrix_json
        from ..pipeline.verify import run

        return run, render_matrix, write_matrix_json
    from ..pipeline.bisect import run

    return run, render_text, write_json


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
