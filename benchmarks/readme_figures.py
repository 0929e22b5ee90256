"""Generate the README's figures block from the benchmark results files.

The README quotes measured figures only inside the block between
``<!-- figures:begin -->`` and ``<!-- figures:end -->``, which this script
writes. Each line cites the results file its numbers come from, with the date
and machine of that run, and every number it quotes is copied as printed in
that file, so a figure cannot drift from its source silently:
``tests/test_readme_figures.py`` checks both.

Run: python benchmarks/readme_figures.py [--write]   (without --write: print the block)
"""
from __future__ import annotations

import argparse
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


def run_line(path: pathlib.Path) -> str:
    """The provenance of a results file: its first line ``<!-- run DATE on MACHINE: command -->``."""
    first = path.read_text().splitlines()[0]
    match = re.match(r"<!-- run (\S+) on (.*?): (.*) -->", first)
    if not match:
        raise ValueError(f"{path} does not start with '<!-- run DATE on MACHINE: command -->'")
    return f"{match.group(1)}, {match.group(2)}"


def table(path: pathlib.Path, heading: str) -> list[dict[str, str]]:
    """The first markdown table after the first line that starts with ``heading``, as one dict per row
    (cells as printed)."""
    lines = path.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(heading)), None)
    if start is None:
        raise ValueError(f"{path} has no line starting with {heading!r}")
    first = next(i for i, ln in enumerate(lines[start + 1:]) if ln.startswith("|"))
    block = []
    for ln in lines[start + 1 + first:]:
        if not ln.startswith("|"):
            break
        block.append([c.strip() for c in ln.strip("|").split("|")])
    header, body = block[0], block[2:]
    return [dict(zip(header, cells)) for cells in body]


def span(rows: list[dict[str, str]], column: str) -> str:
    """``lo-hi`` of a numeric column, each end as printed in the file."""
    cells = [r[column] for r in rows if r[column] not in ("-", "")]
    values = sorted(cells, key=lambda c: float(c.replace(",", "").rstrip("x")))
    return values[0] if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def bullet_values(path: pathlib.Path, heading: str, label: str) -> list[str]:
    """The values of the lines ``- label: value`` after ``heading``, in order."""
    lines = path.read_text().splitlines()
    values = [ln.split(": ", 1)[1] for ln in lines[lines.index(heading):] if ln.startswith(f"- {label}: ")]
    if not values:
        raise ValueError(f"no '- {label}:' after {heading!r} in {path}")
    return values


def csr_event_figures() -> list[str]:
    path = RESULTS / "csr_event_quick.md"
    rel = path.relative_to(ROOT)
    fwd = table(path, "## Forward: spikes @ W (microseconds)")
    single = [r for r in fwd if r["batch"] == "1"]
    batch = [r for r in fwd if r["batch"] == "32"]
    grad = table(path, "## jit(grad) of sum((spikes @ W)**2) w.r.t. the weights (microseconds)")
    goals = next(ln for ln in path.read_text().splitlines() if re.match(r"\d+ of \d+ goals met", ln))
    first = "## First jit(grad) call, n=4000, p=0.02, fresh process, Numba cache warm"
    (warm, cold), brainevent = bullet_values(path, first, "evjax")[:2], bullet_values(path, first, "brainevent")
    return [
        f"- CSR events, `spikes @ W` (`{rel}`, {run_line(path)}): evjax takes "
        f"**{span(single, 'ratio vs brainevent')}x** brainevent's time for one spike vector and "
        f"**{span(batch, 'ratio vs brainevent')}x** for a batch of 32; "
        f"{span(fwd, 'ratio vs hand-written prange')}x a hand-written Numba `prange` loop called from NumPy; "
        f"the event-driven weight gradient takes {span(grad, 'ratio vs brainevent')}x brainevent's time. "
        f"{goals} First `jit(grad)` call: {warm} with warm disk caches (brainevent {brainevent[0]}), "
        f"{cold} with empty ones (brainevent {brainevent[1]})."
    ]


