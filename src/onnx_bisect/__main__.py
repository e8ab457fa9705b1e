"""``python -m onnx_bisect``."""
import sys

from .cli import main

sys.exit(main())
