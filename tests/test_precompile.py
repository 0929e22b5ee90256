"""``python -m evjax.precompile`` fills the disk caches, so a later process compiles nothing."""
import importlib
import io
import os
import subprocess
import sys

import pytest

import evjax
from tests.helpers import HANG_GUARD_S

precompile_module = importlib.import_module("evjax.precompile")  # (evjax.precompile is the function)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_family_has_cases_for_every_operand_kind():
    cases = precompile_module.cases()
    labels = [label for label, _ in cases]
    assert len(labels) == len(set(labels))
    for family in ("csr", "fixed FixedPostNumConn", "fixed FixedPreNumConn", "dense", "jitc scalar",
                   "jitc normal, corder", "jitc uniform"):
        for side in ("x @ M", "M @ x"):
            for operand in ("spikes", "spike batch", "graded events", "values", "value batch"):
                assert f"{family}: {side}, {operand} (float32)" in labels
    assert "neuron" not in precompile_module.FAMILIES  # pure JAX: nothing to compile ahead


def test_bad_families_and_dtypes_are_named():
    with pytest.raises(ValueError, match=r"unknown families \['csrr'\]"):
        precompile_module.cases(["csrr"])
    with pytest.raises(ValueError, match="float32 or float64"):
        precompile_module.cases(["csr"], ["int32"])
    assert evjax.precompile is precompile_module.precompile


def test_the_progress_bar_counts_every_case(monkeypatch):
    ran = []
    monkeypatch.setitem(precompile_module._BUILDERS, "one", lambda dtype: [(f"one ({dtype})", lambda: ran.append(1))])
    stream = io.StringIO()
    assert evjax.precompile(["one"], stream=stream) == 1 and ran == [1]
    text = stream.getvalue()
    assert "0/1" in text and "1/1" in text and text.endswith("\n")


CHECK = '''
import logging, jax, jax.numpy as jnp, numpy as np, evjax
from evjax.backends import compile_log
compile_log.SLOW_COMPILE_S = 0.0
records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger("evjax").addHandler(handler)
W = evjax.CSR.fromdense(np.eye(7, 9, dtype=np.float32) * 2)   # other shapes than precompile's
spikes = jnp.arange(7) % 2 == 0
loss = lambda d: jnp.sum((spikes @ W.with_data(d)) ** 2)
print(float(jax.jit(loss)(W.data)), float(jax.jit(jax.grad(loss))(W.data).sum()))
print(sum("compiling" in r for r in records))
'''


@pytest.mark.slow
def test_a_process_after_precompile_compiles_no_kernel(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "EVJAX_CACHE_DIR": str(tmp_path / "evjax"),
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    # only the cases this check needs: bool spikes on the left of a CSR, forward and grad
    run = ("import importlib; p = importlib.import_module('evjax.precompile'); "
           "[r() for label, r in p.cases(['csr']) if label.startswith('csr: x @ M, spikes ')]")
    done = subprocess.run([sys.executable, "-c", run], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    check = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert check.returncode == 0, check.stderr[-3000:]
    values, compiles = check.stdout.strip().splitlines()[-2:]
    assert values == "16.0 16.0" and compiles == "0"