def import_time_figures() -> list[str]:
    path = RESULTS / "import_time.md"
    text = path.read_text()
    ratio = re.search(r"`import evjax` / `import jax, numba`: \*\*(\S+x)\*\*", text).group(1)
    when = re.match(r"# Import time \((.*)\)", text.splitlines()[0]).group(1)
    return [f"- `import evjax` takes {ratio} the time of `import jax, numba` (`{path.relative_to(ROOT)}`, {when})."]


def ci_figures() -> list[str]:
    path = RESULTS / "ci.md"
    if not path.exists():
        return []
    tests = bullet_values(path, "# CI run", "tests")[0]
    wall = bullet_values(path, "# CI run", "wall time with the install")[0]
    return [f"- The test command in a fresh virtualenv (`.ci/run`; `{path.relative_to(ROOT)}`, {run_line(path)}): "
            f"{tests}; {wall} with the install."]


def example_figures() -> list[str]:
    path = RESULTS / "train_sparse_snn.md"
    if not path.exists():
        return []
    value = {label: bullet_values(path, "# Main example", label)[0]
             for label in ("model", "test accuracy", "time per training step", "wall time of training")}
    line = (f"- The main example (`{path.relative_to(ROOT)}`, {run_line(path)}): {value['model']}; test accuracy "
            f"{value['test accuracy']}; {value['time per training step']} per training step; "
            f"{value['wall time of training']} of training")
    speedup = [ln for ln in path.read_text().splitlines() if ln.startswith("- sparse vs dense training step: ")]
    if speedup:
        line += f"; the same step with dense weights: {speedup[0].split(': ', 1)[1]}"
    whole = [ln for ln in path.read_text().splitlines() if ln.startswith("- whole command")]
    if whole:
        line += f"; the {whole[0][2:]}"
    return [line + "."]


def cold_start_figures() -> list[str]:
    path = RESULTS / "cold_start.md"
    if not path.exists():
        return []
    goals = table(path, "## Goals (issue 29)")
    parts = [f"{g['first call']} ({g['family']}) {g['measured']} (goal {g['goal']})" for g in goals]
    return [f"- First calls with empty caches, fresh process (`{path.relative_to(ROOT)}`, {run_line(path)}): "
            + "; ".join(parts) + "."]


def cold_start_peer_figures() -> list[str]:
    path = RESULTS / "cold_start_peer.md"
    if not path.exists():
        return []
    rows = table(path, "## Against brainevent 0.3.0")
    parts = []
    for call in ("first forward", "first jit(grad), after the forward", "first jit(grad), nothing before",
                 "steady forward (median call)"):
        picked = [r for r in rows if r["call"] == call]
        parts.append(f"{call} {span(picked, 'ratio')}")
    families = ", ".join(dict.fromkeys(r["family"] for r in rows))
    return [f"- First calls against brainevent 0.3.0, the same code, fresh processes with empty caches "
            f"(`{path.relative_to(ROOT)}`, {run_line(path)}; {families}): evjax's wall time / brainevent's: "
            + "; ".join(parts) + "."]


def brainevent_tests_figures() -> list[str]:
    path = RESULTS / "brainevent_tests.md"
    if not path.exists():
        return []
    summary = next(ln for ln in path.read_text().splitlines() if ln.startswith("- pytest: "))[len("- pytest: "):]
    rows = table(path, "## Failures by what they hit")
    parts = [f"{r['failed tests']} failed tests and {r['test modules that did not import']} test modules hit "
             f"{r['what the failure hit']}" for r in rows]
    return [f"- brainevent 0.3.0's own test files against evjax through a naming-only import shim "
            f"(`{path.relative_to(ROOT)}`, {run_line(path)}): {summary}; " + "; ".join(parts) + "."]


def first_calls_figures() -> list[str]:
    path = RESULTS / "first_calls.md"
    if not path.exists():
        return []
    rows = {r["library"]: r for r in table(path, "# The first 200 calls")}
    verdict = [ln for ln in path.read_text().splitlines() if ln.startswith("evjax / brainevent")]
    line = (f"- The first 200 calls of a jitted training step, CSR n = 20000, empty caches (`{path.relative_to(ROOT)}`, "
            f"{run_line(path)}): evjax {rows['evjax']['200 calls, wall']} (first call {rows['evjax']['first call']})")
    if "brainevent" in rows:
        line += (f", brainevent {rows['brainevent']['version']} {rows['brainevent']['200 calls, wall']} (first call "
                 f"{rows['brainevent']['first call']})")
    if verdict:
        line += f"; {verdict[0].rstrip('.')}"
    return [line + "."]


