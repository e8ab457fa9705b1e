"""The PyTorch tensors a segment's initializers are compared with (parameters, folds, concatenations, constant
activations) and the ONNX nodes that read them: shared by the weight readings."""
from __future__ import annotations

import re

import numpy as np

from ..support.param_layouts import gates_exchanged, is_rnn_parameter, model_rnn_weights
from ..support import layout
from ...records.nest import to_numpy
from ..context import DiagnosisContext, attribute


QDQ_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


#: an nn.LSTM/GRU/RNN parameter as PyTorch stores it (compared in the ONNX layout instead: param_layouts)
RAW_RNN = re.compile(r"(^|\.)(weight|bias)_(ih|hh)_l\d+(_reverse)?$")


#: ops that only carry a weight to the node computing with it (dequantized, cast, laid out)
WEIGHT_CARRIERS = frozenset({"DequantizeLinear", "Cast", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Identity"})


def weight_readers(ctx: DiagnosisContext, initializers: list[str]) -> tuple[str, ...]:
    """The nodes computing with ``initializers``, through the ops carrying them there (a DequantizeLinear, a
    Cast, a Transpose): the nodes a weight fix changes."""
    graph, found, stack, seen = ctx.onnx.graph, {}, list(initializers), set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for c in graph.consumers.get(tensor, ()):
            node = graph.nodes[c]
            found[node.name] = None
            if node.op_type in WEIGHT_CARRIERS:
                stack.extend(node.outputs)
    return tuple(found)


def segment_initializers(ctx: DiagnosisContext) -> list[str]:
    names = []
    for p in ctx.segment_protos:
        if p.op_type in QDQ_OPS:
            continue
        names += [t for t in p.input if t and (t in ctx.onnx.weights.arrays or t in ctx.onnx.graph.initializers)]
    return list(dict.fromkeys(names))


def parameters_sized(ctx: DiagnosisContext, size: int) -> dict[str, np.ndarray]:
    """Every floating parameter and buffer of the model with ``size`` elements (the fallback search)."""
    if ctx.baseline.loaded.module is None:
        return {}  # --reference: the candidates were every initializer of the reference already
    tensors = list(ctx.baseline.loaded.module.named_parameters()) + list(ctx.baseline.loaded.module.named_buffers())
    out = {n: t.detach().double().cpu().numpy() for n, t in tensors if t.is_floating_point() and t.numel() == size}
    out.update({n: a for n, a in model_rnn_weights(ctx.baseline.loaded.module).items() if a.size == size})
    return out


def parameter_holding(ctx: DiagnosisContext, value: np.ndarray, rtol: float, atol: float) -> str | None:
    """The first PyTorch parameter (or buffer) of ``value``'s size holding its numbers (allclose ``rtol``,
    ``atol``); None when none does (or with --reference)."""
    flat = np.asarray(value, np.float64).reshape(-1)
    return next((name for name, tensor in parameters_sized(ctx, flat.size).items()
                 if np.allclose(tensor.reshape(-1), flat, rtol=rtol, atol=atol)), None)


def concatenated_parameters(ctx: DiagnosisContext, size: int) -> dict[str, np.ndarray]:
    """The weights (and biases) of consecutive sibling Linear layers reading inputs of one size, concatenated
    along their outputs, where that makes ``size`` elements: ``"concat(a.q.weight, a.k.weight, a.v.weight)"``."""
    module = ctx.baseline.loaded.module
    if module is None:
        return {}
    import torch  # noqa: PLC0415 - only with a PyTorch model

    children: dict[str, list[tuple[str, torch.nn.Linear]]] = {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear):
            children.setdefault(name.rpartition(".")[0], []).append((name, m))
    out: dict[str, np.ndarray] = {}
    for linears in children.values():
        for i in range(len(linears)):
            for j in range(i + 2, len(linears) + 1):
                run = linears[i:j]
                if len({m.in_features for _, m in run}) != 1:
                    break
                for part in ("weight", "bias"):
                    tensors = [getattr(m, part) for _, m in run]
                    if any(t is None for t in tensors) or sum(t.numel() for t in tensors) != size:
                        continue
                    key = f"concat({', '.join(f'{n}.{part}' for n, _ in run)})"
                    out[key] = np.concatenate([t.detach().double().cpu().numpy() for t in tensors], axis=0)
    return out


#: at most this many slices of one stacked parameter are offered
MAX_SLICES = 256


def stacked_slices(ctx: DiagnosisContext, size: int) -> dict[str, np.ndarray]:
    """The slices along the first axis of stacked parameters (a mixture of experts' ``[experts, out, in]``
    weights, a stack of layers' weights in one tensor) with ``size`` elements: ``"experts.weight[2]"``.  An
    exporter folds each expert's ``weight[i]`` into an initializer of its own."""
    module = ctx.baseline.loaded.module
    if module is None:
        return {}
    out: dict[str, np.ndarray] = {}
    for name, t in module.named_parameters():
        if not t.is_floating_point() or t.ndim < 3 or not 2 <= t.shape[0] <= MAX_SLICES \
                or t.numel() // t.shape[0] != size:
            continue  # a matrix's rows are no stack: only a stack of matrices (or kernels) is
        value = t.detach().cpu().numpy()  # views of the parameter: nothing is copied
        out.update({f"{name}[{i}]": value[i] for i in range(t.shape[0])})
    return out


def constant_activations(ctx: DiagnosisContext, size: int) -> dict[str, np.ndarray]:
    """Leaf-module outputs of ``size`` elements, by a name saying what the constant holding one would be."""
    if ctx.baseline.capture is None:
        return {}
    return {f"the output of {a.name} (folded into a constant)": np.asarray(a.value, dtype=np.float64)
            for a in ctx.baseline.capture.activations
            if a.is_leaf and a.module and a.value.size == size and a.value.dtype.kind == "f" and a.call == 0}


def nearest_parameter(value: np.ndarray, name: str, candidates: dict[str, np.ndarray], rnn_input: bool = False):
    """``(parameter, relation, torch value)`` of the closest candidate (an exact name match is preferred, the
    name's BatchNorm fold matching it too)."""
    scored = []
    for pname, tensor in candidates.items():
        if rnn_input and RAW_RNN.search(pname):  # an ONNX RNN never reads PyTorch's gate order: that is the bug
            continue
        rel = layout.relate(value, tensor)
        if rel is not None:  # an RNN's gates in another order: its own weight, though another correlates better
            gates = not rel.equal and is_rnn_parameter(pname) and gates_exchanged(value, tensor)
            # a BatchNorm folded into a conv keeps the conv's parameter name: its fold is named so too
            named = pname == name or pname.startswith(f"fold({name}, ")
            scored.append((rel.equal, named, gates, -rel.rel_l2, pname, rel, tensor))
    if not scored:
        return None
    *_, pname, rel, tensor = max(scored, key=lambda s: s[:4])
    return pname, rel, tensor


def model_arrays(ctx: DiagnosisContext) -> dict[str, np.ndarray]:
    module = ctx.baseline.loaded.module
    return {} if module is None else {n: to_numpy(t) for n, t in
                                      [*module.named_parameters(), *module.named_buffers()] if t.is_floating_point()}


#: weights tried per diagnosis in each other layout (swapped, flipped, reversed)
MAX_SWAPS = 4


def output_axis(proto, value: np.ndarray) -> int:
    """The axis of a product's weight that indexes its output channels."""
    if proto.op_type in ("Conv", "FusedConv"):
        return 0
    if proto.op_type == "ConvTranspose":
        return 1
    if proto.op_type in ("Gemm", "FusedGemm"):
        return 0 if attribute(proto, "transB", 0) else 1
    return value.ndim - 1  # MatMul: x @ B, B's last axis


def bias_input(ctx: DiagnosisContext, proto) -> str | None:
    """The constant a product adds as its bias: its third input (Conv, Gemm), or the constant of the one Add that
    reads a MatMul's output."""
    if proto.op_type != "MatMul" and len(proto.input) > 2 and proto.input[2]:
        return proto.input[2]
    graph = ctx.onnx.graph
    readers = [graph.nodes[c] for c in graph.consumers.get(proto.output[0], ())] if proto.output else []
    if len(readers) == 1 and readers[0].op_type == "Add":
        other = [i for i in readers[0].inputs if i != proto.output[0]]
        return other[0] if len(other) == 1 and graph.is_constant(other[0]) else None
    return None


def readers_own(ctx: DiagnosisContext, candidates, size: int, initializer: str) -> dict[str, np.ndarray]:
    """The parameters of ``size`` elements of the modules whose nodes in the segment read ``initializer`` (by
    their scope): a weight's own module, wherever the segment's output was paired."""
    modules = {ctx.module_of(n)[0] for n in ctx.segment_nodes if initializer in n.inputs} - {None, ""}
    return {k: v for k, v in candidates.items() if v.size == size and any(k.startswith(m + ".") and "." not in
                                                                            k[len(m) + 1:] for m in modules)}


def own_tensors(ctx: DiagnosisContext, candidates, size: int) -> dict[str, np.ndarray]:
    """The divergent module's own tensors of ``size`` elements: for an op, the parameters PyTorch's ops in the
    segment read (:attr:`DiagnosisContext.op_params`); else its parameters and folds, and its sibling Linear
    layers' weights concatenated with its own (a merged q/k/v projection) — not its neighbours' (a key's weight
    and a value's, exchanged, are both near)."""
    read = ctx.op_params
    by_op = {k: v for k, v in candidates.items()  # an op's own: the parameters PyTorch's ops in the segment read
             if v.size == size and (k in read or k.startswith("fold(") and any(  # (a functional attention's
                 f"{p}," in k or f"{p})" in k for p in read))}  # projections, another module's weight)
    if by_op:
        return by_op
    module = ctx.layer.pair.activation.module
    if not module:
        return {}
    parent = module.rpartition(".")[0]
    own = {k: v for k, v in candidates.items() if v.size == size and (ctx.owns(module, k) or k.startswith(
        "fold(") and f"{module}." in k)}
    for key, value in concatenated_parameters(ctx, size).items():
        parents = {part.strip().rsplit(".", 2)[0] for part in key[len("concat("):-1].split(",")}
        if parents == {parent} and f"{module}." in key:
            own[key] = value
    return own
