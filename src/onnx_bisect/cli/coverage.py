"""``onnx-bisect coverage``: argparse -> CoverageConfig -> run_coverage -> render -> exit status."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from ..coverage.records import CoverageConfig
from ..errors import UsageError
from .boundary import guarded


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``onnx-bisect coverage``."""
    p = argparse.ArgumentParser(
        prog="onnx-bisect coverage",
        description="Op-coverage triage: what the exporters, the opset and each ONNX Runtime execution provider "
                    "cannot run, and which ops are numerically risky. Exit 1 when something cannot run.",
    )
    p.add_argument("model", help="MODEL.py[:NAME] (exported with both exporters, then triaged) or MODEL.onnx")
    p.add_argument("--input", "-i", action="append", default=[], metavar="FILE",
                   help="forward argument of a .py model as .npy/.npz/.pt (default: the file's get_inputs())")
    p.add_argument("--provider", action="append", default=[], metavar="NAME",
                   help="ONNX Runtime execution provider, in priority order; repeat for several "
                        "(default CPUExecutionProvider)")
    p.add_argument("--opset", type=int, metavar="N", help="flag nodes that need an opset newer than N")
    p.add_argument("--json", metavar="FILE", help="write the machine-readable report here")
    p.add_argument("--all", action="store_true", help="list every node instead of collapsed groups")
    p.add_argument("--no-session", action="store_true",
                   help="registry only: do not create ONNX Runtime sessions to confirm placement")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def config_from_args(args: argparse.Namespace) -> CoverageConfig:
    """Validate the parsed arguments into a CoverageConfig."""
    protected = {Path(x).resolve() for x in [args.model.split(":")[0], *args.input] if x}
    if args.json and Path(args.json).resolve() in protected:
        raise UsageError(f"Refusing to overwrite input file '{args.json}'; choose another --json path.")
    if args.json and Path(args.json).is_dir():
        raise UsageError(f"--json path '{args.json}' is a directory; name a file in it instead.")
    return CoverageConfig(target=args.model, inputs=tuple(args.input),
                          providers=tuple(args.provider) or ("CPUExecutionProvider",), opset=args.opset,
                          confirm=not args.no_session, show_all=args.all)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0 (everything runs), 1 (something cannot run) or 2 (bad input)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return guarded(lambda: _triage(args), args.debug)


def _triage(args: argparse.Namespace) -> int:
    from ..coverage.render import render_text, to_json
    from ..pipeline.coverage import run_coverage
    from ..report.files import write_atomic

    report = run_coverage(config_from_args(args))
    if args.json:
        try:
            write_atomic(args.json, json.dumps(to_json(report, args.all), indent=2) + "\n")
        except OSError as exc:
            raise UsageError(f"Could not write the JSON report to '{args.json}': {exc.strerror or exc}. "
                             "Choose a writable path.") from exc
    sys.stdout.write(render_text(report, show_all=args.all))
    return report.exit_status
