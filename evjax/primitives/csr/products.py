"""Per-synapse products of a CSR (or CSC) structure: ``out[j] = w[j] * y[row or column of synapse j]``.

brainevent 0.3.0's ``csrmv_dt2t``, ``cscmv_dt2t``, ``csrmm_dt2t`` and
``cscmm_dt2t`` (same names, signatures and orientation).  Where the matmuls
sum over the synapses of a row, these keep one value per synapse: the result
has the shape of ``w``, in the structure's own order.  In D-RTRL, the
eligibility trace of synapse ``j = (i, c)`` decays as
``eps[j] <- D[i] * eps[j] + ...``: that ``D[i] * eps[j]`` is
``csrmv_dt2t(D, eps, indices, indptr, shape=shape)``.

Orientation (``transpose``), for synapse ``j`` at ``(row_j, indices[j])`` of
the CSR matrix of shape ``(n_rows, n_cols)``:

* ``transpose=False``: ``out[j] = w[j] * y[row_j]``, ``y`` of shape ``(n_rows,)``;
* ``transpose=True``: ``out[j] = w[j] * y[indices[j]]``, ``y`` of shape ``(n_cols,)``.

The CSC functions take the arrays of a CSC matrix of shape ``(m, k)``
(``indptr`` over its ``k`` columns, ``indices`` its rows): they are the CSR
arrays of the ``(k, m)`` transpose, so ``cscmv_dt2t(..., shape=(m, k),
transpose=t)`` is ``csrmv_dt2t(..., shape=(k, m), transpose=not t)``, and
``y`` is indexed by the CSC matrix's row (``transpose=False``, ``y`` of shape
``(m,)``) or column (``transpose=True``, ``(k,)``), as in brainevent.

The value of each synapse's row or column comes from the CSR family's
``csr_sddmm`` op (``g_j = r[row_j] * q[indices[j]]``) with a vector of ones
on the other side (``y * 1`` is ``y``, bit for bit), so these run the
``numba``, ``warp``, ``numba_cuda`` or ``reference`` kernels that
``backend`` names (default: the platform's), with that op's JVP, transpose
and batching rules (a batch of structures is one block-diagonal call); the
product with ``w`` is one elementwise multiply that XLA fuses with what
follows.  Measured on CPU at 2e6 synapses (2 cores, jitted): 2.1 ms for
``transpose=False``, against 19.9 ms for a pure-JAX row lookup
(``jnp.repeat`` of the row numbers, then a gather).

The ``mm`` forms (one structure, a batch of ``y`` and ``w``) are pure JAX:
the synapses' rows once (``jnp.repeat``) or their columns, then one gather for
the whole batch, which measured twice as fast as one ``csr_sddmm`` per batch
element (71-84 ms against 144-148 ms for 16 x 2e6 synapses); ``backend`` is
checked there and has no kernel to choose.

Semantics: IEEE products (``nan * 0`` is ``nan``), in JAX's promoted dtype of
``y`` and ``w`` (``w`` must be floating point; an integer ``y`` is promoted).
A concrete structure is checked (``indptr`` rising from 0 to ``nse``, every
index in range); under ``jit`` an index outside ``[0, n)`` is skipped (its
synapse's value is 0), as the CSR products skip it.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ...units import carries_units
from ..._validation import canonical, check_shape
from ...registry import check_backend_name
from .ops import csr_sddmm
from .validation import validate_csr

__all__ = ["csrmv_dt2t", "cscmv_dt2t", "csrmm_dt2t", "cscmm_dt2t"]


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------
def _float_weights(w, who: str, want: str):
    w = canonical(w)
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"{who}: w must be floating point (the per-synapse values {want}), got {w.dtype}; "
                        f"convert it, e.g. w.astype(jnp.float32)")
    return w


def _real_operand(y, who: str):
    y = canonical(y)
    if y.dtype == jnp.bool_:
        raise TypeError(f"{who}: y is bool; these products multiply (IEEE), they do not select events: pass "
                        f"y.astype(w.dtype)")
    if jnp.issubdtype(y.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: complex y is not supported, got {y.dtype}; pass jnp.real(y) and jnp.imag(y) "
                        f"in two calls")
    return y


def _structure(indices, indptr, shape, who: str, csc: bool):
    """``(indices, indptr, shape)`` of the CSR view (a CSC matrix's shape reversed), checked (values too
    when concrete)."""
    shape = check_shape(shape, who)
    if csc:
        n_ptr = np.shape(indptr)[0] if np.ndim(indptr) == 1 else None
        if n_ptr is not None and n_ptr != shape[1] + 1:
            raise ValueError(f"{who}: indptr has length {n_ptr}, but a CSC matrix of shape {shape} needs "
                             f"n_cols + 1 = {shape[1] + 1} (one pointer per column, plus one)")
        shape = shape[::-1]
    dummy = np.zeros(1, np.float32)  # a homogeneous weight: validate_csr checks the structure only
    _, indices, indptr, shape = validate_csr(dummy, indices, indptr, shape, who=who)
    return indices, indptr, shape


def _products(y, w, indices, indptr, shape, user_transpose: bool, batched: bool, who: str, csc: bool, backend):
    """The products on the CSR view: a CSC call's ``transpose`` flips (its arrays are those of ``A.T``)."""
    indices, indptr, shape = _structure(indices, indptr, shape, who, csc)
    transpose = user_transpose != csc
    nse = indices.shape[0]
    w = _float_weights(w, who, "(n_batch, nse)" if batched else "(nse,), like indices")
    y = _real_operand(y, who)
    # the CSR view of the matrix: y follows the CSR row (transpose=False) or column
    n_y = shape[1] if transpose else shape[0]
    user_shape = shape[::-1] if csc else shape
    axis = "column" if transpose != csc else "row"
    if batched:
        if y.ndim != 2 or y.shape[1] != n_y:
            raise ValueError(f"{who}: y must have shape (n_batch, {n_y}) (one value per {axis} of the matrix of "
                             f"shape {user_shape}, transpose={user_transpose}), got {y.shape}")
        if w.shape != (y.shape[0], nse):
            raise ValueError(f"{who}: w must have shape (n_batch, nse) = ({y.shape[0]}, {nse}) (y's batch, then "
                             f"one value per synapse of indices), got {w.shape}")
    else:
        if y.ndim != 1 or y.shape[0] != n_y:
            raise ValueError(f"{who}: y must have shape ({n_y},) (one value per {axis} of the matrix of shape "
                             f"{user_shape}, transpose={user_transpose}), got {y.shape}")
        if w.shape != (nse,):
            raise ValueError(f"{who}: w must have shape (nse,) = ({nse},) (one value per synapse, like indices), "
                             f"got {w.shape}")
    dtype = jnp.result_type(y, w)
    y, w = y.astype(dtype), w.astype(dtype)
    n_rows, n_cols = shape
    if batched:  # the synapses' rows (columns) once, then one gather for the whole batch (pure JAX)
        return w * _batch_picked(indices, indptr, y, shape=shape, along_columns=transpose)
    # the value of each synapse's row (column): csr_sddmm's r[row_j] * q[indices[j]] with ones on the other side
    return w * _picked(indices, indptr, y, shape=shape, backend=backend, along_columns=transpose)


