"""Event-driven CSR operators: sparse synaptic propagation under jit, grad, jvp and vmap.

A CSR matrix ``A`` of shape ``(n_rows, n_cols)`` is three arrays: ``data``
(weights: shape ``(1,)`` homogeneous, or ``(nnz,)`` per synapse), ``indices``
(column of each synapse, ``(nnz,)``) and ``indptr`` (``(n_rows + 1,)``, row
``i`` owns ``indices[indptr[i]:indptr[i + 1]]``).  Duplicate column indices in
a row are summed.

Backend interface contract
==========================
Ops (module-level :class:`~evjax.XLACustomKernel` instances):
``csrmv_p``, ``csrmm_p`` (float operand), ``binary_csrmv_p``, ``binary_csrmm_p``
(event operand), plus ``csr_sddmm_p`` (the weight gradient: Numba, Warp and reference).

Operands, in order: ``data`` ((1,) or (nnz,), float), ``indices`` ((nnz,),
int32 or int64), ``indptr`` ((n_rows + 1,), same dtype as ``indices``), then the
dense operand:

======  ===========  ======================  =====================
op      transpose    dense operand           result
======  ===========  ======================  =====================
mv      False        v (n_cols,)             A @ v, (n_rows,)
mv      True         v (n_rows,)             A.T @ v, (n_cols,)
mm      False        B (n_cols, k)           A @ B, (n_rows, k)
mm      True         B (n_rows, k)           A.T @ B, (n_cols, k)
======  ===========  ======================  =====================

The contracted dimension of ``B`` is first, the batch (columns) second; both
row-major.  Event operands are bool or float (nonzero = spike, value ignored);
float operands have the result dtype.

Static params: ``shape=(n_rows, n_cols)`` (tuple of ints), ``transpose`` (bool).
A generator is called as ``generator(outs=..., ins=..., shape=..., transpose=...)``
(only the keywords it accepts are passed) and returns
``kernel(data, indices, indptr, dense) -> [out]``.

``outs`` is one array of the result dtype: the weight dtype (float ops: the
promotion of the weight and operand dtypes, which the wrappers apply to both
before binding).  float16/bfloat16 weights must be accumulated in float32 by a
kernel (the Numba and reference backends convert to float32 around the call and
round the result back).  Kernels must not read or write out of bounds for a
malformed structure (clamp row spans to ``[0, nnz]``, skip columns outside
``[0, n_cols)``): under ``jit`` it cannot be validated.

Other backends live in ``csr_warp.py`` and ``csr_numba_cuda.py``; each exposes
``register(csrmv_p, csrmm_p, binary_csrmv_p, binary_csrmm_p)`` and is
registered at the bottom of this module when it imports.

Orientation: ``transpose=True`` scatters the operand's rows (``spikes @ W``
with ``W`` of shape ``(n_pre, n_post)``) and is event-driven: its cost follows
the synapses of active rows.  ``transpose=False`` gathers (``W @ x``).

Gradients: see the rules in each section; w.r.t. an event operand given as
float the gradient is straight-through (``d out / d s = A``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from ..rules import ad as ad_rules
from ..rules import batching as batching_rules
from ..xla_custom_kernel import REFERENCE, XLACustomKernel
from . import csr_numba

__all__ = [
    "csrmv",
    "csrmm",
    "binary_csrmv",
    "binary_csrmm",
    "csr_sddmm",
    "csrmv_p",
    "csrmm_p",
    "binary_csrmv_p",
    "binary_csrmm_p",
    "csr_sddmm_p",
    "validate_csr",
]

_LOW_PRECISION = (np.dtype(np.float16), np.dtype(jnp.bfloat16))


# ===========================================================================
# Validation (shapes and dtypes always; values only when concrete)
# ===========================================================================
def _is_concrete(x) -> bool:
    return not isinstance(x, _compat.Tracer)


def _index_dtype(*dtypes) -> np.dtype:
    wide = any(np.dtype(d).itemsize > 4 or np.dtype(d) == np.uint32 for d in dtypes)
    return np.dtype(np.int64) if wide and jax.config.jax_enable_x64 else np.dtype(np.int32)


def validate_csr(data, indices, indptr, shape, *, who: str = "CSR", check_values: bool = True):
    """Check and normalise a CSR structure.

    Args:
        data: weights, a scalar or shape ``(1,)`` (homogeneous) or ``(nnz,)``.
        indices: column index of each synapse, ``(nnz,)``.
        indptr: row pointers, ``(n_rows + 1,)``.
        shape: ``(n_rows, n_cols)``.
        who: the caller's name, for messages.
        check_values: also check ``indptr`` and ``indices`` values when they
            are concrete (not traced).

    Returns:
        ``(data, indices, indptr, shape)`` with ``data`` 1-d and both index
        arrays of one dtype (int32, or int64 when 64-bit mode is on).

    Raises:
        TypeError: non-float weights or non-integer indices.
        ValueError: any shape or value that does not describe a CSR matrix.
    """
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"{who}: shape must be a tuple (n_rows, n_cols) of ints, got {shape!r}") from None
    if len(shape) != 2 or min(shape) < 0:
        raise ValueError(f"{who}: shape must be (n_rows, n_cols) with non-negative sizes, got {shape}")
    n_rows, n_cols = shape
    data, indices, indptr = jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(
            f"{who}: weights (data) must be floating point (float16, bfloat16, float32, float64), "
            f"got {data.dtype}; convert them, e.g. data.astype(jnp.float32)"
        )
    for name, arr in (("indices", indices), ("indptr", indptr)):
        if not jnp.issubdtype(arr.dtype, jnp.integer):
            raise TypeError(f"{who}: {name} must be an integer array (int32 or int64), got {arr.dtype}")
        if arr.ndim != 1:
            raise ValueError(f"{who}: {name} must be 1-d, got shape {arr.shape}")
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
    dtype = _index_dtype(indices.dtype, indptr.dtype)
    indices = indices if indices.dtype == dtype else indices.astype(dtype)
    indptr = indptr if indptr.dtype == dtype else indptr.astype(dtype)
    if check_values and _is_concrete(indptr) and _is_concrete(indices):
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
    return data, indices, indptr, shape


def _operand(x, data, shape, transpose: bool, rank: int, event: bool, who: str):
    """Check the dense operand; return it and the result dtype."""
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
        raise TypeError(f"{who}: complex operands are not supported, got {x.dtype}")
    if event:
        if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.floating)):
            x = x != 0  # integer spike counts: nonzero = spike
        return x, data.dtype
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(data.dtype), data.dtype
    return x, jnp.promote_types(data.dtype, x.dtype)


def _out_shape(shape, transpose: bool, x_shape) -> tuple:
    n = shape[0] if not transpose else shape[1]
    return (n,) + tuple(x_shape[1:])


def _bind(op: XLACustomKernel, data, indices, indptr, x, *, shape, transpose, dtype, backend):
    outs = [jax.ShapeDtypeStruct(_out_shape(shape, transpose, x.shape), dtype)]
    return op(data, indices, indptr, x, outs=outs, shape=tuple(shape), transpose=bool(transpose),
              backend=_backend_for(op, backend))[0]


def _backend_for(op: XLACustomKernel, backend):
    """``backend`` if ``op`` has it, else ``None`` (its default): rules cross ops."""
    if backend is None or backend == REFERENCE or backend in op._all_backends():
        return backend
    return None


# ===========================================================================
# Shared maths: pure-JAX reference, weight cotangent, batching
# ===========================================================================
def _compute_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in _LOW_PRECISION else dtype


def row_ids(indptr, nnz: int):
    """Row of each stored entry: ``row_ids[k] = i`` for ``indptr[i] <= k < indptr[i + 1]``."""
    return jnp.searchsorted(indptr[1:], jnp.arange(nnz, dtype=indptr.dtype), side="right")


def _reference_matmul(data, indices, indptr, x, *, outs, shape, transpose, event):
    """Pure-JAX ``A @ x`` / ``A.T @ x`` (the fallback backend and the tests' oracle)."""
    out = outs[0]
    dtype = _compute_dtype(out.dtype)
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data.astype(dtype), (nnz,)) if data.shape[0] != nnz else data.astype(dtype)
    x = (x != 0).astype(dtype) if event else x.astype(dtype)
    rows = row_ids(indptr, nnz)
    n_in = shape[1] if not transpose else shape[0]
    if n_in == 0 or nnz == 0:
        return [jnp.zeros(out.shape, out.dtype)]
    valid = (indices >= 0) & (indices < shape[1])  # malformed structures: drop bad columns
    cols = jnp.where(valid, indices, 0)
    w = jnp.where(valid, w, 0)
    if x.ndim == 2:
        w = w[:, None]
    if not transpose:  # y_i = sum_{k in row i} w_k x_{j_k}
        y = jax.ops.segment_sum(w * x[cols], rows, num_segments=shape[0])
    else:  # y_j = sum_{k: j_k = j} w_k x_{i_k}
        contrib = w * x[jnp.clip(rows, 0, n_in - 1)]
        contrib = jnp.where((rows < shape[0]).reshape((-1,) + (1,) * (x.ndim - 1)), contrib, 0)
        y = jnp.zeros((shape[1],) + x.shape[1:], dtype).at[cols].add(contrib)
    return [y.astype(out.dtype)]


