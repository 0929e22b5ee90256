"""The CSR operator family with ``backend='warp'`` (Warp's CPU device here; CUDA where a GPU exists).

Reuses the CSR property cases of ``tests/test_csr_ops.py``, from tests/helpers.py (random structures
with empty rows, nnz 0, duplicate columns; homogeneous and per-synapse
weights; every transform of the harness) with the Warp kernels of
:mod:`evjax.primitives.csr.warp` (registered on the ops when it is imported).
"""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

wp = pytest.importorskip("warp")

import evjax  # noqa: E402
from evjax.primitives import csr  # noqa: E402
from evjax.primitives.csr import warp as csr_warp  # noqa: E402  (importing it registers the kernels)
from evjax.testing import ALL_CHECKS, OpSpec, check_all  # noqa: E402
from tests.helpers import (  # noqa: E402
    csr_cases, csr_op_fn, csr_reference, dense_matrix, keep_spikes, random_structure, run_csr_case,
    run_csr_sddmm_case, sddmm_numpy,
)

wp.config.quiet = True
# this module's fixed-count Hypothesis tests
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
OPS = (csr.csrmv_p, csr.csrmm_p, csr.binary_csrmv_p, csr.binary_csrmm_p)
NOT_FORWARD = tuple(c for c in ALL_CHECKS if c != "forward")


def test_warp_is_a_registered_backend_of_every_csr_op():
    for op in OPS:
        assert "warp" in op.backends("cpu") and "warp" in op.backends("gpu")
        assert op.defaults["cpu"] == "numba"  # Warp is never the CPU default


def fixed_case(rank, transpose, event, homogeneous, seed=0, float_spikes=False):
    """A non-trivial case (4 x 5, an empty row, duplicates possible) for the full transform checks."""
    rng = np.random.default_rng(seed)
    indices, indptr = random_structure(rng, 4, 5)
    indptr[2:] = indptr[2:] - (indptr[2] - indptr[1])  # row 1 empty
    indices = indices[: indptr[-1]]
    data = rng.uniform(0.5, 1.5, 1 if homogeneous else indices.shape[0]).astype(np.float32)
    n_in = 5 if not transpose else 4
    x_shape = (n_in,) if rank == 1 else (n_in, 3)
    if event:
        x = rng.random(x_shape) < 0.5
        x = x.astype(np.float32) if float_spikes else x
    else:
        x = rng.standard_normal(x_shape).astype(np.float32)
    return (4, 5), (data, indices, indptr, x)


COMBOS = [(e, r, t) for e in (False, True) for r in (1, 2) for t in (False, True)]


# One orientation per op for the full transform checks: the rules call the other
# orientation (transposes) and the matrix ops (batching), so every kernel runs.
TRANSFORM_COMBOS = [(False, 1, False), (False, 2, True), (True, 1, True), (True, 2, False)]


@pytest.mark.parametrize("event, rank, transpose", TRANSFORM_COMBOS)
def test_csr_every_transform_warp(event, rank, transpose):
    """jit, jvp, vjp, grad, finite differences, vmap (in_axes 0/1/None), nested vmap, jit(grad(vmap)).

    vmap runs over the weights and the dense operand (the batching rules, shared
    by every backend, are tested over all operands with Numba in test_csr_ops).
    """
    homogeneous = (rank + transpose) % 2 == 0
    shape, args = fixed_case(rank, transpose, event, homogeneous, seed=rank + 2 * transpose)
    spec = OpSpec(
        fn=csr_op_fn(rank, event, shape, transpose, "warp"),
        reference=csr_reference(shape, transpose, event),
        diff_argnums=(0,) if event else (0, 3),
        vmap_argnums=(0, 3),
        smooth=not event,
        perturb=keep_spikes if event else None,
        batch_size=2,
        name=f"{'binary_' if event else ''}csrm{'v' if rank == 1 else 'm'}(T={transpose},warp)",
    )
    check_all(spec, args)


@pytest.mark.parametrize("event, rank, transpose", COMBOS)
def test_csr_forward_random_structures_warp(event, rank, transpose):
    """Eager and jit forward on Hypothesis structures (nnz 0, size-0 dims, duplicates, no/all spikes)."""
    @settings(max_examples=6, **SETTINGS)
    @given(csr_cases(rank=rank, transpose=transpose, event=event))
    def check(case):
        run_csr_case(case, rank=rank, transpose=transpose, event=event, backend="warp", skip=NOT_FORWARD)

    check()


