"""The alignment as it grows: pairs found so far, and the claims each pass makes on them.

A pass never writes to shared state: it reads an :class:`AlignmentState`,
decides in a :class:`Draft` (which sees its own earlier decisions, since many
passes build on the pairs they just made), and returns its claims.
:meth:`AlignmentState.apply` turns them into the next state.  A claim on an
activation that already has a pair must say it replaces it; a release removes a
pair.  The order of the passes is data, in :mod:`.passes`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import numpy as np

from ..records import Activation, Capture, MatchMethod, TensorPair
from ..records.graph import GraphIndex


@dataclass(frozen=True)
class Claim:
    """One pass's decision about one activation: this pair (``pair``), or no pair any more (``pair`` None)."""

    index: int
    pair: TensorPair | None
    replaces: bool = False  # the pass knowingly overrides an earlier pair


@dataclass(frozen=True)
class AlignInputs:
    """What every pass reads besides the pairs: the activations, the graph, its scopes and the probed values."""

    capture: Capture
    graph: GraphIndex
    scopes: object  # scopes.ScopeMap (kept untyped here: scopes imports this module)
    values: Mapping[str, np.ndarray]
    #: makes the output tensors of layers anchored by their weights, owned by them (see :mod:`.anchors`); asked
    #: only by the loose pass
    anchor: Callable[[], Mapping[str, float]] | None = None
    #: ``(weight initializer, factor) -> bool``: whether it holds a PyTorch layer's weight divided by the factor
    #: (see :func:`.anchors.holds_divided`); asked only where a tensor holds its value times a factor
    divided: Callable[[str, float], bool] | None = None

    @cached_property
    def owners(self) -> Mapping[str, float]:
        """The anchored layers' output tensors, owned by them (empty without an ``anchor``)."""
        return self.anchor() if self.anchor is not None else {}

    @property
    def acts(self) -> tuple[Activation, ...]:
        """The activations, in capture order (``acts[i].index == i``)."""
        return self.capture.activations

    @cached_property
    def signatures(self) -> dict[str, tuple[int, float, float] | None]:
        """Every computed tensor's permutation-invariant signature (see :func:`.structure.signatures_of`)."""
        from .structure import signatures_of

        return signatures_of(self.graph, self.values)

    @cached_property
    def output_divergence(self) -> float:
        """The largest relative L2 distance between a graph output and the model's output."""
        from .structure import output_divergence

        return output_divergence(self.capture, self.graph, self.values)


class AlignmentState:
    """The pairs found so far, by activation index; read-only to the passes."""

    def __init__(self, pairs: Mapping[int, TensorPair] | None = None):
        self._pairs = dict(pairs or {})

    @property
    def pairs(self) -> Mapping[int, TensorPair]:
        """Every pair, by activation index (a read-only view)."""
        return MappingProxyType(self._pairs)

    def get(self, index: int) -> TensorPair | None:
        """The pair of activation ``index``, if any."""
        return self._pairs.get(index)

    def __contains__(self, index: int) -> bool:
        return index in self._pairs

    def draft(self) -> Draft:
        """A scratch copy a pass grows while it decides; its :attr:`Draft.claims` are the pass's result."""
        return Draft(self._pairs)

    def apply(self, claims: Iterable[Claim]) -> AlignmentState:
        """The next state: ``claims`` applied in order (a later claim on the same activation wins)."""
        pairs = dict(self._pairs)
        for c in claims:
            if c.pair is None:
                pairs.pop(c.index, None)
            elif c.index in pairs and not c.replaces and pairs[c.index] != c.pair:
                raise ValueError(f"a pass paired activation {c.index} again without replacing its pair")
            else:
                pairs[c.index] = c.pair
        return AlignmentState(pairs)


class Draft:
    """The pairs as one pass sees them while it runs: the state's, plus what the pass claimed so far."""

    def __init__(self, base: Mapping[int, TensorPair]):
        self._pairs = dict(base)
        self.claims: list[Claim] = []

    def get(self, index: int) -> TensorPair | None:
        """The pair of activation ``index`` as of now, if any."""
        return self._pairs.get(index)

    def __contains__(self, index: int) -> bool:
        return index in self._pairs

    def values(self):
        """Every current pair."""
        return self._pairs.values()

    def claim(self, pair: TensorPair, replaces: bool = False) -> None:
        """Pair ``pair.activation`` (``replaces``: it may already have a pair, which this one overrides)."""
        index = pair.activation.index
        if index in self._pairs and not replaces:
            raise ValueError(f"activation {index} is already paired; claim with replaces=True")
        self._pairs[index] = pair
        self.claims.append(Claim(index, pair, replaces))

    def release(self, index: int) -> None:
        """Activation ``index`` has no pair any more."""
        self._pairs.pop(index, None)
        self.claims.append(Claim(index, None, True))


def pair_to(a: Activation, graph: GraphIndex, tensor: str, method: MatchMethod, confidence: float = 1.0,
            note: str = "") -> TensorPair:
    """``a`` paired with ``tensor``, naming the node that computes it."""
    node = graph.node_of(tensor)
    return TensorPair(a, tensor, node.name if node else None, node.op_type if node else None, method, confidence,
                      note)


def shared_pair(a: Activation, src: TensorPair) -> TensorPair:
    """``src``'s tensor for ``a``, a container returning the tensor ``src``'s module returned."""
    return TensorPair(a, src.tensor, src.node, src.op_type, src.method, src.confidence,
                      f"returns the tensor of {src.activation.name}", src.perm)


def reuse_alignment(template: tuple[TensorPair, ...], capture: Capture) -> tuple[TensorPair, ...]:
    """The pairs found for one input case, carried over to another capture of the same model.

    Activations are matched by module, call and output path; the pairing is a
    property of the model and the graph, so a case whose values cannot be
    matched by value (all zeros) still gets it.  An activation the template
    lacks (other control flow) is unmatched, with that reason.
    """
    by_key = {(p.activation.module, p.activation.call, p.activation.path): p for p in template}
    pairs = []
    for a in capture.activations:
        p = by_key.get((a.module, a.call, a.path))
        if p is None:
            pairs.append(TensorPair(a, None, None, None, MatchMethod.NONE, 0.0,
                                    "not called on the input the alignment was made on"))
        else:
            pairs.append(dataclasses.replace(p, activation=a))
    return tuple(pairs)
