"""Just-in-time connectivity (JITC) ops: a random matrix regenerated in every kernel, never stored.

A JITC matrix ``M`` of shape ``(n_rows, n_cols)`` is defined by ``(prob, seed)``
and a weight law; the kernels regenerate the synapses of the indices they visit
(:mod:`.generation`: a counter-based stream per outer index, geometric skipping).

Laws and their weight parameters (operands, each of shape ``(1,)``, differentiable):

* ``scalar``: ``(weight,)``, ``w = weight``;
* ``normal``: ``(loc, scale)``, ``w = loc + scale * z``, ``z ~ N(0, 1)``;
* ``uniform``: ``(low, high)``, ``w = low + (high - low) * u``, ``u ~ U[0, 1)``.

Operands, in order: the law's parameters, ``seed`` (``(1,)`` uint32, traced:
a new seed does not recompile), then the dense operand (``x``, contracted
dimension first).  Static params: ``shape``, ``prob``, ``transpose``,
``corder`` (and ``weighted`` for event ops).

Orientation.  An op computes ``M @ x`` (``transpose=False``) or ``M.T @ x``.
``corder`` states which index is generated outer, as brainevent has it:
``corder=True`` generates the op's *output* index outer (each output
regenerates its stream and gathers: parallel without atomics, but every
synapse is generated whatever the operand holds); ``corder=False`` generates
the *input* index outer (each input scatters its synapses: event-driven, a
silent event generates nothing).  Hence ``M`` is generated row-outer iff
``corder != transpose``, and ``(transpose, corder)`` and
``(not transpose, not corder)`` are the same matrix transposed, which is what
the transpose rule and ``.T`` use.  The kernels see only the generated matrix
``G`` (``n_outer x n_inner``): ``y = G @ x`` (gather) or ``y = G.T @ x`` (scatter).

Event operands: ``binary_*`` ops take bool spikes or numbers, nonzero meaning
a spike; an inactive entry contributes nothing, whatever the weights hold
(select, never multiply).  ``weighted=True`` scales each active entry's
weights by its value (graded events, true gradient); otherwise the gradient
w.r.t. a float spike array is straight-through (``M``).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from ...dtypes import compute_dtype
from ..._event_values import as_bool_events
from ...rules import ad as ad_rules
from ...rules import batching as batching_rules
from ...rules.partitioning import PartitionRule
from ...xla_custom_kernel import XLACustomKernel
from .generation import dense_generated, streamed_product

__all__ = ["LAWS", "MATMUL_OPS", "DENSE_OPS", "OPS", "generated_shape", "row_outer", "bind_matmul",
           "bind_dense", "jitsmv_p", "jitsmm_p", "binary_jitsmv_p", "binary_jitsmm_p", "jitnmv_p", "jitnmm_p",
           "binary_jitnmv_p", "binary_jitnmm_p", "jitumv_p", "jitumm_p", "binary_jitumv_p", "binary_jitumm_p",
           "jits_p", "jitn_p", "jitu_p"]


def host_structure(backend: str = "numba"):
    """The host generator of the synapses, identical to the kernels': the backend module's
    ``generated_structure(law, params, seed, prob, n_outer, n_inner, dtype) -> (data, indices,
    indptr)`` (NumPy), from the module the ops' declared loader returns (this module and the data
    types never import a backend)."""
    op = next(iter(MATMUL_OPS.values()))
    return op.backend_module("cpu", backend).generated_structure
LAWS = {"scalar": 1, "normal": 2, "uniform": 2}  # law -> number of weight parameters
_LETTER = {"scalar": "s", "normal": "n", "uniform": "u"}


def row_outer(transpose: bool, corder: bool) -> bool:
    """Whether ``M`` is generated row by row: the output index is outer iff ``corder``."""
    return bool(corder) != bool(transpose)


def generated_shape(shape, transpose: bool, corder: bool) -> tuple[int, int]:
    """``(n_outer, n_inner)`` of the generated matrix ``G`` (``M`` or ``M.T``)."""
    n_rows, n_cols = shape
    return (n_rows, n_cols) if row_outer(transpose, corder) else (n_cols, n_rows)


# ===========================================================================
# Reference (pure JAX: the fallback backend and the stand-in while a kernel compiles)
# ===========================================================================
def _op_matrix(law, params, seed, *, shape, prob, transpose, corder, dtype):
    """``(D, mask)`` with ``D = M`` or ``M.T`` as the op applies it (``n_out x n_in``)."""
    n_outer, n_inner = generated_shape(shape, transpose, corder)
    w, mask = dense_generated(law, params, seed.reshape(()), prob, n_outer, n_inner, dtype)
    return (w, mask) if corder else (w.T, mask.T)  # corder: the output index is outer


def _term(mode: str, dtype):
    """A synapse's contribution ``term(w, x_i)`` to ``y_o = sum_i term(w_oi, x_i)`` (over the structure only):
    ``float`` w x (IEEE); ``binary`` w where x != 0 (select); ``weighted`` w x where x != 0."""
    zero = jnp.zeros((), dtype)
    if mode == "float":
        return lambda w, x: w * x.astype(dtype)
    if mode == "binary":
        return lambda w, x: jnp.where(as_bool_events(x), w, zero)
    return lambda w, x: jnp.where(as_bool_events(x), w * x.astype(dtype), zero)


def _reference_matmul(*args, outs, law, mode, shape, prob, transpose, corder):
    # O(synapses): the streams generated block by block (generation.streamed_product), never the matrix
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    params, seed, x = args[:-2], args[-2], args[-1]
    n_outer, n_inner = generated_shape(shape, transpose, corder)
    scatter = not corder  # corder: the output index is outer (gather); else the input's (scatter)
    if corder:  # the outputs asked for: all, or a device's slice of them (_matmul_partition)
        n_outer = out.shape[0]
    active = None
    if scatter and mode != "float":  # event-driven: only the streams of active events are generated
        active = as_bool_events(x) if x.ndim == 1 else jnp.any(as_bool_events(x), axis=1)
    # a second seed entry: the global index of this slice's first outer index (_matmul_partition)
    first = seed.reshape(-1)[1].astype(jnp.int32) if seed.size > 1 else 0
    y = streamed_product(law, params, seed.reshape(-1)[0], prob, n_outer, n_inner, x, _term(mode, dtype),
                         scatter=scatter, dtype=dtype, outer_active=active, first_outer=first)
    return [y.astype(out.dtype)]


def _reference_dense(*args, outs, law, shape, prob, transpose, corder):
    out = outs[0]
    params, seed = args[:-1], args[-1]
    w, _ = _op_matrix(law, params, seed, shape=shape, prob=prob, transpose=transpose, corder=corder,
                      dtype=compute_dtype(out.dtype))
    return [w.astype(out.dtype)]


# ===========================================================================
# Binding
# ===========================================================================
def _mode(event: bool, weighted: bool) -> str:
    return "float" if not event else ("weighted" if weighted else "binary")


def bind_matmul(law: str, event: bool, params, seed, x, *, shape, prob, transpose, corder, dtype,
                backend, weighted=False):
    """Bind the matmul op of ``law`` (mv or mm by ``x.ndim``) and return its result."""
    op = MATMUL_OPS[(law, x.ndim, event)]
    n_out = shape[1] if transpose else shape[0]
    outs = [jax.ShapeDtypeStruct((n_out,) + tuple(x.shape[1:]), dtype)]
    extra = {"weighted": bool(weighted)} if event else {}
    return op.bind(*params, seed, x, outs=outs, shape=tuple(shape), prob=float(prob), transpose=bool(transpose),
                   corder=bool(corder), backend=backend, **extra)[0]


def bind_dense(law: str, params, seed, *, shape, prob, transpose, corder, dtype, backend):
    """Bind the materialiser of ``law``: ``M`` (or ``M.T``) as a dense array."""
    out_shape = tuple(shape[::-1]) if transpose else tuple(shape)
    outs = [jax.ShapeDtypeStruct(out_shape, dtype)]
    return DENSE_OPS[law].bind(*params, seed, outs=outs, shape=tuple(shape), prob=float(prob),
                               transpose=bool(transpose), corder=bool(corder), backend=backend)[0]


def _basis(params, i: int):
    """The parameters with ``params[i] = 1`` and the others 0 (the law is linear in them jointly)."""
    return [jnp.ones(p.shape, p.dtype) if j == i else jnp.zeros(p.shape, p.dtype)
            for j, p in enumerate(ad_rules.aval_of(q) for q in params)]


def _with_tangent(params, i: int, tangent):
    """The parameters with ``params[i] = tangent`` and the others 0."""
    avals = [ad_rules.aval_of(q) for q in params]
    return [tangent if j == i else jnp.zeros(a.shape, a.dtype) for j, a in enumerate(avals)]


# ===========================================================================
# The matmul ops: jit{s,n,u}m{v,m} (float operands) and binary_jit{s,n,u}m{v,m} (events)
#
# One primitive per law, rank and kind of operand (brainevent's names); they differ only in
# those three, so each rule below is one module-level function whose leading arguments
# (law, rank, event) the registration fixes with functools.partial.
# ===========================================================================
def _matmul_reference(law: str, event: bool, *args, weighted=False, **params):
    return _reference_matmul(*args, law=law, mode=_mode(event, weighted), **params)


def _matmul_jvp_param(law: str, rank: int, event: bool, i: int, tangent, *args, outs, **params):
    # y = sum_p theta_p A_p x is linear in the parameters jointly (A_p: the matrix of basis p):
    # dy = A(dtheta) x, i.e. the op with the tangent at parameter i and 0 at the others.
    n = LAWS[law]
    op = MATMUL_OPS[(law, rank, event)]
    return op.primitive.bind(*_with_tangent(args[:n], i, tangent), *args[n:], outs=outs, **params)


def _matmul_jvp_operand(law: str, rank: int, event: bool, tangent, *args, outs, weighted=False, **params):
    # float: y = A x is linear in x, dy = A dx.  events: straight-through (binary) or the true
    # derivative of sum_{x != 0} w x (weighted), both dy = A dx: the float op on the tangent.
    n = LAWS[law]
    float_op = MATMUL_OPS[(law, rank, False)]
    return float_op.primitive.bind(*args[:n], args[n], tangent.astype(outs[0].dtype), outs=outs, **params)


def _selected_sums(params, selected, ct, products) -> dict:
    """``{i: sum(where(selected, ct * products[i], 0))}`` in each parameter's dtype and shape: the cotangent
    of parameter i, reading ``ct`` only where ``selected`` (0 * nan never enters the sum)."""
    out = {}
    for i, product in products.items():
        aval = ad_rules.aval_of(params[i])
        acc = compute_dtype(aval.dtype)
        terms = jnp.where(selected, ct.astype(acc) * product.astype(acc), jnp.zeros((), acc))
        out[i] = jnp.sum(terms).astype(aval.dtype).reshape(aval.shape)
    return out


def _matmul_param_cotangents(law: str, event: bool, cts, args, undefined, *, shape, prob, transpose, corder,
                             backend, weighted=False):
    # y = A(theta) x = sum_p theta_p A(e_p) x  =>  theta_bar_p = sum_o [o reached] y_bar_o (A(e_p) x)_o,
    # the op itself with the basis e_p (for events only the synapses of active inputs are generated:
    # event-driven), summed over the outputs o that some synapse's term reaches: an active event's
    # (event ops) or any synapse's (float ops: structural).  It is the sum over the synapses of the
    # per-synapse terms y_bar_o * dw_oi/dtheta_p * term(x_i), grouped by output; an output no term reaches
    # has (A(e_p) x)_o = 0, an empty sum, and 0 * y_bar_o would be nan for a nan or inf y_bar_o where the
    # synapse sum has no term (docs/semantics.md).  "Reached" is read off A(e_0) with nonnegative inputs,
    # whose basis weights are positive on every synapse (scalar and normal: 1; uniform: 1 - u >= 2^-24):
    # A(e_0) 1[x != 0] > 0 exactly at the outputs an active event reaches, A(e_0) 1 at those with a synapse.
    # For spikes that is theta_0's own product (no extra pass); weighted events and float values take one
    # more pass (the spikes op on 1[x != 0], event-driven; the float op on ones).  A reached output keeps
    # the IEEE product (a float x = 0 beside y_bar = nan gives nan).
    n = LAWS[law]
    params, seed, x = args[:n], args[n], args[n + 1]
    ct = cts[0]
    bind = functools.partial(bind_matmul, law, seed=seed, shape=shape, prob=prob, transpose=transpose,
                             corder=corder, dtype=ct.dtype, backend=backend)
    y1 = {i: bind(event, _basis(params, i), x=x, weighted=weighted) for i in undefined}
    if event and not weighted:
        first = y1[0] if 0 in y1 else bind(True, _basis(params, 0), x=x)
    elif event:  # weighted: the same op on the spikes 1[x != 0]
        first = bind(True, _basis(params, 0), x=x, weighted=False)
    else:  # float: structural, the synapses of each output
        first = bind(False, _basis(params, 0), x=jnp.ones(x.shape[:1], ct.dtype))
    reached = first != 0
    if reached.ndim < ct.ndim:
        reached = reached[:, None]
    return _selected_sums(params, reached, ct, y1)


def _matmul_operand_cotangent(law: str, cts, *args, shape, prob, transpose, corder, backend):
    # y = A x  =>  x_bar = A.T y_bar: the same generated matrix transposed, i.e. the op with
    # transpose and corder both flipped (row_outer is unchanged: same seed, same draws).
    n = LAWS[law]
    aval = ad_rules.aval_of(args[n + 1])
    return bind_matmul(law, False, args[:n], args[n], cts[0], shape=shape, prob=prob, transpose=not transpose,
                       corder=not corder, dtype=aval.dtype, backend=backend)


def _matmul_transpose(law: str, rank: int, event: bool, cts, *args, outs, **params):
    # the parameters' cotangents together (they share the selection of the reached outputs), then x's
    n = LAWS[law]
    undefined = [i for i in range(n) if ad_rules.is_undefined(args[i])]
    found = _matmul_param_cotangents(law, event, cts, args, undefined, **params) if undefined else {}
    result = [found.get(i) for i in range(n)] + [None, None]
    x = args[n + 1]
    if ad_rules.is_undefined(x) and jnp.issubdtype(x.aval.dtype, jnp.inexact):
        if event:  # not linear in its events: their JVP is the float op, never transposed here
            name = MATMUL_OPS[(law, rank, event)].name
            raise NotImplementedError(f"{name}: transpose w.r.t. argument {n + 1} is not defined; the op "
                                      f"is not linear in it")
        result[n + 1] = _matmul_operand_cotangent(law, cts, *args, **params)
    return result


def _matmul_batching(law: str, rank: int, event: bool, args, axes, *, outs, shape, prob, transpose, corder,
                     backend, weighted=False):
    # vmap of the operand alone: one call of the mm op (the batch folded into columns, no loop);
    # a batch of weight parameters or seeds: a sequential loop (lax.map) over the batch.
    n = LAWS[law]
    extra = {"weighted": weighted} if event else {}
    if any(a is not None for a in axes[:n + 1]):
        self_op = MATMUL_OPS[(law, rank, event)]
        return batching_rules.sequential_batch(self_op.primitive, args, axes, outs=outs, shape=shape, prob=prob,
                                               transpose=transpose, corder=corder, backend=backend, **extra)
    x = jnp.moveaxis(args[n + 1], axes[n + 1], 1)  # (n_in, batch[, k])
    size = x.shape[1]
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:]))
    y = bind_matmul(law, event, args[:n], args[n], flat, shape=shape, prob=prob, transpose=transpose,
                    corder=corder, dtype=outs[0].dtype, backend=backend, weighted=weighted)
    return [y.reshape((y.shape[0], size) + x.shape[2:])], [1]


def _matmul_partition(law: str, rank: int, event: bool, *avals, outs, corder, **params):
    # Y[:, c] = M X[:, c]: the columns c of a matrix operand are independent products, so each device
    # multiplies its own columns by the whole matrix, generated from the same parameters and seed.
    # corder (the output index o is outer, each output's synapses one stream keyed by (seed, o)): a
    # device may also compute a slice of the outputs, generating only their streams; it keys them by
    # their global index, which _seed_with_first appends to the seed operand
    whole = tuple(" ".join(f"p{i}d{d}" for d in range(a.ndim)) for i, a in enumerate(avals[:-1]))
    x, y = ("i c", "o c") if rank == 2 else ("i", "o")
    batch = (("c",) if rank == 2 else ()) + (("o",) if corder else ())
    if not batch:
        return None
    return PartitionRule(whole + (x,), (y,), batch=batch,
                         localize=functools.partial(_seed_with_first, LAWS[law]) if corder else None)


def _seed_with_first(n: int, operands, firsts):
    # the seed operand (params[:n], seed, x, ...) as (seed, first output index of this device)
    if "o" not in firsts:
        return operands
    seed = operands[n].reshape(-1)[:1]
    first = jnp.asarray(firsts["o"], jnp.uint32).reshape(1)
    return (*operands[:n], jnp.concatenate([seed.astype(jnp.uint32), first]).astype(operands[n].dtype),
            *operands[n + 1:])


def _matmul_op(law: str, rank: int, event: bool) -> XLACustomKernel:
    """The matmul primitive of ``law``, ``rank`` and ``event``, its rules registered."""
    op = XLACustomKernel(f"evjax_{'binary_' if event else ''}jit{_LETTER[law]}{'mv' if rank == 1 else 'mm'}")
    op.def_reference(functools.partial(_matmul_reference, law, event))
    param_jvps = [functools.partial(_matmul_jvp_param, law, rank, event, i) for i in range(LAWS[law])]
    op.def_jvp_rule2(*param_jvps, None, functools.partial(_matmul_jvp_operand, law, rank, event))
    op.def_transpose_rule(functools.partial(_matmul_transpose, law, rank, event))
    op.def_batching_rule(functools.partial(_matmul_batching, law, rank, event))
    op.def_partition_rule(functools.partial(_matmul_partition, law, rank, event))
    return op


jitsmv_p = _matmul_op("scalar", 1, False)
jitsmm_p = _matmul_op("scalar", 2, False)
binary_jitsmv_p = _matmul_op("scalar", 1, True)
binary_jitsmm_p = _matmul_op("scalar", 2, True)
jitnmv_p = _matmul_op("normal", 1, False)
jitnmm_p = _matmul_op("normal", 2, False)
binary_jitnmv_p = _matmul_op("normal", 1, True)
binary_jitnmm_p = _matmul_op("normal", 2, True)
jitumv_p = _matmul_op("uniform", 1, False)
jitumm_p = _matmul_op("uniform", 2, False)
binary_jitumv_p = _matmul_op("uniform", 1, True)
binary_jitumm_p = _matmul_op("uniform", 2, True)

MATMUL_OPS = {  # (law, rank, event) -> op: what the backends register on and the rules bind
    ("scalar", 1, False): jitsmv_p, ("scalar", 2, False): jitsmm_p,
    ("scalar", 1, True): binary_jitsmv_p, ("scalar", 2, True): binary_jitsmm_p,
    ("normal", 1, False): jitnmv_p, ("normal", 2, False): jitnmm_p,
    ("normal", 1, True): binary_jitnmv_p, ("normal", 2, True): binary_jitnmm_p,
    ("uniform", 1, False): jitumv_p, ("uniform", 2, False): jitumm_p,
    ("uniform", 1, True): binary_jitumv_p, ("uniform", 2, True): binary_jitumm_p,
}


# ===========================================================================
# The materialisers: jits, jitn, jitu (the matrix as a dense array)
# ===========================================================================
def _dense_jvp_param(law: str, i: int, tangent, *args, outs, **params):
    # D(theta) is linear in theta jointly: dD = D(dtheta)
    n = LAWS[law]
    return DENSE_OPS[law].primitive.bind(*_with_tangent(args[:n], i, tangent), args[n], outs=outs, **params)


def _dense_transpose(law: str, cts, *args, outs, shape, prob, transpose, corder, backend):
    # theta_bar_p = sum over the synapses (o, i) of D_bar_oi * D(e_p)_oi: a cotangent off the synapses is
    # never read (0 * nan would be nan there).  The synapses are where D(e_0) != 0: its basis weights are
    # positive on every synapse (scalar and normal: 1; uniform: 1 - u >= 2^-24).
    n = LAWS[law]
    undefined = [i for i in range(n) if ad_rules.is_undefined(args[i])]
    if not undefined:
        return [None] * (n + 1)
    ct = cts[0]
    bind = functools.partial(bind_dense, law, seed=args[n], shape=shape, prob=prob, transpose=transpose,
                             corder=corder, dtype=ct.dtype, backend=backend)
    d1 = {i: bind(_basis(args[:n], i)) for i in undefined}
    synapses = (d1[0] if 0 in d1 else bind(_basis(args[:n], 0))) != 0
    found = _selected_sums(args[:n], synapses, ct, d1)
    return [found.get(i) for i in range(n)] + [None]


def _dense_batching(law: str, args, axes, **params):
    # parameters or seeds batched: a loop (lax.map), one materialisation per batch element
    return batching_rules.sequential_batch(DENSE_OPS[law].primitive, args, axes, **params)


def _dense_op(law: str) -> XLACustomKernel:
    """The materialiser primitive of ``law``, its rules registered."""
    op = XLACustomKernel(f"evjax_jit{_LETTER[law]}")
    op.def_reference(functools.partial(_reference_dense, law=law))
    op.def_jvp_rule2(*[functools.partial(_dense_jvp_param, law, i) for i in range(LAWS[law])], None)
    op.def_transpose_rule(functools.partial(_dense_transpose, law))
    op.def_batching_rule(functools.partial(_dense_batching, law))
    return op


jits_p = _dense_op("scalar")
jitn_p = _dense_op("normal")
jitu_p = _dense_op("uniform")

DENSE_OPS = {"scalar": jits_p, "normal": jitn_p, "uniform": jitu_p}

OPS = tuple(MATMUL_OPS.values()) + tuple(DENSE_OPS.values())
