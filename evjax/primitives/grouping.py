"""Grouping the entries of a compressed sparse structure: the plans that transpose one.

Shared by the families that need another view of a structure than the one
stored (the CSR family's conversions and transposes; the plasticity family's
row view of a CSC structure).  Each function takes ``xp``, NumPy or
``jax.numpy``, which spell these calls the same way: NumPy on a concrete
structure (once, at trace time), ``jax.numpy`` on a traced one;
:func:`transposed_view` makes that choice for its callers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._validation import is_concrete

__all__ = ["entry_rows", "group_plan", "transpose_plan", "transposed_view"]


def entry_rows(indptr, nnz: int, xp):
    """The row ``r_k`` of every stored entry ``k``: ``#{r : indptr[r + 1] <= k}``."""
    return xp.searchsorted(indptr[1:], xp.arange(nnz, dtype=indptr.dtype), side="right")


def group_plan(keys, n_groups: int, xp):
    """``(perm, ptr)``: a stable sort of the entries by key and the pointers of the groups.

    ``keys[perm]`` is sorted, entries with equal keys keep their order, and
    ``ptr[g] = #{k : keys_k < g}`` for ``0 <= g <= n_groups`` (``searchsorted``
    of the sorted keys), so group ``g`` is ``perm[ptr[g]:ptr[g + 1]]``.
    """
    perm = xp.argsort(keys, stable=True)
    ptr = xp.searchsorted(keys[perm], xp.arange(n_groups + 1, dtype=keys.dtype), side="left")
    return perm, ptr


def transpose_plan(indices, indptr, n_cols: int, xp):
    """``(t_indices, t_indptr, perm)``: the CSR structure of ``A.T``, with ``t_data = data[perm]``.

    Entry ``k`` of ``A`` at (row r_k, column c_k) becomes an entry of row c_k
    of ``A.T`` with column r_k.  A stable sort by column keeps the entries of
    each column in row order; ``t_indptr[j]`` counts the entries with column
    ``< j`` (:func:`group_plan`).  ``xp`` is NumPy or ``jax.numpy`` (both
    spell these calls the same way).
    """
    rows = entry_rows(indptr, indices.shape[0], xp)
    perm, t_indptr = group_plan(indices, n_cols, xp)
    return rows[perm].astype(indices.dtype), t_indptr.astype(indptr.dtype), perm


def transposed_view(indices, indptr, n_cols: int, perm_dtype=None) -> tuple:
    """:func:`transpose_plan` as JAX arrays: ``(t_indices, t_indptr, perm)``.

    Computed with NumPy (once, at trace time: concrete arrays, also inside a
    ``jax.jit`` trace) when the structure is concrete, with ``jax.numpy`` when
    it is traced.  ``t_indices`` and ``t_indptr`` keep the dtypes of
    ``indices`` and ``indptr``; ``perm`` has ``perm_dtype`` (default: ``indptr``'s).
    """
    dtypes = (indices.dtype, indptr.dtype, perm_dtype or indptr.dtype)
    if is_concrete(indices, indptr):
        plan = transpose_plan(np.asarray(indices), np.asarray(indptr), n_cols, np)
        with jax.ensure_compile_time_eval():
            return tuple(jnp.asarray(a, d) for a, d in zip(plan, dtypes))
    plan = transpose_plan(indices, indptr, n_cols, jnp)
    return tuple(a.astype(d) for a, d in zip(plan, dtypes))