def _weight_cotangent(op, data, indices, indptr, x, ct, *, shape, transpose, backend):
    """Cotangent of the weights of ``y = op(data, ..., x)`` given ``ct = y_bar``.

    Per synapse k in row i with column j (x binarised for event ops):
        transpose=False:  y_i += w_k x_j   =>  w_bar_k = <y_bar_i, x_j>
        transpose=True:   y_j += w_k x_i   =>  w_bar_k = <x_i, y_bar_j>
    i.e. w_bar = sddmm(r, q) with (r, q) = (y_bar, x) or (x, y_bar); rows where
    r is zero (silent spikes in the scatter orientation) are skipped: event-driven.
    Homogeneous w (shape (1,)):  w_bar = sum_k (...) = <y_bar, op(1, ..., x)>,
    computed with the op itself, in the same (event-driven) orientation.
    """
    aval = ad_rules.aval_of(data)
    nnz = indices.shape[0]
    if aval.shape[0] != nnz or nnz == 1:
        y1 = op.bind(jnp.ones((1,), aval.dtype), indices, indptr, x, outs=[jax.ShapeDtypeStruct(ct.shape, ct.dtype)],
                     shape=shape, transpose=transpose, backend=_backend_for(op, backend))[0]
        acc = _compute_dtype(aval.dtype)
        return jnp.sum(ct.astype(acc) * y1.astype(acc)).astype(aval.dtype).reshape(1)
    r, q = (ct, x) if not transpose else (x, ct)
    return csr_sddmm(indices, indptr, r, q, shape=shape, dtype=aval.dtype, backend=backend)


