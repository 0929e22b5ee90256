"""Fixed fan-out / fan-in operators: every row of a matrix owns exactly ``k`` synapses.

The stored matrix ``A`` (shape ``(n_rows, n_cols)``) is an index table
``indices`` of shape ``(n_rows, k)`` (row ``i`` connects to the columns
``indices[i, :]``; duplicates add up) and weights, homogeneous (shape ``(1,)``)
or per synapse (shape ``(n_rows, k)``):

    A[i, j] = sum_{l : indices[i, l] = j} w[i, l]

Ops (:class:`~evjax.XLACustomKernel` instances): ``fcnmv_p``, ``fcnmm_p``
(float operand), ``binary_fcnmv_p``, ``binary_fcnmm_p`` (event operand) and
``fcn_sddmm_p`` (the weight gradient).  Operands, in order: ``weights``,
``indices``, then the dense operand (contracted dimension first); static
params ``shape=(n_rows, n_cols)`` and ``transpose`` (as brainevent:
``transpose=False`` is ``A @ x``, the gather, one pass over row ``i``'s table
per output; ``transpose=True`` is ``A.T @ x``, the scatter of the rows'
synapses, event-driven: its cost is ``active rows x k``).

The table is a CSR matrix whose row pointers are ``k * arange(n_rows + 1)``,
so the backends (``numba``, ``warp``, ``numba_cuda``, declared in the package and loaded
on first use) run the CSR kernels on the flattened table with those pointers
made on the fly: no new compiled kernel, and the CSR backend contract
(``docs/csr_backend_contract.md``) holds, including for malformed indices
under ``jit``: an index outside ``[0, n_cols)`` is skipped (see
``docs/fixed_fan.md``).  Weighted (graded) events go one step further and
bind CSR's own weighted op on that structure (``_weighted``): its kernels,
and its rules.
"""
from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import numpy as np

from ..._validation import check_operand
from ...dtypes import compute_dtype
from ...events import as_bool_events
from ...rules import ad as ad_rules
from ...rules import batching as batching_rules
from ...xla_custom_kernel import XLACustomKernel
from ..csr.ops import binary_csrmm, binary_csrmv
from . import blocks
from .validation import pointer_dtype, row_pointers, validate_table  # noqa: F401 (re-exported)

__all__ = [
    "fcnmv", "fcnmm", "binary_fcnmv", "binary_fcnmm", "fcn_sddmm",
    "fcnmv_p", "fcnmm_p", "binary_fcnmv_p", "binary_fcnmm_p", "fcn_sddmm_p",
    "validate_table", "row_pointers", "OPS",
]



def _out_shape(shape, transpose: bool, x_shape) -> tuple:
    return ((shape[0] if not transpose else shape[1]),) + tuple(x_shape[1:])


def _bind(op: XLACustomKernel, weights, indices, x, *, shape, transpose, dtype, backend):
    outs = [jax.ShapeDtypeStruct(_out_shape(shape, transpose, x.shape), dtype)]
    return op.bind(weights, indices, x, outs=outs, shape=tuple(shape), transpose=bool(transpose),
                   backend=backend)[0]


def _matmul(op, weights, indices, x, *, shape, transpose, backend, rank, event, who):
    """Validate, promote and bind one of the four matmul ops (the public wrappers)."""
    weights, indices, shape = validate_table(weights, indices, shape, who=who)
    x, dtype = check_operand(x, weights, shape, transpose, rank, event, who)
    if not event:
        weights, x = weights.astype(dtype), x.astype(dtype)
    return _bind(op, weights, indices, x, shape=shape, transpose=transpose, dtype=dtype, backend=backend)



