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
"""
from __future__ import annotations

import operator
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat
from ...events import as_bool_events

__all__ = ["INT32_MAX", "check_shape", "index_dtypes", "checked_index_cast", "validate_csr", "check_operand"]

INT32_MAX = int(np.iinfo(np.int32).max)
_INT32, _INT64 = np.dtype(np.int32), np.dtype(np.int64)
_ENABLE_X64 = 'jax.config.update("jax_enable_x64", True)'


def _is_concrete(x) -> bool:
    return not isinstance(x, _compat.Tracer)


# ---------------------------------------------------------------------------
# shape
# ---------------------------------------------------------------------------
def _dimension(d, shape, who: str, name: str) -> int:
    """One size of ``shape`` as a Python int: an integer, or a float with an integral value, >= 0."""
    problem = f"{who}: {name} must be a pair (n_rows, n_cols) of non-negative integers, got {shape!r}"
    if isinstance(d, (bool, np.bool_)):
        raise ValueError(f"{problem}: {d} is a bool")
    if isinstance(d, (float, np.floating)):
        if not float(d).is_integer():
            raise ValueError(f"{problem}: {d} is not a whole number")
        d = int(d)
    try:
        d = operator.index(d)
    except TypeError:
        raise ValueError(f"{problem}: {type(d).__name__} {d!r} is not an integer (sizes are static)") from None
    if d < 0:
        raise ValueError(f"{problem}: {d} is negative")
    return d


def check_shape(shape, who: str, name: str = "shape") -> tuple[int, int]:
    """``(n_rows, n_cols)`` as Python ints.

    Raises:
        ValueError: ``shape`` is not a pair, or a size is negative, not a
            whole number or not a number; the message names ``name``.
    """
    if isinstance(shape, (str, bytes)):
        raise ValueError(f"{who}: {name} must be a pair (n_rows, n_cols) of non-negative integers, got {shape!r}")
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(
            f"{who}: {name} must be a pair (n_rows, n_cols) of non-negative integers, got {shape!r}"
        ) from None
    if len(dims) != 2:
        raise ValueError(f"{who}: {name} must be a pair (n_rows, n_cols), got {len(dims)} sizes: {shape!r}")
    return _dimension(dims[0], shape, who, name), _dimension(dims[1], shape, who, name)


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


def _check_fits(x, dtype: np.dtype, name: str, who: str) -> None:
    """Raise unless every value of the (concrete) integer array ``x`` is representable in ``dtype``."""
    if np.can_cast(x.dtype, dtype, "safe") or not _is_concrete(x):
        return
    values = np.asarray(x)
    info = np.iinfo(dtype)
    bad = values > info.max
    if np.issubdtype(values.dtype, np.signedinteger):
        bad |= values < info.min
    if not bad.any():
        return
    k = int(np.argmax(bad))
    if dtype == _INT32 and not jax.config.jax_enable_x64:
        fix = (f"{name} are stored as int32 while JAX's 64-bit mode is off; enable it ({_ENABLE_X64}) "
               f"before building the matrix, or fix the value")
    else:
        fix = f"fix the value (no {dtype} can hold it)"
    raise ValueError(f"{who}: {name}[{k}] = {values[k]} does not fit {dtype}: {fix}")


def checked_index_cast(x, dtype, name: str, who: str) -> np.ndarray:
    """The host integer array ``x`` as ``dtype``, after checking that every value fits.

    Raises:
        ValueError: a value does not fit ``dtype``.
    """
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    _check_fits(x, dtype, name, who)
    return x if x.dtype == dtype else x.astype(dtype)


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
# the structure and the dense operand
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
        TypeError: non-float weights or non-integer indices.
        ValueError: any shape or value that does not describe a CSR matrix,
            an index that does not fit its dtype, or an ``indptr_dtype`` that
            cannot be had (see :func:`index_dtypes`).
    """
    shape = check_shape(shape, who)
    n_rows = shape[0]
    data = jnp.asarray(data)
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
    if check_values and _is_concrete(indptr) and _is_concrete(indices):
        _check_values(indices, indptr, shape, who)
    return data, indices, indptr, shape


def check_operand(x, data, shape, transpose: bool, rank: int, event: bool, who: str):
    """Check the dense operand of a matmul; return it and the result dtype.

    Raises:
        ValueError: ``x`` has the wrong rank or contracted size.
        TypeError: ``x`` is complex.
    """
    x = jnp.asarray(x)
    name = "v" if rank == 1 else "B"
    need = shape[1] if not transpose else shape[0]
    what = "n_cols" if not transpose else "n_rows"
    if x.ndim != rank or x.shape[0] != need:
        expect = f"({need},)" if rank == 1 else f"({need}, k)"
        raise ValueError(
            f"{who}: {name} has shape {x.shape}, but a matrix of shape {shape} with transpose={transpose} "
            f"needs {expect} ({what} = {need} first)"
        )
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: complex operands are not supported, got {x.dtype}; pass the real part "
                        f"(jnp.real(x)) or split real and imaginary parts into two calls")
    if event:
        if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.floating)):
            x = as_bool_events(x)  # integer spike counts: nonzero = spike
        return x, data.dtype
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(data.dtype), data.dtype
    return x, jnp.promote_types(data.dtype, x.dtype)
