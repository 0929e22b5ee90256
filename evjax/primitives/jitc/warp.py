"""Warp backend of the JITC ops (float and event; mv and mm; gather and scatter; dense), CPU and GPU.

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops run with ``backend="warp"``; it
registers its generators (:mod:`.kernel_args`'s, with :func:`_launcher`) as the ``"warp"`` backend of every
JITC op.
The generation scheme is :mod:`.generation`'s, on Warp's ``uint32`` (which
wraps, as C does) with the gap's product in ``uint64``; the two integer tables
are passed to the kernels as operands.  Kernels, one thread per outer index:

* gather (``corder=True``): the thread of output ``o`` regenerates its stream
  and accumulates ``sum_i w_oi x[i]`` (every synapse generated; pure output);
* scatter (``corder=False``): the thread of input ``o`` returns at once for a
  zero ``x[o]`` when zeros are skipped (events), else regenerates its stream
  and adds ``w_oi x[o]`` with ``wp.atomic_add`` into an in-out buffer of zeros
  (the order of the atomic sums is not fixed: results within rounding of the
  other backends; the *structure* is bitwise theirs);
* dense: ``G`` (or ``G.T``) written into a matrix of zeros.

The five kernels of one (law, dtype) live in one Warp module, compiled once
and then loaded from Warp's kernel cache.  Events arrive as floats with the
skip flag (``cfg[2]``), as for Numba: spikes 1.0/0.0, weighted events their values.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np

from ...backends import warp as bridge
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops
from .generation import TWO_LN2, cos_table, log2_table
from .kernel_args import dense_generator, matmul_generator

__all__ = ["jitc_kernels"]

wp = bridge.import_warp()
_lock = threading.Lock()


def _scheme(t):
    """The generation scheme as Warp functions of ``t``'s module."""
    U = wp.uint32

    @wp.func(module=t.module)
    def mix32(x: wp.uint32):
        x = x ^ (x >> U(16))
        x = x * U(0x7FEB352D)
        x = x ^ (x >> U(15))
        x = x * U(0x846CA68B)
        return x ^ (x >> U(16))

    @wp.func(module=t.module)
    def draw(ka: wp.uint32, kb: wp.uint32, c: wp.uint32):
        return mix32(mix32(c ^ ka) + kb)

    @wp.func(module=t.module)
    def shift_if_below(u: wp.uint32, e: wp.uint32, bits: wp.uint32, limit: wp.uint32):
        if u < limit:
            return u << bits, e + bits
        return u, e

    @wp.func(module=t.module)
    def neg_log2_q24(h: wp.uint32, log2t: t.U1):
        u = h
        if u == U(0):
            u = U(1)
        # u shifted left by e until its top bit is set (a binary search over e): h = u 2^-e
        u, e = shift_if_below(u, U(0), U(16), U(65536))
        u, e = shift_if_below(u, e, U(8), U(16777216))
        u, e = shift_if_below(u, e, U(4), U(268435456))
        u, e = shift_if_below(u, e, U(2), U(1073741824))
        u, e = shift_if_below(u, e, U(1), U(2147483648))
        idx = int((u >> U(21)) & U(1023))
        frac = (u >> U(5)) & U(0xFFFF)
        lo = log2t[idx]
        return ((e + U(1)) << U(24)) - (lo + (((log2t[idx + 1] - lo) * frac) >> U(16)))

    @wp.func(module=t.module)
    def gap(ka: wp.uint32, kb: wp.uint32, k: int, cfg: t.U1, log2t: t.U1, cap: int):
        e2 = wp.uint64(neg_log2_q24(draw(ka, kb, U(k) * U(4)), log2t))
        g = (e2 * wp.uint64(cfg[0])) >> wp.uint64(cfg[1])
        if g > wp.uint64(cap):
            return cap
        return int(g)

    t.mix32, t.draw, t.neg_log2_q24, t.gap = mix32, draw, neg_log2_q24, gap


