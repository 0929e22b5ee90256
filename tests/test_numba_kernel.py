"""numba_kernel: the compiled Numba CPU FFI bridge."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax.backends import numba_cpu
from tests import kernels_for_tests as K
from tests.threads import check_in_threads
from tests.helpers import HANG_GUARD_S, handler_count

S = jax.ShapeDtypeStruct
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_single_out_returns_array_and_list_returns_tuple():
    a = jnp.arange(8, dtype=jnp.float32)
    single = evjax.numba_kernel(K.add_kernel, S((8,), jnp.float32))(a, a)
    assert isinstance(single, jax.Array)
    np.testing.assert_array_equal(single, 2 * np.arange(8))
    pair = evjax.numba_kernel(K.split_kernel, [S((8,), jnp.float32), S((8,), jnp.float32)])(a)
    assert isinstance(pair, tuple) and len(pair) == 2
    np.testing.assert_array_equal(pair[0], 2 * np.arange(8))
    np.testing.assert_array_equal(pair[1], 3 * np.arange(8))
    listed = evjax.numba_kernel(K.add_kernel, [S((8,), jnp.float32)])(a, a)
    assert isinstance(listed, tuple) and len(listed) == 1


DTYPE_RANK_CASES = [(dtype, (5,)) for dtype in K.DTYPES] + [
    (dtype, shape) for dtype in (np.float32, np.int64) for shape in [(), (2, 3), (2, 1, 3), (1, 2, 1, 2)]
]


@pytest.mark.parametrize(
    "dtype, shape", DTYPE_RANK_CASES, ids=[f"{np.dtype(d).name}-{s}" for d, s in DTYPE_RANK_CASES]
)
def test_every_dtype_and_rank_round_trips(dtype, shape):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=shape).astype(dtype)
    out = evjax.numba_kernel(K.copy_any_rank, S(shape, dtype))(jnp.asarray(x))
    assert out.dtype == np.dtype(dtype) and out.shape == shape
    np.testing.assert_array_equal(np.asarray(out), x)


def test_jit_and_mixing_with_jnp():
    add = evjax.numba_kernel(K.add_kernel, S((16,), jnp.float32))

    @jax.jit
    def pipeline(a, b):
        return jnp.sin(add(a, b)) * 2

    a = jnp.linspace(0, 1, 16, dtype=jnp.float32)
    np.testing.assert_allclose(pipeline(a, a), np.sin(2 * np.asarray(a)) * 2, rtol=1e-6)


def test_parallel_prange_kernel():
    n = 10_000
    x = jnp.arange(n, dtype=jnp.float32)
    out = jax.jit(evjax.numba_kernel(K.parallel_scale_kernel, S((n,), jnp.float32)))(x, jnp.array([0.5], jnp.float32))
    np.testing.assert_allclose(out, 0.5 * np.arange(n))


def test_reduction_over_any_rank():
    x = jnp.arange(24, dtype=jnp.float64 if jax.config.jax_enable_x64 else jnp.float32).reshape(2, 3, 4)
    total = evjax.numba_kernel(K.sum_any_rank, S((1,), x.dtype))(x)
    assert float(total[0]) == pytest.approx(276.0)


def test_input_output_alias_updates_in_place():
    x = jnp.arange(6, dtype=jnp.float32)
    inc = evjax.numba_kernel(K.increment_in_place, S((6,), jnp.float32), input_output_aliases={0: 0})
    np.testing.assert_array_equal(jax.jit(inc)(x), np.arange(6) + 1)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (1, 0)])
def test_vmap_default_is_a_correct_loop_for_index_driven_kernels(in_axes):
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((3, 7)).astype(np.float32)
    idx = rng.integers(0, 7, size=(3, 5)).astype(np.int32)
    gather = evjax.numba_kernel(K.gather_kernel, S((5,), jnp.float32))
    x_arg = xs if in_axes[0] == 0 else (xs[0] if in_axes[0] is None else xs.T)
    i_arg = idx if in_axes[1] == 0 else idx[0]
    out = jax.vmap(gather, in_axes=in_axes)(jnp.asarray(x_arg), jnp.asarray(i_arg))
    expected = np.stack([
        (xs[b] if in_axes[0] is not None else xs[0])[idx[b] if in_axes[1] is not None else idx[0]]
        for b in range(3)
    ])
    np.testing.assert_array_equal(out, expected)


def test_explicit_vmap_method_is_honoured():
    add = evjax.numba_kernel(K.add_kernel, S((4,), jnp.float32), vmap_method="broadcast_all")
    jaxpr = str(jax.make_jaxpr(jax.vmap(add))(jnp.ones((2, 4)), jnp.ones((2, 4))))
    assert "scan" not in jaxpr and "vmap_method=broadcast_all" in jaxpr
    sequential = evjax.numba_kernel(K.add_kernel, S((4,), jnp.float32))
    assert "scan" in str(jax.make_jaxpr(jax.vmap(sequential))(jnp.ones((2, 4)), jnp.ones((2, 4))))


def test_kernel_exception_reaches_caller_with_its_message():
    overrun = jax.jit(evjax.numba_kernel(K.overrun_kernel, S((4,), jnp.float32)))
    with pytest.raises(Exception, match="overrun_kernel.*IndexError.*out of bounds"):
        overrun(jnp.ones(4, jnp.float32)).block_until_ready()
    raising = evjax.numba_kernel(K.raising_kernel, S((1,), jnp.float32))
    with pytest.raises(Exception, match="ValueError: x\\[0\\] must be non-negative"):
        raising(jnp.array([-1.0], jnp.float32)).block_until_ready()
    np.testing.assert_array_equal(raising(jnp.array([2.0], jnp.float32)), [2.0])


def test_exception_in_parallel_kernel_is_reported():
    raising = evjax.numba_kernel(K.parallel_raising_kernel, S((64,), jnp.float32))
    x = jnp.ones(64, jnp.float32).at[17].set(-1)
    with pytest.raises(Exception, match="negative entry"):
        raising(x).block_until_ready()


def test_rewrapping_reuses_the_registration():
    a = jnp.ones(8, jnp.float32)
    evjax.numba_kernel(K.add_kernel, S((8,), jnp.float32))(a, a)
    before = handler_count()
    for _ in range(5):
        evjax.numba_kernel(K.add_kernel, S((8,), jnp.float32))(a, a)
    evjax.numba_kernel(K.add_kernel, S((32,), jnp.float32))(jnp.ones(32), jnp.ones(32))  # new shape, same types
    assert handler_count() == before


def test_bad_input_errors():
    with pytest.raises(TypeError, match="@numba.njit"):
        evjax.numba_kernel(K.plain_python, S((4,), jnp.float32))
    with pytest.raises(TypeError, match="ShapeDtypeStruct"):
        evjax.numba_kernel(K.add_kernel, [(4,)])
    with pytest.raises(TypeError, match="ShapeDtypeStruct"):
        evjax.numba_kernel(K.add_kernel, "float32")
    add = evjax.numba_kernel(K.add_kernel, S((4,), jnp.float32))
    with pytest.raises(TypeError, match="takes 3 arrays.*1 inputs"):
        add(jnp.ones(4))
    with pytest.raises(TypeError, match="bfloat16"):
        add(jnp.ones(4, jnp.bfloat16), jnp.ones(4, jnp.bfloat16))
    declared = evjax.numba_kernel(K.declared_kernel, S((4,), jnp.float32))
    with pytest.raises(TypeError, match="declared with signatures"):
        declared(jnp.ones(4, jnp.int32))
    np.testing.assert_array_equal(declared(jnp.ones(4, jnp.float32)), np.ones(4))
    with pytest.raises(ValueError, match="vmap_method"):
        evjax.numba_kernel(K.add_kernel, S((4,), jnp.float32), vmap_method="magic")
    with pytest.raises(ValueError, match="input_output_aliases"):
        evjax.numba_kernel(K.add_kernel, S((4,), jnp.float32), input_output_aliases={5: 0})(jnp.ones(4), jnp.ones(4))
    with pytest.raises(ValueError, match="must match output"):
        evjax.numba_kernel(K.increment_in_place, S((4,), jnp.float32), input_output_aliases={0: 0})(jnp.ones(3))


def test_grad_of_raw_kernel_names_the_fix():
    add = evjax.numba_kernel(K.add_kernel, S((4,), jnp.float32))
    with pytest.raises(TypeError, match="def_jvp_rule"):
        jax.grad(lambda a: add(a, a).sum())(jnp.ones(4))


def test_concurrent_calls_from_threads_are_correct():
    n = 50_000
    call = jax.jit(evjax.numba_kernel(K.parallel_scale_kernel, S((n,), jnp.float32)))
    x = jnp.arange(n, dtype=jnp.float32)

    def worker(k):
        for _ in range(20):
            out = call(x, jnp.array([float(k)], jnp.float32))
            np.testing.assert_allclose(out, k * np.arange(n, dtype=np.float32))

    check_in_threads(worker)


def _run_python(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_workqueue_threading_layer_never_aborts_the_process():
    code = """
        import threading, warnings
        import jax, jax.numpy as jnp, numpy as np
        import evjax
        from tests import kernels_for_tests as K
        n = 20000
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call = jax.jit(evjax.numba_kernel(K.parallel_scale_kernel, jax.ShapeDtypeStruct((n,), jnp.float32)))
            call(jnp.ones(n), jnp.ones(1)).block_until_ready()
        assert any("serially" in str(w.message) for w in caught), [str(w.message) for w in caught]
        def work():
            for _ in range(30):
                np.testing.assert_allclose(call(jnp.ones(n), jnp.array([3.0])), 3.0)
        ts = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("survived")
    """
    result = _run_python(code, {"NUMBA_THREADING_LAYER": "workqueue"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "survived" in result.stdout


def test_second_process_loads_handler_from_disk_cache(tmp_path):
    code = """
        import jax, jax.numpy as jnp
        import evjax
        from evjax.backends import numba_cpu
        from tests import kernels_for_tests as K
        f = evjax.numba_kernel(K.add_kernel, jax.ShapeDtypeStruct((4,), jnp.float64))
        f(jnp.ones(4, jnp.float64), jnp.ones(4, jnp.float64)).block_until_ready()
        (h,) = numba_cpu._handlers[K.add_kernel].values()
        print("HITS", h.module.handler.cache_hits)
    """
    env = {"EVJAX_CACHE_DIR": str(tmp_path), "JAX_ENABLE_X64": "1"}
    first = _run_python(code, env)
    second = _run_python(code, env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    assert "HITS 0" in first.stdout
    assert "HITS 1" in second.stdout


# ---------------------------------------------------------------------------
# large outputs: the handler asks Linux for huge pages (intrinsics.advise_huge_pages)
# ---------------------------------------------------------------------------
F32 = np.dtype(np.float32)


def test_handler_source_advises_large_outputs_unless_turned_off(monkeypatch):
    source = numba_cpu._handler_source([(F32, 1)], [(F32, 2), (np.dtype(np.int32), 0)], threads=False)
    views = {line.split("=")[0].strip(): line for line in source.splitlines() if "frame_array(" in line}
    assert views["r0"].endswith(", 1)")  # the array output only (its advise literal) ...
    assert views["r1"].endswith(", 0)") and views["a0"].endswith(", 0)")  # ... not the scalar, not an input
    off = numba_cpu._handler_source([(F32, 1)], [(F32, 2)], threads=False, advise_huge_pages=False)
    assert all(line.endswith(", 0)") for line in off.splitlines() if "frame_array(" in line)
    monkeypatch.setenv("EVJAX_MADVISE_HUGEPAGE", "0")
    assert numba_cpu.huge_pages_advised() is False
    monkeypatch.delenv("EVJAX_MADVISE_HUGEPAGE")
    assert numba_cpu.huge_pages_advised() is True


def _transparent_huge_pages_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "absent"
    return text[text.index("[") + 1:text.index("]")]


@pytest.mark.skipif(_transparent_huge_pages_mode() not in ("madvise", "always"),
                    reason="needs Linux transparent huge pages in madvise or always mode")
def test_a_large_output_is_written_with_few_page_faults():
    import resource

    n = 4096  # 64 MiB of float32: 16384 faults on 4 KiB pages
    fill = evjax.numba_kernel(K.fill_rows, outs=jax.ShapeDtypeStruct((n, n), jnp.float32))
    f = jax.jit(lambda x: fill(x))
    x = jnp.arange(n, dtype=jnp.float32)
    out = jax.block_until_ready(f(x))
    np.testing.assert_array_equal(np.asarray(out[:, 7]), np.asarray(x))
    faults = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        del out
        out = jax.block_until_ready(f(x))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert min(faults) < 16384 // 4, faults


def test_every_public_family_kernel_can_be_called_from_python():
    # A helper compiled for compiled callers only (COMPILED_CODE_ONLY) has no Python entry point: calling it
    # from Python crashes the process.  Only private helpers (a leading underscore) may be compiled so.
    from numba.core.registry import CPUDispatcher

    from evjax._kernel_compat import kernel_options
    from evjax.primitives import event_scan
    from evjax.primitives.compact import numba as compact_numba
    from evjax.primitives.csr import numba as csr_numba, numba_rows
    from evjax.primitives.delay import numba as delay_numba
    from evjax.primitives.dense import numba as dense_numba
    from evjax.primitives.jitc import numba as jitc_numba, numba_stream
    from evjax.primitives.plasticity import numba as plasticity_numba
    from evjax.primitives.sparse_backward import numba as sparse_backward_numba

    modules = (event_scan, compact_numba, csr_numba, numba_rows, delay_numba, dense_numba, jitc_numba,
               numba_stream, plasticity_numba, sparse_backward_numba)
    public = {f"{m.__name__}.{name}": obj for m in modules for name, obj in vars(m).items()
              if isinstance(obj, CPUDispatcher) and not name.startswith("_") and obj.__module__ == m.__name__}
    assert len(public) >= 20, sorted(public)
    no_entry = sorted(name for name, d in public.items() if kernel_options(d).get("no_cpython_wrapper"))
    assert no_entry == [], f"public kernels without a Python entry point: {no_entry}"
    # the delay and plasticity kernels that had none are private now (their handlers call them from compiled
    # code, without the wrapper's compile)
    assert not hasattr(plasticity_numba, "update_lines") and not hasattr(delay_numba, "deliver")
    assert kernel_options(plasticity_numba._update_lines).get("no_cpython_wrapper")