def _matmul_batching(vector_op, matrix_op, rank: int):
    """Batching rule of a matmul op (``rank`` of its dense operand).

    * dense operand batched: one call of the matrix op (``vmap`` of mv is mm;
      ``vmap`` of mm folds the batch into the columns): native, no loop.
    * homogeneous weights batched: y_b = w_b * op(1, ..., x_b), one call.
    * per-synapse weights or the structure batched: a loop over the batch.
    """
    op_self = vector_op if rank == 1 else matrix_op

    def rule(args, axes, *, outs, shape, transpose, backend):
        data, indices, indptr, x = args
        d_ax, i_ax, p_ax, x_ax = axes
        dtype = outs[0].dtype
        homogeneous = d_ax is not None and data.shape[1 - d_ax] == 1
        if i_ax is not None or p_ax is not None or (d_ax is not None and not homogeneous):
            return batching_rules.sequential_batch(op_self.primitive, args, axes, outs=outs, shape=shape,
                                                   transpose=transpose, backend=backend)
        weights = data
        if d_ax is not None:  # homogeneous, batched: compute with w = 1, scale per example
            weights = jnp.ones((1,), data.dtype)
        if x_ax is None:
            y = _bind(op_self, weights, indices, indptr, x, shape=shape, transpose=transpose, dtype=dtype,
                      backend=backend)
            y_ax = None
        else:
            xb = jnp.moveaxis(x, x_ax, 1)  # (n, batch) or (n, batch, k)
            size = xb.shape[1]
            flat = xb.reshape(xb.shape[0], int(np.prod(xb.shape[1:])))
            y = _bind(matrix_op, weights, indices, indptr, flat, shape=shape, transpose=transpose,
                      dtype=dtype, backend=backend)
            y = y.reshape((y.shape[0], size) + xb.shape[2:])
            y_ax = 1
        if d_ax is None:
            return [y], [y_ax]
        w = jnp.moveaxis(data, d_ax, 0)[:, 0]  # (batch,)
        if y_ax is None:
            y = y[None]
        else:
            y = jnp.moveaxis(y, 1, 0)
        acc = _compute_dtype(dtype)
        scale = w.astype(acc).reshape((-1,) + (1,) * (y.ndim - 1))
        return [(scale * y.astype(acc)).astype(dtype)], [0]

    return rule


