"""Numba CUDA backend of the CSR ops (backend ``"numba_cuda"``, GPU).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs this
backend; it registers its generators at the bottom.  The kernels are
module-level and dtype-generic (Numba specialises them per signature), picked
from :data:`KERNELS` by ``(kind, event, transpose)``, with ``W`` the
``(n_rows, n_cols)`` CSR matrix:

* ``mv_gather`` / ``mv_gather_events`` (``W @ v``): one warp per output row,
  the 32 lanes striding over the row's synapses and reducing in shared memory.
* ``mm_gather`` / ``mm_gather_events`` (``W @ B``): one thread per output
  element ``(row, column)``, neighbouring threads on neighbouring columns of
  ``B`` (coalesced reads); grid and block from :func:`mm_launch`.
* ``mv_scatter`` / ``mv_scatter_events`` (``W.T @ v``): one warp per source
  row; ``mm_scatter`` / ``mm_scatter_events`` (``W.T @ B``): one thread per
  ``(row, column)``.  A silent event is skipped, so the work of the event
  kernels follows the active rows; the float kernels visit every row (IEEE:
  a nan weight times 0 is nan).  Each synapse adds with ``cuda.atomic.add``
  into an output that XLA zero-fills (an aliased input).
* ``sddmm_vec*`` / ``sddmm_mat*`` (:data:`SDDMM_KERNELS`, by ``ops.sddmm_mode``),
  the weight gradient ``g[k] = <r[row k], q[indices[k]]>``: one warp per row,
  lanes striding over the row's synapses; with an event operand a row whose
  ``r`` is zero (all zeros for matrices) is skipped, so its entries keep the
  zeros of the aliased in-out buffer.

NaN and inf follow ``docs/semantics.md``: an event selects its weights (``if``,
never a multiply), a value multiplies them (IEEE), term by term.

Kernel arguments: ``(data, indices, indptr, x, out)`` for gathers,
``(data, indices, indptr, x, zeros, out)`` for scatters and
``(indices, indptr, r, q, zeros, g)`` for SDDMM, where ``out``/``g`` alias
``zeros`` (only they are written).  The accumulator has the output's dtype:
the generators cast weights and float operands to
:func:`~evjax.dtypes.compute_dtype` of the result (float32 for
float16/bfloat16) and round the result back; events arrive as bool
(:func:`~evjax.events.as_bool_events`).  Weights are homogeneous when
``data.shape[0] != indices.shape[0]`` (``data`` is ``(1,)``), a branch uniform
across threads.  Row
spans are clamped to ``[0, nnz]`` and columns outside the matrix ignored, so a
malformed structure under ``jit`` never reads or writes out of bounds.
"""
import math

import jax
import jax.numpy as jnp
from numba import cuda

from ...dtypes import compute_dtype
from ..._event_values import as_bool_events
from ...numba_cuda_kernel import numba_cuda_kernel
from . import numba_cuda_weighted, ops

__all__ = [
    "KERNELS",
    "SDDMM_KERNELS",
    "THREADS",
    "WARPS_PER_BLOCK",
    "mm_launch",
    "csrmv_numba_cuda",
    "csrmm_numba_cuda",
    "binary_csrmv_numba_cuda",
    "binary_csrmm_numba_cuda",
    "csr_sddmm_numba_cuda",
]

THREADS = 256  # threads per block of every kernel
WARPS_PER_BLOCK = THREADS // 32  # warp-per-row kernels: rows per block
assert numba_cuda_weighted.THREADS == THREADS, "the weighted kernels' launch layout must match"


# ---------------------------------------------------------------------------
# kernels.  No @cuda.jit(device=True) helpers and no builtin max/min (an
# overload, compiled as a device function by Numba's built-in CUDA target): a
# device function called from a kernel is compiled for the current device, so
# compile_ptx without a GPU could not type-check it.  Every kernel clamps its
# row span to [0, nnz] inline.
# ---------------------------------------------------------------------------

# gather: out = W @ x.  mv: one warp per row (blocks of THREADS), lanes reduced
# in shared memory; mm: one thread per (row, column) (see mm_launch).
@cuda.jit
def mv_gather(data, indices, indptr, v, out):
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
                acc += (data[0] if homo else data[p]) * v[col]
    buf[t] = acc
    cuda.syncthreads()
    step = 16
    while step > 0:  # every thread takes part: syncthreads is block-wide
        if lane < step:
            buf[t] += buf[t + step]
        cuda.syncthreads()
        step //= 2
    if lane == 0 and row < out.shape[0]:
        out[row] = buf[t]


