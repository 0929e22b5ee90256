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

Homogeneous (``data.shape == (1,)``) and per-synapse weights share a kernel (a
runtime branch).  Accumulation is in float32 for float16/float32 and in
float64 for float64; Warp has no bfloat16, so bfloat16 operands are cast to
float32 in JAX first and the result is cast back.  All kernels of one dtype
signature are built together in one Warp module, so a signature compiles
once (then loads from Warp's kernel cache in milliseconds).
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
    "register",
    "csr_kernels",
]

_WARP_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_lock = threading.Lock()


def _acc_dtype(*dtypes) -> np.dtype:
    """float64 if any operand or the output is float64, else float32."""
    return np.dtype(np.float64) if any(np.dtype(d) == np.float64 for d in dtypes) else np.dtype(np.float32)


def _warp_float(dtype) -> np.dtype:
    """The dtype a float operand is handed to Warp in (bfloat16 -> float32)."""
    dt = np.dtype(dtype)
    if dt in _WARP_FLOATS or dt == np.bool_ or np.issubdtype(dt, np.integer):
        return dt
    if dt == np.dtype(jnp.bfloat16):
        return np.dtype(np.float32)
    raise TypeError(f"the Warp CSR kernels do not support dtype {dt}")


@functools.lru_cache(maxsize=None)
def csr_kernels(data_dt: str, index_dt: str, indptr_dt: str, dense_dt: str, out_dt: str, acc_dt: str) -> dict:
    """Build (once per dtype signature) the CSR Warp kernels in one Warp module.

    Returns:
        ``{(kind, binary, transpose): kernel}`` with kind ``"mv"`` or ``"mm"``.
        Float (non-event) kernels exist only for a floating dense operand.
    """
    import warp as wp

    from ..warp_kernel import jaxtype_to_warptype

    D = jaxtype_to_warptype(data_dt)
    I = jaxtype_to_warptype(index_dt)  # noqa: E741
    P = jaxtype_to_warptype(indptr_dt)
    V = jaxtype_to_warptype(dense_dt)
    O = jaxtype_to_warptype(out_dt)  # noqa: E741 - gather output
    A = jaxtype_to_warptype(acc_dt)  # accumulator and scatter buffer
    event_bool = np.dtype(dense_dt) == np.bool_
    module = wp.get_module(f"evjax_csr_{data_dt}_{index_dt}_{indptr_dt}_{dense_dt}_{out_dt}_{acc_dt}")
    opts = dict(enable_backward=False, module=module)
    a1 = lambda t: wp.array(dtype=t, ndim=1)  # noqa: E731
    a2 = lambda t: wp.array(dtype=t, ndim=2)  # noqa: E731

    @wp.func(module=module)
    def fired(x: V):
        if wp.static(event_bool):
            return x
        else:
            return x != V(0)

    @wp.kernel(**opts)
    def ev_mv_gather(data: a1(D), indices: a1(I), indptr: a1(P), v: a1(V), out: a1(O)):
        i = wp.tid()
        acc = A(0)
        homo = data.shape[0] == 1
        for j in range(int(indptr[i]), int(indptr[i + 1])):
            if fired(v[int(indices[j])]):
                if homo:
                    acc += A(1)
                else:
                    acc += A(data[j])
        if homo:
            acc = acc * A(data[0])
        out[i] = O(acc)

    @wp.kernel(**opts)
    def ev_mv_scatter(data: a1(D), indices: a1(I), indptr: a1(P), v: a1(V), out: a1(A)):
        i = wp.tid()
        if fired(v[i]):
            homo = data.shape[0] == 1
            for j in range(int(indptr[i]), int(indptr[i + 1])):
                w = A(0)
                if homo:
                    w = A(data[0])
                else:
                    w = A(data[j])
                wp.atomic_add(out, int(indices[j]), w)

    @wp.kernel(**opts)
    def ev_mm_gather(data: a1(D), indices: a1(I), indptr: a1(P), b: a2(V), out: a2(O)):
        i, c = wp.tid()
        acc = A(0)
        homo = data.shape[0] == 1
        for j in range(int(indptr[i]), int(indptr[i + 1])):
            if fired(b[int(indices[j]), c]):
                if homo:
                    acc += A(1)
                else:
                    acc += A(data[j])
        if homo:
            acc = acc * A(data[0])
        out[i, c] = O(acc)

    @wp.kernel(**opts)
    def ev_mm_scatter(data: a1(D), indices: a1(I), indptr: a1(P), b: a2(V), out: a2(A)):
        i, c = wp.tid()
        if fired(b[i, c]):
            homo = data.shape[0] == 1
            for j in range(int(indptr[i]), int(indptr[i + 1])):
                w = A(0)
                if homo:
                    w = A(data[0])
                else:
                    w = A(data[j])
                wp.atomic_add(out, int(indices[j]), c, w)

    kernels = {
        ("mv", True, False): ev_mv_gather,
        ("mv", True, True): ev_mv_scatter,
        ("mm", True, False): ev_mm_gather,
        ("mm", True, True): ev_mm_scatter,
    }
    if event_bool:
        return kernels

    @wp.kernel(**opts)
    def mv_gather(data: a1(D), indices: a1(I), indptr: a1(P), v: a1(V), out: a1(O)):
        i = wp.tid()
        acc = A(0)
        homo = data.shape[0] == 1
        for j in range(int(indptr[i]), int(indptr[i + 1])):
            x = A(v[int(indices[j])])
            if homo:
                acc += x
            else:
                acc += A(data[j]) * x
        if homo:
            acc = acc * A(data[0])
        out[i] = O(acc)

    @wp.kernel(**opts)
    def mv_scatter(data: a1(D), indices: a1(I), indptr: a1(P), v: a1(V), out: a1(A)):
        i = wp.tid()
        x = A(v[i])
        homo = data.shape[0] == 1
        for j in range(int(indptr[i]), int(indptr[i + 1])):
            w = A(0)
            if homo:
                w = A(data[0])
            else:
                w = A(data[j])
            wp.atomic_add(out, int(indices[j]), w * x)

    @wp.kernel(**opts)
    def mm_gather(data: a1(D), indices: a1(I), indptr: a1(P), b: a2(V), out: a2(O)):
        i, c = wp.tid()
        acc = A(0)
        homo = data.shape[0] == 1
        for j in range(int(indptr[i]), int(indptr[i + 1])):
            x = A(b[int(indices[j]), c])
            if homo:
                acc += x
            else:
                acc += A(data[j]) * x
        if homo:
            acc = acc * A(data[0])
        out[i, c] = O(acc)

    @wp.kernel(**opts)
    def mm_scatter(data: a1(D), indices: a1(I), indptr: a1(P), b: a2(V), out: a2(A)):
        i, c = wp.tid()
        x = A(b[i, c])
        homo = data.shape[0] == 1
        for j in range(int(indptr[i]), int(indptr[i + 1])):
            w = A(0)
            if homo:
                w = A(data[0])
            else:
                w = A(data[j])
            wp.atomic_add(out, int(indices[j]), c, w * x)

    kernels.update(
        {
            ("mv", False, False): mv_gather,
            ("mv", False, True): mv_scatter,
            ("mm", False, False): mm_gather,
            ("mm", False, True): mm_scatter,
        }
    )
    return kernels


