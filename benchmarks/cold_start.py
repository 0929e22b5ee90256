"""Cold start: an operator family's first calls in a fresh process, with empty caches, against the goals.

    python benchmarks/cold_start.py                    # every family in FAMILIES
    python benchmarks/cold_start.py --quick csr        # fewer repetitions, the named families
    python benchmarks/cold_start.py --out benchmarks/results/cold_start_vmap.md csr_vmap fixed_vmap dense_vmap jitc_vmap

Every measurement runs in a fresh subprocess with new, empty ``NUMBA_CACHE_DIR``
and ``EVJAX_CACHE_DIR`` (temporary folders), as a new user's first run:

* ``cold``: ``import evjax``, the first jitted forward call, then the first
  ``jax.jit(jax.grad(loss))`` call in the same process (the order of a first
  script); each first call compiles its kernels on the spot (nothing runs in
  their place);
* ``grad first``: the first ``jit(grad)`` in a process that ran nothing before;
* ``precompiled``: forward then grad in a process started after
  ``python -m evjax.precompile <family>`` filled the (otherwise empty) caches;
* ``warm``: forward then grad again, on the caches the cold run filled.

A ``*_vmap`` family is the same case vmapped over ``TRIALS`` spike vectors (a
user's batch of trials): its first calls compile the batched kernels.

Times are wall-clock seconds and, beside them, the process's CPU seconds
(``time.process_time``: every thread, XLA's compiler threads included).  The
machine may be shared, so wall time includes waiting for a core; the CPU
time is what the first call itself cost.  Steady state: the median forward
call in the cold process after its first calls, against the same in the warm
process (the same compiled kernel; a ratio of about 1 says the cold start
costs nothing later).

A family is an entry of ``FAMILIES``: a function ``case(n) -> (forward, grad,
args)`` of jitted-able callables and their arguments, and its goals.  Writes
``benchmarks/results/cold_start.{md,png}``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.common import RESULTS, fmt_time, markdown_table, save_bar_plot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# families: case(n) -> (forward(*args), grad(*args), args); their goals in seconds
# ---------------------------------------------------------------------------
def _spikes(rng, n: int, rate: float, trials: int | None):
    """Boolean spikes: one vector of ``n``, or ``trials`` of them (a batch a user vmaps over)."""
    import jax.numpy as jnp

    return jnp.asarray(rng.random((n,) if trials is None else (trials, n)) < rate)


def _over_trials(apply, spikes, trials: int | None):
    """``apply(spikes)``, or ``jax.vmap(apply)`` over the trials of a batch."""
    import jax

    return apply(spikes) if trials is None else jax.vmap(apply)(spikes)


# Each case is written once, with the names evjax shares with brainevent 0.3.0 (``lib`` is either
# module): the peer runs the same user code.
def csr_case(n: int, trials: int | None = None, library: str = "evjax"):
    """``BinaryArray(spikes) @ W`` over a CSR with per-synapse weights (p = 0.02), and the gradient
    of ``sum((spikes @ W) ** 2)`` w.r.t. the weights; with ``trials``, both vmapped over a batch of
    spike vectors (the batched kernels)."""
    import importlib

    import jax.numpy as jnp
    import scipy.sparse as sp

    lib = importlib.import_module(library)
    rng = np.random.default_rng(0)
    dense = sp.csr_matrix(((rng.random((n, n)) < 0.02) * rng.standard_normal((n, n))).astype(np.float32))
    W = lib.CSR((jnp.asarray(dense.data), jnp.asarray(dense.indices.astype(np.int32)),
                 jnp.asarray(dense.indptr.astype(np.int32))), shape=(n, n))
    spikes = _spikes(rng, n, 0.1, trials)

    def forward(data):
        return _over_trials(lambda s: lib.BinaryArray(s) @ W.with_data(data), spikes, trials)

    def grad(data):
        return jnp.sum(forward(data) ** 2)

    return forward, grad, (W.data,)


def dense_case(n: int, trials: int | None = None, library: str = "evjax"):
    """``BinaryArray(spikes) @ Dense(W)``, and the gradient w.r.t. ``W`` (with ``trials``: vmapped
    over a batch)."""
    import importlib

    import jax.numpy as jnp

    lib = importlib.import_module(library)
    rng = np.random.default_rng(0)
    W = jnp.asarray(rng.standard_normal((n, n)).astype(np.float32))
    spikes = _spikes(rng, n, 0.05, trials)

    def forward(data):
        return _over_trials(lambda s: lib.BinaryArray(s) @ lib.Dense(data), spikes, trials)

    def grad(data):
        return jnp.sum(forward(data) ** 2)

    return forward, grad, (W,)


def fixed_case(n: int, trials: int | None = None, library: str = "evjax"):
    """``BinaryArray(spikes) @ C`` over a fixed fan-out table (``FixedNumPerPre``, k = 80 distinct
    targets per row) with per-synapse weights, and the gradient (with ``trials``: vmapped over a
    batch)."""
    import importlib

    import jax.numpy as jnp

    lib = importlib.import_module(library)
    rng = np.random.default_rng(0)
    indices = np.stack([rng.choice(n, 80, replace=False) for _ in range(n)]).astype(np.int32)
    C = lib.FixedNumPerPre(jnp.asarray(rng.standard_normal((n, 80)).astype(np.float32)),
                           jnp.asarray(indices), shape=(n, n))
    spikes = _spikes(rng, n, 0.1, trials)

    def forward(data):
        return _over_trials(lambda s: lib.BinaryArray(s) @ C.with_data(data), spikes, trials)

    def grad(data):
        return jnp.sum(forward(data) ** 2)

    return forward, grad, (C.data,)


def jitc_case(n: int, trials: int | None = None, prob: float = 0.02, library: str = "evjax"):
    """``BinaryArray(spikes) @ M`` over a JITC matrix with normal weights (never stored), and the
    gradient of ``sum((spikes @ M) ** 2)`` w.r.t. the weights' mean (with ``trials``: vmapped over a
    batch)."""
    import importlib

    import jax.numpy as jnp

    lib = importlib.import_module(library)
    spikes = _spikes(np.random.default_rng(0), n, 0.1, trials)

    def forward(loc):
        return _over_trials(
            lambda s: lib.BinaryArray(s) @ lib.JITCNormalR(loc, 0.1, prob=prob, seed=7, shape=(n, n)),
            spikes, trials)

    def grad(loc):
        return jnp.sum(forward(loc) ** 2)

    return forward, grad, (jnp.float32(0.01),)


NEW_FAMILY_GOALS = (2.0, 2.0)  # each other family's first forward and grad (issue 29)
PRECOMPILED_GOAL = 0.5  # every family's first forward and first grad after python -m evjax.precompile
CSR_CPU_GOAL = 3.0  # CSR: CPU seconds of the first forward and the first grad together
TRIALS = 16  # the batch of the vmapped cases (a user's trials): the batched kernels' first calls
FAMILIES = {
    # name: (case, goal of the first forward, goal of the first jit(grad)), seconds
    "csr": (csr_case, 1.5, 1.5),
    "dense": (dense_case, *NEW_FAMILY_GOALS),
    "fixed": (fixed_case, *NEW_FAMILY_GOALS),
    "jitc": (jitc_case, *NEW_FAMILY_GOALS),
    # the same, vmapped over TRIALS spike vectors: the same goals as one vector's
    "csr_vmap": (functools.partial(csr_case, trials=TRIALS), 1.5, 1.5),
    "dense_vmap": (functools.partial(dense_case, trials=TRIALS), *NEW_FAMILY_GOALS),
    "fixed_vmap": (functools.partial(fixed_case, trials=TRIALS), *NEW_FAMILY_GOALS),
    "jitc_vmap": (functools.partial(jitc_case, trials=TRIALS), *NEW_FAMILY_GOALS),
}
PRECOMPILE_FAMILY = {name: name.split("_")[0] for name in FAMILIES}


# ---------------------------------------------------------------------------
# the child: one fresh process, one scenario
# ---------------------------------------------------------------------------
def child(family: str, scenario: str, n: int, calls: int, library: str = "evjax") -> dict:
    """One scenario in this (fresh) process, with ``library`` (evjax, or brainevent for the peer)."""
    import importlib

    out = {}

    def now():
        return [time.perf_counter(), time.process_time()]

    clock = now()

    def lap(name):
        t = now()
        out[name] = {"wall": t[0] - clock[0], "cpu": t[1] - clock[1]}
        clock[:] = t

    import jax

    importlib.import_module(library)
    lap("import")
    forward, loss, args = FAMILIES[family][0](n, library=library)
    jax.block_until_ready(args)
    f, g = jax.jit(forward), jax.jit(jax.grad(loss))
    clock[:] = now()
    if scenario != "grad_first":
        jax.block_until_ready(f(*args))
        lap("forward")
    jax.block_until_ready(g(*args))
    lap("grad")
    if scenario in ("cold", "warm"):
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            samples.append(time.perf_counter() - start)
        out["steady_forward"] = float(np.median(samples))
    return out


def _env(cache: str) -> dict:
    return {**os.environ, "NUMBA_CACHE_DIR": os.path.join(cache, "numba"), "EVJAX_CACHE_DIR": os.path.join(cache, "evjax")}


def run_child(family: str, scenario: str, n: int, calls: int, cache: str, library: str = "evjax",
              python: str = sys.executable) -> dict:
    cmd = [python, os.path.abspath(__file__), "--child", family, scenario, str(n), str(calls), library]
    res = subprocess.run(cmd, env=_env(cache), capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"{family}/{scenario} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def precompile(family: str, cache: str) -> float:
    """``python -m evjax.precompile <family>`` into ``cache``; its wall seconds."""
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "evjax.precompile", "--quiet", PRECOMPILE_FAMILY[family]],
                         env=_env(cache), capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"precompile {family} failed:\n{res.stderr[-3000:]}")
    return time.perf_counter() - start


def measure(family: str, n: int, calls: int, with_precompile: bool) -> dict:
    """Every scenario of one family, each in a fresh process; warm reuses the cold one's caches."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="evjax-cold-") as shared:
        results["cold"] = run_child(family, "cold", n, calls, shared)
        results["warm"] = run_child(family, "warm", n, calls, shared)
    with tempfile.TemporaryDirectory(prefix="evjax-cold-") as empty:
        results["grad_first"] = run_child(family, "grad_first", n, calls, empty)
    if with_precompile:
        with tempfile.TemporaryDirectory(prefix="evjax-cold-") as filled:
            results["precompile_s"] = precompile(family, filled)
            results["precompiled"] = run_child(family, "precompiled", n, calls, filled)
    return results


