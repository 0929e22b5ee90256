"""``ShardedCSR``: one CSR matrix split by postsynaptic neuron (column blocks) across devices.

Model parallelism for a network too big for one device: device ``d`` of a
mesh axis holds only the synapses onto its block of postsynaptic neurons
(columns ``[d * n_cols / D, (d + 1) * n_cols / D)``), as a CSR of its own,
and computes only its block of ``spikes @ W``.  The spikes are replicated
(a network all-gathers them once per step); nothing of the matrix moves.

Each device's block keeps the rows in order and, within a row, the
synapses in the order of the whole matrix, so every output sums the same
terms in the same order as ``spikes @ W`` on the whole CSR: the blocks are
the whole matrix's structure, bit for bit.
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from ..grouping import entry_rows
from .matrix import CSR
from .ops import binary_csrmv, csrmv

__all__ = ["ShardedCSR"]


def _split_columns(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n_cols: int, parts: int):
    """Per column block: ``(data, local indices, indptr)``, padded to the largest block's synapses."""
    n_rows = indptr.shape[0] - 1
    width = n_cols // parts
    rows = entry_rows(indptr, indices.shape[0], np)
    block_of = indices // width
    homogeneous = data.shape[0] != indices.shape[0]
    blocks = []
    for b in range(parts):
        keep = block_of == b  # stable: the rows, and the synapses within a row, keep their order
        counts = np.bincount(rows[keep], minlength=n_rows)
        ptr = np.concatenate([[0], np.cumsum(counts)]).astype(indptr.dtype)
        blocks.append((data if homogeneous else data[keep], (indices[keep] - b * width).astype(indices.dtype), ptr))
    nnz = max(1, max(len(b[1]) for b in blocks))

    def pad(a, size):
        return np.concatenate([a, np.zeros(size - len(a), a.dtype)])

    data_b = np.stack([b[0] if homogeneous else pad(b[0], nnz) for b in blocks])
    return data_b, np.stack([pad(b[1], nnz) for b in blocks]), np.stack([b[2] for b in blocks])


@jax.tree_util.register_pytree_node_class
class ShardedCSR:
    """A CSR matrix ``(n_rows, n_cols)`` split by column blocks over the devices of ``mesh``'s ``axis``.

    Build it with :meth:`from_csr`; ``spikes @ W`` (or ``x @ W`` for float
    ``x``) returns the ``(n_cols,)`` result sharded along ``axis``, each device
    computing its own block.  It is a pytree (``data`` is a leaf, so
    ``jax.grad`` differentiates through it and the gradient is sharded
    like the weights).

    Args:
        data: ``(D, nnz_block)`` weights per block (``(D, 1)``: one shared weight).
        indices: ``(D, nnz_block)`` column of each synapse within its block.
        indptr: ``(D, n_rows + 1)`` row pointers of each block.
        shape: ``(n_rows, n_cols)`` of the whole matrix.
        mesh: a ``jax.sharding.Mesh``.
        axis: the mesh axis the blocks are split over (``D`` = its size).

    Example:
        >>> mesh = jax.make_mesh((4,), ("model",))
        >>> W = evjax.ShardedCSR.from_csr(evjax.CSR.fromdense(dense), mesh, "model")
        >>> y = spikes @ W          # (n_cols,), sharded over "model"
    """

    def __init__(self, data, indices, indptr, *, shape, mesh, axis: str):
        self.data, self.indices, self.indptr = data, indices, indptr
        self.shape = tuple(int(s) for s in shape)
        self.mesh, self.axis = mesh, axis

    @classmethod
    def from_csr(cls, matrix: CSR, mesh, axis: str) -> "ShardedCSR":
        """Split a concrete :class:`evjax.CSR` by column blocks over ``mesh``'s ``axis``.

        Raises:
            ValueError: ``n_cols`` does not divide evenly among the axis's devices, or the
                mesh has no such axis.
        """
        if axis not in mesh.shape:
            raise ValueError(f"ShardedCSR.from_csr: the mesh has no axis {axis!r}; its axes: {tuple(mesh.shape)}")
        parts = mesh.shape[axis]
        n_rows, n_cols = matrix.shape
        if n_cols % parts:
            raise ValueError(f"ShardedCSR.from_csr: n_cols = {n_cols} must divide evenly among the {parts} devices "
                             f"of axis {axis!r}; pad the matrix with columns of no synapse")
        data, indices, indptr = _split_columns(np.asarray(matrix.indptr), np.asarray(matrix.indices),
                                               np.asarray(matrix.data), n_cols, parts)
        split = NamedSharding(mesh, P(axis))
        return cls(jax.device_put(data, split), jax.device_put(indices, split), jax.device_put(indptr, split),
                   shape=matrix.shape, mesh=mesh, axis=axis)

    def with_data(self, data) -> "ShardedCSR":
        """The same structure with other weights ``(D, nnz_block)``."""
        return ShardedCSR(data, self.indices, self.indptr, shape=self.shape, mesh=self.mesh, axis=self.axis)

    def tree_flatten(self):
        return (self.data, self.indices, self.indptr), (self.shape, self.mesh, self.axis)

    @classmethod
    def tree_unflatten(cls, aux, children):
        shape, mesh, axis = aux
        return cls(*children, shape=shape, mesh=mesh, axis=axis)

    def __rmatmul__(self, x):
        """``x @ W`` for a vector ``x`` of ``n_rows`` (bool spikes: event-driven; float: values)."""
        x = jnp.asarray(x)
        if x.shape != (self.shape[0],):
            raise ValueError(f"ShardedCSR: x @ W needs x of shape ({self.shape[0]},), got {x.shape}; "
                             f"for a batch, jax.vmap over the trials")
        block = (self.shape[0], self.shape[1] // self.mesh.shape[self.axis])
        event = x.dtype == jnp.bool_

        def local(data, indices, indptr, x):
            if event:
                return binary_csrmv(data[0], indices[0], indptr[0], x, shape=block, transpose=True)
            return csrmv(data[0], indices[0], indptr[0], x, shape=block, transpose=True)

        return jax.shard_map(local, mesh=self.mesh, in_specs=(P(self.axis), P(self.axis), P(self.axis), P()),
                             out_specs=P(self.axis))(self.data, self.indices, self.indptr, x)
