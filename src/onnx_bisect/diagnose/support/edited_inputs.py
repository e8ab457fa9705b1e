"""The values an edit gives a segment's inputs when the edited nodes lie before the segment (a gate, a key's path, a
block computed upstream of a segment narrowed past them): the segment is fed those, not PyTorch's values there."""
from __future__ import annotations

from . import edits


def edited_inputs(ctx, edit, nodes: set[str]) -> dict | None:
    """The edited values of the segment's inputs that ``nodes`` compute, with every tensor of those nodes run (none
    fed); {} when the segment reads none of them; None when the edited graph does not run."""
    graph = ctx.onnx.graph
    model, weights = edit(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights)
    made = {o for n in graph.nodes if n.name in nodes for o in n.outputs if o}
    _, boundary, _ = ctx.segment_model(model, weights)
    fed = [t for t in boundary if t in made]
    if not fed:
        return {}
    try:
        values = ctx.run_segment(model, weights, outputs=fed, through=sorted(made))
    except Exception:  # noqa: BLE001 - an edit the runtime rejects is no reading
        return None
    return {t: values[t] for t in fed if t in values}