def _batch_picked(indices, indptr, y, *, shape, along_columns: bool):
    """``y[:, indices[j]]`` (``along_columns``) or ``y[:, row_j]`` for every synapse ``j``; a column
    outside ``[0, n_cols)`` gives 0, as in :func:`_picked`."""
    n_rows, n_cols = shape
    nse = indices.shape[0]
    if not along_columns:
        rows = jnp.repeat(jnp.arange(n_rows, dtype=indptr.dtype), jnp.diff(indptr), total_repeat_length=nse)
        inside = (indices >= 0) & (indices < n_cols)
        return jnp.where(inside, y[:, rows], jnp.zeros((), y.dtype))
    inside = (indices >= 0) & (indices < n_cols)
    return jnp.where(inside, y[:, jnp.where(inside, indices, 0)], jnp.zeros((), y.dtype))


def _picked(indices, indptr, y, *, shape, backend, along_columns: bool):
    """``y[indices[j]]`` (``along_columns``) or ``y[row_j]`` for every synapse ``j``: ``csr_sddmm`` of ``y``
    and ones, which skips (gives 0 for) a column outside ``[0, n_cols)``."""
    n_rows, n_cols = shape
    if along_columns:
        return csr_sddmm(indices, indptr, jnp.ones((n_rows,), y.dtype), y, shape=shape, dtype=y.dtype,
                         backend=backend)
    return csr_sddmm(indices, indptr, y, jnp.ones((n_cols,), y.dtype), shape=shape, dtype=y.dtype, backend=backend)


def _check(backend, who: str) -> None:
    check_backend_name(backend, who=who)


