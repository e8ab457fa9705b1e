"""Command line: argparse → a typed config → the pipeline → a renderer → an exit status."""
from .main import main

__all__ = ["main"]
