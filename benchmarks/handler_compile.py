"""What the first call of a Numba CPU kernel through the XLA FFI costs to compile.

    python benchmarks/handler_compile.py             # the table (5 fresh processes)
    python benchmarks/handler_compile.py --rounds 3  # fewer processes
    python benchmarks/handler_compile.py --stages    # only one process's split of where the CPU goes
    python benchmarks/handler_compile.py --baseline ../evjax-old   # and another checkout, interleaved

Every ``@numba.njit`` kernel reaches XLA through a generated ``@numba.cfunc``
handler (:mod:`evjax.backends.numba_cpu`); its first call compiles the kernel
and the handler around it.  Each round is a fresh process with new, empty
``NUMBA_CACHE_DIR`` and ``EVJAX_CACHE_DIR`` (a new user's first run) that, after
``import evjax`` and a first ``jax.jit`` (JAX's own first-call cost, not
measured), times the first ``jax.jit(evjax.numba_kernel(k, outs=...))(x)`` of:

1. a trivial two-line kernel, the first of the process;
2. a second trivial kernel;
3. a trivial kernel with 4 inputs;
4. the first kernel again at a second signature (float64).

Wall seconds and the process's CPU seconds (``time.process_time``, every
thread), medians over the rounds; a bare ``@numba.njit`` compile of a trivial
function (first of the process, then a second one) is measured for scale, in
processes of their own after the same imports.  One more process splits the
cases' CPU time into Numba's front end per compiled function, LLVM (IR parsing and function
passes, module passes, machine code), disk-cache loads and writes, and Numba's
one-time set-up of its target (``Numba init``: the registries every first
compile of a process loads, handler or not).

Writes ``benchmarks/results/handler_compile.{md,png}`` (``--stages`` only prints its split).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # after PYTHONPATH: a child imports evjax from the checkout it is given
    sys.path.append(ROOT)
from benchmarks.common import RESULTS, markdown_table, save_bar_plot  # noqa: E402
CASES = [
    ("first", "first trivial kernel of the process"),
    ("second", "a second trivial kernel"),
    ("four_inputs", "a trivial kernel with 4 inputs"),
    ("second_signature", "the first kernel at a second signature (float64)"),
]
BARE = [("bare_first", "bare @numba.njit compile, first of the process"),
        ("bare_second", "bare @numba.njit compile, a second function")]


# ---------------------------------------------------------------------------
# the child: one fresh process
# ---------------------------------------------------------------------------
import numba  # noqa: E402


@numba.njit(cache=True)
def scale(x, out):
    for i in range(out.shape[0]):
        out[i] = x[i] * 2


@numba.njit(cache=True)
def shift(x, out):
    for i in range(out.shape[0]):
        out[i] = x[i] + 1


@numba.njit(cache=True)
def axpby(a, b, c, d, out):
    for i in range(out.shape[0]):
        out[i] = a[i] * b[i] + c[i] - d[i]


@numba.njit(cache=True)
def bare_a(x):
    return x * 2 + 1


@numba.njit(cache=True)
def bare_b(x):
    return x * 3 - 1


def child(mode: str) -> dict:
    """``mode``: "handlers" (the cases), "bare" (bare njit compiles) or "stages" (the cases, split)."""
    import jax
    import jax.numpy as jnp

    import evjax

    jax.config.update("jax_enable_x64", True)  # for the float64 signature
    jax.block_until_ready(jax.jit(lambda v: v * 2 + 1)(jnp.ones(10)))  # JAX's own first jit: not measured
    x32, x64 = jnp.ones(10, jnp.float32), jnp.ones(10, jnp.float64)
    out32 = jax.ShapeDtypeStruct((10,), jnp.float32)
    out64 = jax.ShapeDtypeStruct((10,), jnp.float64)
    runs = [
        ("first", scale, [x32], out32),
        ("second", shift, [x32], out32),
        ("four_inputs", axpby, [x32] * 4, out32),
        ("second_signature", scale, [x64], out64),
    ]
    result, profile, stages = {}, None, mode == "stages"
    if mode == "bare":  # a process of its own: its first compile pays Numba's one-time set-up, as a kernel's would
        for name, fn in (("bare_first", bare_a), ("bare_second", bare_b)):
            w, c = time.perf_counter(), time.process_time()
            fn(1.0)
            result[name] = {"wall": time.perf_counter() - w, "cpu": time.process_time() - c}
        return result
    if stages:
        profile = StageProfile()
        profile.install()
    for name, kernel, args, outs in runs:
        if profile:
            profile.begin(name)
        w, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(jax.jit(evjax.numba_kernel(kernel, outs=outs))(*args))
        result[name] = {"wall": time.perf_counter() - w, "cpu": time.process_time() - c}
        if profile:
            profile.end(result[name]["cpu"])
    if stages:
        return {"times": result, "stages": profile.rows}
    return result


class StageProfile:
    """Where a compile's CPU time goes: Numba's front end per compiled function (its own time, less the
    functions it compiles and its LLVM work), LLVM per function, disk-cache writes and loads."""

    def __init__(self):
        self.rows: dict[str, dict[str, dict[str, float]]] = {}
        self.stack: list[list] = []  # [function, stage, start cpu, cpu of the regions inside]
        self.case = None

    def _add(self, who: str, what: str, seconds: float):
        table = self.rows.setdefault(self.case, {})
        entry = table.setdefault(who, {})
        entry[what] = entry.get(what, 0.0) + seconds

    def push(self, who: str | None, what: str):
        """Enter a measured region; ``who`` None: the compiled function of the region around it."""
        if who is None:
            who = self.stack[-1][0] if self.stack else "(outside any compile)"
        self.stack.append([who, what, time.process_time(), 0.0])

    def pop(self):
        """Leave the region: its own time (less the regions inside it) goes to its (function, stage)."""
        who, what, start, inner = self.stack.pop()
        total = time.process_time() - start
        self._add(who, what, total - inner)
        if self.stack:
            self.stack[-1][3] += total

    def _timed(self, who: str | None, what: str, fn):
        def wrapped(*a, **k):
            self.push(who, what)
            try:
                return fn(*a, **k)
            finally:
                self.pop()
        return wrapped

    def install(self):
        from numba.core import base, caching, codegen, event

        from evjax import _kernel_compat

        profile = self

        class Compiles(event.Listener):
            def on_start(self, ev):
                d = ev.data
                fn = getattr(d.get("dispatcher"), "py_func", None)
                name = getattr(fn, "__qualname__", "?").replace(".<locals>", "")
                args = ", ".join(str(a).split("(")[0] for a in d.get("args", ()))
                profile.push(f"{name}({args})", "front end")

            def on_end(self, ev):
                profile.pop()

        event.register("numba:compile", Compiles())
        lib = codegen.CPUCodeLibrary
        lib.add_ir_module = self._timed(None, "LLVM: IR in, function passes", lib.add_ir_module)
        lib._optimize_final_module = self._timed(None, "LLVM: module passes", lib._optimize_final_module)
        codegen.JITCodeLibrary._finalize_specific = self._timed(
            None, "LLVM: machine code", codegen.JITCodeLibrary._finalize_specific)
        caching.Cache.save_overload = self._timed(None, "disk cache", caching.Cache.save_overload)
        caching.Cache.load_overload = self._timed(None, "disk cache", caching.Cache.load_overload)
        base.BaseContext.refresh = self._timed(None, "Numba init", base.BaseContext.refresh)
        gc.callbacks.append(self._collection)
        _kernel_compat.compile_cfunc = self._timed("handler cfunc", "front end", _kernel_compat.compile_cfunc)

    def _collection(self, phase, info):  # Python's garbage collections: a row of their own
        if phase == "start":
            self.push("(garbage collection)", "other")
        elif self.stack and self.stack[-1][0] == "(garbage collection)":
            self.pop()

    def begin(self, case):
        self.case = case

    def end(self, cpu):
        table = self.rows.setdefault(self.case, {})
        spent = sum(sum(v.values()) for v in table.values())
        table["(JAX trace and XLA compile, evjax's Python)"] = {"other": cpu - spent}


# ---------------------------------------------------------------------------
# the parent
# ---------------------------------------------------------------------------
def run_child(mode: str, tree: str = ROOT) -> dict:
    """One fresh process with empty caches, importing evjax from the checkout ``tree``."""
    with tempfile.TemporaryDirectory(prefix="evjax-handler-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(cache, "numba"),
               "EVJAX_CACHE_DIR": os.path.join(cache, "evjax"), "JAX_PLATFORMS": "cpu"}
        env["PYTHONPATH"] = os.pathsep.join([tree] + [p for p in [env.get("PYTHONPATH")] if p])
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=cache)
    if res.returncode != 0:
        raise RuntimeError(f"child failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def stage_tables(tree: str = ROOT) -> list[str]:
    """Markdown: one fresh process's split of the cases' CPU time."""
    r = run_child("stages", tree)
    columns = ["Numba init", "front end", "LLVM: IR in, function passes", "LLVM: module passes",
               "LLVM: machine code", "disk cache", "other"]
    lines = []
    for case, table in r["stages"].items():
        t = r["times"][case]
        lines += ["", f"#### {case}: {t['cpu']:.3f} s CPU ({t['wall']:.3f} s wall)", ""]
        rows = []
        for who, parts in sorted(table.items(), key=lambda kv: -sum(kv[1].values())):
            rows.append([who] + [f"{parts[c]:.3f}" if c in parts else "" for c in columns]
                        + [f"{sum(parts.values()):.3f}"])
        totals = [sum(table[w].get(c, 0.0) for w in table) for c in columns]
        rows.append(["**total**"] + [f"{v:.3f}" for v in totals] + [f"{sum(totals):.3f}"])
        lines.append(markdown_table(["compiled function (CPU seconds)"] + columns + ["sum"], rows))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes per case set (default 5)")
    parser.add_argument("--stages", action="store_true", help="only print one process's per-stage CPU split")
    parser.add_argument("--baseline", default=None, metavar="CHECKOUT",
                        help="another evjax checkout (e.g. a git worktree of an older commit) measured in the "
                             "same run, its processes interleaved with this tree's")
    parser.add_argument("--baseline-label", default="baseline", help="its name in the tables")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/results/handler_compile.md)")
    args = parser.parse_args(argv)
    if args.stages:
        print("\n".join(stage_tables()))
        return
    lines = []

    def emit(text=""):
        print(text, flush=True)
        lines.append(text)

    import jax
    import numba

    from benchmarks.common import provenance

    trees = {"this tree": ROOT}
    if args.baseline:
        trees = {args.baseline_label: os.path.abspath(args.baseline), "this tree": ROOT}
    load = os.getloadavg()[0]
    samples: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():  # interleaved, so machine noise hits every tree alike
            samples[name].append({**run_child("handlers", tree), **run_child("bare", tree)})
    emit(provenance(argv))
    emit("# First call of a Numba CPU kernel through the XLA FFI")
    emit()
    emit(f"jax {jax.__version__}, numba {numba.__version__}, {os.cpu_count()} CPUs. Median of {args.rounds} fresh "
         f"processes{' per checkout, interleaved' if args.baseline else ''}, each with empty NUMBA_CACHE_DIR and "
         f"EVJAX_CACHE_DIR, after `import evjax` and a first `jax.jit`: the first "
         f"`jax.jit(evjax.numba_kernel(k, outs=...))(x)` of each case, in this order in one process. The process's "
         f"CPU seconds (all threads) and wall seconds. Load average at start: {load:.2f} (a shared machine "
         f"stretches wall times, and CPU times somewhat).")
    if args.baseline:
        emit()
        emit(f"{args.baseline_label}: the checkout {os.path.abspath(args.baseline)}; this tree: {ROOT}.")
    emit()
    header, rows, labels = ["first call"], [], []
    plot: dict[str, list[float]] = {f"{name}, CPU": [] for name in trees}
    for name in trees:
        header += [f"{name}: CPU", f"{name}: wall"] if args.baseline else ["CPU", "wall"]
    for key, what in CASES + BARE:
        row = [what]
        for name in trees:
            cpu = float(np.median([s[key]["cpu"] for s in samples[name]]))
            wall = float(np.median([s[key]["wall"] for s in samples[name]]))
            row += [f"{cpu:.3f} s", f"{wall:.3f} s"]
            plot[f"{name}, CPU"].append(cpu)
        rows.append(row)
        labels.append(key)
    emit(markdown_table(header, rows))
    emit()
    emit("## Where the CPU goes")
    emit()
    emit("One more fresh process, the same cases: each compiled function's own CPU seconds (less the "
         "functions it compiles in turn), split into Numba's front end (bytecode to LLVM IR), LLVM (IR parsing "
         "and function passes, module passes, machine code), Numba's disk cache, and Numba's one-time set-up "
         "of its target (its first compile in a process loads its registries, handler or not); Python's "
         "garbage collections have a row of their own. The timers add some overhead.")
    for name, tree in trees.items():
        if args.baseline:
            emit()
            emit(f"### {name}")
        for line in stage_tables(tree):
            emit(line)
    os.makedirs(RESULTS, exist_ok=True)
    out = args.out or os.path.join(RESULTS, "handler_compile.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    save_bar_plot(os.path.splitext(out)[0] + ".png", labels, plot, ylabel="CPU seconds",
                  title="first call of a numba kernel through the FFI, empty caches", log=False)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    else:
        main()
