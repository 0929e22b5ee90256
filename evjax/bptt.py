"""Backpropagation through time with a choice of what the backward pass keeps per step.

``jax.lax.scan`` under ``jax.grad`` stores, for every step, every
intermediate value that the step's backward pass reads: the membrane
potentials, the surrogate's derivative, masks, the synaptic inputs, ...
Over a long simulation that is most of a training step's memory.
:func:`bptt_scan` is ``lax.scan`` with one more argument, ``memory``, so that
a model keeps its step function and picks what is stored.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

__all__ = ["bptt_scan", "MEMORY_MODES"]

MEMORY_MODES = ("full", "carry", "segments")


def bptt_scan(step: Callable, init: Any, xs: Any = None, *, length: int | None = None, memory: str = "full",
              segment: int | None = None, reverse: bool = False, unroll: int | bool = 1) -> tuple[Any, Any]:
    """``jax.lax.scan(step, init, xs)`` with a memory mode for its backward pass.

    Args:
        step: ``step(carry, x) -> (carry, y)``, as for ``lax.scan``.
        init, xs, length, reverse, unroll: as for ``lax.scan``.
        memory: what the backward pass keeps:

            * ``"full"``: every intermediate of every step (``lax.scan`` as is);
            * ``"carry"``: only the carry entering each step (and its ``x``);
              the backward pass recomputes each step from it first
              (``jax.checkpoint`` of the step, nothing saveable): one more
              forward of each step;
            * ``"segments"``: only the carry entering each segment of
              ``segment`` steps; the backward pass reruns one segment at a
              time, keeping that segment's intermediates only.  For ``T``
              steps and segments of ``K`` the stored state is ``T / K``
              carries plus one segment's intermediates (``K`` of about
              ``sqrt(T)``, the default, minimises it); one more forward of
              each step.
        segment: the segment length of ``"segments"`` (default: the integer
            nearest ``sqrt(T)``); a last, shorter segment takes the remainder.

    Returns:
        ``(final_carry, stacked_ys)``, the same values in every mode.  The
        gradients of ``"carry"`` and ``"segments"`` come from recomputed
        steps, which XLA may fuse (and so round) differently from the first
        forward: they agree with ``"full"`` to float rounding.

    Note:
        The stacked ``ys`` are results, kept in every mode, and their
        cotangent comes back as one stacked array.  A model that returns a
        per-step array (the spike train, for a readout after the loop) keeps
        two ``(T, ...)`` arrays whatever ``memory`` says; carrying the readout
        (a leaky sum, a running maximum, spike counts) in the carry instead
        lets the memory mode decide (``examples/train_sparse_snn.py`` does).

    Raises:
        ValueError: an unknown ``memory``, a ``segment`` below 1, or no way to
            tell the number of steps.

    Example:
        >>> (v, i, s), spikes = evjax.bptt_scan(step, (v0, i0, s0), inputs, memory="segments")
    """
    if memory not in MEMORY_MODES:
        raise ValueError(f"bptt_scan: memory must be one of {MEMORY_MODES}, got {memory!r}")
    if memory == "carry":
        step = jax.checkpoint(step, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)
    if memory != "segments":
        return jax.lax.scan(step, init, xs, length=length, reverse=reverse, unroll=unroll)
    n_steps = _length(xs, length)
    size = max(1, round(math.sqrt(n_steps))) if segment is None else int(segment)
    if size < 1:
        raise ValueError(f"bptt_scan: segment must be at least 1, got {segment!r}")
    if reverse:  # the same scan on the reversed sequence, its outputs put back in order
        carry, ys = _segmented(step, init, _flip(xs), n_steps, size, unroll)
        return carry, _flip(ys)
    return _segmented(step, init, xs, n_steps, size, unroll)


def _length(xs, length: int | None) -> int:
    leaves = jax.tree_util.tree_leaves(xs)
    if leaves:
        return int(leaves[0].shape[0])
    if length is None:
        raise ValueError("bptt_scan: give xs or length (the number of steps)")
    return int(length)


def _flip(tree):
    return jax.tree_util.tree_map(lambda x: jnp.flip(x, axis=0), tree)


def _segmented(step, init, xs, n_steps: int, size: int, unroll):
    """``lax.scan`` over whole segments of ``size`` steps, each rerun in the backward pass, then the rest."""
    n_segments, rest = divmod(n_steps, size)
    head = n_segments * size
    ys_parts, carry = [], init
    if n_segments:
        def run_segment(carry, xs_segment):
            return jax.lax.scan(step, carry, xs_segment, length=size, unroll=unroll)

        run_segment = jax.checkpoint(run_segment, prevent_cse=False)  # keeps its inputs: the entry carry
        xs_head = jax.tree_util.tree_map(lambda x: x[:head].reshape((n_segments, size) + x.shape[1:]), xs)
        carry, ys = jax.lax.scan(run_segment, carry, xs_head, length=n_segments)
        ys_parts.append(jax.tree_util.tree_map(lambda y: y.reshape((head,) + y.shape[2:]), ys))
    if rest:
        xs_tail = jax.tree_util.tree_map(lambda x: x[head:], xs)
        carry, ys = jax.lax.scan(step, carry, xs_tail, length=rest, unroll=unroll)
        ys_parts.append(ys)
    if len(ys_parts) == 1:
        return carry, ys_parts[0]
    return carry, jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), *ys_parts)
