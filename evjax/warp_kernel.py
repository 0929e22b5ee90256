"""``warp_kernel``: call a ``@warp.kernel`` from JAX, on CPU and on CUDA.

Warp is imported only when one of these functions runs, never by ``import evjax``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import _compat, _kernel_compat
from ._wrapper import RawKernelCall, not_differentiable_message
from .backends import ffi_abi
from .backends import warp as bridge
from .outs import normalize_outs
from .rules import batching as batching_rules

__all__ = ["warp_kernel", "jaxinfo_to_warpinfo", "jaxtype_to_warptype", "WarpKernelCall"]

VMAP_METHODS = ("sequential",)
# Warp's scalar type names equal numpy's for every dtype both share.
_WARP_NAMES = {dt: dt.name for dt in ffi_abi.COMMON_KERNEL_DTYPES}


# ---------------------------------------------------------------------------
# Type conversion
# ---------------------------------------------------------------------------
def jaxtype_to_warptype(dtype) -> Any:
    """The Warp scalar type of a JAX/numpy dtype.

    Supported: float16/32/64, int8 to int64, uint8 to uint64 and bool.

    Args:
        dtype: anything ``numpy.dtype`` accepts (``jnp.float32``, ``"int32"``...).

    Returns:
        The Warp scalar type, e.g. ``warp.float32``.

    Raises:
        TypeError: the dtype has no Warp counterpart (bfloat16, complex...).

    Example:
        >>> evjax.jaxtype_to_warptype(jnp.int32) is warp.int32
        True
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    name = _WARP_NAMES.get(dt) if dt is not None else None
    if name is None:
        supported = ", ".join(sorted(_WARP_NAMES.values()))
        raise TypeError(f"dtype {dtype!r} has no Warp scalar type; supported: {supported}.")
    wp = bridge.import_warp()
    return getattr(wp, name)


def jaxinfo_to_warpinfo(info: jax.ShapeDtypeStruct) -> Any:
    """The Warp array type (``warp.array(dtype=..., ndim=...)``) of a JAX array description.

    Args:
        info: a ``jax.ShapeDtypeStruct`` (or anything with ``shape`` and ``dtype``)
            of rank 1 to 4.

    Raises:
        TypeError: unsupported dtype, or ``info`` has no shape/dtype.
        ValueError: rank 0 or above 4 (Warp arrays have 1 to 4 dimensions).

    Example:
        >>> t = evjax.jaxinfo_to_warpinfo(jax.ShapeDtypeStruct((8, 4), jnp.float32))
        >>> @wp.kernel
        ... def k(m: t): ...                 # a 2-d float32 array parameter
    """
    if not (hasattr(info, "shape") and hasattr(info, "dtype")):
        raise TypeError(f"expected a jax.ShapeDtypeStruct, got {type(info).__name__} {info!r}")
    ndim = len(info.shape)
    if not 1 <= ndim <= 4:
        raise ValueError(
            f"Warp arrays have 1 to 4 dimensions; got shape {tuple(info.shape)}. Reshape scalars to (1,)."
        )
    wp = bridge.import_warp()
    return wp.array(dtype=jaxtype_to_warptype(info.dtype), ndim=ndim)


def _warp_type_name(t) -> str:
    return getattr(t, "__name__", str(t))


# ---------------------------------------------------------------------------
# The primitive (one for all Warp kernels; per-platform lowering)
# ---------------------------------------------------------------------------
warp_call_p = _compat.Primitive("evjax_warp_call")
warp_call_p.multiple_results = True


def _abstract_eval(*avals, kernel, launch, mask, n_params, results, aliases):
    return [_compat.ShapedArray(shape, dtype) for shape, dtype in results]


def _lower_cpu(ctx, *operands, kernel, launch, mask, n_params, results, aliases):
    function = bridge.load_cpu(kernel)
    attr = bridge.launch_attr(n_params, mask, _kernel_dim(kernel), launch, [(function, 0)])
    rule = jax.ffi.ffi_lowering(bridge.cpu_target(), operand_output_aliases=dict(aliases) or None)
    return rule(ctx, *operands, **{bridge.ATTR_NAME: attr})


def _lower_cuda(ctx, *operands, kernel, launch, mask, n_params, results, aliases):
    table, options = bridge.load_cuda(kernel)
    attr = bridge.launch_attr(
        n_params,
        mask,
        _kernel_dim(kernel),
        launch,
        table,
        block_dim=options["block_dim"],
        grid_stride=options["grid_stride"],
        cluster_dim=options["cluster_dim"],
        smem=options["smem"],
        launch_fn=bridge.cuda_launch_address(),
    )
    rule = jax.ffi.ffi_lowering(bridge.cuda_target(), operand_output_aliases=dict(aliases) or None)
    return rule(ctx, *operands, **{bridge.ATTR_NAME: attr})


