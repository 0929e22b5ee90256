"""Warp kernels for the CSR operator family (float and event; mv and mm; both orientations).

Each generator follows the CSR contract of :mod:`evjax.primitives.csr`: it is
called as ``generator(outs=..., ins=..., shape=..., transpose=...)`` and returns
``kernel(data, indices, indptr, dense) -> [out]``; :func:`register` adds them as
the ``"warp"`` backend (cpu and gpu) of ``csrmv_p``, ``csrmm_p``,
``binary_csrmv_p`` and ``binary_csrmm_p``.

Kernels, with ``W`` the ``(n_rows, n_cols)`` CSR matrix:

* ``transpose=False`` (gather, ``W @ v``): one thread per output row (mv) or
  per output element (mm) reads the row's synapses; pure outputs.
* ``transpose=True`` (scatter, ``W.T @ v``): one thread per source row (mv) or
  per (row, column) (mm); silent events are skipped (event ops) and each
  synapse adds with ``wp.atomic_add`` into an in-out buffer of zeros.
* the weight gradient ``csr_sddmm_p`` (``g[k] = <r[row k], q[indices[k]]>``):
  one thread per row; a row whose ``r`` is zero (a silent neuron) is skipped,
  so only the synapses of active rows are computed and the rest of ``g`` stays
  the zeros XLA wrote into the in-out buffer.

Homogeneous (``data.shape == (1,)``) and per-synapse weights share a kernel (a
runtime branch).  As in the Numba backend, float16 and bfloat16 (which Warp
lacks) are converted to float32 around the call, the kernels accumulate in
float32 (float64 for float64) and the result is rounded back to the output
dtype; events are passed as bool (nonzero = spike); a malformed structure
(possible under ``jit``, where it cannot be validated) never reads or writes
out of bounds: row spans are clamped and out-of-range columns ignored.  The
eight kernels of one dtype signature live in one Warp module, so a signature
compiles once and then loads from Warp's kernel cache in milliseconds.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "csrmv_warp",
    "csrmm_warp",
    "binary_csrmv_warp",
    "binary_csrmm_warp",
    "csr_sddmm_warp",
    "register",
    "csr_kernels",
    "sddmm_kernels",
]

_LOW_PRECISION = (np.dtype(np.float16), np.dtype(jnp.bfloat16))
_lock = threading.Lock()


def compute_dtype(dtype) -> np.dtype:
    """The dtype the kernels compute and accumulate in: float32 for float16/bfloat16."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in _LOW_PRECISION else dtype


def _module_setup(prefix: str, compute_dt: str, index_dt: str, indptr_dt: str):
    """Warp types ``(F, I, P)`` of one dtype signature, its Warp module, the kernel options and
    the 1-d / 2-d array annotations ``v1(t)``, ``v2(t)``."""
    import warp as wp

    from ..warp_kernel import jaxtype_to_warptype

    module = wp.get_module(f"{prefix}_{compute_dt}_{index_dt}_{indptr_dt}")
    types = tuple(jaxtype_to_warptype(dt) for dt in (compute_dt, index_dt, indptr_dt))
    opts = dict(enable_backward=False, module=module)
    return (*types, module, opts, lambda t: wp.array(dtype=t, ndim=1), lambda t: wp.array(dtype=t, ndim=2))


