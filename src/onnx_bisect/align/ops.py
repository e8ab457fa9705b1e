"""Op-level pairs: each op of the exported program with the ONNX value named after its FX node."""
from __future__ import annotations

import numpy as np

from ..records import Activation, MatchMethod, TensorPair
from ..records.graph import GraphIndex


def op_tensors(ops: tuple[Activation, ...], index: GraphIndex) -> list[str]:
    """The ONNX values named after an op (what the probe must expose for them)."""
    return [a.op for a in ops if a.op in index.producer]


def pair_ops(ops: tuple[Activation, ...], index: GraphIndex, values: dict[str, np.ndarray]) -> tuple[TensorPair, ...]:
    """Each op paired with the ONNX value of its name, when that value exists and holds as many elements.

    Ops without such a value (folded, fused or renamed by the exporter's
    optimizer) are left out: they are finer than modules and the modules
    around them are aligned on their own.
    """
    pairs = []
    for a in ops:
        value = values.get(a.op)
        if a.op in index.producer and value is not None and value.size == a.value.size:
            node = index.node_of(a.op)
            pairs.append(TensorPair(a, a.op, node.name, node.op_type, MatchMethod.OP, 1.0,
                                    f"the ONNX value named after FX node {a.op}"))
    return tuple(pairs)
