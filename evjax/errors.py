"""The exceptions evjax raises about kernels and backends.

Each one also derives from the builtin exception that code written before it
already catches, so ``except ValueError`` and ``except RuntimeError`` keep
working:

* :class:`KernelError`: the base class of the three below.
* :class:`BackendNotAvailableError` (a ``ValueError``): the backend asked for
  cannot run: the op lacks it on the platform, or its library is not installed.
* :class:`KernelNotFoundError` (a ``BackendNotAvailableError`` and a
  ``NotImplementedError``): the op has no kernel for the platform and no
  reference to fall back on.
* :class:`KernelCompilationError` (a ``RuntimeError``): a kernel generator
  failed to build the kernel of one signature.

Errors in the arguments of a call (a malformed CSR structure, a complex
operand) are plain ``ValueError`` / ``TypeError``, as in NumPy and JAX.

This module imports nothing, so any layer of evjax may raise these.

Example:
    >>> try:                  # on a machine without a GPU
    ...     evjax.csrmv(data, indices, indptr, v, shape=shape, backend="numba_cuda")
    ... except evjax.errors.BackendNotAvailableError as err:
    ...     print(err)        # names the op, the platform and the backends it has there
"""
from __future__ import annotations

__all__ = ["KernelError", "BackendNotAvailableError", "KernelNotFoundError", "KernelCompilationError"]


class KernelError(Exception):
    """Base class of evjax's errors about an op's kernels and backends."""


class BackendNotAvailableError(KernelError, ValueError):
    """The backend chosen for an op cannot run on the platform.

    The op has no backend of that name there, or the backend's library is not
    installed.  The message names the op, the platform, how the backend was
    chosen and the backends available instead.
    """


class KernelNotFoundError(BackendNotAvailableError, NotImplementedError):
    """An op has no kernel for the platform it is compiled for, and no reference.

    The message names the op and the platforms it has kernels on.
    """


class KernelCompilationError(KernelError, RuntimeError):
    """A kernel generator raised while building the kernel of one signature.

    The message names the op, the platform, the backend and the other
    backends available on that platform; the generator's own exception is the
    ``__cause__``.
    """
