"""Per-call cost of a Numba kernel called through evjax's compiled FFI handler.

Measures, in one run:
  * the jit call of a 64-element add through ``evjax.numba_kernel`` against
    ``a + b`` in jnp (goal: ratio <= 1.2), and against brainevent's
    ``numba_kernel`` when brainevent is installed;
  * a 1M-element ``prange`` add against jnp;
  * the first call (compile) in a fresh process with an empty cache, and the
    first call in a second process (Numba's disk cache warm).

Run: ``python benchmarks/ffi_overhead.py``
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402

import evjax  # noqa: E402
from common import RESULTS, fmt_time, markdown_table, median_times, save_bar_plot  # noqa: E402

KERNELS = textwrap.dedent(
    """
    import numba

    @numba.njit(cache=True)
    def add64(x, y, out):
        for i in range(out.size):
            out[i] = x[i] + y[i]

    @numba.njit(parallel=True, cache=True)
    def add_parallel(x, y, out):
        for i in numba.prange(out.size):
            out[i] = x[i] + y[i]
    """
)

FIRST_CALL = textwrap.dedent(
    """
    import time, sys
    t0 = time.perf_counter()
    import jax, jax.numpy as jnp
    import evjax
    sys.path.insert(0, {kdir!r})
    from bench_kernels import add64
    t1 = time.perf_counter()
    f = jax.jit(evjax.numba_kernel(add64, jax.ShapeDtypeStruct((64,), jnp.float32)))
    a = jnp.ones(64, jnp.float32)
    f(a, a).block_until_ready()
    t2 = time.perf_counter()
    print(f"FIRST {{t2 - t1:.4f}}")
    """
)


def first_call_times(kernel_dir: str) -> tuple[float, float]:
    """(cold, warm) first-call seconds in fresh processes sharing one cache dir."""
    cache = tempfile.mkdtemp(prefix="evjax-bench-cache-")
    env = dict(os.environ, EVJAX_CACHE_DIR=cache, NUMBA_CACHE_DIR=os.path.join(cache, "numba"))
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = FIRST_CALL.format(kdir=kernel_dir)
    times = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        times.append(float(out.stdout.split("FIRST")[1]))
    return times[0], times[1]


def main() -> None:
    kernel_dir = tempfile.mkdtemp(prefix="evjax-bench-kernels-")
    with open(os.path.join(kernel_dir, "bench_kernels.py"), "w") as f:
        f.write(KERNELS)
    sys.path.insert(0, kernel_dir)
    from bench_kernels import add64, add_parallel

    rows, plot = [], {}
    # --- tiny call -----------------------------------------------------------
    a = jnp.arange(64, dtype=jnp.float32)
    b = jnp.ones(64, jnp.float32)
    tiny = {
        "jnp a + b": jax.jit(lambda a, b: a + b),
        "evjax.numba_kernel": jax.jit(evjax.numba_kernel(add64, jax.ShapeDtypeStruct((64,), jnp.float32))),
    }
    try:
        import brainevent

        tiny["brainevent.numba_kernel"] = jax.jit(
            brainevent.numba_kernel(add64, outs=jax.ShapeDtypeStruct((64,), jnp.float32))
        )
    except Exception as exc:  # noqa: BLE001
        print(f"(brainevent not measured: {type(exc).__name__}: {exc})")
    t_tiny = median_times({k: (lambda f=f: f(a, b)) for k, f in tiny.items()}, rounds=20, calls=200)
    base = t_tiny["jnp a + b"]
    for name, t in t_tiny.items():
        rows.append(["64-element add, jit call", name, fmt_time(t), f"{t / base:.2f}"])
    plot["64-el add"] = t_tiny

    # --- 1M prange -----------------------------------------------------------
    n = 1_000_000
    x = jnp.arange(n, dtype=jnp.float32)
    y = jnp.ones(n, jnp.float32)
    xn, yn, on = np.asarray(x), np.asarray(y), np.empty(n, np.float32)
    big = {
        "jnp a + b": jax.jit(lambda a, b: a + b),
        "evjax.numba_kernel (prange)": jax.jit(
            evjax.numba_kernel(add_parallel, jax.ShapeDtypeStruct((n,), jnp.float32))
        ),
    }
    cands = {k: (lambda f=f: f(x, y)) for k, f in big.items()}
    cands["numba from numpy (limit)"] = lambda: add_parallel(xn, yn, on)
    t_big = median_times(cands, rounds=10, calls=20)
    base = t_big["jnp a + b"]
    for name, t in t_big.items():
        rows.append([f"1M-element add ({numba.get_num_threads()} threads)", name, fmt_time(t), f"{t / base:.2f}"])
    plot["1M add"] = t_big

    # --- first calls ---------------------------------------------------------
    cold, warm = first_call_times(kernel_dir)
    rows.append(["first jit call, empty cache", "evjax.numba_kernel", fmt_time(cold), "-"])
    rows.append(["first jit call, second process (disk cache)", "evjax.numba_kernel", fmt_time(warm),
                 f"{warm / cold:.2f} of cold"])

    print(f"\njax {jax.__version__}, numba {numba.__version__}, {os.cpu_count()} CPUs\n")
    print(markdown_table(["case", "implementation", "median", "ratio to jnp"], rows))
    labels = ["jnp a + b", "evjax.numba_kernel"]
    series = {
        label: [plot["64-el add"].get(label, np.nan) * 1e6,
                plot["1M add"].get(label if label != "evjax.numba_kernel" else "evjax.numba_kernel (prange)") * 1e6]
        for label in labels
    }
    path = save_bar_plot(os.path.join(RESULTS, "ffi_overhead.png"), ["64-element add", "1M-element add"], series,
                         ylabel="median call time (us)", title="evjax.numba_kernel vs jnp (jit)")
    if path:
        print(f"\nplot: {path}")


if __name__ == "__main__":
    main()