@functools.lru_cache(maxsize=None)
def csr_kernels(compute_dt: str, index_dt: str, indptr_dt: str) -> dict:
    """Build (once per dtype signature) the eight CSR Warp kernels in one Warp module.

    Weights and float operands arrive in ``compute_dt``, events as bool.

    Returns:
        ``{(kind, binary, transpose): kernel}`` with kind ``"mv"`` or ``"mm"``.
    """
    import warp as wp

    F, I, P, module, opts, v1, v2 = _module_setup("evjax_csr", compute_dt, index_dt, indptr_dt)  # noqa: E741
    B = wp.bool

    @wp.func(module=module)
    def span(indptr: v1(P), i: int, nnz: int):
        """Row ``i``'s synapses, clamped to [0, nnz] (a malformed structure never reads out of bounds)."""
        return wp.max(int(indptr[i]), 0), wp.min(int(indptr[i + 1]), nnz)

    @wp.func(module=module)
    def weight(data: v1(F), j: int):
        if data.shape[0] == 1:
            return data[0]
        return data[j]

    # ---- gather: y = A @ x (one thread per output row / element; pure output)
    @wp.kernel(**opts)
    def mv_gather(data: v1(F), indices: v1(I), indptr: v1(P), x: v1(F), out: v1(F)):
        i = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                acc += weight(data, j) * x[col]
        out[i] = acc

    @wp.kernel(**opts)
    def ev_mv_gather(data: v1(F), indices: v1(I), indptr: v1(P), x: v1(B), out: v1(F)):
        i = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                if x[col]:
                    acc += weight(data, j)
        out[i] = acc

    @wp.kernel(**opts)
    def mm_gather(data: v1(F), indices: v1(I), indptr: v1(P), x: v2(F), out: v2(F)):
        i, c = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                acc += weight(data, j) * x[col, c]
        out[i, c] = acc

    @wp.kernel(**opts)
    def ev_mm_gather(data: v1(F), indices: v1(I), indptr: v1(P), x: v2(B), out: v2(F)):
        i, c = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                if x[col, c]:
                    acc += weight(data, j)
        out[i, c] = acc

    # ---- scatter: y = A.T @ x (one thread per source row; atomics into zeros)
    @wp.kernel(**opts)
    def mv_scatter(data: v1(F), indices: v1(I), indptr: v1(P), x: v1(F), out: v1(F)):
        i = wp.tid()
        xi = x[i]
        a, b = span(indptr, i, indices.shape[0])
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < out.shape[0]:
                wp.atomic_add(out, col, weight(data, j) * xi)

    @wp.kernel(**opts)
    def ev_mv_scatter(data: v1(F), indices: v1(I), indptr: v1(P), x: v1(B), out: v1(F)):
        i = wp.tid()
        if x[i]:  # silent rows cost nothing
            a, b = span(indptr, i, indices.shape[0])
            for j in range(a, b):
                col = int(indices[j])
                if col >= 0 and col < out.shape[0]:
                    wp.atomic_add(out, col, weight(data, j))

    @wp.kernel(**opts)
    def mm_scatter(data: v1(F), indices: v1(I), indptr: v1(P), x: v2(F), out: v2(F)):
        i, c = wp.tid()
        xi = x[i, c]
        a, b = span(indptr, i, indices.shape[0])
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < out.shape[0]:
                wp.atomic_add(out, col, c, weight(data, j) * xi)

    @wp.kernel(**opts)
    def ev_mm_scatter(data: v1(F), indices: v1(I), indptr: v1(P), x: v2(B), out: v2(F)):
        i, c = wp.tid()
        if x[i, c]:
            a, b = span(indptr, i, indices.shape[0])
            for j in range(a, b):
                col = int(indices[j])
                if col >= 0 and col < out.shape[0]:
                    wp.atomic_add(out, col, c, weight(data, j))

    return {
        ("mv", False, False): mv_gather,
        ("mv", False, True): mv_scatter,
        ("mm", False, False): mm_gather,
        ("mm", False, True): mm_scatter,
        ("mv", True, False): ev_mv_gather,
        ("mv", True, True): ev_mv_scatter,
        ("mm", True, False): ev_mm_gather,
        ("mm", True, True): ev_mm_scatter,
    }


@functools.lru_cache(maxsize=None)
def sddmm_kernels(compute_dt: str, index_dt: str, indptr_dt: str) -> dict:
    """Build (once per dtype signature) the two weight-gradient (SDDMM) Warp kernels.

    Returns:
        ``{"vec": kernel, "mat": kernel}``: ``r`` and ``q`` vectors or ``(rows, k)`` matrices.
    """
    import warp as wp

    F, I, P, module, opts, v1, v2 = _module_setup("evjax_csr_sddmm", compute_dt, index_dt, indptr_dt)  # noqa: E741

    @wp.func(module=module)
    def span(indptr: v1(P), i: int, nnz: int):
        return wp.max(int(indptr[i]), 0), wp.min(int(indptr[i + 1]), nnz)

    @wp.kernel(**opts)
    def sddmm_vec(indices: v1(I), indptr: v1(P), r: v1(F), q: v1(F), g: v1(F)):
        i = wp.tid()
        ri = r[i]
        if ri != F(0):  # silent rows cost nothing: their entries keep the zeros
            a, b = span(indptr, i, indices.shape[0])
            for k in range(a, b):
                col = int(indices[k])
                if col >= 0 and col < q.shape[0]:
                    g[k] = ri * q[col]

    @wp.kernel(**opts)
    def sddmm_mat(indices: v1(I), indptr: v1(P), r: v2(F), q: v2(F), g: v1(F)):
        i = wp.tid()
        width = r.shape[1]
        active = int(0)
        for c in range(width):
            if r[i, c] != F(0):
                active += 1
        if active > 0:
            a, b = span(indptr, i, indices.shape[0])
            for k in range(a, b):
                col = int(indices[k])
                if col >= 0 and col < q.shape[0]:
                    acc = F(0)
                    for c in range(width):
                        acc += r[i, c] * q[col, c]
                    g[k] = acc

    return {"vec": sddmm_vec, "mat": sddmm_mat}


