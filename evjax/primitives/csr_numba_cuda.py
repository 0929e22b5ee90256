"""Numba CUDA kernels for the CSR operator family, as the ``"numba_cuda"`` GPU backend.

Each generator follows the CSR contract of :mod:`evjax.primitives.csr`: it is
called as ``generator(outs=..., ins=..., shape=..., transpose=...)`` and returns
``kernel(data, indices, indptr, dense) -> [out]``; :func:`register` adds them to
``csrmv_p``, ``csrmm_p``, ``binary_csrmv_p`` and ``binary_csrmm_p``, selectable
with ``backend='numba_cuda'``.

Kernels, with ``W`` the ``(n_rows, n_cols)`` CSR matrix:

* ``transpose=False`` (gather, ``W @ v``): for mv one warp per output row, the
  32 lanes striding over the row's synapses and reducing in shared memory; for
  mm one thread per output element ``(row, column)``, neighbouring threads on
  neighbouring columns of the dense operand (coalesced reads).
* ``transpose=True`` (scatter, ``W.T @ v``): a source row whose input is zero
  (no spike) is skipped, so the work follows the active rows; for mv one warp
  per row, for mm one thread per ``(row, column)``.  Each synapse adds with
  ``cuda.atomic.add`` into an output that XLA zero-fills (an aliased input).

Homogeneous (``data.shape == (1,)``) and per-synapse weights get separate
kernels (the weight is multiplied in once per row).  Events are bool or float
(nonzero = spike).  Accumulation is float32 for float16/bfloat16/float32 and
float64 for float64; lower-precision operands are cast in JAX around the call.
Row spans are clamped to ``[0, nnz]`` and column indices outside the matrix are
ignored, so a malformed structure under ``jit`` cannot write out of bounds.

``numba.cuda`` is imported when a kernel is first built, never at import.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "csr_cuda_kernels",
    "csrmv_numba_cuda",
    "csrmm_numba_cuda",
    "binary_csrmv_numba_cuda",
    "binary_csrmm_numba_cuda",
    "register",
]

# ``numba.cuda``, bound on first use by _cuda(); a module global (not a local
# import) because Numba's simulator swaps the kernels' global ``cuda``.
cuda = None

WARPS_PER_BLOCK = 8  # gather mv: 256 threads, one warp per row
THREADS = 256


def _acc_dtype(*dtypes) -> np.dtype:
    """float64 if any operand or the output is float64, else float32."""
    return np.dtype(np.float64) if any(np.dtype(d) == np.float64 for d in dtypes) else np.dtype(np.float32)


def _cuda():
    global cuda
    if cuda is None:
        from numba import cuda as module

        cuda = module
    return cuda


@functools.lru_cache(maxsize=None)
def csr_cuda_kernels(acc: str, homogeneous: bool, event: bool) -> dict:
    """The four ``@cuda.jit`` CSR kernels for one accumulation dtype and weight/event kind.

    Returns a dict with keys ``"mv_gather"``, ``"mv_scatter"``, ``"mm_gather"``,
    ``"mm_scatter"``.  Argument order: ``(data, indices, indptr, dense, out)``
    for gathers and ``(data, indices, indptr, dense, zeros, out)`` for scatters,
    where ``out`` aliases ``zeros`` (only ``out`` is written).
    """
    _cuda()
    ACC = np.float64 if acc == "float64" else np.float32
    HOMO = bool(homogeneous)
    EVENT = bool(event)
    TPB = THREADS

    @cuda.jit
    def mv_gather(data, indices, indptr, v, out):
        buf = cuda.shared.array(TPB, ACC)
        t = cuda.threadIdx.x
        lane = t % 32
        row = cuda.blockIdx.x * (TPB // 32) + t // 32
        nnz = indices.shape[0]
        n_cols = v.shape[0]
        acc = ACC(0)
        if row < out.shape[0]:
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < n_cols:
                    x = v[col]
                    if EVENT:
                        if x != 0:
                            acc += ACC(1) if HOMO else data[p]
                    elif HOMO:
                        acc += x
                    else:
                        acc += data[p] * x
        buf[t] = acc
        cuda.syncthreads()
        step = 16
        while step > 0:
            if lane < step:
                buf[t] += buf[t + step]
            cuda.syncthreads()
            step //= 2
        if lane == 0 and row < out.shape[0]:
            total = buf[t]
            if HOMO:
                total *= data[0]
            out[row] = total

    @cuda.jit
    def mv_scatter(data, indices, indptr, v, zeros, out):
        tid = cuda.grid(1)
        row = tid // 32
        lane = tid % 32
        nnz = indices.shape[0]
        n_cols = out.shape[0]
        if row < v.shape[0]:
            x = v[row]
            if x != 0:
                start = indptr[row] if indptr[row] > 0 else 0
                end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
                w = ACC(0)
                if HOMO:
                    w = data[0] if EVENT else data[0] * x
                for p in range(start + lane, end, 32):
                    col = indices[p]
                    if col >= 0 and col < n_cols:
                        if HOMO:
                            cuda.atomic.add(out, col, w)
                        elif EVENT:
                            cuda.atomic.add(out, col, data[p])
                        else:
                            cuda.atomic.add(out, col, data[p] * x)

    @cuda.jit
    def mm_gather(data, indices, indptr, b, out):
        # threads: x along the k columns (coalesced), y along rows; blocks: x over rows (up to
        # 2**31 - 1 blocks, y is limited to 65535), y over column tiles
        c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        nnz = indices.shape[0]
        n_cols = b.shape[0]
        if row < out.shape[0] and c < out.shape[1]:
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            acc = ACC(0)
            for p in range(start, end):
                col = indices[p]
                if col >= 0 and col < n_cols:
                    x = b[col, c]
                    if EVENT:
                        if x != 0:
                            acc += ACC(1) if HOMO else data[p]
                    elif HOMO:
                        acc += x
                    else:
                        acc += data[p] * x
            if HOMO:
                acc *= data[0]
            out[row, c] = acc

    @cuda.jit
    def mm_scatter(data, indices, indptr, b, zeros, out):
        # threads: x along the k columns (coalesced), y along rows; blocks: x over rows (up to
        # 2**31 - 1 blocks, y is limited to 65535), y over column tiles
        c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        nnz = indices.shape[0]
        n_cols = out.shape[0]
        if row < b.shape[0] and c < b.shape[1]:
            x = b[row, c]
            if x != 0:
                start = indptr[row] if indptr[row] > 0 else 0
                end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
                w = ACC(0)
                if HOMO:
                    w = data[0] if EVENT else data[0] * x
                for p in range(start, end):
                    col = indices[p]
                    if col >= 0 and col < n_cols:
                        if HOMO:
                            cuda.atomic.add(out, (col, c), w)
                        elif EVENT:
                            cuda.atomic.add(out, (col, c), data[p])
                        else:
                            cuda.atomic.add(out, (col, c), data[p] * x)

    return {"mv_gather": mv_gather, "mv_scatter": mv_scatter, "mm_gather": mm_gather, "mm_scatter": mm_scatter}


def mm_launch(n_rows: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(grid, block)`` of the mm kernels.

    A block is ``bx`` threads along the ``k`` columns (the next power of two of
    ``k``, at most 32) by ``256 / bx`` along rows; the grid's x covers the rows
    and its y the column tiles.
    """
    bx = min(32, 1 << max(int(k) - 1, 0).bit_length())
    by = THREADS // bx
    return (math.ceil(n_rows / by), math.ceil(k / bx)), (bx, by)


