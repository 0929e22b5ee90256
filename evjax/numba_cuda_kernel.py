"""``numba_cuda_kernel`` and ``numba_cuda_callable``: Numba CUDA code called from JAX.

Both return a function of JAX arrays that runs on the GPU through the XLA FFI,
on XLA's own stream, without host synchronisation.  ``numba.cuda`` is imported
only when a wrapper is first called.

Without a GPU a call raises a clear error, except when Numba's CUDA simulator
is on (``NUMBA_ENABLE_CUDASIM=1`` before numba is imported): then the kernel
runs in the simulator on the host through ``jax.pure_callback`` (slow; meant
for checking kernel logic on CPU).  In the simulator outputs start filled with
NaN (floats) or a byte pattern, as a GPU's uninitialised buffers would be
arbitrary, so a kernel that forgets to write an element is caught.
"""
from __future__ import annotations

import functools
import math
import threading
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
from .backends import numba_cuda as bridge
from .backends.numba_cpu import NUMBA_TYPE_NAMES
from .outs import normalize_outs

__all__ = ["numba_cuda_kernel", "numba_cuda_callable", "launch_config"]

VMAP_METHODS = ("sequential", "sequential_unrolled")
_sim_lock = threading.Lock()


# ---------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------
def _dims(value, what: str, *, allow_zero: bool) -> tuple[int, ...]:
    items = value if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(items) <= 3:
        raise ValueError(f"{what}={value!r}: give 1 to 3 dimensions (an int or a tuple of up to 3 ints)")
    dims = []
    for d in items:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{what}={value!r}: dimensions must be ints, got {type(d).__name__}")
        if d < 0 or (d == 0 and not allow_zero):
            raise ValueError(f"{what}={value!r}: dimensions must be {'>= 0' if allow_zero else 'positive'}")
        dims.append(int(d))
    return tuple(dims)


def _pad3(dims: tuple[int, ...]) -> tuple[int, int, int]:
    return tuple(dims) + (1,) * (3 - len(dims))  # type: ignore[return-value]


