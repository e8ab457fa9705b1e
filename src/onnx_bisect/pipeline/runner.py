"""One runtime setting's ONNX Runtime sessions over a prepared model: the unmodified graph, the probe, the
cut graph, and one-off runs."""
from __future__ import annotations

import contextlib

import numpy as np
import onnx

from ..errors import BackendError, RuntimeFailure
from ..measure import compare
from ..records.graph import GraphIndex
from ..records.store import ArrayStore
from ..records.weights import trim_heap
from ..report.progress import Progress
from ..run import expose, windows
from ..run.backend import Backend, Session
from ..source import graph
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

    def __init__(self, prepared: Prepared, backend: Backend, keep: bool = False, window_bytes: int | None = None,
                 store: ArrayStore | None = None, progress: Progress | None = None):
        self.prepared = prepared
        self.backend = backend
        self.keep = keep
        self.window_bytes = window_bytes  # expose in windows of at most this many bytes (see run.windows)
        self.store = store  # where windowed runs keep the values they expose (low-memory runs)
        self.progress = progress or Progress(enabled=False)
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

    def _done(self) -> None:
        """After a run: a session not kept is gone; its memory goes back to the system."""
        if not self.keep:
            trim_heap()

    def final(self, model_feeds) -> dict[str, np.ndarray]:
        """The unmodified model's outputs: the same graph and weight bytes as the user's file and settings."""
        values = self._session("final", lambda: (self.prepared.skeleton, False)).run(model_feeds)
        self._done()
        return self._computed(values)

    def probe(self, model_feeds, wanted: list[str] | None = None) -> dict[str, np.ndarray]:
        """Every exposed tensor (or just ``wanted`` of them) from the graph exposing them all."""
        names = list(self._exposed) if wanted is None else wanted
        windowed = self._windowed(self.prepared.skeleton, self.prepared.index, names, model_feeds)
        if windowed is not None:
            return self._computed(windowed)
        with instrumented("with its intermediate tensors exposed"):
            session = self._session("probe",
                                    lambda: (expose.expose_tensors(self.prepared.skeleton, self._exposed), True))
            values = session.run(model_feeds, names)
        del session
        self._done()
        return self._computed(values)

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
        cut = expose.cut_at_tensors(self.prepared.skeleton, references) if self.window_bytes is not None else None
        if cut is not None:
            windowed = self._windowed(cut, graph.index_graph(cut), list(cut_at), ref_feeds)
            if windowed is not None:
                return self._computed(windowed)
        with instrumented("cut at the aligned tensors"):
            session = self._session("local", lambda: (expose.expose_tensors(
                cut if cut is not None else expose.cut_at_tensors(self.prepared.skeleton, references), unfed), True))
            values = session.run(ref_feeds, list(cut_at))
        del session
        self._done()
        return self._computed(values)

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

    def _windowed(self, model, index, names: list[str], model_feeds) -> dict[str, np.ndarray] | None:
        """``names`` from ``model`` run in windows of :attr:`window_bytes` (None when windows are off or one
        window would hold them all)."""
        if self.window_bytes is None:
            return None
        # sizes from the index pinned to the sample (a derived graph's own index keeps free dimensions open,
        # so its tensors would count as nothing and every plan be one window)
        sizes = {**tensor_bytes(index), **tensor_bytes(self.prepared.index)}
        plan = windows.plan_windows(index, names, sizes, self.window_bytes)
        if len(plan) < 2:
            return None
        keep = self.store.put if self.store is not None else (lambda a: a)
        with instrumented("in windows of its nodes"):
            return windows.run_windowed(self.backend, model, plan, model_feeds, self.prepared.weights, keep,
                                        self.progress.advance)

    def _computed(self, values) -> dict[str, np.ndarray]:
        """Values marked with the resolution they were computed at (float32 tensors computed from float16 data);
        an ONNX sequence ONNX Runtime hands over as a list (a Loop's or SplitToSequence's) kept only as a graph
        output: no intermediate sequence is a tensor to pair or compare."""
        outputs = self.prepared.index.graph_outputs
        tensors = {k: v for k, v in values.items() if isinstance(v, np.ndarray) or k in outputs}
        return compare.at_resolution(tensors, self.prepared.index.half_resolution)


def tensor_bytes(index: GraphIndex) -> dict[str, int]:
    """Each tensor's size in bytes where its shape and element type are known."""
    out = {}
    for name, shape in index.shapes.items():
        elem = index.elem_types.get(name)
        if elem and shape is not None and all(isinstance(d, int) and d >= 0 for d in shape):
            try:
                out[name] = int(np.prod(shape, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(elem).itemsize
            except (KeyError, TypeError, ValueError):  # a type numpy lacks: counted as nothing
                pass
    return out


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
