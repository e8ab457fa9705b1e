"""One node of an exported file changed, onnx-bisect run on it, and what a found fault must look like: shared by
the diagnosis tests of op kinds and families (tests/test_diagnose_kinds.py, tests/test_diagnose_families.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


def planted(exported, op_type: str, change, pick=lambda nodes: nodes[0]):
    """Copy the file, ``change(proto, node)`` one node of ``op_type``, run onnx-bisect: ``(fd, node name)``."""
    model, inputs, proto = exported
    faulty = type(proto)()
    faulty.CopyFrom(proto)
    node = pick([n for n in faulty.graph.node if n.op_type == op_type])
    change(faulty, node)
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=faulty)
    return report.first_divergence, node.name


def found(fd, planted_node: str, cause: str = "attribute-mismatch", at_most: int = 3):
    """Assert the first divergence names ``planted_node`` in a segment of at most ``at_most`` nodes, with
    ``cause`` confirmed by re-running; its evidence."""
    assert fd is not None and fd.cause == cause and fd.confirmed is True, fd and (fd.cause, fd.explanation)
    assert planted_node in fd.layer.segment and len(fd.layer.segment) <= at_most, fd.layer.segment
    return fd.evidence
