"""The list of the active entries of spikes: ``active_list_p``.

``active_list(x)`` gives, for spikes ``x`` of shape ``(n,)`` (or each row of
``(rows, n)``), ``ids``, the positions ``i`` with ``x[i] != 0`` in ascending
order followed by zeros (``(n,)`` integers), and ``count``, how many there are
(``(1,)``).  That is ``jnp.nonzero(x, size=n, fill_value=0)`` and a sum, which
XLA runs as a prefix sum and a scatter over every entry (about 2 ms at
``n = 10^5`` on a 2-core CPU); the Numba kernel is one pass that skips eight
silent bytes at a time.  :meth:`evjax.CompactBinary.from_array` calls it, and
the CSR scatter :func:`evjax.binary_csrmv_active` reads the list.

Outputs are integers: the op has no derivative (the wrapper passes the spikes
through ``stop_gradient`` as bools; gradients in spikes flow through the
spikes themselves, which :class:`evjax.CompactBinary` keeps).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..._event_values import as_bool_events
from ..._validation import INT32_MAX, canonical
from ...xla_custom_kernel import XLACustomKernel

__all__ = ["active_list", "active_list_p", "list_dtype", "empty_lists", "row_lists", "OPS"]


def list_dtype(n: int):
    """The integer dtype of a list of positions in ``[0, n)``: int32, int64 past int32's range."""
    return jnp.int32 if n <= INT32_MAX else jnp.int64


def empty_lists(outs):
    """The kernels' result where there is nothing to list (no entries): zeros of ``outs``' shapes."""
    return [jnp.zeros(o.shape, o.dtype) for o in outs]


def row_lists(outs, ins, build):
    """Every backend's generator: ``run(x) -> [ids, count]`` over the spikes as ``(rows, n)``.

    Args:
        outs: the op's ``(ids, count)`` results.
        ins: the op's operand, the spikes.
        build: ``build(rows, results) -> call``, the backend's kernel as ``call(x) -> (ids, count)`` on
            the ``(rows, n)`` spikes, ``results`` the shapes of its outputs ``(rows, n)`` and ``(rows, 1)``.

    Returns:
        ``run``; where there is no entry, one that gives :func:`empty_lists` and launches nothing.
    """
    ids_out, count_out = outs
    if ids_out.size == 0:  # no entries: nothing to launch
        return lambda x: empty_lists(outs)
    n = ins[0].shape[-1]
    rows = int(ids_out.size // n)
    call = build(rows, [jax.ShapeDtypeStruct((rows, n), ids_out.dtype),
                        jax.ShapeDtypeStruct((rows, 1), count_out.dtype)])

    def run(x):
        ids, count = call(x.reshape((rows, n)))
        return [ids.reshape(ids_out.shape), count.reshape(count_out.shape)]

    return run


# ===========================================================================
# active_list: ids = positions of the nonzero entries (ascending, then zeros), count = how many
# ===========================================================================
def active_list(x, *, backend: str | None = None) -> tuple[jax.Array, jax.Array]:
    """The active entries of spikes ``x`` as an ascending list.

    Args:
        x: spikes, ``(n,)`` or ``(rows, n)`` (each row listed); bool, or a number
            where nonzero means a spike (negative values and NaN are active).
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"`` or ``"reference"``
            (``None``: the platform's default, see the family's docstring).

    Returns:
        ``(ids, count)``: ``ids`` of ``x``'s shape (int32; int64 for ``n`` past
        int32), the active positions of each row in ascending order, then zeros;
        ``count`` of shape ``(1,)`` (``(rows, 1)``), how many.

    Raises:
        ValueError: ``x`` is not 1-d or 2-d.

    Example:
        >>> ids, count = evjax.primitives.compact.active_list(jnp.array([0.0, 2.0, 0.0, -1.0]))
        >>> ids, count      # ([1, 3, 0, 0], [2])
    """
    x = canonical(x)
    if x.ndim not in (1, 2):
        raise ValueError(f"active_list: x must be (n,) or (rows, n), got shape {x.shape}")
    events = jax.lax.stop_gradient(as_bool_events(x))
    n = x.shape[-1]
    dtype = list_dtype(n)
    outs = [jax.ShapeDtypeStruct(x.shape, dtype), jax.ShapeDtypeStruct(x.shape[:-1] + (1,), dtype)]
    ids, count = active_list_p.bind(events, outs=outs, backend=backend)
    return ids, count


active_list_p = XLACustomKernel("evjax_active_list")


def _active_list_reference(x, *, outs):
    # per row: ids = nonzero(x, size=n, fill_value=0), count = sum(x != 0)
    ids_out, count_out = outs
    if ids_out.size == 0:
        return empty_lists(outs)
    n = x.shape[-1]

    def one(row):
        return jnp.nonzero(row, size=n, fill_value=0)[0], jnp.sum(row, dtype=count_out.dtype)

    ids, count = jax.vmap(one)(x.reshape((-1, n)))
    return [ids.astype(ids_out.dtype).reshape(ids_out.shape), count.reshape(count_out.shape)]


def _active_list_batching(args, axes, *, outs, backend):
    # each batch element's rows are rows of one call: x (B, ..., n) -> (B * rows, n), then back
    (x,), (ax,) = args, axes
    x = jnp.moveaxis(x, ax, 0)
    flat = x.reshape((int(np.prod(x.shape[:-1])), x.shape[-1]))
    dtype = outs[0].dtype
    ids, count = active_list_p.bind(
        flat, outs=[jax.ShapeDtypeStruct(flat.shape, dtype), jax.ShapeDtypeStruct((flat.shape[0], 1), dtype)],
        backend=backend)
    return [ids.reshape(x.shape), count.reshape(x.shape[:-1] + (1,))], [0, 0]


active_list_p.def_reference(_active_list_reference)
active_list_p.def_batching_rule(_active_list_batching)

OPS = (active_list_p,)
