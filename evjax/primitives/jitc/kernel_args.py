"""What every JITC kernel backend passes its kernels besides the operand, and the generators that pass it:
host-side, no kernel library."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ...dtypes import compute_dtype
from . import ops
from .generation import gap_multiplier

__all__ = ["config", "params_array", "operand_values", "matmul_generator", "dense_generator"]


def config(prob: float, flag: bool, n_inner: int) -> np.ndarray:
    """``cfg``: ``[R, S, flag, expected fan-out]`` (uint32; see :func:`.generation.gap_multiplier`)."""
    r, s = gap_multiplier(prob)
    return np.array([r, s, int(flag), min(int(np.ceil(prob * n_inner)), 2**32 - 1)], np.uint32)


def params_array(params, n: int, dtype):
    """The law's parameters as one ``(2,)`` array of the compute dtype (a scalar law pads a 0)."""
    values = [p.reshape(1).astype(dtype) for p in params[:n]]
    return jnp.concatenate(values + [jnp.zeros((2 - n,), dtype)] if n < 2 else values)


def operand_values(x, event: bool, weighted: bool, dtype):
    """The operand as the kernels read it: spikes as 1.0/0.0, weighted events and floats as values."""
    if event and not weighted:
        return (x != 0).astype(dtype)
    return x.astype(dtype)


def matmul_generator(law: str, event: bool, launcher):
    """The generator of the matmul ops of ``law`` (mv and mm, float or events) on one backend.

    Args:
        law: "scalar", "normal" or "uniform".
        event: whether the ops take events.
        launcher: the backend's ``launcher(law, kind, dtype, out_shape, launch)``, ``kind`` one of
            ``gather_mv``, ``gather_mm`` (``corder``), ``scatter_mv``, ``scatter_mm``, ``launch`` the
            outer indices the kernel visits (a gather: the outputs asked for, all or a device's slice;
            a scatter: the inputs); it returns ``call(params, seed, cfg, x) -> y`` in the compute
            dtype.

    Returns:
        ``generator(outs, ins, shape, prob, transpose, corder, weighted=False) -> run(*args)``.
    """
    n = ops.LAWS[law]

    def generator(outs, ins, shape, prob, transpose, corder, weighted=False):
        out = outs[0]
        dtype = compute_dtype(out.dtype)
        n_outer, n_inner = ops.generated_shape(shape, transpose, corder)
        kind = ("gather_" if corder else "scatter_") + ("mv" if len(ins[n + 1].shape) == 1 else "mm")
        cfg = config(prob, event, n_inner)
        out_shape = tuple(int(d) for d in out.shape)
        call = launcher(law, kind, dtype, out_shape, out_shape[0] if corder else n_outer)

        def run(*args):
            x = operand_values(args[n + 1], event, weighted, dtype)
            return [call(params_array(args[:n], n, dtype), args[n], jnp.asarray(cfg), x).astype(out.dtype)]

        return run

    return generator


def dense_generator(law: str, launcher):
    """The generator of the materialiser of ``law`` on one backend.

    Args:
        law: "scalar", "normal" or "uniform".
        launcher: as for :func:`matmul_generator`, called with ``kind="dense"`` and ``launch`` the outer
            indices (``G``'s rows); its ``call(params, seed, cfg) -> y`` writes ``G`` (``cfg[2]``,
            ``corder``) or ``G.T``.

    Returns:
        ``generator(outs, ins, shape, prob, transpose, corder) -> run(*args)``.
    """
    n = ops.LAWS[law]

    def generator(outs, ins, shape, prob, transpose, corder):
        out = outs[0]
        dtype = compute_dtype(out.dtype)
        n_outer, n_inner = ops.generated_shape(shape, transpose, corder)
        cfg = config(prob, corder, n_inner)  # flag: G written directly (corder) or transposed
        call = launcher(law, "dense", dtype, tuple(int(d) for d in out.shape), n_outer)

        def run(*args):
            return [call(params_array(args[:n], n, dtype), args[n], jnp.asarray(cfg)).astype(out.dtype)]

        return run

    return generator
