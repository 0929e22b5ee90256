"""Event-driven CSR propagation on a CUDA GPU: evjax's GPU backends against the peers, in one process.

    python benchmarks/gpu_event.py            # needs a CUDA GPU and jax with its CUDA plugin
    python benchmarks/gpu_event.py --quick    # fewer cases and repetitions

Cases: n_pre = n_post = 4000 at p = 0.02 and 20000 at p = 0.01 (a fixed
number of synapses per row), spike rates 1 % and 10 %, per-synapse weights.
Measured, each under ``jax.jit`` on the GPU: the forward pass ``spikes @ W``, a
batch of 32 spike vectors, and ``jit(grad)`` of ``sum(out**2)`` w.r.t. the
weights.  Also the first call of evjax's Numba CUDA forward in this process
(PTX compile, CUBIN load, XLA compile).

Candidates, timed in the same run, interleaved round by round:

* evjax ``numba_cuda`` (the GPU default) and ``warp`` (when warp-lang imports),
  and evjax's pure-JAX ``reference`` backend (XLA gathers and segment sums);
* ``jax.experimental.sparse`` BCSR of ``W.T`` times the float spikes (cuSPARSE);
* dense XLA: the float spikes times the dense ``W`` (cuBLAS);
* a hand-written Numba CUDA kernel launched directly on device arrays, no JAX
  (the practical limit: one thread per presynaptic neuron, atomics into a
  zeroed output);
* brainevent is not in this script: its GPU kernels need packages this
  benchmark's GPU machine does not have (see ``docs/performance.md``).

Each time is the median of ``rounds x calls`` calls, each waited for
(``block_until_ready``, or ``cuda.synchronize()`` for the hand-written
kernel), so it is what a synchronous caller pays, launch included.  Writes
``benchmarks/results/gpu_event.{md,png}`` (``--out`` elsewhere).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import sparse as jsparse  # noqa: E402
from numba import cuda  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import evjax  # noqa: E402
from benchmarks.common import fmt_time, markdown_table, median_times, provenance, save_bar_plot  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def make_structure(n: int, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed number of distinct random targets per row (``round(p * n)``), sorted within a row."""
    rng = np.random.default_rng(seed)
    k = max(1, round(p * n))
    indices = np.argsort(rng.random((n, k * 2)), axis=1)[:, :k]  # distinct columns among the first 2k
    indices = np.sort((indices + rng.integers(0, n, (n, 1))) % n, axis=1).astype(np.int32)
    indptr = np.arange(0, n * k + 1, k, dtype=np.int32)
    return indices.reshape(-1), indptr


def warp_available() -> bool:
    try:
        import warp  # noqa: F401
    except Exception:  # noqa: BLE001 - optional peer
        return False
    return True


@cuda.jit
def _zero(out):
    j = cuda.grid(1)
    if j < out.size:
        out[j] = 0.0


@cuda.jit
def _scatter(data, indices, indptr, spikes, out):
    i = cuda.grid(1)
    if i < spikes.size and spikes[i]:
        for k in range(indptr[i], indptr[i + 1]):
            cuda.atomic.add(out, indices[k], data[k])


