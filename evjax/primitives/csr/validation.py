"""Validation of CSR structures and dense operands: shapes and dtypes always, values when concrete.

Index dtypes.  ``indices`` hold columns (``< n_cols``) and ``indptr`` synapse
offsets (``<= nnz``); each is stored as int32 or int64, chosen separately
(:func:`index_dtypes`):

* ``indices``: int64 when 64-bit mode is on and they are given in 64 bits (or
  as uint32), else int32;
* ``indptr``: ``indptr_dtype`` when one is asked for; else int64 when 64-bit
  mode is on and it is given in 64 bits, or when ``nnz > 2**31 - 1`` (only
  int64 offsets can count that many synapses), else int32.

So a matrix of more than ``2**31 - 1`` synapses keeps int32 columns and an
int64 ``indptr``, which needs 64-bit mode.  Concrete index arrays are checked
against the dtype they are converted to *before* the conversion: with 64-bit
mode off JAX would silently wrap an int64 column ``2**32 + 4`` to ``4``.

The checks every family shares (``shape``, fitting an index into its dtype,
the dense operand, float64 weights made in 64-bit mode and used after it is
off) live in :mod:`evjax._validation`; this module re-exports the ones it
always exported (``INT32_MAX``, ``check_shape``, ``checked_index_cast``,
``check_operand``).
"""
from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat
from ..._validation import (  # noqa: F401 (INT32_MAX, check_active_list, check_operand, checked_index_cast: re-exported)
    ENABLE_X64 as _ENABLE_X64,
    INT32_MAX,
    canonical,
    check_active_list,
    check_fits as _check_fits,
    check_operand,
    check_shape,
    checked_index_cast,
    is_concrete as _is_concrete,
)

__all__ = ["INT32_MAX", "check_active_list", "check_shape", "index_dtypes", "checked_index_cast", "validate_csr", "check_operand"]

_INT32, _INT64 = np.dtype(np.int32), np.dtype(np.int64)


# ---------------------------------------------------------------------------
# index dtypes
# ---------------------------------------------------------------------------
def _wide(dtype) -> bool:
    """Whether an integer dtype needs 64 bits to hold all its values as a signed int."""
    dtype = np.dtype(dtype)
    return dtype.itemsize > 4 or dtype == np.uint32


def _requested_indptr_dtype(requested, who: str) -> np.dtype | None:
    """``indptr_dtype`` as int32/int64, or ``None`` for ``"auto"``."""
    if requested is None or (isinstance(requested, str) and requested == "auto"):
        return None
    try:
        dtype = np.dtype(requested)
    except TypeError:
        dtype = None
    if dtype not in (_INT32, _INT64):
        raise ValueError(f"{who}: indptr_dtype must be 'auto', jnp.int32 or jnp.int64, got {requested!r}")
    return dtype


def index_dtypes(indices_dtype, indptr_dtype, nnz: int, *, requested="auto", who: str = "CSR"):
    """The dtypes ``(indices, indptr)`` a structure is stored in (see the module docstring).

    Decided from dtypes and sizes alone, so no array needs to exist.

    Args:
        indices_dtype, indptr_dtype: the dtypes the arrays are given in.
        nnz: the number of synapses (the largest offset ``indptr`` holds).
        requested: ``indptr_dtype=`` of the caller: ``"auto"``, int32 or int64.
        who: the caller's name, for messages.

    Raises:
        ValueError: ``nnz > 2**31 - 1`` with 64-bit mode off or with
            ``indptr_dtype=int32``; ``indptr_dtype=int64`` with 64-bit mode off.
    """
    x64 = bool(jax.config.jax_enable_x64)
    wanted = _requested_indptr_dtype(requested, who)
    if wanted == _INT64 and not x64:
        raise ValueError(f"{who}: indptr_dtype=int64 needs JAX's 64-bit mode; enable it first: {_ENABLE_X64}")
    if nnz > INT32_MAX:  # offsets up to nnz: only int64 holds them
        if not x64:
            raise ValueError(
                f"{who}: nnz = {nnz} synapses is more than int32 offsets can count (2**31 - 1); indptr must "
                f"be int64, which needs JAX's 64-bit mode: {_ENABLE_X64}"
            )
        if wanted == _INT32:
            raise ValueError(
                f"{who}: indptr_dtype=int32 cannot count nnz = {nnz} > 2**31 - 1 synapses; use "
                f"indptr_dtype=jnp.int64 (or 'auto')"
            )
        ptr = _INT64
    elif wanted is not None:
        ptr = wanted
    else:
        ptr = _INT64 if x64 and _wide(indptr_dtype) else _INT32
    idx = _INT64 if x64 and _wide(indices_dtype) else _INT32
    return idx, ptr


def _index_array(x, name: str, who: str):
    """``x`` as an integer array without converting its values: a jax array stays one, others become NumPy."""
    if not isinstance(x, (jax.Array, _compat.Tracer)):
        x = np.asarray(x)
        if x.size == 0 and not np.issubdtype(x.dtype, np.integer) and x.dtype != np.bool_:
            x = x.astype(np.int32)  # an empty list
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{who}: {name} must be an integer array (int32 or int64), got {x.dtype}")
    if x.ndim != 1:
        raise ValueError(f"{who}: {name} must be 1-d, got shape {x.shape}")
    return x


