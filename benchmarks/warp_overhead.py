"""Per-call cost of a Warp kernel called from JAX, and the Warp CSR kernels.

Measures, in one run (medians, candidates interleaved round by round):

* the jit call of a 64-element add through ``evjax.warp_kernel``, through
  Warp's own ``wp.jax_kernel`` and as ``a + b`` in jnp (goal: evjax / jnp <= 2);
* the first call in a fresh process with an empty Warp kernel cache (cold
  compile) and in a second process (warm: Warp's cache and Numba's on disk);
* the CSR operators with ``backend="warp"`` against the default Numba backend
  and a dense jnp product: ``spikes @ W`` (event, scatter), a batch of 32 spike
  vectors, and the float ``W @ v`` (gather).

Run: ``python benchmarks/warp_overhead.py [--quick]``; writes
``benchmarks/results/warp_overhead.md``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import evjax  # noqa: E402
from common import RESULTS, fmt_time, markdown_table, median_times  # noqa: E402

KERNELS = textwrap.dedent(
    """
    import warp as wp

    @wp.kernel(enable_backward=False)
    def add64(a: wp.array(dtype=wp.float32), b: wp.array(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
        i = wp.tid()
        out[i] = a[i] + b[i]
    """
)

FIRST_CALL = textwrap.dedent(
    """
    import sys, time
    t0 = time.perf_counter()
    import jax, jax.numpy as jnp
    import evjax
    import warp as wp
    wp.config.quiet = True
    sys.path.insert(0, {kdir!r})
    from bench_warp_kernels import add64
    t1 = time.perf_counter()
    f = jax.jit(evjax.warp_kernel(add64, jax.ShapeDtypeStruct((64,), jnp.float32), launch_dims=64))
    a = jnp.ones(64, jnp.float32)
    f(a, a).block_until_ready()
    t2 = time.perf_counter()
    from evjax.primitives import csr
    x = jnp.ones(3, jnp.float32)
    g = jax.jit(lambda d, i, p, v: csr.csrmv(d, i, p, v, shape=(2, 3), backend="warp"))
    g(jnp.ones(2, jnp.float32), jnp.asarray([0, 2], jnp.int32), jnp.asarray([0, 1, 2], jnp.int32), x).block_until_ready()
    t3 = time.perf_counter()
    print(f"FIRST {{t2 - t1:.4f}} CSR {{t3 - t2:.4f}}")
    """
)


def first_call_times(kernel_dir: str) -> list[tuple[float, float]]:
    """[(tiny kernel, CSR module)] first-call seconds: cold cache, then a second process."""
    cache = tempfile.mkdtemp(prefix="evjax-warp-bench-cache-")
    env = dict(os.environ, EVJAX_CACHE_DIR=cache, EVJAX_WARP_CACHE_DIR=os.path.join(cache, "warp"),
               NUMBA_CACHE_DIR=os.path.join(cache, "numba"))
    env.pop("WARP_CACHE_PATH", None)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = FIRST_CALL.format(kdir=kernel_dir)
    times = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        fields = out.stdout.split("FIRST")[1].split()
        times.append((float(fields[0]), float(fields[2])))
    return times


def tiny_call(rows: list, add64) -> None:
    import warp as wp

    a = jnp.arange(64, dtype=jnp.float32)
    b = jnp.ones(64, jnp.float32)
    cands = {
        "jnp a + b": jax.jit(lambda a, b: a + b),
        "evjax.warp_kernel": jax.jit(evjax.warp_kernel(add64, jax.ShapeDtypeStruct((64,), jnp.float32), launch_dims=64)),
    }
    try:
        theirs = wp.jax_kernel(add64, launch_dims=64, output_dims=(64,))
        cands["wp.jax_kernel"] = jax.jit(lambda a, b: theirs(a, b)[0])
    except Exception as exc:  # noqa: BLE001
        print(f"(wp.jax_kernel not measured: {type(exc).__name__}: {exc})")
    for f in cands.values():
        np.testing.assert_allclose(np.asarray(f(a, b)), np.asarray(a + b))
    t = median_times({k: (lambda f=f: f(a, b)) for k, f in cands.items()}, rounds=20, calls=200)
    base = t["jnp a + b"]
    for name, value in t.items():
        rows.append(["64-element add, jit call", name, fmt_time(value), f"{value / base:.2f}"])


def csr_cases(quick: bool):
    cases = [(4000, 0.02, 0.01), (4000, 0.02, 0.2)]
    if not quick:
        cases += [(20000, 0.01, 0.01), (20000, 0.01, 0.05)]
    return cases


def csr_benchmark(rows: list, quick: bool) -> None:
    rng = np.random.default_rng(0)
    for n, p, rate in csr_cases(quick):
        per_row = int(n * p)
        indptr = jnp.asarray(np.arange(n + 1) * per_row, jnp.int32)
        indices = jnp.asarray(rng.integers(0, n, n * per_row), jnp.int32)
        data = jnp.asarray(rng.standard_normal(n * per_row), jnp.float32)
        spikes = jnp.asarray(rng.random(n) < rate)
        batch = jnp.asarray(rng.random((n, 32)) < rate)
        v = jnp.asarray(rng.standard_normal(n), jnp.float32)
        label = f"n={n}, {n * per_row // 1000}k syn, {int(rate * 100)}%"
        shape = (n, n)

        def fwd(backend):
            return jax.jit(lambda d, s: evjax.binary_csrmv(d, indices, indptr, s, shape=shape, transpose=True,
                                                           backend=backend))

        def fwd_batch(backend):
            return jax.jit(lambda d, s: evjax.binary_csrmm(d, indices, indptr, s, shape=shape, transpose=True,
                                                           backend=backend))

        def gather(backend):
            return jax.jit(lambda d, x: evjax.csrmv(d, indices, indptr, x, shape=shape, backend=backend))

        for case, make, operand, rounds in [
            ("spikes @ W", fwd, spikes, 8),
            ("32 spike vectors @ W", fwd_batch, batch, 4),
            ("W @ v (float)", gather, v, 8),
        ]:
            fns = {backend: make(backend) for backend in ("numba", "warp")}
            ref = np.asarray(fns["numba"](data, operand))
            np.testing.assert_allclose(np.asarray(fns["warp"](data, operand)), ref, rtol=1e-4, atol=1e-3)
            cands = {f"evjax {k}": (lambda f=f: f(data, operand)) for k, f in fns.items()}
            t = median_times(cands, rounds=rounds, calls=10)
            base = t["evjax numba"]
            for name, value in t.items():
                rows.append([f"{case}, {label}", name, fmt_time(value), f"{value / base:.2f}"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer CSR cases")
    args = parser.parse_args()
    import warp as wp

    wp.config.quiet = True
    kernel_dir = tempfile.mkdtemp(prefix="evjax-warp-bench-kernels-")
    with open(os.path.join(kernel_dir, "bench_warp_kernels.py"), "w") as f:
        f.write(KERNELS)
    sys.path.insert(0, kernel_dir)
    from bench_warp_kernels import add64

    rows: list = []
    tiny_call(rows, add64)
    (cold_tiny, cold_csr), (warm_tiny, warm_csr) = first_call_times(kernel_dir)
    rows.append(["first jit call, empty caches", "tiny kernel (+ evjax's FFI handler)", fmt_time(cold_tiny), "-"])
    rows.append(["first jit call, empty caches", "CSR module (8 kernels)", fmt_time(cold_csr), "-"])
    rows.append(["first jit call, second process", "tiny kernel", fmt_time(warm_tiny), f"{warm_tiny / cold_tiny:.2f} of cold"])
    rows.append(["first jit call, second process", "CSR module", fmt_time(warm_csr), f"{warm_csr / cold_csr:.2f} of cold"])
    csr_rows: list = []
    csr_benchmark(csr_rows, args.quick)

    head = f"jax {jax.__version__}, warp {wp.__version__}, {os.cpu_count()} CPUs, device {jax.devices()[0].platform}"
    text = "\n".join([
        head, "",
        markdown_table(["case", "implementation", "median", "ratio to jnp / of cold"], rows), "",
        "CSR operators (Warp runs a CPU launch on one thread; Numba uses all cores):", "",
        markdown_table(["case", "backend", "median", "ratio to numba"], csr_rows),
    ])
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "warp_overhead.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
