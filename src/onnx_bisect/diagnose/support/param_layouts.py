"""PyTorch parameters as exporters lay them out in ONNX, where that is more than a transpose.

An ``nn.LSTM``/``nn.GRU``/``nn.RNN`` becomes one ONNX LSTM/GRU/RNN node per
layer whose ``W``, ``R`` and ``B`` inputs stack both directions and order the
gates differently: PyTorch's LSTM gates are (input, forget, cell, output),
ONNX's (input, output, forget, cell); GRU (reset, update, new) becomes
(update, reset, hidden); ``B`` is the input bias followed by the hidden bias.
Shared by the weight checks before the run and the weight rule after it.
"""
from __future__ import annotations

import numpy as np

_PREFIX = "rnn("

#: ONNX gate order, as indices into PyTorch's gate chunks
_GATES = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2), "RNN": (0,)}


def rnn_weights(qualname: str, module) -> dict[str, np.ndarray]:
    """``{"rnn(lstm, layer 0, W)": array, ...}`` (float64) for an nn.LSTM/GRU/RNN, else ``{}``."""
    kind = type(module).__name__
    order = _GATES.get(kind)
    if order is None or getattr(module, "proj_size", 0):
        return {}
    directions = ["", "_reverse"] if module.bidirectional else [""]

    def param(name: str) -> np.ndarray | None:
        t = getattr(module, name, None)
        return None if t is None else t.detach().double().cpu().numpy()

    def gates(a: np.ndarray) -> np.ndarray:
        chunks = np.split(a, len(order), axis=0)
        return np.concatenate([chunks[i] for i in order], axis=0)

    out: dict[str, np.ndarray] = {}
    for layer in range(module.num_layers):
        w, r, b = [], [], []
        for d in directions:
            wi, wh = param(f"weight_ih_l{layer}{d}"), param(f"weight_hh_l{layer}{d}")
            if wi is None or wh is None:
                return out
            w.append(gates(wi))
            r.append(gates(wh))
            bi, bh = param(f"bias_ih_l{layer}{d}"), param(f"bias_hh_l{layer}{d}")
            if bi is not None and bh is not None:
                b.append(np.concatenate([gates(bi), gates(bh)]))
        prefix = f"{_PREFIX}{qualname or '<model>'}, layer {layer}"
        out[f"{prefix}, W)"] = np.stack(w)
        out[f"{prefix}, R)"] = np.stack(r)
        if len(b) == len(directions):
            out[f"{prefix}, B)"] = np.stack(b)
    return out


def model_rnn_weights(model) -> dict[str, np.ndarray]:
    """:func:`rnn_weights` of every recurrent module of ``model``."""
    out: dict[str, np.ndarray] = {}
    for qualname, module in model.named_modules():
        out.update(rnn_weights(qualname, module))
    return out


def owner_of(name: str) -> str:
    """The module a parameter name belongs to: ``a.b.weight`` → ``a.b``, ``rnn(a.b, layer 0, W)`` → ``a.b``."""
    if name.startswith(_PREFIX):
        return name[len(_PREFIX):].split(",")[0]
    return name.rpartition(".")[0]


def is_rnn_parameter(name: str) -> bool:
    """Whether ``name`` is one of :func:`rnn_weights`' keys."""
    return name.startswith(_PREFIX)


def gates_exchanged(value: np.ndarray, tensor: np.ndarray) -> bool:
    """Whether ``value`` holds ``tensor``'s gate blocks (axis 1: ``W``/``R`` [dirs, gates·H, ...], ``B``
    [dirs, 2·gates·H]) in another order — a converter's gate order (its values then barely correlate)."""
    if value.shape != tensor.shape or value.ndim < 2:
        return False
    for blocks in (4, 3, 8, 6):
        if value.shape[1] % blocks:
            continue
        have = np.split(np.asarray(value, np.float64), blocks, axis=1)
        want = np.split(np.asarray(tensor, np.float64), blocks, axis=1)
        scale = max(float(np.max(np.abs(tensor))), 1e-12)
        same = lambda a, b: bool(np.allclose(a, b, rtol=0, atol=1e-6 * scale))  # noqa: E731
        if all(any(same(h, w) for w in want) for h in have) and not all(same(h, w) for h, w in zip(have, want)):
            return True
    return False