def _events(x):
    """Events the kernels read directly: bool, float32, float64; others become bool."""
    if x.dtype in (jnp.bool_, jnp.float32, jnp.float64):
        return x
    return x != 0


def _generator(kind: str, binary: bool):
    def generator(outs, ins, shape, transpose):
        from ..numba_cuda_kernel import numba_cuda_kernel

        out = outs[0]
        data_in, _, _, dense_in = ins
        dense_dt = np.dtype(dense_in.dtype)
        acc = _acc_dtype(data_in.dtype, out.dtype, np.float32 if binary else dense_dt)
        homogeneous = tuple(data_in.shape) == (1,)
        kernels = csr_cuda_kernels(str(acc), homogeneous, binary)
        kernel = kernels[f"{kind}_{'scatter' if transpose else 'gather'}"]
        n_rows = int(shape[0])
        out_shape = tuple(int(d) for d in out.shape)
        acc_out = jax.ShapeDtypeStruct(out_shape, acc)
        if kind == "mv":
            if transpose:
                config = dict(launch_dims=n_rows * 32, threads_per_block=THREADS)
            else:
                config = dict(grid=math.ceil(n_rows / WARPS_PER_BLOCK), block=THREADS)
        else:
            grid, block = mm_launch(n_rows, int(dense_in.shape[1]))
            config = dict(grid=grid, block=block)
        if transpose:
            call = numba_cuda_kernel(kernel, acc_out, input_output_aliases={4: 0}, **config)
        else:
            call = numba_cuda_kernel(kernel, acc_out, **config)

        def run(data, indices, indptr, dense):
            data = data.astype(acc) if data.dtype != acc else data
            if binary:
                dense = _events(dense)
            elif dense.dtype != acc:
                dense = dense.astype(acc)
            if transpose:
                result = call(data, indices, indptr, dense, jnp.zeros(out_shape, acc))
            else:
                result = call(data, indices, indptr, dense)
            return [result.astype(out.dtype) if result.dtype != out.dtype else result]

        return run

    generator.__name__ = f"{'binary_' if binary else ''}csr{kind}_numba_cuda"
    return generator


csrmv_numba_cuda = _generator("mv", False)
csrmm_numba_cuda = _generator("mm", False)
binary_csrmv_numba_cuda = _generator("mv", True)
binary_csrmm_numba_cuda = _generator("mm", True)


def register(csrmv_p=None, csrmm_p=None, binary_csrmv_p=None, binary_csrmm_p=None, *, default: bool = False) -> None:
    """Add the generators as the ``"numba_cuda"`` GPU backend of the CSR ops.

    With no op arguments, the ops are taken from :mod:`evjax.primitives.csr`.
    Registering never imports ``numba.cuda``; it changes an op's GPU default
    only with ``default=True``.
    """
    if csrmv_p is None:
        from . import csr

        csrmv_p, csrmm_p = csr.csrmv_p, csr.csrmm_p
        binary_csrmv_p, binary_csrmm_p = csr.binary_csrmv_p, csr.binary_csrmm_p
    for op, generator in (
        (csrmv_p, csrmv_numba_cuda),
        (csrmm_p, csrmm_numba_cuda),
        (binary_csrmv_p, binary_csrmv_numba_cuda),
        (binary_csrmm_p, binary_csrmm_numba_cuda),
    ):
        if op is not None:
            op.def_numba_cuda_kernel(generator, default=default)