def contention_figures() -> list[str]:
    path = RESULTS / "contention.md"
    if not path.exists():
        return []
    rows = table(path, "# evjax on a busy machine")
    key = next(k for k in rows[0] if k.startswith("loaded: default / 1 thread"))
    goals = next(ln for ln in path.read_text().splitlines() if re.match(r"\d+ of \d+ goals met", ln)).split(".")[0]
    return [f"- On a busy machine (`{path.relative_to(ROOT)}`, {run_line(path)}): with the default threads every "
            f"family's forward and weight gradient took {span(rows, key)} its one-thread time under the same "
            f"load; {goals}."]


def dense_figures() -> list[str]:
    path = RESULTS / "dense_event.md"
    if not path.exists():
        return []
    rows = table(path, "## Forward: spikes @ W (scatter orientation)")
    one = [r for r in rows if r["n"] == "4000" and r["batch"] == "1"]
    goals = next(ln for ln in path.read_text().splitlines() if re.match(r"\d+ of \d+ goals met", ln)).split(".")[0]
    return [f"- Dense events, `spikes @ W`, n = 4000, one vector (`{path.relative_to(ROOT)}`, {run_line(path)}): "
            f"{span(one, 'ratio vs XLA dot')}x XLA's dense dot, {span(one, 'ratio vs brainevent')}x brainevent, "
            f"{span(one, 'ratio vs hand-written')}x a hand-written Numba loop; {goals}."]


def fixed_figures() -> list[str]:
    path = RESULTS / "fixed_fan.md"
    if not path.exists():
        return []
    rows = table(path, "## Forward")
    return [f"- Fixed fan-out, `spikes @ FixedPostNumConn` (`{path.relative_to(ROOT)}`, {run_line(path)}): "
            f"{span(rows, '/brainevent')} brainevent's time, {span(rows, '/CSR')} evjax CSR of the same matrix."]


def jitc_figures() -> list[str]:
    path = RESULTS / "jitc_scale.md"  # the full run, else the quick one
    if not path.exists():
        path = RESULTS / "jitc_scale_quick.md"
    if not path.exists():
        return []
    rows = table(path, "## One step at scale")
    parts = [f"`{r['op']}` {r['compiled call']} per step, peak RSS {r['peak RSS']}" for r in rows]
    return [f"- Just-in-time connectivity, 10^6 neurons x 1000 synapses, 1% spiking (`{path.relative_to(ROOT)}`, "
            f"{run_line(path)}): " + "; ".join(parts) + "."]


def versus_brainevent_figures() -> list[str]:
    path = RESULTS / "versus_brainevent.md"
    if not path.exists():
        return []
    rows = table(path, "# evjax and brainevent side by side")
    def ratios(prefix, state):
        return span([r for r in rows if r["case"].startswith(prefix) and r["machine"] == state], "evjax / brainevent")
    return [f"- Side by side with brainevent in alternating processes (`{path.relative_to(ROOT)}`, {run_line(path)}): "
            f"CSR `spikes @ W` {ratios('csr forward', 'quiet')} brainevent's time quiet, "
            f"{ratios('csr forward', 'loaded')} under load; the dense weight gradient "
            f"{ratios('dense weight gradient', 'quiet')} quiet, {ratios('dense weight gradient', 'loaded')} under load."]


def tcsr_figures() -> list[str]:
    path = RESULTS / "tcsr.md"
    if not path.exists():
        return []
    rows = table(path, "# TCSR: evjax and brainevent 0.3.0")

    def ratios(state):
        return span([r for r in rows if r["machine"] == state], "evjax / brainevent")
    return [f"- `TCSR`, the same user code in both libraries, n = 4000, 5 % spiking (`{path.relative_to(ROOT)}`, "
            f"{run_line(path)}): evjax / brainevent {ratios('quiet')} quiet, {ratios('loaded')} under load "
            f"(`s @ W`, `s @ W.T`, `W @ x`, the bptt and pp_prop weight gradients)."]


