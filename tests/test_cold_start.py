"""Cold start: an op's first call compiles its kernel on the spot, and nothing else ever runs.

Each scenario runs in a fresh process with its own empty ``NUMBA_CACHE_DIR`` and
``EVJAX_CACHE_DIR`` (or, to test sharing, the same ones), on a small op whose
Numba kernel compiles in well under a second, so the mechanism is tested, not
the CSR kernels' compile time (``benchmarks/cold_start.py`` measures that).
Which implementation a program runs is read from its lowered text: the
kernel's FFI target, or none.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numba
import numpy as np
import pytest

import evjax
from evjax import _kernel_compat
from evjax.backends import compile_log, numba_cpu
from tests.helpers import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The op: y = 2 * x + 1 (float32 vector), a Numba kernel and a pure-JAX reference, and a counter
# of the traces of the jitted function that calls it.
PRELUDE = '''
import json, logging, os, sys, threading
import jax, jax.numpy as jnp, numba, numpy as np
import evjax
from evjax.backends import compile_log

compile_log.SLOW_COMPILE_S = 0.0  # log every compile, to count them
records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger("evjax").addHandler(handler)

@numba.njit
def affine_kernel(x, out):
    for i in range(x.shape[0]):
        out[i] = 2 * x[i] + 1

op = evjax.XLACustomKernel("cold_affine")
op.def_reference(lambda x, outs: [2 * x + 1])
op.def_numba_kernel(lambda outs, ins: (lambda x: [evjax.numba_kernel(affine_kernel, outs[0])(x)]))

def affine(x, backend=None):
    return op(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], backend=backend)[0]

x = jnp.arange(5, dtype=jnp.float32)
expected = 2 * np.arange(5, dtype=np.float32) + 1
traces = []

def traced_affine(x):
    traces.append(1)  # runs once per trace, never per call
    return affine(x)

def runs_kernel(f, *args):
    return "evjax_numba_affine_kernel" in f.lower(*args).as_text()

def compiles():
    return [r for r in records if "compiling" in r]

result = {}
'''


def write_prelude(cache: str) -> None:
    """The op's module, written once per cache (its file is part of the kernel's cache key)."""
    path = os.path.join(cache, "coldop.py")
    os.makedirs(cache, exist_ok=True)
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(PRELUDE)


def run_script(body: str, cache: str, *, env: dict | None = None, wait: bool = True):
    """Run PRELUDE + body in a fresh process with the caches under ``cache``; its JSON result."""
    write_prelude(cache)
    script = os.path.join(cache, f"run_{abs(hash(body))}.py")
    with open(script, "w") as f:
        f.write("from coldop import *\n" + textwrap.dedent(body) + "\nprint(json.dumps(result))\n")
    full_env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(cache, "numba"),
                "EVJAX_CACHE_DIR": os.path.join(cache, "evjax"), "JAX_PLATFORMS": "cpu",
                "PYTHONPATH": ROOT, **(env or {})}
    process = subprocess.Popen([sys.executable, script], env=full_env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if not wait:
        return process
    return finish(process)


def finish(process) -> dict:
    out, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


FIRST_CALL = '''
f = jax.jit(traced_affine)
outputs = [np.asarray(f(x)) for _ in range(3)]
result["first"] = outputs[0].tolist()
result["same_bits"] = all(o.tobytes() == outputs[0].tobytes() for o in outputs)
result["traces"] = len(traces)
result["runs_kernel"] = runs_kernel(f, x)
result["compiles"] = compiles()
result["threads"] = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
'''


def test_first_call_runs_the_kernel_once_traced_and_the_next_process_finds_it_cached(tmp_path):
    cache = str(tmp_path)
    first = run_script(FIRST_CALL, cache)
    expected = [1.0, 3.0, 5.0, 7.0, 9.0]
    assert first["first"] == expected and first["same_bits"] and first["runs_kernel"]
    assert first["traces"] == 1  # nothing bumps jit's cache key: three calls, one trace
    assert first["threads"] == []  # no compile thread outlives the call
    (line,) = first["compiles"]  # compiled once, announced once, with where it is cached
    assert line.startswith("evjax: compiling cold_affine (numba kernel 'affine_kernel') for (float32[:]) -> ")
    assert f"cached in {os.path.join(cache, 'numba')}" in line

    second = run_script(FIRST_CALL, cache)  # same caches: the handler loads from disk
    assert second["first"] == expected and second["runs_kernel"] and second["compiles"] == []


def test_an_ahead_of_time_compile_runs_the_kernel(tmp_path):
    body = '''
    compiled = jax.jit(affine).lower(x).compile()
    result["text_has_kernel"] = "evjax_numba_affine_kernel" in compiled.as_text()
    result["out"] = np.asarray(compiled(x)).tolist()
    '''
    result = run_script(body, str(tmp_path))
    assert result["text_has_kernel"] and result["out"] == [1.0, 3.0, 5.0, 7.0, 9.0]


def test_concurrent_first_calls_from_threads_compile_once(tmp_path):
    body = '''
    f = jax.jit(affine)
    barrier = threading.Barrier(4)
    outputs, errors = [], []
    def call(k):
        try:
            barrier.wait()
            outputs.append(np.asarray(f(x + k)).tolist())
        except Exception as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    result["outputs"] = sorted(outputs)
    result["errors"] = errors
    result["runs_kernel"] = runs_kernel(f, x)
    result["compiles"] = len(compiles())
    '''
    result = run_script(body, str(tmp_path))
    assert result["errors"] == []
    assert result["outputs"] == [[2.0 * (i + k) + 1 for i in range(5)] for k in range(4)]
    assert result["compiles"] == 1 and result["runs_kernel"]  # one compile for the four calls


def test_processes_sharing_one_empty_cache_both_run_and_fill_it(tmp_path):
    """Two processes start together on the same empty caches: both compile and run the kernel,
    and a third process finds it cached."""
    body = '''
    result["first"] = np.asarray(jax.jit(affine)(x)).tolist()
    '''
    cache = str(tmp_path)
    write_prelude(cache)  # before both start: the same kernel source file for all three
    processes = [run_script(body, cache, wait=False) for _ in range(2)]
    for process in processes:
        assert finish(process)["first"] == [1.0, 3.0, 5.0, 7.0, 9.0]
    third = run_script(FIRST_CALL, cache)
    assert third["runs_kernel"] and third["compiles"] == []


def test_a_kernel_that_fails_to_compile_fails_the_first_call(tmp_path):
    """No silent reference: the user sees Numba's error at once."""
    body = '''
    @numba.njit
    def broken_kernel(x, out):
        out[0] = undefined_name
    op.def_numba_kernel(lambda outs, ins: (lambda x: [evjax.numba_kernel(broken_kernel, outs[0])(x)]))
    try:
        jax.jit(affine)(x)
        result["error"] = None
    except Exception as exc:
        result["error"] = type(exc).__name__ + ": " + str(exc)
    '''
    result = run_script(body, str(tmp_path))
    assert result["error"] and "TypingError" in result["error"] and "undefined_name" in result["error"]