@pytest.mark.parametrize("rank, transpose", [(1, True), (2, False)])
def test_event_ops_float_spikes_warp(rank, transpose):
    """Float spikes: forward on 1[s != 0], straight-through gradient."""
    case = fixed_case(rank, transpose, True, False, seed=7, float_spikes=True)
    run_csr_case(case, rank=rank, transpose=transpose, event=True, backend="warp", float_spikes=True,
                 skip=("nested_vmap", "check_grads"))


@pytest.mark.parametrize("event, rank, transpose", COMBOS)
def test_float64_int64_indices_warp(event, rank, transpose):
    """float64 weights with int64 indices: forward, jvp and vjp."""
    with jax.enable_x64(True):
        shape, (data, indices, indptr, x) = fixed_case(rank, transpose, event, rank == 2, seed=11)
        args = (data.astype(np.float64), indices.astype(np.int64), indptr.astype(np.int64),
                x if x.dtype == np.bool_ else x.astype(np.float64))
        assert csr_op_fn(rank, event, shape, transpose, "warp")(*args).dtype == jnp.float64
        run_csr_case((shape, args), rank=rank, transpose=transpose, event=event, backend="warp",
                     skip=("vmap", "nested_vmap", "jit_grad_vmap", "check_grads"))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("event", [False, True])
def test_low_precision_accumulates_in_float32_like_numba(dtype, transpose, event):
    """float16 and bfloat16 (which Warp lacks) go through float32, rounded once at the end."""
    rng = np.random.default_rng(3)
    indptr = np.array([0, 300, 300, 600], np.int32)
    indices = np.concatenate([np.arange(300), rng.integers(0, 300, 300)]).astype(np.int32)
    data = jnp.asarray(rng.uniform(0.9, 1.1, 600), dtype)
    n_in = 300 if not transpose else 3
    x = rng.random((n_in, 2)) < 0.9
    if not event:
        x = jnp.asarray(x, dtype)
    fn = csr_op_fn(2, event, (3, 300), transpose, "warp")
    out = fn(data, indices, indptr, x)
    assert out.dtype == dtype
    exact = np.asarray(dense_matrix(jnp.asarray(data, jnp.float32), indices, indptr, (3, 300)))
    exact = exact.T if transpose else exact
    expected = (exact @ np.asarray(x, np.float32)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(jnp.asarray(expected, dtype), np.float32),
        rtol=0, atol=1e-6 + np.abs(expected).max() * float(jnp.finfo(dtype).eps),
    )


def test_malformed_structure_under_jit_stays_in_bounds():
    """Row spans past nnz and out-of-range columns are clamped / ignored, never read or written."""
    data = jnp.asarray([1.0, 2.0, 4.0], jnp.float32)
    indices = jnp.asarray([0, 7, -1], jnp.int32)  # 7 and -1 are outside [0, 3)
    indptr = jnp.asarray([0, 2, 99], jnp.int32)  # last row claims 97 synapses that do not exist
    v = jnp.ones(3, jnp.float32)
    f = jax.jit(lambda d, i, p, x: evjax.csrmv(d, i, p, x, shape=(2, 3), backend="warp"))
    np.testing.assert_allclose(f(data, indices, indptr, v), [1.0, 0.0])
    s = jnp.asarray([True, True])
    g = jax.jit(lambda d, i, p, x: evjax.binary_csrmv(d, i, p, x, shape=(2, 3), transpose=True, backend="warp"))
    np.testing.assert_allclose(g(data, indices, indptr, s), [1.0, 0.0, 0.0])


def test_larger_problem_against_scipy():
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    a = sp.random(700, 500, density=0.05, format="csr", random_state=1, dtype=np.float32)
    data, indices, indptr = (jnp.asarray(v) for v in (a.data, a.indices, a.indptr))
    s = rng.random(700) < 0.2
    x = rng.standard_normal(500).astype(np.float32)
    X = rng.standard_normal((700, 8)).astype(np.float32)
    af = a.astype(np.float64)
    got = evjax.binary_csrmv(data, indices, indptr, s, shape=a.shape, transpose=True, backend="warp")
    np.testing.assert_allclose(got, af.T @ s, rtol=2e-5, atol=2e-4)
    got = evjax.csrmv(data, indices, indptr, x, shape=a.shape, backend="warp")
    np.testing.assert_allclose(got, af @ x, rtol=2e-5, atol=2e-4)
    got = evjax.csrmm(data, indices, indptr, X, shape=a.shape, transpose=True, backend="warp")
    np.testing.assert_allclose(got, af.T @ X, rtol=2e-5, atol=2e-4)


