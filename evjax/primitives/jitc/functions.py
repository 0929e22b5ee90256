"""Public JITC functions (brainevent's names and signatures): validation, promotion, binding.

``jit{s,n,u}m{v,m}`` (float operand), ``binary_jit{s,n,u}m{v,m}`` (events) and
``jits/jitn/jitu`` (the dense matrix).  See :mod:`.ops` for the orientation
(``transpose``, ``corder``) and :mod:`.generation` for the generation scheme.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ...units import carries_units
from ... import _compat
from ..._validation import as_seed, canonical, check_shape
from ..._event_values import event_operand
from .ops import bind_dense, bind_matmul

__all__ = [
    "jitsmv", "jitsmm", "jitnmv", "jitnmm", "jitumv", "jitumm",
    "binary_jitsmv", "binary_jitsmm", "binary_jitnmv", "binary_jitnmm", "binary_jitumv", "binary_jitumm",
    "jits", "jitn", "jitu", "check_prob", "as_seed", "MAX_SIZE",
]

MAX_SIZE = 2**30  # positions and stream counters are 32-bit: each dimension below 2^30
_PARAM_NAMES = {"scalar": ("weight",), "normal": ("w_loc", "w_scale"), "uniform": ("w_low", "w_high")}


def check_prob(prob, who: str) -> float:
    """``prob`` as a Python float in ``[0, 1]`` (static: it decides the kernels' constants)."""
    if isinstance(prob, _compat.Tracer):
        raise TypeError(f"{who}: prob must be a Python number (it is static), got a traced value; pass it "
                        f"outside jax.jit, e.g. with functools.partial or static_argnames")
    try:
        p = float(prob)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: prob must be a number in [0, 1], got {type(prob).__name__} {prob!r}") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{who}: prob must be in [0, 1], got {p}")
    return p


def _params(law: str, values, who: str):
    out = []
    for name, v in zip(_PARAM_NAMES[law], values):
        v = canonical(v)  # a float64 weight made in 64-bit mode: float32 once it is off
        if v.size != 1:
            raise ValueError(f"{who}: {name} must be a scalar (one value for the whole matrix), got shape "
                             f"{v.shape}; per-synapse weights need an explicit structure (evjax.CSR)")
        if jnp.issubdtype(v.dtype, jnp.complexfloating) or v.dtype == jnp.bool_:
            raise TypeError(f"{who}: {name} must be a real number, got {v.dtype}")
        out.append(v.reshape(1))
    dtype = jnp.result_type(*out)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.dtype(jnp.float32)  # integer weights: float32 (the kernels compute in floats)
    return [p.astype(dtype) for p in out], dtype


def _shape(shape, who):
    shape = check_shape(shape, who)
    if max(shape) >= MAX_SIZE:
        raise ValueError(f"{who}: each dimension of shape must be below 2**30 (32-bit stream counters), "
                         f"got {shape}")
    return shape


