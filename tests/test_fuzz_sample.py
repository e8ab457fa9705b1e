"""A fixed, seeded sample of ``scripts/fuzz_inputs.py``: untrusted ONNX files and inputs are refused cleanly.

Each case mutates a small real model (or its input), runs the command line in a fresh process under a time
limit with a canary file beside the model's folder and its own ``TMPDIR``, and must show: no traceback, no
hang, an exit status in {0, 1, 2, 3}, no read of the canary (or of a system file the mutation points at), no
file written or left over outside the requested outputs, no warning leaking to stderr.  The path-traversal
cases (external data outside the model's folder) must be refused with exit 2 and a one-paragraph
``onnx-bisect: error:`` message.

``ONNX_BISECT_FUZZ_SRC`` names another source tree to run (default: this repository's ``src``).  The full
fuzzer: ``python scripts/fuzz_inputs.py --cases 2000 --jobs 2``.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def fuzz_module():
    """``scripts/fuzz_inputs.py`` imported as a module (as ``plant_module()`` does for the planters)."""
    path = REPO / "scripts" / "fuzz_inputs.py"
    spec = importlib.util.spec_from_file_location("fuzz_inputs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fuzz = fuzz_module()
SPECS = fuzz.sample_specs()


@pytest.fixture(scope="module")
def sample_results(tmp_path_factory) -> dict[int, dict]:
    """Run the whole sample once, two cases at a time; the record of each case by index."""
    root = tmp_path_factory.mktemp("fuzz")
    seeds = fuzz.ensure_seeds(root / "seeds", sys.executable)
    src = os.environ.get("ONNX_BISECT_FUZZ_SRC", str(REPO / "src"))
    cfg = fuzz.RunConfig(python=sys.executable, src=src, timeout=60)
    fuzz.check_source(cfg)  # the onnx_bisect under test, not another install

    def one(spec):
        record, case = fuzz.execute(spec, root / "cases", seeds, cfg)
        stderr = case.dir / ".fuzz" / "stderr.txt"
        record["stderr"] = stderr.read_text(errors="replace") if stderr.is_file() else ""
        shutil.rmtree(case.dir, ignore_errors=True)
        return record

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {r["index"]: r for r in pool.map(one, SPECS)}


@pytest.mark.parametrize("spec", SPECS, ids=[f"{s.mutation}-{s.variant}-{s.mode}" for s in SPECS])
def test_fuzz_case(spec, sample_results):
    r = sample_results[spec.index]
    assert "skipped" not in r["outcomes"], r["detail"]
    failures = [f"{cat}: {key}" for cat, key in r["patterns"] if cat not in fuzz.SOFT_OUTCOMES]
    if r["exit"] not in fuzz.ALLOWED_EXITS:
        failures.append(f"exit status {r['exit']} (expected 0, 1, 2 or 3)")
    if spec.mutation in fuzz.TRAVERSAL:
        if r["exit"] != 2:
            failures.append(f"exit status {r['exit']}: a file outside the model's folder was not refused (expected 2)")
        elif not fuzz.one_paragraph_error(r["stderr"]):
            failures.append("exit 2 without a one-paragraph 'onnx-bisect: error:' message")
    assert not failures, "\n".join(["", *failures, f"case: {r['detail']}", f"$ {r['command']}", r["stderr_tail"]])
