"""onnx-bisect: find the first ONNX node that diverges from the PyTorch model, and say why."""
__version__ = "0.1.0"

from .errors import BisectError  # noqa: E402
from .pipeline import Config, bisect  # noqa: E402
from .records import Report  # noqa: E402

__all__ = ["bisect", "Config", "Report", "BisectError", "__version__"]
