"""Helpers for batching (vmap) rules."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


def batch_size(args: Sequence, axes: Sequence) -> int:
    """The vmapped size, read from the first batched operand."""
    for arg, axis in zip(args, axes):
        if axis is not None:
            return arg.shape[axis]
    raise ValueError("no operand is batched")


def move_batch_axis(x, axis, to: int = 0):
    """Move ``x``'s batch axis to position ``to`` (``None`` stays unbatched)."""
    if axis is None:
        return x
    return jnp.moveaxis(x, axis, to)


def broadcast_batch(x, axis, size: int, to: int = 0):
    """Give ``x`` a batch axis of ``size`` at ``to``, broadcasting if unbatched."""
    if axis is None:
        x = jnp.expand_dims(x, to)
        shape = list(x.shape)
        shape[to] = size
        return jnp.broadcast_to(x, shape)
    return jnp.moveaxis(x, axis, to)


def vectors_as_columns(x, axis):
    """Promote a batched vector (batch at ``axis``) to a matrix ``(n, batch)``.

    With this a batched matvec becomes one matmat whose result has the batch
    in its last axis.
    """
    return jnp.moveaxis(x, axis, -1)


def vectors_as_rows(x, axis):
    """Promote a batched vector to a matrix ``(batch, n)``."""
    return jnp.moveaxis(x, axis, 0)


def sequential_batch(primitive, args, axes, *, outs, **params):
    """Correct fallback for any primitive: loop over the batch with ``lax.map``.

    Unbatched operands are closed over; the outputs get the batch at axis 0.
    """
    batched = [i for i, axis in enumerate(axes) if axis is not None]
    moved = [move_batch_axis(args[i], axes[i]) for i in batched]

    def one_example(slices):
        operands = list(args)
        for i, value in zip(batched, slices):
            operands[i] = value
        return tuple(primitive.bind(*operands, outs=outs, **params))

    results = jax.lax.map(one_example, tuple(moved))
    return list(results), [0] * len(outs)
