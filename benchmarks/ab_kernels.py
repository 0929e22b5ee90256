"""A/B: kernel and step speed in this tree against an earlier commit, in one run.

    python benchmarks/ab_kernels.py                          # CSR, against 740351d (before issue 17)
    python benchmarks/ab_kernels.py --suite dense --base <commit> --rounds 9
    python benchmarks/ab_kernels.py --suite example --base 7ed9763   # the example's training step

The earlier commit is checked out into a temporary folder (``git worktree``).
Each round runs one fresh process per tree, alternately (base, new, new,
base, ...), each with its own warm Numba/evjax cache, and each process times the suite's cases (medians of many calls):

* ``csr``: the forward ``spikes @ W`` and ``jit(grad)`` of ``sum((spikes @ W)**2)``
  w.r.t. the weights at the cases of ``benchmarks/csr_event.py --quick``;
* ``dense``: the same through ``BinaryArray(spikes) @ W`` for a dense ``W``;
* ``jitc``: ``binary_jitsmv`` (event-driven scatter), ``jitnmv`` (gather of a
  float vector) and ``jit(grad)`` w.r.t. the normal law's parameters;
* ``spikes``: the event scatter ``spikes @ W`` where ``W`` is larger than the
  caches (n = 10^5, 10 and 100 synapses per row; n = 20000, 200 per row) and
  the spikes are new at each call, as a network's are at each step: each call
  takes the next of 64 spike vectors (``BinaryArray``, and the same events as a
  ``CompactBinary``), one vector and a batch of 32;
* ``example``: one training step of ``examples/train_sparse_snn.py`` (the
  tree's own example, its README configuration: BPTT over 50 steps, a batch
  of 16, Adam), in milliseconds.

The table gives, per case, the median over rounds of each tree, the ratio
new / base, and the same ratio between the new tree's own rounds (an A/A:
this machine's noise; ±20% per case at the n=20000 parallel paths on 2
shared cores). Goal (issues 17 and Structure v3: speed must not fall by more
than 5%): the geometric mean of the ratios at most 1.05, and no case more
than 5% slower in every round. Writes ``benchmarks/results/ab_kernels.{md,png}``
(csr) or ``ab_<suite>.{md,png}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import RESULTS, markdown_table, provenance, save_bar_plot  # noqa: E402

PRELUDE = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_cpu_enable_async_dispatch", False)
import evjax
assert evjax.__file__.startswith(sys.argv[1]), (evjax.__file__, sys.argv[1])

def structure(n, p, homogeneous, seed=0):
    rng = np.random.default_rng(seed)
    k = int(round(n * p))
    indices = np.concatenate([np.sort(rng.choice(n, k, replace=False)) for _ in range(n)]).astype(np.int32)
    indptr = np.arange(0, n * k + 1, k, dtype=np.int32)
    data = np.ones(1, np.float32) if homogeneous else rng.standard_normal(n * k).astype(np.float32)
    return evjax.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)), shape=(n, n))

def median_over(f, arg_sets, calls=200):  # median us of f's calls, call c taking arg_sets[c % len(arg_sets)]
    jax.block_until_ready(f(*arg_sets[0]))
    try:  # the full kernels, not the first calls' serial tiers (a tree that has none lacks this)
        from evjax.backends import numba_cpu
        numba_cpu.compile_full_kernels(hand_over=True)
    except (ImportError, AttributeError, TypeError):
        pass
    for args in (arg_sets * 2)[:max(2, len(arg_sets))]:
        jax.block_until_ready(f(*args))
    times = []
    for c in range(calls):
        args = arg_sets[c % len(arg_sets)]
        t = time.perf_counter(); jax.block_until_ready(f(*args)); times.append(time.perf_counter() - t)
    return 1e6 * float(np.median(times))

def median_us(f, *args, calls=200):  # the same arguments at every call
    return median_over(f, [args], calls)

out = {}
"""

