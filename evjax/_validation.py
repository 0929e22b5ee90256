"""Checks shared by every operator family: sizes, shapes, seeds, index casts, dtypes, the dense operand.

A low layer: it imports JAX, NumPy and only those evjax modules that import
no other evjax module (``_compat``, ``events``), so every family may use it
and no family imports another family's validation module (the layering test
of ``tests/test_core_ffi.py`` checks both).  Each family keeps its own
structural checks (``csr/validation.py``: ``indptr`` and the index dtypes of
a CSR structure; ``fixed/validation.py``: the fixed-width table).

Every message names the caller (``who``), the argument and the fix.  The
rules:

* A size (a dimension of ``shape``, a count such as ``k``) is a Python int, a
  NumPy integer, a 0-d integer array or a float with a whole value, and is
  not negative.  Anything else raises a ``TypeError`` (a bool, ``4.7``,
  ``"5"``, ``None``: never truncated, as ``int()`` would), a negative size a
  ``ValueError``.
* A ``shape`` is a pair of sizes; a string, a scalar or a pair of the wrong
  length raises ``TypeError`` / ``ValueError`` naming it.
* A traced seed (JITC's ``seed``) is one integer, wrapped modulo ``2**32``;
  a host seed (``FixedPostNumConn.random``'s ``key``) is a JAX key or a
  non-negative integer.
* Arrays are used in the dtype JAX gives them *now* (:func:`canonical`): a
  float64 array made while 64-bit mode was on is float32 once it is off, as
  ``jnp`` functions treat it.
"""
from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat
from ._event_values import as_bool_events

__all__ = [
    "check_compressed",
    "INT32_MAX", "ENABLE_X64", "is_concrete", "canonical", "check_size", "check_shape", "as_seed", "host_rng",
    "check_fits", "checked_index_cast", "check_operand",
]

INT32_MAX = int(np.iinfo(np.int32).max)
ENABLE_X64 = 'jax.config.update("jax_enable_x64", True)'
_WIDE_INEXACT = (np.dtype(np.float64), np.dtype(np.complex128))


def is_concrete(*arrays) -> bool:
    """Whether every one of ``arrays`` holds values (none is traced under ``jit``/``vmap``/``grad``)."""
    return not any(isinstance(x, _compat.Tracer) for x in arrays)


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------
def canonical(x):
    """``x`` as a jax array whose float dtype is the one JAX's current mode gives it.

    An array made while 64-bit mode was on keeps its float64 dtype after the
    mode is turned off, though every ``jnp`` function computes it in float32;
    a kernel's result dtype decided from it would then promise float64, which
    the kernel does not return.  So float64 (complex128) is narrowed to
    float32 (complex64) while the mode is off, as ``jnp.asarray`` does to a
    NumPy array; otherwise ``x`` is returned as it is (after ``jnp.asarray``).
    Integer arrays are left alone: narrowing them could wrap a value (index
    arrays are checked to fit before they are cast, see :func:`check_fits`).
    """
    x = x if isinstance(x, (jax.Array, _compat.Tracer)) else jnp.asarray(x)
    if x.dtype in _WIDE_INEXACT and not jax.config.jax_enable_x64:
        x = x.astype(jax.dtypes.canonicalize_dtype(x.dtype))
    return x


