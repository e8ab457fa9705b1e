"""No confident cause on clean models: a divergence made of float32 rounding stays 'unknown'."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402

from onnx_bisect.diagnose import CONFIDENT, RULES  # noqa: E402


@pytest.mark.parametrize("arch", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("provenance", ["dynamo", "torchscript"])
def test_rounding_noise_gets_no_confident_cause(arch, provenance):
    model, inputs, proto = dc.clean(arch, provenance)
    case = dc.Case("tight", None, arch, provenance, model, inputs, proto, options={"atol": 1e-9, "rtol": 1e-9})
    report, ctx = bisect_case(case)
    fd = report.first_divergence
    assert fd is not None, "a 1e-9 tolerance must flag float32 rounding"
    assert fd.cause == "unknown" or fd.confidence < CONFIDENT, (fd.cause, fd.explanation)
    assert "rules_failed" not in fd.evidence
    for rule in RULES:  # and no single rule claims it either
        finding = rule().match(ctx)
        assert finding is None or finding.confidence < CONFIDENT, (rule.cause, finding.summary)


def test_no_rule_fails_on_the_planted_cases():
    for planter in (dc.gelu, dc.epsilon, dc.quantization):
        report, _ = bisect_case(planter("transformer", "torchscript"))
        assert "rules_failed" not in report.first_divergence.evidence
