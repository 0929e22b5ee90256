"""Weights stored in another order: brainevent's ``binary_csrmv_indexed`` / ``binary_csrmm_indexed``.

A structure traversed in one order (say a CSC view of a CSR matrix) whose
weights are kept in the canonical order of the other: slot ``k`` of the
traversed structure has weight ``data[perm[k]]``.  Each function is the event
op on the gathered weights, ``binary_csrmv(data[perm], indices, indptr, v)``;
the gather is one XLA op of ``nnz`` reads per call (it is not fused into the
kernel), and JAX differentiates it (its transpose scatters the weight
gradient back to the canonical order).
"""
from __future__ import annotations

import jax

from ...units import carries_units
from ..._validation import canonical, check_index_vector, is_concrete
from .ops import binary_csrmm, binary_csrmv

__all__ = ["binary_csrmv_indexed", "binary_csrmm_indexed"]


def _gathered(data, perm, who: str):
    """``data[perm]``, or ``data`` itself when homogeneous (``(1,)``: ``perm`` is ignored)."""
    data = canonical(data)
    if data.ndim != 1:
        raise ValueError(f"{who}: data must be 1-d, (1,) or (nse,), got shape {data.shape}")
    if data.shape[0] == 1:
        return data
    perm = check_index_vector(perm, "perm", data.shape[0], who)
    if is_concrete(perm) and perm.size and (int(perm.min()) < 0 or int(perm.max()) >= data.shape[0]):
        raise ValueError(f"{who}: perm must hold weight positions in [0, {data.shape[0]}); got values in "
                         f"[{int(perm.min())}, {int(perm.max())}]")
    return data[perm]


@carries_units("data", events=("v",), weighted="weighted")
def binary_csrmv_indexed(data, indices, indptr, perm, v, *, shape, workspace=None, transpose: bool = False,
                         backend: str | None = None, weighted: bool = False) -> jax.Array:
    """:func:`evjax.binary_csrmv` with the weights of slot ``k`` at ``data[perm[k]]``.

    Args:
        data: weights in their canonical order, ``(nse,)``, or ``(1,)``
            (homogeneous: ``perm`` is ignored).
        indices: as in :func:`evjax.binary_csrmv` (the traversed structure).
        indptr: as in :func:`evjax.binary_csrmv`.
        perm: ``(nse,)`` integers, slot ``k``'s weight position.
        v: as in :func:`evjax.binary_csrmv`.
        shape: as in :func:`evjax.binary_csrmv`.
        workspace: accepted and ignored.
        transpose: as in :func:`evjax.binary_csrmv`.
        backend: as in :func:`evjax.binary_csrmv`.
        weighted: as in :func:`evjax.binary_csrmv`.

    Returns:
        ``binary_csrmv(data[perm], indices, indptr, v, ...)``.

    Example:
        >>> csc_indptr, csc_indices, perm = evjax.csr_to_csc_index(W.indptr, W.indices, shape=W.shape)
        >>> y = evjax.binary_csrmv_indexed(W.data, csc_indices, csc_indptr, perm, spikes,
        ...                                shape=W.shape[::-1], transpose=False)   # W.T-structure gather
    """
    return binary_csrmv(_gathered(data, perm, "binary_csrmv_indexed"), indices, indptr, v, shape=shape,
                        transpose=transpose, backend=backend, weighted=weighted)


@carries_units("data", events=("B",), weighted="weighted")
def binary_csrmm_indexed(data, indices, indptr, perm, B, *, shape, workspace=None, transpose: bool = False,
                         backend: str | None = None, weighted: bool = False) -> jax.Array:
    """:func:`evjax.binary_csrmm` with the weights of slot ``k`` at ``data[perm[k]]``.

    Args:
        data: as in :func:`binary_csrmv_indexed`.
        indices: as in :func:`evjax.binary_csrmm`.
        indptr: as in :func:`evjax.binary_csrmm`.
        perm: as in :func:`binary_csrmv_indexed`.
        B: the event matrix, as in :func:`evjax.binary_csrmm`.
        shape: as in :func:`evjax.binary_csrmm`.
        workspace: accepted and ignored.
        transpose: as in :func:`evjax.binary_csrmm`.
        backend: as in :func:`evjax.binary_csrmm`.
        weighted: as in :func:`evjax.binary_csrmm`.

    Returns:
        ``binary_csrmm(data[perm], indices, indptr, B, ...)``.

    Example:
        >>> Y = evjax.binary_csrmm_indexed(W.data, csc_indices, csc_indptr, perm, spikes_batch,
        ...                                shape=W.shape[::-1], transpose=False)
    """
    return binary_csrmm(_gathered(data, perm, "binary_csrmm_indexed"), indices, indptr, B, shape=shape,
                        transpose=transpose, backend=backend, weighted=weighted)