def measure_peer(family: str, n: int, calls: int, python: str) -> dict:
    """brainevent 0.3.0's first calls on the same case (its own interpreter: it needs Python >= 3.12),
    each scenario in a fresh process with empty caches, as :func:`measure`'s ``cold`` and
    ``grad_first``."""
    results = {}
    for scenario in ("cold", "grad_first"):
        with tempfile.TemporaryDirectory(prefix="evjax-cold-peer-") as empty:
            results[scenario] = run_child(family, scenario, n, calls, empty, "brainevent", python)
    return results


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------
def seconds(entry: dict | None) -> str:
    if not entry:
        return "-"
    return f"{entry['wall']:.2f} s ({entry['cpu']:.2f} s CPU)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help=f"families to measure (default: all of {sorted(FAMILIES)})")
    parser.add_argument("--quick", action="store_true", help="fewer steady-state calls")
    parser.add_argument("--no-precompile", action="store_true", help="skip the precompiled scenario")
    parser.add_argument("--n", type=int, default=4000, help="neurons per side (default 4000)")
    parser.add_argument("--brainevent-python", default=os.environ.get("BRAINEVENT_PYTHON"),
                        help="an interpreter with brainevent 0.3.0 installed (Python >= 3.12; or "
                             "$BRAINEVENT_PYTHON): its first calls on the same cases, in the same run")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/results/cold_start.md; "
                                                     "the figure beside it, .png)")
    args = parser.parse_args(argv)
    families = args.families or list(FAMILIES)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; known: {sorted(FAMILIES)}")
    calls = 20 if args.quick else 200
    lines = []

    def emit(text=""):
        print(text, flush=True)
        lines.append(text)

    import jax
    import numba

    from benchmarks.common import provenance

    emit(provenance(argv))
    emit("# evjax cold start")
    emit()
    emit(f"jax {jax.__version__}, numba {numba.__version__}, {os.cpu_count()} CPUs, n={args.n}. Each run is a "
         f"fresh process with empty NUMBA_CACHE_DIR and EVJAX_CACHE_DIR; the first calls compile their kernels "
         f"on the spot. Wall seconds, and in brackets the process's CPU seconds (all threads). Load average at "
         f"start: {os.getloadavg()[0]:.2f} (a shared machine stretches wall times).")
    emit()
    goal_rows, detail_rows, peer_rows, met, total = [], [], [], 0, 0
    plot = {"measured": [], "goal": []}
    labels = []

    def goal(family, what, got, limit, key="wall"):
        nonlocal met, total
        ok = got[key] <= limit
        met += ok
        total += 1
        unit = "s CPU" if key == "cpu" else "s"
        goal_rows.append([family, what, f"<= {limit:.1f} {unit}", seconds(got), "met" if ok else "NOT met"])
        labels.append(f"{family}: {what.split(',')[0]}")
        plot["measured"].append(got[key])
        plot["goal"].append(limit)

    for family in families:
        _, forward_goal, grad_goal = FAMILIES[family]
        r = measure(family, args.n, calls, not args.no_precompile)
        cold = r["cold"]
        goal(family, "first forward", cold["forward"], forward_goal)
        goal(family, "first jit(grad), after the forward", cold["grad"], grad_goal)
        goal(family, "first jit(grad), nothing before", r["grad_first"]["grad"], grad_goal)
        if family == "csr":
            both = {"wall": cold["forward"]["wall"] + cold["grad"]["wall"],
                    "cpu": cold["forward"]["cpu"] + cold["grad"]["cpu"]}
            goal(family, "forward and grad, CPU", both, CSR_CPU_GOAL, key="cpu")
        if "precompiled" in r:
            goal(family, "first forward after precompile", r["precompiled"]["forward"], PRECOMPILED_GOAL)
            goal(family, "first jit(grad) after precompile", r["precompiled"]["grad"], PRECOMPILED_GOAL)
        if args.brainevent_python:
            peer = measure_peer(family, args.n, calls, args.brainevent_python)
            for what, ours, theirs in (
                    ("import", cold["import"], peer["cold"]["import"]),
                    ("first forward", cold["forward"], peer["cold"]["forward"]),
                    ("first jit(grad), after the forward", cold["grad"], peer["cold"]["grad"]),
                    ("first jit(grad), nothing before", r["grad_first"]["grad"], peer["grad_first"]["grad"])):
                peer_rows.append([family, what, seconds(ours), seconds(theirs),
                                  f"{ours['wall'] / theirs['wall']:.2f}x"])
            peer_rows.append([family, "steady forward (median call)", fmt_time(cold["steady_forward"]),
                              fmt_time(peer["cold"]["steady_forward"]),
                              f"{cold['steady_forward'] / peer['cold']['steady_forward']:.2f}x"])
        steady = cold["steady_forward"] / r["warm"]["steady_forward"]
        detail_rows.append([
            family, seconds(cold["import"]), seconds(r["warm"]["forward"]), seconds(r["warm"]["grad"]),
            f"{r['precompile_s']:.0f} s" if "precompile_s" in r else "-",
            f"{fmt_time(cold['steady_forward'])} / {fmt_time(r['warm']['steady_forward'])} = {steady:.2f}",
        ])
    emit("## Goals (issue 29's; a `*_vmap` case holds the batched kernels, vmapped over "
         f"{TRIALS} trials, to its family's goals)")
    emit()
    emit(markdown_table(["family", "first call", "goal", "measured", ""], goal_rows))
    emit()
    emit(f"{met} of {total} goals met.")
    emit()
    emit("## Around them")
    emit()
    emit("Warm: a second process on the caches the cold one filled. Precompile: `python -m evjax.precompile "
         "<family>` into empty caches, wall time. Steady forward: median call after the first ones, cold "
         "process / warm process.")
    emit()
    emit(markdown_table(["family", "import evjax", "warm: forward", "warm: grad", "precompile",
                         "steady forward (ratio)"], detail_rows))
    emit()
    emit("## Against brainevent 0.3.0")
    emit()
    if peer_rows:
        emit("The same cases (each written once with the names the two libraries share: `BinaryArray(s) @ W`), "
             "brainevent 0.3.0 in its own interpreter (it needs Python >= 3.12; its jax version is its own), "
             "each scenario in a fresh process with empty caches, after evjax's in the same run. Ratio: "
             "evjax's wall time / brainevent's (below 1: evjax is faster).")
        emit()
        emit(markdown_table(["family", "call", "evjax", "brainevent 0.3.0", "ratio"], peer_rows))
    else:
        emit("brainevent not run (no `--brainevent-python`): no peer figures in this run.")
    os.makedirs(RESULTS, exist_ok=True)
    out = args.out or os.path.join(RESULTS, "cold_start.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    save_bar_plot(os.path.splitext(out)[0] + ".png", labels, plot, ylabel="seconds",
                  title="evjax first calls, empty caches", log=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        family, scenario, n, calls, library = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        print(json.dumps(child(family, scenario, n, calls, library)))
    else:
        main()
