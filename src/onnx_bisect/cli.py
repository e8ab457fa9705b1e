"""Command line: argparse → Config → pipeline.run → renderer → exit status."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from . import __version__
from .errors import BisectError, UsageError
from .progress import Progress
from .records import ExitStatus, Exporter, Tolerance


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
    p.add_argument("--exporter", choices=[e.value for e in (Exporter.DYNAMO, Exporter.TORCHSCRIPT)],
                   help="exporter to use (default: dynamo, falling back to torchscript)")
    p.add_argument("--opset", type=int, metavar="N", help="ONNX opset for the export")
    p.add_argument("--save-onnx", metavar="PATH", help="also write the exported ONNX model here")
    p.add_argument("--provider", default="CPUExecutionProvider", help="ONNX Runtime execution provider")
    p.add_argument("--ort-opt-level", choices=["disable", "basic", "extended", "all"], default="all",
                   help="ONNX Runtime graph optimization level (default all, as ONNX Runtime)")
    p.add_argument("--ort-config", action="append", default=[], metavar="KEY=VALUE",
                   help="ONNX Runtime session config entry, e.g. optimization.enable_gelu_approximation=1")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4)")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (default 1e-3)")
    p.add_argument("--json", metavar="FILE", help="write the machine-readable report here")
    p.add_argument("--all", action="store_true", help="list every layer, not just the neighbourhood")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version", version=f"onnx-bisect {__version__}")
    return p


def config_from_args(args: argparse.Namespace):
    """Validate the parsed arguments into a Config."""
    if args.atol < 0 or args.rtol < 0:
        raise UsageError(f"--atol and --rtol must be non-negative (got --atol {args.atol:g} --rtol {args.rtol:g}).")
    if args.opset is not None and not 7 <= args.opset <= 30:
        raise UsageError(f"--opset {args.opset} is not a valid ONNX opset; use a value such as 17 or 18.")
    protected = {Path(x).resolve() for x in [args.model.split(":")[0], *args.input, args.onnx] if x}
    for out in (args.json, args.save_onnx):
        if out and Path(out).resolve() in protected:
            raise UsageError(f"Refusing to overwrite input file '{out}'; choose another output path.")
        if out and Path(out).is_dir():
            raise UsageError(f"Output path '{out}' is a directory; name a file in it instead.")
    if args.onnx and args.save_onnx:
        raise UsageError("--save-onnx writes the exported model; it cannot be combined with --onnx.")
    bad = [kv for kv in args.ort_config if "=" not in kv]
    if bad:
        raise UsageError(f"--ort-config takes KEY=VALUE, got {bad[0]!r}.")
    from .pipeline import Config

    return Config(
        ort_config=tuple(tuple(kv.split("=", 1)) for kv in args.ort_config), ort_opt_level=args.ort_opt_level,
        model=args.model, inputs=tuple(args.input), onnx=args.onnx,
        exporter=Exporter(args.exporter) if args.exporter else None, opset=args.opset, provider=args.provider,
        tolerance=Tolerance(args.atol, args.rtol), save_onnx=args.save_onnx,
    )


def _write_report(report, path: str) -> None:
    from .report import write_json

    try:
        write_json(report, path)
    except OSError as exc:
        raise UsageError(
            f"Could not write the JSON report to '{path}': {exc.strerror or exc}. Choose a writable path."
        ) from exc


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 agree, 1 diverged, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["coverage"]:
        from .coverage.cli import main as coverage_main

        return coverage_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        from .pipeline import run

        report = run(config, Progress())
        if args.json:
            _write_report(report, args.json)
    except BisectError as exc:
        if args.debug:
            raise
        print(f"onnx-bisect: error: {exc}", file=sys.stderr)
        return ExitStatus.USAGE
    except KeyboardInterrupt:
        return 130
    from .report import render_text

    sys.stdout.write(render_text(report, show_all=args.all))
    return report.exit_status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
