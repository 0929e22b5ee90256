"""Batches of fixed-width tables as one block-diagonal table (the ops' batching rules).

Batch element ``b`` of ``B`` becomes rows ``[b n, (b + 1) n)`` and columns
``[b n_cols, (b + 1) n_cols)`` of one table of shape ``(B n, k)`` over
``B n_cols`` columns, with its operand stacked the same way: one kernel call
does the work of the ``B`` calls a loop would make (the same synapses, no
more), in parallel where the kernel splits its work.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..._validation import INT32_MAX

__all__ = ["stack", "stack_rows", "block_table", "fits"]


def stack(a, axis, size: int):
    """``a`` with its batch axis first, an unbatched ``a`` broadcast to ``(size,) + a.shape``."""
    return jnp.moveaxis(a, axis, 0) if axis is not None else jnp.broadcast_to(a, (size,) + a.shape)


def stack_rows(a, axis, size: int):
    """The batch of ``a`` (each ``(rows, ...)``) as one ``(size rows, ...)`` array, element after element."""
    a = stack(a, axis, size)
    return a.reshape((size * a.shape[1],) + a.shape[2:])


def block_table(indices, axis, size: int, n_cols: int):
    """``(size n, k)``: element b's targets offset by ``b n_cols``.  A target outside
    ``[0, n_cols)`` becomes -1, outside the big table too, so it is still skipped (never
    moved into the next element's block)."""
    idx = stack(indices, axis, size)
    offsets = (jnp.arange(size, dtype=idx.dtype) * n_cols)[:, None, None]
    valid = (idx >= 0) & (idx < n_cols)
    big = jnp.where(valid, idx + offsets, jnp.asarray(-1, idx.dtype))
    return big.reshape(size * idx.shape[1], idx.shape[2])


def fits(indices_dtype, size: int, n_rows: int, k: int, n_cols: int) -> bool:
    """Whether the block table's columns and synapse count fit its index dtype (else: a loop)."""
    wide = np.dtype(indices_dtype).itemsize == 8
    return wide or max(size * n_cols, size * n_rows * k) <= INT32_MAX