@cuda.jit
def mv_gather_events(data, indices, indptr, v, out):
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
                if v[col]:  # selected, not multiplied: a silent event hides a nan weight
                    acc += data[0] if homo else data[p]
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
def mm_gather(data, indices, indptr, b, out):
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
                acc += (data[0] if homo else data[p]) * b[col, c]
        out[row, c] = acc


@cuda.jit
def mm_gather_events(data, indices, indptr, b, out):
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
                if b[col, c]:
                    acc += data[0] if homo else data[p]
        out[row, c] = acc


# scatter: out (zero-filled, aliased) += W.T @ x, skipping source entries that
# are zero.  mv: one warp per source row; mm: one thread per (row, column).
@cuda.jit
def mv_scatter(data, indices, indptr, v, zeros, out):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < v.shape[0]:  # every row, x == 0 included (IEEE: nan * 0 is nan)
        x = v[row]
        nnz = indices.shape[0]
        homo = data.shape[0] != nnz
        start = indptr[row] if indptr[row] > 0 else 0
        end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
        for p in range(start + lane, end, 32):
            col = indices[p]
            if col >= 0 and col < out.shape[0]:
                cuda.atomic.add(out, col, (data[0] if homo else data[p]) * x)


@cuda.jit
def mv_scatter_events(data, indices, indptr, v, zeros, out):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < v.shape[0]:
        if v[row]:
            nnz = indices.shape[0]
            homo = data.shape[0] != nnz
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < out.shape[0]:
                    if homo:
                        cuda.atomic.add(out, col, data[0])
                    else:
                        cuda.atomic.add(out, col, data[p])


@cuda.jit
def mm_scatter(data, indices, indptr, b, zeros, out):
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if row < b.shape[0] and c < b.shape[1]:  # every entry, x == 0 included (IEEE)
        x = b[row, c]
        nnz = indices.shape[0]
        homo = data.shape[0] != nnz
        start = indptr[row] if indptr[row] > 0 else 0
        end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
        for p in range(start, end):
            col = indices[p]
            if col >= 0 and col < out.shape[0]:
                cuda.atomic.add(out, (col, c), (data[0] if homo else data[p]) * x)


@cuda.jit
def mm_scatter_events(data, indices, indptr, b, zeros, out):
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if row < b.shape[0] and c < b.shape[1]:
        if b[row, c]:
            nnz = indices.shape[0]
            homo = data.shape[0] != nnz
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start, end):
                col = indices[p]
                if col >= 0 and col < out.shape[0]:
                    if homo:
                        cuda.atomic.add(out, (col, c), data[0])
                    else:
                        cuda.atomic.add(out, (col, c), data[p])


# weight gradient: g[k] = <r[row k], q[indices[k]]> into a zero-filled, aliased
# g; one warp per row, lanes striding over its synapses.  Three modes (see
# ops.sddmm_mode): "values" (float r and q: the IEEE product on every row),
# "r_events" (bool r: silent rows skipped, q selected by r) and "q_events"
# (bool q, float r: r selected by q; rows with r == 0 skipped, their terms
# being 0).  An event selects (``if``), it never multiplies.
@cuda.jit
def sddmm_vec(indices, indptr, r, q, zeros, g):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < r.shape[0]:
        ri = r[row]
        nnz = indices.shape[0]
        start = indptr[row] if indptr[row] > 0 else 0
        end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
        for p in range(start + lane, end, 32):
            col = indices[p]
            if col >= 0 and col < q.shape[0]:
                g[p] = ri * q[col]


@cuda.jit
def sddmm_vec_r_events(indices, indptr, r, q, zeros, g):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < r.shape[0]:
        if r[row]:  # silent rows cost nothing: their entries keep the zeros
            nnz = indices.shape[0]
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < q.shape[0]:
                    g[p] = q[col]


@cuda.jit
def sddmm_vec_q_events(indices, indptr, r, q, zeros, g):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < r.shape[0]:
        ri = r[row]
        if ri != 0:  # every term of a zero row is 0: its entries keep the zeros
            nnz = indices.shape[0]
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < q.shape[0]:
                    g[p] = ri if q[col] else g.dtype.type(0)