def gpu_figures() -> list[str]:
    return _gpu_figure("gpu_event.md") + _gpu_figure("gpu_event_h200.md")


def _gpu_figure(name: str) -> list[str]:
    path = RESULTS / name
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    device = next(ln for ln in lines if ln.startswith("Device: ")).split(";")[0][len("Device: "):]
    ratios = {"jax BCSR (cuSPARSE)": [], "dense XLA": [], "hand-written Numba CUDA": []}
    for i, ln in enumerate(lines):
        if ln.startswith("## n=20000"):
            forward = lines.index("### forward", i)
            for row in _table_at(lines, forward):
                if row["method"] in ratios:
                    ratios[row["method"]].append(row["ratio"])
    def rng(values):
        values = sorted(values, key=lambda c: float(c.rstrip("x")))
        return values[0] if values[0] == values[-1] else f"{values[0]}-{values[-1]}"
    return [f"- On a GPU, `spikes @ W`, n = 20000, p = 1 %, 1 and 10 % spiking (`{path.relative_to(ROOT)}`, "
            f"{run_line(path)}, {device}): jax BCSR (cuSPARSE) takes {rng(ratios['jax BCSR (cuSPARSE)'])} evjax's "
            f"Numba CUDA time, dense XLA {rng(ratios['dense XLA'])}, a hand-written Numba CUDA kernel "
            f"{rng(ratios['hand-written Numba CUDA'])}."]


def _table_at(lines: list[str], start: int) -> list[dict[str, str]]:
    """The first markdown table after line ``start`` of ``lines``."""
    first = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("|"))
    block = []
    for ln in lines[first:]:
        if not ln.startswith("|"):
            break
        block.append([c.strip() for c in ln.strip("|").split("|")])
    return [dict(zip(block[0], cells)) for cells in block[2:]]


def plasticity_figures() -> list[str]:
    path = RESULTS / "plasticity.md"
    if not path.exists():
        return []
    rows = table(path, "## Goals (issue 32")
    out = []
    for kind, label in (("", "one jitted call"), ("(per step of a scan)", "per step of a lax.scan")):
        updates = [r for r in rows if r["op"].startswith("update_csr") and r["op"].endswith(kind)
                   and ("scan" in r["op"]) == bool(kind)]
        loop = [r for r in updates if "hand-written" in r["goal"]]
        peer = [r for r in updates if "brainevent" in r["goal"] and r["measured"].endswith("x")]
        text = (f"- Plasticity, `update_csr_on_binary_pre/post`, {label}, n = 20000, p = 0.005, 1 and 5 % spiking "
                f"(`{path.relative_to(ROOT)}`, {run_line(path)}): {span(loop, 'measured')} a hand-written Numba "
                f"loop")
        if peer:
            text += f", {span(peer, 'measured')} brainevent's time"
        out.append(text + ".")
    delay = [r for r in rows if r["op"].startswith("csr_delay_deliver") and "brainevent" in r["goal"]
             and r["measured"].endswith("x")]
    if delay:
        out.append(f"- Delays, `csr_delay_deliver`, n = 20000, p = 0.005, 1 % active, L = 32 "
                   f"(`{path.relative_to(ROOT)}`): {span(delay, 'measured')} brainevent's time.")
    step = RESULTS / "stdp_step.md"
    if step.exists():
        lines = step.read_text().splitlines()
        goal = next(ln for ln in lines if ln.startswith("Goal:"))
        ratio = re.search(r": ([0-9.]+x) \(", goal).group(1)
        out.append(f"- An STDP training step of `examples/stdp.py` (`{step.relative_to(ROOT)}`, {run_line(step)}): "
                   f"{ratio} faster than the same network with dense weights.")
    return out


