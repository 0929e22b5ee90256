"""Plasticity updates per step: evjax against a hand-written Numba loop, pure JAX and brainevent, in one process.

    python benchmarks/plasticity.py           # n = 20000, p = 0.005, 1 % and 5 % active
    python benchmarks/plasticity.py --quick   # fewer repetitions

Cases (issue 32): ``update_csr_on_binary_pre`` and ``update_csr_on_binary_post``
on a CSR connection of n_pre = n_post = 20000 neurons, p = 0.005 (100
synapses per row, 2 million synapses, per-synapse weights), with 1 % and 5 %
of the neurons spiking, bounds [0, 1].  Each call returns a new weight array
(the copy of 8 MB is part of every candidate's work).

Candidates, each a jitted call from JAX (or a call from NumPy for the loop),
timed round-robin in the same run (medians; ratios are to evjax's numba
backend):

* evjax ``numba`` (the CPU default) and ``reference`` (pure JAX: a gather, a
  select and a scatter over every synapse);
* the hand-written limit: a serial Numba loop over the active rows (columns)
  from NumPy that copies the weights and updates the synapses of active
  lines, what evjax's kernel does, without JAX around it;
* brainevent 0.3.0's functions of the same names, when it imports (it needs
  Python 3.12 or later: run this script in such a virtualenv with evjax on
  ``PYTHONPATH`` to include it).

Each update is also timed per step of a ``jax.lax.scan`` of 50 steps whose
carry is the weights (a training loop): there evjax's kernel writes in place
(its output aliases the weights), and the hand-written loop updates one copy
in place for all 50 steps.

Goals (issue 32): evjax <= 1.3x the hand-written loop, <= 0.5x brainevent.

Delays (``csr_delay_deliver``, section at the end): the same connection (n =
20000, p = 0.005: 2 million synapses, per-synapse weights), 1 % of the
presynaptic neurons spiking, a ring of L = 32 slots, delays uniform in [1, 32)
(brainevent refuses 0).  Candidates: evjax ``numba`` and ``reference``, a
hand-written serial Numba loop from NumPy (copies the ring, adds the synapses
of active rows), brainevent 0.3.0's ``csr_delay_deliver`` (its CPU default,
numba).  "one call": a jitted call returning a new ring (the ring's copy, 2.5
MB, is part of every candidate's work, as the weights' copy above); "per step
of a scan": 50 steps of ``lax.scan`` with the ring carried (updated in place
where the op aliases it), time / 50.  Goal: evjax <= 0.5x brainevent per step;
the ratio to the hand-written loop is reported.
Writes ``benchmarks/results/plasticity.{md,png}``.
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
import evjax  # noqa: E402
from benchmarks.common import fmt_time, markdown_table, median_times, provenance, save_bar_plot  # noqa: E402

try:
    import brainevent  # noqa: E402
except Exception:  # noqa: BLE001 - optional peer
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
GOAL_LOOP, GOAL_BRAINEVENT = 1.3, 0.5
SCAN_STEPS = 50  # steps of the jax.lax.scan in the "per step of a scan" measurements


@numba.njit(cache=True, nogil=True)
def hand_written(weight, indices, indptr, positions, trace, spikes, lo, hi):
    out = weight.copy()
    direct = positions.shape[0] == 0
    for i in range(spikes.shape[0]):
        if spikes[i]:
            for e in range(indptr[i], indptr[i + 1]):
                p = e if direct else positions[e]
                out[p] = min(max(out[p] + trace[indices[e]], lo), hi)
    return out


@numba.njit(cache=True, nogil=True)
def hand_written_steps(weight, indices, indptr, positions, trace, steps, lo, hi):
    """``hand_written`` for each row of ``steps`` in turn, in place after one copy (what a scan does)."""
    out = weight.copy()
    direct = positions.shape[0] == 0
    for k in range(steps.shape[0]):
        for i in range(steps.shape[1]):
            if steps[k, i]:
                for e in range(indptr[i], indptr[i + 1]):
                    p = e if direct else positions[e]
                    out[p] = min(max(out[p] + trace[indices[e]], lo), hi)
    return out


def structure(n: int, p: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    k = max(1, round(p * n))
    indices = np.sort(rng.choice(n, size=(n, k), replace=True), axis=1).astype(np.int32).ravel()
    indptr = np.arange(0, n * k + 1, k, dtype=np.int32)
    return indices, indptr


def measure(n: int, p: float, rate: float, *, rounds: int, calls: int) -> dict:
    rng = np.random.default_rng(1)
    indices, indptr = structure(n, p)
    nnz = len(indices)
    weight = rng.uniform(0, 1, nnz).astype(np.float32)
    csc_indptr, csc_indices, weight_indices = evjax.csr_to_csc_index(indptr, indices, shape=(n, n))
    pre_spike, post_spike = rng.random(n) < rate, rng.random(n) < rate
    pre_trace, post_trace = (rng.uniform(-0.05, 0.05, n).astype(np.float32) for _ in range(2))
    empty = np.zeros(0, np.int32)
    j = {name: jnp.asarray(v) for name, v in dict(w=weight, idx=indices, ptr=indptr, cidx=csc_indices,
                                                  cptr=csc_indptr, wi=weight_indices, spre=pre_spike,
                                                  spost=post_spike, tpre=pre_trace, tpost=post_trace).items()}

    def evjax_pre(backend):
        f = jax.jit(lambda w, idx, ptr, s, t: evjax.update_csr_on_binary_pre(w, idx, ptr, s, t, 0.0, 1.0,
                                                                              shape=(n, n), backend=backend))
        return lambda: f(j["w"], j["idx"], j["ptr"], j["spre"], j["tpost"])

    def evjax_post(backend):
        f = jax.jit(lambda w, idx, ptr, wi, t, s: evjax.update_csr_on_binary_post(
            w, idx, ptr, wi, t, s, 0.0, 1.0, shape=(n, n), backend=backend))
        return lambda: f(j["w"], j["cidx"], j["cptr"], j["wi"], j["tpre"], j["spost"])

    pre = {"evjax numba": evjax_pre("numba"), "evjax reference": evjax_pre("reference"),
           "hand-written Numba": lambda: hand_written(weight, indices, indptr, empty, post_trace, pre_spike,
                                                      np.float32(0), np.float32(1))}
    post = {"evjax numba": evjax_post("numba"), "evjax reference": evjax_post("reference"),
            "hand-written Numba": lambda: hand_written(weight, csc_indices, csc_indptr, weight_indices, pre_trace,
                                                       post_spike, np.float32(0), np.float32(1))}
    if brainevent is not None:
        be_pre = jax.jit(lambda w, idx, ptr, s, t: brainevent.update_csr_on_binary_pre(w, idx, ptr, s, t, 0.0, 1.0,
                                                                                       shape=(n, n)))
        be_post = jax.jit(lambda w, idx, ptr, wi, t, s: brainevent.update_csr_on_binary_post(
            w, idx, ptr, wi, t, s, 0.0, 1.0, shape=(n, n)))
        pre["brainevent 0.3.0"] = lambda: be_pre(j["w"], j["idx"], j["ptr"], j["spre"], j["tpost"])
        post["brainevent 0.3.0"] = lambda: be_post(j["w"], j["cidx"], j["cptr"], j["wi"], j["tpre"], j["spost"])
    want_pre = hand_written(weight, indices, indptr, empty, post_trace, pre_spike, np.float32(0), np.float32(1))
    np.testing.assert_array_equal(np.asarray(pre["evjax numba"]()), want_pre)
    want_post = hand_written(weight, csc_indices, csc_indptr, weight_indices, pre_trace, post_spike, np.float32(0),
                             np.float32(1))
    np.testing.assert_array_equal(np.asarray(post["evjax numba"]()), want_post)
    # per step of a scan: the weights are the carry, so the update writes in place (no copy per step)
    steps = {side: jnp.asarray(rng.random((SCAN_STEPS, n)) < rate) for side in ("pre", "post")}

    def scanned(update, side):
        if side == "pre":
            def one(w, s):
                return update(w, j["idx"], j["ptr"], s, j["tpost"], 0.0, 1.0, shape=(n, n))
        else:
            def one(w, s):
                return update(w, j["cidx"], j["cptr"], j["wi"], j["tpre"], s, 0.0, 1.0, shape=(n, n))
        f = jax.jit(lambda w, st: jax.lax.scan(lambda w, s: (one(w, s), None), w, st)[0])
        return lambda: f(j["w"], steps[side])

    per_step = {}
    for side, update in (("pre", evjax.update_csr_on_binary_pre), ("post", evjax.update_csr_on_binary_post)):
        per_step[side] = {"evjax numba": scanned(update, side)}
        if side == "pre":
            per_step[side]["hand-written Numba"] = lambda: hand_written_steps(
                weight, indices, indptr, empty, post_trace, np.asarray(steps["pre"]), np.float32(0), np.float32(1))
        else:
            per_step[side]["hand-written Numba"] = lambda: hand_written_steps(
                weight, csc_indices, csc_indptr, weight_indices, pre_trace, np.asarray(steps["post"]),
                np.float32(0), np.float32(1))
        if brainevent is not None:
            per_step[side]["brainevent 0.3.0"] = scanned(getattr(brainevent, f"update_csr_on_binary_{side}"), side)
        np.testing.assert_array_equal(np.asarray(per_step[side]["evjax numba"]()),
                                      per_step[side]["hand-written Numba"]())
    scan_calls = max(1, calls // 4)
    return {"pre": median_times(pre, rounds=rounds, calls=calls),
            "post": median_times(post, rounds=rounds, calls=calls),
            "pre, per step of a scan": {k: v / SCAN_STEPS for k, v in median_times(
                per_step["pre"], rounds=rounds, calls=scan_calls).items()},
            "post, per step of a scan": {k: v / SCAN_STEPS for k, v in median_times(
                per_step["post"], rounds=rounds, calls=scan_calls).items()}, "nnz": nnz}


# ---------------------------------------------------------------------------
# synaptic delays: csr_delay_deliver
# ---------------------------------------------------------------------------
DELAY_SLOTS = 32


@numba.njit(cache=True, nogil=True)
def hand_written_delay(ring, spikes, data, indices, indptr, delays, t):
    out = ring.copy()
    n_slots = out.shape[0]
    tm = t % n_slots
    for i in range(spikes.shape[0]):
        if spikes[i]:
            for e in range(indptr[i], indptr[i + 1]):
                s = tm + delays[e]
                if s >= n_slots:
                    s -= n_slots
                out[s, indices[e]] += data[e]
    return out


def measure_delay(n: int, p: float, rate: float, *, rounds: int, calls: int) -> dict:
    from evjax.primitives.delay import csr_delay_deliver

    rng = np.random.default_rng(2)
    indices, indptr = structure(n, p)
    nnz = len(indices)
    data = rng.uniform(0, 1, nnz).astype(np.float32)
    delays = rng.integers(1, DELAY_SLOTS, nnz).astype(np.int32)
    ring = rng.uniform(0, 1, (DELAY_SLOTS, n)).astype(np.float32)
    spikes = rng.random(n) < rate
    steps = rng.random((SCAN_STEPS, n)) < rate
    t = np.int32(7)
    j = {name: jnp.asarray(v) for name, v in dict(ring=ring, s=spikes, w=data, idx=indices, ptr=indptr, d=delays,
                                                  steps=steps).items()}

    def one_call(deliver):
        f = jax.jit(lambda r, s, w, idx, ptr, d, t: deliver(r, s, w, idx, ptr, d, t, shape=(n, n)))
        return lambda: f(j["ring"], j["s"], j["w"], j["idx"], j["ptr"], j["d"], t)

    def scan(deliver):
        def run(r, steps, w, idx, ptr, d):
            def step(r, xs):
                k, s = xs
                return deliver(r, s, w, idx, ptr, d, k, shape=(n, n)), None
            return jax.lax.scan(step, r, (jnp.arange(SCAN_STEPS, dtype=jnp.int32), steps))[0]
        f = jax.jit(run)
        return lambda: f(j["ring"], j["steps"], j["w"], j["idx"], j["ptr"], j["d"])

    numba_deliver = lambda *a, **k: csr_delay_deliver(*a, **k, backend="numba")  # noqa: E731
    reference_deliver = lambda *a, **k: csr_delay_deliver(*a, **k, backend="reference")  # noqa: E731
    single = {"evjax numba": one_call(numba_deliver), "evjax reference": one_call(reference_deliver),
              "hand-written Numba": lambda: hand_written_delay(ring, spikes, data, indices, indptr, delays, int(t))}
    per_step = {"evjax numba": scan(numba_deliver), "evjax reference": scan(reference_deliver)}
    if brainevent is not None:
        single["brainevent 0.3.0"] = one_call(brainevent.csr_delay_deliver)
        per_step["brainevent 0.3.0"] = scan(brainevent.csr_delay_deliver)
    want = hand_written_delay(ring, spikes, data, indices, indptr, delays, int(t))
    np.testing.assert_array_equal(np.asarray(single["evjax numba"]()), want)
    if brainevent is not None:
        np.testing.assert_allclose(np.asarray(single["brainevent 0.3.0"]()), want, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(per_step["brainevent 0.3.0"]()), np.asarray(per_step["evjax numba"]()),
                                   rtol=1e-5)
    scanned = median_times(per_step, rounds=rounds, calls=max(1, calls // 4))
    return {"one call": median_times(single, rounds=rounds, calls=calls),
            "per step of a scan": {k: v / SCAN_STEPS for k, v in scanned.items()}, "nnz": nnz}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=os.path.join(RESULTS, "plasticity.md"))
    args = parser.parse_args()
    rounds, calls = (3, 10) if args.quick else (9, 20)
    n, p = 20000, 0.005
    versions = f"jax {jax.__version__}, numba {numba.__version__}, Python {sys.version.split()[0]}" + (
        f", brainevent {brainevent.__version__}" if brainevent is not None else ", brainevent not importable")
    lines = [provenance(), "# Plasticity updates per step", "",
             f"{versions}; {os.cpu_count()} CPUs. n_pre = n_post = {n}, p = {p}, bounds [0, 1]; medians of "
             f"{rounds} x {calls} synchronous calls, candidates interleaved; ratio = time / evjax numba's.", ""]
    goals, labels, series = [], [], {}
    for rate in (0.01, 0.05):
        r = measure(n, p, rate, rounds=rounds, calls=calls)
        for side in ("pre", "post", "pre, per step of a scan", "post, per step of a scan"):
            times = r[side]
            base = times["evjax numba"]
            op = f"update_csr_on_binary_{side.split(',')[0]}" + ("" if "," not in side else " (per step of a scan)")
            lines += [f"## {op}, {rate:.0%} active ({r['nnz']} synapses)", "",
                      markdown_table(["method", "median", "ratio"],
                                     [[k, fmt_time(t), f"{t / base:.2f}x"] for k, t in times.items()]), ""]
            ratio = base / times["hand-written Numba"]
            goals.append([op, f"{rate:.0%}", "<= 1.3x hand-written", f"{ratio:.2f}x",
                          "met" if ratio <= GOAL_LOOP else "NOT met"])
            if "brainevent 0.3.0" in times:
                ratio = base / times["brainevent 0.3.0"]
                goals.append([op, f"{rate:.0%}", "<= 0.5x brainevent", f"{ratio:.2f}x",
                              "met" if ratio <= GOAL_BRAINEVENT else "NOT met"])
            else:
                goals.append([op, f"{rate:.0%}", "<= 0.5x brainevent", "not measured (brainevent not importable)",
                              "-"])
            labels.append(f"{side} {rate:.0%}")
            for k in sorted(set(series) | set(times)):
                series.setdefault(k, [float("nan")] * (len(labels) - 1)).append(times.get(k, float("nan")) * 1e6)
        print("\n".join(lines[-12:]), flush=True)
    rate = 0.01
    r = measure_delay(n, p, rate, rounds=rounds, calls=calls)
    for kind in ("one call", "per step of a scan"):
        times = r[kind]
        base = times["evjax numba"]
        lines += [f"## csr_delay_deliver, {rate:.0%} active, L = {DELAY_SLOTS}, {kind} ({r['nnz']} synapses)", "",
                  markdown_table(["method", "median", "ratio"],
                                 [[k, fmt_time(t), f"{t / base:.2f}x"] for k, t in times.items()]), ""]
        labels.append(f"delay {kind}")
        for k in series:
            series[k].append(times.get(k, float("nan")) * 1e6)
        print("\n".join(lines[-10:]), flush=True)
    ratio = r["one call"]["evjax numba"] / r["one call"]["hand-written Numba"]
    goals.append(["csr_delay_deliver (one call)", f"{rate:.0%}", "ratio to hand-written (reported)", f"{ratio:.2f}x",
                  "-"])
    for kind in ("one call", "per step of a scan"):
        times = r[kind]
        if "brainevent 0.3.0" in times:
            ratio = times["evjax numba"] / times["brainevent 0.3.0"]
            goals.append([f"csr_delay_deliver ({kind})", f"{rate:.0%}", "<= 0.5x brainevent", f"{ratio:.2f}x",
                          "met" if ratio <= GOAL_BRAINEVENT else "NOT met"])
        else:
            goals.append([f"csr_delay_deliver ({kind})", f"{rate:.0%}", "<= 0.5x brainevent",
                          "not measured (brainevent not importable)", "-"])
    lines += ["## Goals (issue 32; delays: n = 20000, p = 0.005, 1 % active, L = 32)", "",
              markdown_table(["op", "active", "goal", "measured", ""], goals), ""]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    save_bar_plot(os.path.splitext(args.out)[0] + ".png", labels, series, ylabel="us per call",
                  title="plasticity update per step")


if __name__ == "__main__":
    main()
