"""GELU approximation: the ONNX segment computes one GELU form where PyTorch computes another — erf (exact), tanh
(``approximate="tanh"``, FastGelu) or the sigmoid "quick GELU" ``x·σ(1.702x)`` (CLIP's QuickGELU, a converter's
approximation)."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from ..support import edits
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute
from ..support.segment import downstream

ANCHORS = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Erf", "Tanh", "Sigmoid"}
_TANH_CLASSES = ("newgelu", "geluTanh".lower(), "pytorchgelutanh", "fastgelu", "gelupytorchtanh")


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x/2 (1 + erf(x/√2))``, in float64."""
    import torch  # noqa: PLC0415 - numpy has no erf; torch is always there when a model is

    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + torch.special.erf(torch.from_numpy(x / math.sqrt(2.0))).numpy())


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU, ``x/2 (1 + tanh(√(2/π)(x + 0.044715 x³)))``, in float64."""
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


#: the quick GELU's factor: ``x·σ(1.702x)``
QUICK = 1.702


def gelu_sigmoid(x: np.ndarray) -> np.ndarray:
    """Sigmoid-approximated ("quick") GELU, ``x·σ(1.702x)``, in float64."""
    x = x.astype(np.float64)
    return x / (1.0 + np.exp(-QUICK * x))


FORMULAS = {"erf": gelu_erf, "tanh": gelu_tanh, "sigmoid": gelu_sigmoid}


class GeluApproximation(Rule):
    """Evaluate both GELU formulas on the segment's real input and see which one each side follows."""

    cause = Cause.GELU_APPROXIMATION

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        protos = [n for n in ctx.segment_protos if n.op_type in ANCHORS]
        if not protos or not ctx.significant(ctx.layer.local):
            return None
        site = _locate(ctx, protos)
        if site is None:
            return None
        x, y, static, node_names, bias, whole = site
        values = ctx.run_segment(outputs=[t for t in (x, y, bias) if t], from_inputs=whole)
        dtype = values[x].dtype
        xv = values[x].astype(np.float64) + (values[bias].astype(np.float64) if bias else 0.0)
        yv = values[y].astype(np.float64)
        err = {name: float(np.max(np.abs(yv - f(xv)))) for name, f in FORMULAS.items()}
        follows = min(err, key=err.get)
        torch_formula, torch_err = _torch_formula(ctx, xv, y)
        if torch_formula is None or follows == torch_formula:
            return None
        gap = float(np.max(np.abs(FORMULAS[follows](xv) - FORMULAS[torch_formula](xv))))
        if gap <= ctx.noise_floor(yv):
            return None
        if static is not None and static != follows:
            return None  # the graph says one formula, the runtime computes the other: runtime-optimization
        evidence = {
            "gelu_nodes": node_names, "onnx_formula": follows, "pytorch_formula": torch_formula,
            **{f"max_abs_onnx_vs_{k}": v for k, v in err.items()}, "max_abs_between_formulas": gap,
        }
        evidence.update({f"max_abs_pytorch_vs_{k}": v for k, v in torch_err.items()})
        module = ctx.layer.pair.activation
        summary = (
            f"The ONNX GELU ({', '.join(node_names)}) computes the {follows} form while PyTorch's "
            f"{module.name} ({module.module_type}) uses the {torch_formula} form: on the segment's real input the "
            f"ONNX output is {err[follows]:.2g} from the {follows} formula and {err[torch_formula]:.2g} from the "
            f"{torch_formula} formula (the two formulas differ by up to {gap:.2g} there)."
        )
        fix = _fix_text(torch_formula)
        return Finding(self.cause, 0.9, summary, fix, evidence, changes=between(ctx, x, y),
                       counterfactual=lambda c: _switch(c, site, torch_formula, dtype))


def _fix_text(formula: str) -> str:
    if formula == "sigmoid":
        return ("Make the ONNX GELU compute PyTorch's quick GELU x·sigmoid(1.702·x) (Mul, Sigmoid, Mul; com.microsoft "
                "QuickGelu alpha=1.702) instead of a Gelu, or turn off the tool that rewrote it.")
    approximate = "none" if formula == "erf" else "tanh"
    rewriter = ("the FastGelu fusion / gelu approximation, or the converter that wrote a sigmoid (quick) GELU"
                if formula == "erf" else "the erf rewrite")
    return (f"Make the ONNX GELU use the {formula} form: export from nn.GELU(approximate='{approximate}'), set the "
            f"Gelu node's approximate attribute to '{approximate}', or turn off the tool that rewrote it ({rewriter}).")