def _law(t, law: str):
    """``weight(ka, kb, k, params, log2t, cost)``: the law's formula (see :mod:`.generation`)."""
    U, F = wp.uint32, t.F
    draw, neg_log2_q24 = t.draw, t.neg_log2_q24
    if law == "scalar":
        @wp.func(module=t.module)
        def weight(ka: wp.uint32, kb: wp.uint32, k: int, params: t.F1, log2t: t.U1, cost: t.U1):
            return params[0]  # w
    elif law == "uniform":
        @wp.func(module=t.module)
        def weight(ka: wp.uint32, kb: wp.uint32, k: int, params: t.F1, log2t: t.U1, cost: t.U1):
            u = wp.float32(draw(ka, kb, U(k) * U(4) + U(1)) >> U(8)) * wp.float32(5.9604644775390625e-08)
            return params[0] + (params[1] - params[0]) * F(u)  # w = low + (high - low) u
    else:
        @wp.func(module=t.module)
        def weight(ka: wp.uint32, kb: wp.uint32, k: int, params: t.F1, log2t: t.U1, cost: t.U1):
            e2 = wp.float32(neg_log2_q24(draw(ka, kb, U(k) * U(4) + U(1)), log2t)) * wp.float32(5.9604644775390625e-08)
            radius = wp.sqrt(wp.float32(TWO_LN2) * e2)
            h2 = draw(ka, kb, U(k) * U(4) + U(2))
            idx = int(h2 >> U(22))
            frac = (h2 >> U(14)) & U(255)
            c = (cost[idx] * (U(256) - frac) + cost[idx + 1] * frac) >> U(8)
            cosine = wp.float32(wp.int32(c) - 4194304) * wp.float32(2.384185791015625e-07)
            return params[0] + params[1] * F(radius * cosine)  # w = loc + scale z

    return weight


def _kernels(t, weight):
    mix32, gap = t.mix32, t.gap
    U = wp.uint32

    @wp.func(module=t.module)
    def first_outer(seed: t.U1):  # the first outer index of a device's slice of the outputs (seed[1]), else 0
        first = int(0)
        if seed.shape[0] > 1:
            first = int(seed[1])
        return first

    @wp.func(module=t.module)
    def keys(seed: wp.uint32, o: int):
        s = mix32(seed)
        ka = mix32(U(o) * U(0x9E3779B9) + s)
        return ka, mix32(ka ^ mix32(seed ^ U(0x85EBCA6B)))

    @wp.kernel(**t.opts)
    def gather_mv(params: t.F1, seed: t.U1, cfg: t.U1, log2t: t.U1, cost: t.U1, x: t.F1, out: t.F1):
        o = wp.tid()
        ka, kb = keys(seed[0], first_outer(seed) + o)
        n = x.shape[0]
        acc = t.F(0.0)
        pos = int(-1)
        k = int(0)
        while True:
            pos = pos + 1 + gap(ka, kb, k, cfg, log2t, n)
            if pos >= n:
                break
            xi = x[pos]
            if cfg[2] == U(0) or xi != t.F(0.0):
                acc = acc + weight(ka, kb, k, params, log2t, cost) * xi
            k = k + 1
        out[o] = acc

    @wp.kernel(**t.opts)
    def gather_mm(params: t.F1, seed: t.U1, cfg: t.U1, log2t: t.U1, cost: t.U1, x: t.F2, out: t.F2):
        o = wp.tid()
        ka, kb = keys(seed[0], first_outer(seed) + o)
        n = x.shape[0]
        pos = int(-1)
        k = int(0)
        while True:
            pos = pos + 1 + gap(ka, kb, k, cfg, log2t, n)
            if pos >= n:
                break
            w = weight(ka, kb, k, params, log2t, cost)
            for c in range(x.shape[1]):
                xi = x[pos, c]
                if cfg[2] == U(0) or xi != t.F(0.0):
                    out[o, c] = out[o, c] + w * xi
            k = k + 1

    @wp.kernel(**t.opts)
    def scatter_mv(params: t.F1, seed: t.U1, cfg: t.U1, log2t: t.U1, cost: t.U1, x: t.F1, out: t.F1):
        o = wp.tid()
        xo = x[o]
        if cfg[2] != U(0) and xo == t.F(0.0):
            return  # a silent input generates nothing
        ka, kb = keys(seed[0], o)
        n = out.shape[0]
        pos = int(-1)
        k = int(0)
        while True:
            pos = pos + 1 + gap(ka, kb, k, cfg, log2t, n)
            if pos >= n:
                break
            wp.atomic_add(out, pos, weight(ka, kb, k, params, log2t, cost) * xo)
            k = k + 1

    @wp.kernel(**t.opts)
    def scatter_mm(params: t.F1, seed: t.U1, cfg: t.U1, log2t: t.U1, cost: t.U1, x: t.F2, out: t.F2):
        o = wp.tid()
        width = x.shape[1]
        if cfg[2] != U(0):
            active = int(0)
            for c in range(width):
                if x[o, c] != t.F(0.0):
                    active = active + 1
            if active == 0:
                return
        ka, kb = keys(seed[0], o)
        n = out.shape[0]
        pos = int(-1)
        k = int(0)
        while True:
            pos = pos + 1 + gap(ka, kb, k, cfg, log2t, n)
            if pos >= n:
                break
            w = weight(ka, kb, k, params, log2t, cost)
            for c in range(width):
                xo = x[o, c]
                if cfg[2] == U(0) or xo != t.F(0.0):
                    wp.atomic_add(out, pos, c, w * xo)
            k = k + 1

    @wp.kernel(**t.opts)
    def dense(params: t.F1, seed: t.U1, cfg: t.U1, log2t: t.U1, cost: t.U1, out: t.F2):
        o = wp.tid()
        ka, kb = keys(seed[0], o)
        direct = cfg[2] != U(0)
        n = out.shape[1]
        if not direct:
            n = out.shape[0]
        pos = int(-1)
        k = int(0)
        while True:
            pos = pos + 1 + gap(ka, kb, k, cfg, log2t, n)
            if pos >= n:
                break
            w = weight(ka, kb, k, params, log2t, cost)
            if direct:
                out[o, pos] = w
            else:
                out[pos, o] = w
            k = k + 1

    return {"gather_mv": gather_mv, "gather_mm": gather_mm, "scatter_mv": scatter_mv, "scatter_mm": scatter_mm,
            "dense": dense}


