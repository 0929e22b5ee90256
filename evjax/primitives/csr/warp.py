"""Warp backend of the CSR ops (float and event; mv and mm; both orientations), CPU and GPU.

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops run with ``backend="warp"``; importing
it registers the generators below as the ``"warp"`` backend (cpu and gpu) of
``csrmv_p``, ``csrmm_p``, ``binary_csrmv_p``, ``binary_csrmm_p`` and
``csr_sddmm_p``.  Each generator follows the CSR contract of
:mod:`evjax.primitives.csr.ops`: ``generator(outs, ins, shape, transpose)``
returns ``run(data, indices, indptr, x) -> [out]`` (``generator(outs, ins, shape,
weighted)`` returns ``run(indices, indptr, r, q) -> [g]`` for the SDDMM).

Kernels, with ``W`` the ``(n_rows, n_cols)`` CSR matrix:

* ``transpose=False`` (gather, ``W @ v``): one thread per output row (mv) or
  per output element (mm) reads the row's synapses; pure outputs.
* ``transpose=True`` (scatter, ``W.T @ v``): one thread per source row (mv) or
  per (row, column) (mm); silent events are skipped (event ops) and each
  synapse adds with ``wp.atomic_add`` into an in-out buffer of zeros.
* the weight gradient ``csr_sddmm_p`` (``g[k] = <r[row k], q[indices[k]]>``):
  one thread per row.  A bool (event) operand selects (``wp.where``, never a
  multiply) and, with one, a row whose ``r`` is zero (a silent neuron) is
  skipped, so only the synapses of active rows are computed and the rest of
  ``g`` stays the zeros XLA wrote into the in-out buffer; two float operands
  give the IEEE product on every row (:data:`SDDMM_MODES`).

NaN and inf follow ``docs/semantics.md``: an event selects its weights, a value
multiplies them (IEEE) and a weighted event (``weighted=True``) selects, then
multiplies.  The three are flavours of the same four matmul kernels
(:data:`FLAVOURS`): a compile-time parameter of each kernel factory, which
picks the operand's type and the rules the kernel calls (:func:`_rules`);
the SDDMM's five modes are its rules likewise (:func:`_sddmm_rules`).

Each kernel is a small factory of the Warp types of one dtype signature
(:func:`_types`), selected by :data:`KERNELS` / :data:`SDDMM_KERNELS`; the
helpers ``span`` (a row's synapses) and ``weight`` are written once
(:func:`_helpers`).  Homogeneous (``data.shape == (1,)``) and per-synapse
weights share a kernel (a runtime branch).  float16 and bfloat16 (which Warp
lacks) are computed in float32 (:func:`evjax.dtypes.compute_dtype`) and the
result is rounded back to the output dtype; events are passed as bool
(:func:`evjax.events.as_bool_events`); a malformed structure (possible under
``jit``, where it cannot be validated) never reads or writes out of bounds:
row spans are clamped to ``[0, nnz]`` and out-of-range columns ignored.  The
eight forward kernels of values and events of one dtype signature live in one
Warp module, so a signature compiles once (then loads from Warp's kernel cache
in milliseconds); the four of weighted events live in another, and the two
SDDMM kernels of a mode in a third, which code that does not use them never compiles.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from ...backends import warp as bridge
from ...dtypes import as_dtype, compute_dtype
from ..._event_values import as_bool_events
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops

__all__ = [
    "csrmv_warp", "csrmm_warp", "binary_csrmv_warp", "binary_csrmm_warp", "binary_csrmv_active_warp",
    "csr_sddmm_warp", "listed_kernel",
    "csr_kernels", "weighted_kernels", "sddmm_kernels", "KERNELS", "SDDMM_KERNELS", "FLAVOURS",
]

wp = bridge.import_warp()
_lock = threading.Lock()


# ---------------------------------------------------------------------------
# Types of one dtype signature, and the helpers every kernel shares
# ---------------------------------------------------------------------------
def _helpers(t):
    """``span`` and ``weight``, as Warp functions of ``t``'s module and types."""

    @wp.func(module=t.module)
    def span(indptr: t.P1, i: int, nnz: int):
        """Row ``i``'s synapses, clamped to [0, nnz] (a malformed structure never reads out of bounds)."""
        return wp.max(int(indptr[i]), 0), wp.min(int(indptr[i + 1]), nnz)

    @wp.func(module=t.module)
    def weight(data: t.F1, j: int):
        """Synapse ``j``'s weight: ``data[0]`` when homogeneous."""
        if data.shape[0] == 1:
            return data[0]
        return data[j]

    return span, weight


