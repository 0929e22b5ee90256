"""Numba CUDA backend of the CSR ops (backend ``"numba_cuda"``, GPU).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs this
backend; it registers its generators at the bottom.  The kernels are
dtype-generic (Numba specialises them per signature).  Each kind of kernel is
written once, as a factory of the dense operand's flavour (:data:`FLAVOURS`:
values, events, weighted events; for the SDDMM, its mode): the flavour's
flags are closure constants of the kernel, whose branches on them Numba
prunes before typing, so each built kernel compiles its own rule only.  They
are built at import and picked from :data:`KERNELS` by
``(kind, event, transpose)`` (weighted events: :data:`WEIGHTED_KERNELS`, by
``(kind, transpose)``), with ``W`` the ``(n_rows, n_cols)`` CSR matrix (names:
``mv_gather``, ``mv_gather_events``, ``weighted_mv_gather`` and so on):

* ``mv_gather*`` (``W @ v``): one warp per output row, the 32 lanes striding
  over the row's synapses and reducing in shared memory.
* ``mm_gather*`` (``W @ B``): one thread per output element ``(row, column)``,
  neighbouring threads on neighbouring columns of ``B`` (coalesced reads);
  grid and block from :func:`mm_launch`.
* ``mv_scatter*`` (``W.T @ v``): one warp per source row; ``mm_scatter*``
  (``W.T @ B``): one thread per ``(row, column)``.  A silent (or zero
  weighted) event is skipped, so the work of the event kernels follows the
  active rows; the float kernels visit every row (IEEE: a nan weight times 0
  is nan).  Each synapse adds with ``cuda.atomic.add`` into an output that
  XLA zero-fills (an aliased input).
* ``sddmm_vec*`` / ``sddmm_mat*`` (:data:`SDDMM_KERNELS`, by ``ops.sddmm_mode``),
  the weight gradient ``g[k] = <r[row k], q[indices[k]]>``: one warp per row,
  lanes striding over the row's synapses; with an event operand (or weighted
  ``r``) a row whose ``r`` is zero (all zeros for matrices) is skipped, so its
  entries keep the zeros of the aliased in-out buffer.  Weighted operands run
  on ``(n, k)`` matrices only (vectors as ``(n, 1)``).

NaN and inf follow ``docs/semantics.md``: an event selects its weights (``if``,
never a multiply), a value multiplies them (IEEE) and a weighted event selects,
then multiplies, term by term.

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

from ...dtypes import as_dtype, compute_dtype
from ..._event_values import as_bool_events
from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops

__all__ = [
    "FLAVOURS",
    "KERNELS",
    "WEIGHTED_KERNELS",
    "SDDMM_KERNELS",
    "THREADS",
    "WARPS_PER_BLOCK",
    "mm_launch",
    "csrmv_numba_cuda",
    "csrmm_numba_cuda",
    "binary_csrmv_numba_cuda",
    "binary_csrmm_numba_cuda",
    "csr_sddmm_numba_cuda",
    "binary_csrmv_active_numba_cuda",
    "LISTED_KERNEL",
]

THREADS = 256  # threads per block of every kernel
WARPS_PER_BLOCK = THREADS // 32  # warp-per-row kernels: rows per block


# ---------------------------------------------------------------------------
# kernels.  No @cuda.jit(device=True) helpers and no builtin max/min (an
# overload, compiled as a device function by Numba's built-in CUDA target): a
# device function called from a kernel is compiled for the current device, so
# compile_ptx without a GPU could not type-check it.  Every kernel clamps its
# row span to [0, nnz] inline.
#
# Each kernel is built by a factory of its flavour (matmul: "values", "events"
# or "weighted", see FLAVOURS; SDDMM: its mode).  The flavour's flags are
# closure constants of the kernel: Numba prunes the branches on them before
# typing, so every kernel compiles its own rule and nothing else (dead code
# never widens an accumulator's type: tests/test_numba_cuda_ptx.py checks that
# float32 kernels compile to no float64 arithmetic).
# ---------------------------------------------------------------------------
FLAVOURS = ("values", "events", "weighted")
_NAMES = {"values": "%s", "events": "%s_events", "weighted": "weighted_%s"}  # the kernels' names by flavour


def _named(kernel, name: str):
    """``cuda.jit`` of a factory's Python function under its table name."""
    kernel.__name__ = kernel.__qualname__ = name
    return cuda.jit(kernel)


