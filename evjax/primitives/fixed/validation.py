"""Checks of a fixed-width connectivity table: shapes and dtypes always, index values when concrete.

Split from :mod:`evjax.primitives.fixed.ops` (which re-exports ``validate_table``
and ``row_pointers``); the checks every family shares (``shape``, sizes, seeds,
the dense operand) live in :mod:`evjax._validation`.
"""
from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from ... import _compat
from ..._validation import INT32_MAX, canonical, check_shape, is_concrete as _is_concrete

__all__ = ["validate_table", "row_pointers", "pointer_dtype"]


# ===========================================================================
# Validation: shapes and dtypes always; index values when concrete
# ===========================================================================
def validate_table(weights, indices, shape, *, who: str):
    """Check and normalise a fixed-width table.

    Args:
        weights: a scalar or ``(1,)`` (homogeneous), or ``(n_rows, k)``; float.
        indices: ``(n_rows, k)`` column of each synapse, int32 or int64.
        shape: ``(n_rows, n_cols)`` of the stored matrix.
        who: the caller's name, for messages.

    Returns:
        ``(weights, indices, shape)``: weights ``(1,)`` or ``(n_rows, k)``,
        indices int32 (int64 only in 64-bit mode), shape a pair of ints.

    Raises:
        TypeError: non-float weights, non-integer indices, or a ``shape``
            that is not a pair of integers (see :func:`evjax._validation.check_shape`).
        ValueError: shapes that do not fit, or (concrete indices) an index
            outside ``[0, n_cols)``.
    """
    shape = check_shape(shape, who)
    weights = canonical(weights)  # float64 weights made in 64-bit mode: float32 once it is off
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        raise TypeError(f"{who}: weights must be floating point, got {weights.dtype}; convert them, "
                        f"e.g. weights.astype(jnp.float32)")
    if not isinstance(indices, (jax.Array, _compat.Tracer)):
        indices = np.asarray(indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{who}: indices must be an integer array (int32 or int64), got {indices.dtype}")
    if indices.ndim != 2 or indices.shape[0] != shape[0]:
        raise ValueError(f"{who}: indices must have shape (n_rows, k) = ({shape[0]}, k) for shape {shape}, "
                         f"got {indices.shape}")
    if weights.ndim == 0 or weights.shape == (1,):
        weights = weights.reshape(1)
    elif weights.shape != indices.shape:
        raise ValueError(f"{who}: weights have shape {weights.shape}, but must be a scalar or (1,) (homogeneous) "
                         f"or {indices.shape} (one per synapse, like indices)")
    if _is_concrete(indices) and indices.size and _checked.get(id(indices)) != shape[1]:
        values = np.asarray(indices)
        bad = (values < 0) | (values >= shape[1])
        if bad.any():
            i, l = np.unravel_index(int(np.argmax(bad)), bad.shape)
            raise ValueError(f"{who}: indices out of range: indices[{i}, {l}] = {values[i, l]}, but columns "
                             f"must lie in [0, {shape[1]}) for shape {shape}; fix the table (under jit such "
                             f"an index is skipped, see docs/fixed_fan.md)")
    wide = jax.config.jax_enable_x64 and indices.dtype.itemsize == 8
    dtype = jnp.int64 if wide else jnp.int32
    if indices.dtype != dtype:
        indices = jnp.asarray(indices).astype(dtype)
    if indices.size > INT32_MAX and not jax.config.jax_enable_x64:
        raise ValueError(f"{who}: {indices.size} synapses need 64-bit row pointers; enable JAX's 64-bit mode "
                         f'(jax.config.update("jax_enable_x64", True))')
    indices = jnp.asarray(indices)
    if _is_concrete(indices):
        _remember_checked(indices, shape[1])
    return weights, indices, shape


# id(indices) -> n_cols of concrete tables whose values were checked (a FixedPostNumConn's table is
# checked when it is built, not again at every product); an entry leaves with its array.
_checked: dict[int, int] = {}


def _remember_checked(indices, n_cols: int) -> None:
    key = id(indices)
    if key not in _checked:
        _checked[key] = n_cols
        weakref.finalize(indices, _checked.pop, key, None)


def pointer_dtype(indices_dtype, n_rows: int, k: int):
    """The row pointers' dtype for a table: the indices' width (as a CSR built from the same arrays,
    so its compiled kernels are shared), or int64 where int32 cannot count the synapses."""
    wide = np.dtype(indices_dtype).itemsize == 8 or n_rows * k > INT32_MAX
    return jnp.int64 if wide else jnp.int32


def row_pointers(n_rows: int, k: int, dtype=None):
    """The CSR row pointers of a fixed-width table: ``indptr[i] = k * i``, made on the fly.

    Every k-th entry of an iota over ``[0, n_rows k]``: XLA fuses the slice
    into one loop over the ``n_rows + 1`` pointers, with no arithmetic.  That
    matters on the CPU: JAX's CPU client runs a program on the calling thread
    only when XLA counts fewer than 1000 flops in it, and hands it to a worker
    thread otherwise (by default; tens of microseconds on small machines), so
    ``arange(n_rows + 1) * k`` (``n_rows + 1`` multiplies) made a lone fixed op
    of 1000 rows or more slower than the same CSR op (see ``docs/performance.md``).
    """
    dtype = dtype or pointer_dtype(jnp.int32, n_rows, k)
    if k == 0:
        return jnp.zeros(n_rows + 1, dtype)
    end = n_rows * k + 1
    return lax.slice(lax.iota(dtype, end), (0,), (end,), (k,))