def _split_block(threads_per_block: int, ndim: int) -> tuple[int, ...]:
    """Split a power-of-two thread count over ``ndim`` dims, x largest: 256 -> (16, 16)."""
    exponent = threads_per_block.bit_length() - 1
    parts = [exponent // ndim + (1 if k < exponent % ndim else 0) for k in range(ndim)]
    return tuple(2**p for p in parts)


def launch_config(
    grid=None, block=None, launch_dims=None, threads_per_block: int = 256
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Resolve and check a launch configuration; return 3-D ``(grid, block)``.

    Args:
        grid: blocks per grid (int or tuple of up to 3 ints); with ``block``.
        block: threads per block (int or tuple); with ``grid``.
        launch_dims: total threads instead (int, or tuple for 2-D/3-D): the
            block is ``threads_per_block`` threads (split as 16x16 for 2-D and
            8x8x4 for 3-D at 256), the grid covers ``launch_dims``.
        threads_per_block: block size used with ``launch_dims`` (1 to 1024; a
            power of two for 2-D and 3-D).

    Raises:
        ValueError: both or neither of grid/block and launch_dims, only one of
            grid and block, more than 1024 threads per block, or dimensions out
            of CUDA's limits.
    """
    if isinstance(threads_per_block, (bool, np.bool_)) or not isinstance(threads_per_block, (int, np.integer)):
        raise TypeError(f"threads_per_block must be an int, got {type(threads_per_block).__name__}")
    if not 1 <= threads_per_block <= bridge.MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"threads_per_block={threads_per_block}: CUDA allows 1 to {bridge.MAX_THREADS_PER_BLOCK} threads "
            f"per block (use a multiple of 32, e.g. 128 or 256)."
        )
    explicit = grid is not None or block is not None
    if launch_dims is not None and explicit:
        raise ValueError(
            "give either grid= and block= (explicit launch) or launch_dims= (total threads), not both."
        )
    if launch_dims is None and not explicit:
        raise ValueError(
            "no launch configuration: give grid= and block= (e.g. grid=4, block=256) or launch_dims= "
            "(e.g. launch_dims=n for n threads, launch_dims=(m, n) for a 2-D launch)."
        )
    if launch_dims is not None:
        dims = _dims(launch_dims, "launch_dims", allow_zero=True)
        if len(dims) == 1:
            block_dims: tuple[int, ...] = (int(threads_per_block),)
        elif threads_per_block & (threads_per_block - 1):
            raise ValueError(
                f"threads_per_block={threads_per_block}: a {len(dims)}-D launch_dims needs a power of two "
                f"(e.g. 256, split as 16x16), or give grid= and block= explicitly."
            )
        else:
            block_dims = _split_block(int(threads_per_block), len(dims))
        grid_dims = tuple(-(-d // b) for d, b in zip(dims, block_dims))
    else:
        if grid is None or block is None:
            raise ValueError(f"grid and block go together: got grid={grid!r}, block={block!r}.")
        grid_dims = _dims(grid, "grid", allow_zero=True)
        block_dims = _dims(block, "block", allow_zero=False)
    grid3, block3 = _pad3(grid_dims), _pad3(block_dims)
    threads = math.prod(block3)
    if threads > bridge.MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"block={block3[:len(block_dims)]} has {threads} threads; CUDA allows at most "
            f"{bridge.MAX_THREADS_PER_BLOCK} per block."
        )
    for axis, (b, limit) in enumerate(zip(block3, bridge.MAX_BLOCK_DIMS)):
        if b > limit:
            raise ValueError(f"block dimension {'xyz'[axis]}={b} exceeds CUDA's limit of {limit}.")
    for axis, (g, limit) in enumerate(zip(grid3, bridge.MAX_GRID_DIMS)):
        if g > limit:
            raise ValueError(f"grid dimension {'xyz'[axis]}={g} exceeds CUDA's limit of {limit} blocks.")
    return grid3, block3


def _check_shared_mem(shared_mem) -> int:
    if isinstance(shared_mem, (bool, np.bool_)) or not isinstance(shared_mem, (int, np.integer)):
        raise TypeError(f"shared_mem must be an int number of bytes, got {type(shared_mem).__name__}")
    if shared_mem < 0:
        raise ValueError(f"shared_mem={shared_mem}: must be >= 0 bytes")
    if shared_mem > bridge.MAX_SHARED_MEM_ANY_GPU:
        raise ValueError(
            f"shared_mem={shared_mem} bytes is more dynamic shared memory than any NVIDIA GPU allows per "
            f"block ({bridge.MAX_SHARED_MEM_ANY_GPU} bytes at most; 48 KiB without opt-in). Use global memory "
            f"for larger scratch space."
        )
    return int(shared_mem)


# ---------------------------------------------------------------------------
# Shared machinery of both wrappers
# ---------------------------------------------------------------------------
def _garbage(struct) -> np.ndarray:
    """A writable host array standing for an uninitialised device buffer."""
    dtype = np.dtype(struct.dtype)
    if np.issubdtype(dtype, np.inexact):
        return np.full(struct.shape, np.nan, dtype)
    if dtype == np.bool_:
        return np.ones(struct.shape, dtype)
    count = math.prod(struct.shape)
    return np.full(count * dtype.itemsize, 0x5A, np.uint8).view(dtype).reshape(struct.shape)


class _CudaCall(RawKernelCall):
    """Common part of the callables returned by both wrappers."""

    who = "numba_cuda"
    register_with = "def_numba_cuda_kernel"
    passes_stream = False  # whether the callee takes XLA's stream after outputs and scratch buffers

    def __init__(self, name, outs, single, extra, vmap_method, input_output_aliases, arity):
        if vmap_method is not None and vmap_method not in VMAP_METHODS:
            raise ValueError(
                f"{self.who}: vmap_method={vmap_method!r} is not supported; use one of {VMAP_METHODS}. A kernel's "
                f"launch configuration is fixed for unbatched shapes, so vmap runs it once per example; for a "
                f"batched kernel write one and register it in an evjax.XLACustomKernel with a batching rule."
            )
        super().__init__(name, outs, single)
        self.extra = extra  # scratch buffers: extra FFI results, dropped
        self.vmap_method = vmap_method or "sequential"
        self.input_output_aliases = {int(k): int(v) for k, v in dict(input_output_aliases or {}).items()}
        self.arity = arity

    def _check(self, args) -> None:
        subject = f"{self.who} '{self.name}'"
        n_in, n_scratch = len(args), len(self.extra)
        if self.passes_stream:
            layout = f"inputs, outputs, {'scratch buffers, ' if n_scratch else ''}then the stream"
            trailing_text = (f", {n_scratch} scratch buffers" if n_scratch else "") + " and the stream"
        else:
            layout, trailing_text = "inputs then outputs", ""
        check_arity(
            self.arity,
            n_in,
            len(self.outs),
            subject=subject,
            noun="arguments",
            layout=layout,
            n_trailing=n_scratch + int(self.passes_stream),
            trailing_text=trailing_text,
        )
        arrays = list(args) + list(self.outs) + list(self.extra)
        check_supported_dtypes(arrays, n_in, NUMBA_TYPE_NAMES, subject=subject, backend="Numba CUDA")
        check_input_output_aliases(self.input_output_aliases, args, self.outs)

    def _forward(self, *args):
        self._check(args)
        if bridge.simulator_enabled():
            return self._simulate(args)
        bridge.require_gpu(f"{self.who}({self.name!r})")
        in_specs = [(tuple(a.shape), np.dtype(a.dtype)) for a in args]
        all_outs = list(self.outs) + list(self.extra)
        out_specs = [(tuple(o.shape), np.dtype(o.dtype)) for o in all_outs]
        handler = self._handler(in_specs, out_specs)
        call = jax.ffi.ffi_call(
            handler.target_name,
            all_outs,
            vmap_method=self.vmap_method,
            input_output_aliases=self.input_output_aliases or None,
        )
        return tuple(call(*args, **handler.attributes))[: len(self.outs)]

    def _simulate(self, args):
        # ``host`` must not reference ``self``: the callback lives in the traced
        # jaxpr, which jit's caches (keyed weakly by this object) hold strongly,
        # so a reference to ``self`` would keep every ``jax.jit(wrapper)`` alive.
        outs = list(self.outs)
        aliases = dict(self.input_output_aliases)
        extra = list(self.extra)
        run = self._host_runner()

        def host(*arrays):
            ins = [np.array(a, copy=True) for a in arrays]
            results = [_garbage(o) for o in outs]
            for i_in, i_out in aliases.items():
                results[i_out][...] = ins[i_in]
            scratch = [_garbage(o) for o in extra]
            _kernel_compat.cuda_simulator_threadsafe_shared()
            with _sim_lock:
                run(ins, results, scratch)
            return tuple(results)

        return tuple(jax.pure_callback(host, tuple(outs), *args, vmap_method="sequential"))

    def _handler(self, in_specs, out_specs):  # pragma: no cover - abstract
        raise NotImplementedError

    def _host_runner(self) -> Callable[[list, list, list], None]:  # pragma: no cover - abstract
        """``run(ins, outs, scratch)`` running the callee in the simulator; it holds no reference to ``self``."""
        raise NotImplementedError


class NumbaCudaKernelCall(_CudaCall):
    """The JAX-callable returned by :func:`numba_cuda_kernel`."""

    who = "numba_cuda_kernel"

    def __init__(self, kernel, outs, single, grid, block, shared_mem, vmap_method, input_output_aliases):
        super().__init__(
            kernel.__name__, outs, single, (), vmap_method, input_output_aliases, positional_arity(kernel.py_func)
        )
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.shared_mem = shared_mem

    def _handler(self, in_specs, out_specs):
        return bridge.kernel_handler(
            self.kernel, in_specs, out_specs, self.grid, self.block, self.shared_mem, f"{self.who}({self.name!r})"
        )

    def _host_runner(self):
        return functools.partial(_run_kernel_on_host, self.kernel, self.grid, self.block, self.shared_mem)


class NumbaCudaCallableCall(_CudaCall):
    """The JAX-callable returned by :func:`numba_cuda_callable`."""

    who = "numba_cuda_callable"
    passes_stream = True

    def __init__(self, func, outs, single, scratch, vmap_method, input_output_aliases):
        super().__init__(
            getattr(func, "__name__", "func"), outs, single, scratch, vmap_method, input_output_aliases,
            positional_arity(func),
        )
        self.func = func

    def _handler(self, in_specs, out_specs):
        return bridge.callable_handler(self.func, in_specs, out_specs, f"{self.who}({self.name!r})")

    def _host_runner(self):
        return functools.partial(_run_callable_on_host, self.func)


def _run_kernel_on_host(kernel, grid, block, shared_mem, ins, outs, scratch) -> None:
    """Launch a ``@cuda.jit`` kernel in the simulator."""
    if 0 in grid:
        return
    kernel[grid, block, 0, shared_mem](*ins, *outs)


def _run_callable_on_host(func, ins, outs, scratch) -> None:
    """Call a host function in the simulator, with the stream last."""
    cuda = bridge.cuda_module()
    func(*ins, *outs, *scratch, cuda.stream())


def _check_cuda_kernel(kernel) -> None:
    kind = type(kernel).__name__
    if not _kernel_compat.is_cuda_dispatcher(kernel):
        hint = " (for CPU kernels use evjax.numba_kernel)" if kind == "CPUDispatcher" else ""
        raise TypeError(
            f"numba_cuda_kernel expects a kernel decorated with @numba.cuda.jit, got {kind} "
            f"{getattr(kernel, '__name__', kernel)!r}{hint}. Decorate it: "
            f"`@cuda.jit def kernel(*inputs, *outputs): ...`."
        )
    if _kernel_compat.is_cuda_device_function(kernel):
        raise TypeError(
            f"numba_cuda_kernel: '{kernel.__name__}' is a device function (@cuda.jit(device=True)); it cannot be "
            f"launched. Call it from a @cuda.jit kernel and wrap that kernel."
        )


def numba_cuda_kernel(
    kernel: Callable,
    outs: jax.ShapeDtypeStruct | Sequence[jax.ShapeDtypeStruct],
    *,
    grid: int | Sequence[int] | None = None,
    block: int | Sequence[int] | None = None,
    launch_dims: int | Sequence[int] | None = None,
    threads_per_block: int = 256,
    shared_mem: int = 0,
    vmap_method: str | None = None,
    input_output_aliases: Mapping[int, int] | None = None,
) -> Callable[..., Any]:
    """Make a ``@numba.cuda.jit`` kernel callable from JAX on the GPU.

    The kernel takes its inputs, then its outputs, as device arrays and writes
    the outputs in place (they start uninitialised). It is launched on XLA's
    stream with a fixed configuration, once per call, with no host
    synchronisation; where possible the launch is a compiled FFI handler that
    calls ``cuLaunchKernel`` directly (no Python per call).

    Args:
        kernel: a function decorated with ``@numba.cuda.jit``.
        outs: one ``jax.ShapeDtypeStruct`` (the call returns one array) or a
            sequence of them (the call returns a tuple).
        grid: blocks per grid, an int or a tuple of up to 3 ints; with ``block``.
        block: threads per block, an int or a tuple of up to 3 ints; with ``grid``.
        launch_dims: instead of grid/block, the number of threads to cover: an
            int (1-D) or a tuple for 2-D/3-D launches (blocks of 16x16 threads
            for 2-D at the default ``threads_per_block``).
        threads_per_block: threads per block with ``launch_dims`` (max 1024).
        shared_mem: bytes of dynamic shared memory per block (for
            ``cuda.shared.array(0, dtype)``); above 48 KiB evjax opts in where
            the GPU allows it.
        vmap_method: ``"sequential"`` (default) or ``"sequential_unrolled"``:
            under ``jax.vmap`` the kernel runs once per example.
        input_output_aliases: ``{input_index: output_index}`` for outputs that
            reuse an input's buffer (e.g. a zero-filled accumulator).

    Returns:
        A function of JAX arrays returning the output array(s); it works under
        ``jax.jit`` and ``jax.vmap``.

    Raises:
        TypeError: ``kernel`` is not a ``@cuda.jit`` kernel, or ``outs`` are not
            ``ShapeDtypeStruct``s.
        ValueError: grid/block and launch_dims both or neither given, more than
            1024 threads per block, or too much shared memory.
        RuntimeError: (at call time) no GPU; use the CPU backends there.

    Example:
        >>> @cuda.jit
        ... def add(x, y, out):
        ...     i = cuda.grid(1)
        ...     if i < out.size:
        ...         out[i] = x[i] + y[i]
        >>> f = evjax.numba_cuda_kernel(add, outs=jax.ShapeDtypeStruct((1024,), jnp.float32), launch_dims=1024)
        >>> z = jax.jit(f)(x, y)          # on a CUDA device
    """
    _check_cuda_kernel(kernel)
    out_structs, single = normalize_outs(outs, who="numba_cuda_kernel")
    grid3, block3 = launch_config(grid, block, launch_dims, threads_per_block)
    shared = _check_shared_mem(shared_mem)
    return NumbaCudaKernelCall(kernel, out_structs, single, grid3, block3, shared, vmap_method, input_output_aliases)


def numba_cuda_callable(
    func: Callable,
    outs: jax.ShapeDtypeStruct | Sequence[jax.ShapeDtypeStruct],
    *,
    scratch: Sequence[jax.ShapeDtypeStruct] | None = None,
    vmap_method: str | None = None,
    input_output_aliases: Mapping[int, int] | None = None,
) -> Callable[..., Any]:
    """Make a Python function that launches Numba CUDA kernels callable from JAX.

    ``func(*inputs, *outputs, *scratch, stream)`` receives Numba device arrays
    (zero-copy views of XLA's buffers) and XLA's stream as a Numba stream; it
    may launch several kernels (``kernel[blocks, threads, stream](...)``) and
    must launch everything on ``stream`` and must not synchronise. It runs in
    Python at every call (tens of microseconds of host time).

    Args:
        func: the launcher.
        outs: one ``jax.ShapeDtypeStruct`` or a sequence of them.
        scratch: temporary device buffers, allocated by XLA for the call
            (stream-ordered, no ``cudaMalloc``, no synchronisation) and passed
            after the outputs; they are not returned. ``cuda.device_array``
            inside ``func`` also works but allocates and frees synchronously.
        vmap_method: ``"sequential"`` (default) or ``"sequential_unrolled"``.
        input_output_aliases: ``{input_index: output_index}``.

    Returns:
        A function of JAX arrays returning the output array(s).

    Raises:
        TypeError: ``func`` is not callable, or ``outs``/``scratch`` are not
            ``ShapeDtypeStruct``s.
        RuntimeError: (at call time) no GPU; use the CPU backends there.

    Example:
        >>> def two_steps(x, out, tmp):           # launches kernels on XLA's stream
        ...     double.forall(x.size)(x, tmp)
        ...     shift.forall(x.size)(tmp, out)
        >>> f = evjax.numba_cuda_callable(two_steps, outs=jax.ShapeDtypeStruct(x.shape, x.dtype),
        ...                               scratch=[jax.ShapeDtypeStruct(x.shape, x.dtype)])
        >>> y = jax.jit(f)(x)
    """
    if not callable(func):
        raise TypeError(f"numba_cuda_callable expects a Python function, got {type(func).__name__}")
    if _kernel_compat.is_cuda_dispatcher(func):
        raise TypeError(
            "numba_cuda_callable wraps a Python function that launches kernels (func(*ins, *outs, stream)); "
            "for a single @cuda.jit kernel use numba_cuda_kernel with grid/block or launch_dims."
        )
    out_structs, single = normalize_outs(outs, who="numba_cuda_callable")
    extra = normalize_outs(list(scratch), who="numba_cuda_callable scratch")[0] if scratch else ()
    return NumbaCudaCallableCall(func, out_structs, single, extra, vmap_method, input_output_aliases)
