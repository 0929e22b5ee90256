"""brainunit quantities on weights and operands (the optional ``units`` extra): every family's functions
and matrix types run on the numbers and return the product's unit, under jit, grad and vmap; spikes carry
no unit; a scale in another dimension than its location is refused; evjax never imports brainunit itself."""
from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax

u = pytest.importorskip("brainunit")

rng = np.random.default_rng(0)
A = (rng.random((5, 4)) < 0.5) * rng.standard_normal((5, 4)).astype(np.float32)
W = evjax.CSR.fromdense(A.astype(np.float32))
V = rng.standard_normal(4).astype(np.float32)
S = rng.random(5) < 0.5
TABLE = rng.integers(0, 4, (5, 2)).astype(np.int32)


def _same(got, unit, want):
    assert u.get_unit(got) == unit, (u.get_unit(got), unit)
    np.testing.assert_allclose(np.asarray(got.to_decimal(unit)), np.asarray(want), rtol=1e-5, atol=1e-6)


def _cases():
    """(name, fn, plain args, the units of the args that carry one, the result's unit)."""
    nS, mV = u.nS, u.mV
    d, i, p = W.data, W.indices, W.indptr
    B = rng.standard_normal((4, 3)).astype(np.float32)
    D = jnp.asarray(A.astype(np.float32))
    w1 = jnp.asarray([0.7], jnp.float32)
    yield "csrmv", lambda d, v: evjax.csrmv(d, i, p, v, shape=W.shape), (d, V), (nS, mV), nS * mV
    yield "csrmm", lambda d, b: evjax.csrmm(d, i, p, b, shape=W.shape), (d, B), (nS, mV), nS * mV
    yield "binary_csrmv", lambda d: evjax.binary_csrmv(d, i, p, S, shape=W.shape, transpose=True), (d,), (nS,), nS
    yield ("weighted", lambda d, v: evjax.binary_csrmv(d, i, p, v, shape=W.shape, weighted=True), (d, V), (nS, mV),
           nS * mV)
    yield ("csr_sddmm", lambda r, q: evjax.csr_sddmm(i, p, r, q, shape=W.shape), (V[:4].repeat(2)[:5], V),
           (nS, mV), nS * mV)
    yield ("dt2t", lambda y, w: evjax.csrmv_dt2t(y, w, i, p, shape=W.shape, transpose=True), (V, d), (mV, nS),
           nS * mV)
    yield "fcnmv", lambda w, v: evjax.fcnmv(w, TABLE, v, shape=(5, 4)), (w1, V), (nS, mV), nS * mV
    yield ("binary_fcnmv", lambda w: evjax.binary_fcnmv(w, TABLE, S, shape=(5, 4), transpose=True), (w1,), (nS,),
           nS)
    yield "binary_densemv", lambda w: evjax.binary_densemv(w, S, transpose=True), (D,), (nS,), nS
    yield "jitsmv", lambda w, v: evjax.jitsmv(w, 0.5, v, 3, shape=(5, 4)), (0.5, V), (nS, mV), nS * mV
    yield ("jitnmv", lambda a, b, v: evjax.jitnmv(a, b, 0.5, v, 3, shape=(5, 4)), (0.5, 0.1, V), (nS, nS, mV),
           nS * mV)
    yield "jits", lambda w: evjax.jits(w, 0.5, 3, shape=(5, 4)), (0.5,), (nS,), nS
    yield ("indexed", lambda d: evjax.binary_csrmv_indexed(d, i, p, jnp.arange(W.nnz), S[:4], shape=W.shape),
           (d,), (nS,), nS)


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0] if isinstance(c, tuple) else str(c))
def test_functions_return_the_product_unit(case):
    _, fn, args, arg_units, unit = case
    want = fn(*args)
    got = fn(*[a * un for a, un in zip(args, arg_units)])
    _same(got, unit, want)
    jitted = jax.jit(fn)(*[a * un for a, un in zip(args, arg_units)])
    _same(jitted, unit, want)


def test_matrix_types_carry_units_through_jit_grad_vmap():
    nS, mV = u.nS, u.mV
    Wq = evjax.CSR((W.data * nS, W.indices, W.indptr), shape=W.shape)
    _same(Wq.data, nS, W.data)
    _same(Wq.todense(), nS, A)
    _same(Wq @ (V * mV), nS * mV, A @ V)
    _same(jax.jit(lambda W, v: W @ v)(Wq, V * mV), nS * mV, A @ V)
    _same(evjax.BinaryArray(S) @ Wq, nS, S @ A)
    _same(evjax.CompactBinary.from_array(S) @ Wq, nS, S @ A)
    graded = V[:4].repeat(2)[:5]
    _same(evjax.WeightedArray(graded * mV) @ Wq, nS * mV, graded @ A)
    _same(Wq.T @ evjax.BinaryArray(S), nS, S @ A)
    batch = rng.standard_normal((3, 4)).astype(np.float32)
    _same(jax.vmap(lambda x: Wq @ x)(batch * mV), nS * mV, batch @ A.T)
    g = jax.grad(lambda d: jnp.sum((evjax.CSR((d, W.indices, W.indptr), shape=W.shape) @ (V * mV)).mantissa))(
        W.data * nS)
    g_plain = jax.grad(lambda d: jnp.sum(W.with_data(d) @ V))(W.data)
    _same(g, nS, g_plain)
    for M, dense in ((evjax.Dense(A * nS), A),
                     (evjax.FixedPostNumConn((np.float32(0.5) * nS, TABLE), shape=(5, 4)), None),
                     (evjax.JITCScalarR((0.5 * nS, 0.5, 3), shape=(5, 4)), None),
                     (evjax.JITCNormalR((0.5 * nS, 0.1 * nS, 0.5, 3), shape=(5, 4)), None)):
        dense = np.asarray(M.todense().to_decimal(nS)) if dense is None else dense
        _same(M.todense(), nS, dense)
        _same(evjax.BinaryArray(S) @ M, nS, S @ dense)
        _same(M @ (V * mV), nS * mV, dense @ V)