# gather: out = W @ x.  mv: one warp per row (blocks of THREADS), lanes reduced
# in shared memory; mm: one thread per (row, column) (see mm_launch).  An event
# selects its weight (``if``, never a multiply: a silent event hides a nan
# weight), a weighted event selects, then multiplies, a value multiplies.
def _mv_gather(flavour: str):
    EVENTS, WEIGHTED = flavour == "events", flavour == "weighted"

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
                    if EVENTS:
                        if v[col]:
                            acc += data[0] if homo else data[p]
                    elif WEIGHTED:
                        x = v[col]
                        if x != 0:
                            acc += (data[0] if homo else data[p]) * x
                    else:
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

    return _named(mv_gather, _NAMES[flavour] % "mv_gather")


def _mm_gather(flavour: str):
    EVENTS, WEIGHTED = flavour == "events", flavour == "weighted"

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
                    if EVENTS:
                        if b[col, c]:
                            acc += data[0] if homo else data[p]
                    elif WEIGHTED:
                        x = b[col, c]
                        if x != 0:
                            acc += (data[0] if homo else data[p]) * x
                    else:
                        acc += (data[0] if homo else data[p]) * b[col, c]
            out[row, c] = acc

    return _named(mm_gather, _NAMES[flavour] % "mm_gather")


# scatter: out (zero-filled, aliased) += W.T @ x.  mv: one warp per source row;
# mm: one thread per (row, column).  Events and weighted events skip a zero
# source entry (its row costs nothing); values visit every entry, x == 0
# included (IEEE: a nan weight times 0 is nan).
def _mv_scatter(flavour: str):
    EVENTS, VALUES = flavour == "events", flavour == "values"

    def mv_scatter(data, indices, indptr, v, zeros, out):
        t = cuda.threadIdx.x
        lane = t % 32
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
        if row < v.shape[0]:
            x = v[row]
            if VALUES or x != 0:
                nnz = indices.shape[0]
                homo = data.shape[0] != nnz
                start = indptr[row] if indptr[row] > 0 else 0
                end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
                for p in range(start + lane, end, 32):
                    col = indices[p]
                    if col >= 0 and col < out.shape[0]:
                        if EVENTS:  # selected, not multiplied
                            if homo:
                                cuda.atomic.add(out, col, data[0])
                            else:
                                cuda.atomic.add(out, col, data[p])
                        else:
                            cuda.atomic.add(out, col, (data[0] if homo else data[p]) * x)

    return _named(mv_scatter, _NAMES[flavour] % "mv_scatter")


def _mv_scatter_listed():
    # events given as the list of their active rows: one warp per list slot, as mv_scatter_events
    def mv_scatter_listed(data, indices, indptr, ids, count, zeros, out):
        t = cuda.threadIdx.x
        lane = t % 32
        a = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
        if a < ids.shape[0] and a < count[0]:
            row = ids[a]
            if row >= 0 and row < indptr.shape[0] - 1:
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

    return _named(mv_scatter_listed, "mv_scatter_listed")


def _mm_scatter(flavour: str):
    EVENTS, VALUES = flavour == "events", flavour == "values"

    def mm_scatter(data, indices, indptr, b, zeros, out):
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        if row < b.shape[0] and c < b.shape[1]:
            x = b[row, c]
            if VALUES or x != 0:
                nnz = indices.shape[0]
                homo = data.shape[0] != nnz
                start = indptr[row] if indptr[row] > 0 else 0
                end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
                for p in range(start, end):
                    col = indices[p]
                    if col >= 0 and col < out.shape[0]:
                        if EVENTS:  # selected, not multiplied
                            if homo:
                                cuda.atomic.add(out, (col, c), data[0])
                            else:
                                cuda.atomic.add(out, (col, c), data[p])
                        else:
                            cuda.atomic.add(out, (col, c), (data[0] if homo else data[p]) * x)

    return _named(mm_scatter, _NAMES[flavour] % "mm_scatter")


