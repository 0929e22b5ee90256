"""brainevent's op-layer names: the benchmark API (``benchmark_function``, ``XLACustomKernel.benchmark``,
``BenchmarkConfig/Record/Result``, ``KernelEntry``), ``register_ffi_target`` /
``list_registered_targets`` with a real compiled FFI handler, and ``DataRepresentation``."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax import XLACustomKernel, numba_kernel
from evjax.errors import BenchmarkDataFnNotProvidedError, KernelRegistrationError
from tests import kernels_for_tests as K

S = jax.ShapeDtypeStruct
HERE = pathlib.Path(__file__).resolve().parent


# ---------------------------------------------------------------------------
# benchmark_function
# ---------------------------------------------------------------------------
def test_benchmark_function_counts_calls_and_returns_per_call_times():
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    mean, std, low, high, out = evjax.benchmark_function(fn, 2, 5, n_batch_per_run=3, data=(jnp.ones(3),))
    assert len(calls) == 2 + 5 * 3
    assert 0 <= low <= mean <= high and std >= 0
    np.testing.assert_array_equal(np.asarray(out), 2 * np.ones(3))
    for bad in (dict(n_warmup=-1, n_runs=1), dict(n_warmup=0, n_runs=0), dict(n_warmup=0, n_runs=1, n_batch_per_run=0),
                dict(n_warmup=0.5, n_runs=1)):
        with pytest.raises(ValueError, match="must be an int"):
            evjax.benchmark_function(fn, **bad)


# ---------------------------------------------------------------------------
# XLACustomKernel.benchmark
# ---------------------------------------------------------------------------
def _scale_op(name, *, wrong_reference=False):
    op = XLACustomKernel(name)
    op.def_numba_kernel(lambda outs, **params: numba_kernel(K.parallel_scale_kernel, outs=outs[0]))
    op.def_reference(lambda x, s, **params: [x * s[0] + (1.0 if wrong_reference else 0.0)])
    return op


def _configs(*, platform):
    x = jnp.arange(1000, dtype=jnp.float32)
    return [evjax.BenchmarkConfig(f"n={n}", (x[:n], jnp.array([2.0], jnp.float32)),
                                  dict(outs=[S((n,), jnp.float32)]), dict(n=n)) for n in (10, 1000)]


def test_benchmark_times_every_backend_and_reports_the_fastest():
    op = _scale_op("bench_scale")
    with pytest.raises(BenchmarkDataFnNotProvidedError, match="def_benchmark_data"):
        op.benchmark(platform="cpu")
    op.def_benchmark_data(_configs)
    result = op.benchmark(platform="cpu", n_warmup=1, n_runs=3)
    assert isinstance(result, evjax.BenchmarkResult) and result.primitive_name == "bench_scale"
    assert [(r.label, r.backend) for r in result.records] == [("n=10", "numba"), ("n=10", "reference"),
                                                             ("n=1000", "numba"), ("n=1000", "reference")]
    assert all(r.success and r.mean_ms > 0 and r.min_ms <= r.mean_ms for r in result.records)
    assert result.records[0].data_kwargs == {"n": 10}
    best = result.fastest("n=1000")
    assert best.mean_ms == min(r.mean_ms for r in result.records if r.label == "n=1000")
    assert op.defaults["cpu"] == "numba"  # benchmarking chose nothing
    only = op.benchmark(platform="cpu", n_warmup=0, n_runs=1, backends=["reference"])
    assert {r.backend for r in only.records} == {"reference"}


def test_benchmark_warns_on_disagreeing_backends_and_records_failures():
    op = _scale_op("bench_wrong", wrong_reference=True)
    op.def_benchmark_data(_configs)
    with pytest.warns(RuntimeWarning, match="'reference' differs from 'numba'"):
        op.benchmark(platform="cpu", n_warmup=0, n_runs=1)

    def broken(*args, backend, **kwargs):
        if backend == "reference":
            raise RuntimeError("this backend is broken")
        return op(*args, backend=backend, **kwargs)

    op.def_call(broken)
    result = op.benchmark(platform="cpu", n_warmup=0, n_runs=1, compare_results=False)
    failed = [r for r in result.records if not r.success]
    assert len(failed) == 2 and all("this backend is broken" in r.error for r in failed)
    assert result.fastest().backend == "numba"
    with pytest.raises(RuntimeError, match="this backend is broken"):
        op.benchmark(platform="cpu", n_warmup=0, n_runs=1, catch_errors=False)


def test_builtin_op_has_benchmark_data():
    result = evjax.binary_csrmv_p.benchmark(platform="cpu", n_warmup=1, n_runs=2, backends=["numba", "reference"])
    assert {r.backend for r in result.records} == {"numba", "reference"} and all(r.success for r in result.records)


def test_result_save_load_print_plot(tmp_path, capsys):
    op = _scale_op("bench_io")
    op.def_benchmark_data(_configs)
    result = op.benchmark(platform="cpu", n_warmup=0, n_runs=2)
    result.save(tmp_path / "r.json")
    back = evjax.BenchmarkResult.load(tmp_path / "r.json")
    assert back.primitive_name == "bench_io" and len(back.records) == 4
    assert [r.mean_ms for r in back.records] == [r.mean_ms for r in result.records]
    assert json.loads((tmp_path / "r.json").read_text())["records"][0]["kernel_kwargs"]["outs"]  # shapes as text
    result.save(tmp_path / "r.csv", format="csv")
    assert (tmp_path / "r.csv").read_text().splitlines()[0].startswith("platform,backend,label,mean_ms")
    with pytest.raises(ValueError, match="'json' or 'csv'"):
        result.save(tmp_path / "r.pkl", format="pkl")
    result.print(speedup_vs="reference")
    table = capsys.readouterr().out
    assert "| n=10 | cpu | numba |" in table and "vs reference" in table and " *" in table
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    assert result.plot() is not None


def test_kernel_entries():
    op = _scale_op("bench_entries")
    entries = op.kernel_entries("cpu")
    assert [(e.backend, e.platform) for e in entries] == [("numba", "cpu")]
    assert isinstance(entries[0], evjax.KernelEntry) and callable(entries[0].kernel_generator)
    assert {e.backend for e in evjax.binary_csrmv_p.kernel_entries("cpu")} >= {"numba"}


# ---------------------------------------------------------------------------
# register_ffi_target with a handler compiled from C
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fill_library(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("ffi") / "libfill.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-I", jax.ffi.include_dir(), str(HERE / "ffi_fill_handler.c"),
                    "-o", str(out)], check=True, capture_output=True)
    return out


def test_register_ffi_target_runs_the_handler(fill_library):
    import ctypes

    evjax.register_ffi_target("evjax_test_fill", str(fill_library), "evjax_test_fill", platform="cpu")
    evjax.register_ffi_target("evjax_test_fill", ctypes.CDLL(str(fill_library)), "evjax_test_fill", platform="cpu")
    assert "evjax_test_fill" in evjax.list_registered_targets()
    y = jax.jit(lambda: jax.ffi.ffi_call("evjax_test_fill", S((2, 3), jnp.float32))())()
    np.testing.assert_array_equal(np.asarray(y), np.full((2, 3), 7.0, np.float32))

    class CompiledModule:  # brainevent's type exposes its library as so_path
        so_path = str(fill_library)

    evjax.register_ffi_target("evjax_test_fill_2", CompiledModule(), "evjax_test_fill", platform="host")
    with pytest.raises(KernelRegistrationError, match="one handler per name"):
        evjax.register_ffi_target("evjax_test_fill_2", CompiledModule(), "evjax_test_fill", platform="CUDA",
                                  replace=True)
    with pytest.raises(AttributeError, match="no symbol 'nope'"):
        evjax.register_ffi_target("evjax_test_x", str(fill_library), "nope", platform="cpu")
    with pytest.raises(ValueError, match="platform must be"):
        evjax.register_ffi_target("evjax_test_x", str(fill_library), "evjax_test_fill", platform="tpu")
    with pytest.raises(FileNotFoundError, match="no shared library"):
        evjax.register_ffi_target("evjax_test_x", "/nonexistent/lib.so", "f", platform="cpu")
    with pytest.raises(TypeError, match="module must be"):
        evjax.register_ffi_target("evjax_test_x", 42, "f", platform="cpu")
    assert "evjax_test_x" not in evjax.list_registered_targets()


# ---------------------------------------------------------------------------
# DataRepresentation
# ---------------------------------------------------------------------------
def test_every_matrix_type_is_a_data_representation():
    eye = np.eye(4, dtype=np.float32)
    csr = evjax.CSR.fromdense(eye)
    matrices = [csr, csr.T, evjax.CSC.fromdense(eye), evjax.Dense(eye),
                evjax.FixedPostNumConn((np.ones(1, np.float32), np.zeros((4, 2), np.int32)), shape=(4, 4)),
                evjax.JITCScalarR((0.5, 0.2, 1), shape=(4, 4)), evjax.JITCNormalC((0.0, 1.0, 0.2, 3), shape=(4, 4))]
    for m in matrices:
        assert isinstance(m, evjax.DataRepresentation), type(m)
    for other in (jnp.ones(3), evjax.BinaryArray(jnp.ones(3)), evjax.CompactBinary.from_array(jnp.ones(3))):
        assert not isinstance(other, evjax.DataRepresentation)
