"""Cold start: an op's first calls run its reference while its kernel compiles in the background.

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
import subprocess
import sys
import textwrap
import threading

import numba
import numpy as np
import pytest

import evjax
from evjax import _kernel_compat
from evjax.backends import compile_queue, numba_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The op: y = 2 * x + 1 (float32 vector), a Numba kernel and a pure-JAX reference.  The worker can be
# held behind a gate, so that what a first call runs does not depend on how fast the kernel compiles.
PRELUDE = '''
import json, logging, os, sys, threading
import jax, jax.numpy as jnp, numba, numpy as np
import evjax
from evjax.backends import compile_queue

compile_queue.SLOW_COMPILE_S = 0.0  # log every compile, to count them
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
op.def_numba_kernel(lambda outs: (lambda x: [evjax.numba_kernel(affine_kernel, outs[0])(x)]))

def affine(x, backend=None):
    return op(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], backend=backend)[0]

x = jnp.arange(5, dtype=jnp.float32)
expected = 2 * np.arange(5, dtype=np.float32) + 1
gate = threading.Event()

def hold_worker():
    compile_queue.submit("gate", gate.wait)

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
                "EVJAX_BACKGROUND_COMPILE": "1", "PYTHONPATH": ROOT, **(env or {})}
    process = subprocess.Popen([sys.executable, script], env=full_env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if not wait:
        return process
    return finish(process)


def finish(process) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


FIRST_CALL = '''
f = jax.jit(affine)
hold_worker()
result["first"] = np.asarray(f(x)).tolist()
result["first_runs_kernel"] = runs_kernel(f, x)
result["pending"] = compile_queue.pending()
gate.set()
result["ready"] = evjax.wait_for_kernels(timeout=120)
result["after"] = np.asarray(f(x)).tolist()
result["after_runs_kernel"] = runs_kernel(f, x)
result["compiles"] = compiles()
'''


def test_first_call_runs_the_reference_then_the_kernel_and_the_next_process_finds_it_cached(tmp_path):
    cache = str(tmp_path)
    first = run_script(FIRST_CALL, cache)
    expected = [1.0, 3.0, 5.0, 7.0, 9.0]
    assert first["first"] == expected and first["after"] == expected
    assert not first["first_runs_kernel"] and first["pending"] == 2  # the gate and the kernel
    assert first["ready"] and first["after_runs_kernel"]
    (line,) = first["compiles"]  # compiled once, announced once, with where it is cached
    assert line.startswith("evjax: compiling cold_affine (numba kernel 'affine_kernel') for (float32[:]) -> ")
    assert f"cached in {os.path.join(cache, 'numba')}" in line

    second = run_script(FIRST_CALL, cache)  # same caches: the handler loads from disk, nothing deferred
    assert second["first"] == expected and second["first_runs_kernel"]
    assert second["pending"] == 1 and second["compiles"] == []


def test_a_backend_the_user_chose_compiles_on_the_spot(tmp_path):
    body = '''
    hold_worker()  # the worker is held: only a compile on the calling thread can give the kernel
    named = jax.jit(lambda x: affine(x, backend="numba"))
    result["named"] = np.asarray(named(x)).tolist()
    result["named_runs_kernel"] = runs_kernel(named, x)
    with evjax.use_backend("numba"):
        result["block_runs_kernel"] = runs_kernel(jax.jit(lambda x: affine(x) + 0), x)
    evjax.set_background_compile(False)
    @numba.njit
    def other_kernel(x, out):
        for i in range(x.shape[0]):
            out[i] = 2 * x[i] + 1
    op.def_numba_kernel(lambda outs: (lambda x: [evjax.numba_kernel(other_kernel, outs[0])(x)]))
    result["switched_off_runs_kernel"] = "evjax_numba_other_kernel" in jax.jit(affine).lower(x).as_text()
    gate.set()
    '''
    result = run_script(body, str(tmp_path))
    assert result["named"] == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert result["named_runs_kernel"] and result["block_runs_kernel"] and result["switched_off_runs_kernel"]


def test_a_reference_that_may_not_stand_in_leaves_the_first_call_to_the_kernel(tmp_path):
    # JITC's reference builds the whole matrix: at large shapes its first call must wait for the kernel
    body = '''
    big = evjax.XLACustomKernel("cold_affine_sized")
    seen = []
    def stand_in(**params):
        seen.append(sorted(params))
        return params["small"]
    big.def_reference(lambda x, outs, small: [2 * x + 1], stand_in=stand_in)
    big.def_numba_kernel(lambda outs, small: (lambda x: [evjax.numba_kernel(affine_kernel, outs[0])(x)]))
    def call(x, small):
        return big(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], small=small)[0]
    hold_worker()
    small, large = jax.jit(lambda x: call(x, True)), jax.jit(lambda x: call(x, False))
    result["small_runs_kernel"] = runs_kernel(small, x)
    result["large_runs_kernel"] = runs_kernel(large, x)
    result["large"] = np.asarray(large(x)).tolist()
    result["seen"] = seen[0]
    gate.set()
    '''
    result = run_script(body, str(tmp_path))
    assert not result["small_runs_kernel"] and result["large_runs_kernel"]
    assert result["large"] == [1.0, 3.0, 5.0, 7.0, 9.0] and result["seen"] == ["small"]


def test_stand_in_must_be_callable():
    op = evjax.XLACustomKernel("stand_in_check")
    with pytest.raises(TypeError, match="stand_in must be callable"):
        op.def_reference(lambda x, outs: [x], stand_in=True)


def test_concurrent_first_calls_from_threads_compile_once(tmp_path):
    body = '''
    f = jax.jit(affine)
    hold_worker()
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
    result["pending"] = compile_queue.pending()
    gate.set()
    evjax.wait_for_kernels()
    result["after"] = np.asarray(f(x)).tolist()
    result["after_runs_kernel"] = runs_kernel(f, x)
    result["compiles"] = len(compiles())
    '''
    result = run_script(body, str(tmp_path))
    assert result["errors"] == []
    assert result["outputs"] == [[2.0 * (i + k) + 1 for i in range(5)] for k in range(4)]
    assert result["pending"] == 2 and result["compiles"] == 1  # one background compile for the four calls
    assert result["after"] == [1.0, 3.0, 5.0, 7.0, 9.0] and result["after_runs_kernel"]


def test_processes_sharing_one_empty_cache_both_run_and_fill_it(tmp_path):
    """Two processes start together on the same empty caches and exit without waiting: the
    worker finishes its compile before the process ends, so a third process finds it cached."""
    body = '''
    result["first"] = np.asarray(jax.jit(affine)(x)).tolist()
    '''
    cache = str(tmp_path)
    write_prelude(cache)  # before both start: the same kernel source file for all three
    processes = [run_script(body, cache, wait=False) for _ in range(2)]
    for process in processes:
        assert finish(process)["first"] == [1.0, 3.0, 5.0, 7.0, 9.0]
    third = run_script(FIRST_CALL, cache)
    assert third["first_runs_kernel"] and third["compiles"] == []


def test_a_kernel_that_fails_to_compile_in_the_background_fails_the_next_call(tmp_path):
    body = '''
    @numba.njit
    def broken_kernel(x, out):
        out[0] = undefined_name
    op.def_numba_kernel(lambda outs: (lambda x: [evjax.numba_kernel(broken_kernel, outs[0])(x)]))
    f = jax.jit(affine)
    result["first"] = np.asarray(f(x)).tolist()  # the reference, while the kernel fails to compile
    evjax.wait_for_kernels()
    try:
        f(x)
        result["error"] = None
    except Exception as exc:
        result["error"] = type(exc).__name__ + ": " + str(exc)
    '''
    result = run_script(body, str(tmp_path))
    assert result["first"] == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert result["error"] and "TypingError" in result["error"] and "undefined_name" in result["error"]


# ---------------------------------------------------------------------------
# the pieces, in this process
# ---------------------------------------------------------------------------
def test_a_slow_compile_logs_one_line_and_a_fast_one_none(caplog):
    caplog.set_level(logging.WARNING, logger="evjax")
    with compile_queue.announce_slow_compile("op_a", "(float32[:]) -> (float32[:])", "/cache", after=0.05):
        threading.Event().wait(0.3)
    with compile_queue.announce_slow_compile("op_b", "(int32[:]) -> (int32[:])", "/cache", after=5.0):
        pass
    messages = [r.getMessage() for r in caplog.records if r.name == "evjax"]
    assert messages == ["evjax: compiling op_a for (float32[:]) -> (float32[:]) (first use; cached in /cache)"]


def test_wait_for_kernels_times_out_while_a_compile_runs():
    gate = threading.Event()
    compile_queue.submit("gate", gate.wait)
    try:
        assert compile_queue.pending() >= 1
        assert evjax.wait_for_kernels(timeout=0.05) is False
    finally:
        gate.set()
    assert evjax.wait_for_kernels(timeout=30) is True and compile_queue.pending() == 0


def test_background_compile_switch():
    with pytest.raises(TypeError, match="True, False or None"):
        evjax.set_background_compile("yes")
    try:
        evjax.set_background_compile(True)
        assert compile_queue.background_enabled()
        with compile_queue.lowering("op", deferrable=True):
            assert compile_queue.may_defer() and compile_queue.current_op() == "op"
        assert not compile_queue.may_defer()  # outside an op's lowering: never
        evjax.set_background_compile(False)
        with compile_queue.lowering("op", deferrable=True):
            assert not compile_queue.may_defer()
    finally:
        evjax.set_background_compile(None)


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