SUITES = {
    "csr": r"""
fwd = jax.jit(lambda W, s: s @ W)
loss = jax.jit(jax.grad(lambda d, W, s: jnp.sum((s @ W.with_data(d)) ** 2)))
for n, p in ((4000, 0.02), (20000, 0.01)):
    for kind in ("het", "hom"):
        W = structure(n, p, kind == "hom")
        for rate in (0.01, 0.05, 0.2):
            rng = np.random.default_rng(1)
            s1 = jnp.asarray(rng.random(n) < rate)
            sB = jnp.asarray(rng.random((32, n)) < rate)
            tag = f"n={n} {kind} rate={rate}"
            out[f"{tag} forward"] = median_us(fwd, W, s1)
            out[f"{tag} batch32"] = median_us(fwd, W, sB, calls=50)
            if kind == "het":
                out[f"{tag} jit(grad)"] = median_us(loss, W.data, W, s1)
""",
    "dense": r"""
fwd = jax.jit(lambda W, s: evjax.BinaryArray(s) @ W)
loss = jax.jit(jax.grad(lambda W, s: jnp.sum((evjax.BinaryArray(s) @ W) ** 2)))
for n in (1000, 4000):
    W = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32))
    for rate in (0.01, 0.05, 0.2):
        rng = np.random.default_rng(1)
        s1 = jnp.asarray(rng.random(n) < rate)
        sB = jnp.asarray(rng.random((32, n)) < rate)
        tag = f"n={n} rate={rate}"
        out[f"{tag} forward"] = median_us(fwd, W, s1)
        out[f"{tag} batch32"] = median_us(fwd, W, sB, calls=50)
        out[f"{tag} jit(grad)"] = median_us(loss, W, s1, calls=50)
""",
    "jitc": r"""
for n, prob in ((4000, 0.02), (20000, 0.005)):
    kw = dict(shape=(n, n), transpose=True)
    events = jax.jit(lambda s: evjax.binary_jitsmv(0.5, prob, s, 7, corder=False, **kw))
    floats = jax.jit(lambda v: evjax.jitnmv(0.0, 1.0, prob, v, 7, corder=True, **kw))
    loss = jax.jit(jax.grad(lambda loc, scale, s: jnp.sum(
        evjax.binary_jitnmv(loc, scale, prob, s, 7, corder=False, **kw) ** 2), argnums=(0, 1)))
    v = jnp.asarray(np.random.default_rng(2).standard_normal(n).astype(np.float32))
    out[f"n={n} jitnmv gather"] = median_us(floats, v, calls=50)
    for rate in (0.01, 0.05):
        s1 = jnp.asarray(np.random.default_rng(1).random(n) < rate)
        tag = f"n={n} rate={rate}"
        out[f"{tag} binary_jitsmv scatter"] = median_us(events, s1)
        out[f"{tag} jit(grad) binary_jitnmv"] = median_us(loss, jnp.float32(0.1), jnp.float32(1.0), s1, calls=50)
""",
    "spikes": r"""
binary = jax.jit(lambda W, s: evjax.BinaryArray(s) @ W)
compact = jax.jit(lambda W, c: c @ W)
for n, k in ((100_000, 10), (100_000, 100), (20_000, 200)):
    rng = np.random.default_rng(0)
    indices = np.sort(rng.integers(0, n, (n, k)), axis=1).astype(np.int32).ravel()
    data = rng.standard_normal(n * k).astype(np.float32)
    W = evjax.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(np.arange(0, n * k + 1, k, dtype=np.int32))),
                  shape=(n, n))
    for rate in (0.01, 0.05):
        spikes = [jnp.asarray(rng.random(n) < rate) for _ in range(64)]
        tag = f"n={n} k={k} rate={rate}"
        out[f"{tag} BinaryArray @ W"] = median_over(binary, [(W, s) for s in spikes], calls=640)
        if hasattr(evjax, "CompactBinary"):
            out[f"{tag} CompactBinary @ W"] = median_over(
                compact, [(W, evjax.CompactBinary.from_array(s)) for s in spikes], calls=640)
        if k == 10:
            out[f"{tag} batch32"] = median_over(
                binary, [(W, jnp.asarray(rng.random((32, n)) < rate)) for _ in range(8)], calls=80)
""",
    "example": r"""
import optax
sys.path.insert(0, sys.argv[1] + "/examples")
import train_sparse_snn as ex
cfg = ex.Config()
x, y = ex.make_randman(cfg, cfg.batch, seed=cfg.seed + 3)
params, s_in, s_rec = ex.init_params(cfg)
optimizer = optax.adam(cfg.lr)
step = ex.make_train_step(ex.make_loss(cfg, ex.make_trial(cfg, ex.make_synapses(s_in, s_rec, False))), optimizer)
state = optimizer.init(params)
out["training step (ms)"] = median_us(step, params, state, x, y, calls=30) / 1e3
""",
}
FINISH = 'print("RESULT" + json.dumps(out))\n'



