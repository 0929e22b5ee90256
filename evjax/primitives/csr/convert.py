"""Conversions and structural edits of a stored CSR structure (the maths behind the CSR/CSC methods).

Every function here works on the arrays of one stored CSR matrix ``A`` of
shape ``(m, n)`` (a ``CSC`` matrix stores the CSR of its transpose) and knows
nothing of the classes in :mod:`.matrix`, which import this module.

Structure (``indices``, ``indptr``) may be concrete or traced:

* a transposition keeps ``nnz``, so it is computed with NumPy when the
  structure is concrete (the result stays concrete, even inside ``jax.jit``,
  where the matrix is closed over) and with ``jax.numpy`` (a stable sort) when
  it is traced;
* inserting diagonal entries or selecting rows changes ``nnz`` by an amount
  that depends on the structure's values: :func:`add_diagonal` then appends one
  entry per diagonal element instead (duplicates add up), and
  :func:`select_rows` needs a concrete structure.

Weights (``data``) may always be traced: they are only gathered, scattered and
summed with ``jax.numpy``, so every result is differentiable in them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat
from ..._validation import INT32_MAX, check_shape
from ...dtypes import compute_dtype
from ..grouping import entry_rows as _entry_rows
from ..grouping import group_plan as _group_plan
from ..grouping import transpose_plan as _transpose_plan
from ..grouping import transposed_view
from .ops import row_ids

__all__ = ["csr_slice_rows", "dense_rows", "selected_rows", "is_concrete", "weights_of", "transpose_structure", "axis_sums", "add_diagonal",
           "normalize_row_index", "select_rows", "dense_at_entries",
           "csr_to_coo_index", "coo_to_csc_index", "csr_to_csc_index", "csc_to_csr_index", "coo2csr"]


def is_concrete(*arrays) -> bool:
    """Whether no array is a tracer (its values can be read now)."""
    return not any(isinstance(a, _compat.Tracer) for a in arrays)


def _constant(x, dtype=None):
    """A concrete jax array from a NumPy one, also while a ``jax.jit`` trace is running."""
    with jax.ensure_compile_time_eval():
        return jnp.asarray(x, dtype)


def weights_of(data, nnz: int):
    """One weight per stored entry: a homogeneous ``data`` of shape ``(1,)`` is broadcast."""
    return data if data.shape[0] == nnz else jnp.broadcast_to(data, (nnz,))


def _gather_data(data, positions):
    """``data[positions]``; a ``(1,)`` weight is kept as it is (homogeneous, or the only entry)."""
    return data if data.shape[0] == 1 else data[positions]


# ---------------------------------------------------------------------------
# transposition: CSR(A) -> CSR(A.T)
# ---------------------------------------------------------------------------
def transpose_structure(data, indices, indptr, shape) -> tuple:
    """The arrays ``(data, indices, indptr)`` of the CSR matrix ``A.T`` (a real re-sort, not a view).

    Args:
        data, indices, indptr: the CSR arrays of ``A``.
        shape: ``(m, n)``, the shape of ``A``.
    """
    t_indices, t_indptr, perm = transposed_view(indices, indptr, shape[1])
    return _gather_data(data, perm), t_indices, t_indptr


# ---------------------------------------------------------------------------
# sums and gathers
# ---------------------------------------------------------------------------
def axis_sums(data, indices, indptr, shape, axis):
    """Structural sums of ``A`` (duplicates included), in ``data``'s dtype.

    Args:
        axis: ``None`` (all entries), ``1`` (row sums, ``(m,)``) or ``0``
            (column sums, ``(n,)``), in the stored orientation.

    Maths: ``sum = sum_k w_k``; ``row_i = sum_{k in row i} w_k``;
    ``col_j = sum_{k: c_k = j} w_k``.  16-bit weights accumulate in float32.
    """
    nnz = indices.shape[0]
    acc = compute_dtype(data.dtype)
    if axis is None:
        if data.shape[0] != nnz:  # homogeneous: nnz * w
            return (data[0].astype(acc) * nnz).astype(data.dtype)
        return jnp.sum(data.astype(acc)).astype(data.dtype)
    w = weights_of(data, nnz).astype(acc)
    if axis == 1:
        sums = jax.ops.segment_sum(w, row_ids(indptr, nnz), num_segments=shape[0])
    else:
        sums = jnp.zeros((shape[1],), acc).at[indices].add(w, mode="drop")
    return sums.astype(data.dtype)


def dense_at_entries(dense, indices, indptr):
    """``dense[r_k, c_k]`` for every stored entry ``k`` (``dense`` in the stored orientation)."""
    return dense[row_ids(indptr, indices.shape[0]), indices]


# ---------------------------------------------------------------------------
# A + diag(d)
# ---------------------------------------------------------------------------
def add_diagonal(data, indices, indptr, shape, diag) -> tuple:
    """The arrays ``(data, indices, indptr)`` of ``A + diag(d)``, ``d`` of length ``min(m, n)``.

    A concrete structure gets the union of ``A``'s pattern and the main
    diagonal: ``d_i`` is added to the first stored ``(i, i)`` entry, and a row
    without one gets an entry inserted in sorted position (after its columns
    ``< i``).  When nothing is missing the structure arrays are reused.
    A traced structure (under ``jax.jit``) cannot grow by a data-dependent
    amount, so every row ``i < min(m, n)`` gets one more entry ``(i, i)`` with
    value ``d_i``, appended at the end of the row: duplicates add up, so the
    matrix is the same.
    """
    nnz = indices.shape[0]
    w = weights_of(data, nnz)
    diag = diag.astype(w.dtype)
    if is_concrete(indices, indptr):
        plan = _diagonal_plan(np.asarray(indices), np.asarray(indptr), min(shape))
        if plan is None:  # every diagonal entry is stored already
            dest = _first_diagonal_entries(np.asarray(indices), np.asarray(indptr), min(shape))
            return w.at[dest].add(diag), indices, indptr
        new_indices, new_indptr, old_to_new, dest = plan
        new_data = jnp.zeros(new_indices.shape, w.dtype).at[old_to_new].set(w).at[dest].add(diag)
        return new_data, _constant(new_indices), _constant(new_indptr)
    return _append_diagonal(w, indices, indptr, shape, diag)


def _first_diagonal_entries(indices, indptr, k: int):
    """Position of the first stored ``(i, i)`` entry of each row ``i < k`` (-1 if none); NumPy."""
    rows = np.searchsorted(indptr[1:], np.arange(indices.shape[0]), side="right")
    on_diagonal = np.flatnonzero((indices == rows) & (rows < k))
    first = np.full(k, -1, dtype=np.int64)
    first[rows[on_diagonal][::-1]] = on_diagonal[::-1]  # the last write wins: the first entry
    return first


def _diagonal_plan(indices, indptr, k: int):
    """Where old entries move and where the diagonal lands when the missing ``(i, i)`` are inserted.

    Returns ``None`` when nothing is missing, else ``(new_indices, new_indptr,
    old_to_new, dest)``, NumPy arrays.  Row ``i`` lacking its diagonal gets it
    at old position ``ins_i = indptr[i] + #{k in row i: c_k < i}``; an old
    entry ``p`` moves to ``p + #{ins <= p}``; the j-th insertion lands at
    ``ins_j + j``; ``new_indptr[r] = indptr[r] + #{missing rows < r}``.
    """
    nnz = indices.shape[0]
    first = _first_diagonal_entries(indices, indptr, k)
    missing = np.flatnonzero(first < 0)
    if missing.size == 0:
        return None
    rows = np.searchsorted(indptr[1:], np.arange(nnz), side="right")
    below = np.bincount(rows[indices < rows], minlength=indptr.shape[0] - 1)
    insert_at = indptr[missing] + below[missing]
    new_indices = np.insert(indices, insert_at, missing.astype(indices.dtype))
    old_to_new = np.arange(nnz) + np.searchsorted(insert_at, np.arange(nnz), side="right")
    new_indptr = indptr + np.searchsorted(missing, np.arange(indptr.shape[0]), side="left").astype(indptr.dtype)
    dest = np.empty(k, dtype=np.int64)
    present = first >= 0
    dest[present] = old_to_new[first[present]]
    dest[missing] = insert_at + np.arange(missing.size)
    return new_indices, new_indptr, old_to_new, dest


def _append_diagonal(w, indices, indptr, shape, diag) -> tuple:
    """``A + diag(d)`` for a traced structure: entry ``(i, i)`` appended to each row ``i < k``.

    Row ``r`` grows by ``[r < k]``, so ``new_indptr[r] = indptr[r] + min(r, k)``;
    old entry ``p`` of row ``r_p`` moves to ``p + min(r_p, k)``; the appended
    entry of row ``i`` is the row's last slot, ``new_indptr[i + 1] - 1``.
    """
    k = min(shape)
    nnz = indices.shape[0]
    new_indptr = indptr + jnp.minimum(jnp.arange(shape[0] + 1, dtype=indptr.dtype), k)
    old_to_new = jnp.arange(nnz, dtype=indptr.dtype) + jnp.minimum(row_ids(indptr, nnz), k)
    dest = new_indptr[1:k + 1] - 1
    new_indices = jnp.zeros((nnz + k,), indices.dtype).at[old_to_new].set(indices)
    new_indices = new_indices.at[dest].set(jnp.arange(k, dtype=indices.dtype))
    new_data = jnp.zeros((nnz + k,), w.dtype).at[old_to_new].set(w).at[dest].set(diag)
    return new_data, new_indices, new_indptr


# ---------------------------------------------------------------------------
# row selection
# ---------------------------------------------------------------------------
def normalize_row_index(index, n_rows: int, who: str) -> np.ndarray:
    """Rows selected by an int, a slice, a sequence of ints or a bool mask, as a NumPy int array.

    Raises:
        TypeError: a traced index, or one that is neither integer nor bool.
        IndexError: a row out of range.
    """
    if isinstance(index, slice):
        return np.arange(n_rows)[index]
    if isinstance(index, _compat.Tracer):
        raise TypeError(f"{who}: the row index must be concrete (the result's size depends on it), "
                        f"got a traced value; select rows outside jax.jit or close over the index")
    rows = np.asarray(index)
    if rows.dtype == np.bool_:
        if rows.shape != (n_rows,):
            raise IndexError(f"{who}: a bool mask must have shape ({n_rows},), got {rows.shape}")
        return np.flatnonzero(rows)
    if rows.size == 0:  # [] is float to NumPy
        return np.zeros(0, np.int64)
    if not np.issubdtype(rows.dtype, np.integer):
        raise TypeError(f"{who}: rows must be given by ints, a slice or a bool mask, got dtype {rows.dtype}")
    rows = rows.reshape(-1)
    bad = (rows < -n_rows) | (rows >= n_rows)
    if bad.any():
        raise IndexError(f"{who}: row {rows[bad][0]} is out of range for {n_rows} rows")
    return rows % max(n_rows, 1)


def _selection_plan(indices, indptr, rows):
    """``(take, new_indptr)``: the entries of the selected rows in order (NumPy).

    Selected row ``s`` (old row ``rows[s]``) owns the old entries
    ``indptr[rows[s]] + t`` for ``0 <= t < count_s``; they land at
    ``new_indptr[s] + t``, so ``take[q] = q + (indptr[rows[s]] - new_indptr[s])``.
    """
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    new_indptr = np.concatenate([[0], np.cumsum(counts)]).astype(indptr.dtype)
    take = np.arange(new_indptr[-1]) + np.repeat(starts - new_indptr[:-1], counts)
    return take, new_indptr


def select_rows(data, indices, indptr, rows, *, rows_are_columns_of: tuple | None = None) -> tuple:
    """The arrays ``(data, indices, indptr)`` of ``A[rows, :]``, as a CSR matrix.

    Args:
        data, indices, indptr: the stored CSR arrays (concrete structure).
        rows: NumPy ints (see :func:`normalize_row_index`).
        rows_are_columns_of: ``None`` to select rows of the stored matrix; the
            stored shape ``(m, n)`` to select its *columns* instead (the rows of
            a ``CSC`` matrix), returning the stored CSR of ``A[:, rows].T``.
    """
    indices, indptr = np.asarray(indices), np.asarray(indptr)
    if rows_are_columns_of is None:
        take, new_indptr = _selection_plan(indices, indptr, rows)
        return _gather_data(data, take), _constant(indices[take]), _constant(new_indptr)
    # columns of A = rows of A.T: transpose, select, transpose back (positions composed, one gather)
    t_indices, t_indptr, perm = _transpose_plan(indices, indptr, rows_are_columns_of[1], np)
    take, sub_indptr = _selection_plan(t_indices, t_indptr, rows)
    back_indices, back_indptr, back = _transpose_plan(t_indices[take], sub_indptr, rows_are_columns_of[0], np)
    return _gather_data(data, perm[take][back]), _constant(back_indices), _constant(back_indptr)


def dense_rows(w, entry_rows, entry_cols, rows, shape):
    """Rows ``A[rows, :]`` of a matrix given by its entries, as a dense ``(k, n)`` array.

    Args:
        w: one weight per entry, ``(nnz,)``.
        entry_rows, entry_cols: the row and column of every entry (duplicates add up).
        rows: ``(k,)`` ints in ``[0, m)`` (may be traced; a row out of range gives zeros).
        shape: ``(m, n)``.

    Maths: each selected row gets a slot, ``slot[rows[s]] = s'`` for one
    ``s'`` with ``rows[s'] = rows[s]``; entries scatter into the slot of their
    row (entries of unselected rows are dropped) and ``out[s] = dense[slot[rows[s]]]``,
    so a repeated row is scattered once and gathered again: ``O(m + nnz + k n)``.
    """
    m, n = shape
    k = rows.shape[0]
    rows = rows.astype(jnp.int32) if m <= INT32_MAX else rows
    slot = jnp.full((m,), k, rows.dtype).at[rows].set(jnp.arange(k, dtype=rows.dtype), mode="drop")
    scattered = jnp.zeros((k, n), w.dtype).at[slot[entry_rows], entry_cols].add(w, mode="drop")
    return scattered.at[slot.at[rows].get(mode="fill", fill_value=k)].get(mode="fill", fill_value=0)


def csr_slice_rows(data, indices, indptr, row_indices, *, shape, backend=None):
    """Rows ``A[row_indices, :]`` of a CSR matrix, as a dense array (brainevent's name).

    Pure JAX: works under ``jax.jit``, ``vmap`` and ``grad`` (in ``data``),
    with a traced structure and traced row indices.

    Args:
        data: the weights, ``(nnz,)`` or ``(1,)`` (one shared weight).
        indices: ``(nnz,)`` column indices.
        indptr: ``(m + 1,)`` row pointers.
        row_indices: an int (one row) or a 1-d array of ints (repeats and
            negative rows allowed).  Concrete rows are checked; a traced row
            out of range gives a row of zeros.
        shape: ``(m, n)``.
        backend: accepted for brainevent's signature and ignored (there is one
            implementation).

    Returns:
        ``(n,)`` for an int, ``(k, n)`` for ``k`` row indices; the dtype of ``data``.

    Raises:
        IndexError: a concrete row out of range.
        TypeError: row indices that are not integers.

    Example:
        >>> W = evjax.CSR.fromdense(np.array([[1.0, 0.0], [2.0, 3.0]], np.float32))
        >>> evjax.csr_slice_rows(W.data, W.indices, W.indptr, [1, 0], shape=W.shape)
        Array([[2., 3.],
               [1., 0.]], dtype=float32)
    """
    who = "csr_slice_rows"
    m, n = check_shape(shape, who)
    data, indices, indptr = jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)
    rows, single = selected_rows(row_indices, m, who)
    nnz = indices.shape[0]
    out = dense_rows(weights_of(data, nnz), row_ids(indptr, nnz), indices, rows, (m, n))
    return out[0] if single else out


def selected_rows(index, n_rows: int, who: str) -> tuple:
    """``(rows, single)``: the rows an index selects as a 1-d JAX int array, and whether it is one int.

    A concrete index is checked by :func:`normalize_row_index` (slices and bool
    masks too); a traced one must be integers, and its negative rows count from
    the end.
    """
    if not isinstance(index, _compat.Tracer):
        single = not isinstance(index, slice) and np.ndim(index) == 0
        return jnp.asarray(normalize_row_index(index, n_rows, who)), single
    if not jnp.issubdtype(index.dtype, jnp.integer):
        raise TypeError(f"{who}: a traced row index must be integers, got {index.dtype}")
    return jnp.where(index < 0, index + n_rows, index).reshape(-1), index.ndim == 0


# ---------------------------------------------------------------------------
# index utilities (brainevent's names): structure only, NumPy in -> NumPy out
# ---------------------------------------------------------------------------
_CSR_TO_CSC_METHODS = ("coo", "numpy", "gpu_column_block")


def _index_arrays(who: str, **arrays) -> tuple:
    """``(xp, arrays...)``: NumPy when every array is a NumPy array (or a list), else ``jax.numpy``.

    Raises:
        ValueError: an array that is not 1-d.
        TypeError: an array that is not of an integer dtype.
    """
    xp = np if not any(isinstance(a, (jax.Array, _compat.Tracer)) for a in arrays.values()) else jnp
    out = []
    for name, a in arrays.items():
        a = xp.asarray(a)
        if a.ndim != 1:
            raise ValueError(f"{who}: {name} must be 1-d, got shape {a.shape}")
        if a.size == 0 and not np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int32)  # [] is float to NumPy
        if not np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
            raise TypeError(f"{who}: {name} must be integers, got {a.dtype}")
        out.append(a)
    return (xp, *out)


def _offset_dtype(nnz: int):
    """Pointers and permutations index ``nnz`` entries: int32 while that fits, else int64."""
    return np.dtype(np.int64) if nnz > INT32_MAX else np.dtype(np.int32)


def _check_range(ids, n: int, who: str, name: str, what: str) -> None:
    """Raise unless every id lies in ``[0, n)`` (checked when the ids are concrete)."""
    if is_concrete(ids) and ids.size:
        values = np.asarray(ids)
        bad = (values < 0) | (values >= n)
        if bad.any():
            raise ValueError(f"{who}: {name} holds {values[bad][0]}, outside [0, {n}) ({what})")


def _check_pointers(indptr, n_rows: int, nnz: int, who: str, name: str) -> None:
    if indptr.shape[0] != n_rows + 1:
        raise ValueError(f"{who}: {name} must have {n_rows + 1} entries (n + 1 for shape={n_rows} rows), got "
                         f"{indptr.shape[0]}")
    if is_concrete(indptr):
        ptr = np.asarray(indptr)
        if ptr[0] != 0 or ptr[-1] != nnz or (np.diff(ptr) < 0).any():
            raise ValueError(f"{who}: {name} must start at 0, never decrease and end at the number of indices "
                             f"({nnz}); got {ptr[0]} ... {ptr[-1]}")


def csr_to_coo_index(indptr, indices) -> tuple:
    """The COO coordinates ``(row_ids, col_ids)`` of a CSR structure.

    ``row_ids[k]`` is the row of stored entry ``k``: ``indptr[r] <= k <
    indptr[r + 1]``; ``col_ids`` is ``indices`` itself.  Rows without entries
    contribute nothing.

    Args:
        indptr: row pointers, ``(n_rows + 1,)``.
        indices: column indices, ``(nnz,)``.

    Returns:
        ``(row_ids, col_ids)``, both ``(nnz,)`` in ``indices``' dtype: NumPy
        arrays when both inputs are NumPy, else JAX arrays.  Works under
        ``jax.jit`` (``nnz`` is the length of ``indices``, a static shape).

    Raises:
        ValueError: an input is not 1-d.
        TypeError: an input is not of an integer dtype.

    Example:
        >>> evjax.csr_to_coo_index(np.array([0, 2, 2, 3]), np.array([0, 2, 1]))
        (array([0, 0, 2]), array([0, 2, 1]))
    """
    xp, indptr, indices = _index_arrays("csr_to_coo_index", indptr=indptr, indices=indices)
    return _entry_rows(indptr, indices.shape[0], xp).astype(indices.dtype), indices


def coo_to_csc_index(pre_ids, indices, *, shape) -> tuple:
    """The CSC structure of COO coordinates: ``(csc_indptr, csc_row_ids, perm)``.

    The entries are sorted by column with a stable sort, so the entries of a
    column keep their COO order (duplicates stay, in order).  Entry ``p`` of
    the CSC layout is COO entry ``perm[p]``: ``data[perm]`` is the data in CSC
    order, ``csc_row_ids = pre_ids[perm]``, and ``csc_indptr[j]`` counts the
    entries with column ``< j``.

    Args:
        pre_ids: the row (presynaptic) index of each entry, ``(nnz,)``.
        indices: the column (postsynaptic) index of each entry, ``(nnz,)``.
        shape: ``(n_rows, n_cols)``, concrete Python ints.

    Returns:
        ``(csc_indptr, csc_row_ids, perm)``: ``csc_indptr`` ``(n_cols + 1,)``
        and ``perm`` ``(nnz,)`` in int32 (int64 beyond ``2**31 - 1`` entries,
        which needs ``jax_enable_x64`` for JAX arrays), ``csc_row_ids`` in
        ``pre_ids``' dtype.  NumPy arrays when both inputs are NumPy, else JAX
        arrays; works under ``jax.jit``.

    Raises:
        ValueError: inputs of different lengths, or (concrete inputs) an index
            outside ``shape``.

    Example:
        >>> indptr, rows, perm = evjax.coo_to_csc_index(np.array([0, 0, 2]), np.array([0, 2, 1]), shape=(3, 3))
        >>> indptr, rows, perm
        (array([0, 1, 2, 3], dtype=int32), array([0, 2, 0]), array([0, 2, 1], dtype=int32))
    """
    return _compress_coo("coo_to_csc_index", shape, {"pre_ids": pre_ids, "indices": indices}, key_axis=1)


def _compress_coo(who: str, shape, ids: dict, key_axis: int) -> tuple:
    """``(ptr, other_ids[order], order)``: COO ids (``{row name: rows, column name: columns}``)
    grouped by axis ``key_axis`` (0: rows, CSR; 1: columns, CSC) with :func:`_group_plan`."""
    n = check_shape(shape, who)
    xp, *arrays = _index_arrays(who, **ids)
    names = list(ids)
    if arrays[0].shape != arrays[1].shape:
        raise ValueError(f"{who}: {names[0]} and {names[1]} must have the same length, got {arrays[0].shape[0]} "
                         f"and {arrays[1].shape[0]}")
    for axis in (0, 1):
        _check_range(arrays[axis], n[axis], who, names[axis], f"shape={n}")
    offset = _offset_dtype(arrays[0].shape[0])
    order, ptr = _group_plan(arrays[key_axis], n[key_axis], xp)
    return ptr.astype(offset), arrays[1 - key_axis][order], order.astype(offset)


def csr_to_csc_index(csr_indptr, csr_indices, *, shape, include_perm: bool = True, method: str = "coo",
                     column_block_size: int = 4096) -> tuple:
    """The CSC structure of a CSR structure: ``(csc_indptr, csc_indices, perm)``.

    The CSC arrays of ``A`` are the CSR arrays of ``A.T``; each column's
    entries are in row order (duplicates stay, in order), as
    ``scipy.sparse.csr_matrix.tocsc`` gives them.  ``data[perm]`` is the CSR
    ``data`` in CSC order.

    Args:
        csr_indptr: row pointers, ``(n_rows + 1,)``.
        csr_indices: column indices, ``(nnz,)``.
        shape: ``(n_rows, n_cols)``, concrete Python ints.
        include_perm: ``False`` returns ``None`` in place of ``perm``.
        method: ``"coo"``, ``"numpy"`` or ``"gpu_column_block"`` (brainevent's
            algorithms); evjax computes the same result the same way for each
            (one stable sort, NumPy or ``jax.numpy`` by the inputs).
        column_block_size: accepted for brainevent's signature (a positive
            int); evjax has no column blocks.

    Returns:
        ``(csc_indptr, csc_indices, perm)``: ``(n_cols + 1,)`` pointers and
        ``(nnz,)`` permutation in ``csr_indptr``'s dtype, ``(nnz,)`` row
        indices in ``csr_indices``' dtype.  NumPy arrays when both inputs are
        NumPy, else JAX arrays; works under ``jax.jit``.

    Raises:
        ValueError: an unknown ``method``, a non-positive
            ``column_block_size``, ``csr_indptr`` of the wrong length, or
            (concrete inputs) malformed pointers or a column outside ``shape``.

    Example:
        >>> indptr, rows, perm = evjax.csr_to_csc_index(np.array([0, 2, 2, 3]), np.array([0, 2, 1]), shape=(3, 3))
        >>> indptr, rows, perm
        (array([0, 1, 2, 3]), array([0, 2, 0]), array([0, 2, 1]))
    """
    who = "csr_to_csc_index"
    if method not in _CSR_TO_CSC_METHODS:
        raise ValueError(f"{who}: unknown method {method!r}; use one of {_CSR_TO_CSC_METHODS}")
    if isinstance(column_block_size, bool) or not isinstance(column_block_size, (int, np.integer)) \
            or column_block_size <= 0:
        raise ValueError(f"{who}: column_block_size must be a positive int, got {column_block_size!r}")
    return _csr_to_csc(csr_indptr, csr_indices, shape, include_perm, who)


def _csr_to_csc(indptr, indices, shape, include_perm: bool, who: str) -> tuple:
    n_rows, n_cols = check_shape(shape, who)
    xp, indptr, indices = _index_arrays(who, indptr=indptr, indices=indices)
    _check_pointers(indptr, n_rows, indices.shape[0], who, "the pointers")
    _check_range(indices, n_cols, who, "indices", f"shape={(n_rows, n_cols)}")
    t_indices, t_indptr, perm = _transpose_plan(indices, indptr, n_cols, xp)
    return t_indptr, t_indices, (perm.astype(indptr.dtype) if include_perm else None)


def csc_to_csr_index(csc_indptr, csc_indices, *, shape, include_perm: bool = True) -> tuple:
    """The CSR structure of a CSC structure: ``(csr_indptr, csr_indices, perm)``.

    The CSC arrays of ``A`` (shape ``(n_rows, n_cols)``) are the CSR arrays of
    ``A.T``, so this is :func:`csr_to_csc_index` of ``A.T``: each row's
    entries come out in column order, and ``data[perm]`` is the CSC ``data``
    in CSR order.  The two functions are inverses: their permutations compose
    to the identity.

    Args:
        csc_indptr: column pointers, ``(n_cols + 1,)``.
        csc_indices: row indices, ``(nnz,)``.
        shape: ``(n_rows, n_cols)`` of the matrix the CSC arrays describe, concrete Python ints.
        include_perm: ``False`` returns ``None`` in place of ``perm``.

    Returns:
        ``(csr_indptr, csr_indices, perm)``, typed as in :func:`csr_to_csc_index`.

    Raises:
        ValueError: as :func:`csr_to_csc_index`.

    Example:
        >>> indptr, cols, perm = evjax.csc_to_csr_index(np.array([0, 1, 2, 3]), np.array([0, 2, 0]), shape=(3, 3))
        >>> indptr, cols
        (array([0, 2, 2, 3]), array([0, 2, 1]))
    """
    n_rows, n_cols = check_shape(shape, "csc_to_csr_index")
    return _csr_to_csc(csc_indptr, csc_indices, (n_cols, n_rows), include_perm, "csc_to_csr_index")


def coo2csr(row_ids, col_ids, *, shape) -> tuple:
    """The CSR structure of COO coordinates: ``(csr_indptr, csr_indices, order)``.

    The entries are grouped by row with a stable sort: each row keeps its COO
    order (its columns are not sorted, duplicates stay).  ``data[order]`` is
    the COO data in CSR order and ``csr_indices = col_ids[order]``.

    Args:
        row_ids: the row of each entry, ``(nnz,)``.
        col_ids: the column of each entry, ``(nnz,)``.
        shape: ``(n_rows, n_cols)``, concrete Python ints.

    Returns:
        ``(csr_indptr, csr_indices, order)``: ``(n_rows + 1,)`` pointers and
        ``(nnz,)`` order in int32 (int64 beyond ``2**31 - 1`` entries),
        ``csr_indices`` in ``col_ids``' dtype.  NumPy arrays when both inputs
        are NumPy, else JAX arrays; works under ``jax.jit``.

    Raises:
        ValueError: inputs of different lengths, or (concrete inputs) an index
            outside ``shape``.

    Example:
        >>> indptr, indices, order = evjax.coo2csr(np.array([2, 0, 0]), np.array([1, 2, 0]), shape=(3, 3))
        >>> indptr, indices
        (array([0, 2, 2, 3], dtype=int32), array([2, 0, 1]))
    """
    return _compress_coo("coo2csr", shape, {"row_ids": row_ids, "col_ids": col_ids}, key_axis=0)
