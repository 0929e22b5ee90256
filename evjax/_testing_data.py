"""Data for the property harness: batch elements, CSR structures, non-finite values.

Everything here draws from a ``numpy.random.Generator``; the harness seeds it
from a number Hypothesis draws, so Hypothesis still searches and replays it.
Re-exported by :mod:`evjax.testing`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

__all__ = [
    "SIZES",
    "NNZ",
    "redraw",
    "random_csr",
    "csr_resampler",
    "inject_nonfinite",
    "NONFINITE",
]

# Small buckets: after the first examples most draws reuse compiled programs.
SIZES = (0, 1, 2, 5)
NNZ = (0, 1, 4, 9)
NONFINITE = (np.nan, np.inf, -np.inf)


def _is_float(value) -> bool:
    return jnp.issubdtype(np.asarray(value).dtype, jnp.inexact)


def _is_bool(value) -> bool:
    return np.asarray(value).dtype == np.bool_


def redraw(rng: np.random.Generator, args: Sequence, argnums: Sequence[int]) -> tuple:
    """New values for the float and bool arguments ``argnums``, same shapes and dtypes.

    Floats: standard normal with about a quarter exact zeros; bools: fair
    coins.  Integer arguments usually encode a structure that only the op knows
    how to redraw validly, so they are refused: give :class:`OpSpec` a
    ``resample`` function (for CSR: :func:`csr_resampler`).

    Raises:
        ValueError: an integer argument is among ``argnums``.
    """
    out = list(args)
    for i in argnums:
        value = np.asarray(args[i])
        if _is_bool(value):
            out[i] = rng.random(value.shape) < 0.5
        elif _is_float(value):
            fresh = rng.standard_normal(value.shape) * (rng.random(value.shape) >= 0.25)
            out[i] = fresh.astype(value.dtype)
        else:
            raise ValueError(
                f"cannot vmap over argument {i} ({value.dtype}, shape {value.shape}): the harness does not know "
                f"how to draw a new valid value of an integer argument, and identical copies would hide "
                f"structure bugs. Give OpSpec a resample(rng, args, argnums) function that returns a new "
                f"valid argument tuple (for CSR structures: evjax.testing.csr_resampler), or leave the "
                f"argument out of vmap_argnums."
            )
    return tuple(out)


def random_csr(rng: np.random.Generator, n_rows: int, n_cols: int, nnz: int, *,
               index_dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
    """A random valid CSR structure ``(indices, indptr)`` with ``nnz`` entries.

    Rows split ``nnz`` at random cut points (so empty rows and long rows
    happen); columns are uniform, so duplicates within a row happen.  With no
    row or no column there can be no entry: ``nnz`` becomes 0.
    """
    nnz = nnz if n_rows and n_cols else 0
    return _random_columns(rng, nnz, n_cols, index_dtype), _random_split(rng, n_rows, nnz, index_dtype)


def _random_split(rng, n_rows: int, nnz: int, dtype) -> np.ndarray:
    # indptr = [0, sorted cut points in [0, nnz], nnz]: non-decreasing, indptr[-1] = nnz
    if n_rows == 0:
        return np.zeros(1, dtype)
    cuts = np.sort(rng.integers(0, nnz + 1, size=n_rows - 1))
    return np.concatenate([[0], cuts, [nnz]]).astype(dtype)


def _random_columns(rng, nnz: int, n_cols: int, dtype) -> np.ndarray:
    return rng.integers(0, max(n_cols, 1), size=nnz).astype(dtype)


def csr_resampler(*, indices: int, indptr: int, shape: int | tuple[int, int],
                  others: Callable | None = None) -> Callable:
    """A ``resample(rng, args, argnums)`` for ops that take a CSR structure.

    Args:
        indices: position of ``indices`` in the op's arguments.
        indptr: position of ``indptr``.
        shape: position of the static ``(n_rows, n_cols)`` argument, or the
            shape itself.
        others: how to redraw the remaining batched arguments (default
            :func:`redraw`).

    The returned function keeps what is not batched: new ``indices`` (any
    valid columns) under the same ``indptr``; a new ``indptr`` (another
    non-decreasing split of the same nnz) under the same ``indices``; or both.
    Shapes never change, so the batch stacks.
    """
    others = redraw if others is None else others

    def resample(rng: np.random.Generator, args: Sequence, argnums: Sequence[int]) -> tuple:
        n_rows, n_cols = args[shape] if isinstance(shape, int) else shape
        out = list(args)
        nnz = np.shape(args[indices])[0]
        if indices in argnums:
            out[indices] = _random_columns(rng, nnz, n_cols, np.asarray(args[indices]).dtype)
        if indptr in argnums:
            out[indptr] = _random_split(rng, n_rows, nnz, np.asarray(args[indptr]).dtype)
        rest = [i for i in argnums if i not in (indices, indptr)]
        return others(rng, tuple(out), rest) if rest else tuple(out)

    return resample


def inject_nonfinite(rng: np.random.Generator, value, fraction: float = 0.3):
    """``value`` (a float array) with about ``fraction`` of its entries NaN, +inf or -inf."""
    array = np.array(value, copy=True)
    if array.size == 0:
        return array
    mask = rng.random(array.shape) < fraction
    picks = np.asarray(NONFINITE)[rng.integers(0, len(NONFINITE), array.shape)]
    return np.where(mask, picks, np.asarray(array, np.float64)).astype(array.dtype)
