"""Activations with no ONNX tensor: values folded into constants, and the reason every other one has none."""
from __future__ import annotations

from ..records import Absence, Activation, MatchMethod, TensorPair
from ..records.nest import informative
from .similarity import STRUCTURE_MAX_REL, kind
from .state import AlignInputs, AlignmentState, Claim
from .structure import layout_of

#: how a note saying that nothing in the graph computes an activation begins
ABSENT = "absent from the ONNX graph"


def mark_folded_constants(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Unaligned leaves whose value is an initializer: computed once and folded into a constant
    (position embeddings of a fixed length), so nothing in the graph computes them."""
    constants = [t for t in x.values if t in x.graph.initializers]
    draft = state.draft()
    for a in x.acts:
        if a.index in draft or not (a.is_leaf and a.module) or kind(a.value) != "f":
            continue
        for t in constants:
            found = layout_of(a.value, x.values[t])
            if found is not None and found[1] <= STRUCTURE_MAX_REL:
                draft.claim(TensorPair(a, None, None, None, MatchMethod.NONE, 0.0,
                                       f"{ABSENT}: its value is the constant {t} (folded when the file was made)",
                                       absent=Absence.FOLDED_CONSTANT))
                break
    return draft.claims


def release_constants(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Pairs whose ONNX tensor no graph input reaches and holds one number repeated (an initial state of zeros,
    a placeholder a simplifier left where it pruned the computation) while the activation holds varied numbers:
    nothing computes it at run time, so it is no layer's output to measure (onnxsim pruned the state xLSTM's
    backend returns, and its scope's boundary named the zeros it starts from)."""
    live = x.graph.input_fed
    draft = state.draft()
    for pair in list(draft.values()):
        t = pair.tensor
        if t is None or t in live or t not in x.values or kind(pair.activation.value) != "f" \
                or informative(x.values[t]) or not informative(pair.activation.value):
            continue  # (a folded table of numbers may be a stale one: that stays the weight rule's to name)
        if not _holds(pair, x.values[t]):
            draft.release(pair.activation.index)
    return draft.claims


def release_unread(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Pairs whose ONNX tensor no graph output is computed from (a TopK's values where only its indices are read)
    and does not hold the activation's value: what it holds changes nothing the file computes, so it is no
    layer's output to measure — a module output the file never computes (ViTMAE's mask, pruned: nothing
    downstream reads it) was paired there by its scope, and measured as a hidden fault."""
    reaching = x.graph.output_reaching
    draft = state.draft()
    for pair in list(draft.values()):
        t = pair.tensor
        # (one that holds the value is kept: a GRU's final state nothing reads still shows its module's)
        if t is not None and t not in reaching and t in x.values and not _holds(pair, x.values[t]):
            draft.release(pair.activation.index)
    return draft.claims


def _holds(pair: TensorPair, value) -> bool:
    """Whether the ONNX tensor's ``value`` is the activation's, in some layout, at the structure pass's closeness."""
    return holds(pair.activation.value, value)


def holds(activation_value, value) -> bool:
    """Whether ``value`` is ``activation_value``, in some layout, at the structure pass's closeness (a layout
    beyond that on a sample of the elements is not measured on all of them)."""
    found = layout_of(activation_value, value, screen=STRUCTURE_MAX_REL)
    return found is not None and found[1] <= STRUCTURE_MAX_REL


def unmatched(a: Activation, scopes, values) -> TensorPair:
    """No pair for ``a``, with the reason (and :class:`Absence` when nothing in the graph computes it)."""
    absent = None
    if a.module in scopes.boundary:
        same = [t for t in scopes.boundary[a.module] if t in values and values[t].shape == a.value.shape]
        sized = [t for t in scopes.boundary[a.module] if t in values and values[t].size == a.value.size]
        if same:
            note = (f"{len(same)} ONNX tensor(s) of shape {list(a.value.shape)} leave this module's scope and none "
                    "holds its value")
        elif sized:
            note = (f"no ONNX tensor of shape {list(a.value.shape)} leaves this module's scope; "
                    f"{len(sized)} of as many elements ({', '.join(repr(t) for t in sized[:3])}) neither hold its "
                    "value nor are its only reshaped output")
        else:
            note = f"no ONNX tensor of shape {list(a.value.shape)} leaves this module's scope"
    elif a.module in scopes.blocked:
        note = ("its ONNX tensors are held in ONNX Runtime's channel-blocked NCHWc layout (a file saved after "
                "ORT_ENABLE_ALL optimization on CPU): their memory is not the NCHW shape they declare, so they are "
                "not compared; the comparison resumes after the ReorderOutput node")
    elif scopes.module_of:
        note = (f"{ABSENT}: no node carries this module's scope (pruned as unused or folded into a "
                "constant) and no tensor with equal values was found")
        absent = Absence.NO_SCOPE
    else:
        note = "the graph carries no scope information and no tensor with equal values was found"
    return TensorPair(a, None, None, None, MatchMethod.NONE, 0.0, note, absent=absent)