# ===========================================================================
# Backends: the CSR kernels on the flattened table
# ===========================================================================
def as_csr_generator(csr_generator, *, sddmm: bool = False, **csr_params):
    """A fixed-width op's kernel generator from a CSR backend's generator of the same op.

    The table ``(n_rows, k)`` is the CSR structure ``indices.ravel()`` with row
    pointers ``k * arange(n_rows + 1)`` (an iota XLA computes in the call): the
    CSR kernel then visits row ``i``'s synapses ``[k i, k (i + 1))``.  Weights
    ``(n_rows, k)`` are flattened the same way (``(1,)`` stays homogeneous);
    ``fcn_sddmm``'s flat ``(n_rows k,)`` gradient is reshaped back.
    ``csr_params`` are the CSR op's parameters that the fixed op lacks (the
    binary ops' and the SDDMM's ``weighted``).
    """
    def flat(struct, size):
        return jax.ShapeDtypeStruct((size,), struct.dtype)

    def generator(outs, ins, shape, **params):
        index_in = ins[0] if sddmm else ins[1]
        n, k = index_in.shape
        ptr = jax.ShapeDtypeStruct((n + 1,), pointer_dtype(index_in.dtype, n, k))
        structure = (flat(index_in, n * k), ptr)
        if sddmm:
            flat_outs = [flat(outs[0], n * k)]
            run = csr_generator(outs=flat_outs, ins=structure + tuple(ins[1:]), shape=shape, **params, **csr_params)
        else:
            weights_in = ins[0]
            flat_w = flat(weights_in, int(np.prod(weights_in.shape)))
            run = csr_generator(outs=outs, ins=(flat_w,) + structure + (ins[2],), shape=shape, **params,
                                **csr_params)

        def kernel(*arrays):
            if sddmm:
                indices, r, q = arrays
                (g,) = run(indices.reshape(-1), row_pointers(n, k, ptr.dtype), r, q)
                return [g.reshape(n, k)]
            weights, indices, x = arrays
            return run(weights.reshape(-1), indices.reshape(-1), row_pointers(n, k, ptr.dtype), x)

        return kernel

    return generator


# ===========================================================================
# Pure-JAX reference (the fallback backend and the tests' oracle)
# ===========================================================================
def _term(a, b):
    """One term of a sum over synapses: ``a * b`` for two values (IEEE); a bool (event) operand
    selects the other, never multiplies it (a silent event contributes 0 whatever the weight)."""
    if a.dtype == jnp.bool_:
        return a & b if b.dtype == jnp.bool_ else jnp.where(a, b, jnp.zeros((), b.dtype))
    return jnp.where(b, a, jnp.zeros((), a.dtype)) if b.dtype == jnp.bool_ else a * b


def _columns(indices, n_cols: int):
    """``(valid, cols)``: which synapses lie in the matrix, and their columns clamped for reading."""
    valid = (indices >= 0) & (indices < n_cols)
    return valid, jnp.where(valid, indices, 0)