# ---------------------------------------------------------------------------
# sizes and shapes
# ---------------------------------------------------------------------------
def _size(value, problem: str) -> int:
    """``value`` as a non-negative Python int; ``problem`` starts the message."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{problem}: {value} is a bool, not a size; pass an int")
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise TypeError(f"{problem}: {value} is not a whole number; pass an int (a size is never rounded "
                            f"or truncated)")
        value = int(value)
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{problem}: {type(value).__name__} {value!r} is not an integer (sizes are static: pass "
                        f"a Python int or a NumPy integer)") from None
    if value < 0:
        raise ValueError(f"{problem}: {value} is negative")
    return value


def check_size(value, who: str, name: str) -> int:
    """A count or size (``k``, ``n_pre``, a dimension) as a non-negative Python int.

    Accepts a Python int, a NumPy integer, a 0-d integer array or a float
    with a whole value.

    Raises:
        TypeError: a bool, a float that is not a whole number, or not a number.
        ValueError: a negative value.
    """
    return _size(value, f"{who}: {name} must be a non-negative integer, got {value!r}")


def check_shape(shape, who: str, name: str = "shape", dims: tuple = ("n_rows", "n_cols")) -> tuple[int, int]:
    """``shape`` as a pair of non-negative Python ints (each size as in :func:`check_size`).

    Args:
        shape: the value to check.
        who: the caller's name, for messages.
        name: the argument's name, for messages.
        dims: the names of the two sizes, for messages (``("n_pre", "n_post")``).

    Raises:
        TypeError: ``shape`` is not a sequence (a string, a number, ``None``),
            or a size is a bool, a float that is not a whole number or not a
            number; the message names ``name``.
        ValueError: ``shape`` does not have two sizes, or a size is negative.
    """
    pair = f"a pair ({', '.join(dims)}) of non-negative integers"
    not_pair = (f"{who}: {name} must be {pair}, got {type(shape).__name__} {shape!r}; pass a tuple of two ints, "
                f"e.g. {name}=(3, 4)")
    if isinstance(shape, (str, bytes)) or isinstance(shape, (jax.Array, np.ndarray)) and np.ndim(shape) != 1:
        raise TypeError(not_pair)
    try:
        sizes = tuple(shape)
    except TypeError:
        raise TypeError(not_pair) from None
    if len(sizes) != 2:
        raise ValueError(f"{who}: {name} must be {pair}, got {len(sizes)} sizes: {shape!r}")
    problem = f"{who}: {name} must be {pair}, got {shape!r}"
    return _size(sizes[0], problem), _size(sizes[1], problem)


# ---------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------
def as_seed(seed, who: str, name: str = "seed"):
    """A traced seed as a ``(1,)`` uint32 array (integers wrap modulo ``2**32``).

    ``None`` draws a random seed on the host (a new matrix on every call: pass
    one to reproduce it).  A traced integer array stays traced (a new seed
    does not recompile).

    Raises:
        TypeError: not one integer (a string, a float, a bool, several values).
    """
    if seed is None:
        seed = int(np.random.randint(0, 2**31 - 1))
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        return jnp.asarray([operator.index(seed) & 0xFFFFFFFF], jnp.uint32)
    fix = f"pass an int, e.g. {name}=42, or an integer array of one element"
    if isinstance(seed, str) and seed.strip().lstrip("+-").isdigit():
        fix = f"convert it: {name}=int({seed!r})"
    if isinstance(seed, (str, bytes)):
        raise TypeError(f"{who}: {name} must be one integer, got {type(seed).__name__} {seed!r}; {fix}")
    try:
        seed = jnp.asarray(seed)
    except TypeError:
        raise TypeError(f"{who}: {name} must be one integer, got {type(seed).__name__} {seed!r}; {fix}") from None
    if seed.size != 1 or not (jnp.issubdtype(seed.dtype, jnp.integer) and seed.dtype != jnp.bool_):
        raise TypeError(f"{who}: {name} must be one integer (a Python int or an integer array of one element), "
                        f"got {seed.dtype}{list(seed.shape)}; {fix}")
    return seed.reshape(1).astype(jnp.uint32)


def host_rng(key, who: str, name: str = "key") -> np.random.Generator:
    """A NumPy generator seeded from a JAX key (typed or raw uint32) or a non-negative integer seed.

    Raises:
        TypeError: a bool, a float, a string or another non-integer value.
        ValueError: a negative integer seed.
    """
    fix = "pass a JAX key (e.g. jax.random.key(0)) or a non-negative int seed"
    if isinstance(key, (bool, np.bool_)) or isinstance(key, (str, bytes, float, np.floating)):
        raise TypeError(f"{who}: {name} must be a JAX random key or an integer seed, got "
                        f"{type(key).__name__} {key!r}; {fix}")
    if isinstance(key, (int, np.integer)):
        if key < 0:
            raise ValueError(f"{who}: {name} = {key} is negative: an integer seed must be >= 0; pass a JAX key "
                             f"(jax.random.key({key}) takes any int) or a non-negative int")
        return np.random.default_rng(int(key))
    try:
        key = jnp.asarray(key)
    except TypeError:
        raise TypeError(f"{who}: {name} must be a JAX random key or an integer seed, got "
                        f"{type(key).__name__} {key!r}; {fix}") from None
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    elif not jnp.issubdtype(key.dtype, jnp.integer):
        raise TypeError(f"{who}: {name} must be a JAX random key or an integer seed, got a {key.dtype} array; "
                        f"{fix}")
    if not is_concrete(key):
        raise TypeError(f"{who}: {name} must be concrete (the table is drawn on the host), got a traced value; "
                        f"draw the matrix outside jax.jit")
    return np.random.default_rng(np.asarray(key).astype(np.uint32).ravel().tolist())


# ---------------------------------------------------------------------------
# index casts
# ---------------------------------------------------------------------------
def check_index_vector(x, name: str, length: int | None, who: str):
    """``x`` as a 1-d integer array of ``length`` entries (any length when None), or a named error.

    Raises:
        TypeError: not a 1-d integer array.
        ValueError: the wrong length.
    """
    x = canonical(x)
    if x.ndim != 1 or not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{who}: {name} must be a 1-d integer array, got {x.dtype}{list(x.shape)}")
    if length is not None and x.shape[0] != length:
        raise ValueError(f"{who}: {name} has {x.shape[0]} entries, expected {length}")
    return x


def check_compressed(indices, indptr, n_lines: int, nnz: int | None, who: str, structure: str):
    """A compressed structure's ``indices`` (``nnz`` entries; any number when None) and ``indptr`` (one
    entry per line, plus one), in one index dtype.  A concrete ``indptr`` must rise from 0 to the
    number of entries.

    Args:
        structure: what to pass instead, for the message ("the CSR (row) structure of the connection").

    Raises:
        TypeError: not 1-d integer arrays.
        ValueError: the wrong lengths, or a concrete ``indptr`` that does not rise from 0 to nnz.
    """
    indices = check_index_vector(indices, "indices", nnz, who)
    indptr = check_index_vector(indptr, "indptr", n_lines + 1, who)
    nnz = indices.shape[0]
    if is_concrete(indptr):
        ptr = np.asarray(indptr)
        if ptr[0] != 0 or ptr[-1] != nnz or np.any(np.diff(ptr) < 0):
            raise ValueError(f"{who}: indptr must rise from 0 to nnz = {nnz} (len(indices)), got indptr[0] = "
                             f"{ptr[0]}, indptr[-1] = {ptr[-1]}; pass {structure}")
    dtype = jnp.result_type(indices.dtype, indptr.dtype)
    return indices.astype(dtype), indptr.astype(dtype)


def check_active_list(active_ids, n_active, n_rows: int, who: str):
    """A list of active rows, ``(active_ids, n_active)``, checked and as int32 (int64 past int32).

    ``active_ids`` holds ``n_rows`` integers: the first ``n_active[0]`` are the
    active rows, strictly ascending in ``[0, n_rows)`` (values checked when
    concrete), the rest is padding; ``n_active`` is a ``(1,)`` (or scalar) count.

    Raises:
        TypeError: not integer arrays.
        ValueError: the wrong shapes, or (concrete) a count or row out of range, or rows not ascending.
    """
    active_ids = check_index_vector(active_ids, "active_ids", n_rows, who)
    n_active = canonical(n_active)
    if not jnp.issubdtype(n_active.dtype, jnp.integer) or n_active.size != 1 or n_active.ndim > 1:
        raise TypeError(f"{who}: n_active must be an integer count of shape (1,), got "
                        f"{n_active.dtype}{list(n_active.shape)}")
    dtype = jnp.int32 if n_rows <= INT32_MAX else jnp.int64
    if is_concrete(active_ids, n_active):
        count = int(np.asarray(n_active).reshape(()))
        if not 0 <= count <= n_rows:
            raise ValueError(f"{who}: n_active = {count} is outside [0, {n_rows}]")
        rows = np.asarray(active_ids[:count]).astype(np.int64)
        if rows.size and (rows[0] < 0 or rows[-1] >= n_rows or np.any(np.diff(rows) <= 0)):
            raise ValueError(f"{who}: active_ids[:n_active] must be distinct rows in [0, {n_rows}) in ascending "
                             f"order; build the list with evjax.CompactBinary.from_array(spikes)")
    return active_ids.astype(dtype), n_active.reshape(1).astype(dtype)


def check_fits(x, dtype, name: str, who: str) -> None:
    """Raise unless every value of the (concrete) integer array ``x`` is representable in ``dtype``.

    A traced ``x`` (no values) and a safe cast pass.

    Raises:
        ValueError: a value does not fit; the message names ``name[k]`` and the fix.
    """
    dtype = np.dtype(dtype)
    if np.can_cast(x.dtype, dtype, "safe") or not is_concrete(x):
        return
    values = np.asarray(x)
    info = np.iinfo(dtype)
    bad = values > info.max
    if np.issubdtype(values.dtype, np.signedinteger):
        bad |= values < info.min
    if not bad.any():
        return
    k = int(np.argmax(bad))
    if dtype == np.int32 and not jax.config.jax_enable_x64:
        fix = (f"{name} are stored as int32 while JAX's 64-bit mode is off; enable it ({ENABLE_X64}) "
               f"before building the matrix, or fix the value")
    else:
        fix = f"fix the value (no {dtype} can hold it)"
    raise ValueError(f"{who}: {name}[{k}] = {values[k]} does not fit {dtype}: {fix}")


def checked_index_cast(x, dtype, name: str, who: str) -> np.ndarray:
    """The host integer array ``x`` as ``dtype``, after checking that every value fits.

    Raises:
        ValueError: a value does not fit ``dtype``.
    """
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    check_fits(x, dtype, name, who)
    return x if x.dtype == dtype else x.astype(dtype)


# ---------------------------------------------------------------------------
# the dense operand of a sparse matmul
# ---------------------------------------------------------------------------
def check_operand(x, data, shape, transpose: bool, rank: int, event: bool, who: str):
    """Check the dense operand of a matmul with a stored matrix; return it and the result dtype.

    ``x`` is put in the dtype of JAX's current mode (:func:`canonical`), as
    ``data`` must already be; integer spike counts become bool events.

    Raises:
        ValueError: ``x`` has the wrong rank or contracted size.
        TypeError: ``x`` is complex.
    """
    x = canonical(x)
    name = "v" if rank == 1 else "B"
    need = shape[1] if not transpose else shape[0]
    what = "n_cols" if not transpose else "n_rows"
    if x.ndim != rank or x.shape[0] != need:
        expect = f"({need},)" if rank == 1 else f"({need}, k)"
        raise ValueError(
            f"{who}: {name} has shape {x.shape}, but a matrix of shape {shape} with transpose={transpose} "
            f"needs {expect} ({what} = {need} first)"
        )
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: complex operands are not supported, got {x.dtype}; pass the real part "
                        f"(jnp.real(x)) or split real and imaginary parts into two calls")
    if event:
        if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.floating)):
            x = as_bool_events(x)  # integer spike counts: nonzero = spike
        return x, data.dtype
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(data.dtype), data.dtype
    return x, jnp.promote_types(data.dtype, x.dtype)
