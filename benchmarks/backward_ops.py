"""The ops of the example network's backward pass, one at a time, on every backend of the platform.

    python benchmarks/backward_ops.py              # the default device (a GPU where JAX has one)
    python benchmarks/backward_ops.py --out FILE   # markdown elsewhere
    python benchmarks/backward_ops.py --loop 50    # also each op 50 times inside one jitted loop

``benchmarks/sparse_backward.py`` times whole gradients; this script times the
ops inside them, so that a slow one can be found: per step of the example's
training loop (``examples/train_sparse_snn.py``: input and recurrent CSR
layers, a batch of 16 samples), the dense-support backward runs ``csrmm``
(the recurrent layer's transposed product), and ``csr_sddmm`` twice (the
weight gradients); the sparse backward runs ``csrmv_nonzero`` (the batch as the rows of its
vector operand, as its batching rule binds it) and ``csr_sddmm_nonzero`` twice
(the batch summed in the kernel, as the transpose rule binds it).  Each op is jitted alone on the example's
shapes, with cotangents whose share of zeros is ``--zeros`` (the sparse
backward's default band leaves about 85 %), and timed on each backend
registered for the platform (medians of synchronous calls, interleaved).
A synchronous call of a small op pays JAX's dispatch and, on a GPU, a
launch and a synchronisation, which can hide the op itself; ``--loop N``
also times each op ``N`` times inside one jitted ``lax.fori_loop`` (each
iteration's operand depends on the last result, so XLA cannot hoist the op
out of the loop), as it runs inside the example's ``lax.scan``, and reports
the time per iteration.
Writes ``benchmarks/results/backward_ops_<platform>.md`` and a PNG beside it.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import evjax  # noqa: E402
from benchmarks.common import fmt_time, markdown_table, median_times, provenance, save_bar_plot  # noqa: E402


def _csr(rng, n_pre: int, n_post: int, p: float):
    dense = ((rng.random((n_pre, n_post)) < p) * rng.standard_normal((n_pre, n_post))).astype(np.float32)
    return evjax.CSR.fromdense(dense)


def _sparse_rows(rng, shape, zeros: float):
    values = rng.standard_normal(shape).astype(np.float32)
    return jnp.asarray(np.where(rng.random(shape) < zeros, 0.0, values).astype(np.float32))


def _repeated(f, times: int, first, *rest):
    """``f(first, *rest)`` ``times`` times in a loop; each call's ``first`` depends on the last result."""
    def body(_, carry):
        shift, _ = carry
        out = f(first + shift, *rest)
        return out.ravel()[0] * 0.0, out  # zero at run time, but not to XLA: no hoisting
    return jax.lax.fori_loop(0, times, body, (jnp.zeros((), first.dtype), jnp.zeros_like(f(first, *rest))))[1]


def cases(n_in: int, n_hidden: int, batch: int, p_in: float, p_rec: float, zeros: float, loop: int = 0):
    """``{name: (op(backend) -> a function of no arguments that waits for its result)}``.

    With ``loop > 0`` each function runs its op ``loop`` times inside one jitted ``lax.fori_loop``.
    """
    rng = np.random.default_rng(0)
    w_in, w_rec = _csr(rng, n_in, n_hidden, p_in), _csr(rng, n_hidden, n_hidden, p_rec)
    g = _sparse_rows(rng, (batch, n_hidden), zeros)  # the cotangent of the summed synaptic input
    s_in = jnp.asarray(rng.random((batch, n_in)) < 0.05).astype(jnp.float32)
    s_rec = jnp.asarray(rng.random((batch, n_hidden)) < 0.05).astype(jnp.float32)
    view = w_rec.build_weight_indices()._other_view()  # (t_indices, t_indptr, perm): the column view

    def waited(f, *args):
        jitted = jax.jit(lambda *a: _repeated(f, loop, *a)) if loop else jax.jit(f)
        return lambda: jax.block_until_ready(jitted(*args))

    def csrmm(be):  # the recurrent layer's transposed product, the batch at once: W_rec @ g.T
        return waited(lambda d, b: evjax.csrmm(d, w_rec.indices, w_rec.indptr, b, shape=w_rec.shape,
                                               transpose=False, backend=be), w_rec.data, g.T)

    def sddmm(w, s):
        def make(be):
            return waited(lambda r, q: evjax.csr_sddmm(w.indices, w.indptr, r, q, shape=w.shape, backend=be),
                          s.T, g.T)
        return make

    out = {"csrmm (W_rec @ g, batch)": csrmm, "csr_sddmm (input weights, batch)": sddmm(w_in, s_in),
           "csr_sddmm (recurrent weights, batch)": sddmm(w_rec, s_rec)}

    def nonzero_mv(be):  # as the batching rule calls it: the batch as the rows of v, one call
        return waited(lambda v: evjax.csrmv_nonzero(w_rec.data, w_rec.indices, w_rec.indptr, view, v,
                                                    shape=w_rec.shape, transpose=False, backend=be), g)

    def nonzero_sddmm(w, s):  # as the transpose rule calls it: one group, the batch summed in the kernel
        w_view = w.build_weight_indices()._other_view()

        def make(be):
            return waited(lambda r, q: evjax.csr_sddmm_nonzero(w.indices, w.indptr, w_view, r, q,
                                                               shape=w.shape, backend=be), s, g)
        return make

    out["csrmv_nonzero (W_rec @ g, batch)"] = nonzero_mv
    out["csr_sddmm_nonzero (input weights, batch)"] = nonzero_sddmm(w_in, s_in)
    out["csr_sddmm_nonzero (recurrent weights, batch)"] = nonzero_sddmm(w_rec, s_rec)
    return out


