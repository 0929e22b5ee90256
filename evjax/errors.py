"""The exceptions evjax raises about kernels and backends, under evjax's and brainevent's names.

Every class derives from :class:`BrainEventError` (brainevent 0.3.0's base
name), and each one evjax raised before also derives from the builtin
exception that code written before it already catches, so ``except
ValueError`` and ``except RuntimeError`` keep working:

* :class:`BrainEventError`: the base of every class here.
* :class:`KernelError`: the base of the errors about an op's kernels and backends.
* :class:`BackendNotAvailableError` (a ``ValueError``; brainevent's name for
  it is :data:`KernelNotAvailableError`): the backend asked for cannot run:
  the op lacks it on the platform, or its library is not installed.
* :class:`KernelFallbackExhaustedError` (a ``BackendNotAvailableError``):
  nothing is left to fall back on: no backend of the op can run on the
  platform, and it has no reference.
* :class:`KernelNotFoundError` (a ``KernelFallbackExhaustedError`` and a
  ``NotImplementedError``): what evjax raises in that case: the op has no
  kernel for the platform and no reference.
* :class:`CompilationError` (a ``RuntimeError``): building machine code
  failed; it carries ``compiler_output``, ``command`` and ``stage``.
* :class:`KernelCompilationError` (a ``CompilationError``): a kernel
  generator failed to build the kernel of one signature.
* :class:`KernelToolchainError` (an ``ImportError``): a library or tool a
  backend needs is missing (Warp's ``WarpNotInstalledError`` is one).
* :class:`KernelRegistrationError` (a ``ValueError``): a kernel cannot be
  registered as asked (e.g. under the name ``"reference"``).
* :class:`KernelExecutionError` (a ``RuntimeError``), :class:`MathError` (an
  ``ArithmeticError``): brainevent's names for a kernel that failed while
  running and for a mathematical failure; evjax raises neither itself (a
  failing compiled kernel surfaces as XLA's runtime error), they are there
  for code that raises or catches them.
* :class:`UnsupportedOperationError` (a ``TypeError``): an operation evjax
  does not support on these operands (``sparse @ sparse``, ``JITC @ JITC``).

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

__all__ = [
    "BrainEventError", "KernelError", "BackendNotAvailableError", "KernelNotAvailableError",
    "KernelFallbackExhaustedError", "KernelNotFoundError", "CompilationError", "KernelCompilationError",
    "KernelToolchainError", "KernelRegistrationError", "KernelExecutionError", "MathError",
    "UnsupportedOperationError", "BenchmarkDataFnNotProvidedError",
]


class BrainEventError(Exception):
    """Base class of every exception in :mod:`evjax.errors` (brainevent's name for its base).

    Example:
        >>> try:
        ...     y = evjax.csrmv(data, indices, indptr, v, shape=shape, backend="numba_cuda")
        ... except evjax.BrainEventError:   # any of evjax's kernel and backend errors
        ...     y = evjax.csrmv(data, indices, indptr, v, shape=shape, backend="reference")
    """


class KernelError(BrainEventError):
    """Base class of evjax's errors about an op's kernels and backends.

    Example:
        >>> issubclass(evjax.errors.KernelCompilationError, evjax.KernelError)
        True
    """


class BackendNotAvailableError(KernelError, ValueError):
    """The backend chosen for an op cannot run on the platform (brainevent: ``KernelNotAvailableError``).

    The op has no backend of that name there, or the backend's library is not
    installed.  The message names the op, the platform, how the backend was
    chosen and the backends available instead.

    Example:
        >>> try:
        ...     evjax.csrmv(data, indices, indptr, v, shape=shape, backend="no_such_backend")
        ... except evjax.KernelNotAvailableError as err:
        ...     print(err)    # lists the known backends
    """


# brainevent's name: the same condition
KernelNotAvailableError = BackendNotAvailableError


class KernelFallbackExhaustedError(BackendNotAvailableError):
    """No backend of an op can run on the platform, and it has no reference to fall back on.

    Example:
        >>> op = evjax.XLACustomKernel("gpu_only")   # kernels on gpu only, no reference
        >>> try:
        ...     op(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)])   # on a CPU
        ... except evjax.KernelFallbackExhaustedError as err:
        ...     print(err)
    """


class KernelNotFoundError(KernelFallbackExhaustedError, NotImplementedError):
    """An op has no kernel for the platform it is compiled for, and no reference.

    The message names the op and the platforms it has kernels on.

    Example:
        >>> issubclass(evjax.errors.KernelNotFoundError, NotImplementedError)
        True
    """


class CompilationError(KernelError, RuntimeError):
    """Building machine code failed.

    Args:
        message: what failed.
        compiler_output: the compiler's output, if any.
        command: the command or call that failed, if any.
        stage: the step that failed (``"compile"`` by default).

    Example:
        >>> err = evjax.CompilationError("nvcc failed", compiler_output="...", command="nvcc k.cu")
        >>> err.stage
        'compile'
    """

    def __init__(self, message: str = "", compiler_output: str = "", command: str = "", stage: str = "compile"):
        super().__init__(message)
        self.message = message
        self.compiler_output = compiler_output
        self.command = command
        self.stage = stage


class KernelCompilationError(CompilationError):
    """A kernel generator raised while building the kernel of one signature.

    The message names the op, the platform, the backend and the other
    backends available on that platform; the generator's own exception is the
    ``__cause__``.

    Args:
        message: what failed.
        compiler_output, command, stage: as in :class:`CompilationError`.

    Example:
        >>> try:
        ...     y = op(x, outs=outs, backend="numba")
        ... except evjax.KernelCompilationError as err:
        ...     print(err.__cause__)   # what the generator raised
    """


class KernelToolchainError(KernelError, ImportError):
    """A library or tool a backend needs is not installed.

    Example:
        >>> try:
        ...     evjax.backends.warp.import_warp()
        ... except evjax.KernelToolchainError as err:
        ...     print(err)    # says what to install
    """


class KernelRegistrationError(KernelError, ValueError):
    """A kernel cannot be registered on an op as asked.

    Example:
        >>> try:
        ...     op.def_kernel("reference", "cpu", generator)
        ... except evjax.KernelRegistrationError as err:
        ...     print(err)    # use def_reference
    """


class KernelExecutionError(KernelError, RuntimeError):
    """A kernel failed while running (brainevent's name; evjax does not raise it itself).

    Example:
        >>> raise evjax.KernelExecutionError("my kernel: status 3")
    """


class MathError(BrainEventError, ArithmeticError):
    """A mathematical operation failed (brainevent's name; evjax does not raise it itself).

    Example:
        >>> raise evjax.MathError("the matrix is singular")
    """


class UnsupportedOperationError(BrainEventError, TypeError, NotImplementedError):
    """An operation evjax does not support on these operands (also a ``TypeError``, and a
    ``NotImplementedError`` as brainevent raises for some of them, e.g. ``Dense * CSR``).

    Example:
        >>> try:
        ...     W @ W   # sparse @ sparse
        ... except evjax.UnsupportedOperationError as err:
        ...     print(err)   # says what to do instead
    """


class BenchmarkDataFnNotProvidedError(BrainEventError, LookupError):
    """:meth:`evjax.XLACustomKernel.benchmark` was called on an op with no benchmark data function
    (register one with :meth:`~evjax.XLACustomKernel.def_benchmark_data`).

    Example:
        >>> op.def_benchmark_data(lambda *, platform: [evjax.BenchmarkConfig("small", (x,), dict(outs=outs))])
    """
