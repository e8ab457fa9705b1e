"""One runtime setting's ONNX Runtime sessions over a prepared model: the unmodified graph, the probe, the
cut graph, and one-off runs."""
from __future__ import annotations

import contextlib

import numpy as np

from ..errors import BackendError, RuntimeFailure
from ..measure import compare
from ..run import expose
from ..run.backend import Backend, Session
from .prepare import Prepared


class Runner:
    """One runtime setting's ONNX Runtime sessions over a prepared model.

    ``final`` is the unmodified graph with the user's settings (the true
    outputs); ``probe`` exposes the alignment candidates; ``local`` is the graph
    cut at the aligned tensors, every segment fed PyTorch values.  With
    ``keep`` (many input cases) each session is created once and reused;
    otherwise each is released after its run, so a single bisection holds one
    session's memory at a time.
    """

    def __init__(self, prepared: Prepared, backend: Backend, keep: bool = False):
        self.prepared = prepared
        self.backend = backend
        self.keep = keep
        self._sessions: dict[str, Session] = {}
        self._cut_at: tuple[str, ...] | None = None
        self._exposed: tuple[str, ...] = prepared.candidates

    def _session(self, role: str, build) -> Session:
        if role in self._sessions:
            return self._sessions[role]
        model, one_shot = build()
        session = self.backend.load(model, self.prepared.weights, one_shot=one_shot)
        if self.keep:
            self._sessions[role] = session
        return session

    def final(self, model_feeds) -> dict[str, np.ndarray]:
        """The unmodified model's outputs: the same graph and weight bytes as the user's file and settings."""
        return self._computed(self._session("final", lambda: (self.prepared.skeleton, False)).run(model_feeds))

    def probe(self, model_feeds, wanted: list[str] | None = None) -> dict[str, np.ndarray]:
        """Every exposed tensor (or just ``wanted`` of them) from the graph exposing them all."""
        with instrumented("with its intermediate tensors exposed"):
            session = self._session("probe",
                                    lambda: (expose.expose_tensors(self.prepared.skeleton, self._exposed), True))
            return self._computed(session.run(model_feeds, list(self._exposed) if wanted is None else wanted))

    def narrow(self, tensors: list[str]) -> None:
        """From now on the probe exposes only ``tensors`` (once an alignment is known: its paired tensors).

        Fewer outputs leave ONNX Runtime more of its fusions and memory reuse, so
        each further case runs faster and closer to the shipped graph.
        """
        if tuple(tensors) != self._exposed:
            self._exposed = tuple(tensors)
            self._sessions.pop("probe", None)

    def local(self, ref_feeds, references: dict[str, np.ndarray], unfed: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """Each cut tensor as its segment computes it from the PyTorch values of the cuts upstream.

        ``unfed`` are cut points whose reference cannot be fed (ONNX computes
        another size there): they are observed, not cut.
        """
        cut_at = tuple(references) + unfed
        if self._cut_at is not None and cut_at != self._cut_at:
            self._sessions.pop("local", None)
        self._cut_at = cut_at
        with instrumented("cut at the aligned tensors"):
            session = self._session("local", lambda: (expose.expose_tensors(
                expose.cut_at_tensors(self.prepared.skeleton, references), unfed), True))
            return self._computed(session.run(ref_feeds, list(cut_at)))

    def switched(self, ref_feeds, references: dict[str, np.ndarray]):
        """A function running the graph with any subset of ``references`` cut (fed its PyTorch value) and the
        rest computing freely: ``run(cut: set[str]) -> outputs``. One session serves every subset."""
        p = self.prepared
        with instrumented("with switchable cuts at the aligned tensors"):
            session = self.backend.load(expose.switch_at_tensors(p.skeleton, references), p.weights, one_shot=True)
        off, on = np.array(False), np.array(True)

        def run(cut) -> dict[str, np.ndarray]:
            flags = {expose.switch_input_name(t): on if t in cut else off for t in references}
            with instrumented("with switchable cuts at the aligned tensors"):
                return self._computed(session.run({**ref_feeds, **flags}, None))

        return run

    def observe(self, model_feeds, tensors) -> dict[str, np.ndarray]:
        """A fresh session of the unmodified graph exposing only ``tensors`` (for faithful location)."""
        p = self.prepared
        with instrumented("with a few tensors exposed"):
            return self._computed(self.backend.run(expose.expose_tensors(p.skeleton, tensors), model_feeds, None,
                                                   p.weights, one_shot=True))

    def run_cut(self, model, ref_feeds, outputs, store, optimize: bool = True) -> dict[str, np.ndarray]:
        """One run of a cut graph (a diagnosis's counterfactual, a faithful location's segment), values as
        computed (see :meth:`_computed`)."""
        return self._computed(self.backend.run(model, ref_feeds, outputs, store, one_shot=True, optimize=optimize))

    def _computed(self, values) -> dict[str, np.ndarray]:
        """Values marked with the resolution they were computed at (float32 tensors computed from float16 data)."""
        return compare.at_resolution(values, self.prepared.index.half_resolution)


@contextlib.contextmanager
def instrumented(how: str):
    """ONNX Runtime failing on a graph derived from the model (which itself ran) is not the user's problem:
    say so, as a :class:`RuntimeFailure`."""
    try:
        yield
    except RuntimeFailure:
        raise
    except BackendError as exc:
        raise RuntimeFailure(
            f"The model runs in ONNX Runtime, but the copy onnx-bisect made of it {how} does not ({exc}). This is "
            "a failure of onnx-bisect or ONNX Runtime, not of your model: please report it with the output of "
            "--debug.") from exc
