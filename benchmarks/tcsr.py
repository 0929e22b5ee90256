"""``TCSR``: evjax's (a CSR over evjax's kernels) against brainevent 0.3.0's (tiled), side by side.

    python benchmarks/tcsr.py --brainevent-python /path/to/py312/bin/python [--quick]

The same user code in both libraries (``lib.TCSR.fromcsr(lib.CSR.fromdense(dense))``), each library in its own
fresh processes (brainevent 0.3.0 needs Python 3.12 and jax 0.12; it also needs ``jax_enable_x64``, which its
children turn on as its docs say; evjax's run with JAX's defaults), alternating, on a quiet and a loaded machine
(``benchmarks/contention.py``'s neighbours and spinners).  n = 4000 neurons, p = 0.02 (320,000 synapses), 5 % of
the neurons spiking:

* ``s @ W``: ``BinaryArray(s) @ W`` (event-driven: the rows of the spiking neurons);
* ``s @ W.T``: the transposed view;
* ``W @ x``: a float vector;
* ``grad (bptt)``: ``jit(grad)`` of ``sum(BinaryArray(s) @ W.with_data(d))`` w.r.t. ``d``;
* ``grad (pp_prop)``: the same with float spikes and ``backward_algorithm="pp_prop"``.

The evjax children also time the peers on the same data: SciPy (``W.T @ s``, the CSR of ``W.T``), JAX's
``BCOO`` (``s @ W``), XLA's dense product (and its gradient), and a hand-written Numba loop over the active rows
(the limit of ``s @ W``).  Each cell: the median of ``calls`` calls, wall time and the process's CPU time (all
threads), the best of ``rounds`` alternating children.  Writes ``benchmarks/results/tcsr.{md,png}``.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import side_by_side  # noqa: E402
from benchmarks.common import RESULTS, fmt_time, markdown_table, provenance, save_bar_plot  # noqa: E402

N, PROB, RATE = 4000, 0.02, 0.05
CASES = ("s @ W", "s @ W.T", "W @ x", "grad (bptt)", "grad (pp_prop)")


def _data():
    rng = np.random.default_rng(0)
    dense = ((rng.random((N, N)) < PROB) * rng.standard_normal((N, N))).astype(np.float32)
    spikes = rng.random(N) < RATE
    rates = np.where(spikes, rng.uniform(0.5, 1.5, N), 0).astype(np.float32)
    return dense, spikes, rates, rng.standard_normal(N).astype(np.float32)


def _library_cases(lib) -> dict:
    """``{case: call}``, the same user code for both libraries."""
    import jax
    import jax.numpy as jnp

    dense, spikes, rates, x = _data()
    W = lib.TCSR.fromcsr(lib.CSR.fromdense(dense))
    P = lib.TCSR.fromcsr(lib.CSR.fromdense(dense), backward_algorithm="pp_prop")
    s, r, xj = jnp.asarray(spikes), jnp.asarray(rates), jnp.asarray(x)
    forward = jax.jit(lambda d, s: lib.BinaryArray(s) @ W.with_data(d))
    forward_t = jax.jit(lambda d, s: lib.BinaryArray(s) @ W.T.with_data(d))
    product = jax.jit(lambda d, x: W.with_data(d) @ x)
    grad = jax.jit(jax.grad(lambda d, s: jnp.sum(lib.BinaryArray(s) @ W.with_data(d))))
    grad_pp = jax.jit(jax.grad(lambda d, r: jnp.sum(lib.BinaryArray(r) @ P.with_data(d))))
    data, data_t = W.data, W.T.data
    return {"s @ W": lambda: forward(data, s), "s @ W.T": lambda: forward_t(data_t, s),
            "W @ x": lambda: product(data, xj), "grad (bptt)": lambda: grad(data, s),
            "grad (pp_prop)": lambda: grad_pp(data, r)}


def _peer_cases() -> dict:
    """``{(case, peer): call}``: SciPy, JAX's BCOO, XLA's dense product and a hand-written Numba loop."""
    import jax
    import jax.numpy as jnp
    import numba
    import scipy.sparse as sp
    from jax.experimental import sparse as jsparse

    dense, spikes, rates, x = _data()
    csr = sp.csr_matrix(dense)
    csr_t = csr.T.tocsr()
    s_f = spikes.astype(np.float32)
    dj, dj_t, sj, xj = jnp.asarray(dense), jnp.asarray(dense.T), jnp.asarray(s_f), jnp.asarray(x)
    bcoo = jsparse.BCOO.fromdense(dj)
    bcoo_t = jsparse.BCOO.fromdense(dj_t)
    spmv = jax.jit(lambda m, v: v @ m)
    dense_dot = jax.jit(lambda m, v: v @ m)
    dense_grad = jax.jit(jax.grad(lambda m, v: jnp.sum(v @ m)))

    @numba.njit(cache=True, nogil=True)
    def scatter(data, indices, indptr, active, out):
        out[:] = 0
        for i in active:
            for k in range(indptr[i], indptr[i + 1]):
                out[indices[k]] += data[k]
        return out

    data, indices, indptr = csr.data, csr.indices.astype(np.int32), csr.indptr.astype(np.int32)
    out = np.zeros(N, np.float32)
    return {
        ("s @ W", "scipy"): lambda: csr_t @ s_f,
        ("s @ W", "BCOO"): lambda: spmv(bcoo, sj),
        ("s @ W", "XLA dense"): lambda: dense_dot(dj, sj),
        ("s @ W", "Numba loop"): lambda: scatter(data, indices, indptr, np.flatnonzero(spikes).astype(np.int32), out),
        ("s @ W.T", "scipy"): lambda: csr @ s_f,
        ("s @ W.T", "BCOO"): lambda: spmv(bcoo_t, sj),
        ("s @ W.T", "XLA dense"): lambda: dense_dot(dj_t, sj),
        ("W @ x", "scipy"): lambda: csr @ x,
        ("W @ x", "XLA dense"): lambda: dense_dot(dj_t, xj),
        ("grad (bptt)", "XLA dense"): lambda: dense_grad(dj, sj),
        ("grad (pp_prop)", "XLA dense"): lambda: dense_grad(dj, jnp.asarray(rates)),
    }


def _timed(call, calls: int) -> tuple[float, float]:
    import jax

    for _ in range(3):
        jax.block_until_ready(call())
    wall, cpu = [], []
    for _ in range(calls):
        w0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(call())
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return float(np.median(wall)), float(np.median(cpu))


def child(library: str, calls: int) -> dict:
    import jax

    if library == "brainevent":
        jax.config.update("jax_enable_x64", True)  # brainevent's TCSR requires it (its docs say so)
    lib = __import__(library)
    cases = {(name, library): call for name, call in _library_cases(lib).items()}
    if library == "evjax":
        cases.update(_peer_cases())
        for call in cases.values():
            jax.block_until_ready(call())
        from benchmarks.common import settle_kernels

        settle_kernels()  # the full kernels, not the first calls' serial tiers
    return {f"{name}|{who}": _timed(call, calls) for (name, who), call in cases.items()}


def measure(pythons: dict, rounds: int, calls: int) -> dict:
    """``{key: (wall, cpu)}``: the best median wall time over alternating rounds (with its CPU time)."""
    best: dict = {}
    for _ in range(rounds):
        for library, python in pythons.items():
            for key, (wall, cpu) in side_by_side.run_child(__file__, python, library, calls).items():
                if key not in best or wall < best[key][0]:
                    best[key] = (wall, cpu)
    return best


def main(argv=None):
    started = side_by_side.run(__file__, __doc__, argv, child, measure)
    if started is None:
        return
    args, calls, rounds, quiet, loaded, load_avg = started
    results = {"quiet": quiet, "loaded": loaded}

    peers = ("scipy", "BCOO", "XLA dense", "Numba loop")
    lines = [provenance(argv), "# TCSR: evjax and brainevent 0.3.0", "",
             f"n = {N}, p = {PROB} ({int(N * N * PROB):,} synapses expected), {RATE:.0%} spiking; {os.cpu_count()} "
             f"CPUs. Each library in its own fresh processes, alternating (brainevent with `jax_enable_x64`, which "
             f"its TCSR requires; evjax with JAX's defaults); each cell the median of {calls} calls, the best of "
             f"{rounds} rounds: wall time, and in brackets the process's CPU time (all threads). The peers run in "
             f"evjax's processes. Ratio: evjax / brainevent (below 1: evjax is faster). Loaded: "
             f"{args.neighbours} neighbours running a parallel Numba kernel and {args.spinners} spinners "
             f"(`benchmarks/contention.py`); 1-minute load average about {load_avg:.1f}.", ""]
    rows, labels, plot = [], [], {"evjax": [], "brainevent": []}
    for state, res in results.items():
        for name in CASES:
            ev, be = res[f"{name}|evjax"], res[f"{name}|brainevent"]
            cells = [name, state, f"{fmt_time(ev[0])} ({fmt_time(ev[1])})", f"{fmt_time(be[0])} ({fmt_time(be[1])})",
                     f"{ev[0] / be[0]:.2f}x"]
            for peer in peers:
                p = res.get(f"{name}|{peer}")
                cells.append("-" if p is None else f"{fmt_time(p[0])} ({ev[0] / p[0]:.2f}x)")
            rows.append(cells)
            labels.append(f"{name} ({state})")
            plot["evjax"].append(ev[0])
            plot["brainevent"].append(be[0])
    lines.append(markdown_table(["case", "machine", "evjax", "brainevent 0.3.0", "evjax / brainevent"]
                                + [f"{p} (evjax / it)" for p in peers], rows))
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    out = args.out or os.path.join(RESULTS, "tcsr.md")
    with open(out, "w") as f:
        f.write(text)
    save_bar_plot(os.path.splitext(out)[0] + ".png", labels, plot, ylabel="seconds per call (wall)",
                  title="TCSR: evjax and brainevent 0.3.0, quiet and loaded", log=True)


if __name__ == "__main__":
    main()
