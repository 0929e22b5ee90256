"""How deep and how scattered is a call: evjax frames before ``bind``, and file moves.

Issue "Structure v3" goals: at most 5 evjax frames on the way from
``BinaryArray @ CSR`` to the primitive's ``bind``, and at most 25 moves
between evjax files during a warm forward (``jit(grad)`` and ``jit(vmap)``
are reported too).  A *move* is a call or return that crosses from one evjax
source file to another; frames of JAX itself are not counted, and a move
through JAX (evjax -> jax -> evjax) counts as one evjax-to-evjax move when the
two evjax files differ.

Usage::

    python benchmarks/call_depth.py [--save]

Prints a markdown table; ``--save`` writes ``benchmarks/results/call_depth.md``.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import evjax  # noqa: E402
from benchmarks.common import settle_kernels  # noqa: E402
from jax._src import core as jax_core  # noqa: E402

EVJAX_DIR = os.path.dirname(os.path.abspath(evjax.__file__))
GOAL_FRAMES, GOAL_MOVES = 5, 25


def _is_evjax(filename: str) -> bool:
    return filename.startswith(EVJAX_DIR)


def frames_before_bind(fn, *args) -> int:
    """The evjax frames on the stack when the first evjax primitive is bound."""
    depth = []
    original = jax_core.Primitive.bind

    def spy(self, *a, **k):
        if not depth and self.name.startswith("evjax_"):
            frame, count = sys._getframe(1), 0
            while frame is not None:
                count += _is_evjax(frame.f_code.co_filename)
                frame = frame.f_back
            depth.append(count)
        return original(self, *a, **k)

    jax_core.Primitive.bind = spy
    try:
        jax.make_jaxpr(fn)(*args)
    finally:
        jax_core.Primitive.bind = original
    return depth[0]


def file_moves(thunk) -> tuple[int, int]:
    """``(moves, files)``: moves between evjax files while ``thunk()`` runs, warm: after a first run,
    the serial tiers handed over to their full kernels (:func:`settle_kernels`) and two more runs (a
    chain of tiers hands over one stage per call), so that no compile or hand-over is counted."""
    jax.block_until_ready(thunk())
    settle_kernels()
    for _ in range(2):
        jax.block_until_ready(thunk())
    seen: list[str] = []

    def profile(frame, event, arg):
        if event in ("call", "return"):
            name = frame.f_code.co_filename if event == "call" else (
                frame.f_back.f_code.co_filename if frame.f_back is not None else "")
            if _is_evjax(name) and (not seen or seen[-1] != name):
                seen.append(name)

    sys.setprofile(profile)
    try:
        jax.block_until_ready(thunk())
    finally:
        sys.setprofile(None)
    return max(len(seen) - 1, 0), len(set(seen))


def cases():
    rng = np.random.default_rng(0)
    dense = (rng.random((200, 300)) < 0.1) * rng.standard_normal((200, 300)).astype(np.float32)
    W = evjax.CSR.fromdense(dense)
    spikes = jnp.asarray(rng.random(200) < 0.2)
    batch = jnp.asarray(rng.random((8, 200)) < 0.2)

    def forward(data):
        return evjax.BinaryArray(spikes) @ W.with_data(data)

    def loss(data):
        return jnp.sum(forward(data) ** 2)

    def batched(data):
        return jax.vmap(lambda s: evjax.BinaryArray(s) @ W.with_data(data))(batch)

    return W.data, {"forward": forward, "jit(grad)": jax.grad(loss), "jit(vmap)": batched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/call_depth.md")
    args = parser.parse_args()
    data, fns = cases()
    rows = []
    for name, fn in fns.items():
        frames = frames_before_bind(fn, data)
        if name == "forward":  # an eager call runs evjax's Python each time
            moves, files = file_moves(lambda: fn(data))
        else:  # a jitted call runs none once compiled: count its trace and lowering
            moves, files = file_moves(lambda: jax.jit(lambda d: fn(d)).lower(data))
        rows.append((name, frames, moves, files))
    stamp = f"<!-- run {datetime.date.today()} on {os.cpu_count()} CPU cores, {platform.machine()}: " \
            f"python benchmarks/call_depth.py --save -->"
    lines = [stamp, "# Call depth and file moves", "",
             f"Goals (issue Structure v3): at most {GOAL_FRAMES} evjax frames before `bind`, at most "
             f"{GOAL_MOVES} file moves for the warm forward. Moves are counted during an eager forward "
             f"(kernels compiled) and during the trace and lowering of `jit(grad)` and `jit(vmap)` (a "
             f"compiled jitted call runs no evjax code).", "",
             "| call | evjax frames before bind | file moves | evjax files touched | goal met |",
             "|---|---:|---:|---:|---|"]
    for name, frames, moves, files in rows:
        met = frames <= GOAL_FRAMES and (moves <= GOAL_MOVES or name != "forward")
        lines.append(f"| {name} | {frames} | {moves} | {files} | {'yes' if met else 'no'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.save:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "call_depth.md")
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
