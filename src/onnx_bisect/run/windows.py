"""Windowed exposure: a graph run in consecutive windows of nodes, so that the tensors it exposes are never all
held at once.

Exposing every intermediate tensor of a large model in one run makes ONNX
Runtime keep all of them until the run ends.  Here the nodes (in topological
order) are split into windows whose exposed tensors fit a byte budget
(:func:`plan_windows`); each window is a model of its own (:func:`window_model`,
a pure rewrite) whose inputs are the tensors that cross into it from earlier
windows (ONNX's own values, carried over: the values are those of the whole
graph) and the graph inputs it reads.  No window needs the full forward, and
only the carried tensors (a decoder's hidden state, its mask) outlive a window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from ..records.graph import GraphIndex, outer_inputs
from ..records.weights import Weights, trim_heap
from .backend import Backend


@dataclass(frozen=True)
class Window:
    """Nodes ``start`` to ``stop`` (exclusive) of the graph; the tensors fed in (carried from earlier windows or
    graph inputs) and those it returns (exposed here, or carried on to a later window)."""

    start: int
    stop: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    exposed: tuple[str, ...]  # the wanted tensors among the outputs


def plan_windows(index: GraphIndex, wanted: Sequence[str], nbytes: Mapping[str, int], budget: int) -> list[Window]:
    """Split the graph so that each window's exposed tensors (``nbytes`` each) take at most ``budget`` bytes (a
    single node's outputs may exceed it).  ``wanted`` tensors no node computes (graph inputs, initializers)
    are returned by the first window."""
    wanted_set = set(wanted)
    cuts, used = [0], 0
    for node in index.nodes:
        size = sum(nbytes.get(t, 0) for t in node.outputs if t in wanted_set)
        if used and used + size > budget:
            cuts.append(node.index)
            used = 0
        used += size
    cuts.append(len(index.nodes))
    return [_window(index, start, stop, wanted_set, first=(k == 0))
            for k, (start, stop) in enumerate(zip(cuts, cuts[1:])) if stop > start]


def _window(index: GraphIndex, start: int, stop: int, wanted: set[str], first: bool) -> Window:
    inside = range(start, stop)
    made = {t for i in inside for t in index.nodes[i].outputs if t}
    read = [t for i in inside for t in index.nodes[i].inputs if t and t not in made]
    inputs = tuple(dict.fromkeys(t for t in read if t not in index.initializers))
    later = {t for t in made if any(c >= stop for c in index.consumers.get(t, ())) or t in index.graph_outputs}
    exposed = [t for i in inside for t in index.nodes[i].outputs if t in wanted]
    if first:
        exposed = [t for t in wanted if t not in index.producer] + exposed
    return Window(start, stop, inputs, tuple(dict.fromkeys(exposed + sorted(later))), tuple(dict.fromkeys(exposed)))


def window_model(model: onnx.ModelProto, window: Window, input_types: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A model of ``window``'s nodes alone: its inputs typed after ``input_types`` (the values to be fed), the
    initializers its nodes read, its outputs untyped (ONNX Runtime infers them).  ``model`` is not modified."""
    graph = model.graph
    nodes = list(graph.node[window.start:window.stop])
    read = {t for n in nodes for t in tuple(n.input) + outer_inputs(n)}
    out = onnx.ModelProto()  # built from parts: copying the whole model would copy every node
    out.ir_version, out.producer_name = model.ir_version, model.producer_name
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    inputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(input_types[t].dtype),
                                            list(input_types[t].shape)) for t in window.inputs]
    initializers = [i for i in graph.initializer if i.name in read or i.name in window.outputs]
    outputs = [onnx.ValueInfoProto(name=t) for t in window.outputs]
    known = set(window.inputs)
    info = [v for v in graph.value_info if v.name not in known]
    out.graph.CopyFrom(helper.make_graph(nodes, f"{graph.name}-window-{window.start}", inputs, outputs,
                                         initializers, value_info=info))
    return out


def run_windowed(backend: Backend, model: onnx.ModelProto, windows: Sequence[Window], feeds: Mapping[str, np.ndarray],
                 weights: Weights | None, keep: Callable[[np.ndarray], np.ndarray] = lambda a: a,
                 on_window: Callable[[int, int], None] | None = None, optimize: bool = True) -> dict[str, np.ndarray]:
    """Run ``model`` window by window and return every window's exposed tensors (each passed through ``keep``:
    e.g. into the activation store); carried tensors are dropped once no later window reads them.  ``optimize``
    False: ONNX Runtime's graph optimizations off (a reference file's plain semantics)."""
    carried: dict[str, np.ndarray] = dict(feeds)
    last_read = {t: k for k, w in enumerate(windows) for t in w.inputs}
    values: dict[str, np.ndarray] = {}
    for k, window in enumerate(windows):
        part = window_model(model, window, carried)
        names = {i.name for i in part.graph.initializer}
        store = None if weights is None else Weights({n: a for n, a in weights.arrays.items() if n in names})
        got = backend.run(part, {t: carried[t] for t in window.inputs}, list(window.outputs), store, one_shot=True,
                          optimize=optimize)
        trim_heap()  # the window's session is gone: its weights' memory goes back to the system
        for t in window.exposed:
            values[t] = keep(got[t])
        carried.update({t: v for t, v in got.items() if t not in window.exposed or last_read.get(t, -1) > k})
        for t in [t for t in carried if last_read.get(t, -1) <= k and t not in feeds]:
            del carried[t]
        if on_window is not None:
            on_window(k + 1, len(windows))
    return values