# weight gradient: g[k] = <r[row k], q[indices[k]]> into a zero-filled, aliased
# g; one warp per row, lanes striding over its synapses.  Five modes (see
# ops.sddmm_mode): "values" (float r and q: the IEEE product on every row),
# "r_events" (bool r: silent rows skipped, q selected by r), "q_events" (bool
# q, float r: r selected by q; rows with r == 0 skipped, their terms being 0),
# and, on (n, k) matrices only (vectors run as (n, 1)), "r_weighted" (rows of
# all-zero r skipped, g = sum where(r != 0, r q, 0)) and "q_weighted" (every
# row: r == 0 meets a nonzero q by IEEE, g = sum where(q != 0, r q, 0)).  An
# event selects (``if``), it never multiplies.
def _sddmm_vec(mode: str):
    VALUES, R_EVENTS, Q_EVENTS = mode == "values", mode == "r_events", mode == "q_events"

    def sddmm_vec(indices, indptr, r, q, zeros, g):
        t = cuda.threadIdx.x
        lane = t % 32
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
        if row < r.shape[0]:
            ri = r[row]
            if VALUES or ri != 0:  # skipped rows cost nothing: their entries keep the zeros
                nnz = indices.shape[0]
                start = indptr[row] if indptr[row] > 0 else 0
                end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
                for p in range(start + lane, end, 32):
                    col = indices[p]
                    if col >= 0 and col < q.shape[0]:
                        if R_EVENTS:
                            g[p] = q[col]
                        elif Q_EVENTS:
                            g[p] = ri if q[col] else g.dtype.type(0)
                        else:
                            g[p] = ri * q[col]

    return _named(sddmm_vec, "sddmm_vec" if VALUES else f"sddmm_vec_{mode}")


def _sddmm_mat(mode: str):
    R_EVENTS, Q_EVENTS = mode == "r_events", mode == "q_events"
    R_WEIGHTED, Q_WEIGHTED = mode == "r_weighted", mode == "q_weighted"
    SKIPS = R_EVENTS or Q_EVENTS or R_WEIGHTED  # rows of all-zero r: every term is 0

    def sddmm_mat(indices, indptr, r, q, zeros, g):
        t = cuda.threadIdx.x
        lane = t % 32
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + t // 32
        if row < r.shape[0]:
            width = r.shape[1]
            active = True
            if SKIPS:
                active = False
                for c in range(width):
                    if r[row, c] != 0:
                        active = True
                        break
            if active:  # skipped rows cost nothing: their entries keep the zeros
                nnz = indices.shape[0]
                start = indptr[row] if indptr[row] > 0 else 0
                end = indptr[row + 1] if indptr[row + 1] < nnz else nnz
                for p in range(start + lane, end, 32):
                    col = indices[p]
                    if col >= 0 and col < q.shape[0]:
                        acc = g.dtype.type(0)
                        for c in range(width):
                            if R_EVENTS:
                                if r[row, c]:
                                    acc += q[col, c]
                            elif Q_EVENTS:
                                if q[col, c]:
                                    acc += r[row, c]
                            elif R_WEIGHTED:
                                if r[row, c] != 0:
                                    acc += r[row, c] * q[col, c]
                            elif Q_WEIGHTED:
                                if q[col, c] != 0:
                                    acc += r[row, c] * q[col, c]
                            else:
                                acc += r[row, c] * q[col, c]
                        g[p] = acc

    return _named(sddmm_mat, "sddmm_mat" if mode == "values" else f"sddmm_mat_{mode}")


_FACTORIES = {("mv", False): _mv_gather, ("mv", True): _mv_scatter, ("mm", False): _mm_gather,
              ("mm", True): _mm_scatter}

# (kind, event, transpose) -> kernel, kind "mv" or "mm": values (event False) and events (True)
KERNELS = {(kind, flavour == "events", transpose): factory(flavour)
           for flavour in ("values", "events") for (kind, transpose), factory in _FACTORIES.items()}
# (kind, transpose) -> kernel of weighted events
WEIGHTED_KERNELS = {key: factory("weighted") for key, factory in _FACTORIES.items()}
# binary_csrmv_active_p's scatter over a list of active rows
LISTED_KERNEL = _mv_scatter_listed()