def test_bad_units_raise_clear_errors():
    nS, mV = u.nS, u.mV
    Wq = evjax.CSR((W.data * nS, W.indices, W.indptr), shape=W.shape)
    with pytest.raises(TypeError, match="v are spikes, which carry no unit"):
        evjax.binary_csrmv(W.data * nS, W.indices, W.indptr, S * mV, shape=W.shape, transpose=True)
    with pytest.raises(TypeError, match="spikes carry no unit"):
        evjax.BinaryArray(S * mV) @ Wq
    with pytest.raises(TypeError, match="w_scale has unit mV, which is not a unit of the weights' dimension"):
        evjax.jitnmv(0.5 * nS, 0.1 * mV, 0.5, V, 3, shape=(5, 4))
    with pytest.raises(TypeError, match="w_scale and the weights must both be quantities"):
        evjax.jitnmv(0.5 * nS, 0.1, 0.5, V, 3, shape=(5, 4))
    with pytest.raises(TypeError, match="indices cannot carry a unit"):
        evjax.csrmv(W.data, W.indices * mV, W.indptr, V, shape=W.shape)


def test_dimensionless_products_are_plain_arrays():
    got = evjax.csrmv(W.data * u.nS, W.indices, W.indptr, V / u.nS, shape=W.shape)
    assert not hasattr(got, "unit") or u.get_unit(got).is_unitless
    np.testing.assert_allclose(np.asarray(got), A @ V, rtol=1e-5)


def test_evjax_never_imports_brainunit():
    code = ("import sys, numpy as np, evjax; W = evjax.CSR.fromdense(np.eye(3, dtype=np.float32)); "
            "(np.ones(3, bool) @ W).block_until_ready(); assert 'brainunit' not in sys.modules "
            "and 'saiunit' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)


def test_plasticity_and_delays_keep_the_weights_unit():
    nS, pA = u.nS, u.pA
    spikes = jnp.asarray(S[:4])
    W4 = evjax.CSR.fromdense(np.eye(4, dtype=np.float32) * 2)
    trace = jnp.asarray(rng.random(4).astype(np.float32))
    want = evjax.update_csr_on_binary_pre(W4.data, W4.indices, W4.indptr, spikes, trace, w_min=0.0, w_max=2.5,
                                          shape=(4, 4))
    got = evjax.update_csr_on_binary_pre(W4.data * nS, W4.indices, W4.indptr, spikes, trace * 1e-3 * u.uS,
                                         w_min=0.0 * nS, w_max=2.5 * nS, shape=(4, 4))
    _same(got, nS, want)
    dense = jnp.asarray(A[:4].astype(np.float32))
    _same(evjax.update_dense_on_binary_post(dense * nS, trace * nS, spikes), nS,
          evjax.update_dense_on_binary_post(dense, trace, spikes))
    ring = jnp.asarray(rng.standard_normal((3, 4)).astype(np.float32))
    delays = jnp.asarray(rng.integers(0, 3, W4.nnz).astype(np.int32))
    _same(evjax.csr_delay_deliver(ring * pA, spikes, W4.data * pA, W4.indices, W4.indptr, delays, 1, shape=(4, 4)),
          pA, evjax.csr_delay_deliver(ring, spikes, W4.data, W4.indices, W4.indptr, delays, 1, shape=(4, 4)))
    with pytest.raises(TypeError, match="post_trace has unit mV"):
        evjax.update_csr_on_binary_pre(W4.data * nS, W4.indices, W4.indptr, spikes, trace * u.mV, shape=(4, 4))
    with pytest.raises(TypeError, match="pre_spike are spikes"):
        evjax.update_csr_on_binary_pre(W4.data * nS, W4.indices, W4.indptr, spikes * u.mV, trace * nS,
                                       shape=(4, 4))


def test_a_unit_of_another_dimension_is_brainunits_mismatch_error_too():
    """brainevent users catch ``brainunit.UnitMismatchError``; evjax's error is also a ``TypeError``."""
    W4 = evjax.CSR.fromdense(np.eye(4, dtype=np.float32))
    for catch in (u.UnitMismatchError, TypeError):
        with pytest.raises(catch, match="post_trace has unit mV, which is not a unit of the weights' dimension"):
            evjax.update_csr_on_binary_pre(W4.data * u.nS, W4.indices, W4.indptr, jnp.ones(4, bool),
                                           jnp.ones(4) * u.mV, shape=(4, 4))


def test_matrix_constructors_and_methods_keep_units():
    mV, ohm, volt = u.mV, u.ohm, u.volt
    dense = np.array([[3.0, 1.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 4.0]], np.float32)
    b = np.array([9.0, 8.0, 4.0], np.float32)
    for cls in (evjax.CSR, evjax.CSC):
        M = cls.fromdense(dense * mV)
        _same(M.todense(), mV, dense)
        _same(M.with_data(M.data * 2).todense(), mV, 2 * dense)  # with_data takes quantities
        _same(cls.fromdense(dense * ohm).solve(b * volt), u.amp, np.linalg.solve(dense, b))
    D = evjax.Dense.fromdense(dense * mV)
    _same((D + dense * mV).todense(), mV, 2 * dense)
    _same(D.diag_add(1.0 * mV).todense(), mV, dense + np.eye(3))
    _same(evjax.Dense(dense * ohm).solve(b * volt), u.amp, np.linalg.solve(dense, b))
    with pytest.raises(u.UnitMismatchError):
        D + dense * u.ms
