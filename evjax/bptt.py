"""Backpropagation through time with a choice of what the backward pass keeps per step.

``jax.lax.scan`` under ``jax.grad`` stores, for every step, every
intermediate value that the step's backward pass reads: the membrane
potentials before and after the update, the surrogate's derivative, masks,
the synaptic inputs, ...  Over a long simulation that is most of a training
step's memory.  :func:`bptt_scan` is ``lax.scan`` with one more argument,
``memory``, so that a model keeps its step function and picks what is stored.
"""
from __future__ import annotations

from typing import Any, Callable

import jax

__all__ = ["bptt_scan", "MEMORY_MODES"]

MEMORY_MODES = ("full", "carry")


def bptt_scan(step: Callable, init: Any, xs: Any = None, *, length: int | None = None, memory: str = "full",
              reverse: bool = False, unroll: int | bool = 1) -> tuple[Any, Any]:
    """``jax.lax.scan(step, init, xs)`` with a memory mode for its backward pass.

    Args:
        step: ``step(carry, x) -> (carry, y)``, as for ``lax.scan``.
        init, xs, length, reverse, unroll: as for ``lax.scan``.
        memory: what the backward pass keeps for each step:

            * ``"full"``: every intermediate it reads (``lax.scan`` as is);
            * ``"carry"``: only the carry entering the step (and the step's
              ``x``); the backward pass recomputes the step from it first
              (``jax.checkpoint`` of the step, nothing saveable).  One more
              forward of each step, for the memory of the carry alone.

    Returns:
        ``(final_carry, stacked_ys)``, the same values in every mode.

    Raises:
        ValueError: an unknown ``memory``.

    Example:
        >>> (v, i, s), spikes = evjax.bptt_scan(step, (v0, i0, s0), inputs, memory="carry")
    """
    if memory not in MEMORY_MODES:
        raise ValueError(f"bptt_scan: memory must be one of {MEMORY_MODES}, got {memory!r}")
    if memory == "carry":
        step = jax.checkpoint(step, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)
    return jax.lax.scan(step, init, xs, length=length, reverse=reverse, unroll=unroll)