def hand_written_limit(data, indices, indptr, n_post):
    """A hand-written Numba CUDA scatter on device arrays: ``(spikes) -> out``, waited for."""
    d_data, d_indices, d_indptr = (cuda.to_device(a) for a in (data, indices, indptr))
    out = cuda.device_array(n_post, np.float32)
    n_pre = indptr.shape[0] - 1

    def run(d_spikes):
        _zero[(n_post + 255) // 256, 256](out)
        _scatter[(n_pre + 255) // 256, 256](d_data, d_indices, d_indptr, d_spikes, out)
        cuda.synchronize()
        return out

    return run


def measure_case(n: int, p: float, rate: float, *, rounds: int, calls: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed + 7)
    indices, indptr = make_structure(n, p, seed)
    data = rng.uniform(0.1, 1.0, indices.shape[0]).astype(np.float32)
    spikes = rng.random(n) < rate
    batch = rng.random((32, n)) < rate
    W = evjax.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)), shape=(n, n))
    s, sb = jnp.asarray(spikes), jnp.asarray(batch)
    sf, sbf = s.astype(jnp.float32), sb.astype(jnp.float32)

    import scipy.sparse as sp

    scipy_W = sp.csr_matrix((data, indices, indptr), shape=(n, n))
    bcsr_T = jsparse.BCSR.from_scipy_sparse(scipy_W.T.tocsr())
    dense = jnp.asarray(scipy_W.toarray())

    def evjax_on(backend: str):
        with evjax.use_backend(backend):
            fwd = jax.jit(lambda W, s: s @ W)
            mm = jax.jit(lambda W, s: s @ W)
            grad = jax.jit(jax.grad(lambda d, W, s: jnp.sum((s @ W.with_data(d)) ** 2)))
            fwd(W, s).block_until_ready(), mm(W, sb).block_until_ready(), grad(W.data, W, s).block_until_ready()
        return fwd, mm, grad

    first_call = {}
    backends = ["numba_cuda"] + (["warp"] if warp_available() else []) + ["reference"]
    programs = {}
    for backend in backends:
        start = time.perf_counter()
        programs[backend] = evjax_on(backend)
        first_call[backend] = time.perf_counter() - start

    bcsr_fwd = jax.jit(lambda M, x: M @ x)
    bcsr_mm = jax.jit(lambda M, x: (M @ x.T).T)
    bcsr_grad = jax.jit(jax.grad(lambda d, indices, indptr, x: jnp.sum(
        (jsparse.BCSR((d, indices, indptr), shape=bcsr_T.shape) @ x) ** 2)))
    dense_fwd = jax.jit(lambda D, x: x @ D)
    dense_grad = jax.jit(jax.grad(lambda D, x: jnp.sum((x @ D) ** 2)))
    limit = hand_written_limit(data, indices, indptr, n)
    d_spikes = cuda.to_device(spikes)
    np.testing.assert_allclose(np.asarray(programs["numba_cuda"][0](W, s)), spikes.astype(np.float32) @ scipy_W,
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(limit(d_spikes).copy_to_host(), spikes.astype(np.float32) @ scipy_W,
                               rtol=1e-4, atol=1e-3)

    forward = {f"evjax {b}": (lambda f=programs[b][0]: f(W, s)) for b in backends}
    forward.update({"jax BCSR (cuSPARSE)": lambda: bcsr_fwd(bcsr_T, sf), "dense XLA": lambda: dense_fwd(dense, sf),
                    "hand-written Numba CUDA": lambda: limit(d_spikes)})
    batched = {f"evjax {b}": (lambda f=programs[b][1]: f(W, sb)) for b in backends}
    batched.update({"jax BCSR (cuSPARSE)": lambda: bcsr_mm(bcsr_T, sbf), "dense XLA": lambda: dense_fwd(dense, sbf)})
    gradient = {f"evjax {b}": (lambda f=programs[b][2]: f(W.data, W, s)) for b in backends}
    gradient.update({"jax BCSR (cuSPARSE)": lambda: bcsr_grad(bcsr_T.data, bcsr_T.indices, bcsr_T.indptr, sf),
                     "dense XLA (dense gradient)": lambda: dense_grad(dense, sf)})
    return {
        "forward": median_times(forward, rounds=rounds, calls=calls),
        "batch of 32": median_times(batched, rounds=rounds, calls=calls),
        "weight gradient": median_times(gradient, rounds=rounds, calls=calls),
        "first call": first_call,
        "nnz": int(indices.shape[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases and repetitions")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/results/gpu_event.md)")
    args = parser.parse_args()
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        print("gpu_event.py needs a CUDA GPU visible to JAX (jax.devices() has none); nothing measured.")
        return
    cases = [(4000, 0.02), (20000, 0.01)]
    rates = [0.01, 0.10] if not args.quick else [0.05]
    rounds, calls = (5, 20) if not args.quick else (3, 10)
    lines = [provenance(), "# Event-driven CSR on a GPU", "",
             f"Device: {gpus[0].device_kind}; jax {jax.__version__}; medians of {rounds} x {calls} synchronous "
             "calls, candidates interleaved; ratio = time / evjax numba_cuda's in the same row.", ""]
    labels, series = [], {}
    for n, p in cases:
        for rate in rates:
            result = measure_case(n, p, rate, rounds=rounds, calls=calls)
            title = f"n={n}, p={p}, rate {rate:.0%} ({result['nnz']} synapses)"
            lines += [f"## {title}", "", "First call in this process (compile and load, forward + batch + grad): "
                      + ", ".join(f"{b} {t:.2f} s" for b, t in result["first call"].items()), ""]
            for op in ("forward", "batch of 32", "weight gradient"):
                times = result[op]
                base = times["evjax numba_cuda"]
                rows = [[name, fmt_time(t), f"{t / base:.2f}x"] for name, t in times.items()]
                lines += [f"### {op}", "", markdown_table(["method", "median", "ratio"], rows), ""]
                if op == "forward":
                    labels.append(f"n={n} {rate:.0%}")
                    for name, t in times.items():
                        series.setdefault(name, []).append(t * 1e6)
            print("\n".join(lines[-30:]), flush=True)
    out = args.out or os.path.join(RESULTS, "gpu_event.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    save_bar_plot(os.path.splitext(out)[0] + ".png", labels, series, ylabel="forward, us per call",
                  title="spikes @ W on the GPU")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