# ---------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------
@carries_units("y", "w")
def csrmv_dt2t(y: jax.typing.ArrayLike, w: jax.typing.ArrayLike, indices: jax.typing.ArrayLike,
               indptr: jax.typing.ArrayLike, *, shape: tuple[int, int], transpose: bool = False,
               backend: Optional[str] = None) -> jax.Array:
    """Per-synapse product of a vector and the values of a CSR structure.

    ``out[j] = w[j] * y[row_j]`` (``transpose=False``) or
    ``out[j] = w[j] * y[indices[j]]`` (``transpose=True``), where ``row_j`` is
    the row owning synapse ``j`` (``indptr[row_j] <= j < indptr[row_j + 1]``).

    Args:
        y: ``(n_rows,)`` (``transpose=False``) or ``(n_cols,)`` (``transpose=True``);
            float or integer (promoted).
        w: ``(nse,)`` floating-point values, one per synapse, in the structure's order.
        indices: ``(nse,)`` column of each synapse, int32 or int64.
        indptr: ``(n_rows + 1,)`` row pointers, int32 or int64.
        shape: ``(n_rows, n_cols)`` of the CSR matrix (static).
        transpose: index ``y`` by the column (``True``) instead of the row.
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"`` or ``"reference"``: the
            kernels of ``csr_sddmm`` that give each synapse its row's (column's)
            value; ``None``: the platform's default.

    Returns:
        ``(nse,)`` in ``jnp.result_type(y, w)``.

    Raises:
        TypeError: non-float ``w``, bool or complex ``y``, non-integer indices,
            a ``shape`` that is not a pair of integers, a non-string ``backend``.
        ValueError: a ``y``, ``w`` or ``indptr`` whose length does not fit
            ``shape`` and ``indices``; a concrete structure that is not CSR.
        evjax.errors.BackendNotAvailableError: an unknown ``backend`` name.

    Example:
        >>> indices, indptr = jnp.array([0, 2, 1, 2]), jnp.array([0, 2, 4])
        >>> evjax.csrmv_dt2t(jnp.array([1.0, 2.0]), jnp.array([0.5, 0.3, 0.7, 0.1]), indices, indptr,
        ...                  shape=(2, 3))
        Array([0.5, 0.3, 1.4, 0.2], dtype=float32)
    """
    _check(backend, "csrmv_dt2t")
    return _products(y, w, indices, indptr, shape, bool(transpose), False, "csrmv_dt2t", csc=False,
                     backend=backend)


@carries_units("y", "w")
def cscmv_dt2t(y: jax.typing.ArrayLike, w: jax.typing.ArrayLike, indices: jax.typing.ArrayLike,
               indptr: jax.typing.ArrayLike, *, shape: tuple[int, int], transpose: bool = False,
               backend: Optional[str] = None) -> jax.Array:
    """Per-synapse product of a vector and the values of a CSC structure.

    For synapse ``j`` at ``(r_j, c_j)`` of the CSC matrix of shape ``(m, k)``
    (``c_j`` the column owning ``j`` through ``indptr``, ``r_j = indices[j]``):
    ``out[j] = w[j] * y[r_j]`` (``transpose=False``) or ``w[j] * y[c_j]``
    (``transpose=True``).  The same as ``csrmv_dt2t(y, w, indices, indptr,
    shape=(k, m), transpose=not transpose)``.

    Args:
        y: ``(m,)`` (``transpose=False``) or ``(k,)`` (``transpose=True``); float or integer.
        w: ``(nse,)`` floating-point values in the CSC order.
        indices: ``(nse,)`` row of each synapse, int32 or int64.
        indptr: ``(k + 1,)`` column pointers, int32 or int64.
        shape: ``(m, k)`` of the CSC matrix (static).
        transpose: index ``y`` by the column (``True``) instead of the row.
        backend: as in :func:`csrmv_dt2t`.

    Returns:
        ``(nse,)`` in ``jnp.result_type(y, w)``.

    Raises:
        TypeError: as :func:`csrmv_dt2t`.
        ValueError: as :func:`csrmv_dt2t` (``indptr`` must have ``k + 1`` entries).
        evjax.errors.BackendNotAvailableError: an unknown ``backend`` name.

    Example:
        >>> indices, indptr = jnp.array([0, 2, 1, 2]), jnp.array([0, 2, 4])   # a (3, 2) CSC matrix
        >>> evjax.cscmv_dt2t(jnp.array([1.0, 2.0, 3.0]), jnp.ones(4), indices, indptr, shape=(3, 2))
        Array([1., 3., 2., 3.], dtype=float32)
    """
    _check(backend, "cscmv_dt2t")
    return _products(y, w, indices, indptr, shape, bool(transpose), False, "cscmv_dt2t", csc=True,
                     backend=backend)


