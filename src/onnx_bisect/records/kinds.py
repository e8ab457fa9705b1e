"""What kind of computation a PyTorch module is, by its class's ancestry."""
from __future__ import annotations

import torch

from .core import ModuleKind


def module_kind(module: object) -> ModuleKind:
    """The :class:`ModuleKind` of ``module`` (``OTHER`` for anything that is not a conv, Linear or BatchNorm)."""
    nn = torch.nn
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return ModuleKind.BATCHNORM
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        return ModuleKind.CONV_TRANSPOSE
    if isinstance(module, nn.modules.conv._ConvNd):
        return ModuleKind.CONV
    if isinstance(module, nn.Linear):
        return ModuleKind.LINEAR
    return ModuleKind.OTHER