def _no_jvp(primals, tangents, *, kernel, **params):
    raise TypeError(not_differentiable_message("warp_kernel", kernel.key, register_with="def_warp_kernel"))


warp_call_p.def_impl(functools.partial(_compat.apply_primitive, warp_call_p))
warp_call_p.def_abstract_eval(_abstract_eval)
_compat.register_lowering(warp_call_p, _lower_cpu, platform="cpu")
_compat.register_lowering(warp_call_p, _lower_cuda, platform="cuda")
_compat.primitive_jvps[warp_call_p] = _no_jvp


def _batch_rule(args, axes, **params):
    """Sequential vmap: one launch per example (correct for index-driven kernels)."""
    return batching_rules.sequential_batch(warp_call_p, args, axes, **params)


_compat.primitive_batchers[warp_call_p] = _batch_rule


def _kernel_dim(kernel) -> int:
    return _kernel_compat.warp_kernel_dim(kernel)


# ---------------------------------------------------------------------------
# The wrapper
# ---------------------------------------------------------------------------
def _check_kernel(kernel):
    bridge.import_warp()
    if not _kernel_compat.warp_is_kernel(kernel):
        name = getattr(kernel, "__name__", repr(kernel))
        raise TypeError(
            f"warp_kernel expects a function decorated with @warp.kernel, got {type(kernel).__name__} "
            f"{name!r}. Decorate it: `@wp.kernel def k(x: wp.array(dtype=wp.float32), ...): ...` "
            f"(for Numba kernels use evjax.numba_kernel)."
        )
    for arg in _kernel_compat.warp_params(kernel):
        if not _kernel_compat.warp_is_array_type(arg.type):
            raise TypeError(
                f"warp kernel '{kernel.key}': parameter '{arg.label}' is {_warp_type_name(arg.type)}; "
                f"evjax passes JAX arrays only, so every parameter must be a wp.array. Pass a scalar "
                f"as a 1-element array, or bind it in a kernel generator."
            )