@cuda.jit
def sddmm_mat(indices, indptr, r, q, zeros, g):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < r.shape[0]:
        width = r.shape[1]
        nnz = indices.shape[0]
        start = indptr[row] if indptr[row] > 0 else 0
        end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
        for p in range(start + lane, end, 32):
            col = indices[p]
            if col >= 0 and col < q.shape[0]:
                acc = g.dtype.type(0)
                for c in range(width):
                    acc += r[row, c] * q[col, c]
                g[p] = acc


@cuda.jit
def sddmm_mat_r_events(indices, indptr, r, q, zeros, g):
    t = cuda.threadIdx.x
    lane = t % 32
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
    if row < r.shape[0]:
        width = r.shape[1]
        active = False
        for c in range(width):
            if r[row, c]:
                active = True
                break
        if active:
            nnz = indices.shape[0]
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < q.shape[0]:
                    acc = g.dtype.type(0)
                    for c in range(width):
                        if r[row, c]:
                            acc += q[col, c]
                    g[p] = acc


@cuda.jit
def sddmm_mat_q_events(indices, indptr, r, q, zeros, g):
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
        if active:
            nnz = indices.shape[0]
            start = indptr[row] if indptr[row] > 0 else 0
            end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
            for p in range(start + lane, end, 32):
                col = indices[p]
                if col >= 0 and col < q.shape[0]:
                    acc = g.dtype.type(0)
                    for c in range(width):
                        if q[col, c]:
                            acc += r[row, c]
                    g[p] = acc


# (kind, event, transpose) -> kernel
KERNELS = {
    ("mv", False, False): mv_gather,
    ("mv", True, False): mv_gather_events,
    ("mv", False, True): mv_scatter,
    ("mv", True, True): mv_scatter_events,
    ("mm", False, False): mm_gather,
    ("mm", True, False): mm_gather_events,
    ("mm", False, True): mm_scatter,
    ("mm", True, True): mm_scatter_events,
}

# (kind, mode) -> kernel; kind "vec" (r, q vectors) or "mat" (r (n_rows, k), q (n_cols, k)),
# mode as ops.sddmm_mode
SDDMM_KERNELS = {
    ("vec", "values"): sddmm_vec,
    ("vec", "r_events"): sddmm_vec_r_events,
    ("vec", "q_events"): sddmm_vec_q_events,
    ("mat", "values"): sddmm_mat,
    ("mat", "r_events"): sddmm_mat_r_events,
    ("mat", "q_events"): sddmm_mat_q_events,
}