@functools.lru_cache(maxsize=None)
def jitc_kernels(law: str, compute_dt: str) -> dict:
    """The five Warp kernels of one law and compute dtype, in one Warp module."""
    F = jaxtype_to_warptype(compute_dt)
    module = wp.get_module(f"evjax_jitc_{law}_{compute_dt}")
    t = SimpleNamespace(F=F, module=module, opts=dict(enable_backward=False, module=module),
                        F1=wp.array(dtype=F, ndim=1), F2=wp.array(dtype=F, ndim=2),
                        U1=wp.array(dtype=wp.uint32, ndim=1))
    _scheme(t)
    return _kernels(t, _law(t, law))


def _tables():
    return jnp.asarray(log2_table()), jnp.asarray(cos_table())


def _launcher(law: str, kind: str, dtype, out_shape: tuple, launch: int):
    """``call(params, seed, cfg, *operand)``: the kernel of ``kind`` and ``law``, one thread per outer
    index of ``launch``, into an in-out buffer of zeros (``kernel_args.matmul_generator``'s launcher)."""
    with _lock:
        kernel = jitc_kernels(law, str(np.dtype(dtype)))[kind]
    warp_call = warp_kernel(kernel, [], launch_dims=(launch,), in_out_argnames=("out",))

    def call(params, seed, cfg, *operand):
        (y,) = warp_call(params, seed, cfg, *_tables(), *operand, jnp.zeros(out_shape, dtype))
        return y

    return call


for (_law_name, _rank, _event), _op in ops.MATMUL_OPS.items():
    _op.def_warp_kernel(matmul_generator(_law_name, _event, _launcher))
for _law_name, _op in ops.DENSE_OPS.items():
    _op.def_warp_kernel(dense_generator(_law_name, _launcher))
