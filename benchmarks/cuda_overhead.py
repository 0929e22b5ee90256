"""Per-call cost of a Numba CUDA kernel called through evjax.

On a GPU, in one run, under ``jax.jit``:
  * a tiny kernel (64-element add) through ``numba_cuda_kernel`` on the
    compiled launch path (a cfunc FFI handler calling ``cuLaunchKernel``),
    on the Python launch path (``EVJAX_NUMBA_CUDA_LAUNCH=python``), and through
    ``numba_cuda_callable``, against ``a + b`` in jnp;
  * the same at 1M elements (the launch is no longer the bottleneck).

Without a GPU it measures what it can: the host-side cost of the two FFI
handlers themselves, called on a hand-built call frame with a no-op driver
(no XLA dispatch in it), which shows the difference between the paths.

Run: ``python benchmarks/cuda_overhead.py``
"""
from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from common import fmt_time, markdown_table, median_times  # noqa: E402
from evjax.backends import numba_cuda as bridge  # noqa: E402


def gpu_benchmark() -> None:
    from numba import cuda

    from evjax import numba_cuda_callable, numba_cuda_kernel

    @cuda.jit
    def add(x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + y[i]

    def add_callable(x, y, out, stream):
        add[math.ceil(out.shape[0] / 256), 256, stream](x, y, out)

    rows = []
    for n in (64, 1 << 20):
        spec = jax.ShapeDtypeStruct((n,), jnp.float32)
        a = jnp.arange(n, dtype=jnp.float32)
        b = jnp.ones(n, jnp.float32)
        os.environ[bridge.LAUNCH_ENV] = "compiled"
        compiled = jax.jit(numba_cuda_kernel(add, spec, launch_dims=n))
        compiled(a, b).block_until_ready()
        os.environ[bridge.LAUNCH_ENV] = "python"
        python = jax.jit(numba_cuda_kernel(add, spec, launch_dims=n, threads_per_block=128))
        python(a, b).block_until_ready()
        os.environ.pop(bridge.LAUNCH_ENV)
        via_callable = jax.jit(numba_cuda_callable(add_callable, spec))
        reference = jax.jit(lambda x, y: x + y)
        for fn in (compiled, python, via_callable):
            np.testing.assert_allclose(fn(a, b), a + b)
        times = median_times({"jnp": lambda: reference(a, b), "compiled": lambda: compiled(a, b),
                              "python": lambda: python(a, b), "callable": lambda: via_callable(a, b)})
        rows.append([f"{n:,}", fmt_time(times["jnp"]), fmt_time(times["compiled"]),
                     f"{times['compiled'] / times['jnp']:.2f}x", fmt_time(times["python"]),
                     f"{times['python'] / times['jnp']:.2f}x", fmt_time(times["callable"])])
    device = jax.devices("gpu")[0].device_kind
    print(f"jit call, add of n float32 elements, {device}; medians, measured interleaved\n")
    print(markdown_table(["n", "jnp a + b", "numba_cuda_kernel (compiled)", "ratio", "(python path)", "ratio",
                          "numba_cuda_callable"], rows))


def host_handler_benchmark() -> None:
    """Host cost of each handler on a fake frame (no GPU, no XLA): what a call adds."""
    import numba
    from numba import types

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from numba_cuda_fakes import FakeApi, Frame

    from numba_cuda_fakes import HANDLER_T

    from evjax.backends import ffi_abi
    from evjax.backends import numba_cuda_launch as launch
    from evjax.backends.intrinsics import as_int, as_voidptr, store_i64

    # compiled stand-ins for the driver's cuLaunchKernel and XLA's Stream_Get
    @numba.cfunc(types.int32(types.voidptr, *[types.uint32] * 7, types.voidptr, types.voidptr, types.voidptr))
    def no_launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return 0

    @numba.cfunc(types.voidptr(types.voidptr))
    def stream_get(args):
        store_i64(as_int(args) + 24, 0xABC0)
        return as_voidptr(0)

    arrays = [np.ones(64, np.float32), np.ones(64, np.float32), np.zeros(64, np.float32)]
    specs = [((64,), np.dtype(np.float32))] * 3
    values, slots = bridge.pack_plan(specs, 2)
    plan = launch.LaunchPlan(tuple(values), tuple(slots), (1, 1, 1), (64, 1, 1), 0, 0x1234, 0, no_launch.address)
    compiled = launch.build(plan, lambda status: "failed")

    class NoOpOverload:  # numba's own launch (arg packing + cuLaunchKernel) would come on top
        def launch(self, arrays, grid, block, stream, shared):
            return None

    run = bridge.PythonLaunch(NoOpOverload(), bridge.DeviceViews(specs), 2, 1, (1, 1, 1), (64, 1, 1), 0,
                              wrap_stream=lambda s: s)
    run.views.cache = [{a.ctypes.data: a} for a in arrays]  # as after the first call: cached views
    python = bridge.PythonHandler("bench", run)
    api = FakeApi()
    api.table[ffi_abi.API_STREAM_GET // 8] = stream_get.address
    frames = {"compiled cfunc handler": Frame(api, arrays[:2], arrays[2:], attributes=compiled.attributes),
              "Python callback handler": Frame(api, arrays[:2], arrays[2:], attributes=python.attributes)}
    rows = []
    for name, handler in (("compiled cfunc handler", compiled.address), ("Python callback handler", python.address)):
        fn = HANDLER_T(handler)
        frame = frames[name]
        best = math.inf
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(2000):
                fn(frame.address)
            best = min(best, (time.perf_counter() - start) / 2000)
        rows.append([name, fmt_time(best)])
    print("No GPU here: host cost of one handler call on a hand-built frame, called through ctypes (which")
    print("itself costs ~1 us), with the driver and XLA stubbed by compiled no-ops. The Python handler's")
    print("number excludes numba's own launch (argument packing, cuLaunchKernel), which comes on top.\n")
    print(markdown_table(["handler", "per call"], rows))


def main() -> None:
    if bridge.gpu_devices() and not bridge.simulator_enabled():
        gpu_benchmark()
    else:
        host_handler_benchmark()


if __name__ == "__main__":
    main()