def _no_transpose_wrt_events(name):
    def fail():
        raise NotImplementedError(
            f"{name} is not linear in its event operand: its JVP w.r.t. float spikes is the "
            f"straight-through csrmv/csrmm, so no transpose w.r.t. the events is needed"
        )

    return fail


# ===========================================================================
# csrmv: y = A @ v  (transpose=False)  or  y = A.T @ v  (transpose=True), float v
# ===========================================================================
def csrmv(data, indices, indptr, v, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times float vector.

    Args:
        data: weights, shape ``(1,)``/scalar (homogeneous) or ``(nnz,)``; float.
        indices: column indices, ``(nnz,)``, int32 or int64.
        indptr: row pointers, ``(n_rows + 1,)``.
        v: ``(n_cols,)`` (transpose=False) or ``(n_rows,)`` (transpose=True).
        shape: ``(n_rows, n_cols)``.
        transpose: compute ``A.T @ v`` (the scatter orientation).
        backend: ``"numba"``, ``"reference"``, ... (default: the platform's).

    Returns:
        ``A @ v`` of shape ``(n_rows,)`` or ``A.T @ v`` of shape ``(n_cols,)``,
        in the promoted dtype of ``data`` and ``v``.
    """
    data, indices, indptr, shape = validate_csr(data, indices, indptr, shape, who="csrmv")
    v, dtype = _operand(v, data, shape, transpose, 1, False, "csrmv")
    return _bind(csrmv_p, data.astype(dtype), indices, indptr, v.astype(dtype), shape=shape, transpose=transpose,
                 dtype=dtype, backend=backend)


def _csrmv_jvp_data(t_data, data, indices, indptr, v, *, outs, **params):
    # y = A(w) v is linear in w:  dy = A(dw) v
    return csrmv_p.primitive.bind(t_data, indices, indptr, v, outs=outs, **params)


def _csrmv_jvp_v(t_v, data, indices, indptr, v, *, outs, **params):
    # y = A v (or A.T v) is linear in v:  dy = A dv (or A.T dv)
    return csrmv_p.primitive.bind(data, indices, indptr, t_v, outs=outs, **params)


def _csrmv_transpose(cts, data, indices, indptr, v, *, outs, shape, transpose, backend):
    (ct,) = cts
    if ad_rules.is_undefined(v):
        # y = A v  =>  v_bar = A.T y_bar ;  y = A.T v  =>  v_bar = A y_bar
        v_bar = _bind(csrmv_p, data, indices, indptr, ct, shape=shape, transpose=not transpose,
                      dtype=ad_rules.aval_of(v).dtype, backend=backend)
        return [None, None, None, v_bar]
    if ad_rules.is_undefined(data):
        # w_bar_k = y_bar[i_k] v[j_k]  (or v[i_k] y_bar[j_k]); see _weight_cotangent
        return [_weight_cotangent(csrmv_p, data, indices, indptr, v, ct, shape=shape, transpose=transpose,
                                  backend=backend), None, None, None]
    return [None] * 4


csrmv_p = XLACustomKernel("evjax_csrmv")
csrmv_p.def_reference(functools.partial(_reference_matmul, event=False))
csrmv_p.def_numba_kernel(csr_numba.csrmv_generator)
csrmv_p.def_jvp_rule2(_csrmv_jvp_data, None, None, _csrmv_jvp_v)
csrmv_p.def_transpose_rule(_csrmv_transpose)


# ===========================================================================
# csrmm: Y = A @ B  (transpose=False)  or  Y = A.T @ B  (transpose=True), float B
# ===========================================================================
def csrmm(data, indices, indptr, B, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times float matrix.

    Args:
        data, indices, indptr, shape, transpose, backend: as in :func:`csrmv`.
        B: ``(n_cols, k)`` (transpose=False) or ``(n_rows, k)`` (transpose=True).

    Returns:
        ``A @ B`` of shape ``(n_rows, k)`` or ``A.T @ B`` of shape ``(n_cols, k)``.
    """
    data, indices, indptr, shape = validate_csr(data, indices, indptr, shape, who="csrmm")
    B, dtype = _operand(B, data, shape, transpose, 2, False, "csrmm")
    return _bind(csrmm_p, data.astype(dtype), indices, indptr, B.astype(dtype), shape=shape, transpose=transpose,
                 dtype=dtype, backend=backend)


def _csrmm_jvp_data(t_data, data, indices, indptr, B, *, outs, **params):
    # Y = A(w) B is linear in w:  dY = A(dw) B
    return csrmm_p.primitive.bind(t_data, indices, indptr, B, outs=outs, **params)


def _csrmm_jvp_b(t_b, data, indices, indptr, B, *, outs, **params):
    # Y = A B (or A.T B) is linear in B:  dY = A dB (or A.T dB)
    return csrmm_p.primitive.bind(data, indices, indptr, t_b, outs=outs, **params)


def _csrmm_transpose(cts, data, indices, indptr, B, *, outs, shape, transpose, backend):
    (ct,) = cts
    if ad_rules.is_undefined(B):
        # Y = A B  =>  B_bar = A.T Y_bar ;  Y = A.T B  =>  B_bar = A Y_bar
        b_bar = _bind(csrmm_p, data, indices, indptr, ct, shape=shape, transpose=not transpose,
                      dtype=ad_rules.aval_of(B).dtype, backend=backend)
        return [None, None, None, b_bar]
    if ad_rules.is_undefined(data):
        # w_bar_k = <Y_bar[i_k, :], B[j_k, :]>  (or <B[i_k, :], Y_bar[j_k, :]>); see _weight_cotangent
        return [_weight_cotangent(csrmm_p, data, indices, indptr, B, ct, shape=shape, transpose=transpose,
                                  backend=backend), None, None, None]
    return [None] * 4


csrmm_p = XLACustomKernel("evjax_csrmm")
csrmm_p.def_reference(functools.partial(_reference_matmul, event=False))
csrmm_p.def_numba_kernel(csr_numba.csrmm_generator)
csrmm_p.def_jvp_rule2(_csrmm_jvp_data, None, None, _csrmm_jvp_b)
csrmm_p.def_transpose_rule(_csrmm_transpose)
csrmv_p.def_batching_rule(_matmul_batching(csrmv_p, csrmm_p, rank=1))
csrmm_p.def_batching_rule(_matmul_batching(csrmv_p, csrmm_p, rank=2))


# ===========================================================================
# binary_csrmv: y = A @ 1[s != 0]  (or A.T @ 1[s != 0]), event vector s
# ===========================================================================
def binary_csrmv(data, indices, indptr, spikes, *, shape, transpose: bool = False,
                 backend: str | None = None) -> jax.Array:
    """Sparse matrix times event vector: only active entries of ``spikes`` contribute.

    With ``transpose=True`` (``spikes @ W`` for ``W`` of shape ``(n_pre, n_post)``)
    the cost follows the synapses of the active rows.

    Args:
        data, indices, indptr, shape, transpose, backend: as in :func:`csrmv`.
        spikes: bool, or float with nonzero = spike (the value is ignored in
            the forward pass; its gradient is straight-through, ``A``).

    Returns:
        The result in the weight dtype.
    """
    data, indices, indptr, shape = validate_csr(data, indices, indptr, shape, who="binary_csrmv")
    spikes, dtype = _operand(spikes, data, shape, transpose, 1, True, "binary_csrmv")
    return _bind(binary_csrmv_p, data, indices, indptr, spikes, shape=shape, transpose=transpose, dtype=dtype,
                 backend=backend)


def _events_as_bool(s):
    return s if s.dtype == jnp.bool_ else s != 0


def _binary_jvp_data(op):
    def rule(t_data, data, indices, indptr, s, *, outs, **params):
        # y = A(w) 1[s != 0] is linear in w:  dy = A(dw) 1[s != 0]
        return op.primitive.bind(t_data, indices, indptr, s, outs=outs, **params)

    return rule


def _binary_jvp_spikes(float_op):
    def rule(t_s, data, indices, indptr, s, *, outs, shape, transpose, backend):
        # Straight-through estimator: the forward uses 1[s != 0], the derivative
        # is taken as if y = A s:  dy/ds = A (resp. A.T), so dy = A ds.
        return float_op.bind(data, indices, indptr, t_s.astype(outs[0].dtype), outs=outs, shape=shape,
                             transpose=transpose, backend=_backend_for(float_op, backend))

    return rule


def _binary_transpose(op, name):
    def rule(cts, data, indices, indptr, s, *, outs, shape, transpose, backend):
        (ct,) = cts
        if ad_rules.is_undefined(s):
            _no_transpose_wrt_events(name)()
        if ad_rules.is_undefined(data):
            # w_bar_k = y_bar[i_k] 1[s_{j_k} != 0]  (or 1[s_{i_k} != 0] y_bar[j_k]); see _weight_cotangent.
            # In the scatter orientation only the synapses of active rows are computed.
            events = _events_as_bool(s)
            return [_weight_cotangent(op, data, indices, indptr, events, ct, shape=shape, transpose=transpose,
                                      backend=backend), None, None, None]
        return [None] * 4

    return rule


binary_csrmv_p = XLACustomKernel("evjax_binary_csrmv")
binary_csrmv_p.def_reference(functools.partial(_reference_matmul, event=True))
binary_csrmv_p.def_numba_kernel(csr_numba.binary_csrmv_generator)
binary_csrmv_p.def_jvp_rule2(_binary_jvp_data(binary_csrmv_p), None, None, _binary_jvp_spikes(csrmv_p))
binary_csrmv_p.def_transpose_rule(_binary_transpose(binary_csrmv_p, "binary_csrmv"))


# ===========================================================================
# binary_csrmm: Y = A @ 1[S != 0]  (or A.T @ 1[S != 0]), event matrix S
# ===========================================================================
def binary_csrmm(data, indices, indptr, spikes, *, shape, transpose: bool = False,
                 backend: str | None = None) -> jax.Array:
    """Sparse matrix times event matrix (a batch of spike vectors as columns).

    Args:
        data, indices, indptr, shape, transpose, backend: as in :func:`csrmv`.
        spikes: ``(n_cols, k)`` (transpose=False) or ``(n_rows, k)``
            (transpose=True); bool, or float with nonzero = spike.

    Returns:
        ``(n_rows, k)`` or ``(n_cols, k)`` in the weight dtype.
    """
    data, indices, indptr, shape = validate_csr(data, indices, indptr, shape, who="binary_csrmm")
    spikes, dtype = _operand(spikes, data, shape, transpose, 2, True, "binary_csrmm")
    return _bind(binary_csrmm_p, data, indices, indptr, spikes, shape=shape, transpose=transpose, dtype=dtype,
                 backend=backend)


binary_csrmm_p = XLACustomKernel("evjax_binary_csrmm")
binary_csrmm_p.def_reference(functools.partial(_reference_matmul, event=True))
binary_csrmm_p.def_numba_kernel(csr_numba.binary_csrmm_generator)
binary_csrmm_p.def_jvp_rule2(_binary_jvp_data(binary_csrmm_p), None, None, _binary_jvp_spikes(csrmm_p))
binary_csrmm_p.def_transpose_rule(_binary_transpose(binary_csrmm_p, "binary_csrmm"))
binary_csrmv_p.def_batching_rule(_matmul_batching(binary_csrmv_p, binary_csrmm_p, rank=1))
binary_csrmm_p.def_batching_rule(_matmul_batching(binary_csrmv_p, binary_csrmm_p, rank=2))


# ===========================================================================
# csr_sddmm: g[k] = <r[i_k], q[j_k]>  (the weight gradient; r, q vectors or matrices)
# ===========================================================================
def csr_sddmm(indices, indptr, r, q, *, shape, dtype=None, backend: str | None = None) -> jax.Array:
    """Sampled dense-dense product on the CSR pattern: ``g[k] = <r[row k], q[indices[k]]>``.

    The gradient of the CSR matmuls w.r.t. per-synapse weights.  Rows where
    ``r`` is zero are skipped (their entries are written as 0), which makes the
    gradient of the scatter orientation event-driven.

    Args:
        indices, indptr, shape: the CSR structure.
        r: ``(n_rows,)`` or ``(n_rows, k)``; float or bool.
        q: ``(n_cols,)`` or ``(n_cols, k)``; float or bool.
        dtype: the result dtype (default: promotion of the float operands).
        backend: as in :func:`csrmv`.

    Returns:
        ``(nnz,)`` array.
    """
    r, q = jnp.asarray(r), jnp.asarray(q)
    if r.ndim not in (1, 2) or r.ndim != q.ndim or r.shape[0] != shape[0] or q.shape[0] != shape[1] \
            or r.shape[1:] != q.shape[1:]:
        raise ValueError(
            f"csr_sddmm: r {r.shape} and q {q.shape} must be (n_rows[, k]) and (n_cols[, k]) for shape {shape}"
        )
    if dtype is None:
        floats = [a.dtype for a in (r, q) if a.dtype != jnp.bool_]
        dtype = jnp.result_type(*floats) if floats else jnp.float32
    outs = [jax.ShapeDtypeStruct((indices.shape[0],), dtype)]
    return csr_sddmm_p(indices, indptr, r, q, outs=outs, shape=tuple(shape),
                       backend=_backend_for(csr_sddmm_p, backend))[0]


def _sddmm_dense(indices, indptr, r, q, *, dtype, shape):
    acc = _compute_dtype(dtype)
    nnz = indices.shape[0]
    if nnz == 0 or min(shape) == 0:
        return jnp.zeros((nnz,), dtype)
    rows = row_ids(indptr, nnz)
    valid = (rows < shape[0]) & (indices >= 0) & (indices < shape[1])
    rv = r.astype(acc)[jnp.clip(rows, 0, max(shape[0] - 1, 0))]
    qv = q.astype(acc)[jnp.clip(indices, 0, max(shape[1] - 1, 0))]
    g = rv * qv if r.ndim == 1 else jnp.sum(rv * qv, axis=-1)
    return jnp.where(valid, g, 0).astype(dtype)


def _sddmm_reference(indices, indptr, r, q, *, outs, shape):
    return [_sddmm_dense(indices, indptr, r, q, dtype=outs[0].dtype, shape=shape)]


def _sddmm_jvp_r(t_r, indices, indptr, r, q, *, outs, **params):
    # g = <r_i, q_j> is linear in r:  dg = sddmm(dr, q)
    return csr_sddmm_p.primitive.bind(indices, indptr, t_r, q, outs=outs, **params)


def _sddmm_jvp_q(t_q, indices, indptr, r, q, *, outs, **params):
    # g = <r_i, q_j> is linear in q:  dg = sddmm(r, dq)
    return csr_sddmm_p.primitive.bind(indices, indptr, r, t_q, outs=outs, **params)


def _sddmm_transpose(cts, indices, indptr, r, q, *, outs, shape, backend):
    (g_bar,) = cts
    mat = csrmv_p if ad_rules.aval_of(r).ndim == 1 else csrmm_p
    if ad_rules.is_undefined(r):
        # r_bar_i = sum_{k in row i} g_bar_k q_{j_k} = (A(g_bar) q)_i
        dt = ad_rules.aval_of(r).dtype
        return [None, None, _bind(mat, g_bar.astype(dt), indices, indptr, q.astype(dt), shape=shape,
                                  transpose=False, dtype=dt, backend=backend), None]
    if ad_rules.is_undefined(q):
        # q_bar_j = sum_{k: j_k = j} g_bar_k r_{i_k} = (A(g_bar).T r)_j
        dt = ad_rules.aval_of(q).dtype
        return [None, None, None, _bind(mat, g_bar.astype(dt), indices, indptr, r.astype(dt), shape=shape,
                                        transpose=True, dtype=dt, backend=backend)]
    return [None] * 4


def _sddmm_batching(args, axes, *, outs, shape, backend):
    # vectorised pure-JAX formula g[b, k] = <r_b[i_k], q_b[j_k]> (used by jacfwd / hessian)
    fn = functools.partial(_sddmm_dense, dtype=outs[0].dtype, shape=shape)
    return [jax.vmap(fn, in_axes=tuple(axes))(*args)], [0]


csr_sddmm_p = XLACustomKernel("evjax_csr_sddmm")
csr_sddmm_p.def_reference(_sddmm_reference)
csr_sddmm_p.def_numba_kernel(csr_numba.sddmm_generator)
csr_sddmm_p.def_jvp_rule2(None, None, _sddmm_jvp_r, _sddmm_jvp_q)
csr_sddmm_p.def_transpose_rule(_sddmm_transpose)
csr_sddmm_p.def_batching_rule(_sddmm_batching)


# ===========================================================================
# Other backends (Warp, Numba CUDA), registered when their modules import
# ===========================================================================
def _register_optional_backends() -> None:
    ops = (csrmv_p, csrmm_p, binary_csrmv_p, binary_csrmm_p)
    try:
        from . import csr_warp
    except ImportError:
        csr_warp = None
    if csr_warp is not None:
        csr_warp.register(*ops, csr_sddmm_p=csr_sddmm_p)
    try:
        from . import csr_numba_cuda
    except ImportError:
        csr_numba_cuda = None
    if csr_numba_cuda is not None:
        csr_numba_cuda.register(*ops)
    for op in ops + (csr_sddmm_p,):  # GPU default: Warp, else Numba CUDA, else the reference
        gpu = op._kernels.get("gpu", {})
        if "gpu" not in op.defaults or op.defaults["gpu"] not in gpu:
            for name in ("warp", "numba_cuda"):
                if name in gpu:
                    op.set_default("gpu", name)
                    break


_register_optional_backends()