def _types(prefix: str, compute_dt: str, index_dt: str, indptr_dt: str) -> SimpleNamespace:
    """The Warp types of one dtype signature, its Warp module (``prefix``) and the shared helpers.

    Returns:
        A namespace: scalar types ``F`` (compute), ``I`` (indices), ``P``
        (indptr); array annotations ``F1``, ``F2``, ``B1``, ``B2`` (events),
        ``I1``, ``P1``; ``module``, the kernel options ``opts``, and the
        functions ``span`` and ``weight``.
    """
    F, I, P = (jaxtype_to_warptype(dt) for dt in (compute_dt, index_dt, indptr_dt))  # noqa: E741
    module = wp.get_module(f"{prefix}_{compute_dt}_{index_dt}_{indptr_dt}")
    t = SimpleNamespace(
        F=F, I=I, P=P, module=module, opts=dict(enable_backward=False, module=module),
        F1=wp.array(dtype=F, ndim=1), F2=wp.array(dtype=F, ndim=2),
        B1=wp.array(dtype=wp.bool, ndim=1), B2=wp.array(dtype=wp.bool, ndim=2),
        I1=wp.array(dtype=I, ndim=1), P1=wp.array(dtype=P, ndim=1),
    )
    t.span, t.weight = _helpers(t)
    return t


# ---------------------------------------------------------------------------
# The flavours of the dense operand, and their rules
# ---------------------------------------------------------------------------
# "values" (float: multiplies), "events" (bool: selects) and "weighted" (float
# weighted events: selects, then multiplies).  Every matmul kernel below is one
# factory of the types ``t`` and a flavour's rules (:func:`_rules`): the
# operand's array types, the scatters' two rules, and the flags ``EVENTS`` /
# ``WEIGHTED``, closure constants of the gathers: Warp compiles only the branch
# of an ``if`` on a constant that is taken.
FLAVOURS = ("values", "events", "weighted")
_PREFIX = {"values": "", "events": "ev_", "weighted": "weighted_"}  # of the kernels' and rules' names


def _rules(t, flavour: str) -> SimpleNamespace:
    """The dense operand's array types (``X1``, ``X2``), the flags ``events`` and ``weighted``, the
    kernels' name prefix and the scatters' rules of a flavour, as Warp functions:

    * ``visits(v)``: whether a scatter visits a row whose operand entry is ``v``
      (events: an active one; weighted events: a nonzero one, whatever the
      weights of a zero row hold; values: every row, ``nan * 0`` is nan);
    * ``term(w, v)``: what a visited row adds per synapse of weight ``w``
      (events: ``w``, selected, never multiplied; others: ``w * v``).
    """
    EVENTS, WEIGHTED = flavour == "events", flavour == "weighted"
    X, p = (wp.bool if EVENTS else t.F), _PREFIX[flavour]

    @wp.func(name=p + "visits", module=t.module)
    def visits(v: X):
        if EVENTS:
            return v
        elif WEIGHTED:
            return v != t.F(0)
        else:
            return True

    @wp.func(name=p + "term", module=t.module)
    def term(w: t.F, v: X):
        if EVENTS:
            return w
        else:
            return w * v

    return SimpleNamespace(X1=wp.array(dtype=X, ndim=1), X2=wp.array(dtype=X, ndim=2), events=EVENTS,
                           weighted=WEIGHTED, visits=visits, term=term, prefix=p)


# ---------------------------------------------------------------------------
# gather: y = W @ x (one thread per output row / element; pure output)
# ---------------------------------------------------------------------------
def _mv_gather(t, f):
    span, weight, EVENTS, WEIGHTED = t.span, t.weight, f.events, f.weighted

    @wp.kernel(name=f.prefix + "mv_gather", **t.opts)
    def mv_gather(data: t.F1, indices: t.I1, indptr: t.P1, x: f.X1, out: t.F1):
        i = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = t.F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                if EVENTS:
                    if x[col]:  # selected, not multiplied: a silent event hides a nan weight
                        acc += weight(data, j)
                elif WEIGHTED:  # selected, then multiplied
                    v = x[col]
                    acc += wp.where(v != t.F(0), weight(data, j) * v, t.F(0))
                else:
                    acc += weight(data, j) * x[col]
        out[i] = acc

    return mv_gather


