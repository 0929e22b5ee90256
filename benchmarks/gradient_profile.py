"""Where the example's gradient spends its time on a device: kernel by kernel, from JAX's profiler.

    python benchmarks/gradient_profile.py                 # the default device (a GPU where JAX has one)
    python benchmarks/gradient_profile.py --calls 5 --top 12 --out FILE

``benchmarks/sparse_backward.py`` times whole gradients of the example's
network (``examples/train_sparse_snn.py``) and ``benchmarks/backward_ops.py``
the ops inside them one at a time.  This script traces ``--calls`` calls of
each configuration's jitted forward and ``value_and_grad`` with
``jax.profiler.trace`` and sums the device's events by name (on a CPU, the
XLA client threads' events), so that the time between "the ops are fast" and
"the gradient is slow" can be read off: per call, the wall time, the summed
kernel time, and the kernels that take most of it.  Writes markdown to
``--out`` (default ``benchmarks/results/gradient_profile_<platform>.md``) and
a PNG beside it: wall time against the time the device's streams were busy.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import common  # noqa: E402
import sparse_backward  # noqa: E402

snn = sparse_backward.snn


def _device_events(path: str) -> dict[str, tuple[collections.Counter, collections.Counter]]:
    """``{line: (total ns by event name, count by name)}`` over the device planes of one trace (a GPU's
    lines: its streams, "XLA Ops", "XLA Modules"); on a CPU, the XLA client threads of the host plane."""
    data = jax.profiler.ProfileData.from_file(path)
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    lines: dict = {}
    for plane in planes or [p for p in data.planes if p.name == "/host:CPU"]:
        for line in plane.lines:
            if not planes and "PjRt" not in line.name:
                continue
            totals, counts = lines.setdefault(line.name, (collections.Counter(), collections.Counter()))
            for event in line.events:
                totals[event.name] += event.duration_ns
                counts[event.name] += 1
    return lines


def profile(fn, args, calls: int) -> dict:
    """Trace ``calls`` synchronous calls of ``fn(*args)`` (after one warm-up)."""
    jax.block_until_ready(fn(*args))
    folder = tempfile.mkdtemp(prefix="evjax_profile_")
    with jax.profiler.trace(folder):
        start = time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(fn(*args))
        wall = (time.perf_counter() - start) / calls
    path = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)[0]
    return {"wall": wall, "lines": _device_events(path), "calls": calls}


def busy(result: dict) -> float | None:
    """Seconds per call of kernels and copies on the device's streams; None without a device plane."""
    streams = [totals for line, (totals, _) in result["lines"].items() if line.startswith("Stream")]
    return sum(sum(t.values()) for t in streams) / 1e9 / result["calls"] if streams else None


def _table(name: str, result: dict, top: int) -> list[str]:
    calls = result["calls"]
    on_device = busy(result)
    out = [f"### {name}", "", f"Wall per call {common.fmt_time(result['wall'])} (traced)"
           + (f"; the device's streams busy {common.fmt_time(on_device)}." if on_device is not None else "."), ""]
    for line, (totals, counts) in sorted(result["lines"].items()):
        whole = sum(totals.values())
        rows = [[event[:90], common.fmt_time(ns / 1e9 / calls), f"{counts[event] / calls:g}",
                 f"{100 * ns / max(whole, 1):.1f} %"] for event, ns in totals.most_common(top)]
        out += [f"Line `{line}`: {common.fmt_time(whole / 1e9 / calls)} of events per call "
                f"({sum(counts.values()) / calls:g} events).", "",
                common.markdown_table(["event", "time per call", "count per call", "share"], rows), ""]
    return out


def main(argv=None) -> None:
    defaults = snn.Config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=defaults.n_hidden)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--steps", type=int, default=defaults.n_steps)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import dataclasses
    cfg = dataclasses.replace(defaults, n_hidden=args.hidden, batch=args.batch, n_steps=args.steps)
    x, y = snn.make_randman(cfg, cfg.batch, seed=cfg.seed + 3)
    params, s_in, s_rec = snn.init_params(cfg)
    device = jax.devices()[0]
    lines = [common.provenance(argv), f"# The example's gradient, event by event ({device.platform})", "",
             f"Device: {device.device_kind}; jax {jax.__version__}; hidden {cfg.n_hidden}, batch {cfg.batch}, "
             f"{cfg.n_steps} steps. {args.calls} traced synchronous calls of each function after a warm-up; "
             "events summed by name over the device's planes.", ""]
    labels, series = [], {"wall": [], "device busy": []}
    for name, variant in sparse_backward.variants(cfg).items():
        forward, gradient = sparse_backward.build(variant, x, y, params, s_in, s_rec)
        lines.append(f"## {name}")
        lines.append("")
        for kind, fn in (("forward", forward), ("value_and_grad", gradient)):
            result = profile(fn, (params,), args.calls)
            lines += _table(f"{name}: {kind}", result, args.top)
            labels.append(f"{name}\n{kind}")
            series["wall"].append(result["wall"] * 1e3)
            series["device busy"].append((busy(result) or 0.0) * 1e3)
    text = "\n".join(lines) + "\n"
    print(text)
    path = args.out or os.path.join(ROOT, "benchmarks", "results", f"gradient_profile_{device.platform}.md")
    with open(path, "w") as f:
        f.write(text)
    common.save_bar_plot(os.path.splitext(path)[0] + ".png", labels, series, ylabel="ms per call",
                         title=f"The example's gradient on {device.device_kind}", log=False)


if __name__ == "__main__":
    main()