# (kind, mode) -> kernel; kind "vec" (r, q vectors) or "mat" (r (n_rows, k), q (n_cols, k)),
# mode as ops.sddmm_mode (the weighted modes: "mat" only)
SDDMM_KERNELS = {("vec", mode): _sddmm_vec(mode) for mode in ("values", "r_events", "q_events")}
SDDMM_KERNELS.update({("mat", mode): _sddmm_mat(mode)
                      for mode in ("values", "r_events", "q_events", "r_weighted", "q_weighted")})


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


# ---------------------------------------------------------------------------
# generators (the ops' backend slot)
# ---------------------------------------------------------------------------
def _matmul_generator(kind: str, event: bool):
    def generator(outs, ins, shape, transpose, weighted=False):
        out = outs[0]
        dtype = compute_dtype(out.dtype)
        transpose = bool(transpose)
        if weighted:  # values that select, then multiply
            kernel = WEIGHTED_KERNELS[(kind, transpose)]
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
            data = as_dtype(data, dtype)
            x = as_bool_events(x) if event and not weighted else as_dtype(x, dtype)
            if transpose:
                y = call(data, indices, indptr, x, jnp.zeros(out_shape, dtype))
            else:
                y = call(data, indices, indptr, x)
            return [as_dtype(y, out.dtype)]

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


def binary_csrmv_active_numba_cuda(outs, ins, shape):
    """Numba CUDA kernel generator for ``binary_csrmv_active_p``: one warp per slot of the list of
    active rows (the spikes operand is not read).

    Returns:
        ``run(data, indices, indptr, active_ids, n_active, v) -> [out]``.
    """
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    out_shape = tuple(int(d) for d in out.shape)
    call = numba_cuda_kernel(LISTED_KERNEL, jax.ShapeDtypeStruct(out_shape, dtype), input_output_aliases={5: 0},
                             **_warp_per_row(int(ins[3].shape[0])))

    def run(data, indices, indptr, active_ids, n_active, v):
        y = call(as_dtype(data, dtype), indices, indptr, active_ids, n_active, jnp.zeros(out_shape, dtype))
        return [as_dtype(y, out.dtype)]

    return run


def csr_sddmm_numba_cuda(outs, ins, shape, weighted):
    """Numba CUDA kernel generator for ``csr_sddmm_p``: ``g[k] = <r[row k], q[indices[k]]>``.

    Args:
        outs: the op's single output, ``(nnz,)``.
        ins: the input avals ``(indices, indptr, r, q)``; ``r`` and ``q`` both
            vectors or both matrices (``(n_rows, k)``, ``(n_cols, k)``).
        shape: ``(n_rows, n_cols)`` of the CSR matrix (unused: ``r`` gives the rows).
        weighted: ``"r"`` or ``"q"``: that operand holds weighted events
            (the ``"mat"`` kernels of :data:`SDDMM_KERNELS`; vectors run as ``(n, 1)``).

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
    if weighted is not None and len(r_in.shape) == 1:
        as_matrix = lambda a: a[:, None]  # noqa: E731
    kernel = SDDMM_KERNELS[("mat" if len(r_in.shape) == 2 or weighted is not None else "vec", mode)]
    nnz = int(out.shape[0])
    call = numba_cuda_kernel(kernel, jax.ShapeDtypeStruct((nnz,), dtype), input_output_aliases={4: 0},
                             **_warp_per_row(int(r_in.shape[0])))

    def run(indices, indptr, r, q):
        r = r if mode == "r_events" else as_matrix(as_dtype(r, dtype))
        q = q if mode == "q_events" else as_matrix(as_dtype(q, dtype))
        g = call(indices, indptr, r, q, jnp.zeros((nnz,), dtype))
        return [as_dtype(g, out.dtype)]

    return run


for _op, _generator in ((ops.csrmv_p, csrmv_numba_cuda), (ops.csrmm_p, csrmm_numba_cuda),
                        (ops.binary_csrmv_p, binary_csrmv_numba_cuda),
                        (ops.binary_csrmm_p, binary_csrmm_numba_cuda),
                        (ops.binary_csrmv_active_p, binary_csrmv_active_numba_cuda),
                        (ops.csr_sddmm_p, csr_sddmm_numba_cuda)):
    _op.def_numba_cuda_kernel(_generator)
