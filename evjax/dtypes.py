"""Dtype rules shared by every operator family and backend."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["LOW_PRECISION", "compute_dtype", "as_dtype"]

LOW_PRECISION = (np.dtype(np.float16), np.dtype(jnp.bfloat16))


def compute_dtype(dtype) -> np.dtype:
    """The dtype a kernel accumulates in for results of ``dtype``.

    float16 and bfloat16 (which Numba and Warp lack, and which lose too much
    in long sums) are accumulated in float32 and rounded once at the end;
    other dtypes accumulate in themselves.
    """
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in LOW_PRECISION else dtype


def as_dtype(x, dtype):
    """``x`` (a JAX array) in ``dtype``: itself where it already is, else ``x.astype(dtype)``; how every
    backend's generator puts an operand in its compute dtype and the result back in the op's."""
    return x if x.dtype == dtype else x.astype(dtype)
