"""Scaffolding shared by the raw-kernel wrappers.

:func:`evjax.numba_kernel`, :func:`evjax.numba_cuda_kernel`,
:func:`evjax.numba_cuda_callable` and :func:`evjax.warp_kernel` each return a
:class:`RawKernelCall`: a callable that turns its arguments into JAX arrays,
runs the subclass's ``_forward`` behind a ``jax.custom_jvp`` guard that refuses
differentiation with a message naming the fix, and returns one array or a
tuple.  The functions below are the per-call checks that several wrappers make
(arity, dtypes, ``input_output_aliases``), with their error messages.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Collection, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def not_differentiable_message(who: str, name: str, *, register_with: str) -> str:
    """The message of the error raised when a raw kernel call is differentiated.

    Args:
        who: the wrapper's name, e.g. ``"numba_kernel"``.
        name: the kernel's name.
        register_with: the ``XLACustomKernel`` method that registers such a
            kernel, e.g. ``"def_numba_kernel"``.

    Returns:
        A message naming the fix: an ``evjax.XLACustomKernel`` with rules, or
        ``jax.custom_jvp`` / ``jax.custom_vjp`` around the call.
    """
    return (
        f"{who}({name!r}) has no differentiation rule: a raw kernel is not differentiable. Wrap it in an "
        f"evjax.XLACustomKernel (op.{register_with}) and add rules with op.def_jvp_rule(...) / "
        f"op.def_transpose_rule(...) (see evjax.rules.ad for helpers), or wrap the call in "
        f"jax.custom_jvp / jax.custom_vjp."
    )


def _refuse_jvp(who: str, name: str, register_with: str, primals, tangents):
    """The JVP rule of a raw kernel call: refuse, naming the fix."""
    raise TypeError(not_differentiable_message(who, name, register_with=register_with))


class RawKernelCall:
    """Common part of the JAX-callables returned by the raw-kernel wrappers.

    A subclass sets :attr:`who` and :attr:`register_with` and implements
    ``_forward(*arrays) -> tuple`` (all results, in order).  Calling the
    object converts non-JAX arguments with ``jnp.asarray``, runs ``_forward``
    under a ``jax.custom_jvp`` whose JVP raises a ``TypeError`` (see
    :func:`not_differentiable_message`), and returns the only result when
    :attr:`single` is true, else the tuple.

    Attributes:
        who: the wrapper's name, used in messages (class attribute).
        register_with: the ``XLACustomKernel`` method for this kind of kernel
            (class attribute).
        name: the kernel's name.
        outs: the output specifications (``jax.ShapeDtypeStruct``s).
        single: whether a call returns one array rather than a tuple.
    """

    who: str = "raw_kernel"
    register_with: str = "def_numba_kernel"

    def __init__(self, name: str, outs: Sequence[jax.ShapeDtypeStruct], single: bool) -> None:
        self.name = name
        self.outs = outs
        self.single = single
        self._call = jax.custom_jvp(self._forward)
        # The JVP rule must not reference ``self``: JAX keeps it in the traced
        # jaxpr (the ``custom_jvp_call`` equation's ``jvp_jaxpr_fun``), and jit's
        # caches, keyed weakly by this object, hold that jaxpr strongly, so a
        # rule bound to ``self`` would keep every ``jax.jit(wrapper)`` alive,
        # with its compiled executable.
        self._call.defjvp(functools.partial(_refuse_jvp, self.who, name, self.register_with))

    def __repr__(self) -> str:
        return f"{self.who}({self.name}, outs={list(self.outs)})"

    def _forward(self, *args: jax.Array) -> tuple[jax.Array, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, *args: Any) -> jax.Array | tuple[jax.Array, ...]:
        arrays = [a if isinstance(a, jax.Array) or hasattr(a, "aval") else jnp.asarray(a) for a in args]
        results = self._call(*arrays)
        return results[0] if self.single else results


def positional_arity(func: Callable) -> int | None:
    """How many positional parameters ``func`` takes.

    Returns:
        The count, or ``None`` when it takes ``*args`` / ``**kwargs`` or has no
        inspectable signature (then no arity check is possible).
    """
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def check_arity(
    arity: int | None,
    n_inputs: int,
    n_outputs: int,
    *,
    subject: str,
    noun: str,
    layout: str = "inputs then outputs",
    n_trailing: int = 0,
    trailing_text: str = "",
) -> None:
    """Check that a kernel called as ``kernel(*inputs, *outputs, *trailing)`` takes that many arguments.

    Args:
        arity: the kernel's positional parameter count (``None``: no check).
        n_inputs: arrays passed to the call.
        n_outputs: entries of ``outs``.
        subject: who is called, e.g. ``"numba kernel 'add'"``.
        noun: what the kernel's parameters are, e.g. ``"arrays"``.
        layout: the parameter order, for the message.
        n_trailing: parameters after the outputs (scratch buffers, a stream).
        trailing_text: how the message names them, e.g. ``" and the stream"``.

    Raises:
        TypeError: the counts disagree; the message says which counts fit.
    """
    expected = n_inputs + n_outputs + n_trailing
    if arity is None or arity == expected:
        return
    fits_inputs = arity - expected + n_inputs
    fits_outputs = arity - expected + n_outputs
    fixes = []
    if fits_inputs >= 0:
        fixes.append(f"pass {fits_inputs} inputs")
    if fits_outputs >= 1:
        fixes.append(f"give `outs` {fits_outputs} entries")
    fix = ", or ".join(fixes) if fixes else "fix the kernel's parameters or `outs`"
    raise TypeError(
        f"{subject} takes {arity} {noun} ({layout}) but was called with {n_inputs} inputs and {n_outputs} "
        f"outputs from `outs`{trailing_text}. {fix[0].upper()}{fix[1:]}."
    )


def check_supported_dtypes(
    arrays: Sequence[Any], n_inputs: int, supported: Collection[np.dtype], *, subject: str, backend: str
) -> None:
    """Check that every array (inputs, then outputs) has a dtype the backend takes.

    Args:
        arrays: the inputs followed by the outputs (anything with ``dtype``).
        n_inputs: how many of ``arrays`` are inputs.
        supported: the dtypes the backend takes.
        subject: who is called, e.g. ``"numba kernel 'add'"``.
        backend: the backend's name in the message, e.g. ``"numba"``.

    Raises:
        TypeError: an array's dtype is not supported; the message lists those that are.
    """
    for i, a in enumerate(arrays):
        dt = np.dtype(a.dtype)
        if dt not in supported:
            what = f"input {i}" if i < n_inputs else f"output {i - n_inputs}"
            raise TypeError(
                f"{subject}: {what} has dtype {dt}, which {backend} cannot take. Supported: "
                f"{', '.join(sorted(str(d) for d in supported))}."
            )


def check_input_output_aliases(
    aliases: Mapping[int, int], inputs: Sequence[Any], outputs: Sequence[Any]
) -> None:
    """Check ``{input_index: output_index}`` aliases against a call's inputs and outputs.

    Raises:
        ValueError: an index is out of range, or an aliased input and output
            differ in shape or dtype.
    """
    n_in, n_out = len(inputs), len(outputs)
    for i_in, i_out in aliases.items():
        if not (0 <= i_in < n_in and 0 <= i_out < n_out):
            raise ValueError(
                f"input_output_aliases {{{i_in}: {i_out}}} is out of range for {n_in} inputs and {n_out} outputs."
            )
        a, o = inputs[i_in], outputs[i_out]
        if tuple(a.shape) != tuple(o.shape) or np.dtype(a.dtype) != np.dtype(o.dtype):
            raise ValueError(
                f"input_output_aliases: input {i_in} ({a.dtype}{list(a.shape)}) must match output {i_out} "
                f"({o.dtype}{list(o.shape)}) in shape and dtype."
            )