def _locate(ctx: DiagnosisContext, protos: list[onnx.NodeProto]):
    """``(x, y, formula in the graph or None, nodes, bias, whole)`` of the segment's GELU, found by value
    (``whole``: its tensors are read from a run from the graph inputs, see :func:`_by_value`)."""
    for p in protos:
        if p.op_type == "Gelu":
            return (p.input[0], p.output[0], "tanh" if attribute(p, "approximate", "none") == "tanh" else "erf",
                    [p.name], None, False)
        if p.op_type == "QuickGelu":
            quick = math.isclose(attribute(p, "alpha", QUICK), QUICK, rel_tol=1e-3)
            return p.input[0], p.output[0], "sigmoid" if quick else None, [p.name], None, False
        if p.op_type in ("FastGelu", "BiasGelu"):
            bias = p.input[1] if len(p.input) > 1 and p.input[1] else None
            return p.input[0], p.output[0], "tanh" if p.op_type == "FastGelu" else "erf", [p.name], bias, False
    anchor = protos[0]
    found = _by_value(ctx, anchor, ctx.segment_protos, False)
    if found is None:  # a segment narrowed to the GELU's core (Erf where PyTorch ran tanh): widen to its tail
        found = _by_value(ctx, anchor, ctx.segment_protos + _tail(ctx.onnx.skeleton, anchor, ctx.segment_protos),
                          True)
    return found


#: nodes after the GELU's core (Erf or Tanh) that complete it: + 1, × x, × 0.5
TAIL = 3


def _tail(model: onnx.ModelProto, anchor: onnx.NodeProto, segment: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes at most :data:`TAIL` steps after ``anchor``, outside ``segment``, in graph order."""
    inside = {n.name for n in segment}
    frontier, reached = set(anchor.output), set()
    for _ in range(TAIL):
        step = {n.name for n in model.graph.node if n.name not in inside | reached and frontier & set(n.input)}
        reached |= step
        frontier = {o for n in model.graph.node if n.name in step for o in n.output}
    return [n for n in model.graph.node if n.name in reached]


def _by_value(ctx: DiagnosisContext, anchor: onnx.NodeProto, protos: list[onnx.NodeProto], whole: bool):
    """``(x, y, formula in the graph, nodes, None, whole)``: among ``protos``, the output after ``anchor`` that a
    GELU formula computes from another of their tensors, or None.  ``whole``: computed from the graph inputs,
    not cut at PyTorch's values (a tail beyond the segment reads PyTorch's ``1 + tanh(u)`` where it is cut)."""
    inside = {n.name for n in protos}
    float_outputs = [o for n in protos for o in n.output if o]
    read = [i for n in protos for i in n.input if i and ctx.initializer(i) is None] if whole else []
    values = ctx.run_segment(outputs=list(dict.fromkeys(float_outputs + read + list(ctx.segment_feeds(
        from_inputs=whole)))), from_inputs=whole)
    values = {k: v for k, v in values.items() if np.issubdtype(v.dtype, np.floating)}
    after = downstream(ctx.onnx.skeleton, anchor.output, inside)
    ys = [o for n in protos if n.name in after or n is anchor for o in n.output if o in values]
    xs = [t for t in values if t not in ys]
    best = None
    for y in ys:
        for x in xs:
            if values[x].shape != values[y].shape:
                continue
            err = min(float(np.max(np.abs(values[y] - f(values[x])))) for f in FORMULAS.values())
            if err <= 1e-3 * (1.0 + float(np.max(np.abs(values[y])))) and (best is None or err < best[0]):
                best = (err, x, y)
    if best is None:
        return None
    computing = _ancestors(protos, best[2])
    nodes = [n.name for n in protos if (n.name in after or n is anchor) and n.name in computing]
    # the graph's own form, to tell a runtime rewrite: an Erf is the exact form; a Tanh or a Sigmoid may carry any
    return best[1], best[2], "erf" if anchor.op_type == "Erf" else None, nodes, None, whole


def between(ctx: DiagnosisContext, x: str, y: str) -> tuple[str, ...]:
    """The nodes computing the GELU: on a path from its input ``x`` to its output ``y`` (the polynomial
    before a Tanh included), in graph order."""
    names = {n.name for n in ctx.onnx.skeleton.graph.node}
    after_x = downstream(ctx.onnx.skeleton, [x], names)
    computing = _ancestors(list(ctx.onnx.skeleton.graph.node), y)
    return tuple(n.name for n in ctx.onnx.skeleton.graph.node if n.name in after_x and n.name in computing)


def _ancestors(protos: list[onnx.NodeProto], tensor: str) -> set[str]:
    """The names of the nodes of ``protos`` that ``tensor`` is computed from (its producer included)."""
    producer = {o: n for n in protos for o in n.output}
    seen: set[str] = set()
    stack = [tensor]
    while stack:
        n = producer.get(stack.pop())
        if n is not None and n.name not in seen:
            seen.add(n.name)
            stack.extend(n.input)
    return seen


def _torch_formula(ctx: DiagnosisContext, x: np.ndarray, y: str):
    """PyTorch's GELU form: from the module's configuration, else from its output when it is ``y``."""
    torch_err = {}
    if y == ctx.tensor:
        ref = ctx.reference.astype(np.float64).reshape(x.shape)
        torch_err = {name: float(np.max(np.abs(ref - f(x)))) for name, f in FORMULAS.items()}
    op = next((f for a in (ctx.layer.pair.activation, *ctx.ops) if (f := _op_formula(a)) is not None), None)
    if op is not None:  # the divergent value's op, else one PyTorch ran around the segment (an erf written out)
        return op, torch_err
    for _, module in ctx.modules_near():
        kind = type(module).__name__.lower()
        if "gelu" not in kind:
            continue
        if "quick" in kind:
            return "sigmoid", torch_err
        approximate = getattr(module, "approximate", None)
        if approximate is not None:
            return ("tanh" if approximate == "tanh" else "erf"), torch_err
        return ("tanh" if any(k in kind for k in _TANH_CLASSES) else "erf"), torch_err
    if torch_err and min(torch_err.values()) < 0.1 * max(torch_err.values()):
        return min(torch_err, key=torch_err.get), torch_err
    return None, torch_err


def _op_formula(activation) -> str | None:
    """PyTorch's GELU form from the ATen op the divergent value is (op-level capture): an ``erf`` is the exact
    form's core (a GELU written out: ESM's, BERT's ``gelu``), ``aten.gelu`` says its ``approximate``."""
    name = activation.module_type if activation.op else ""
    if name.startswith("aten.erf"):
        return "erf"
    if name.startswith("aten.gelu"):
        approximate = dict((str(k), v) for k, v in activation.args).get("approximate", "none")
        return "tanh" if approximate == "tanh" else "erf"
    return None


