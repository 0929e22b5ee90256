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


def sequential_batch(primitive, args, axes, **params):
    """Correct fallback for any primitive: loop over the batch with ``lax.map``.

    Args:
        primitive: a primitive (or its ``bind``) with several results.
        args, axes: the batching rule's operands and their batch axes.
        params: the primitive's parameters, bound unchanged.

    Unbatched operands are closed over; every output gets the batch at axis 0.
    """
    bind = getattr(primitive, "bind", primitive)
    batched = [i for i, axis in enumerate(axes) if axis is not None]
    moved = [move_batch_axis(args[i], axes[i]) for i in batched]

    def one_example(slices):
        operands = list(args)
        for i, value in zip(batched, slices):
            operands[i] = value
        return tuple(bind(*operands, **params))

    results = jax.lax.map(one_example, tuple(moved))
    return list(results), [0] * len(results)


def general_batching_rule(prim, args: Sequence, axes: Sequence, **kwargs):
    """The sequential batching fallback under brainevent's name: one call per batch element.

    Args:
        prim: a primitive, or any object with ``bind`` (an
            :class:`~evjax.XLACustomKernel`), or a function of the operands.
        args: the batching rule's operands.
        axes: their batch axes (``None``: unbatched).
        kwargs: the primitive's parameters (``outs=...`` and the rest), bound
            unchanged.

    Returns:
        ``(outputs, out_axes)``: the outputs (the primitive's result structure)
        with the batch at axis 0, and a matching structure of 0s; when no
        operand is batched, one call and ``None`` axes.

    Example:
        >>> op.def_batching_rule(functools.partial(general_batching_rule, op))
    """
    bind = getattr(prim, "bind", prim)
    if all(axis is None for axis in axes):
        out = bind(*args, **kwargs)
        return out, jax.tree_util.tree_map(lambda _: None, out)
    batched = [i for i, axis in enumerate(axes) if axis is not None]

    def one_example(slices):
        operands = list(args)
        for i, value in zip(batched, slices):
            operands[i] = value
        return bind(*operands, **kwargs)

    outs = jax.lax.map(one_example, tuple(move_batch_axis(args[i], axes[i]) for i in batched))
    return outs, jax.tree_util.tree_map(lambda _: 0, outs)
