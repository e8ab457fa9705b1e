"""The sixteenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a converter's, a graph rewriter's, a hand-written port's or a deployment's mistake the earlier
sets never planted:

* ``softmax-flattened`` — opset-11 Softmax semantics kept where opset 13's are meant (a converter or a version
  converter that emits ``Softmax`` without its axis, or keeps the old coercion to 2-D): the input flattened from
  an axis on and normalised jointly over every axis from there, instead of over the one axis.  A Softmax /
  LogSoftmax of rank ≥ 3 replaced by Flatten(axis) → Softmax over the flattened tail → Reshape back (axis 1, the
  opset-11 default, first; then the node's own axis when it is not the last; then rank − 2).  ``softmax-axis``
  moves the normalisation to another single axis, ``softmax-chunked`` splits it.  Expected ``attribute-mismatch``.
* ``view-for-permute`` — a permute written as a view (``x.view(B, H, S, d)`` where ``x.permute(…)`` was meant,
  a converter lowering a Transpose to a Reshape of the same output shape): the data kept in the input's memory
  order and merely re-shaped.  A Transpose of a computed float tensor replaced by a Reshape to its output shape,
  where the two differ.  ``transpose-perm`` swaps two perm entries (another transpose), ``reshape-order`` splits an
  axis in the other order.  Expected ``attribute-mismatch``.
* ``layer-repeated`` — a residual block applied twice with the same weights (an unrolled loop off by one, a
  weight-shared stack run one step too many, a hand-port's ``range(n + 1)``): the nodes from a residual Add's
  skip input to the Add copied after it and run on its output.  Blocks of up to 11 nodes (an MLP, a conv block, a
  norm + MLP; the copy with its Add ≤ 12 nodes, the tool's segment limit).  ``op-doubled`` repeats one node,
  ``residual-doubled`` the skip.  Expected ``attribute-mismatch``.
* ``norm-placement`` — pre-LN and post-LN exchanged (``norm_first`` read wrong, a hand-port that normalises the
  block's input where the model normalises the residual sum, or the other way round): ``x + f(N(x))`` rewired to
  ``N(x + f(x))``, or ``N(x + f(x))`` to ``x + f(N(x))``, for a LayerNormalization / SimplifiedLayerNormalization /
  RMSNormalization node and the residual Add around one block.  ``norm-scale-before`` moves only the norm's
  weight.  Expected ``attribute-mismatch``.
* ``rnn-state-carried`` — an RNN started from a state that is not zero: the previous layer's final state passed on
  as this layer's initial state (a stacked RNN port that threads ``(h, c)`` through the layers), else the final
  state of the tracing batch baked in as a constant (a stateful RNN exported with its state captured).  An LSTM /
  GRU / RNN whose initial_h (and initial_c) is empty or zero given the previous RNN's Y_h (Y_c) where the shapes
  agree, else the constant.  ``rnn-attr`` and ``rnn-layout`` change the cell.  Expected ``attribute-mismatch``
  (``weight-mismatch`` recorded as also accepted: the state is a constant input).
* ``pool-window`` — a pooling window of another size with the padding adjusted so the shape stays (a port of
  ``MaxPool2d(3, 2, padding=1)`` as ``MaxPool2d(2, 2)`` or back, TF ``'SAME'`` pools ported with another window):
  a MaxPool's / AveragePool's kernel made one larger (pads +1 on each side, else at the end), one smaller (pads −1
  on each side, else at the end) or two larger (pads +1 on each side), the first that keeps the output shape.  ``pool-mode`` swaps max ↔ average, ``pad-shift`` moves the padding.  Expected
  ``attribute-mismatch``.
* ``stride-moved`` — a downsampling stride put on the other convolution of a pair (ResNet v1 ↔ v1.5: the stride on
  the 1×1 convolution instead of the 3×3 one, a MobileNet port striding the expansion instead of the depthwise
  convolution): two Convs joined by elementwise ops (activations, BatchNorm, SiLU) only, the stride moved from
  one to the other where the output shape stays.  ``conv-dilation`` changes the dilation.  Expected
  ``attribute-mismatch``.
* ``residual-rescaled`` — a residual sum rescaled the model does not rescale (diffusers' ``output_scale_factor``,
  a DeepNet / "skip scale" 1/√2 from another model's port): a Mul by 1/√2 inserted after a residual Add of two
  computed tensors (one an ancestor of the other).  ``scale-constant`` changes an existing scale, ``embed-scale``
  adds one to an embedding.  Expected ``attribute-mismatch``.

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; a site where even the strongest
variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (:func:`sweep_faults_thirteen._counting`),
so every planted fault of this set counts.

Planted nodes: only the nodes whose own output is wrong, changed or inserted — the flattened Softmax (not the
Flatten and Reshape around it, which move values only); the Reshape that replaced the Transpose; every node of the
repeated copy (its Add writes the block's output); the moved norm and the branch nodes rewired to read the raw
stream (pre → post) or the norm's output (post → pre); the RNN given the state; the pool; both Convs (the one now
striding writes another shape, the other another value); the inserted Mul.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, Planted, Site, attribute, constant, copy,
                          drop_stale_value_info, insert_nodes, node_by_name, producer, readers, replace_node,
                          set_attr, unique_name)
from sweep_faults_nine import _onnx
from sweep_faults_ops import _opset
from sweep_faults_ten import _checked, _dynamic, _named, _value
from sweep_faults_thirteen import _add_constant, _after, _counting, _norm_axis
from sweep_faults_twelve import _float_output, _graph_outputs

MS_DOMAIN = "com.microsoft"
SEGMENT = 12  # the tool's segment limit (fault_sweep.MAX_SEGMENT): a planted set larger than it cannot be pinpointed


def _producers(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in proto.graph.node for o in n.output if o}


def _ancestor_tensors(proto: onnx.ModelProto, tensor: str, made: dict | None = None) -> set[str]:
    """Every tensor ``tensor`` is computed from (itself included)."""
    made = made if made is not None else _producers(proto)
    seen, stack = set(), [tensor]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        node = made.get(t)
        if node is not None:
            stack += [i for i in node.input if i]
    return seen


def _block(proto: onnx.ModelProto, x: str, g: str, made: dict | None = None) -> list[onnx.NodeProto]:
    """The nodes computing ``g`` from ``x``: descendants of ``x`` that are ancestors of ``g``, in graph order."""
    made = made if made is not None else _producers(proto)
    up = _ancestor_tensors(proto, g, made)
    down, found = {x}, []
    for n in proto.graph.node:
        if any(i in down for i in n.input if i):
            down.update(o for o in n.output if o)
            if any(o in up for o in n.output if o):
                found.append(n)
    return found


def _residuals(ctx: FileContext) -> list[tuple[onnx.NodeProto, int]]:
    """(Add, k): named ONNX Adds of two computed float tensors of the output's shape, input k (the skip) an
    ancestor of the other (the branch)."""
    dynamic, made, found = _dynamic(ctx), _producers(ctx.proto), []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Add" or not _onnx(n.domain) or len(n.input) != 2 or not _float_output(ctx, n) \
                or n.input[0] == n.input[1]:
            continue
        shape = ctx.values[n.output[0]].shape
        if not all(t in dynamic and t in ctx.values and ctx.values[t].shape == shape for t in n.input):
            continue
        for k in (0, 1):
            if n.input[k] in _ancestor_tensors(ctx.proto, n.input[1 - k], made):
                found.append((n, k))
                break
    return found


# --------------------------------------------------------------------------- opset-11 softmax semantics

SOFTMAX_OPS = ("Softmax", "LogSoftmax")


def flattened_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Softmax / LogSoftmax nodes (opset ≥ 13) of a float tensor of rank ≥ 3: ``(axis, starts)``, the
    axes to flatten from (1, the node's axis when not last, rank − 2; those normalising more than the axis)."""
    if _opset(ctx) < 13:
        return []
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in SOFTMAX_OPS or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        v = ctx.values[n.output[0]]
        if v.ndim < 3:
            continue
        axis = _norm_axis(attribute(n, "axis", -1), v.ndim)
        starts = [s for s in dict.fromkeys((1, axis, v.ndim - 2))
                  if s <= axis and int(np.prod(v.shape[s:])) > v.shape[axis]]
        if starts:
            sites.append(Site(n.name, (axis, tuple(starts))))
    return sites