@carries_units("y", "w")
def csrmm_dt2t(y: jax.typing.ArrayLike, w: jax.typing.ArrayLike, indices: jax.typing.ArrayLike,
               indptr: jax.typing.ArrayLike, *, shape: tuple[int, int], transpose: bool = False,
               backend: Optional[str] = None) -> jax.Array:
    """Batched :func:`csrmv_dt2t`: ``out[b, j] = w[b, j] * y[b, row_j]`` (or ``y[b, indices[j]]``).

    One structure shared by the batch; for a batch of structures, ``jax.vmap``
    :func:`csrmv_dt2t` over them.

    Args:
        y: ``(n_batch, n_rows)`` (``transpose=False``) or ``(n_batch, n_cols)``; float or integer.
        w: ``(n_batch, nse)`` floating-point values.
        indices: ``(nse,)`` column of each synapse, int32 or int64.
        indptr: ``(n_rows + 1,)`` row pointers, int32 or int64.
        shape: ``(n_rows, n_cols)`` of the CSR matrix (static).
        transpose: index ``y`` by the column (``True``) instead of the row.
        backend: checked (``None`` or a backend name evjax knows); the batched forms are pure JAX.

    Returns:
        ``(n_batch, nse)`` in ``jnp.result_type(y, w)``.

    Raises:
        TypeError: as :func:`csrmv_dt2t`.
        ValueError: as :func:`csrmv_dt2t`, or batch sizes of ``y`` and ``w`` that differ.
        evjax.errors.BackendNotAvailableError: an unknown ``backend`` name.

    Example:
        >>> indices, indptr = jnp.array([0, 2, 1, 2]), jnp.array([0, 2, 4])
        >>> evjax.csrmm_dt2t(jnp.array([[1.0, 2.0], [10.0, 20.0]]), jnp.ones((2, 4)), indices, indptr,
        ...                  shape=(2, 3))
        Array([[ 1.,  1.,  2.,  2.],
               [10., 10., 20., 20.]], dtype=float32)
    """
    _check(backend, "csrmm_dt2t")
    return _products(y, w, indices, indptr, shape, bool(transpose), True, "csrmm_dt2t", csc=False,
                     backend=backend)


@carries_units("y", "w")
def cscmm_dt2t(y: jax.typing.ArrayLike, w: jax.typing.ArrayLike, indices: jax.typing.ArrayLike,
               indptr: jax.typing.ArrayLike, *, shape: tuple[int, int], transpose: bool = False,
               backend: Optional[str] = None) -> jax.Array:
    """Batched :func:`cscmv_dt2t`: ``out[b, j] = w[b, j] * y[b, r_j]`` (or ``y[b, c_j]`` when transposed).

    Args:
        y: ``(n_batch, m)`` (``transpose=False``) or ``(n_batch, k)``; float or integer.
        w: ``(n_batch, nse)`` floating-point values in the CSC order.
        indices: ``(nse,)`` row of each synapse, int32 or int64.
        indptr: ``(k + 1,)`` column pointers, int32 or int64.
        shape: ``(m, k)`` of the CSC matrix (static).
        transpose: index ``y`` by the column (``True``) instead of the row.
        backend: checked (``None`` or a backend name evjax knows); the batched forms are pure JAX.

    Returns:
        ``(n_batch, nse)`` in ``jnp.result_type(y, w)``.

    Raises:
        TypeError: as :func:`csrmv_dt2t`.
        ValueError: as :func:`cscmv_dt2t`, or batch sizes of ``y`` and ``w`` that differ.
        evjax.errors.BackendNotAvailableError: an unknown ``backend`` name.

    Example:
        >>> indices, indptr = jnp.array([0, 2, 1, 2]), jnp.array([0, 2, 4])   # a (3, 2) CSC matrix
        >>> evjax.cscmm_dt2t(jnp.ones((2, 3)), jnp.ones((2, 4)), indices, indptr, shape=(3, 2)).shape
        (2, 4)
    """
    _check(backend, "cscmm_dt2t")
    return _products(y, w, indices, indptr, shape, bool(transpose), True, "cscmm_dt2t", csc=True,
                     backend=backend)
