"""Cold start: an operator family's first calls in a fresh process, with empty caches, against the goals.

    python benchmarks/cold_start.py                    # every family in FAMILIES
    python benchmarks/cold_start.py --quick csr        # fewer repetitions, the named families

Every measurement runs in a fresh subprocess with new, empty ``NUMBA_CACHE_DIR``
and ``EVJAX_CACHE_DIR`` (temporary folders), as a new user's first run:

* ``forward, then grad``: ``import evjax``, the first jitted forward call, then
  the first ``jax.jit(jax.grad(loss))`` call in the same process (the order of
  a first script), then how long until the kernels that compile in the
  background are ready (``evjax.wait_for_kernels``) and the next call, which
  is traced again and runs them;
* ``grad first``: the first ``jit(grad)`` in a process that ran nothing before;
* ``waiting for the compile``: forward then grad with
  ``EVJAX_BACKGROUND_COMPILE=0``, where a first call waits for its kernels
  (evjax before background compiles);
* ``warm``: forward then grad again, on the caches the first run filled.

Times are wall-clock seconds and, beside them, CPU seconds: the process's
(``time.process_time``, every thread, XLA's compiler threads included) minus
the background compiler's (``evjax.backends.compile_queue.compile_cpu_seconds``).
The machine is shared, so wall time includes waiting for a core; the CPU time
is what the first call itself cost.  Steady state: the median forward call
after the kernels are ready, against the same in the warm process (the same
compiled kernel; a ratio of about 1 says the cold start costs nothing later).

A family is an entry of ``FAMILIES``: a function ``case(n) -> (forward, grad,
args)`` of jitted-able callables and their arguments, and its goals.  Writes
``benchmarks/results/cold_start.{md,png}``.
"""
from __future__ import annotations

import argparse
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
def csr_case(n: int):
    """``spikes @ W`` over a CSR with per-synapse weights (p = 0.02), and the gradient of
    ``sum((spikes @ W) ** 2)`` w.r.t. the weights."""
    import jax.numpy as jnp

    import evjax

    rng = np.random.default_rng(0)
    dense = ((rng.random((n, n)) < 0.02) * rng.standard_normal((n, n))).astype(np.float32)
    W = evjax.CSR.fromdense(dense)
    spikes = jnp.asarray(rng.random(n) < 0.1)

    def forward(data):
        return spikes @ W.with_data(data)

    def grad(data):
        return jnp.sum(forward(data) ** 2)

    return forward, grad, (W.data,)


def dense_case(n: int):
    """``spikes @ W`` over a dense ``evjax.Dense`` matrix, and the gradient w.r.t. ``W``."""
    import jax.numpy as jnp

    import evjax

    rng = np.random.default_rng(0)
    W = evjax.Dense(jnp.asarray(rng.standard_normal((n, n)).astype(np.float32)))
    spikes = jnp.asarray(rng.random(n) < 0.05)

    def forward(data):
        return spikes @ evjax.Dense(data)

    def grad(data):
        return jnp.sum(forward(data) ** 2)

    return forward, grad, (W.data,)


def fixed_case(n: int):
    """``spikes @ C`` over a fixed fan-out table (k = 80) with per-synapse weights, and the gradient."""
    import jax
    import jax.numpy as jnp

    import evjax

    rng = np.random.default_rng(0)
    C = evjax.FixedPostNumConn.random(jax.random.PRNGKey(0), n, n, 80,
                                      weight=jnp.asarray(rng.standard_normal((n, 80)).astype(np.float32)))
    spikes = jnp.asarray(rng.random(n) < 0.1)

    def forward(data):
        return spikes @ C.with_data(data)

    def grad(data):
        return jnp.sum(forward(data) ** 2)

    return forward, grad, (C.data,)


def jitc_case(n: int, prob: float = 0.02):
    """``spikes @ M`` over a JITC matrix with normal weights (never stored), and the gradient of
    ``sum((spikes @ M) ** 2)`` w.r.t. the weights' mean."""
    import jax.numpy as jnp

    import evjax

    spikes = jnp.asarray(np.random.default_rng(0).random(n) < 0.1)

    def forward(loc):
        return spikes @ evjax.JITCNormalR(loc, 0.1, prob=prob, seed=7, shape=(n, n))

    def grad(loc):
        return jnp.sum(forward(loc) ** 2)

    return forward, grad, (jnp.float32(0.01),)


def jitc_large_case(n: int):
    """:func:`jitc_case` at JITC's own scale, whatever ``--n``: 10^5 neurons, 100 synapses each (10^7)."""
    return jitc_case(100_000, prob=0.001)


NEW_FAMILY_GOALS = (2.0, 2.0)  # each new-format family's first forward and grad (issue 17)
FAMILIES = {
    # name: (case, goal of the first forward, goal of the first jit(grad)), seconds
    "csr": (csr_case, 1.0, 2.0),
    "dense": (dense_case, *NEW_FAMILY_GOALS),
    "fixed": (fixed_case, *NEW_FAMILY_GOALS),
    "jitc": (jitc_case, *NEW_FAMILY_GOALS),
    "jitc_large": (jitc_large_case, *NEW_FAMILY_GOALS),
}


