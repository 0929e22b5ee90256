"""Numba CPU backend of the plasticity ops in :mod:`evjax.primitives.plasticity.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generator on them.  One kernel serves both ops: it copies the
weights, then for each active line (a row for ``update_csr_on_binary_pre``, a
column of the CSC view for ``_post``) moves the weight of each entry by the
trace of its other end and clips it.  ``positions`` is empty for the row view
(an entry is its own weight position) and ``weight_indices`` for the column
view.  Serial: each synapse is written at most once per call (the positions
are a permutation), so the order of the lines cannot change a bit, and the
work (the synapses of active lines) is small next to the copy.

Spikes reach the kernel as bytes (``s != 0`` computed by XLA before the call),
so one compiled kernel per weight and index dtype serves bool, integer and
float spikes.  float16 and bfloat16 are computed in float32, as the reference
does.
"""
from __future__ import annotations

import jax.numpy as jnp
import numba

from ..._kernel_compat import COMPILED_CODE_ONLY
from ...backends import numba_cpu
from ...dtypes import compute_dtype
from . import ops

__all__ = ["update_lines", "update_generator"]


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def update_lines(weight, indices, indptr, positions, trace, spikes, bounds, out):
    """``out = weight``, then ``out[p] = clip(out[p] + trace[indices[e]])`` for each entry ``e`` of each
    line ``i`` with ``spikes[i]``; ``p = positions[e]``, or ``e`` when ``positions`` is empty."""
    for k in range(weight.shape[0]):  # an element loop: measured faster here than out[:] = weight, whose
        out[k] = weight[k]            # stores left the updates below slower (1.2 vs 0.8 ms at 2e6 synapses)
    lo, hi = bounds[0], bounds[1]
    direct = positions.shape[0] == 0
    for i in range(spikes.shape[0]):
        if spikes[i]:
            for e in range(indptr[i], indptr[i + 1]):
                p = e if direct else positions[e]
                v = out[p] + trace[indices[e]]
                if lo != lo or v < lo:  # max(v, lo), NaN propagated
                    v = lo
                if hi != hi or v > hi:  # min(v, hi), NaN propagated
                    v = hi
                out[p] = v
    return


def update_generator(outs, ins, indirect: bool, clip_min: bool, clip_max: bool):
    """Numba kernel for ``update_csr_on_binary_pre_p`` / ``update_csr_on_binary_post_p``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)

    def kernel(*args):
        weight, indices, indptr, positions, trace, spikes, bounds = ops._lines(args, indirect)
        if positions is None:
            positions = jnp.zeros((0,), indices.dtype)
        active = spikes != 0
        w, t, b = (x if x.dtype == dtype else x.astype(dtype) for x in (weight, trace, bounds))
        y = numba_cpu.call(update_lines, (w, indices, indptr, positions, t, active, b), out.shape, dtype,
                           threads=False, bool_as_bytes=True)
        return [y.astype(out.dtype)]

    return kernel


for _op in ops.OPS:
    _op.def_numba_kernel(update_generator)
