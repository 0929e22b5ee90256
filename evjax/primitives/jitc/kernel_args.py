"""What every JITC kernel backend passes its kernels besides the operand: host-side, no kernel library."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .generation import gap_multiplier

__all__ = ["config", "params_array", "operand_values"]


def config(prob: float, flag: bool, n_inner: int) -> np.ndarray:
    """``cfg``: ``[R, S, flag, expected fan-out]`` (uint32; see :func:`.generation.gap_multiplier`)."""
    r, s = gap_multiplier(prob)
    return np.array([r, s, int(flag), min(int(np.ceil(prob * n_inner)), 2**32 - 1)], np.uint32)


def params_array(params, n: int, dtype):
    """The law's parameters as one ``(2,)`` array of the compute dtype (a scalar law pads a 0)."""
    values = [p.reshape(1).astype(dtype) for p in params[:n]]
    return jnp.concatenate(values + [jnp.zeros((2 - n,), dtype)] if n < 2 else values)


def operand_values(x, event: bool, weighted: bool, dtype):
    """The operand as the kernels read it: spikes as 1.0/0.0, weighted events and floats as values."""
    if event and not weighted:
        return (x != 0).astype(dtype)
    return x.astype(dtype)
