"""Drop-in adapters for code written against other libraries' kernel APIs.

``jax_kernel`` takes the arguments of ``warp.jax_experimental.jax_kernel``
(the module Warp removed; brainevent's Warp tutorial still imports it) and runs
the kernel through :func:`evjax.warp_kernel`, so such code runs unchanged on
Warp's CPU device and on CUDA:

    from evjax.compat import jax_kernel      # was: from warp.jax_experimental import jax_kernel

    relu = jax_kernel(relu_kernel, launch_dims=[n], num_outputs=1, output_dims={"out": (n,)})
    (y,) = relu(x)

Warp is imported only when a returned function first runs.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from . import _kernel_compat
from .backends import warp as bridge
from .warp_kernel import warp_kernel

__all__ = ["jax_kernel"]


def _as_dims(dims) -> tuple[int, ...]:
    return (int(dims),) if np.ndim(dims) == 0 else tuple(int(d) for d in dims)


class _JaxKernelAdapter:
    """The function ``jax_kernel`` returns: builds one ``evjax.warp_kernel`` per call signature."""

    def __init__(self, kernel, num_outputs, launch_dims, output_dims, in_out_argnames):
        if not _kernel_compat.warp_is_kernel(kernel):
            raise TypeError(
                f"jax_kernel expects a function decorated with @warp.kernel, got {type(kernel).__name__}."
            )
        params = _kernel_compat.warp_params(kernel)
        names = [p.label for p in params]
        in_out = list(in_out_argnames or ())
        if len(set(in_out)) != len(in_out):
            raise ValueError(f"jax_kernel: in_out_argnames {in_out} has duplicates.")
        unknown = [n for n in in_out if n not in names]
        if unknown:
            raise ValueError(f"jax_kernel: in_out_argnames {unknown} are not parameters of the kernel: {names}.")
        if not len(in_out) <= num_outputs <= len(params):
            raise ValueError(
                f"jax_kernel: num_outputs={num_outputs} must count the in-out arguments ({len(in_out)}) plus the "
                f"pure outputs, and be at most the kernel's {len(params)} parameters."
            )
        # Warp's convention: parameters are inputs (in-out ones among them), then pure outputs.
        self.n_inputs = len(params) - num_outputs + len(in_out)
        late = [n for n in in_out if names.index(n) >= self.n_inputs]
        if late:
            raise ValueError(
                f"jax_kernel: in-out arguments {late} come after the pure outputs; put them among the inputs."
            )
        self.kernel, self.params, self.in_out = kernel, params, tuple(in_out)
        self.launch_dims, self.output_dims = launch_dims, output_dims
        self._built: dict = {}

    def _first_array_shape(self, args) -> tuple[int, ...]:
        for a in args:
            if np.ndim(a) > 0:
                return tuple(int(d) for d in np.shape(a))
        raise ValueError("jax_kernel: no array argument to infer launch_dims from; pass launch_dims=.")

    def _outs(self, launch, output_dims) -> list[jax.ShapeDtypeStruct]:
        wp = bridge.import_warp()
        outs = []
        for p in self.params[self.n_inputs:]:
            dims = output_dims.get(p.label) if isinstance(output_dims, Mapping) else output_dims
            if isinstance(output_dims, Mapping) and dims is None:
                raise ValueError(f"jax_kernel: output_dims has no entry for output {p.label!r}.")
            shape = launch if dims is None else _as_dims(dims)
            outs.append(jax.ShapeDtypeStruct(shape, np.dtype(wp.dtype_to_numpy(p.type.dtype))))
        return outs

    def __call__(self, *args, launch_dims=None, output_dims=None) -> tuple:
        if len(args) != self.n_inputs:
            raise TypeError(
                f"jax_kernel: kernel '{self.kernel.key}' takes {self.n_inputs} input arrays (in-out ones "
                f"included), got {len(args)}."
            )
        launch = launch_dims if launch_dims is not None else self.launch_dims
        launch = self._first_array_shape(args) if launch is None else _as_dims(launch)
        output_dims = output_dims if output_dims is not None else self.output_dims
        outs = self._outs(launch, output_dims)
        key = (launch, tuple((o.shape, o.dtype) for o in outs))
        call = self._built.get(key)
        if call is None:
            call = warp_kernel(
                self.kernel,
                outs,
                launch_dims=launch,
                in_out_argnames=self.in_out,
                vmap_method="sequential",
                check_launch_dims=False,
            )
            self._built[key] = call
        result = call(*args)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def jax_kernel(
    kernel: Any,
    num_outputs: int = 1,
    vmap_method: str | None = "broadcast_all",
    launch_dims: Any = None,
    output_dims: Any = None,
    in_out_argnames: Sequence[str] | None = None,
    **ignored: Any,
) -> Callable[..., tuple]:
    """Call a ``@warp.kernel`` from JAX with the arguments of ``warp.jax_experimental.jax_kernel``.

    The kernel's parameters are its inputs, then ``num_outputs`` outputs:
    the in-out arguments (named in ``in_out_argnames``; they sit among the
    inputs and are also returned) and the pure outputs (the last parameters,
    allocated by XLA; the kernel writes every element). The returned
    function takes the inputs in parameter order and returns a tuple: the
    in-out arguments' final values, then the pure outputs.

    Args:
        kernel: a function decorated with ``@warp.kernel`` whose parameters are
            all ``wp.array``s.
        num_outputs: in-out arguments plus pure outputs.
        vmap_method: accepted for compatibility; any value makes ``jax.vmap``
            launch the kernel once per batch element (correct for every
            kernel), ``None`` too.
        launch_dims: the launch grid (int or sequence); default: the shape of
            the first array argument. May also be given per call.
        output_dims: the shape of the pure outputs: one shape for all, or a
            dict from parameter name to shape; default ``launch_dims``. May
            also be given per call.
        in_out_argnames: names of the in-out parameters.
        **ignored: other options of Warp's function (``module_preload_mode``,
            ``block_dim``, ...), accepted and ignored.

    Returns:
        A function of JAX arrays returning a tuple of arrays, usable under
        ``jax.jit`` and ``jax.vmap``.

    Raises:
        TypeError: ``kernel`` is not a Warp kernel, or a call passes the wrong
            number of inputs.
        ValueError: inconsistent ``num_outputs``/``in_out_argnames``, or an
            output missing from an ``output_dims`` dict.

    Example:
        >>> fn = jax_kernel(scale_kernel, launch_dims=[n], num_outputs=1, output_dims={"out": (n,)})
        >>> (y,) = fn(x)
    """
    del vmap_method, ignored
    return _JaxKernelAdapter(kernel, num_outputs, launch_dims, output_dims, in_out_argnames)