def _mm_gather(t, f):
    span, weight, EVENTS, WEIGHTED = t.span, t.weight, f.events, f.weighted

    @wp.kernel(name=f.prefix + "mm_gather", **t.opts)
    def mm_gather(data: t.F1, indices: t.I1, indptr: t.P1, x: f.X2, out: t.F2):
        i, c = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = t.F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                if EVENTS:
                    if x[col, c]:
                        acc += weight(data, j)
                elif WEIGHTED:
                    v = x[col, c]
                    acc += wp.where(v != t.F(0), weight(data, j) * v, t.F(0))
                else:
                    acc += weight(data, j) * x[col, c]
        out[i, c] = acc

    return mm_gather


# ---------------------------------------------------------------------------
# scatter: y = W.T @ x (one thread per source row / (row, column); atomics into zeros)
# ---------------------------------------------------------------------------
def _mv_scatter(t, f):
    span, weight, visits, term = t.span, t.weight, f.visits, f.term

    @wp.kernel(name=f.prefix + "mv_scatter", **t.opts)
    def mv_scatter(data: t.F1, indices: t.I1, indptr: t.P1, x: f.X1, out: t.F1):
        i = wp.tid()
        xi = x[i]
        if visits(xi):  # silent rows cost nothing
            a, b = span(indptr, i, indices.shape[0])
            for j in range(a, b):
                col = int(indices[j])
                if col >= 0 and col < out.shape[0]:
                    wp.atomic_add(out, col, term(weight(data, j), xi))

    return mv_scatter


def _mm_scatter(t, f):
    span, weight, visits, term = t.span, t.weight, f.visits, f.term

    @wp.kernel(name=f.prefix + "mm_scatter", **t.opts)
    def mm_scatter(data: t.F1, indices: t.I1, indptr: t.P1, x: f.X2, out: t.F2):
        i, c = wp.tid()
        xi = x[i, c]
        if visits(xi):
            a, b = span(indptr, i, indices.shape[0])
            for j in range(a, b):
                col = int(indices[j])
                if col >= 0 and col < out.shape[0]:
                    wp.atomic_add(out, col, c, term(weight(data, j), xi))

    return mm_scatter


# listed scatter: y = W.T @ e, e given by the list of its active rows (one thread per list slot)
def _mv_scatter_listed(t):
    span, weight = t.span, t.weight

    @wp.kernel(name="mv_scatter_listed", **t.opts)
    def mv_scatter_listed(data: t.F1, indices: t.I1, indptr: t.P1, ids: t.L1, count: t.L1, out: t.F1):
        a = wp.tid()
        if a < int(count[0]):
            i = int(ids[a])
            if i >= 0 and i < indptr.shape[0] - 1:  # a row outside the matrix adds nothing
                lo, hi = span(indptr, i, indices.shape[0])
                for j in range(lo, hi):
                    col = int(indices[j])
                    if col >= 0 and col < out.shape[0]:
                        wp.atomic_add(out, col, weight(data, j))  # selected, not multiplied

    return mv_scatter_listed


# ---------------------------------------------------------------------------
# SDDMM: g[k] = <r[row k], q[indices[k]]> (one thread per row; silent rows skipped)
# ---------------------------------------------------------------------------
def _sddmm_rules(t, mode: str):
    """``visits(r_i)`` and ``term(r, q)`` of an SDDMM ``mode`` (see :data:`SDDMM_MODES`).

    An event operand selects (``term`` is 0 for an inactive event, whatever the
    other operand holds) and a row whose ``r`` is zero is skipped; two values
    give the IEEE product on every row (``0 * inf`` is nan).  A weighted
    operand selects, then multiplies: ``r_weighted`` skips the rows of zero
    ``r``, ``q_weighted`` visits every row (``0 * inf`` is nan there).
    """
    if mode == "r_weighted":  # both float
        @wp.func(module=t.module)
        def visits(r: t.F):
            return r != t.F(0)

        @wp.func(module=t.module)
        def term(r: t.F, q: t.F):
            return wp.where(r != t.F(0), r * q, t.F(0))
    elif mode == "q_weighted":
        @wp.func(module=t.module)
        def visits(r: t.F):
            return True

        @wp.func(module=t.module)
        def term(r: t.F, q: t.F):
            return wp.where(q != t.F(0), r * q, t.F(0))
    elif mode == "r_events":  # r bool; q float (0/1 when it was bool too)
        @wp.func(module=t.module)
        def visits(r: wp.bool):
            return r

        @wp.func(module=t.module)
        def term(r: wp.bool, q: t.F):
            return wp.where(r, q, t.F(0))
    elif mode == "q_events":  # r float, q bool
        @wp.func(module=t.module)
        def visits(r: t.F):
            return r != t.F(0)

        @wp.func(module=t.module)
        def term(r: t.F, q: wp.bool):
            return wp.where(q, r, t.F(0))
    else:  # two values
        @wp.func(module=t.module)
        def visits(r: t.F):
            return True

        @wp.func(module=t.module)
        def term(r: t.F, q: t.F):
            return r * q
    return visits, term


