"""Per-synapse products of a just-in-time connectivity (JITC) matrix: one value per generated synapse.

brainevent 0.3.0's ``jitsmv_dt2t``, ``jitnmv_dt2t`` and ``jitumv_dt2t`` (same
names and signatures).  The matrix is the ``M`` of shape ``(n_rows, n_cols)``
that :func:`~evjax.jits` / :func:`~evjax.jitn` / :func:`~evjax.jitu` build
from the same ``(params, prob, seed, shape, corder)`` (with
``transpose=False``); its synapses are taken in CSR order (row by row, the
columns of a row increasing), and synapse ``j`` at ``(r_j, c_j)`` with weight
``w_j`` gives

* ``transpose=False``: ``out[j] = w_j * y[r_j]``, ``y`` of shape ``(n_rows,)``;
* ``transpose=True``: ``out[j] = w_j * y[c_j]``, ``y`` of shape ``(n_cols,)``.

``w_j`` is ``weight`` (``jitsmv_dt2t``) or the weight drawn for that synapse
(``w_loc + w_scale * z_j``, ``w_low + (w_high - w_low) * u_j``), so scattering
the result at ``(r_j, c_j)`` gives ``M * y[:, None]`` (or ``M * y[None, :]``).
``corder`` chooses the matrix, as it does for ``jits``: ``True`` generates ``M``
row by row, ``False`` column by column (another matrix for the same seed); the
result is in ``M``'s CSR order either way.

The seed must be concrete.  The number of synapses, hence the result's shape,
depends on ``(seed, prob, shape)``: the structure is generated on the host
(by the same generator as :meth:`evjax.JITCScalarR.tocsr`, identical to the
kernels') when the function is called or traced, and a traced ``seed`` (or
``prob``) raises a ``TypeError`` saying how to pass it.  The weight parameters
and ``y`` may be traced: the products are pure JAX (a gather-multiply on the
constant structure, fused by XLA), differentiable in them and batched by
``jax.vmap``.  ``backend`` is accepted for brainevent's signature and ignored
(``None`` or a backend name evjax knows).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ...units import carries_units
from ..._validation import as_seed, canonical, is_concrete
from ...registry import check_backend_name
from .functions import _params, _shape, check_prob
from .ops import generated_shape, host_structure, row_outer

__all__ = ["jitsmv_dt2t", "jitnmv_dt2t", "jitumv_dt2t"]


def _concrete_seed(seed, who: str) -> int:
    """``seed`` as a Python int (modulo ``2**32``, as the matrices take it); traced or missing: raise."""
    if seed is None:
        raise TypeError(f"{who}: seed is required: pass the seed of the matrix whose synapses these are "
                        f"(e.g. seed=42); a random one would describe an unrelated matrix")
    if not is_concrete(seed):
        raise TypeError(
            f"{who}: seed must be concrete (a Python int or an integer array with a value), got a traced "
            f"value: the number of synapses, hence the shape of the result, depends on the seed. Pass it "
            f"from outside jax.jit (close over it, or jax.jit(f, static_argnames='seed')), or materialize the "
            f"structure once (e.g. evjax.JITCScalarR(weight, prob=prob, seed=seed, shape=shape, "
            f"corder=corder).tocsr()) and use csrmv_dt2t on it")
    if not isinstance(seed, (str, bytes, bool, np.bool_)):
        try:
            value = np.asarray(seed)
        except (TypeError, ValueError):
            value = None
        if value is not None and value.size == 1 and np.issubdtype(value.dtype, np.integer):
            return int(value.reshape(())) & 0xFFFFFFFF  # wrapped as evjax's as_seed wraps it
    as_seed(seed, who)  # not one integer: raises, naming seed and the fix
    raise TypeError(f"{who}: seed must be one integer, got {type(seed).__name__} {seed!r}")


def _synapses(law: str, seed: int, prob: float, shape, corder: bool, dtype):
    """``(rows, cols, draws)`` of ``M``'s synapses in CSR order (NumPy): ``draws`` is ``z`` (normal),
    ``u`` (uniform) or 1 (scalar), generated with unit parameters in ``dtype``."""
    n_outer, n_inner = generated_shape(shape, False, corder)
    unit = {"scalar": (1.0,), "normal": (0.0, 1.0), "uniform": (0.0, 1.0)}[law]
    draws, inner, indptr = host_structure("numba")(law, unit, seed, prob, n_outer, n_inner, dtype)
    outer = np.repeat(np.arange(n_outer, dtype=np.int32), np.diff(indptr))
    if row_outer(False, corder):  # G = M: already row by row, columns increasing
        return outer, inner, draws
    order = np.argsort(inner, kind="stable")  # G = M.T: group by M's row, stable keeps M's columns increasing
    return inner[order], outer[order], draws[order]


def _products(law: str, values, prob, y, seed, *, shape, transpose, corder, backend, who: str):
    check_backend_name(backend, who=who)
    shape = _shape(shape, who)
    prob = check_prob(prob, who)
    params, dtype = _params(law, values, who)
    seed = _concrete_seed(seed, who)
    y = canonical(y)
    if y.dtype == jnp.bool_ or jnp.issubdtype(y.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: y must be real numbers (float or integer), got {y.dtype}; these products "
                        f"multiply (IEEE): pass y.astype(jnp.float32) (or jnp.real(y))")
    transpose, corder = bool(transpose), bool(corder)
    n_y = shape[1] if transpose else shape[0]
    if y.ndim != 1 or y.shape[0] != n_y:
        raise ValueError(f"{who}: y must have shape ({n_y},) (one value per {'column' if transpose else 'row'} "
                         f"of the matrix of shape {shape}, transpose={transpose}), got {y.shape}")
    dtype = jnp.result_type(dtype, y.dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.dtype(jnp.float32)
    params, y = [p.astype(dtype)[0] for p in params], y.astype(dtype)
    if prob == 0.0 or 0 in shape:
        return jnp.zeros((0,), dtype)
    rows, cols, draws = _synapses(law, seed, prob, shape, corder, dtype)
    gathered = y[jnp.asarray(cols if transpose else rows)]
    if law == "scalar":
        return params[0] * gathered
    draws = jnp.asarray(draws).astype(dtype)
    if law == "normal":  # w = loc + scale * z, as the generation (and todense) has it
        weights = params[0] + params[1] * draws
    else:  # w = low + (high - low) * u
        weights = params[0] + (params[1] - params[0]) * draws
    return weights * gathered


_ARGS = """
        prob: the connection probability, a Python float in ``[0, 1]`` (concrete).
        y: ``(n_rows,)`` (``transpose=False``) or ``(n_cols,)`` (``transpose=True``); float or integer.
        seed: the matrix's seed: a Python int or an integer array of one element, concrete (not traced).
        shape: ``(n_rows, n_cols)`` of the matrix (static).
        transpose: index ``y`` by the synapse's column (``True``) instead of its row.
        corder: the matrix's ``corder`` (``True``: generated row by row), as for ``jits``.
        backend: accepted for brainevent's signature and ignored (one pure-JAX implementation);
            ``None`` or a backend name evjax knows."""

_RETURNS_RAISES = """
    Returns:
        ``(nse,)`` in the promoted float dtype of the weight parameters and ``y``; ``nse`` is the
        number of synapses of the matrix (0 when ``prob`` is 0 or a dimension is 0).

    Raises:
        TypeError: a traced or missing ``seed``, a traced ``prob``, weight parameters that are not real
            scalars, a bool or complex ``y``, a non-string ``backend``.
        ValueError: ``prob`` outside ``[0, 1]``, a ``y`` whose shape does not fit ``shape`` and
            ``transpose``, a dimension of ``shape`` of ``2**30`` or more.
        evjax.errors.BackendNotAvailableError: an unknown ``backend`` name.
