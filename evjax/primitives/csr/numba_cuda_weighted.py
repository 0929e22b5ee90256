"""Numba CUDA kernels of the CSR ops with weighted events (``weighted=True``).

Chosen by :mod:`evjax.primitives.csr.numba_cuda` from :data:`KERNELS` and
:data:`SDDMM_KERNELS`; same launch layouts and arguments as the binary kernels
there (one warp per row for vectors and the SDDMM, one thread per
``(row, column)`` for matrices; scatters and the SDDMM write into a
zero-filled, aliased buffer).

Weighted events are values of the output dtype: only nonzero entries are read
further, each contributing ``v * w`` (IEEE); a zero entry contributes nothing
whatever its weights hold (an ``if``, never ``0 * w``).  The scatters skip
zero rows, so their work follows the nonzero events.  SDDMM
``g[k] = sum_c where(e != 0, r[i, c] q[j, c], 0)`` with ``e`` the weighted
operand (``r``: all-zero rows skipped; ``q``: every row), on ``(n, k)``
matrices (vectors are passed as ``(n, 1)``).
"""
from numba import cuda

__all__ = ["KERNELS", "SDDMM_KERNELS", "THREADS"]

THREADS = 256  # threads per block: numba_cuda.THREADS, which checks that they agree
WARPS_PER_BLOCK = THREADS // 32

# (No device-function helpers, no builtin min/max: see numba_cuda.py.)


@cuda.jit
def weighted_mv_gather(data, indices, indptr, v, out):
    buf = cuda.shared.array(THREADS, out.dtype)
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    nnz = indices.shape[0]
    homo = data.shape[0] != nnz
    acc = out.dtype.type(0)
    if row < out.shape[0]:
        start = indptr[row] if indptr[row] > 0 else 0
        end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
        for p in range(start + lane, end, 32):
            col = indices[p]
            if col >= 0 and col < v.shape[0]:
                x = v[col]
                if x != 0:  # a zero event hides its weight (nan, inf)
                    acc += (data[0] if homo else data[p]) * x
    buf[t] = acc
    cuda.syncthreads()
    step = 16
    while step > 0:
        if lane < step:
            buf[t] += buf[t + step]
        cuda.syncthreads()
        step //= 2
    if lane == 0 and row < out.shape[0]:
        out[row] = buf[t]


@cuda.jit
def weighted_mm_gather(data, indices, indptr, b, out):
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if row < out.shape[0] and c < out.shape[1]:
        nnz = indices.shape[0]
        homo = data.shape[0] != nnz
        acc = out.dtype.type(0)
        start = indptr[row] if indptr[row] > 0 else 0
        end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
        for p in range(start, end):
            col = indices[p]
            if col >= 0 and col < b.shape[0]:
                x = b[col, c]
                if x != 0:
                    acc += (data[0] if homo else data[p]) * x
        out[row, c] = acc


@cuda.jit
def weighted_mv_scatter(data, indices, indptr, v, zeros, out):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < v.shape[0]:
        x = v[row]
        if x != 0:  # zero rows cost nothing
            nnz = indices.shape[0]
            homo = data.shape[0] != nnz
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < out.shape[0]:
                    cuda.atomic.add(out, col, (data[0] if homo else data[p]) * x)


@cuda.jit
def weighted_mm_scatter(data, indices, indptr, b, zeros, out):
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if row < b.shape[0] and c < b.shape[1]:
        x = b[row, c]
        if x != 0:
            nnz = indices.shape[0]
            homo = data.shape[0] != nnz
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start, end):
                col = indices[p]
                if col >= 0 and col < out.shape[0]:
                    cuda.atomic.add(out, (col, c), (data[0] if homo else data[p]) * x)


@cuda.jit
def sddmm_r_weighted(indices, indptr, r, q, zeros, g):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < r.shape[0]:
        width = r.shape[1]
        active = False
        for c in range(width):
            if r[row, c] != 0:
                active = True
                break
        if active:  # all-zero rows cost nothing: their entries keep the zeros
            nnz = indices.shape[0]
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < q.shape[0]:
                    acc = g.dtype.type(0)
                    for c in range(width):
                        if r[row, c] != 0:
                            acc += r[row, c] * q[col, c]
                    g[p] = acc


@cuda.jit
def sddmm_q_weighted(indices, indptr, r, q, zeros, g):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < r.shape[0]:  # every row: r == 0 meets a nonzero q by IEEE (0 * inf is nan)
        width = r.shape[1]
        nnz = indices.shape[0]
        start = indptr[row] if indptr[row] > 0 else 0
        end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
        for p in range(start + lane, end, 32):
            col = indices[p]
            if col >= 0 and col < q.shape[0]:
                acc = g.dtype.type(0)
                for c in range(width):
                    if q[col, c] != 0:
                        acc += r[row, c] * q[col, c]
                g[p] = acc


# (kind, transpose) -> kernel; kind "mv" or "mm"
KERNELS = {
    ("mv", False): weighted_mv_gather,
    ("mv", True): weighted_mv_scatter,
    ("mm", False): weighted_mm_gather,
    ("mm", True): weighted_mm_scatter,
}
# ops.sddmm_mode -> kernel (r, q as (n, k) matrices)
SDDMM_KERNELS = {"r_weighted": sddmm_r_weighted, "q_weighted": sddmm_q_weighted}
