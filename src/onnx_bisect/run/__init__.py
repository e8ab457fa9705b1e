"""Run stage: pure graph rewrites that expose tensors, and the backends that run a graph."""