"""


@carries_units("weight", "y")
def jitsmv_dt2t(weight: jax.typing.ArrayLike, prob: float, y: jax.typing.ArrayLike, seed, *,
                shape: tuple[int, int], transpose: bool = False, corder: bool = True,
                backend: Optional[str] = None) -> jax.Array:
    return _products("scalar", (weight,), prob, y, seed, shape=shape, transpose=transpose, corder=corder,
                     backend=backend, who="jitsmv_dt2t")


@carries_units("w_loc", "y", shared={"w_scale": "w_loc"})
def jitnmv_dt2t(w_loc: jax.typing.ArrayLike, w_scale: jax.typing.ArrayLike, prob: float, y: jax.typing.ArrayLike,
                seed, *, shape: tuple[int, int], transpose: bool = False, corder: bool = True,
                backend: Optional[str] = None) -> jax.Array:
    return _products("normal", (w_loc, w_scale), prob, y, seed, shape=shape, transpose=transpose, corder=corder,
                     backend=backend, who="jitnmv_dt2t")


@carries_units("w_low", "y", shared={"w_high": "w_low"})
def jitumv_dt2t(w_low: jax.typing.ArrayLike, w_high: jax.typing.ArrayLike, prob: float, y: jax.typing.ArrayLike,
                seed, *, shape: tuple[int, int], transpose: bool = False, corder: bool = True,
                backend: Optional[str] = None) -> jax.Array:
    return _products("uniform", (w_low, w_high), prob, y, seed, shape=shape, transpose=transpose, corder=corder,
                     backend=backend, who="jitumv_dt2t")


jitsmv_dt2t.__doc__ = f"""Per-synapse ``weight * y`` of a scalar-weight JITC matrix, in its CSR order.

    The matrix is ``evjax.jits(weight, prob, seed, shape=shape, corder=corder)``.

    Args:
        weight: the weight of every synapse, a scalar or one-element array (traced; differentiable).{_ARGS}
{_RETURNS_RAISES}
    Example:
        >>> out = evjax.jitsmv_dt2t(0.5, 0.1, jnp.ones(40), 7, shape=(40, 30))
        >>> M = evjax.jits(0.5, 0.1, 7, shape=(40, 30))
        >>> out.shape == (int((M != 0).sum()),)
        True
"""

jitnmv_dt2t.__doc__ = f"""Per-synapse ``w_j * y`` of a normal-weight JITC matrix, in its CSR order.

    The matrix is ``evjax.jitn(w_loc, w_scale, prob, seed, shape=shape, corder=corder)``; ``w_j`` is the
    weight drawn for synapse ``j``, ``w_loc + w_scale * z_j``.

    Args:
        w_loc: the mean of the weights (traced; differentiable).
        w_scale: their standard deviation (traced; differentiable).{_ARGS}
{_RETURNS_RAISES}
    Example:
        >>> out = evjax.jitnmv_dt2t(0.5, 0.1, 0.1, jnp.ones(30), 7, shape=(40, 30), transpose=True)
"""

jitumv_dt2t.__doc__ = f"""Per-synapse ``w_j * y`` of a uniform-weight JITC matrix, in its CSR order.

    The matrix is ``evjax.jitu(w_low, w_high, prob, seed, shape=shape, corder=corder)``; ``w_j`` is the
    weight drawn for synapse ``j``, ``w_low + (w_high - w_low) * u_j``.

    Args:
        w_low: the lower bound of the weights (traced; differentiable).
        w_high: the upper bound (traced; differentiable).{_ARGS}
{_RETURNS_RAISES}
    Example:
        >>> out = evjax.jitumv_dt2t(0.0, 0.2, 0.1, jnp.ones(40), 7, shape=(40, 30), corder=False)
"""