# ---------------------------------------------------------------------------
# launch configurations
# ---------------------------------------------------------------------------
def mm_launch(n_rows: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The ``(grid, block)`` of the mm kernels.

    A block is ``bx`` threads along the ``k`` columns (the next power of two of
    ``k``, at most 32) by ``THREADS / bx`` along rows; the grid's x covers the
    rows (up to 2**31 - 1 blocks; y is limited to 65535) and its y the column
    tiles.

    Args:
        n_rows: rows of the CSR matrix (the output rows of a gather, the
            input rows of a scatter).
        k: columns of the dense operand.

    Returns:
        ``((grid_x, grid_y), (block_x, block_y))``.
    """
    bx = min(32, 1 << max(int(k) - 1, 0).bit_length())
    by = THREADS // bx
    return (math.ceil(n_rows / by), math.ceil(k / bx)), (bx, by)


def _warp_per_row(n_rows: int) -> dict:
    return dict(grid=math.ceil(n_rows / WARPS_PER_BLOCK), block=THREADS)


def _cast(x, dtype):
    return x if x.dtype == dtype else x.astype(dtype)


# ---------------------------------------------------------------------------
# generators (the ops' backend slot)
# ---------------------------------------------------------------------------
def _matmul_generator(kind: str, event: bool):
    def generator(outs, ins, shape, transpose, weighted=False):
        out = outs[0]
        dtype = compute_dtype(out.dtype)
        transpose = bool(transpose)
        if weighted:  # values that select: numba_cuda_weighted
            kernel = numba_cuda_weighted.KERNELS[(kind, transpose)]
        else:
            kernel = KERNELS[(kind, event, transpose)]
        out_shape = tuple(int(d) for d in out.shape)
        result = jax.ShapeDtypeStruct(out_shape, dtype)
        n_rows = int(shape[0])
        if kind == "mv":
            config = _warp_per_row(n_rows)
        else:
            grid, block = mm_launch(n_rows, int(ins[3].shape[1]))
            config = dict(grid=grid, block=block)
        if transpose:
            call = numba_cuda_kernel(kernel, result, input_output_aliases={4: 0}, **config)
        else:
            call = numba_cuda_kernel(kernel, result, **config)

        def run(data, indices, indptr, x):
            data = _cast(data, dtype)
            x = as_bool_events(x) if event and not weighted else _cast(x, dtype)
            if transpose:
                y = call(data, indices, indptr, x, jnp.zeros(out_shape, dtype))
            else:
                y = call(data, indices, indptr, x)
            return [_cast(y, out.dtype)]

        return run

    op = f"{'binary_' if event else ''}csr{kind}_p"
    generator.__name__ = f"{op[:-2]}_numba_cuda"
    generator.__qualname__ = generator.__name__
    generator.__doc__ = f"""Numba CUDA kernel generator for ``{op}``.

    Args:
        outs: the op's single output (``jax.ShapeDtypeStruct``).
        ins: the input avals ``(data, indices, indptr, x)``.
        shape: ``(n_rows, n_cols)`` of the CSR matrix.
        transpose: scatter (``W.T @ x``) instead of gather (``W @ x``).
        weighted: (binary ops) ``x`` holds weighted events.

    Returns:
        ``run(data, indices, indptr, x) -> [out]``.
    """
    return generator


csrmv_numba_cuda = _matmul_generator("mv", event=False)
csrmm_numba_cuda = _matmul_generator("mm", event=False)
binary_csrmv_numba_cuda = _matmul_generator("mv", event=True)
binary_csrmm_numba_cuda = _matmul_generator("mm", event=True)


def csr_sddmm_numba_cuda(outs, ins, shape, weighted):
    """Numba CUDA kernel generator for ``csr_sddmm_p``: ``g[k] = <r[row k], q[indices[k]]>``.

    Args:
        outs: the op's single output, ``(nnz,)``.
        ins: the input avals ``(indices, indptr, r, q)``; ``r`` and ``q`` both
            vectors or both matrices (``(n_rows, k)``, ``(n_cols, k)``).
        weighted: ``"r"`` or ``"q"``: that operand holds weighted events
            (:data:`.numba_cuda_weighted.SDDMM_KERNELS`; vectors run as ``(n, 1)``).

    Returns:
        ``run(indices, indptr, r, q) -> [g]``; a bool operand selects (kept as
        bool; a bool ``q`` beside a bool ``r`` becomes 0/1), float ones are cast
        to the compute dtype, and ``g`` is rounded to the output dtype.
    """
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    r_in, q_in = ins[2], ins[3]
    mode = ops.sddmm_mode(r_in.dtype, q_in.dtype, weighted)
    as_matrix = lambda a: a  # noqa: E731
    if weighted is not None:
        kernel = numba_cuda_weighted.SDDMM_KERNELS[mode]
        as_matrix = (lambda a: a[:, None]) if len(r_in.shape) == 1 else as_matrix  # noqa: E731
    else:
        kernel = SDDMM_KERNELS[("mat" if len(r_in.shape) == 2 else "vec", mode)]
    nnz = int(out.shape[0])
    call = numba_cuda_kernel(kernel, jax.ShapeDtypeStruct((nnz,), dtype), input_output_aliases={4: 0},
                             **_warp_per_row(int(r_in.shape[0])))

    def run(indices, indptr, r, q):
        r = r if mode == "r_events" else as_matrix(_cast(r, dtype))
        q = q if mode == "q_events" else as_matrix(_cast(q, dtype))
        g = call(indices, indptr, r, q, jnp.zeros((nnz,), dtype))
        return [_cast(g, out.dtype)]

    return run


for _op, _generator in ((ops.csrmv_p, csrmv_numba_cuda), (ops.csrmm_p, csrmm_numba_cuda),
                        (ops.binary_csrmv_p, binary_csrmv_numba_cuda),
                        (ops.binary_csrmm_p, binary_csrmm_numba_cuda),
                        (ops.csr_sddmm_p, csr_sddmm_numba_cuda)):
    _op.def_numba_cuda_kernel(_generator)