def _sddmm_vec(t):
    span, visits, term = t.span, t.visits, t.term

    @wp.kernel(**t.opts)
    def sddmm_vec(indices: t.I1, indptr: t.P1, r: t.R1, q: t.Q1, g: t.F1):
        i = wp.tid()
        ri = r[i]
        if visits(ri):  # skipped rows cost nothing: their entries keep the zeros
            a, b = span(indptr, i, indices.shape[0])
            for k in range(a, b):
                col = int(indices[k])
                if col >= 0 and col < q.shape[0]:
                    g[k] = term(ri, q[col])

    return sddmm_vec


def _sddmm_mat(t):
    span, visits, term = t.span, t.visits, t.term

    @wp.kernel(**t.opts)
    def sddmm_mat(indices: t.I1, indptr: t.P1, r: t.R2, q: t.Q2, g: t.F1):
        i = wp.tid()
        width = r.shape[1]
        active = int(0)
        for c in range(width):
            if visits(r[i, c]):
                active += 1
        if active > 0:
            a, b = span(indptr, i, indices.shape[0])
            for k in range(a, b):
                col = int(indices[k])
                if col >= 0 and col < q.shape[0]:
                    acc = t.F(0)
                    for c in range(width):
                        acc += term(r[i, c], q[col, c])
                    g[k] = acc

    return sddmm_mat


# (kind, transpose) -> kernel factory of (t, the flavour's rules); kind "mv" (vector) or "mm" (matrix)
KERNELS = {
    ("mv", False): _mv_gather,
    ("mv", True): _mv_scatter,
    ("mm", False): _mm_gather,
    ("mm", True): _mm_scatter,
}

# rank of r and q -> SDDMM kernel factory; each is built once per mode, in the mode's module
SDDMM_KERNELS = {1: _sddmm_vec, 2: _sddmm_mat}
SDDMM_MODES = ("values", "r_events", "q_events", "r_weighted", "q_weighted")


@functools.lru_cache(maxsize=None)
def csr_kernels(compute_dt: str, index_dt: str, indptr_dt: str) -> dict:
    """The eight forward Warp kernels of values and events of one dtype signature, built together in one
    Warp module.

    Args:
        compute_dt: the weights' and float operands' dtype (``"float32"`` or
            ``"float64"``); events arrive as bool.
        index_dt: the dtype of ``indices``.
        indptr_dt: the dtype of ``indptr``.

    Returns:
        ``{(kind, event, transpose): kernel}``, ``(kind, transpose)`` as in :data:`KERNELS`.
    """
    t = _types("evjax_csr", compute_dt, index_dt, indptr_dt)
    return {(kind, flavour == "events", transpose): factory(t, f)
            for flavour, f in ((flavour, _rules(t, flavour)) for flavour in ("values", "events"))
            for (kind, transpose), factory in KERNELS.items()}


@functools.lru_cache(maxsize=None)
def weighted_kernels(compute_dt: str, index_dt: str, indptr_dt: str) -> dict:
    """The four forward Warp kernels of weighted events of one dtype signature (the same factories,
    flavour ``"weighted"``), in their own Warp module: code that uses spikes only never compiles them.

    Returns:
        ``{(kind, transpose): kernel}``, keyed as :data:`KERNELS`.
    """
    t = _types("evjax_csr_weighted", compute_dt, index_dt, indptr_dt)
    f = _rules(t, "weighted")
    return {key: factory(t, f) for key, factory in KERNELS.items()}