def test_importing_the_warp_module_registers_and_keeps_defaults():
    ops = OPS + (csr.csr_sddmm_p,)
    for op in ops:
        assert "warp" in op.backends("cpu") and "warp" in op.backends("gpu")
    # the generators are registered by the import (the ops only declared the module)
    assert csr.csrmv_p.kernel_generator("cpu", "warp") is csr_warp.csrmv_warp
    assert csr.csr_sddmm_p.kernel_generator("gpu", "warp") is csr_warp.csr_sddmm_warp
    # in a fresh process: the ops do not import the module, and importing it changes no default
    code = (
        "import sys\n"
        "from evjax.primitives import csr\n"
        "assert 'evjax.primitives.csr.warp' not in sys.modules\n"
        "ops = (csr.csrmv_p, csr.csrmm_p, csr.binary_csrmv_p, csr.binary_csrmm_p, csr.csr_sddmm_p)\n"
        "before = [op.defaults for op in ops]\n"
        "from evjax.primitives.csr import warp\n"
        "after = [op.defaults for op in ops]\n"
        "assert after == before and all(d['cpu'] == 'numba' for d in after), (before, after)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env={**os.environ, "JAX_PLATFORMS": "cpu"})


# ---------------------------------------------------------------------------
# the weight gradient (csr_sddmm_p) on Warp
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("width", [None, 3])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n_rows, n_cols", [(6, 5), (1, 1), (4, 3)])
def test_sddmm_warp_matches_numpy(width, index_dtype, n_rows, n_cols):
    rng = np.random.default_rng(n_rows * 7 + n_cols)
    indices, indptr = random_structure(rng, n_rows, n_cols)
    indices, indptr = indices.astype(index_dtype), indptr.astype(index_dtype)
    shape_r = (n_rows,) if width is None else (n_rows, width)
    shape_q = (n_cols,) if width is None else (n_cols, width)
    q = rng.standard_normal(shape_q).astype(np.float32)
    for r in (rng.random(shape_r) < 0.4,  # events: silent rows are skipped
              (rng.standard_normal(shape_r) * (rng.random(shape_r) < 0.5)).astype(np.float32)):
        with jax.enable_x64(index_dtype == np.int64):  # else JAX narrows int64 indices to int32
            got = csr.csr_sddmm(indices, indptr, r, q, shape=(n_rows, n_cols), backend="warp")
        np.testing.assert_allclose(got, sddmm_numpy(indices, indptr, r, q), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [None, 2])
def test_sddmm_every_transform_warp(width):
    run_csr_sddmm_case(0, width, "warp")


def test_sddmm_warp_empty_and_malformed():
    empty = csr.csr_sddmm(np.zeros(0, np.int32), np.zeros(4, np.int32), np.ones(3, np.float32),
                          np.ones(3, np.float32), shape=(3, 3), backend="warp")
    assert empty.shape == (0,)
    indices = jnp.asarray([0, 5, -1, 2], jnp.int32)  # 5 and -1 are outside [0, 3)
    indptr = jnp.asarray([0, 3, 99], jnp.int32)  # the last row claims synapses that do not exist
    f = jax.jit(lambda i, p, r, q: csr.csr_sddmm(i, p, r, q, shape=(2, 3), backend="warp"))
    np.testing.assert_allclose(f(indices, indptr, jnp.ones(2), jnp.arange(1.0, 4.0)), [1.0, 0.0, 0.0, 3.0])


@pytest.mark.parametrize("batched", [False, True])
def test_weight_gradient_runs_on_warp_and_matches_reference(batched):
    rng = np.random.default_rng(3)
    indices, indptr = random_structure(rng, 30, 20)
    data = jnp.asarray(rng.uniform(0.1, 1.0, indices.shape[0]).astype(np.float32))
    W = evjax.CSR((data, indices, indptr), shape=(30, 20))
    s = jnp.asarray(rng.random((4, 30) if batched else 30) < 0.3)

    def grad_on(backend):
        with evjax.use_backend(backend):
            loss = lambda d: jnp.sum((s @ W.with_data(d)) ** 2)  # noqa: E731
            return jax.jit(jax.grad(loss))(data), jax.make_jaxpr(jax.grad(loss))(data)

    got, jaxpr = grad_on("warp")
    want, _ = grad_on("reference")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    sddmm = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "evjax_csr_sddmm"]
    # the op records the use_backend choice made at trace time; it resolves to Warp
    assert sddmm and csr.csr_sddmm_p.resolve_backend("cpu", sddmm[0].params["backend"]) == "warp"


def test_sddmm_warp_is_registered_and_gpu_default():
    assert "warp" in csr.csr_sddmm_p.backends("cpu") and "warp" in csr.csr_sddmm_p.backends("gpu")
    assert csr.csr_sddmm_p.defaults["cpu"] == "numba"
    assert csr.csr_sddmm_p.defaults["gpu"] == "warp"
