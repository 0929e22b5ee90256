"""Numba kernels shared by the foundation tests (a real module, so their
handlers are cached on disk between test runs)."""
import numba
import numpy as np


@numba.njit(cache=True)
def add_kernel(x, y, out):
    for i in range(out.size):
        out[i] = x[i] + y[i]


@numba.njit(cache=True)
def copy_any_rank(x, out):
    flat_in = x.reshape(x.size)
    flat_out = out.reshape(out.size)
    for i in range(flat_out.size):
        flat_out[i] = flat_in[i]


@numba.njit(cache=True)
def sum_any_rank(x, out):
    out[0] = x.sum()


@numba.njit(parallel=True, cache=True)
def parallel_scale_kernel(x, s, out):
    for i in numba.prange(out.size):
        out[i] = x[i] * s[0]


@numba.njit(cache=True)
def split_kernel(x, doubled, tripled):
    for i in range(x.size):
        doubled[i] = x[i] * 2
        tripled[i] = x[i] * 3


@numba.njit(cache=True)
def gather_kernel(x, idx, out):
    for i in range(out.size):
        out[i] = x[idx[i]]


@numba.njit(cache=True)
def increment_in_place(x, out):
    for i in range(out.size):
        out[i] = out[i] + 1.0


@numba.njit(boundscheck=True, cache=True)
def overrun_kernel(x, out):
    for i in range(out.size + 3):
        out[i] = x[i]


@numba.njit(cache=True)
def raising_kernel(x, out):
    if x[0] < 0:
        raise ValueError("x[0] must be non-negative")
    out[0] = x[0]


@numba.njit(parallel=True, cache=True)
def parallel_raising_kernel(x, out):
    for i in numba.prange(out.size):
        if x[i] < 0:
            raise ValueError("negative entry")
        out[i] = x[i]


@numba.njit("void(float32[:], float32[:])", cache=True)
def declared_kernel(x, out):
    for i in range(out.size):
        out[i] = x[i]


def plain_python(x, out):
    out[:] = x


DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]


def make_add_one():
    """A kernel factory: each call returns a new function object of the same content
    (as a factory called twice, or a notebook cell run again)."""

    @numba.njit
    def add_one(x, out):
        for i in range(out.size):
            out[i] = x[i] + 1.0

    return add_one


add_one_kernel = make_add_one()


@numba.njit(cache=True)
def report_threads(threads, x, out):
    """Writes the thread count its handler passed (plus x[0]): evjax.set_num_threads reaches it."""
    out[0] = threads + x[0]


# A kernel and a serial tier of it that tell apart which one ran (a real tier gives the same bits; these
# differ on purpose): the tier doubles, declines (2) inputs longer than 10 and reports work longer than 5
# as splittable (1); the full kernel triples.
@numba.njit(cache=True, nogil=True)
def tripling_kernel(threads, x, out):
    for i in range(out.size):
        out[i] = x[i] * 3


@numba.njit(cache=True, nogil=True)
def doubling_tier(threads, x, out):
    if x.size > 10:
        return np.int64(2)
    for i in range(out.size):
        out[i] = x[i] * 2
    return np.int64(1) if x.size > 5 else np.int64(0)


@numba.njit(cache=True, nogil=True)
def mistyped_kernel(threads, x, out):
    out[0] = x  # an array into a scalar: does not compile


@numba.njit(cache=True, nogil=True)
def raising_tier(threads, x, out):
    if x.size >= 0:
        raise ValueError("the tier raised")
    return np.int64(0)


@numba.njit(cache=True, nogil=True)
def bool_tier(threads, x, out):
    return True


@numba.njit(cache=True)
def fill_rows(x, out):
    """``out[i, j] = x[i]``: writes every element of a (possibly large) output."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = x[i]