@functools.lru_cache(maxsize=None)
def sddmm_kernels(compute_dt: str, index_dt: str, indptr_dt: str, mode: str = "values") -> dict:
    """The two weight-gradient (SDDMM) Warp kernels of one dtype signature and mode, in their own Warp module.

    Args:
        compute_dt, index_dt, indptr_dt: as in :func:`csr_kernels`.
        mode: ``"values"`` (float r and q), ``"r_events"`` (bool r),
            ``"q_events"`` (bool q, float r), ``"r_weighted"`` or ``"q_weighted"``;
            see :func:`~evjax.primitives.csr.ops.sddmm_mode`.

    Returns:
        ``{rank: kernel}``: ``r`` and ``q`` vectors (1) or ``(rows, k)`` matrices (2).
    """
    if mode not in SDDMM_MODES:
        raise ValueError(f"sddmm_kernels: mode must be one of {SDDMM_MODES}, got {mode!r}")
    prefix = "evjax_csr_sddmm" if mode == "values" else f"evjax_csr_sddmm_{mode}"
    t = _types(prefix, compute_dt, index_dt, indptr_dt)
    r_type, q_type = {"r_events": (wp.bool, t.F), "q_events": (t.F, wp.bool)}.get(mode, (t.F, t.F))
    t.R1, t.R2 = wp.array(dtype=r_type, ndim=1), wp.array(dtype=r_type, ndim=2)
    t.Q1, t.Q2 = wp.array(dtype=q_type, ndim=1), wp.array(dtype=q_type, ndim=2)
    t.visits, t.term = _sddmm_rules(t, mode)
    return {rank: factory(t) for rank, factory in SDDMM_KERNELS.items()}


@functools.lru_cache(maxsize=None)
def listed_kernel(compute_dt: str, index_dt: str, indptr_dt: str, list_dt: str):
    """The listed scatter of ``binary_csrmv_active_p`` for one dtype signature (``list_dt``: the
    list's integer dtype), in its own Warp module."""
    t = _types(f"evjax_csr_listed_{list_dt}", compute_dt, index_dt, indptr_dt)
    t.L1 = wp.array(dtype=jaxtype_to_warptype(list_dt), ndim=1)
    return _mv_scatter_listed(t)


def _signature(dtype, index_in, indptr_in) -> tuple:
    return str(np.dtype(dtype)), str(np.dtype(index_in.dtype)), str(np.dtype(indptr_in.dtype))


# ---------------------------------------------------------------------------
# Generators (the ops' "warp" backend)
# ---------------------------------------------------------------------------
def _matmul_generator(outs, ins, shape, transpose, kind: str, event: bool, weighted: bool = False):
    out = outs[0]
    _, index_in, indptr_in, dense_in = ins
    dtype = compute_dtype(out.dtype)
    with _lock:
        if weighted:
            kernel = weighted_kernels(*_signature(dtype, index_in, indptr_in))[(kind, bool(transpose))]
        else:
            kernel = csr_kernels(*_signature(dtype, index_in, indptr_in))[(kind, event, bool(transpose))]
    out_shape = tuple(int(d) for d in out.shape)
    launch = (int(shape[0]),) if kind == "mv" else (int(shape[0]), int(dense_in.shape[1]))
    if transpose:  # scatter: atomics into an in-out buffer of zeros
        call = warp_kernel(kernel, [], launch_dims=launch, in_out_argnames=("out",))
    else:  # gather: every output element written once
        call = warp_kernel(kernel, jax.ShapeDtypeStruct(out_shape, dtype), launch_dims=launch)

    def run(data, indices, indptr, x):
        data = as_dtype(data, dtype)
        x = as_bool_events(x) if event and not weighted else as_dtype(x, dtype)
        if transpose:
            (y,) = call(data, indices, indptr, x, jnp.zeros(out_shape, dtype))
        else:
            y = call(data, indices, indptr, x)
        return [as_dtype(y, out.dtype)]

    return run


def csrmv_warp(outs, ins, shape, transpose):
    """Warp kernel generator for ``csrmv_p`` (float vector).

    Args:
        outs: the one output's ``ShapeDtypeStruct``.
        ins: the operands' ``ShapeDtypeStruct``s (data, indices, indptr, x).
        shape: ``(n_rows, n_cols)``.
        transpose: scatter (``W.T @ x``) instead of gather (``W @ x``).

    Returns:
        ``run(data, indices, indptr, x) -> [out]``.
    """
    return _matmul_generator(outs, ins, shape, transpose, "mv", event=False)