EXIT_SCRIPT = '''
import time
import jax, jax.numpy as jnp, numpy as np
import evjax
n = 300
rng = np.random.default_rng(0)
W = evjax.CSR.fromdense(((rng.random((n, n)) < 0.05) * rng.standard_normal((n, n))).astype(np.float32))
spikes = jnp.asarray(rng.random(n) < 0.2)
loss = jax.jit(jax.grad(lambda d: jnp.sum((spikes @ W.with_data(d)) ** 2)))
loss(W.data).block_until_ready()
print(repr(time.time()), flush=True)
'''


@pytest.mark.slow
def test_a_script_with_empty_caches_exits_within_a_second_of_its_last_statement(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "EVJAX_CACHE_DIR": str(tmp_path / "evjax"),
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    process = subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=1200)  # a hang guard only: the compiles take about 20 s
    ended = __import__("time").time()
    assert process.returncode == 0, err[-3000:]
    last_statement = float(out.strip().splitlines()[-1])
    assert ended - last_statement < 1.0, f"exited {ended - last_statement:.2f} s after its last statement"


@pytest.mark.slow
def test_ctrl_c_during_a_cold_compile_stops_the_process(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "EVJAX_CACHE_DIR": str(tmp_path / "evjax"),
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    # the log line 50 ms into each compile (not after a second): the plain first tiers compile in less
    # than a second, so with the default a run could log nothing and finish before the press
    script = EXIT_SCRIPT.replace("loss(W.data)", "print('compiling', flush=True); loss(W.data)").replace(
        "import evjax\n", "import evjax\nfrom evjax.backends import compile_log\ncompile_log.SLOW_COMPILE_S = 0.05\n")
    # Python's own SIGINT handler, as a script started at a terminal has: a shell without job control
    # starts background commands (``cmd &``) with SIGINT ignored, the child inherits that, and Python
    # (and evjax, which leaves a handler it did not install alone) then keeps it ignored
    script = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + script
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "compiling"
    # The press must land inside a compile: evjax logs "evjax: compiling ..." once a compile has run
    # for SLOW_COMPILE_S (here 50 ms), from within it (a fixed sleep could land, on a loaded machine, in JAX's
    # tracing before the compile, which is not what this test is about).
    for line in process.stderr:
        if line.startswith("evjax: compiling"):
            break
    process.send_signal(signal.SIGINT)
    start = __import__("time").monotonic()
    out, err = process.communicate(timeout=120)  # a hang guard only
    waited = __import__("time").monotonic() - start
    assert process.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    assert waited < 5.0, f"took {waited:.1f} s to stop after Ctrl-C"


# ---------------------------------------------------------------------------
# the pieces, in this process
# ---------------------------------------------------------------------------
def test_a_slow_compile_logs_one_line_and_a_fast_one_none(caplog):
    caplog.set_level(logging.WARNING, logger="evjax")
    with compile_log.announce_slow_compile("op_a", "(float32[:]) -> (float32[:])", "/cache", after=0.05):
        threading.Event().wait(0.3)
    with compile_log.announce_slow_compile("op_b", "(int32[:]) -> (int32[:])", "/cache", after=5.0):
        pass
    messages = [r.getMessage() for r in caplog.records if r.name == "evjax"]
    assert messages == ["evjax: compiling op_a for (float32[:]) -> (float32[:]) (first use; cached in /cache)"]


def test_the_lowering_context_names_the_op_on_its_thread_only():
    assert compile_log.current_op() is None
    seen = []
    with compile_log.lowering("op_a"):
        worker = threading.Thread(target=lambda: seen.append(compile_log.current_op()))
        worker.start()
        worker.join()
        with compile_log.lowering("op_b"):
            assert compile_log.current_op() == "op_b"
        assert compile_log.current_op() == "op_a"
    assert compile_log.current_op() is None and seen == [None]


def test_the_background_compile_is_gone():
    assert not hasattr(evjax, "wait_for_kernels") and not hasattr(evjax, "set_background_compile")
    with pytest.raises(TypeError):
        evjax.XLACustomKernel("no_stand_in").def_reference(lambda x, outs: [x], stand_in=lambda **_: True)


@numba.njit(parallel={"prange": True, "numpy": False})
def _parallel_copy(x, out):
    for i in numba.prange(x.shape[0]):
        out[i] = x[i]


def test_a_kernel_keeps_its_handler_name_once_it_has_compiled():
    """Numba empties a ``parallel={...}`` dict as it compiles; the handler's name (its content
    digest) must not change with it, or the kernel compiled in the background is never found."""
    before = numba_cpu._kernel_fingerprint(_parallel_copy)
    _kernel_compat.threadsafe_layer()
    out = np.zeros(3)
    _parallel_copy(np.arange(3.0), out)
    assert out.tolist() == [0.0, 1.0, 2.0]
    assert _kernel_compat.kernel_options(_parallel_copy)["parallel"] == {}  # what Numba did
    assert numba_cpu._kernel_fingerprint(_parallel_copy) == before