def _stored(x, dtype: np.dtype, name: str, who: str):
    """``x`` as a jax array of ``dtype``; a concrete array is checked to fit first."""
    if x.dtype == dtype:
        return jnp.asarray(x)
    _check_fits(x, dtype, name, who)
    if isinstance(x, np.ndarray):
        return jnp.asarray(x.astype(dtype))  # cast on the host: jnp.asarray must not narrow it
    return x.astype(dtype)


# ---------------------------------------------------------------------------
# values (concrete structures, once per structure)
# ---------------------------------------------------------------------------
# (id(indices), id(indptr)) -> shape of structures whose values were checked; an entry
# leaves with either array, so an id is never reused for an unchecked array.
_checked: dict[tuple[int, int], tuple] = {}


def _remember_checked(indices, indptr, shape) -> None:
    key = (id(indices), id(indptr))
    if key not in _checked:
        _checked[key] = shape
        for array in (indices, indptr):
            weakref.finalize(array, _checked.pop, key, None)


def _check_values(indices, indptr, shape, who: str) -> None:
    if _checked.get((id(indices), id(indptr))) == shape:
        return
    n_rows, n_cols = shape
    nnz = indices.shape[0]
    ptr = np.asarray(indptr)
    if ptr[0] != 0:
        raise ValueError(f"{who}: indptr must start at 0, got indptr[0] = {ptr[0]}")
    if np.any(np.diff(ptr) < 0):
        row = int(np.argmax(np.diff(ptr) < 0))
        raise ValueError(
            f"{who}: indptr must be non-decreasing, but indptr[{row + 1}] = {ptr[row + 1]} < "
            f"indptr[{row}] = {ptr[row]}"
        )
    if ptr[-1] != nnz:
        raise ValueError(f"{who}: indptr[-1] = {ptr[-1]} must equal nnz = len(indices) = {nnz}")
    if nnz:
        idx = np.asarray(indices)
        bad = (idx < 0) | (idx >= n_cols)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(
                f"{who}: indices out of range: indices[{k}] = {idx[k]}, but columns must lie in "
                f"[0, {n_cols}) for shape {shape}"
            )
    _remember_checked(indices, indptr, shape)


# ---------------------------------------------------------------------------
# the structure
# ---------------------------------------------------------------------------
def validate_csr(data, indices, indptr, shape, *, who: str = "CSR", check_values: bool = True,
                 indptr_dtype="auto"):
    """Check and normalise a CSR structure.

    Nothing is converted before it is checked: an index that does not fit the
    dtype it is stored in raises instead of wrapping around.

    Args:
        data: weights, a scalar or shape ``(1,)`` (homogeneous) or ``(nnz,)``.
        indices: column index of each synapse, ``(nnz,)``.
        indptr: row pointers, ``(n_rows + 1,)``.
        shape: ``(n_rows, n_cols)``.
        who: the caller's name, for messages.
        check_values: also check ``indptr`` and ``indices`` values when they
            are concrete (not traced); a structure already checked is not
            checked again.
        indptr_dtype: ``"auto"`` (see the module docstring), ``jnp.int32`` or
            ``jnp.int64`` (for more than ``2**31 - 1`` synapses; needs 64-bit mode).

    Returns:
        ``(data, indices, indptr, shape)`` with ``data`` 1-d, ``indices`` and
        ``indptr`` int32 or int64 (see :func:`index_dtypes`) and ``shape`` a
        pair of Python ints.

    Raises:
        TypeError: non-float weights, non-integer indices, or a ``shape``
            that is not a pair of integers (see :func:`evjax._validation.check_shape`).
        ValueError: any shape or value that does not describe a CSR matrix,
            an index that does not fit its dtype, or an ``indptr_dtype`` that
            cannot be had (see :func:`index_dtypes`).
    """
    shape = check_shape(shape, who)
    n_rows = shape[0]
    data = canonical(data)  # float64 weights made in 64-bit mode: float32 once it is off
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(
            f"{who}: weights (data) must be floating point (float16, bfloat16, float32, float64), "
            f"got {data.dtype}; convert them, e.g. data.astype(jnp.float32)"
        )
    indices, indptr = _index_array(indices, "indices", who), _index_array(indptr, "indptr", who)
    if data.ndim == 0:
        data = data.reshape(1)
    if data.ndim != 1:
        raise ValueError(f"{who}: data must be a scalar or 1-d, got shape {data.shape}")
    nnz = indices.shape[0]
    if indptr.shape[0] != n_rows + 1:
        raise ValueError(
            f"{who}: indptr has length {indptr.shape[0]} but a matrix of shape {shape} needs "
            f"n_rows + 1 = {n_rows + 1}"
        )
    if data.shape[0] not in (1, nnz):
        raise ValueError(
            f"{who}: data has length {data.shape[0]}, but must have length nnz = {nnz} (one weight per "
            f"synapse) or 1 (homogeneous weight)"
        )
    idx_dtype, ptr_dtype = index_dtypes(indices.dtype, indptr.dtype, nnz, requested=indptr_dtype, who=who)
    indices, indptr = _stored(indices, idx_dtype, "indices", who), _stored(indptr, ptr_dtype, "indptr", who)
    if check_values and _is_concrete(indptr, indices):
        _check_values(indices, indptr, shape, who)
    return data, indices, indptr, shape
