"""Op-level granularity: the exported program's individual ops as activations, paired by ONNX value name.

When onnx-bisect exports with the dynamo exporter, every FX node of the
``torch.export`` program that becomes an ONNX value keeps its name (``matmul_3``,
``gelu``, ``add_7``).  Running that program once with an FX interpreter records
each op's output; pairing it with the ONNX value of the same name cuts a module
with several ops (attention, a hand-written norm) into one segment per op, so a
divergence is blamed on a single op where possible, not on a whole module.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import torch
import torch.fx
from torch.fx import _pytree as fx_pytree
from torch.utils._pytree import tree_map_only

from ..records.nest import to_numpy
from ..records.store import ArrayStore
from ..records import Activation, Capture, ModelInputs


def capture_ops(program: Any, inputs: ModelInputs, first_index: int,
                values: frozenset[str] | None = None, store: ArrayStore | None = None) -> tuple[Activation, ...]:
    """Run the exported program's graph once and record every op's tensor output, in graph order.

    Each op becomes an activation of the module it was traced in (its
    innermost ``nn_module_stack`` entry), typed ``aten.<op>`` and named
    ``module::fx_name``; ``Activation.op`` holds the FX node name.  With
    ``values`` (the ONNX graph's value names) only the ops that kept their
    value are recorded: the others could not be paired anyway.  With a ``store``
    (low-memory runs) each op's value is copied there as it is computed.
    """
    module = program.module()
    flat = fx_pytree.tree_flatten_spec((tuple(inputs.args), dict(inputs.kwargs)), module._in_spec)
    recorder = _OpRecorder(module, values, store)
    with torch.no_grad():
        recorder.run(*flat)
    activations: list[Activation] = []
    made_by: dict[str, int] = {}
    for node, value in recorder.outputs:
        index = first_index + len(activations)
        consumed = tuple(sorted({made_by[a.name] for a in node.all_input_nodes if a.name in made_by}))
        activations.append(Activation(
            index=index, module=_owner(node), module_type=_op_name(node), call=0, path=f"::{node.name}",
            value=value, is_leaf=True, inputs=consumed, op=node.name,
        ))
        made_by[node.name] = index
    return tuple(activations)


def capture_ops_float64(program: Any, inputs: ModelInputs, names: frozenset[str]) -> dict[str, np.ndarray] | None:
    """The exported program's ops named ``names`` as a float64 run computes them (a copy of its module in
    float64 on the inputs' float32 tensors in float64), by FX node name; None when it will not run so."""
    try:
        module = copy.deepcopy(program.module()).double()
        wide = tree_map_only(torch.Tensor, lambda t: t.double() if t.dtype == torch.float32 else t,
                             (tuple(inputs.args), dict(inputs.kwargs)))
        flat = fx_pytree.tree_flatten_spec(wide, module._in_spec)
        recorder = _OpRecorder(module, names, None)
        with torch.no_grad():
            recorder.run(*flat)
    except Exception:  # noqa: BLE001 - without a float64 run, nothing is judged against it
        return None
    return {node.name: value for node, value in recorder.outputs}


class _OpRecorder(torch.fx.Interpreter):
    """An interpreter that keeps each call_function node's tensor output."""

    def __init__(self, module: torch.fx.GraphModule, values: frozenset[str] | None, store: ArrayStore | None):
        super().__init__(module)
        self.outputs: list[tuple[torch.fx.Node, np.ndarray]] = []
        self.values = values
        self.store = store

    def run_node(self, node: torch.fx.Node):
        out = super().run_node(node)
        if node.op == "call_function" and isinstance(out, torch.Tensor) and out.is_floating_point() \
                and (self.values is None or node.name in self.values):
            value = to_numpy(out, copy=self.store is None)
            self.outputs.append((node, value if self.store is None else self.store.put(value)))
        return out


def _owner(node: torch.fx.Node) -> str:
    """The qualified name of the innermost module that traced ``node`` ("" for the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    return path


def _op_name(node: torch.fx.Node) -> str:
    """``aten.matmul`` for ``aten.matmul.default``; a Python builtin by its name (``getitem``)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return getattr(node.target, "__name__", str(node.target))
    name = str(node.target)
    return name.rsplit(".", 1)[0] if name.count(".") >= 2 else name


def with_ops(capture: Capture, ops: tuple[Activation, ...]) -> Capture:
    """``capture`` with the op activations appended."""
    return dataclasses.replace(capture, activations=capture.activations + ops)


def split(capture: Capture) -> tuple[Capture, tuple[Activation, ...]]:
    """``(module-level capture, op activations)``."""
    ops = tuple(a for a in capture.activations if a.op)
    if not ops:
        return capture, ()
    return dataclasses.replace(capture, activations=tuple(a for a in capture.activations if not a.op)), ops




