"""Capture stage: the PyTorch reference run — every module's outputs, and the ops of the exported program."""