def csrmm_warp(outs, ins, shape, transpose):
    """Warp kernel generator for ``csrmm_p`` (float matrix); arguments as in :func:`csrmv_warp`."""
    return _matmul_generator(outs, ins, shape, transpose, "mm", event=False)


def binary_csrmv_warp(outs, ins, shape, transpose, weighted=False):
    """Warp kernel generator for ``binary_csrmv_p`` (event vector; ``weighted``: values that
    select); arguments as in :func:`csrmv_warp`."""
    return _matmul_generator(outs, ins, shape, transpose, "mv", event=True, weighted=weighted)


def binary_csrmm_warp(outs, ins, shape, transpose, weighted=False):
    """Warp kernel generator for ``binary_csrmm_p`` (event matrix); as :func:`binary_csrmv_warp`."""
    return _matmul_generator(outs, ins, shape, transpose, "mm", event=True, weighted=weighted)


def binary_csrmv_active_warp(outs, ins, shape):
    """Warp kernel generator for ``binary_csrmv_active_p``: one thread per slot of the list of active
    rows, atomics into zeros (the spikes operand is not read).

    Returns:
        ``run(data, indices, indptr, active_ids, n_active, v) -> [out]``.
    """
    out = outs[0]
    _, index_in, indptr_in, ids_in, _, _ = ins
    dtype = compute_dtype(out.dtype)
    with _lock:
        kernel = listed_kernel(*_signature(dtype, index_in, indptr_in), str(np.dtype(ids_in.dtype)))
    out_shape = tuple(int(d) for d in out.shape)
    call = warp_kernel(kernel, [], launch_dims=(int(ids_in.shape[0]),), in_out_argnames=("out",))

    def run(data, indices, indptr, active_ids, n_active, v):
        (y,) = call(as_dtype(data, dtype), indices, indptr, active_ids, n_active, jnp.zeros(out_shape, dtype))
        return [as_dtype(y, out.dtype)]

    return run


def csr_sddmm_warp(outs, ins, shape, weighted):
    """Warp kernel generator for ``csr_sddmm_p``: ``g[k] = <r[row k], q[indices[k]]>``.

    Args:
        outs: the one output's ``ShapeDtypeStruct``, ``(nnz,)``.
        ins: the operands' ``ShapeDtypeStruct``s (indices, indptr, r, q).
        shape: ``(n_rows, n_cols)`` of the CSR matrix (unused: ``r`` gives the rows).
        weighted: ``"r"`` or ``"q"``: that operand holds weighted events.

    Returns:
        ``run(indices, indptr, r, q) -> [g]``; a bool operand selects, and where
        one is bool the rows where ``r`` is zero are skipped (their entries stay 0).
    """
    out = outs[0]
    index_in, indptr_in, r_in, q_in = ins
    dtype = compute_dtype(out.dtype)
    mode = ops.sddmm_mode(r_in.dtype, q_in.dtype, weighted)
    with _lock:
        kernel = sddmm_kernels(*_signature(dtype, index_in, indptr_in), mode)[len(r_in.shape)]
    n_rows, nnz = int(r_in.shape[0]), int(out.shape[0])
    call = warp_kernel(kernel, [], launch_dims=(n_rows,), in_out_argnames=("g",))

    def run(indices, indptr, r, q):
        # bool stays bool where the mode selects by it; a bool q beside a bool r becomes 0/1
        r = r if mode == "r_events" else as_dtype(r, dtype)
        q = q if mode == "q_events" else as_dtype(q, dtype)
        (g,) = call(indices, indptr, r, q, jnp.zeros((nnz,), dtype))
        return [as_dtype(g, out.dtype)]

    return run


for _op, _generator in ((ops.csrmv_p, csrmv_warp), (ops.csrmm_p, csrmm_warp),
                        (ops.binary_csrmv_p, binary_csrmv_warp), (ops.binary_csrmm_p, binary_csrmm_warp),
                        (ops.binary_csrmv_active_p, binary_csrmv_active_warp),
                        (ops.csr_sddmm_p, csr_sddmm_warp)):
    _op.def_warp_kernel(_generator)