def _generator(kind: str, binary: bool):
    def generator(outs, ins, shape, transpose):
        from ..warp_kernel import warp_kernel

        out = outs[0]
        data_in, index_in, indptr_in, dense_in = ins
        data_dt = _warp_float(data_in.dtype)
        dense_dt = _warp_float(dense_in.dtype) if not (binary and np.dtype(dense_in.dtype) == np.bool_) else np.dtype(np.bool_)
        out_dt = np.dtype(out.dtype)
        acc_dt = _acc_dtype(data_dt, dense_dt if dense_dt != np.bool_ else np.float32, out_dt if out_dt in _WARP_FLOATS else np.float32)
        gather_dt = out_dt if out_dt in _WARP_FLOATS else acc_dt
        with _lock:
            kernels = csr_kernels(
                str(data_dt), str(np.dtype(index_in.dtype)), str(np.dtype(indptr_in.dtype)), str(dense_dt),
                str(gather_dt), str(acc_dt),
            )
        kernel = kernels[(kind, binary, bool(transpose))]
        n_rows = int(shape[0])
        out_shape = tuple(int(d) for d in out.shape)
        launch = (n_rows,) if kind == "mv" else (n_rows, int(dense_in.shape[1]))

        def run(data, indices, indptr, dense):
            data = data.astype(data_dt) if data.dtype != data_dt else data
            dense = dense.astype(dense_dt) if dense.dtype != dense_dt else dense
            if transpose:
                call = warp_kernel(kernel, [], launch_dims=launch, in_out_argnames=("out",))
                (result,) = call(data, indices, indptr, dense, jnp.zeros(out_shape, acc_dt))
            else:
                call = warp_kernel(kernel, jax.ShapeDtypeStruct(out_shape, gather_dt), launch_dims=launch)
                result = call(data, indices, indptr, dense)
            return [result.astype(out_dt) if result.dtype != out_dt else result]

        return run

    generator.__name__ = f"{'binary_' if binary else ''}csr{kind}_warp"
    return generator


csrmv_warp = _generator("mv", False)
csrmm_warp = _generator("mm", False)
binary_csrmv_warp = _generator("mv", True)
binary_csrmm_warp = _generator("mm", True)


def register(csrmv_p=None, csrmm_p=None, binary_csrmv_p=None, binary_csrmm_p=None) -> None:
    """Add the Warp generators as the ``"warp"`` backend (cpu and gpu) of the CSR ops.

    With no arguments, the ops are taken from :mod:`evjax.primitives.csr`.
    Registering never imports Warp and never changes an op's default backend.
    """
    if csrmv_p is None:
        from . import csr

        csrmv_p, csrmm_p = csr.csrmv_p, csr.csrmm_p
        binary_csrmv_p, binary_csrmm_p = csr.binary_csrmv_p, csr.binary_csrmm_p
    for op, generator in (
        (csrmv_p, csrmv_warp),
        (csrmm_p, csrmm_warp),
        (binary_csrmv_p, binary_csrmv_warp),
        (binary_csrmm_p, binary_csrmm_warp),
    ):
        if op is not None:
            op.def_warp_kernel(generator, default=False)