def _switch(ctx: DiagnosisContext, site, formula: str, dtype) -> FixedSegment:
    """The skeleton with the GELU computing ``y`` from ``x`` replaced by ``formula``."""
    x, y, _, node_names, bias, whole = site
    model = edits.copy_model(ctx.onnx.skeleton)
    producer = next(n for n in model.graph.node if y in n.output)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    prefix = f"{producer.name}_as_{formula}"
    nodes = []
    if bias:
        nodes.append(helper.make_node("Add", [x, bias], [f"{prefix}_x"], name=f"{prefix}_bias"))
        x = f"{prefix}_x"
    # a segment narrowed to the GELU's core (its Erf or Tanh) is re-run at that core's tensor: the whole GELU is
    # replaced and the new core writes it
    core = next(n.output[0] for n in model.graph.node if n.name == node_names[0]) if whole else None
    if formula == "sigmoid":
        nodes += sigmoid_form(model, x, y, prefix, dtype, core)
    elif opset >= 20 and core is None:
        nodes.append(helper.make_node("Gelu", [x], [y], name=prefix,
                                      approximate="none" if formula == "erf" else "tanh"))
    else:
        nodes += decomposed(model, x, y, formula, prefix, dtype, core)
    edits.replace_nodes(model, set(node_names) if whole else {producer.name}, nodes)
    return FixedSegment(model, ctx.onnx.weights)


def decomposed(model, x: str, y: str, formula: str, prefix: str, dtype, core: str | None = None) -> list:
    def const(name, value):
        return edits.add_initializer(model, f"{prefix}_{name}", np.array(value, dtype=dtype))

    t = [f"{prefix}_{k}" for k in range(6)]
    if core is not None:  # the Erf's (t[1]) or the Tanh's (t[5]) output
        t[1 if formula == "erf" else 5] = core
    if formula == "erf":
        steps = [("Div", [x, const("sqrt2", math.sqrt(2.0))], t[0]), ("Erf", [t[0]], t[1]),
                 ("Add", [t[1], const("one", 1.0)], t[2]), ("Mul", [x, t[2]], t[3]),
                 ("Mul", [t[3], const("half", 0.5)], y)]
    else:
        steps = [("Mul", [x, x], t[0]), ("Mul", [t[0], x], t[1]), ("Mul", [t[1], const("c", 0.044715)], t[2]),
                 ("Add", [x, t[2]], t[3]), ("Mul", [t[3], const("k", math.sqrt(2.0 / math.pi))], t[4]),
                 ("Tanh", [t[4]], t[5]), ("Add", [t[5], const("one", 1.0)], f"{prefix}_6"),
                 ("Mul", [x, f"{prefix}_6"], f"{prefix}_7"), ("Mul", [f"{prefix}_7", const("half", 0.5)], y)]
    return [helper.make_node(op, ins, [out], name=f"{prefix}_{k}_{op}") for k, (op, ins, out) in enumerate(steps)]


def sigmoid_form(model, x: str, y: str, prefix: str, dtype, core: str | None) -> list:
    """``x·σ(1.702x)`` written as ``x/2·(1 + tanh(0.851x))`` (the same numbers): the Tanh writes ``core`` when the
    segment ends at the replaced GELU's core."""
    def const(name, value):
        return edits.add_initializer(model, f"{prefix}_{name}", np.array(value, dtype=dtype))

    t = [f"{prefix}_{k}" for k in range(4)]
    if core is not None:
        t[1] = core
    steps = [("Mul", [x, const("k", QUICK / 2)], t[0]), ("Tanh", [t[0]], t[1]),
             ("Add", [t[1], const("one", 1.0)], t[2]), ("Mul", [x, t[2]], t[3]), ("Mul", [t[3], const("half", 0.5)], y)]
    return [helper.make_node(op, ins, [out], name=f"{prefix}_{k}_{op}") for k, (op, ins, out) in enumerate(steps)]