def _rows(args, platform: str, loop: int, plot: dict) -> list:
    """The table's rows; ``plot[(loop, backend)][op]`` collects the medians in microseconds."""
    rows = []
    ops = cases(args.inputs, args.hidden, args.batch, args.p_in, args.p_rec, args.zeros, loop)
    for name, make in ops.items():
        candidates = {}
        for be in ("default", *evjax.csrmm_p.available_backends(platform)):
            try:
                call = make(None if be == "default" else be)
                call()
            except Exception as exc:  # noqa: BLE001 - a backend without this op: reported, not timed
                rows.append([name, be, f"n/a ({type(exc).__name__})", "-"])
                continue
            candidates[be] = call
        times = median_times(candidates, rounds=args.rounds, calls=20)
        base = times.get("default")
        for be, t in times.items():
            rows.append([name, be, fmt_time(t / max(loop, 1)), f"{t / base:.2f}x" if base else "-"])
            plot.setdefault((loop, be), {})[name] = 1e6 * t / max(loop, 1)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=700)
    parser.add_argument("--hidden", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--p-in", type=float, default=0.02)
    parser.add_argument("--p-rec", type=float, default=0.01)
    parser.add_argument("--zeros", type=float, default=0.85)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--loop", type=int, default=0, help="also time each op N times in one jitted loop")
    args = parser.parse_args(argv)
    platform = jax.devices()[0].platform
    device = jax.devices()[0].device_kind
    lines = [provenance(argv), f"# The backward pass's ops, one at a time ({platform})", "",
             f"Device: {device}; jax {jax.__version__}. The example's shapes: {args.inputs} inputs, {args.hidden} "
             f"hidden, batch {args.batch}, p = {args.p_in} / {args.p_rec}; cotangents {args.zeros:.0%} zero. "
             f"Medians of {args.rounds} x 20 synchronous jitted calls, candidates interleaved; ratio to the "
             f"default backend.", ""]
    plot: dict = {}
    for loop in (0, args.loop) if args.loop else (0,):
        rows = _rows(args, platform, loop, plot)
        lines += [f"## {'One synchronous call per op' if not loop else f'{loop} calls in one jitted loop, per call'}",
                  "", markdown_table(["op", "backend", "median", "ratio"], rows), ""]
    text = "\n".join(lines) + "\n"
    print(text)
    path = args.out or os.path.join(ROOT, "benchmarks", "results", f"backward_ops_{platform}.md")
    with open(path, "w") as f:
        f.write(text)
    labels = list(next(iter(plot.values())))
    series = {f"{be}{f', in a loop' if loop else ''}": [by_op.get(op, float("nan")) for op in labels]
              for (loop, be), by_op in plot.items() if be != "default"}
    save_bar_plot(os.path.splitext(path)[0] + ".png", [op.split(" (")[0] + "\n(" + op.split(" (")[1] for op in labels],
                  series, ylabel="us per call", title=f"The backward pass's ops ({device})")


if __name__ == "__main__":
    main()