def _matmul(law, values, prob, x, seed, *, shape, transpose, corder, backend, rank, event, weighted, who):
    shape = _shape(shape, who)
    prob = check_prob(prob, who)
    params, dtype = _params(law, values, who)
    seed = as_seed(seed, who)
    if event:
        x, from_wrapper = event_operand(x)
        weighted = bool(weighted) or from_wrapper
    x = canonical(x)
    n_in = shape[0] if transpose else shape[1]
    what = "vector" if rank == 1 else "matrix B"
    if x.ndim != rank or x.shape[0] != n_in:
        want = f"({n_in},)" if rank == 1 else f"({n_in}, k)"
        raise ValueError(f"{who}: the {what} must have shape {want} for shape={shape}, transpose={transpose}, "
                         f"got {x.shape}")
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: complex operands are not supported, got {x.dtype}")
    if not event:
        if x.dtype == jnp.bool_:
            raise TypeError(f"{who}: a bool operand is events: use binary_{who}, or convert it with "
                            f"x.astype(jnp.float32)")
        dtype = jnp.result_type(dtype, x.dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            dtype = jnp.dtype(jnp.float32)
        params, x = [p.astype(dtype) for p in params], x.astype(dtype)
    n_out = shape[1] if transpose else shape[0]
    if prob == 0.0:  # no synapse: nothing to generate
        return jnp.zeros((n_out,) + x.shape[1:], dtype)
    return bind_matmul(law, event, params, seed, x, shape=shape, prob=prob, transpose=transpose, corder=corder,
                       dtype=dtype, backend=backend, weighted=weighted)


def _dense(law, values, prob, seed, *, shape, transpose, corder, backend, who):
    shape = _shape(shape, who)
    prob = check_prob(prob, who)
    params, dtype = _params(law, values, who)
    seed = as_seed(seed, who)
    if prob == 0.0:
        out_shape = shape[::-1] if transpose else shape
        return jnp.zeros(out_shape, dtype)
    return bind_dense(law, params, seed, shape=shape, prob=prob, transpose=transpose, corder=corder,
                      dtype=dtype, backend=backend)


_DOC_ARGS = """
    Args:
        prob: the connection probability, a Python float in ``[0, 1]`` (static);
            each entry is a synapse independently, the expected fan-out of an
            outer index is ``prob * n_inner``.
        seed: an integer, or an integer array of one element (traced: a new
            seed does not recompile); ``None`` draws one at random.
        shape: ``(n_rows, n_cols)`` of the matrix ``M``.
        transpose: compute with ``M.T`` instead of ``M``.
        corder: ``True`` generates the output index outer (a gather: every
            synapse generated); ``False`` the input index (a scatter: only the
            synapses of nonzero inputs generated).  ``(transpose, corder)`` and
            ``(not transpose, not corder)`` give the same matrix, transposed.
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"`` or ``"reference"``
            (default: see :mod:`evjax.config`).
"""


_LAW_ARGS = {
    "scalar": "        weight: the weight of every synapse: a scalar or a one-element array (traced; differentiable).\n",
    "normal": ("        w_loc: the mean of the weights (traced; differentiable).\n"
               "        w_scale: their standard deviation (traced; differentiable).\n"),
    "uniform": ("        w_low: the lower bound of the weights (traced; differentiable).\n"
                "        w_high: the upper bound (traced; differentiable).\n"),
}
_LAW_CALL = {"scalar": "0.1", "normal": "0.1, 0.02", "uniform": "0.0, 0.2"}
_PREFIX = {"scalar": "s", "normal": "n", "uniform": "u"}


def _law_of(law_text: str) -> str:
    return "normal" if "N(0, 1)" in law_text else "uniform" if "U[" in law_text else "scalar"


def _doc(law_text: str, operand: str, rank: int, event: bool) -> str:
    law = _law_of(law_text)
    shape = "(n_in,)" if rank == 1 else "(n_in, k)"
    what = ("bool spikes, numbers with nonzero = spike, an ``evjax.BinaryArray`` or an ``evjax.WeightedArray``"
            if event else "float")
    name = f"{'binary_' if event else ''}jit{_PREFIX[law]}{'mv' if rank == 1 else 'mm'}"
    x = "spikes" if event else operand
    make = (f"jax.random.bernoulli(key, 0.01, {'(n,)' if rank == 1 else '(n, 32)'})" if event
            else f"jnp.ones({'(n,)' if rank == 1 else '(n, 32)'})")
    text = (f"JITC matrix ({law_text}) times {'event' if event else 'float'} {'vector' if rank == 1 else 'matrix'}: "
            f"``M @ {operand}``.\n" + _DOC_ARGS.replace("    Args:\n", "    Args:\n" + _LAW_ARGS[law], 1)
            + f"        {operand}: ``{shape}``, ``n_in = shape[1]`` (``shape[0]`` when transposed); {what}.\n")
    if event:
        text += ("        weighted: scale each active entry's weights by its value (graded events, true\n"
                 "            gradient); a ``WeightedArray`` operand sets it.\n")
    return (text + "\n    Returns:\n        ``M @ x`` (or ``M.T @ x``), in the promoted float dtype.\n"
            "\n    Example:\n"
            f"        >>> n = 100_000                                    # 10^5 x 10^5, 1000 synapses per row\n"
            f"        >>> {x} = {make}\n"
            f"        >>> y = evjax.{name}({_LAW_CALL[law]}, 0.01, {x}, seed=42, shape=(n, n), transpose=True)\n")


def _dense_doc(law: str, name: str) -> str:
    text = (f"The dense matrix ``M`` of a {law}-weight JITC op, for tests and inspection: "
            f"``jit{_PREFIX[law]}mv(..., v, seed, shape=...) == M @ v``.\n"
            + _DOC_ARGS.replace("    Args:\n", "    Args:\n" + _LAW_ARGS[law], 1))
    return (text + "\n    Returns:\n        ``M`` (``shape``), or ``M.T`` when ``transpose``.\n"
            "\n    Example:\n"
            f"        >>> M = evjax.{name}({_LAW_CALL[law]}, 0.1, 7, shape=(50, 40))   # prob 0.1, seed 7\n"
            f"        >>> bool((M != 0).mean() < 0.2)\n        True\n")


@carries_units("weight", "vector")
def jitsmv(weight, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None) -> jax.Array:
    return _matmul("scalar", (weight,), prob, vector, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=1, event=False, weighted=False, who="jitsmv")


jitsmv.__doc__ = _doc('one weight for every synapse', "vector", 1, False)


@carries_units("weight", events=("vector",), weighted="weighted")
def binary_jitsmv(weight, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None, weighted: bool = False) -> jax.Array:
    return _matmul("scalar", (weight,), prob, vector, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=1, event=True, weighted=weighted, who="binary_jitsmv")


binary_jitsmv.__doc__ = _doc('one weight for every synapse', "vector", 1, True)


@carries_units("weight", "B")
def jitsmm(weight, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None) -> jax.Array:
    return _matmul("scalar", (weight,), prob, B, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=2, event=False, weighted=False, who="jitsmm")


jitsmm.__doc__ = _doc('one weight for every synapse', "B", 2, False)


@carries_units("weight", events=("B",), weighted="weighted")
def binary_jitsmm(weight, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None, weighted: bool = False) -> jax.Array:
    return _matmul("scalar", (weight,), prob, B, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=2, event=True, weighted=weighted, who="binary_jitsmm")


binary_jitsmm.__doc__ = _doc('one weight for every synapse', "B", 2, True)


@carries_units("w_loc", "vector", shared={"w_scale": "w_loc"})
def jitnmv(w_loc, w_scale, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None) -> jax.Array:
    return _matmul("normal", (w_loc, w_scale,), prob, vector, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=1, event=False, weighted=False, who="jitnmv")


jitnmv.__doc__ = _doc('weights ``w_loc + w_scale * z``, ``z ~ N(0, 1)``', "vector", 1, False)


@carries_units("w_loc", events=("vector",), weighted="weighted", shared={"w_scale": "w_loc"})
def binary_jitnmv(w_loc, w_scale, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None, weighted: bool = False) -> jax.Array:
    return _matmul("normal", (w_loc, w_scale,), prob, vector, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=1, event=True, weighted=weighted, who="binary_jitnmv")


binary_jitnmv.__doc__ = _doc('weights ``w_loc + w_scale * z``, ``z ~ N(0, 1)``', "vector", 1, True)


@carries_units("w_loc", "B", shared={"w_scale": "w_loc"})
def jitnmm(w_loc, w_scale, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None) -> jax.Array:
    return _matmul("normal", (w_loc, w_scale,), prob, B, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=2, event=False, weighted=False, who="jitnmm")


jitnmm.__doc__ = _doc('weights ``w_loc + w_scale * z``, ``z ~ N(0, 1)``', "B", 2, False)


@carries_units("w_loc", events=("B",), weighted="weighted", shared={"w_scale": "w_loc"})
def binary_jitnmm(w_loc, w_scale, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None, weighted: bool = False) -> jax.Array:
    return _matmul("normal", (w_loc, w_scale,), prob, B, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=2, event=True, weighted=weighted, who="binary_jitnmm")


binary_jitnmm.__doc__ = _doc('weights ``w_loc + w_scale * z``, ``z ~ N(0, 1)``', "B", 2, True)


@carries_units("w_low", "vector", shared={"w_high": "w_low"})
def jitumv(w_low, w_high, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None) -> jax.Array:
    return _matmul("uniform", (w_low, w_high,), prob, vector, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=1, event=False, weighted=False, who="jitumv")


jitumv.__doc__ = _doc('weights ``U[w_low, w_high)``', "vector", 1, False)


@carries_units("w_low", events=("vector",), weighted="weighted", shared={"w_high": "w_low"})
def binary_jitumv(w_low, w_high, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None, weighted: bool = False) -> jax.Array:
    return _matmul("uniform", (w_low, w_high,), prob, vector, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=1, event=True, weighted=weighted, who="binary_jitumv")


binary_jitumv.__doc__ = _doc('weights ``U[w_low, w_high)``', "vector", 1, True)


@carries_units("w_low", "B", shared={"w_high": "w_low"})
def jitumm(w_low, w_high, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None) -> jax.Array:
    return _matmul("uniform", (w_low, w_high,), prob, B, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=2, event=False, weighted=False, who="jitumm")


jitumm.__doc__ = _doc('weights ``U[w_low, w_high)``', "B", 2, False)


@carries_units("w_low", events=("B",), weighted="weighted", shared={"w_high": "w_low"})
def binary_jitumm(w_low, w_high, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
        backend: str | None = None, weighted: bool = False) -> jax.Array:
    return _matmul("uniform", (w_low, w_high,), prob, B, seed, shape=shape, transpose=transpose, corder=corder,
                   backend=backend, rank=2, event=True, weighted=weighted, who="binary_jitumm")


binary_jitumm.__doc__ = _doc('weights ``U[w_low, w_high)``', "B", 2, True)


@carries_units("weight")
def jits(weight, prob, seed, *, shape, transpose: bool = False, corder: bool = True,
         backend: str | None = None) -> jax.Array:
    return _dense("scalar", (weight,), prob, seed, shape=shape, transpose=transpose, corder=corder,
                  backend=backend, who="jits")


@carries_units("w_loc", shared={"w_scale": "w_loc"})
def jitn(w_loc, w_scale, prob, seed, *, shape, transpose: bool = False, corder: bool = True,
         backend: str | None = None) -> jax.Array:
    return _dense("normal", (w_loc, w_scale), prob, seed, shape=shape, transpose=transpose, corder=corder,
                  backend=backend, who="jitn")


@carries_units("w_low", shared={"w_high": "w_low"})
def jitu(w_low, w_high, prob, seed, *, shape, transpose: bool = False, corder: bool = True,
         backend: str | None = None) -> jax.Array:
    return _dense("uniform", (w_low, w_high), prob, seed, shape=shape, transpose=transpose, corder=corder,
                  backend=backend, who="jitu")


jits.__doc__ = _dense_doc("scalar", "jits")
jitn.__doc__ = _dense_doc("normal", "jitn")
jitu.__doc__ = _dense_doc("uniform", "jitu")