def compact_figures() -> list[str]:
    path = RESULTS / "compact_events.md"
    if not path.exists():
        return []
    ratios, peers = [], []
    for k in (10, 100):
        for how in ("new spikes at each call", "the same spikes at every call"):
            rows = {r["method"]: r["ratio"] for r in table_with(path, f"## {k} synapses per row", how)}
            ratios.append((k, how, rows["evjax CompactBinary @ CSR (list made)"]))
            if "brainevent 0.3.0 BinaryArray @ CSR" in rows:
                peers.append(rows["brainevent 0.3.0 BinaryArray @ CSR"])
    met = all(float(r.rstrip("x")) <= 0.5 for _, _, r in ratios)
    line = (f"- Compact events, `CompactBinary @ CSR`, n = 10^5, 1 % active (`{path.relative_to(ROOT)}`, "
            f"{run_line(path)}): " + "; ".join(f"{r} ({k} synapses per row, {how})" for k, how, r in ratios)
            + f" the time of `BinaryArray @ CSR` (goal <= 0.5x: {'met' if met else 'not met'})")
    if peers:
        line += (f"; brainevent 0.3.0's `BinaryArray @ CSR` takes {span([{'r': p} for p in peers], 'r')} "
                 f"evjax's `BinaryArray @ CSR` time")
    return [line + "."]


def table_with(path: pathlib.Path, heading: str, words: str) -> list[dict[str, str]]:
    """:func:`table` after the first line that starts with ``heading`` and contains ``words``."""
    lines = path.read_text().splitlines()
    line = next((ln for ln in lines if ln.startswith(heading) and words in ln), None)
    if line is None:
        raise ValueError(f"{path} has no line starting with {heading!r} that says {words!r}")
    return table(path, line)


def lookahead_figures() -> list[str]:
    path = RESULTS / "ab_spikes.md"
    if not path.exists():
        return []
    heading = next(ln for ln in path.read_text().splitlines() if ln.startswith("# A/B"))
    rows = table(path, heading)
    geo = bullet_values(path, heading, "geometric mean of the ratios")[0]
    return [f"- The CSR event scatter with new spikes at each call (`spikes @ W`, `CompactBinary @ W` and batches of "
            f"32; n = 20000-10^5, 10-200 synapses per row, 1-5 % active; `{path.relative_to(ROOT)}`, "
            f"{run_line(path)}): with the look-ahead, {span(rows, 'ratio')} the time of the scatter before it "
            f"(geometric mean {geo})."]


def sparse_backward_figures() -> list[str]:
    path = RESULTS / "sparse_backward.md"
    if not path.exists():
        return []
    rows = {r["variant"]: r for r in table(path, "## Backward pass")}
    sb = rows["sparse backward"]
    speedup = sb["backward speed-up vs dense-support"]
    met = float(speedup.rstrip("x")) >= 3.0
    memory = {r["variant"]: r["vs dense-support full"] for r in table(path, "## Peak memory")}
    mode, carry = min(((m, memory[f"sparse backward, memory='{m}'"]) for m in ("carry", "segments")
                       if f"sparse backward, memory='{m}'" in memory), key=lambda item: float(item[1].rstrip("x")))
    line = (f"- Sparse backward, the example's network (hidden 2000, batch 16, 50 steps; `{path.relative_to(ROOT)}`, "
            f"{run_line(path)}): backward pass {speedup} as fast as with the dense-support surrogate "
            f"(goal >= 3x: {'met' if met else 'not met'}), {sb['zero cotangent entries']} of the cotangent "
            f"entries zero; peak gradient memory at 100 steps with `memory='{mode}'`: {carry} "
            f"(goal <= 0.5x: {'met' if float(carry.rstrip('x')) <= 0.5 else 'not met'}).")
    sweep = table(path, "## Band width")
    if sweep:
        best = max(sweep, key=lambda r: float(r["speed-up"].rstrip("x")))
        line = line[:-1] + (f"; the best band of the sweep, {best['band half-width']}: {best['speed-up']} "
                            f"({best['zero cotangent entries']} zero).")
    out = [line]
    gpu, before = RESULTS / "sparse_backward_h200.md", RESULTS / "sparse_backward_h200_no_graphs.md"
    if gpu.exists() and before.exists():  # the A/B of the Numba CUDA launches in CUDA graphs
        now = {r["variant"]: r for r in table(gpu, "## Backward pass")}
        old = {r["variant"]: r for r in table(before, "## Backward pass")}
        d_now, d_old = now["dense-support"], old["dense-support"]
        out.append(f"- On a GPU (NVIDIA H200), the same network's gradient (`{gpu.relative_to(ROOT)}`, {run_line(gpu)}): "
                   f"`value_and_grad` {d_now['gradient (wall)']}, backward "
                   f"{d_now['backward = gradient - forward (wall)']}, with the Numba CUDA launches in CUDA graphs; "
                   f"the sparse backward there: {now['sparse backward']['backward speed-up vs dense-support']} "
                   f"(goal >= 3x: not met).")
        out.append(f"- The same run without CUDA graphs for the Numba CUDA launches (`{before.relative_to(ROOT)}`, "
                   f"{run_line(before)}): `value_and_grad` {d_old['gradient (wall)']}, backward "
                   f"{d_old['backward = gradient - forward (wall)']}.")
    accuracy = RESULTS / "sparse_backward_accuracy.md"
    if accuracy.exists():
        out.append(f"- Sparse-backward accuracy, mean of 3 seeds: see `{accuracy.relative_to(ROOT)}` "
                   f"({run_line(accuracy)}).")
    return out


