"""An activation applied on the wrong side of a layer: the file applies it to the layer's input where PyTorch
applies it to the layer's output (a port writing ``linear(tanh(x))`` for ``tanh(linear(x))``).  The node's
removal reproduces the layer's output; that PyTorch applies the same function right after it — and the file
does not — says the op was moved, not added, and names the layer's nodes with it.
"""
from __future__ import annotations

import math

import numpy as np

#: elementwise functions of one tensor, as numpy computes them (the ONNX op's default attributes; a stage imports
#: no other stage, so not align.fused_outputs.activated's table)
FUNCTIONS = {
    "Tanh": np.tanh,
    "Relu": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "Exp": np.exp,
    "Abs": np.abs,
    "Neg": np.negative,
    "Softplus": lambda x: np.logaddexp(0.0, x),
    "Softsign": lambda x: x / (1.0 + np.abs(x)),
    "Sin": np.sin,
    "Cos": np.cos,
    "Erf": np.vectorize(math.erf, otypes=[np.float64]),
}

#: how close PyTorch's later value must be to the function of the divergent tensor's value (relative)
AGREE = 1e-4


#: how many nodes past the op its layer's output may lie (a MatMul and its bias Add, a Reshape)
LAYER_AT_MOST = 6


def applied_after(ctx, proto) -> tuple[str, ...]:
    """The nodes between ``proto`` (an elementwise function the segment applies to a layer's input, whose removal
    reproduces PyTorch) and the layer's output — the divergent tensor, or an aligned tensor a few nodes on — when
    PyTorch applies that function to the output's value right after (a captured value equal to it, later in
    capture order) and no node of the file applies it there: the op moved before the layer.  () otherwise."""
    function = FUNCTIONS.get(proto.op_type)
    if function is None or proto.domain not in ("", "ai.onnx") or proto.attribute:
        return ()
    graph = ctx.onnx.graph
    for tensor, reference, index in _outputs_after(ctx, proto):
        if any(graph.nodes[c].op_type == proto.op_type for c in graph.consumers.get(tensor, ())):
            continue
        reference = np.asarray(reference, np.float64).reshape(-1)
        with np.errstate(all="ignore"):
            wanted = function(reference)
        scale = float(np.max(np.abs(wanted))) if wanted.size else 0.0
        if not np.all(np.isfinite(wanted)) or np.ptp(wanted) == 0 or _near(wanted, reference, scale):
            continue  # a ReLU of a value with no negative entry: any later copy of the value would match
        for a in ctx.baseline.capture.activations:  # module outputs: one numbering with ``index``
            value = a.value
            if a.index <= index or value is None or np.size(value) != wanted.size or value.dtype.kind != "f":
                continue
            if _near(np.asarray(value, np.float64).reshape(-1), wanted, scale):
                path = _path(ctx, proto, tensor)
                if path:
                    return path
                break
    return ()


def _near(a: np.ndarray, b: np.ndarray, scale: float) -> bool:
    return float(np.max(np.abs(a - b))) <= AGREE * (scale or 1.0)


def _outputs_after(ctx, proto):
    """``(tensor, PyTorch value, capture index)`` of the divergent tensor, then of the aligned tensors a few
    nodes past ``proto`` (a segment narrowed to the op itself ends before the layer it was moved in front of)."""
    if not ctx.layer.pair.activation.op:  # an op's index counts PyTorch's ops, not the module outputs
        yield ctx.tensor, ctx.reference, ctx.layer.pair.activation.index
    near = {o for n in ctx.onnx.graph.downstream(proto.output[0], LAYER_AT_MOST) for o in n.outputs if o}
    for layer in ctx.layers:
        if layer.pair.tensor in near and layer.pair.tensor != ctx.tensor and not layer.pair.activation.op:
            yield layer.pair.tensor, layer.pair.reference(), layer.pair.activation.index


def _path(ctx, proto, tensor: str) -> tuple[str, ...]:
    """The nodes computed from ``proto``'s output that ``tensor`` is computed from, in graph order (the layer the op
    was moved in front of)."""
    graph = ctx.onnx.graph
    below = {n.name for n in graph.downstream(proto.output[0], LAYER_AT_MOST)}
    above, frontier = set(), [tensor]
    while frontier:
        node = graph.node_of(frontier.pop())
        if node is not None and node.name in below and node.name not in above:
            above.add(node.name)
            frontier.extend(i for i in node.inputs if i)
    return tuple(n.name for n in graph.nodes if n.name in above)
