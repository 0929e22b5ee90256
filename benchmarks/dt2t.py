"""Per-synapse products (``csrmv_dt2t``, ``csrmm_dt2t``): evjax against brainevent, a Numba loop and NumPy.

    PYTHONPATH=. /tmp/v312/bin/python benchmarks/dt2t.py           # with brainevent (Python >= 3.12)
    python benchmarks/dt2t.py --quick                               # fewer repetitions, no brainevent

Cases: a CSR structure of n_rows = n_cols = 20000, p = 0.005 (row lengths
binomial, about 2 million synapses, columns sorted within a row), float32;
``csrmv_dt2t`` (``y`` of one vector) and ``csrmm_dt2t`` (a batch of 16: ``w``
and the result are 16 x 2e6), ``transpose`` False (``y`` by the row) and True
(``y`` by the column).  Every candidate returns a new array of the synapses'
values (8 MB, 128 MB for the batch): the write is part of every one's work.

Candidates, timed round-robin in one process (medians of wall time, and of
the process's CPU time per call, which counts every thread; ratio = wall time
/ evjax's):

* evjax (jitted; the CSR/CSC forms bind ``csr_sddmm`` on the platform's default backend, ``numba`` on CPU);
* brainevent 0.3.0's functions of the same names, jitted, with their CPU
  default backend (when brainevent imports: it needs Python 3.12 or later);
* the limit: a serial Numba loop from NumPy over the rows (``out[j] = w[j] *
  y[i]`` for the synapses of row ``i``, or ``y[indices[j]]``);
* plain NumPy: ``w * y[np.repeat(arange(n), diff(indptr))]`` (or ``y[indices]``).

Writes ``benchmarks/results/dt2t.{md,png}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numba  # noqa: E402

jax.config.update("jax_cpu_enable_async_dispatch", False)  # synchronous, as the loop from NumPy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.common import (  # noqa: E402
    fmt_time, freeze_import_heap, markdown_table, median_wall_cpu, provenance, save_bar_plot,
)
from evjax.primitives.csr.products import csrmm_dt2t, csrmv_dt2t  # noqa: E402

try:
    import brainevent  # noqa: E402
except Exception:  # noqa: BLE001 - optional peer
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BATCH = 16


@numba.njit(cache=True, nogil=True)
def loop_mv(y, w, indices, indptr, transpose):
    out = np.empty_like(w)
    for i in range(indptr.shape[0] - 1):
        for j in range(indptr[i], indptr[i + 1]):
            out[j] = w[j] * (y[indices[j]] if transpose else y[i])
    return out


@numba.njit(cache=True, nogil=True)
def loop_mm(y, w, indices, indptr, transpose):
    out = np.empty_like(w)
    for b in range(w.shape[0]):
        for i in range(indptr.shape[0] - 1):
            for j in range(indptr[i], indptr[i + 1]):
                out[b, j] = w[b, j] * (y[b, indices[j]] if transpose else y[b, i])
    return out


def numpy_products(y, w, indices, indptr, transpose):
    index = indices if transpose else np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return w * y[..., index]


def structure(n: int, p: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    counts = rng.binomial(n, p, n)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([np.sort(rng.choice(n, c, replace=False)) for c in counts]).astype(np.int32)
    return indices, indptr


def measure(n: int, p: float, batched: bool, transpose: bool, *, rounds: int, calls: int) -> tuple[dict, int]:
    rng = np.random.default_rng(1)
    indices, indptr = structure(n, p)
    nse = len(indices)
    lead = (BATCH,) if batched else ()
    y = rng.standard_normal(lead + (n,)).astype(np.float32)
    w = rng.standard_normal(lead + (nse,)).astype(np.float32)
    j = [jnp.asarray(a) for a in (y, w, indices, indptr)]
    ours = csrmm_dt2t if batched else csrmv_dt2t
    f = jax.jit(lambda *a: ours(*a, shape=(n, n), transpose=transpose))
    loop = loop_mm if batched else loop_mv
    candidates = {"evjax": lambda: f(*j)}
    if brainevent is not None:
        theirs = brainevent.csrmm_dt2t if batched else brainevent.csrmv_dt2t
        g = jax.jit(lambda *a: theirs(*a, shape=(n, n), transpose=transpose))
        candidates["brainevent 0.3.0"] = lambda: g(*j)
    candidates["hand-written Numba"] = lambda: loop(y, w, indices, indptr, transpose)
    candidates["NumPy"] = lambda: numpy_products(y, w, indices, indptr, transpose)
    want = loop(y, w, indices, indptr, transpose)
    for name, fn in candidates.items():  # every candidate computes the same IEEE products
        np.testing.assert_array_equal(np.asarray(fn()), want, err_msg=name)
    return median_wall_cpu(candidates, rounds=rounds, calls=calls), nse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=os.path.join(RESULTS, "dt2t.md"))
    args = parser.parse_args()
    rounds, calls = (3, 3) if args.quick else (7, 5)
    n, p = 20000, 0.005
    freeze_import_heap()
    versions = f"jax {jax.__version__}, numba {numba.__version__}, Python {sys.version.split()[0]}" + (
        f", brainevent {brainevent.__version__}" if brainevent is not None else ", brainevent not importable")
    lines = [provenance(), "# Per-synapse products (dt2t)", "",
             f"{versions}; {os.cpu_count()} CPUs. n_rows = n_cols = {n}, p = {p}, float32; medians of {rounds} x "
             f"{calls} synchronous calls, candidates interleaved; wall = elapsed time, CPU = the process's CPU "
             f"time (all threads); ratio = wall / evjax's wall.", ""]
    labels, series = [], {}
    for batched in (False, True):
        for transpose in (False, True):
            times, nse = measure(n, p, batched, transpose, rounds=rounds, calls=calls)
            op = "csrmm_dt2t" if batched else "csrmv_dt2t"
            base = times["evjax"][0]
            size = f"batch {BATCH} x {nse} synapses" if batched else f"{nse} synapses"
            lines += [f"## {op}, transpose={transpose} ({size})", "",
                      markdown_table(["method", "wall", "CPU", "ratio"],
                                     [[k, fmt_time(t), fmt_time(c), f"{t / base:.2f}x"]
                                      for k, (t, c) in times.items()]), ""]
            labels.append(f"{op} T={transpose}")
            for k, (t, _) in times.items():
                series.setdefault(k, []).append(t * 1e3)
            print("\n".join(lines[-9:]), flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    save_bar_plot(os.path.splitext(args.out)[0] + ".png", labels, series, ylabel="ms per call (wall)",
                  title="per-synapse products, n = 20000, p = 0.005")


if __name__ == "__main__":
    main()