def run_tree(tree: str, cache: str, suite: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree, NUMBA_CACHE_DIR=os.path.join(cache, "numba"),
               EVJAX_CACHE_DIR=os.path.join(cache, "evjax"))
    child = PRELUDE + SUITES[suite] + FINISH
    result = subprocess.run([sys.executable, "-c", child, tree], env=env, cwd=tree, capture_output=True, text=True,
                            timeout=3600)
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT")]
    if result.returncode != 0 or not line:
        raise RuntimeError(f"run in {tree} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return json.loads(line[-1][len("RESULT"):])


def same_tree_ratio(times: list[float]) -> float:
    """Median of the even rounds over the median of the odd ones: an A/A ratio of one tree."""
    if len(times) < 2:
        return float("nan")
    return float(np.median(times[0::2]) / np.median(times[1::2]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="740351d", help="the earlier commit (default: before issue 17)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--suite", choices=sorted(SUITES), default="csr", help="what to time (default csr)")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="evjax_ab_")
    base_tree = os.path.join(work, "base")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", base_tree, args.base], check=True,
                   capture_output=True)
    try:
        trees = {"base": base_tree, "new": ROOT}
        caches = {name: os.path.join(work, f"cache_{name}") for name in trees}
        for name in trees:  # warm-up: compile every kernel into each tree's cache
            run_tree(trees[name], caches[name], args.suite)
        runs: dict[str, list[dict]] = {"base": [], "new": []}
        for r in range(args.rounds):
            for name in (("base", "new") if r % 2 == 0 else ("new", "base")):
                runs[name].append(run_tree(trees[name], caches[name], args.suite))
                print(f"round {r + 1}: {name} done", flush=True)
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_tree], capture_output=True)
    cases = list(runs["new"][0])
    med = {name: {c: float(np.median([run[c] for run in runs[name]])) for c in cases} for name in runs}
    rows, ratios, failing = [], [], []
    for c in cases:
        ratio = med["new"][c] / med["base"][c]
        ratios.append(ratio)
        noise = same_tree_ratio([run[c] for run in runs["new"]])
        # the fastest new round slower than the slowest base round (by chance, with r rounds
        # each: 1 time in C(2r, r), 1 in 3432 at r = 7)
        separated = min(run[c] for run in runs["new"]) > max(run[c] for run in runs["base"])
        if ratio > 1.05 and separated:
            failing.append(c)
        rows.append([c, f"{med['base'][c]:.1f}", f"{med['new'][c]:.1f}", f"{ratio:.2f}", f"{noise:.2f}",
                     "yes" if separated else "no"])
    worst = max(ratios)
    geo = float(np.exp(np.mean(np.log(ratios))))
    met = geo <= 1.05 and not failing
    unit = "milliseconds" if args.suite == "example" else "microseconds"
    what = "the example's training step" if args.suite == "example" else f"{args.suite} kernel speed"
    lines = [provenance(argv), f"# A/B: {what}, this tree against {args.base}", "",
             f"{args.rounds} rounds of one fresh process per tree, alternating; medians in {unit} "
             f"(sync dispatch, warm caches). Ratio = new / base. "
             f"'A/A' is the same ratio between the new tree's own even and odd rounds: the noise of "
             f"this machine for that case. 'Separated': every new round slower than every base round.", "",
             markdown_table(["case", f"base {args.base}", "new", "ratio", "A/A", "separated"], rows), "",
             f"- geometric mean of the ratios: {geo:.3f}",
             f"- worst case: {worst:.2f} ({cases[ratios.index(worst)]})",
             f"- cases more than 5% slower in every round: {', '.join(failing) if failing else 'none'}",
             f"- goal (at most 5% slower: geometric mean <= 1.05, and no case more than 5% "
             f"slower in every round): {'met' if met else 'NOT met'}"]
    text = "\n".join(lines)
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    stem = "ab_kernels" if args.suite == "csr" else f"ab_{args.suite}"
    with open(os.path.join(RESULTS, f"{stem}.md"), "w") as f:
        f.write(text + "\n")
    save_bar_plot(os.path.join(RESULTS, f"{stem}.png"), cases,
                  {"base": [med["base"][c] for c in cases], "new": [med["new"][c] for c in cases]},
                  ylabel=f"median ({'ms' if args.suite == 'example' else 'us'})",
                  title=f"{what}: this tree vs {args.base}")


if __name__ == "__main__":
    main()
