"""Per-synapse products of a fixed-width table: ``out[i, l] = w[i, l] * y[i or indices[i, l]]``.

brainevent 0.3.0's ``fcnmv_dt2t`` and ``fcnmm_dt2t`` (same names, signatures
and orientation).  The table (``indices`` of shape ``(n_rows, k)``, row ``i``
connecting to the columns ``indices[i, :]``, see :mod:`.ops`) keeps one value
per synapse, so the result has the shape of ``indices`` (``(n_batch, n_rows,
k)`` for the batched form).  In D-RTRL, the eligibility trace of synapse
``(i, l)`` decays as ``eps[i, l] <- D[i] * eps[i, l] + ...``: that product is
``fcnmv_dt2t(eps, indices, D, shape=shape, transpose=False)``.

Orientation, as brainevent's ``fcnmv_dt2t`` has it (and as ``csrmv_dt2t``):

* ``transpose=False``: ``out[i, l] = w[i, l] * y[i]``, ``y`` of shape ``(n_rows,)``;
* ``transpose=True``: ``out[i, l] = w[i, l] * y[indices[i, l]]``, ``y`` of shape ``(n_cols,)``.

This is the opposite sense of ``transpose`` in :func:`~evjax.fcnmv`, where
``False`` is ``A @ x`` and gathers ``x`` by the stored columns: here ``False``
reads ``y`` by the row.  ``transpose`` has no default, as in brainevent.

Pure JAX: a broadcast-multiply (``transpose=False``) or a gather-multiply,
bound by memory bandwidth and fused by XLA with the code around it;
differentiated and batched by JAX itself.  There is no ``backend`` argument
(brainevent's functions have none).

Semantics: IEEE products in ``jnp.result_type(weights, y)`` (``weights``
floating point; an integer ``y`` is promoted); ``weights`` of size 1 are one
value for every synapse.  A concrete table is checked (every index in
``[0, n_cols)``); under ``jit`` an index outside it is skipped (its value is 0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...units import carries_units
from ..._validation import canonical, check_shape
from .validation import validate_table

__all__ = ["fcnmv_dt2t", "fcnmm_dt2t"]


def _checked(weights, indices, y, shape, transpose: bool, batched: bool, who: str):
    """``(weights, indices, y, dtype, n_y)`` checked and promoted; ``weights`` ``()`` when homogeneous."""
    shape = check_shape(shape, who)
    weights, y = canonical(weights), canonical(y)
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        raise TypeError(f"{who}: weights must be floating point, got {weights.dtype}; convert them, e.g. "
                        f"weights.astype(jnp.float32)")
    if y.dtype == jnp.bool_ or jnp.issubdtype(y.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: y must be real numbers (float or integer), got {y.dtype}; these products "
                        f"multiply (IEEE): pass y.astype(weights.dtype) (or jnp.real(y))")
    # the table (indices' dtype, shape (n_rows, k) and, when concrete, values); weights are checked here
    _, indices, shape = validate_table(np.zeros(1, np.float32), indices, shape, who=who)
    n_y = shape[1] if transpose else shape[0]
    axis = "column" if transpose else "row"
    if batched:
        if y.ndim != 2 or y.shape[1] != n_y:
            raise ValueError(f"{who}: y must have shape (n_batch, {n_y}) (one value per {axis} of the table of "
                             f"shape {shape}, transpose={transpose}), got {y.shape}")
        want = (y.shape[0],) + indices.shape
        if weights.size != 1 and weights.shape != want:
            raise ValueError(f"{who}: weights must have size 1 (one value for every synapse) or shape "
                             f"(n_batch, n_rows, k) = {want} (y's batch, then indices' shape), got {weights.shape}")
    else:
        if y.ndim != 1 or y.shape[0] != n_y:
            raise ValueError(f"{who}: y must have shape ({n_y},) (one value per {axis} of the table of shape "
                             f"{shape}, transpose={transpose}), got {y.shape}")
        if weights.size != 1 and weights.shape != indices.shape:
            raise ValueError(f"{who}: weights must have size 1 (one value for every synapse) or the shape of "
                             f"indices, {indices.shape}, got {weights.shape}")
    if weights.size == 1:
        weights = weights.reshape(())
    dtype = jnp.result_type(weights, y)
    return weights.astype(dtype), indices, y.astype(dtype), dtype, n_y


def _products(weights, indices, y, shape, transpose, batched: bool, who: str):
    if not isinstance(transpose, (bool, np.bool_, int, np.integer)):
        raise TypeError(f"{who}: transpose must be True or False (a static Python bool), got "
                        f"{type(transpose).__name__} {transpose!r}")
    transpose = bool(transpose)
    weights, indices, y, dtype, n_y = _checked(weights, indices, y, shape, transpose, batched, who)
    out_shape = (y.shape[0],) + indices.shape if batched else indices.shape
    if transpose:
        inside = (indices >= 0) & (indices < n_y)
        values = y[..., jnp.where(inside, indices, 0)]
        return jnp.where(inside, jnp.broadcast_to(weights * values, out_shape), jnp.zeros((), dtype))
    values = y[..., :, None]  # one value per row, broadcast over the row's k synapses
    return jnp.broadcast_to(weights * values, out_shape)


@carries_units("weights", "y")
def fcnmv_dt2t(weights: jax.typing.ArrayLike, indices: jax.typing.ArrayLike, y: jax.typing.ArrayLike, *,
               shape: tuple[int, int], transpose: bool) -> jax.Array:
    """Per-synapse product of a vector and the values of a fixed-width table.

    ``out[i, l] = weights[i, l] * y[i]`` (``transpose=False``) or
    ``weights[i, l] * y[indices[i, l]]`` (``transpose=True``): the opposite
    sense of :func:`~evjax.fcnmv`'s ``transpose``, as in brainevent.

    Args:
        weights: a scalar or any size-1 array (homogeneous), or ``(n_rows, k)``; floating point.
        indices: ``(n_rows, k)`` column of each synapse, int32 or int64.
        y: ``(n_rows,)`` (``transpose=False``) or ``(n_cols,)`` (``transpose=True``); float or integer.
        shape: ``(n_rows, n_cols)`` of the stored matrix (static).
        transpose: index ``y`` by the stored column (``True``) instead of the row (static, required).

    Returns:
        ``(n_rows, k)`` in ``jnp.result_type(weights, y)``.

    Raises:
        TypeError: non-float ``weights``, bool or complex ``y``, non-integer ``indices``, a non-bool
            ``transpose`` or a ``shape`` that is not a pair of integers.
        ValueError: shapes that do not fit, or a concrete index outside ``[0, n_cols)``.

    Example:
        >>> weights, indices = jnp.array([[0.5, 1.0], [1.5, 2.0]]), jnp.array([[0, 1], [1, 2]])
        >>> evjax.fcnmv_dt2t(weights, indices, jnp.array([10.0, 20.0]), shape=(2, 3), transpose=False)
        Array([[ 5., 10.],
               [30., 40.]], dtype=float32)
    """
    return _products(weights, indices, y, shape, transpose, False, "fcnmv_dt2t")


@carries_units("weights", "y")
def fcnmm_dt2t(weights: jax.typing.ArrayLike, indices: jax.typing.ArrayLike, y: jax.typing.ArrayLike, *,
               shape: tuple[int, int], transpose: bool) -> jax.Array:
    """Batched :func:`fcnmv_dt2t`: ``out[b, i, l] = weights[b, i, l] * y[b, i or indices[i, l]]``.

    One table shared by the batch; for a batch of tables, ``jax.vmap``
    :func:`fcnmv_dt2t` over them.

    Args:
        weights: any size-1 array (homogeneous), or ``(n_batch, n_rows, k)``; floating point.
        indices: ``(n_rows, k)`` column of each synapse, int32 or int64.
        y: ``(n_batch, n_rows)`` (``transpose=False``) or ``(n_batch, n_cols)``; float or integer.
        shape: ``(n_rows, n_cols)`` of the stored matrix (static).
        transpose: index ``y`` by the stored column (``True``) instead of the row (static, required).

    Returns:
        ``(n_batch, n_rows, k)`` in ``jnp.result_type(weights, y)``.

    Raises:
        TypeError: as :func:`fcnmv_dt2t`.
        ValueError: shapes that do not fit (``weights`` and ``y`` with different batch sizes included),
            or a concrete index outside ``[0, n_cols)``.

    Example:
        >>> indices = jnp.array([[0, 1], [1, 2]])
        >>> y = jnp.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
        >>> evjax.fcnmm_dt2t(jnp.ones((2, 2, 2)), indices, y, shape=(2, 3), transpose=True)[1]
        Array([[10., 20.],
               [20., 30.]], dtype=float32)
    """
    return _products(weights, indices, y, shape, transpose, True, "fcnmm_dt2t")