def csr_sddmm_warp(outs, ins):
    """Warp kernel generator for ``csr_sddmm_p``: ``g[k] = <r[row k], q[indices[k]]>``."""
    from ..warp_kernel import warp_kernel

    out = outs[0]
    index_in, indptr_in, r_in, _ = ins
    dtype = compute_dtype(out.dtype)
    with _lock:
        kernels = sddmm_kernels(str(dtype), str(np.dtype(index_in.dtype)), str(np.dtype(indptr_in.dtype)))
    kernel = kernels["mat" if len(r_in.shape) == 2 else "vec"]
    n_rows, nnz = int(r_in.shape[0]), int(out.shape[0])

    def run(indices, indptr, r, q):
        r = r if r.dtype == dtype else r.astype(dtype)  # events (bool) become 0/1
        q = q if q.dtype == dtype else q.astype(dtype)
        call = warp_kernel(kernel, [], launch_dims=(n_rows,), in_out_argnames=("g",))
        (g,) = call(indices, indptr, r, q, jnp.zeros((nnz,), dtype))
        return [g if g.dtype == out.dtype else g.astype(out.dtype)]

    return run


def _generator(kind: str, binary: bool):
    def generator(outs, ins, shape, transpose):
        from ..warp_kernel import warp_kernel

        out = outs[0]
        _, index_in, indptr_in, dense_in = ins
        dtype = compute_dtype(out.dtype)
        with _lock:
            kernels = csr_kernels(str(dtype), str(np.dtype(index_in.dtype)), str(np.dtype(indptr_in.dtype)))
        kernel = kernels[(kind, binary, bool(transpose))]
        out_shape = tuple(int(d) for d in out.shape)
        launch = (int(shape[0]),) if kind == "mv" else (int(shape[0]), int(dense_in.shape[1]))

        def run(data, indices, indptr, x):
            data = data if data.dtype == dtype else data.astype(dtype)
            if binary:
                x = x if x.dtype == jnp.bool_ else x != 0
            elif x.dtype != dtype:
                x = x.astype(dtype)
            if transpose:
                call = warp_kernel(kernel, [], launch_dims=launch, in_out_argnames=("out",))
                (y,) = call(data, indices, indptr, x, jnp.zeros(out_shape, dtype))
            else:
                call = warp_kernel(kernel, jax.ShapeDtypeStruct(out_shape, dtype), launch_dims=launch)
                y = call(data, indices, indptr, x)
            return [y if y.dtype == out.dtype else y.astype(out.dtype)]

        return run

    generator.__name__ = f"{'binary_' if binary else ''}csr{kind}_warp"
    generator.__doc__ = (
        f"Warp kernel generator for ``{'binary_' if binary else ''}csr{kind}_p`` "
        f"({'event' if binary else 'float'} {'vector' if kind == 'mv' else 'matrix'})."
    )
    return generator


csrmv_warp = _generator("mv", False)
csrmm_warp = _generator("mm", False)
binary_csrmv_warp = _generator("mv", True)
binary_csrmm_warp = _generator("mm", True)


def register(csrmv_p=None, csrmm_p=None, binary_csrmv_p=None, binary_csrmm_p=None, csr_sddmm_p=None) -> None:
    """Add the Warp generators as the ``"warp"`` backend (cpu and gpu) of the CSR ops
    (and of ``csr_sddmm_p``, the weight gradient).

    With no arguments, the ops are taken from :mod:`evjax.primitives.csr`.
    Registering never imports Warp and never changes an op's default backend.
    """
    if csrmv_p is None:
        from . import csr

        csrmv_p, csrmm_p = csr.csrmv_p, csr.csrmm_p
        binary_csrmv_p, binary_csrmm_p = csr.binary_csrmv_p, csr.binary_csrmm_p
        csr_sddmm_p = csr.csr_sddmm_p
    for op, generator in (
        (csrmv_p, csrmv_warp),
        (csrmm_p, csrmm_warp),
        (binary_csrmv_p, binary_csrmv_warp),
        (binary_csrmm_p, binary_csrmm_warp),
        (csr_sddmm_p, csr_sddmm_warp),
    ):
        if op is not None:
            op.def_warp_kernel(generator, default=False)