def _reference_matmul(weights, indices, x, *, outs, shape, transpose, event):
    """gather: y_i = sum_l _term(w_il, x_{j_il});  scatter: y_j = sum_{(i, l): j_il = j} _term(w_il, x_i).
    A synapse whose column lies outside [0, n_cols) contributes nothing."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    n, k = indices.shape
    if n == 0 or k == 0 or shape[1] == 0:
        return [jnp.zeros(out.shape, out.dtype)]
    w = jnp.broadcast_to(weights.astype(dtype), (n, k)) if weights.ndim == 1 else weights.astype(dtype)
    x = as_bool_events(x) if event else x.astype(dtype)
    valid, cols = _columns(indices, shape[1])
    lift = (lambda a: a[..., None]) if x.ndim == 2 else (lambda a: a)
    if not transpose:  # x[cols]: (n, k[, m])
        y = jnp.sum(jnp.where(lift(valid), _term(lift(w), x[cols]), 0), axis=1)
    else:  # x[:, None]: (n, 1[, m]) meets the (n, k) weights
        contrib = jnp.where(lift(valid), _term(lift(w), x[:, None]), 0)
        y = jnp.zeros((shape[1],) + x.shape[1:], dtype).at[cols].add(contrib)
    return [y.astype(out.dtype)]


# ===========================================================================
# Rules shared by the four matmul ops
# ===========================================================================
def _weight_cotangent(op, weights, indices, x, ct, *, shape, transpose, backend, event=False):
    """Cotangent of the weights of ``y = op(w, indices, x)`` given ``ct = y_bar``.

    Per synapse (i, l) with column j = indices[i, l] (x binarised for event ops):
        transpose=False:  y_i += w_il x_j   =>  w_bar_il = <y_bar_i, x_j>
        transpose=True:   y_j += w_il x_i   =>  w_bar_il = <x_i, y_bar_j>
    i.e. w_bar = fcn_sddmm(r, q) with (r, q) = (y_bar, x) or (x, y_bar).  With
    events as r (the scatter) only the synapses of active rows are computed,
    the rest of the (n, k) gradient is a zero-fill: event-driven.

    Homogeneous w: the sum of those per-synapse terms, grouped by output o:
        w_bar = sum_il g_il = sum_o [o reached] y_bar_o * op(1, indices, x)_o
    with op(1, ...)_o the sum of the terms into o (events: their count) and "o reached":
    some synapse contributes a term to o, an active event's (event ops) or any synapse's
    (float ops: structural).  The selection keeps 0 * y_bar_o (nan for y_bar_o = nan or
    inf) out of the sum at outputs that no term reaches, where the per-synapse sum has no
    term (docs/semantics.md); a reached output keeps the IEEE product.  Cost: the op
    itself in the same (event-driven) orientation, whose result counts the active
    synapses for events; float values add one pass of the bool op over every synapse
    (which the float op visits anyway) to count the stored ones.  It never reads w.
    (Weighted events run CSR's weighted op and its rules: ``_weighted``.)
    """
    aval = ad_rules.aval_of(weights)
    if aval.ndim == 1:
        one = jnp.ones((1,), aval.dtype)
        y1 = _bind(op, one, indices, x, shape=shape, transpose=transpose, dtype=ct.dtype, backend=backend)
        if event:
            reached = y1 != 0  # y1 counts the active synapses into each output
        else:  # count the synapses into each output (structural)
            counts = _bind(binary_fcnmv_p, one, indices, jnp.ones(x.shape[:1], jnp.bool_), shape=shape,
                           transpose=transpose, dtype=ct.dtype, backend=backend)
            reached = (counts != 0) if counts.ndim == ct.ndim else (counts != 0)[:, None]
        acc = compute_dtype(aval.dtype)
        terms = jnp.where(reached, ct.astype(acc) * y1.astype(acc), jnp.zeros((), acc))
        return jnp.sum(terms).astype(aval.dtype).reshape(1)
    r, q = (ct, x) if not transpose else (x, ct)
    return _bind_sddmm(indices, r, q, shape=shape, dtype=aval.dtype, backend=backend)


def _operand_cotangent(cts, weights, indices, x, *, outs, shape, transpose, backend):
    # y = A x  =>  x_bar = A.T y_bar (the scatter over the same table) ;  y = A.T x  =>  x_bar = A y_bar
    # (the gather over the same table): no transposed copy of the table is ever built.
    op = fcnmv_p if ad_rules.aval_of(x).ndim == 1 else fcnmm_p
    return _bind(op, weights, indices, cts[0], shape=shape, transpose=not transpose,
                 dtype=ad_rules.aval_of(x).dtype, backend=backend)


def _weights_cotangent_rule(op, event: bool):
    def rule(cts, weights, indices, x, *, outs, shape, transpose, backend):
        # w_bar_il = <y_bar_i, x_{j_il}> (gather) or <x_i, y_bar_{j_il}> (scatter), x as 1[x != 0] for events
        x = as_bool_events(x) if event else x
        return _weight_cotangent(op, weights, indices, x, cts[0], shape=shape, transpose=transpose, backend=backend,
                                 event=event)

    return rule


def _straight_through(float_op):
    def rule(t_s, weights, indices, s, *, outs, shape, transpose, backend):
        # The forward uses 1[s != 0]; the derivative is taken as if y = A s: dy = A ds (the float op).
        return float_op.bind(weights, indices, t_s.astype(outs[0].dtype), outs=outs, shape=shape,
                             transpose=transpose, backend=backend)

    return rule


def _matmul_batching(vector_op, matrix_op, rank: int, event: bool):
    """Batching rule of a matmul op (``rank`` of its dense operand).

    * operand batched, table and weights shared: one call of the matrix op
      (vmap of mv is mm; vmap of mm folds the batch into the columns);
    * homogeneous weights batched: y_b = w_b * op(1, indices, x_b), one call (for
      values only when every w_b is finite: inf * 0 is nan; for events op(1, ...)
      counts active synapses and a count of 0 gives 0);
    * per-synapse weights or the table batched (each element its own table), and
      the non-finite case above: one call on the block-diagonal table
      (``blocks.py``): y_b = A_b x_b is block b of diag(A_1..A_B) [x_1; ...; x_B].
    """
    op_self = vector_op if rank == 1 else matrix_op

    def rule(args, axes, *, outs, shape, transpose, backend):
        weights, indices, x = args
        w_ax, i_ax, x_ax = axes
        dtype = outs[0].dtype
        size = next(a.shape[ax] for a, ax in zip(args, axes) if ax is not None)
        homogeneous = w_ax is not None and weights.ndim == 2  # (batch, 1) or (1, batch)

        def per_element():
            n, k = indices.shape if i_ax is None else tuple(np.delete(np.array(indices.shape), i_ax))
            if not blocks.fits(indices.dtype, size, n, k, shape[1]):
                return batching_rules.sequential_batch(op_self.primitive, args, axes, outs=outs, shape=shape,
                                                       transpose=transpose, backend=backend)[0][0]
            if homogeneous:  # (batch,) weights, one per block
                w = jnp.moveaxis(weights, w_ax, 0)[:, :1, None] * jnp.ones((1, n, k), weights.dtype)
                w = blocks.stack_rows(w, 0, size)
            else:  # an unbatched (1,) stays homogeneous; (n, k) or a batch of them is stacked
                w = weights if (w_ax is None and weights.ndim == 1) else blocks.stack_rows(weights, w_ax, size)
            y = _bind(op_self, w, blocks.block_table(indices, i_ax, size, shape[1]),
                      blocks.stack_rows(x, x_ax, size), shape=(size * n, size * shape[1]), transpose=transpose,
                      dtype=dtype, backend=backend)
            return y.reshape((size, y.shape[0] // size) + y.shape[1:])

        if i_ax is not None or (w_ax is not None and not homogeneous):
            return [per_element()], [0]
        base = jnp.ones((1,), weights.dtype) if w_ax is not None else weights
        if x_ax is None:
            y, y_ax = _bind(op_self, base, indices, x, shape=shape, transpose=transpose, dtype=dtype,
                            backend=backend), None
        else:
            xb = jnp.moveaxis(x, x_ax, 1)  # (n, batch[, m])
            flat = xb.reshape(xb.shape[0], int(np.prod(xb.shape[1:])))
            y = _bind(matrix_op, base, indices, flat, shape=shape, transpose=transpose, dtype=dtype,
                      backend=backend)
            y, y_ax = y.reshape((y.shape[0],) + xb.shape[1:]), 1
        if w_ax is None:
            return [y], [y_ax]
        w = jnp.moveaxis(weights, w_ax, 0)[:, 0]  # (batch,)
        y = y[None] if y_ax is None else jnp.moveaxis(y, 1, 0)
        acc = compute_dtype(dtype)
        scaled = w.astype(acc).reshape((-1,) + (1,) * (y.ndim - 1)) * y.astype(acc)
        if event:  # y counts active synapses: none gives 0, whatever w_b holds
            return [jnp.where(y != 0, scaled, 0).astype(dtype)], [0]
        scaled = jnp.broadcast_to(scaled, (w.shape[0],) + scaled.shape[1:]).astype(dtype)
        return [jax.lax.cond(jnp.all(jnp.isfinite(w)), lambda: scaled, per_element)], [0]

    return rule


def _define_matmul(name: str, float_op, event: bool) -> XLACustomKernel:
    """One matmul op: reference, JVPs and transpose.

    JVP: y = A(w) x is linear in w, and (float ops) in x: dy = A(dw) x + A(w) dx.
    Event ops: dy = A(dw) 1[s != 0] + A(w) ds  (straight-through in s).
    The indices get no tangent (integers: their cotangent is a float0 zero).
    """
    op = XLACustomKernel(name)
    op.def_reference(functools.partial(_reference_matmul, event=event))
    rules = list(ad_rules.linear_jvp_rules(op, 3, (0,) if event else (0, 2)))
    if event:
        rules[2] = _straight_through(float_op)
    op.def_jvp_rule2(*rules)
    cotangents = {0: _weights_cotangent_rule(op, event)}
    if not event:  # an event op is not linear in its events: its JVP w.r.t. them is the float op
        cotangents[2] = _operand_cotangent
    op.def_transpose_rule(ad_rules.linear_transpose_rule(cotangents, name=name))
    return op


fcnmv_p = _define_matmul("evjax_fcnmv", None, event=False)
fcnmm_p = _define_matmul("evjax_fcnmm", None, event=False)
binary_fcnmv_p = _define_matmul("evjax_binary_fcnmv", fcnmv_p, event=True)
binary_fcnmm_p = _define_matmul("evjax_binary_fcnmm", fcnmm_p, event=True)
for _vector, _matrix in ((fcnmv_p, fcnmm_p), (binary_fcnmv_p, binary_fcnmm_p)):
    _event = _vector is binary_fcnmv_p
    _vector.def_batching_rule(_matmul_batching(_vector, _matrix, rank=1, event=_event))
    _matrix.def_batching_rule(_matmul_batching(_vector, _matrix, rank=2, event=_event))


# ===========================================================================
# Public wrappers (brainevent's names and signatures)
# ===========================================================================
def _weighted(rank, weights, indices, values, *, shape, transpose, backend, who):
    """Graded events (``weighted=True``): y = sum over the nonzero entries v of v * w
    (select, then IEEE: a zero entry adds nothing, whatever its weights hold).

    The table is the CSR matrix of its flattened synapses and row pointers
    ``k * arange(n_rows + 1)``, so this is CSR's weighted op on it: its kernels
    visit only the nonzero entries in the scatter orientation, and its rules
    hold (the gradient w.r.t. the values is the true one, A(w).T y_bar, the op
    being linear in them; the weight gradient is event-driven, reshaped here to
    the table's ``(n_rows, k)``).
    """
    weights, indices, shape = validate_table(weights, indices, shape, who=who)
    n, k = indices.shape
    pointers = row_pointers(n, k, pointer_dtype(indices.dtype, n, k))
    csr_op = binary_csrmv if rank == 1 else binary_csrmm
    return csr_op(weights.reshape(-1), indices.reshape(-1), pointers, values, shape=shape, transpose=transpose,
                  backend=backend, weighted=True)


def fcnmv(weights, indices, vector, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Fixed-width connectivity times float vector.

    Args:
        weights: a scalar or ``(1,)`` (homogeneous), or ``(n_rows, k)`` (per synapse); float.
        indices: ``(n_rows, k)``, the columns of row ``i``'s ``k`` synapses; int32 or int64.
        vector: ``(n_cols,)`` (transpose=False) or ``(n_rows,)`` (transpose=True).
        shape: ``(n_rows, n_cols)`` of the stored matrix ``A``.
        transpose: compute ``A.T @ vector`` (the scatter orientation).
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"`` (default: see :mod:`evjax.config`).

    Returns:
        ``A @ vector`` of shape ``(n_rows,)`` or ``A.T @ vector`` of shape ``(n_cols,)``.

    Raises:
        ValueError: shapes that do not fit, or a concrete index outside ``[0, n_cols)``.

    Example:
        >>> C = evjax.FixedPostNumConn.random(jax.random.PRNGKey(0), 1000, 500, 20, weight=0.1)
        >>> y = evjax.fcnmv(C.data, C.indices, x, shape=C.shape, transpose=True)   # x @ C, x: (1000,)
    """
    return _matmul(fcnmv_p, weights, indices, vector, shape=shape, transpose=transpose, backend=backend,
                   rank=1, event=False, who="fcnmv")


def fcnmm(weights, indices, matrix, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Fixed-width connectivity times float matrix.

    Args:
        weights: as in :func:`fcnmv`.
        indices: as in :func:`fcnmv`.
        shape: as in :func:`fcnmv`.
        transpose: as in :func:`fcnmv`.
        backend: as in :func:`fcnmv`.
        matrix: ``(n_cols, m)`` (transpose=False) or ``(n_rows, m)`` (transpose=True).

    Returns:
        ``A @ matrix`` of shape ``(n_rows, m)`` or ``A.T @ matrix`` of shape ``(n_cols, m)``.

    Example:
        >>> Y = evjax.fcnmm(C.data, C.indices, X, shape=C.shape, transpose=True)   # X: (1000, 32)
    """
    return _matmul(fcnmm_p, weights, indices, matrix, shape=shape, transpose=transpose, backend=backend,
                   rank=2, event=False, who="fcnmm")


def binary_fcnmv(weights, indices, spikes, *, shape, transpose: bool = False, backend: str | None = None,
                 weighted: bool = False) -> jax.Array:
    """Fixed-width connectivity times event vector: only active entries contribute.

    With ``transpose=True`` (``spikes @ W`` for a fan-out table of shape ``(n_pre, n_post)``)
    the cost is ``active rows x k``.

    Args:
        weights: as in :func:`fcnmv`.
        indices: as in :func:`fcnmv`.
        shape: as in :func:`fcnmv`.
        transpose: as in :func:`fcnmv`.
        backend: as in :func:`fcnmv`.
        spikes: ``(n_cols,)`` (transpose=False) or ``(n_rows,)`` (transpose=True); bool, or a
            number where nonzero is a spike (its gradient is straight-through, ``A``).
        weighted: graded events: each nonzero entry contributes ``value * weight`` (a zero
            entry nothing, whatever its weights hold), with the true gradient w.r.t. the values.

    Returns:
        The result in the weight dtype (weighted: the promoted dtype).

    Example:
        >>> spikes = jax.random.bernoulli(key, 0.05, (1000,))
        >>> current = evjax.binary_fcnmv(C.data, C.indices, spikes, shape=C.shape, transpose=True)
    """
    if weighted:
        return _weighted(1, weights, indices, spikes, shape=shape, transpose=transpose, backend=backend,
                         who="binary_fcnmv")
    return _matmul(binary_fcnmv_p, weights, indices, spikes, shape=shape, transpose=transpose, backend=backend,
                   rank=1, event=True, who="binary_fcnmv")


def binary_fcnmm(weights, indices, matrix, *, shape, transpose: bool = False, backend: str | None = None,
                 weighted: bool = False) -> jax.Array:
    """Fixed-width connectivity times event matrix (a batch of spike vectors as columns).

    Args:
        weights: as in :func:`binary_fcnmv`.
        indices: as in :func:`binary_fcnmv`.
        shape: as in :func:`binary_fcnmv`.
        transpose: as in :func:`binary_fcnmv`.
        backend: as in :func:`binary_fcnmv`.
        weighted: as in :func:`binary_fcnmv`.
        matrix: ``(n_cols, m)`` (transpose=False) or ``(n_rows, m)`` (transpose=True); events.

    Returns:
        ``(n_rows, m)`` or ``(n_cols, m)`` in the weight dtype.

    Example:
        >>> S = jax.random.bernoulli(key, 0.05, (1000, 32))       # 32 event vectors as columns
        >>> out = evjax.binary_fcnmm(C.data, C.indices, S, shape=C.shape, transpose=True)
    """
    if weighted:
        return _weighted(2, weights, indices, matrix, shape=shape, transpose=transpose, backend=backend,
                         who="binary_fcnmm")
    return _matmul(binary_fcnmm_p, weights, indices, matrix, shape=shape, transpose=transpose, backend=backend,
                   rank=2, event=True, who="binary_fcnmm")


# ===========================================================================
# fcn_sddmm: g[i, l] = <r[i], q[indices[i, l]]>  (the per-synapse weight gradient)
# ===========================================================================
def fcn_sddmm(indices, r, q, *, shape, dtype=None, backend: str | None = None) -> jax.Array:
    """Sampled dense-dense product on the table: ``g[i, l] = <r[i], q[indices[i, l]]>``.

    The gradient of the fixed-width matmuls w.r.t. per-synapse weights.  A bool
    (event) operand selects (a term with an inactive event is 0, whatever the
    other holds); with a bool operand the rows where ``r`` is zero are skipped
    (zero-filled), which makes the scatter's weight gradient event-driven.

    Args:
        indices: the table and the stored matrix's shape.
        shape: the table and the stored matrix's shape.
        r: ``(n_rows,)`` or ``(n_rows, m)``; float or bool.
        q: ``(n_cols,)`` or ``(n_cols, m)``; float or bool.
        dtype: the result dtype (default: promotion of the float operands).
        backend: as in :func:`fcnmv`.

    Returns:
        ``(n_rows, k)`` array.

    Example:
        >>> # d sum(g * (spikes @ C)) / d C.data, event-driven: r = spikes, q = g
        >>> dW = evjax.fcn_sddmm(C.indices, spikes, g, shape=C.shape)
    """
    _, indices, shape = validate_table(jnp.ones((1,), jnp.float32), indices, shape, who="fcn_sddmm")
    r, q = jnp.asarray(r), jnp.asarray(q)
    if r.ndim not in (1, 2) or r.ndim != q.ndim or r.shape[0] != shape[0] or q.shape[0] != shape[1] \
            or r.shape[1:] != q.shape[1:]:
        raise ValueError(f"fcn_sddmm: r {r.shape} and q {q.shape} must be (n_rows[, m]) and (n_cols[, m]) "
                         f"for shape {shape}")
    floats = [a.dtype for a in (r, q) if a.dtype != jnp.bool_]
    dtype = dtype or (jnp.result_type(*floats) if floats else jnp.float32)
    return _bind_sddmm(indices, r, q, shape=shape, dtype=dtype, backend=backend)


def _bind_sddmm(indices, r, q, *, shape, dtype, backend):
    outs = [jax.ShapeDtypeStruct(tuple(indices.shape), dtype)]
    return fcn_sddmm_p.bind(indices, r, q, outs=outs, shape=tuple(shape), backend=backend)[0]


def _sddmm_dense(indices, r, q, *, dtype, shape):
    """g_il = <r_i, q_{j_il}> term by term (``_term``: a bool operand selects), 0 off the matrix."""
    acc = compute_dtype(dtype)
    if indices.size == 0 or shape[1] == 0:
        return jnp.zeros(indices.shape, dtype)
    valid, cols = _columns(indices, shape[1])
    as_acc = lambda a: a if a.dtype == jnp.bool_ else a.astype(acc)  # noqa: E731
    terms = _term(as_acc(r)[:, None], as_acc(q)[cols]).astype(acc)  # (n, k[, m])
    g = terms if r.ndim == 1 else jnp.sum(terms, axis=-1)
    return jnp.where(valid, g, 0).astype(dtype)


def _sddmm_reference(indices, r, q, *, outs, shape):
    return [_sddmm_dense(indices, r, q, dtype=outs[0].dtype, shape=shape)]


def _sddmm_operand_cotangent(cts, indices, other, *, aval, shape, transpose, backend):
    # the matmul of A(g_bar) with the other operand: a bool one selects (the binary op), a float one multiplies
    event = other.dtype == jnp.bool_
    op = {(1, False): fcnmv_p, (2, False): fcnmm_p, (1, True): binary_fcnmv_p, (2, True): binary_fcnmm_p}
    return _bind(op[(aval.ndim, event)], cts[0].astype(aval.dtype), indices,
                 other if event else other.astype(aval.dtype), shape=shape, transpose=transpose,
                 dtype=aval.dtype, backend=backend)


def _sddmm_r_cotangent(cts, indices, r, q, *, outs, shape, backend):
    # r_bar_i = sum_l g_bar_il q_{j_il} = (A(g_bar) q)_i: the gather
    return _sddmm_operand_cotangent(cts, indices, q, aval=ad_rules.aval_of(r), shape=shape, transpose=False,
                                    backend=backend)


def _sddmm_q_cotangent(cts, indices, r, q, *, outs, shape, backend):
    # q_bar_j = sum_{(i, l): j_il = j} g_bar_il r_i = (A(g_bar).T r)_j: the scatter
    return _sddmm_operand_cotangent(cts, indices, r, aval=ad_rules.aval_of(q), shape=shape, transpose=True,
                                    backend=backend)


def _sddmm_batching(args, axes, *, outs, shape, backend):
    # g_b = sddmm(indices_b, r_b, q_b) is block b of the sddmm on the block-diagonal table (blocks.py),
    # with r and q stacked: one call, still event-driven (silent rows of an event r are skipped)
    indices, r, q = args
    i_ax, r_ax, q_ax = axes
    size = next(a.shape[ax] for a, ax in zip(args, axes) if ax is not None)
    n, k = indices.shape if i_ax is None else tuple(np.delete(np.array(indices.shape), i_ax))
    if not blocks.fits(indices.dtype, size, n, k, shape[1]):
        fn = functools.partial(_sddmm_dense, dtype=outs[0].dtype, shape=shape)
        return [jax.vmap(fn, in_axes=tuple(axes))(*args)], [0]
    g = _bind_sddmm(blocks.block_table(indices, i_ax, size, shape[1]), blocks.stack_rows(r, r_ax, size),
                    blocks.stack_rows(q, q_ax, size), shape=(size * n, size * shape[1]), dtype=outs[0].dtype,
                    backend=backend)
    return [g.reshape(size, n, k)], [0]


fcn_sddmm_p = XLACustomKernel("evjax_fcn_sddmm")
fcn_sddmm_p.def_reference(_sddmm_reference)
# g = <r_i, q_j> is bilinear: dg = sddmm(dr, q) + sddmm(r, dq)
fcn_sddmm_p.def_jvp_rule2(*ad_rules.linear_jvp_rules(fcn_sddmm_p, 3, (1, 2)))
fcn_sddmm_p.def_transpose_rule(ad_rules.linear_transpose_rule(
    {1: _sddmm_r_cotangent, 2: _sddmm_q_cotangent}, name="evjax_fcn_sddmm"))
fcn_sddmm_p.def_batching_rule(_sddmm_batching)

OPS = (fcnmv_p, fcnmm_p, binary_fcnmv_p, binary_fcnmm_p, fcn_sddmm_p)