# ---------------------------------------------------------------------------
# the child: one fresh process, one scenario
# ---------------------------------------------------------------------------
def child(family: str, scenario: str, n: int, calls: int) -> dict:
    out = {}

    def compile_cpu():
        from evjax.backends import compile_queue

        return compile_queue.compile_cpu_seconds()

    def now():
        return [time.perf_counter(), time.process_time(), compile_cpu() if "evjax" in sys.modules else 0.0]

    clock = now()

    def lap(name):
        t = now()
        process, background = t[1] - clock[1], t[2] - clock[2]
        out[name] = {"wall": t[0] - clock[0], "cpu": process - background, "process_cpu": process,
                     "background_cpu": background}
        clock[:] = t

    import jax

    import evjax

    lap("import")
    forward, loss, args = FAMILIES[family][0](n)
    jax.block_until_ready(args)
    f, g = jax.jit(forward), jax.jit(jax.grad(loss))
    clock[:] = now()
    if scenario != "grad_first":
        jax.block_until_ready(f(*args))
        lap("forward")
    jax.block_until_ready(g(*args))
    lap("grad")
    if scenario == "background":
        evjax.wait_for_kernels()
        lap("ready")
        jax.block_until_ready((f(*args), g(*args)))
        lap("retrace")
    if scenario in ("background", "warm"):
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            samples.append(time.perf_counter() - start)
        out["steady_forward"] = float(np.median(samples))
    return out


def run_child(family: str, scenario: str, n: int, calls: int, cache: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(cache, "numba"),
           "EVJAX_CACHE_DIR": os.path.join(cache, "evjax"),
           "EVJAX_BACKGROUND_COMPILE": "0" if scenario == "waiting" else "1"}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", family, scenario, str(n), str(calls)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"{family}/{scenario} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(family: str, n: int, calls: int) -> dict:
    """Every scenario of one family, each in a fresh process; warm reuses the first one's caches."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="evjax-cold-") as shared:
        results["background"] = run_child(family, "background", n, calls, shared)
        results["warm"] = run_child(family, "warm", n, calls, shared)
    for scenario in ("grad_first", "waiting"):
        with tempfile.TemporaryDirectory(prefix="evjax-cold-") as empty:
            results[scenario] = run_child(family, scenario, n, calls, empty)
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
    parser.add_argument("--n", type=int, default=4000, help="neurons per side (default 4000)")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/results/cold_start.md)")
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
         f"fresh process with empty NUMBA_CACHE_DIR and EVJAX_CACHE_DIR. Wall seconds, and in brackets the "
         f"process's CPU seconds less the background compiler's. Load average at start: "
         f"{os.getloadavg()[0]:.2f} (a shared machine stretches wall times).")
    emit()
    goal_rows, detail_rows, met, total = [], [], 0, 0
    plot = {"measured": [], "goal": []}
    labels = []
    for family in families:
        _, forward_goal, grad_goal = FAMILIES[family]
        r = measure(family, args.n, calls)
        bg = r["background"]
        for what, got, goal in (("first forward", bg["forward"], forward_goal),
                                ("first jit(grad), after the forward", bg["grad"], grad_goal),
                                ("first jit(grad), nothing before", r["grad_first"]["grad"], grad_goal)):
            ok = got["wall"] <= goal
            met += ok
            total += 1
            goal_rows.append([family, what, f"<= {goal:.1f} s", seconds(got), "met" if ok else "NOT met"])
            labels.append(f"{family}: {what.split(',')[0]}")
            plot["measured"].append(got["wall"])
            plot["goal"].append(goal)
        steady = bg.get("steady_forward", float("nan")) / r["warm"].get("steady_forward", float("nan"))
        detail_rows.append([
            family, seconds(bg["import"]), seconds(bg["ready"]), seconds(bg["retrace"]),
            seconds(r["waiting"]["forward"]), seconds(r["waiting"]["grad"]),
            seconds(r["warm"]["forward"]), seconds(r["warm"]["grad"]),
            f"{fmt_time(bg['steady_forward'])} / {fmt_time(r['warm']['steady_forward'])} = {steady:.2f}",
        ])
    emit("## Goals (issue 17)")
    emit()
    emit(markdown_table(["family", "first call", "goal", "measured", ""], goal_rows))
    emit()
    emit(f"{met} of {total} goals met.")
    emit()
    emit("## Around them")
    emit()
    emit("Kernels ready: until `evjax.wait_for_kernels()` returned after the grad call (the background compile "
         "of every kernel used; meanwhile calls run the ops' pure-JAX references). Next call: forward and grad "
         "again, traced again, now on the kernels. Waiting: the same first calls with "
         "`EVJAX_BACKGROUND_COMPILE=0`. Warm: a second process on the filled caches. Steady forward: median "
         "call after the kernels are ready, cold process / warm process.")
    emit()
    emit(markdown_table(["family", "import evjax", "kernels ready", "next call", "waiting: forward",
                         "waiting: grad", "warm: forward", "warm: grad", "steady forward (ratio)"], detail_rows))
    os.makedirs(RESULTS, exist_ok=True)
    out = args.out or os.path.join(RESULTS, "cold_start.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    save_bar_plot(os.path.join(RESULTS, "cold_start.png"), labels, plot, ylabel="seconds (wall)",
                  title="evjax first calls, empty caches", log=False)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        family, scenario, n, calls = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(child(family, scenario, n, calls)))
    else:
        main()
