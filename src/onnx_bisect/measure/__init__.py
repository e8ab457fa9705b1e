"""Measure stage: compare tensors, separate the error a segment introduces from the one it inherits."""