def plant_softmax_flattened(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Flatten(start) → the Softmax over the flattened tail → Reshape to the input's shape.  Planted: the
    Softmax."""
    axis, starts = site.detail
    node = node_by_name(ctx.proto, site.node)
    shape = ctx.values[node.output[0]].shape

    def variants():
        for start in starts:
            out = copy(ctx.proto)
            y = node.output[0]
            base = f"{site.node}_flat{start}"
            flat, normed, dims = (unique_name(out, f"{y}_{k}") for k in ("flat", "flat_normed", "shape"))
            soft = helper.make_node(node.op_type, [flat], [normed], name=unique_name(out, f"{base}_softmax"), axis=1)
            new = [helper.make_node("Shape", [node.input[0]], [dims], name=unique_name(out, f"{base}_shape")),
                   helper.make_node("Flatten", [node.input[0]], [flat], name=unique_name(out, f"{base}_flatten"),
                                    axis=start),
                   soft,
                   helper.make_node("Reshape", [normed, dims], [y], name=unique_name(out, f"{base}_reshape"))]
            replace_node(out, site.node, new)
            checked = _checked(ctx, out, [y])
            yield None if checked is None else Planted(
                checked, [soft.name], "attribute-mismatch",
                f"{node.op_type} {site.node} over axis {axis} of {list(shape)} computed with opset-11 semantics "
                f"from axis {start}: normalised jointly over axes {list(range(start, len(shape)))} "
                f"({int(np.prod(shape[start:]))} entries instead of {shape[axis]})",
                {"softmax": site.node, "from_axis": start})

    return _counting(ctx, variants(), "flattened softmax")


# --------------------------------------------------------------------------- a permute written as a view

def view_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Transposes of a computed float tensor whose output differs from the input merely reshaped."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Transpose" or not _onnx(n.domain) or not _float_output(ctx, n) or n.input[0] not in dynamic:
            continue
        x, y = _value(ctx, n.input[0]), ctx.values[n.output[0]]
        if x is not None and y.size > 1 and not np.array_equal(x.reshape(y.shape), y):
            sites.append(Site(n.name, (tuple(int(d) for d in y.shape),)))
    return sites


def plant_view_for_permute(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Transpose replaced by a Reshape to its output shape.  Planted: the Reshape."""
    (shape,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    perm = attribute(node, "perm")

    def variants():
        out = copy(ctx.proto)
        dims = _add_constant(out, f"{site.node}_view_shape", np.array(shape, np.int64))
        view = helper.make_node("Reshape", [node.input[0], dims], [node.output[0]],
                                name=unique_name(out, f"{site.node}_view"))
        replace_node(out, site.node, [view])
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [view.name], "attribute-mismatch",
            f"Transpose {site.node} (perm {list(perm) if perm is not None else 'reversed'}) of "
            f"{list(_value(ctx, node.input[0]).shape)} written as a view: a Reshape to {list(shape)}",
            {"transpose": site.node})

    return _counting(ctx, variants(), "view for permute")


# --------------------------------------------------------------------------- a residual block applied twice

def repeat_sites(ctx: FileContext) -> list[Site]:
    """Residual Adds (:func:`_residuals`) whose branch is at most ``SEGMENT − 1`` nodes computed from the skip
    (Constants aside): ``(k,)``."""
    made = _producers(ctx.proto)
    sites = []
    for n, k in _residuals(ctx):
        block = [b for b in _block(ctx.proto, n.input[k], n.input[1 - k], made) if b.op_type != "Constant"]
        if 1 <= len(block) <= SEGMENT - 1 and all(b.op_type not in ("LSTM", "GRU", "RNN", "Loop", "Scan", "If")
                                                  for b in block):
            sites.append(Site(n.name, (k,)))
    return sites


def plant_layer_repeated(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The branch's nodes and the Add copied after the Add, reading its output as their skip.  Planted: the copied
    nodes."""
    (k,) = site.detail
    add = node_by_name(ctx.proto, site.node)
    x, g = add.input[k], add.input[1 - k]

    def variants():
        out = copy(ctx.proto)
        block = _block(out, x, g)
        target = node_by_name(out, site.node)
        result = target.output[0]
        raw = unique_name(out, f"{result}_once")
        target.output[0] = raw
        rename = {x: raw}
        new = []
        for b in [*block, target]:
            c = onnx.NodeProto()
            c.CopyFrom(b)
            c.name = unique_name(out, f"{b.name or b.op_type}_again")
            for i, t in enumerate(c.input):
                c.input[i] = rename.get(t, t)
            for i, t in enumerate(c.output):
                if t:
                    if b is target:
                        c.output[i] = result
                    else:
                        rename[t] = c.output[i] = unique_name(out, f"{t}_again")
            c.ClearField("metadata_props")
            new.append(c)
            out.graph.node.append(c)  # (for unique_name; moved below)
        del out.graph.node[len(out.graph.node) - len(new):]
        insert_nodes(out, site.node, [], new)
        checked = _checked(ctx, out, [result])
        counted = [c.name for c in new if c.op_type != "Constant"]
        yield None if checked is None else Planted(
            checked, counted, "attribute-mismatch",
            f"residual block ending at Add {site.node} ({len(counted) - 1} branch nodes from {x}) applied a second "
            f"time with the same weights on its own output", {"add": site.node, "block": [b.name for b in block]})

    return _counting(ctx, variants(), "block repeated")


# --------------------------------------------------------------------------- pre-LN ↔ post-LN

PLACED_NORMS = ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization")
DECOMPOSED_NORM_START = ("ReduceMean", "Pow")  # a written-out norm's first nodes on its input


def _single_output_norm(ctx: FileContext, n: onnx.NodeProto) -> bool:
    outputs = _graph_outputs(ctx)
    return n.op_type in PLACED_NORMS and (_onnx(n.domain) or n.domain == MS_DOMAIN) and _float_output(ctx, n) \
        and not any(o and (o in outputs or readers(ctx.proto, o)) for o in n.output[1:])


def placement_sites(ctx: FileContext) -> list[Site]:
    """``("pre", add, k)``: a norm reading a residual Add's skip x, every reader of the norm in the branch that
    computes the Add's other input; ``("post", add, k)``: a norm that is the only reader of a residual Add (not a
    graph output) whose branch reads the skip x directly."""
    made = _producers(ctx.proto)
    outputs = _graph_outputs(ctx)
    sites = []
    for add, k in _residuals(ctx):
        x, g = add.input[k], add.input[1 - k]
        block = _block(ctx.proto, x, g, made)
        names = {b.name for b in block}
        for n in readers(ctx.proto, x):
            if n.name and n.name in names and _single_output_norm(ctx, n) and n.input[0] == x:
                users = readers(ctx.proto, n.output[0])
                if users and all(u.name and u.name in names for u in users) and n.output[0] not in outputs:
                    sites.append(Site(n.name, ("pre", add.name, k)))
        after = readers(ctx.proto, add.output[0])
        if len(after) == 1 and after[0].name and _single_output_norm(ctx, after[0]) \
                and after[0].input[0] == add.output[0] and add.output[0] not in outputs:
            entry = [b for b in block if x in b.input]
            # (a branch that starts with a norm is a pre-LN block: the norm after its Add is the final norm)
            if entry and all(b.name and b.op_type not in PLACED_NORMS and b.op_type not in DECOMPOSED_NORM_START
                             for b in entry):
                sites.append(Site(after[0].name, ("post", add.name, k)))
    return sites


def plant_norm_placement(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Pre → post: the norm's readers read x, the norm moved after the Add (it writes the Add's old output).  Post
    → pre: the norm reads x and is moved before the branch, whose readers of x read it; the Add writes the norm's
    old output.  Planted: the norm and the rewired branch nodes."""
    how, add_name, k = site.detail
    add = node_by_name(ctx.proto, add_name)
    x, g = add.input[k], add.input[1 - k]
    norm = node_by_name(ctx.proto, site.node)

    def variants():
        out = copy(ctx.proto)
        n = node_by_name(out, site.node)
        moved = onnx.NodeProto()
        moved.CopyFrom(n)
        if how == "pre":
            rewired = [r.name for r in readers(out, n.output[0])]
            for name in rewired:
                r = node_by_name(out, name)
                for i, t in enumerate(r.input):
                    if t == n.output[0]:
                        r.input[i] = x
            a = node_by_name(out, add_name)
            result = a.output[0]
            raw = unique_name(out, f"{result}_unnormed")
            a.output[0] = raw
            moved.input[0] = raw
            moved.output[0] = result
            out.graph.node.remove(n)
            insert_nodes(out, add_name, [], [moved])
            text = f"pre-LN block rewired to post-LN: x + f({norm.op_type}(x)) → {norm.op_type}(x + f(x))"
        else:
            block = _block(out, x, g)
            rewired = [b.name for b in block if x in b.input]
            normed = unique_name(out, f"{x}_prenormed")
            moved.input[0] = x
            moved.output[0] = normed
            for name in rewired:
                r = node_by_name(out, name)
                for i, t in enumerate(r.input):
                    if t == x:
                        r.input[i] = normed
            a = node_by_name(out, add_name)
            a.output[0] = n.output[0]
            out.graph.node.remove(n)
            first = next(b.name for b in out.graph.node if b.name in set(rewired))
            insert_nodes(out, first, [moved], [])
            text = f"post-LN block rewired to pre-LN: {norm.op_type}(x + f(x)) → x + f({norm.op_type}(x))"
        moved.name = site.node
        checked = _checked(ctx, out, [add.output[0] if how == "pre" else norm.output[0]])
        yield None if checked is None else Planted(
            checked, [site.node, *rewired], "attribute-mismatch",
            f"{text} around Add {add_name} ({norm.op_type} {site.node}; branch nodes {', '.join(rewired)} rewired)",
            {"norm": site.node, "add": add_name, "direction": f"{how} → {'post' if how == 'pre' else 'pre'}"})

    return _counting(ctx, variants(), "norm placement")


# --------------------------------------------------------------------------- an RNN started from a carried state

RNN_OPS = ("LSTM", "GRU", "RNN")


def _zero_state(ctx: FileContext, node: onnx.NodeProto, index: int) -> bool:
    if len(node.input) <= index or not node.input[index]:
        return True
    v = _value(ctx, node.input[index])
    return v is not None and v.dtype.kind == "f" and not np.any(v)


def _upstream_rnn(ctx: FileContext, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The nearest LSTM / GRU / RNN the node's sequence input is computed from through layout and elementwise
    nodes (one computed input each), of the same op, hidden size, direction and layout."""
    dynamic = _dynamic(ctx)
    t = node.input[0]
    for _ in range(12):
        p = producer(ctx.proto, t)
        if p is None:
            return None
        if p.op_type == node.op_type and _onnx(p.domain):
            same = all(attribute(p, a, d) == attribute(node, a, d)
                       for a, d in (("hidden_size", None), ("direction", b"forward"), ("layout", 0)))
            return p if same and p.name else None
        live = [i for i in p.input if i in dynamic]
        if len(set(live)) != 1:
            return None
        t = live[0]
    return None


def state_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX LSTM / GRU / RNN nodes whose initial_h (and an LSTM's initial_c) is absent or zero."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type in RNN_OPS and _onnx(n.domain) and (n.input[0] in ctx.values or n.input[0] in ctx.feeds) \
                and n.output and n.output[0] in ctx.values and _zero_state(ctx, n, 5) \
                and (n.op_type != "LSTM" or _zero_state(ctx, n, 6)):
            sites.append(Site(n.name))
    return sites


def _with_state_outputs(out: onnx.ModelProto, name: str, count: int) -> list[str]:
    """Node ``name``'s Y_h (and Y_c) output names in ``out``, given names where they were empty."""
    node = node_by_name(out, name)
    while len(node.output) < 1 + count:
        node.output.append("")
    for i in range(1, 1 + count):
        if not node.output[i]:
            node.output[i] = unique_name(out, f"{node.output[0] or name}_state{i}")
    return list(node.output[1:1 + count])


def _set_input(node: onnx.NodeProto, index: int, tensor: str) -> None:
    while len(node.input) <= index:
        node.input.append("")
    node.input[index] = tensor


def plant_rnn_state_carried(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """initial_h (initial_c) = the upstream RNN's Y_h (Y_c), else a constant: this RNN's own final state on the
    feeds.  Planted: the RNN."""
    node = node_by_name(ctx.proto, site.node)
    count = 2 if node.op_type == "LSTM" else 1
    up = _upstream_rnn(ctx, node)

    def carried():
        out = copy(ctx.proto)
        states = _with_state_outputs(out, up.name, count)
        target = node_by_name(out, site.node)
        for i, s in enumerate(states):
            _set_input(target, 5 + i, s)
        checked = _checked(ctx, out, [node.output[0]])
        return None if checked is None else Planted(
            checked, [site.node], "attribute-mismatch",
            f"{node.op_type} {site.node} started from the final state of {up.op_type} {up.name} (a stacked RNN "
            f"that threads (h, c) through its layers) instead of zeros",
            {"rnn": site.node, "from": up.name, "also_accepted": "weight-mismatch"})

    def baked():
        probe = copy(ctx.proto)
        states = _with_state_outputs(probe, site.node, count)
        finals = ctx.tensors(probe, states)
        out = copy(ctx.proto)
        target = node_by_name(out, site.node)
        dtype = ctx.values[node.output[0]].dtype if node.output[0] in ctx.values else np.float32
        for i, s in enumerate(states):
            _set_input(target, 5 + i, _add_constant(out, f"{site.node}_stale_state{i}", finals[s].astype(dtype)))
        checked = _checked(ctx, out, [node.output[0]])
        return None if checked is None else Planted(
            checked, [site.node], "attribute-mismatch",
            f"{node.op_type} {site.node} started from a constant state: its own final state on the traced batch "
            f"baked in as initial_h{'/initial_c' if count == 2 else ''} (a stateful export)",
            {"rnn": site.node, "also_accepted": "weight-mismatch"})

    def variants():
        if up is not None:
            yield carried()
        yield baked()

    return _counting(ctx, variants(), "carried RNN state")


# --------------------------------------------------------------------------- a pooling window of another size

POOLS = ("MaxPool", "AveragePool")


def _pool_size(n: int, k: int, s: int, p0: int, p1: int, ceil: int) -> int:
    span = n + p0 + p1 - k
    return (-(-span // s) if ceil else span // s) + 1


def pool_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX MaxPool / AveragePool nodes (explicit pads, no dilation, one output used) of a computed float
    tensor: ``(options,)`` with each option (kernel, pads) keeping the output shape."""
    outputs = _graph_outputs(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in POOLS or not _onnx(n.domain) or not _float_output(ctx, n) \
                or attribute(n, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") \
                or any(d != 1 for d in attribute(n, "dilations", []) or []) \
                or any(o and (o in outputs or readers(ctx.proto, o)) for o in n.output[1:]):
            continue
        x = _value(ctx, n.input[0])
        kernel = list(attribute(n, "kernel_shape", []))
        r = len(kernel)
        if x is None or x.ndim != r + 2:
            continue
        strides = list(attribute(n, "strides", [1] * r))
        pads = list(attribute(n, "pads", [0] * 2 * r))
        ceil = int(attribute(n, "ceil_mode", 0))
        size = ctx.values[n.output[0]].shape[2:]
        options = []
        for dk, grow in ((1, "both"), (1, "end"), (-1, "both"), (-1, "end"), (2, "both")):
            new_k, new_p = [], []
            for a in range(r):
                k = kernel[a] + dk
                p0, p1 = pads[a], pads[a + r]
                if grow == "both":
                    step = 1 if dk > 0 else -1
                    q0, q1 = p0 + step * max(1, abs(dk) // 2), p1 + step * max(1, abs(dk) // 2)
                else:
                    q0, q1 = p0, p1 + dk
                if k < 1 or q0 < 0 or q1 < 0 or q0 >= k or q1 >= k:
                    break
                new_k.append(k)
                new_p += [q0, q1]
            else:
                p = new_p[0::2] + new_p[1::2]
                if all(_pool_size(x.shape[2 + a], new_k[a], strides[a], p[a], p[a + r], ceil) == size[a]
                       for a in range(r)) and (new_k, p) not in options:
                    options.append((new_k, p))
        if options:
            sites.append(Site(n.name, (tuple((tuple(k), tuple(p)) for k, p in options),)))
    return sites


def plant_pool_window(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The pool's kernel_shape and pads changed, the output shape kept.  Planted: the pool."""
    (options,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    kernel, pads = list(attribute(node, "kernel_shape")), list(attribute(node, "pads", [0] * 2 * len(
        attribute(node, "kernel_shape"))))

    def variants():
        for k, p in options:
            out = copy(ctx.proto)
            target = node_by_name(out, site.node)
            set_attr(target, "kernel_shape", list(k))
            set_attr(target, "pads", list(p))
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [site.node], "attribute-mismatch",
                f"{node.op_type} {site.node}'s window {kernel} (pads {pads}) made {list(k)} (pads {list(p)}), the "
                f"output shape kept", {"pool": site.node, "kernel": list(k), "pads": list(p)})

    return _counting(ctx, variants(), "pool window")


# --------------------------------------------------------------------------- a stride on the other convolution

ELEMENTWISE = ("Relu", "Clip", "LeakyRelu", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Elu", "Selu", "Gelu",
               "Softplus", "Mish", "BatchNormalization", "Identity", "Cast", "PRelu", "Mul", "Add", "Div", "Sub")


def _per_channel(ctx: FileContext, tensor: str, rank: int) -> bool:
    """A constant operand that broadcasts over the spatial axes (size 1 there)."""
    v = _value(ctx, tensor)
    if v is None:
        return False
    full = (1,) * (rank - v.ndim) + tuple(v.shape) if v.ndim <= rank else None
    return full is not None and all(d == 1 for d in full[2:])


ELEMENTWISE_MORE = ("Erf", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Min", "Max", "Where")


def _conv_pair(ctx: FileContext, conv: onnx.NodeProto) -> tuple[onnx.NodeProto, list[onnx.NodeProto]] | None:
    """(the Conv before ``conv``, the nodes between them) when ``conv``'s input is computed from the nearest Conv
    above it through elementwise nodes alone (activations written out — x·σ(x), the erf GELU — included; constant
    operands broadcasting over the spatial axes) that nothing else reads."""
    rank = ctx.values[conv.output[0]].ndim
    outputs = _graph_outputs(ctx)
    dynamic = _dynamic(ctx)
    kinds = ELEMENTWISE + ELEMENTWISE_MORE
    first, frontier, seen = None, [conv.input[0]], set()
    for _ in range(12):
        nxt = []
        for t in frontier:
            p = producer(ctx.proto, t)
            if p is None or not _onnx(p.domain):
                return None
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.op_type == "Conv":
                if first is not None and first is not p:
                    return None
                first = p
                continue
            if p.op_type not in kinds:
                return None
            nxt += [i for i in p.input if i in dynamic]
        frontier = nxt
        if not frontier:
            break
    if first is None or frontier or not first.name:
        return None
    chain = _block(ctx.proto, first.output[0], conv.input[0])
    members = {id(c) for c in chain} | {id(conv)}
    for m in chain:
        if m.op_type not in kinds or not m.name:
            return None
        for i in m.input:
            if i and i not in dynamic and not _per_channel(ctx, i, rank) and m.op_type != "BatchNormalization":
                return None
            if i in dynamic and i != first.output[0] and producer(ctx.proto, i) is not None \
                    and id(producer(ctx.proto, i)) not in members:
                return None
    for m in [first, *chain]:
        for o in m.output:
            if o and (o in outputs or any(id(r) not in members for r in readers(ctx.proto, o))):
                return None
    return first, chain


def _conv_out(n: int, k: int, s: int, p0: int, p1: int, d: int) -> int:
    return (n + p0 + p1 - d * (k - 1) - 1) // s + 1


def stride_sites(ctx: FileContext) -> list[Site]:
    """Named Conv pairs (:func:`_conv_pair`, explicit pads) where one strides (> 1) and the stride moved to the
    other keeps the second's output shape: ``(first, chain, strides of the first, strides of the second)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Conv" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        pair = _conv_pair(ctx, n)
        if pair is None:
            continue
        first, chain = pair
        convs = [first, n]
        if any(attribute(c, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") for c in convs):
            continue
        x = _value(ctx, first.input[0])
        r = x.ndim - 2 if x is not None else 0
        if r < 1:
            continue
        params = []
        for c in convs:
            w = constant(ctx.proto, c.input[1])
            kernel = list(attribute(c, "kernel_shape", list(w.shape[2:]) if w is not None else []))
            if len(kernel) != r:
                break
            params.append((kernel, list(attribute(c, "strides", [1] * r)), list(attribute(c, "pads", [0] * 2 * r)),
                           list(attribute(c, "dilations", [1] * r))))
        if len(params) != 2:
            continue
        (k1, s1, p1, d1), (k2, s2, p2, d2) = params
        if all(a == 1 for a in s1) == all(a == 1 for a in s2):
            continue  # exactly one of the two strides
        new1, new2 = list(s2), list(s1)
        size = x.shape[2:]
        mid = [_conv_out(size[a], k1[a], new1[a], p1[a], p1[a + r], d1[a]) for a in range(r)]
        end = [_conv_out(mid[a], k2[a], new2[a], p2[a], p2[a + r], d2[a]) for a in range(r)]
        if tuple(end) == tuple(ctx.values[n.output[0]].shape[2:]) and min(mid) >= 1:
            sites.append(Site(n.name, (first.name, tuple(c.name for c in chain), tuple(new1), tuple(new2))))
    return sites


def plant_stride_moved(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The strides of the two Convs exchanged.  Planted: both Convs."""
    first_name, chain, new1, new2 = site.detail
    second = node_by_name(ctx.proto, site.node)
    first = node_by_name(ctx.proto, first_name)

    def variants():
        out = copy(ctx.proto)
        set_attr(node_by_name(out, first_name), "strides", list(new1))
        set_attr(node_by_name(out, site.node), "strides", list(new2))
        try:
            out = drop_stale_value_info(ctx, out)
        except Exception:  # noqa: BLE001 - the variant does not run
            yield None
            return
        checked = _checked(ctx, out, [second.output[0]])
        yield None if checked is None else Planted(
            checked, [first_name, site.node], "attribute-mismatch",
            f"the stride of Conv {site.node if all(s == 1 for s in new2) else first_name} moved to Conv "
            f"{first_name if all(s == 1 for s in new2) else site.node} (Conv {first_name} → {list(new1)}, Conv "
            f"{site.node} → {list(new2)}; {len(chain)} elementwise nodes between them)",
            {"convs": [first_name, site.node], "first_kernel": list(attribute(first, "kernel_shape", []))})

    return _counting(ctx, variants(), "stride moved")


# --------------------------------------------------------------------------- a residual sum rescaled

RESCALE = (1 / math.sqrt(2), math.sqrt(2))
NORM_LIKE = ("GroupNormalization", "InstanceNormalization", "BatchNormalization")


def rescale_sites(ctx: FileContext) -> list[Site]:
    """Residual Adds (:func:`_residuals`) not already followed by a scalar Mul / Div."""
    sites = []
    for n, k in _residuals(ctx):
        after = readers(ctx.proto, n.output[0])
        if after and n.output[0] not in _graph_outputs(ctx) and all(
                r.op_type in PLACED_NORMS + NORM_LIKE and r.input[0] == n.output[0] for r in after):
            continue  # a norm alone reads the sum: the scale cancels
        if any(r.op_type in ("Mul", "Div") and any(
                (c := constant(ctx.proto, i)) is not None and c.size == 1 for i in r.input) for r in after):
            continue
        sites.append(Site(n.name, (k,)))
    return sites


def plant_residual_rescaled(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Mul by 1/√2 (else √2) inserted after the Add.  Planted: the Mul."""
    node = node_by_name(ctx.proto, site.node)
    dtype = ctx.values[node.output[0]].dtype

    def variants():
        for factor in RESCALE:
            def build(o, raw, result):
                c = _add_constant(o, f"{site.node}_skip_scale", np.array(factor, dtype))
                return [helper.make_node("Mul", [raw, c], [result], name=unique_name(o, f"{site.node}_rescaled"))]

            out, new = _after(ctx, site.node, build)
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [new[0].name], "attribute-mismatch",
                f"residual sum {site.node} ({list(ctx.values[node.output[0]].shape)}) multiplied by {factor:.4g} "
                f"(an output_scale_factor / skip scale the model does not have)",
                {"add": site.node, "factor": factor})

    return _counting(ctx, variants(), "residual rescaled")


KINDS = (
    FaultKind("softmax-flattened", flattened_sites, plant_softmax_flattened, "attribute-mismatch",
              "a Softmax with opset-11 semantics: normalised jointly over every axis from axis 1 (or its own axis) on",
              max_tries=40),
    FaultKind("view-for-permute", view_sites, plant_view_for_permute, "attribute-mismatch",
              "a Transpose written as a view: a Reshape to its output shape (the data not permuted)", max_tries=40),
    FaultKind("layer-repeated", repeat_sites, plant_layer_repeated, "attribute-mismatch",
              "a residual block applied twice with the same weights (an unrolled loop off by one)", max_tries=40),
    FaultKind("norm-placement", placement_sites, plant_norm_placement, "attribute-mismatch",
              "pre-LN ↔ post-LN: x + f(N(x)) rewired to N(x + f(x)), or back (norm_first read wrong)", max_tries=40),
    FaultKind("rnn-state-carried", state_sites, plant_rnn_state_carried, "attribute-mismatch",
              "an RNN started from a carried state: the previous layer's final state, or a baked-in stale state",
              max_tries=40),
    FaultKind("pool-window", pool_sites, plant_pool_window, "attribute-mismatch",
              "a pooling window one larger / smaller with the padding adjusted so the shape stays", max_tries=40),
    FaultKind("stride-moved", stride_sites, plant_stride_moved, "attribute-mismatch",
              "a downsampling stride moved to the other Conv of a pair (ResNet v1 ↔ v1.5)", max_tries=40),
    FaultKind("residual-rescaled", rescale_sites, plant_residual_rescaled, "attribute-mismatch",
              "a residual sum multiplied by 1/√2 the model does not apply (an output_scale_factor)", max_tries=40),
)