class WarpKernelCall(RawKernelCall):
    """The JAX-callable returned by :func:`warp_kernel`."""

    who = "warp_kernel"
    register_with = "def_warp_kernel"

    def __init__(self, kernel, outs, single, dims, in_out, check_launch_dims):
        super().__init__(kernel.key, outs, single)
        self.kernel = kernel
        self.dims = dims
        self.check_launch_dims = check_launch_dims
        params = _kernel_compat.warp_params(kernel)
        names = [a.label for a in params]
        n_outs = len(outs)
        if n_outs > len(params):
            raise TypeError(
                f"warp kernel '{kernel.key}' has {len(params)} parameters, fewer than the {n_outs} outputs in `outs`."
            )
        unknown = [n for n in in_out if n not in names]
        if unknown:
            raise ValueError(f"in_out_argnames {unknown} are not parameters of warp kernel '{kernel.key}': {names}")
        self.pure_out = list(range(len(params) - n_outs, len(params)))
        clash = [n for n in in_out if names.index(n) in self.pure_out]
        if clash:
            raise ValueError(
                f"in_out_argnames {clash} are among the last {n_outs} parameters, which `outs` makes pure "
                f"outputs. A parameter is either an in-out buffer (passed in) or a pure output (in `outs`)."
            )
        if len(params) > bridge.MAX_PARAMS:
            raise ValueError(f"warp kernel '{kernel.key}' has {len(params)} parameters; at most {bridge.MAX_PARAMS}")
        self.in_out = sorted(names.index(n) for n in in_out)
        self.inputs = [k for k in range(len(params)) if k not in self.pure_out]
        self.written = sorted(self.in_out + self.pure_out)

    def __repr__(self) -> str:
        return f"warp_kernel({self.kernel.key}, outs={list(self.outs)}, launch_dims={self.dims})"

    def _check_arg(self, kernel, k, value, what):
        label = _kernel_compat.warp_params(kernel)[k].label
        annotation = _kernel_compat.warp_params(kernel)[k].type
        dt = np.dtype(value.dtype)
        if dt not in _WARP_NAMES:
            raise TypeError(
                f"warp kernel '{kernel.key}': {what} '{label}' has dtype {dt}, which Warp "
                f"cannot take. Supported: {', '.join(sorted(_WARP_NAMES.values()))}."
            )
        ndim = len(value.shape)
        if not 1 <= ndim <= 4:
            raise ValueError(
                f"warp kernel '{kernel.key}': {what} '{label}' has shape {tuple(value.shape)}; "
                f"Warp arrays have 1 to 4 dimensions (reshape scalars to (1,))."
            )
        lead_stride = int(np.prod(value.shape[1:], dtype=np.int64)) * dt.itemsize
        if lead_stride >= 2**31 or any(d >= 2**31 for d in value.shape):
            raise ValueError(
                f"warp kernel '{kernel.key}': {what} '{label}' of shape {tuple(value.shape)} "
                f"is too large for Warp's int32 shapes and byte strides."
            )
        return dt, ndim, annotation

    def _specialize(self, args):
        """Check the arguments against the kernel's annotations; the (possibly overloaded) kernel."""
        wp = bridge.import_warp()
        kernel = self.kernel
        params = _kernel_compat.warp_params(kernel)
        if len(args) != len(self.inputs):
            labels = [params[k].label for k in self.inputs]
            raise TypeError(
                f"warp kernel '{kernel.key}' takes {len(self.inputs)} arrays {labels} (every parameter that is "
                f"not a pure output; in-out buffers carry their initial values), but was called with {len(args)}."
            )
        values = {k: a for k, a in zip(self.inputs, args)}
        values.update({k: o for k, o in zip(self.pure_out, self.outs)})
        if _kernel_compat.warp_is_generic(kernel):
            types = []
            for k in range(len(params)):
                dt, ndim, _ = self._check_arg(kernel, k, values[k], "argument")
                types.append(wp.array(dtype=jaxtype_to_warptype(dt), ndim=ndim))
            kernel = _kernel_compat.warp_specialize(kernel, types)
        for k in range(len(params)):
            what = "output" if k in self.pure_out else ("in-out argument" if k in self.in_out else "argument")
            dt, ndim, annotation = self._check_arg(kernel, k, values[k], what)
            want = annotation.dtype
            if jaxtype_to_warptype(dt) is not want or ndim != annotation.ndim:
                raise TypeError(
                    f"warp kernel '{kernel.key}': {what} '{params[k].label}' is annotated "
                    f"wp.array(dtype={_warp_type_name(want)}, ndim={annotation.ndim}) but gets "
                    f"{dt}{list(values[k].shape)} ({ndim}-d). Pass {_warp_type_name(want)} arrays of rank "
                    f"{annotation.ndim}, or fix the annotation / `outs`."
                )
        kdim = _kernel_dim(kernel)
        if len(self.dims) != kdim:
            raise ValueError(
                f"warp kernel '{kernel.key}': launch_dims {self.dims} has {len(self.dims)} dimension(s) but the "
                f"kernel's wp.tid() returns {kdim}. Give launch_dims exactly {kdim} dimension(s)."
            )
        if self.check_launch_dims:
            for k, o in zip(self.pure_out, self.outs):
                if tuple(o.shape[: len(self.dims)]) != self.dims:
                    raise ValueError(
                        f"warp kernel '{kernel.key}': launch_dims {self.dims} do not match output "
                        f"'{params[k].label}' of shape {tuple(o.shape)}. A pure output is only written where a "
                        f"thread runs and XLA does not zero it, so its leading dimensions must equal launch_dims. "
                        f"Launch one thread per output element, or make it an in-out buffer "
                        f"(in_out_argnames=[...]) with initial values (e.g. zeros for atomic accumulation), or "
                        f"pass check_launch_dims=False if the kernel writes every element anyway."
                    )
        return kernel

    def _forward(self, *args):
        kernel = self._specialize(args)
        plain = [i for i, k in enumerate(self.inputs) if k not in self.in_out]
        carried = [i for i, k in enumerate(self.inputs) if k in self.in_out]
        operands = [args[i] for i in plain] + [args[i] for i in carried]
        mask = 0
        for k in self.written:
            mask |= 1 << k
        shapes = {k: (tuple(int(d) for d in o.shape), np.dtype(o.dtype)) for k, o in zip(self.pure_out, self.outs)}
        for i in carried:
            k = self.inputs[i]
            shapes[k] = (tuple(int(d) for d in args[i].shape), np.dtype(args[i].dtype))
        results = tuple(shapes[k] for k in self.written)
        aliases = tuple(
            (len(plain) + j, self.written.index(self.inputs[i])) for j, i in enumerate(carried)
        )
        values = warp_call_p.bind(
            *operands,
            kernel=kernel,
            launch=self.dims,
            mask=mask,
            n_params=len(_kernel_compat.warp_params(kernel)),
            results=results,
            aliases=aliases,
        )
        return tuple(values)


