"""Rows of two tables of one shape: whether one holds the other's rows in another order (shared by the stages that
judge a layer, narrow a segment and confirm a fix)."""
from __future__ import annotations

import numpy as np


#: multiply-adds a row-by-row comparison may take (rows × rows × row length), and rows at most (the distance
#: table is rows × rows)
MAX_ROW_WORK = 1 << 27
MAX_ROWS = 2048


def rows_reordered(actual: np.ndarray, expected: np.ndarray) -> np.ndarray | None:
    """``actual`` with its rows (along its last axis, the leading axes flattened) put in the order of the
    ``expected`` rows nearest them (each the nearest one not taken yet), when that order is neither the rows' own
    nor reversed (a flipped sort is a fault; ties broken another way are not): the caller compares it with
    ``expected``.  A vector's rows are its numbers.  None for fewer than two rows, non-finite values or tables too
    large to compare row by row."""
    order = row_order(actual, expected)
    if order is None:
        return None
    a = np.asarray(actual).reshape(len(order), -1)
    moved = np.empty_like(a)
    moved[order] = a
    return moved.reshape(actual.shape)


def row_order(actual: np.ndarray, expected: np.ndarray, any_order: bool = False) -> np.ndarray | None:
    """For each row of ``actual`` (as :func:`rows_reordered` reads rows), the ``expected`` row nearest it:
    ``expected`` laid out in ``actual``'s order is ``in_order(expected, order)``.  None where
    :func:`rows_reordered` is (``any_order``: a reversal too is an order, where a sort's reversal is not in
    question — a chunk of two sorted rows exchanged)."""
    if actual.shape != expected.shape or actual.ndim == 0 or actual.shape[-1] == 0:
        return None
    width = row_width(actual)
    a = np.asarray(actual, np.float64).reshape(-1, width)
    b = np.asarray(expected, np.float64).reshape(-1, width)
    if not 2 <= len(a) <= MAX_ROWS or len(a) * len(a) * a.shape[1] > MAX_ROW_WORK \
            or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    ranked = ((b ** 2).sum(1)[None, :] - 2 * a @ b.T).argsort(1)
    order, used = np.empty(len(a), np.int64), set()
    for i, candidates in enumerate(ranked):  # the nearest row not taken yet: equal rows (two experts' zero rows)
        order[i] = next(j for j in candidates.tolist() if j not in used)  # go one each
        used.add(int(order[i]))
    rows = np.arange(len(a))
    if np.array_equal(order, rows) or not any_order and np.array_equal(order, rows[::-1]):
        return None
    return order


def row_width(v: np.ndarray) -> int:
    """How many numbers one of ``v``'s rows holds: its last axis, or 1 for a vector (its numbers are its rows)."""
    return v.shape[-1] if v.ndim > 1 else 1


def in_order(expected: np.ndarray, order) -> np.ndarray:
    """``expected``'s rows in the order a :func:`row_order` gives (the file's order of PyTorch's rows)."""
    order = np.asarray(order, np.int64)
    return np.asarray(expected).reshape(len(order), -1)[order].reshape(np.shape(expected))
