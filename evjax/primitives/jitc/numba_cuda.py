"""Numba CUDA backend of the JITC ops (backend ``"numba_cuda"``, GPU; kernel logic tested in the simulator).

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops need this backend; it registers its
generators (:mod:`.kernel_args`'s, with :func:`_launcher`) at the bottom.  One thread per outer index (blocks of
:data:`THREADS`), as in the Warp backend: a gather thread regenerates its
output's stream and accumulates; a scatter thread returns at once for a
silent input (events), else adds its synapses with ``cuda.atomic.add`` into an
aliased buffer of zeros; the dense kernel writes ``G`` or ``G.T`` into zeros.

The generation scheme is :mod:`.generation`'s, written as inlined device
functions on ``uint64`` values masked to 32 bits (Numba widens ``uint32``
products, as on the CPU), the two integer tables module globals (constant
memory).  One kernel per (kind, law), made by :func:`_kernels` with the law's
weight function closed over; kernel arguments ``(params, seed, cfg, x, zeros,
out)`` (``out`` aliases ``zeros``), ``cfg`` as in :mod:`.kernel_args`.

Unlike the CSR kernels these call device functions, so compiling their PTX
needs a GPU (or the simulator).
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from numba import cuda

from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops
from .generation import TWO_LN2, cos_table, log2_table
from .kernel_args import dense_generator, matmul_generator

__all__ = ["THREADS", "kernels"]

THREADS = 128
_LOG2 = log2_table().astype(np.uint64)
_COS = cos_table().astype(np.uint64)
_M32 = np.uint64(0xFFFFFFFF)
_TWO_LN2 = np.float32(TWO_LN2)
_S24 = np.float32(2.0 ** -24)
_S22 = np.float32(2.0 ** -22)
_device = cuda.jit(device=True, inline=True)


@_device
def _mix32(x):
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & _M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & _M32
    return x ^ (x >> np.uint64(16))


@_device
def _draw(ka, kb, c):
    return _mix32((_mix32(c ^ ka) + kb) & _M32)


@_device
def _first_outer(seed):
    """The global index of the first outer index a gather computes: ``seed[1]`` when the seed operand
    carries it (a device's slice of the outputs, see ``ops._matmul_partition``), else 0."""
    return np.int64(seed[1]) if seed.shape[0] > 1 else np.int64(0)


@_device
def _keys(seed, o):
    s = _mix32(seed)
    ka = _mix32((np.uint64(o) * np.uint64(0x9E3779B9) + s) & _M32)
    return ka, _mix32(ka ^ _mix32(seed ^ np.uint64(0x85EBCA6B)))


@_device
def _shift_if_below(u, e, bits, limit):
    t = bits if u < limit else np.uint64(0)
    return u << t, e + t


@_device
def _neg_log2_q24(h):
    u = h if h > np.uint64(0) else np.uint64(1)
    e = np.uint64(0)
    u, e = _shift_if_below(u, e, np.uint64(16), np.uint64(1 << 16))
    u, e = _shift_if_below(u, e, np.uint64(8), np.uint64(1 << 24))
    u, e = _shift_if_below(u, e, np.uint64(4), np.uint64(1 << 28))
    u, e = _shift_if_below(u, e, np.uint64(2), np.uint64(1 << 30))
    u, e = _shift_if_below(u, e, np.uint64(1), np.uint64(1 << 31))
    idx = (u >> np.uint64(21)) & np.uint64(1023)
    frac = (u >> np.uint64(5)) & np.uint64(0xFFFF)
    lo = _LOG2[idx]
    return ((e + np.uint64(1)) << np.uint64(24)) - (lo + (((_LOG2[idx + np.uint64(1)] - lo) * frac) >> np.uint64(16)))


@_device
def _gap(ka, kb, k, r, s, cap):
    g = (_neg_log2_q24(_draw(ka, kb, k * np.uint64(4))) * r) >> s
    return np.int64(g) if g < cap else np.int64(cap)


@_device
def _w_scalar(ka, kb, k, p0, p1):
    return p0  # w


@_device
def _w_uniform(ka, kb, k, p0, p1):
    u = np.float32(_draw(ka, kb, k * np.uint64(4) + np.uint64(1)) >> np.uint64(8)) * _S24
    return p0 + (p1 - p0) * u  # w = low + (high - low) u


@_device
def _w_normal(ka, kb, k, p0, p1):
    e2 = np.float32(_neg_log2_q24(_draw(ka, kb, k * np.uint64(4) + np.uint64(1)))) * _S24
    radius = math.sqrt(_TWO_LN2 * e2)
    h2 = _draw(ka, kb, k * np.uint64(4) + np.uint64(2))
    idx = h2 >> np.uint64(22)
    frac = (h2 >> np.uint64(14)) & np.uint64(255)
    c = (_COS[idx] * (np.uint64(256) - frac) + _COS[idx + np.uint64(1)] * frac) >> np.uint64(8)
    cosine = np.float32(np.int64(c) - np.int64(1 << 22)) * _S22
    return p0 + p1 * np.float32(np.float32(radius) * cosine)  # w = loc + scale z


_WEIGHTS = {"scalar": _w_scalar, "normal": _w_normal, "uniform": _w_uniform}


@functools.lru_cache(maxsize=None)
def kernels(law: str) -> dict:
    """The five kernels of ``law``: ``gather_mv``, ``gather_mm``, ``scatter_mv``, ``scatter_mm``, ``dense``."""
    weight = _WEIGHTS[law]

    @cuda.jit
    def gather_mv(params, seed, cfg, x, zeros, out):
        o = cuda.grid(1)
        if o >= out.shape[0]:
            return
        ka, kb = _keys(np.uint64(seed[0]), _first_outer(seed) + o)
        n = x.shape[0]
        r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
        acc = zeros[o]  # 0 in the output's dtype
        pos = np.int64(-1)
        k = np.uint64(0)
        while True:
            pos += 1 + _gap(ka, kb, k, r, s, np.uint64(n))
            if pos >= n:
                break
            xi = x[pos]
            if not (skip and xi == 0):
                acc += weight(ka, kb, k, params[0], params[1]) * xi
            k += np.uint64(1)
        out[o] = acc

    @cuda.jit
    def gather_mm(params, seed, cfg, x, zeros, out):
        o = cuda.grid(1)
        if o >= out.shape[0]:
            return
        ka, kb = _keys(np.uint64(seed[0]), _first_outer(seed) + o)
        n = x.shape[0]
        r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
        pos = np.int64(-1)
        k = np.uint64(0)
        while True:
            pos += 1 + _gap(ka, kb, k, r, s, np.uint64(n))
            if pos >= n:
                break
            w = weight(ka, kb, k, params[0], params[1])
            for c in range(x.shape[1]):
                xi = x[pos, c]
                if not (skip and xi == 0):
                    out[o, c] += w * xi
            k += np.uint64(1)

    @cuda.jit
    def scatter_mv(params, seed, cfg, x, zeros, out):
        o = cuda.grid(1)
        if o >= x.shape[0]:
            return
        xo = x[o]
        if cfg[2] != 0 and xo == 0:
            return  # a silent input generates nothing
        ka, kb = _keys(np.uint64(seed[0]), o)
        n = out.shape[0]
        r, s = np.uint64(cfg[0]), np.uint64(cfg[1])
        pos = np.int64(-1)
        k = np.uint64(0)
        while True:
            pos += 1 + _gap(ka, kb, k, r, s, np.uint64(n))
            if pos >= n:
                break
            cuda.atomic.add(out, pos, weight(ka, kb, k, params[0], params[1]) * xo)
            k += np.uint64(1)

    @cuda.jit
    def scatter_mm(params, seed, cfg, x, zeros, out):
        o = cuda.grid(1)
        if o >= x.shape[0]:
            return
        skip = cfg[2] != 0
        if skip:
            active = 0
            for c in range(x.shape[1]):
                if x[o, c] != 0:
                    active += 1
            if active == 0:
                return
        ka, kb = _keys(np.uint64(seed[0]), o)
        n = out.shape[0]
        r, s = np.uint64(cfg[0]), np.uint64(cfg[1])
        pos = np.int64(-1)
        k = np.uint64(0)
        while True:
            pos += 1 + _gap(ka, kb, k, r, s, np.uint64(n))
            if pos >= n:
                break
            w = weight(ka, kb, k, params[0], params[1])
            for c in range(x.shape[1]):
                xo = x[o, c]
                if not (skip and xo == 0):
                    cuda.atomic.add(out, (pos, c), w * xo)
            k += np.uint64(1)

    @cuda.jit
    def dense(params, seed, cfg, zeros, out):
        o = cuda.grid(1)
        direct = cfg[2] != 0
        n_outer = out.shape[0] if direct else out.shape[1]
        n = out.shape[1] if direct else out.shape[0]
        if o >= n_outer:
            return
        ka, kb = _keys(np.uint64(seed[0]), o)
        r, s = np.uint64(cfg[0]), np.uint64(cfg[1])
        pos = np.int64(-1)
        k = np.uint64(0)
        while True:
            pos += 1 + _gap(ka, kb, k, r, s, np.uint64(n))
            if pos >= n:
                break
            w = weight(ka, kb, k, params[0], params[1])
            if direct:
                out[o, pos] = w
            else:
                out[pos, o] = w
            k += np.uint64(1)

    return {"gather_mv": gather_mv, "gather_mm": gather_mm, "scatter_mv": scatter_mv, "scatter_mm": scatter_mm,
            "dense": dense}


def _blocks(n: int) -> dict:
    return dict(grid=max(math.ceil(n / THREADS), 1), block=THREADS)


def _launcher(law: str, kind: str, dtype, out_shape: tuple, launch: int):
    """``call(params, seed, cfg, *operand)``: the kernel of ``kind`` and ``law``, one thread per outer
    index of ``launch``, into an aliased buffer of zeros (``kernel_args.matmul_generator``'s launcher)."""
    zeros_at = 3 if kind == "dense" else 4  # the zeros' argument: after params, seed, cfg (and x)
    kernel = numba_cuda_kernel(kernels(law)[kind], jax.ShapeDtypeStruct(out_shape, dtype),
                               input_output_aliases={zeros_at: 0}, **_blocks(launch))

    def call(*args):
        return kernel(*args, jnp.zeros(out_shape, dtype))

    return call


for (_law, _rank, _event), _op in ops.MATMUL_OPS.items():
    _op.def_numba_cuda_kernel(matmul_generator(_law, _event, _launcher))
for _law, _op in ops.DENSE_OPS.items():
    _op.def_numba_cuda_kernel(dense_generator(_law, _launcher))