def warp_kernel(
    kernel: Any,
    outs: jax.ShapeDtypeStruct | Sequence[jax.ShapeDtypeStruct],
    *,
    launch_dims: int | Sequence[int],
    in_out_argnames: Sequence[str] = (),
    vmap_method: str | None = None,
    check_launch_dims: bool = True,
) -> Callable[..., Any]:
    """Make a ``@warp.kernel`` callable from JAX, on CPU (Warp's CPU device) and CUDA.

    Every kernel parameter must be a ``wp.array``.  The **last** ``len(outs)``
    parameters are *pure outputs*: XLA allocates them and the kernel must write
    every element (they are not zeroed).  Parameters named in
    ``in_out_argnames`` are *in-out buffers*: the call passes their initial
    value, the kernel updates them (e.g. with ``wp.atomic_add``) and the call
    returns the final value; this is the pattern for scatter/accumulation.
    All other parameters are inputs.

    The call takes one array per parameter that is not a pure output, in the
    kernel's parameter order.  It returns the written parameters (in-out and
    pure outputs) in parameter order: a tuple, or a single array when ``outs``
    is one ``ShapeDtypeStruct`` and there is no in-out buffer.

    On CPU, a compiled FFI handler calls Warp's compiled entry point directly
    (no Python per call; Warp's CPU kernels run serially on one thread).  On
    CUDA the kernel is launched on XLA's stream, zero copy, without host
    synchronisation (CUDA-graph compatible).

    Args:
        kernel: a function decorated with ``@warp.kernel`` (generic kernels
            with ``dtype=Any`` are specialised to the argument dtypes).
        outs: one ``jax.ShapeDtypeStruct`` or a sequence of them (may be empty
            when every result is an in-out buffer).
        launch_dims: the launch grid: an int or a tuple of up to 4 ints, with as
            many dimensions as the kernel's ``wp.tid()`` returns.
        in_out_argnames: names of in-out parameters.
        vmap_method: ``None`` or ``"sequential"``: ``jax.vmap`` loops over the
            batch, launching the kernel once per example (correct for any
            kernel, index-driven ones included).
        check_launch_dims: require the leading dimensions of each pure output
            to equal ``launch_dims``.

    Returns:
        A function of JAX arrays, usable under ``jax.jit`` and ``jax.vmap``.
        For ``jax.grad``, wrap it in an :class:`evjax.XLACustomKernel` with rules.

    Raises:
        TypeError: ``kernel`` is not a Warp kernel, a parameter is not an array,
            or a call's arity/dtypes/ranks contradict the annotations.
        ValueError: bad ``launch_dims`` (or not matching the outputs or the
            kernel's ``wp.tid()`` dimensionality), unknown ``in_out_argnames``.
        ImportError: warp-lang is not installed (``pip install evjax[warp]``).

    Example:
        >>> @wp.kernel
        ... def scale(x: wp.array(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
        ...     i = wp.tid()
        ...     out[i] = 2.0 * x[i]
        >>> f = evjax.warp_kernel(scale, jax.ShapeDtypeStruct((8,), jnp.float32), launch_dims=8)
        >>> y = jax.jit(f)(jnp.arange(8.0, dtype=jnp.float32))     # Warp's CPU device or CUDA
    """
    _check_kernel(kernel)
    dims = bridge.normalize_launch_dims(launch_dims)
    if isinstance(outs, (list, tuple)) and len(outs) == 0:
        if not in_out_argnames:
            raise TypeError("warp_kernel: `outs` is empty and there is no in-out buffer: the call would return nothing.")
        out_structs, single = (), False
    else:
        out_structs, single = normalize_outs(outs, who="warp_kernel")
    if isinstance(in_out_argnames, str):
        in_out_argnames = (in_out_argnames,)
    if vmap_method is not None and vmap_method not in VMAP_METHODS:
        raise ValueError(
            f"warp_kernel: vmap_method {vmap_method!r} is not supported; use None or 'sequential'. For a "
            f"batched kernel, register it in an evjax.XLACustomKernel with a batching rule."
        )
    single = single and not in_out_argnames
    return WarpKernelCall(kernel, out_structs, single, dims, tuple(in_out_argnames), check_launch_dims)