def scaling_figures() -> list[str]:
    path = RESULTS / "scaling.md"
    if not path.exists():
        return []
    parts, best = [], 0.0
    for line in path.read_text().splitlines():
        if line.startswith("## Global batch "):
            rows = {r["run"]: r for r in table(path, line)}
            column = next(c for c in next(iter(rows.values())) if c.startswith("throughput vs 1 process"))
            ceiling = next(r for name, r in rows.items() if name.startswith("2 unrelated"))
            best = max(best, float(rows["2 processes"][column].rstrip("x")))
            parts.append(f"batch {line.split()[-1]}: {rows['2 processes'][column]} "
                         f"(the machine's ceiling, two unrelated jobs: {ceiling[column]})")
    out = []
    model = RESULTS / "scaling_model.md"
    if model.exists():
        rows = {r["run"]: r for r in table(model, "# Model-parallel scaling")}
        big = next(r for name, r in rows.items() if name.startswith("10^7"))
        event = next(r for name, r in rows.items() if "event-driven" in name)
        line = next(ln for ln in model.read_text().splitlines() if ln.startswith("- 10^6 neurons over 2"))
        out.append(f"- Model parallel (`examples/large_network.py --processes N`, JITC generated output by output; "
                   f"`{model.relative_to(ROOT)}`, {run_line(model)}): {line[2:]} 10^7 neurons x 1000 synapses over "
                   f"4 processes: {big['time per step']} per step, peak RSS {big['peak RSS per process (MB)']} MB. "
                   f"(The event-driven one-process run of 10^6 neurons: {event['time per step']} per step.)")
    return out + [f"- Data parallel over 2 processes against 1 (`examples/distributed_snn.py`, 1 Numba thread each; "
            f"`{path.relative_to(ROOT)}`, {run_line(path)}): throughput {'; '.join(parts)}; goal >= 1.6x: "
            f"{'met' if best >= 1.6 else 'not met'}."]


SECTIONS = (ci_figures, example_figures, cold_start_figures, cold_start_peer_figures, first_calls_figures,
            contention_figures, brainevent_tests_figures,
            versus_brainevent_figures, tcsr_figures, csr_event_figures, dense_figures,
            fixed_figures, jitc_figures, plasticity_figures, compact_figures, lookahead_figures, sparse_backward_figures, scaling_figures, gpu_figures,
            import_time_figures)


def block() -> str:
    """The README's figures block, without the markers."""
    lines = ["Each figure is copied from the results file it cites (regenerate this block with",
             "`python benchmarks/readme_figures.py --write` after a benchmark run).", ""]
    for section in SECTIONS:
        lines += section()
    return "\n".join(lines)


def write_readme() -> None:
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{block()}\n{END}{tail}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the block in README.md")
    if parser.parse_args().write:
        write_readme()
    else:
        print(block())
