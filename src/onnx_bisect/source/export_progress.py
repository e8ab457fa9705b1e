"""What an export is doing, told as it goes: the module calls its trace has made, the graph nodes its
translation has handled, the phase without counts it is in (optimizing, writing).

Neither exporter reports progress, so it is observed: a global forward pre-hook counts the module calls the
trace makes (out of the model's modules: most are called once), and the dynamo exporter's translation, which
logs each FX node it handles at DEBUG level, is counted by a filter on its logger that drops every record
(nothing is printed, nothing reaches the user's logging).  Where the exporter changes and the logger says
nothing, the translation is shown as a phase without counts.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable

import torch

#: ``on_progress(phase, done, total)``: ``total`` 0 where it is not known
OnProgress = Callable[[str, int, int], None]

TRACING = "tracing the model (module calls)"
TRANSLATING = "translating to ONNX (graph nodes)"
OPTIMIZING = "optimizing the ONNX graph"
WRITING = "writing the model and its weights"

#: the logger of the dynamo exporter's translation (one DEBUG record per FX node)
TRANSLATION_LOGGER = "torch.onnx._internal.exporter._core"


@contextmanager
def counting_module_calls(model: torch.nn.Module, on_progress: OnProgress | None):
    """Tell ``on_progress`` of each module call made while inside (a trace), out of ``model``'s modules."""
    if on_progress is None:
        yield
        return
    ours = {id(m) for m in model.modules()}  # not the exporter's own wrappers and guard modules
    total, calls = len(ours), [0]

    def called(module, args):
        # Dynamo traces hooks too: count only the calls Python makes
        if id(module) in ours and not torch.compiler.is_dynamo_compiling():
            calls[0] += 1
            on_progress(TRACING, calls[0], total)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(called)
    try:
        yield
    finally:
        handle.remove()


class _NodeCounter(logging.Filter):
    """Counts the translation's per-node records and drops every record below ``level`` (the logger's
    effective level before it was lowered to DEBUG to hear them)."""

    def __init__(self, on_progress: OnProgress, level: int):
        super().__init__()
        self.on_progress, self.level, self.done, self.total = on_progress, level, 0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:  # what the logger passed before its level was lowered
            return True
        fields = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if record.msg != "%s" or not isinstance(fields, tuple) or len(fields) < 4:
            return False
        self.done += 1
        if not self.total:
            self.total = _graph_size(fields)
        self.on_progress(TRANSLATING, self.done, self.total)
        return False


def _graph_size(fields: tuple) -> int:
    """The number of nodes of the FX graph a node's arguments belong to (0 when none is a node)."""
    args = fields[1] if isinstance(fields[1], (tuple, list)) else ()
    for arg in args:
        if isinstance(arg, torch.fx.Node):
            return len(arg.graph.nodes)
    return 0


@contextmanager
def counting_translation(on_progress: OnProgress | None):
    """Tell ``on_progress`` of each FX node the dynamo exporter translates while inside."""
    if on_progress is None:
        yield
        return
    logger = logging.getLogger(TRANSLATION_LOGGER)
    level, effective = logger.level, logger.getEffectiveLevel()
    counter = _NodeCounter(on_progress, effective)
    if effective > logging.DEBUG:  # a user who asked for its DEBUG records keeps them
        logger.addFilter(counter)
        logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeFilter(counter)
        logger.setLevel(level)


def phase(on_progress: OnProgress | None, name: str) -> None:
    """A phase without counts has begun."""
    if on_progress is not None:
        on_progress(name, 0, 0)
