"""``numba_kernel``: call an ``@numba.njit`` kernel from JAX on CPU."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from . import _kernel_compat
from ._wrapper import (
    RawKernelCall,
    check_arity,
    check_input_output_aliases,
    check_supported_dtypes,
    positional_arity,
)
from .backends import numba_cpu
from .outs import normalize_outs

# numba has no float16 arithmetic on CPU: such buffers reach the kernel as float32
# (converted by XLA around the call) and results are rounded back to float16.
_KERNEL_DTYPE = {np.dtype(np.float16): np.dtype(np.float32)}
SUPPORTED_DTYPES = frozenset(numba_cpu.NUMBA_TYPE_NAMES) | frozenset(_KERNEL_DTYPE)

VMAP_METHODS = ("sequential", "sequential_unrolled", "expand_dims", "broadcast_all", "legacy_vectorized")


def _check_njit(kernel) -> None:
    if not _kernel_compat.is_cpu_dispatcher(kernel):
        kind = type(kernel).__name__
        raise TypeError(
            f"numba_kernel expects a function decorated with @numba.njit, got {kind} "
            f"{getattr(kernel, '__name__', kernel)!r}. Decorate it: `@numba.njit def kernel(*ins, *outs): ...` "
            f"(for GPU kernels use evjax.numba_cuda_kernel)."
        )


def _declared_signature_error(kernel, arg_types: list[tuple[np.dtype, int]]) -> str | None:
    """If the kernel was compiled with explicit signatures only, check against them."""
    signatures = _kernel_compat.declared_signatures(kernel)
    if _kernel_compat.can_compile(kernel) or not signatures:
        return None
    from numba import types

    for signature in signatures:
        if len(signature) != len(arg_types):
            continue
        if all(
            isinstance(t, types.Array) and np.dtype(str(t.dtype)) == dt and t.ndim == nd
            for t, (dt, nd) in zip(signature, arg_types)
        ):
            return None
    given = ", ".join(f"{dt}[{nd}d]" for dt, nd in arg_types)
    declared = "; ".join(str(s) for s in signatures)
    return (
        f"numba kernel '{kernel.__name__}' was declared with signatures ({declared}) but is called "
        f"with inputs+outputs ({given}). Pass arrays of the declared dtypes and ranks, or fix `outs`."
    )


class NumbaKernelCall(RawKernelCall):
    """The JAX-callable returned by :func:`numba_kernel`."""

    who = "numba_kernel"
    register_with = "def_numba_kernel"

    def __init__(self, kernel, outs, single: bool, vmap_method, input_output_aliases):
        super().__init__(kernel.__name__, outs, single)
        self.kernel = kernel
        self.vmap_method = vmap_method or "sequential"
        self.input_output_aliases = dict(input_output_aliases or {})
        self._arity = positional_arity(kernel.py_func)

    def _check(self, args) -> list[tuple[np.dtype, int]]:
        subject = f"numba kernel '{self.name}'"
        n_in = len(args)
        check_arity(self._arity, n_in, len(self.outs), subject=subject, noun="arrays")
        arrays = list(args) + list(self.outs)
        check_supported_dtypes(arrays, n_in, SUPPORTED_DTYPES, subject=subject, backend="numba")
        types = []
        for a in arrays:
            dt = np.dtype(a.dtype)
            types.append((_KERNEL_DTYPE.get(dt, dt), len(a.shape)))
        message = _declared_signature_error(self.kernel, types)
        if message:
            raise TypeError(message)
        check_input_output_aliases(self.input_output_aliases, args, self.outs)
        return types

    def _forward(self, *args):
        types = self._check(args)
        n_in = len(args)
        handler = numba_cpu.get_handler(self.kernel, types[:n_in], types[n_in:])
        kernel_outs = [jax.ShapeDtypeStruct(o.shape, dt) for o, (dt, _) in zip(self.outs, types[n_in:])]
        call = jax.ffi.ffi_call(
            handler.target_name,
            kernel_outs,
            vmap_method=self.vmap_method,
            input_output_aliases=self.input_output_aliases or None,
        )
        kernel_args = [a.astype(dt) if a.dtype != dt else a for a, (dt, _) in zip(args, types)]
        results = call(*kernel_args)
        return tuple(r.astype(o.dtype) if r.dtype != o.dtype else r for r, o in zip(results, self.outs))


def numba_kernel(
    kernel: Callable,
    outs: jax.ShapeDtypeStruct | Sequence[jax.ShapeDtypeStruct],
    *,
    vmap_method: str | None = None,
    input_output_aliases: Mapping[int, int] | None = None,
) -> Callable[..., Any]:
    """Make an ``@numba.njit`` CPU kernel callable from JAX.

    The kernel takes its inputs, then its outputs, as arrays and writes the
    outputs in place; it returns nothing.  The call goes through the XLA FFI to
    a compiled handler (a ``numba.cfunc``), so no Python runs per call.

    Args:
        kernel: a function decorated with ``@numba.njit`` (``parallel=True`` with
            ``numba.prange`` is fine).
        outs: one ``jax.ShapeDtypeStruct`` (the call returns one array) or a
            sequence of them (the call returns a tuple).
        vmap_method: how ``jax.vmap`` treats the call. ``None`` (default) runs a
            correct sequential loop over the batch; any ``jax.ffi.ffi_call``
            method name is honoured.
        input_output_aliases: ``{input_index: output_index}`` for outputs
            written in place into an input's buffer.

    Returns:
        A function of JAX arrays that returns the output array(s). It works
        under ``jax.jit`` and ``jax.vmap``. For ``jax.grad`` wrap the kernel in
        an :class:`evjax.XLACustomKernel` with rules.

    Raises:
        TypeError: ``kernel`` is not ``@numba.njit``, ``outs`` are not
            ``ShapeDtypeStruct``s, or a call's arity or dtypes contradict the
            kernel.
        ValueError: an unknown ``vmap_method`` or bad ``input_output_aliases``.

    Example:
        >>> @numba.njit
        ... def add(x, y, out):
        ...     for i in range(out.size):
        ...         out[i] = x[i] + y[i]
        >>> f = evjax.numba_kernel(add, outs=jax.ShapeDtypeStruct((8,), jnp.float32))
        >>> z = jax.jit(f)(x, y)
    """
    _check_njit(kernel)
    out_structs, single = normalize_outs(outs, who="numba_kernel")
    if vmap_method is not None and vmap_method not in VMAP_METHODS:
        raise ValueError(f"numba_kernel: unknown vmap_method {vmap_method!r}; use one of {VMAP_METHODS}.")
    return NumbaKernelCall(kernel, out_structs, single, vmap_method, input_output_aliases)
