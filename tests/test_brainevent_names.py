"""brainevent 0.3.0's names that evjax exports: the primitives called as ``op(*ins, outs=..., **params)``,
the base classes, the error hierarchy and the catalogue of ops (``get_registry`` and friends)."""
from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
import pytest
import scipy.sparse as sp

import evjax
from evjax import XLACustomKernel, errors
from tests.helpers import equations

S = jax.ShapeDtypeStruct
REF = "reference"
RNG = np.random.default_rng(31)


def _csr(m=5, n=4, density=0.5):
    a = sp.random(m, n, density=density, format="csr", random_state=3, dtype=np.float32)
    return (jnp.asarray(a.data), jnp.asarray(a.indices, jnp.int32), jnp.asarray(a.indptr, jnp.int32),
            a.toarray(), (m, n))


# ---------------------------------------------------------------------------
# the primitives, called through brainevent's signature (*ins, outs, **kwargs)
# ---------------------------------------------------------------------------
def test_primitives_are_the_ops_the_public_functions_bind():
    assert evjax.binary_fcnmv_p is evjax.binary_csrmv_p and evjax.binary_fcnmm_p is evjax.binary_csrmm_p
    for name in ("csrmv_p", "csrmm_p", "binary_csrmv_p", "binary_csrmm_p", "binary_densemv_p", "binary_densemm_p",
                 "jitsmv_p", "jitsmm_p", "binary_jitsmv_p", "binary_jitsmm_p", "jitnmv_p", "jitnmm_p",
                 "binary_jitnmv_p", "binary_jitnmm_p", "jitumv_p", "jitumm_p", "binary_jitumv_p", "binary_jitumm_p",
                 "jits_p", "jitn_p", "jitu_p"):
        op = getattr(evjax, name)
        assert isinstance(op, XLACustomKernel) and name in evjax.__all__
        assert op.name == "evjax_" + name.removesuffix("_p")


@pytest.mark.parametrize("transpose", [False, True])
def test_csr_primitives_called_directly_match_the_functions_and_numpy(transpose):
    data, indices, indptr, dense, shape = _csr()
    a = dense.T if transpose else dense
    n_in, n_out = a.shape[1], a.shape[0]
    v = jnp.asarray(RNG.normal(size=n_in), jnp.float32)
    B = jnp.asarray(RNG.normal(size=(n_in, 3)), jnp.float32)
    spikes = jnp.asarray([True, False] * n_in)[:n_in]
    spikes_m = jnp.asarray(RNG.random((n_in, 3)) < 0.5)
    kw = dict(shape=shape, transpose=transpose, backend=REF)
    cases = [
        (evjax.csrmv_p, evjax.csrmv, v, {}, S((n_out,), jnp.float32), a @ np.asarray(v)),
        (evjax.csrmm_p, evjax.csrmm, B, {}, S((n_out, 3), jnp.float32), a @ np.asarray(B)),
        (evjax.binary_csrmv_p, evjax.binary_csrmv, spikes, {"weighted": False}, S((n_out,), jnp.float32),
         a @ np.asarray(spikes, np.float32)),
        (evjax.binary_csrmm_p, evjax.binary_csrmm, spikes_m, {"weighted": False}, S((n_out, 3), jnp.float32),
         a @ np.asarray(spikes_m, np.float32)),
    ]
    for op, fn, x, extra, out, expected in cases:
        y, = op(data, indices, indptr, x, outs=[out], **kw, **extra)
        np.testing.assert_allclose(y, fn(data, indices, indptr, x, **kw), rtol=1e-6)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_fixed_primitives_take_the_tables_csr_structure():
    n_pre, n_post, k = 6, 5, 2
    table = jnp.asarray(np.stack([RNG.choice(n_post, k, replace=False) for _ in range(n_pre)]), jnp.int32)
    w = jnp.asarray(RNG.normal(size=(n_pre, k)), jnp.float32)
    spikes = jnp.asarray(RNG.random(n_pre) < 0.5)
    spikes_m = jnp.asarray(RNG.random((n_pre, 2)) < 0.5)
    indptr = jnp.arange(n_pre + 1, dtype=jnp.int32) * k
    dense = np.zeros((n_pre, n_post), np.float32)
    np.add.at(dense, (np.repeat(np.arange(n_pre), k), np.asarray(table).ravel()), np.asarray(w).ravel())
    kw = dict(shape=(n_pre, n_post), transpose=True, backend=REF)
    y, = evjax.binary_fcnmv_p(w.ravel(), table.ravel(), indptr, spikes, outs=[S((n_post,), jnp.float32)],
                              weighted=False, **kw)
    np.testing.assert_allclose(y, evjax.binary_fcnmv(w, table, spikes, **kw), rtol=1e-6)
    np.testing.assert_allclose(y, np.asarray(spikes, np.float32) @ dense, rtol=1e-5, atol=1e-6)
    y, = evjax.binary_fcnmm_p(w.ravel(), table.ravel(), indptr, spikes_m, outs=[S((n_post, 2), jnp.float32)],
                              weighted=False, **kw)
    np.testing.assert_allclose(y, evjax.binary_fcnmm(w, table, spikes_m, **kw), rtol=1e-6)
    np.testing.assert_allclose(y, dense.T @ np.asarray(spikes_m, np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transpose", [False, True])
def test_dense_primitives_called_directly(transpose):
    w = jnp.asarray(RNG.normal(size=(4, 6)), jnp.float32)
    n_in, n_out = (4, 6) if transpose else (6, 4)
    s = jnp.asarray(RNG.random(n_in) < 0.5)
    s_m = jnp.asarray(RNG.random((n_in, 3)) < 0.5)
    a = np.asarray(w).T if transpose else np.asarray(w)
    kw = dict(transpose=transpose, backend=REF)
    y, = evjax.binary_densemv_p(w, s, outs=[S((n_out,), jnp.float32)], weighted=False, **kw)
    np.testing.assert_allclose(y, evjax.binary_densemv(w, s, **kw), rtol=1e-6)
    np.testing.assert_allclose(y, a @ np.asarray(s, np.float32), rtol=1e-5, atol=1e-6)
    y, = evjax.binary_densemm_p(w, s_m, outs=[S((n_out, 3), jnp.float32)], weighted=False, **kw)
    np.testing.assert_allclose(y, evjax.binary_densemm(w, s_m, **kw), rtol=1e-6)
    np.testing.assert_allclose(y, a @ np.asarray(s_m, np.float32), rtol=1e-5, atol=1e-6)


_LAWS = {"s": (0.7,), "n": (0.5, 0.2), "u": (-0.3, 0.4)}


@pytest.mark.parametrize("letter", sorted(_LAWS))
def test_jitc_primitives_called_directly_match_the_functions_and_the_dense_matrix(letter):
    shape, prob, seed, transpose, corder = (7, 5), 0.4, 11, False, True
    values = _LAWS[letter]
    params = [jnp.asarray([v], jnp.float32) for v in values]
    seed_arr = jnp.asarray([seed], jnp.uint32)
    common = dict(shape=shape, prob=prob, transpose=transpose, corder=corder, backend=REF)
    fn_kw = dict(shape=shape, transpose=transpose, corder=corder, backend=REF)
    dense_op, dense_fn = getattr(evjax, f"jit{letter}_p"), getattr(evjax, f"jit{letter}")
    M, = dense_op(*params, seed_arr, outs=[S(shape, jnp.float32)], **common)
    np.testing.assert_allclose(M, dense_fn(*values, prob, seed, **fn_kw), rtol=1e-6)
    M = np.asarray(M)
    v = jnp.asarray(RNG.normal(size=shape[1]), jnp.float32)
    B = jnp.asarray(RNG.normal(size=(shape[1], 2)), jnp.float32)
    s = jnp.asarray(RNG.random(shape[1]) < 0.5)
    s_m = jnp.asarray(RNG.random((shape[1], 2)) < 0.5)
    for name, x, out, extra, expected in [
        (f"jit{letter}mv", v, S((shape[0],), jnp.float32), {}, M @ np.asarray(v)),
        (f"jit{letter}mm", B, S((shape[0], 2), jnp.float32), {}, M @ np.asarray(B)),
        (f"binary_jit{letter}mv", s, S((shape[0],), jnp.float32), {"weighted": False}, M @ np.asarray(s, np.float32)),
        (f"binary_jit{letter}mm", s_m, S((shape[0], 2), jnp.float32), {"weighted": False},
         M @ np.asarray(s_m, np.float32)),
    ]:
        y, = getattr(evjax, f"{name}_p")(*params, seed_arr, x, outs=[out], **common, **extra)
        np.testing.assert_allclose(y, getattr(evjax, name)(*values, prob, x, seed, **fn_kw), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# base classes
# ---------------------------------------------------------------------------
def test_base_class_names():
    W = evjax.JITCScalarR(0.5, prob=0.2, seed=1, shape=(4, 3))
    for obj in (W, W.T, evjax.JITCScalarC(0.5, prob=0.2, seed=1, shape=(4, 3))):
        assert isinstance(obj, evjax.JITCScalarMatrix) and isinstance(obj, evjax.JITCMatrix)
    assert isinstance(W, evjax.JITCHomoR) and evjax.JITCHomoC is evjax.JITCScalarC
    N = evjax.JITCNormalR(0.5, 0.1, prob=0.2, seed=1, shape=(4, 3))
    assert isinstance(N, evjax.JITCMatrix) and not isinstance(N, evjax.JITCScalarMatrix)
    np.testing.assert_allclose(jax.tree_util.tree_map(lambda x: x, W).todense(), W.todense())  # still a pytree
    with pytest.raises(TypeError, match="JITCScalarR or a JITCScalarC"):
        evjax.JITCScalarMatrix(0.5, prob=0.2, seed=1, shape=(4, 3))

    table = jnp.asarray([[0, 1], [1, 2]], jnp.int32)
    C = evjax.FixedPostNumConn((0.5, table), shape=(2, 3))
    assert isinstance(C, evjax.FixedNumConn) and isinstance(C.T, evjax.FixedNumConn)
    assert issubclass(evjax.FixedNumPerPost, evjax.FixedNumConn)
    with pytest.raises(TypeError, match="FixedPostNumConn"):
        evjax.FixedNumConn((0.5, table), shape=(2, 3))

    for events in (evjax.BinaryArray(jnp.ones(3, bool)), evjax.WeightedArray(jnp.ones(3))):
        assert isinstance(events, evjax.EventRepresentation)
    assert isinstance(C, evjax.DataRepresentation) and not isinstance(events, evjax.DataRepresentation)


def test_every_matrix_type_transposes_with_numpys_signature():
    """``transpose(axes)`` is the base class's, for every matrix type: ``T``, or a named error."""
    dense = np.arange(6, dtype=np.float32).reshape(2, 3)
    for M in (evjax.CSR.fromdense(dense), evjax.CSC.fromdense(dense), evjax.Dense(dense),
              evjax.FixedPostNumConn((1.0, np.zeros((2, 1), np.int32)), shape=(2, 3)),
              evjax.JITCScalarR(0.5, prob=0.2, seed=1, shape=(2, 3))):
        for axes in (None, (1, 0)):
            np.testing.assert_array_equal(np.asarray(M.transpose(axes).todense()), np.asarray(M.todense()).T)
        with pytest.raises(ValueError, match=rf"{type(M).__name__}\.transpose: axes must be None or \(1, 0\), "
                                             rf"got \(0, 1\)"):
            M.transpose((0, 1))


def test_event_arrays_behave_as_their_values():
    """brainevent's EventRepresentation API: size, len, indexing, iteration, with_value, NumPy arrays."""
    value = np.array([2, 0, 3])
    with pytest.raises(TypeError, match="not built directly; use evjax.BinaryArray"):
        evjax.EventRepresentation(value)
    for cls in (evjax.BinaryArray, evjax.WeightedArray):
        events = cls(value)
        assert events.shape == (3,) and events.ndim == 1 and events.size == 3 and len(events) == 3
        assert events[0] == 2 and [int(v) for v in events] == [2, 0, 3]
        np.testing.assert_array_equal(np.asarray(events), value)
        np.testing.assert_array_equal(np.asarray(events, dtype=np.float64), value.astype(np.float64))
        other = events.with_value(np.array([1, 1, 0]))
        assert type(other) is cls and other is not events
        np.testing.assert_array_equal(np.asarray(events.value), value)  # unchanged
        np.testing.assert_array_equal(np.asarray(other.value), [1, 1, 0])
    with pytest.raises(TypeError, match=r"len\(\) of a 0-d BinaryArray"):
        len(evjax.BinaryArray(np.array(True)))
    batch = evjax.BinaryArray(np.eye(3, 4, dtype=bool))
    assert batch.size == 12 and len(batch) == 3
    np.testing.assert_array_equal(np.asarray(batch[1]), np.eye(3, 4, dtype=bool)[1])
    cb = evjax.CompactBinary.from_array(jnp.array([False, True, True, False]))
    assert cb.size == 4 and "shape=(4,)" in repr(cb)
    again = cb.with_value(jnp.array([True, False, False, True]))
    assert type(again) is evjax.CompactBinary
    np.testing.assert_array_equal(np.asarray(again.active_ids[:int(again.n_active[0])]), [0, 3])
    light = evjax.CompactBinary.from_array_light(jnp.array([False, True])).with_value(jnp.array([True, True]))
    assert light.active_ids is None  # the same form: no list
    W = evjax.CSR.fromdense(np.arange(8, dtype=np.float32).reshape(4, 2))
    np.testing.assert_array_equal(np.asarray(again @ W), np.asarray(evjax.BinaryArray(again.value) @ W))


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------
def test_brainevent_error_names_are_evjax_errors():
    for name in ("BrainEventError", "KernelError", "KernelNotAvailableError", "KernelCompilationError",
                 "KernelFallbackExhaustedError", "KernelExecutionError", "KernelToolchainError", "CompilationError",
                 "KernelRegistrationError", "MathError", "UnsupportedOperationError"):
        cls = getattr(evjax, name)
        assert cls is getattr(errors, name) and issubclass(cls, errors.BrainEventError), name
    assert evjax.KernelNotAvailableError is errors.BackendNotAvailableError
    assert issubclass(errors.KernelNotFoundError, evjax.KernelFallbackExhaustedError)
    assert issubclass(evjax.KernelCompilationError, evjax.CompilationError)
    assert issubclass(evjax.UnsupportedOperationError, TypeError)
    assert issubclass(evjax.KernelToolchainError, ImportError)
    from evjax.backends.warp import WarpNotInstalledError
    assert issubclass(WarpNotInstalledError, evjax.KernelToolchainError)
    err = evjax.CompilationError("failed", compiler_output="out", command="cc k.c")
    assert (str(err), err.compiler_output, err.command, err.stage) == ("failed", "out", "cc k.c", "compile")


def test_except_brainevent_error_catches_evjax_kernel_errors():
    data, indices, indptr, _, shape = _csr()
    x = jnp.ones(shape[1], jnp.float32)
    with pytest.raises(evjax.BrainEventError, match="unknown backend"):
        evjax.csrmv(data, indices, indptr, x, shape=shape, backend="no_such_backend")
    op = XLACustomKernel("names_gpu_only")
    op.def_kernel("numba_cuda", "gpu", lambda outs, ins: (lambda x: [x]))
    with pytest.raises(evjax.KernelFallbackExhaustedError):
        op(jnp.ones(3), outs=[S((3,), jnp.float32)])
    broken = XLACustomKernel("names_broken")
    broken.def_kernel("alt", "cpu", lambda outs, ins: 1 / 0)
    with pytest.raises(evjax.BrainEventError) as info:
        broken(jnp.ones(3), outs=[S((3,), jnp.float32)])
    assert isinstance(info.value, evjax.KernelCompilationError) and info.value.stage == "compile"
    with pytest.raises(evjax.KernelRegistrationError, match="def_reference"):
        broken.def_kernel("reference", "cpu", lambda outs, ins: None)
    W = evjax.CSR(data, indices, indptr, shape=shape)
    with pytest.raises(evjax.UnsupportedOperationError, match="sparse @ sparse"):
        W @ W.T
    J = evjax.JITCScalarR(0.5, prob=0.2, seed=1, shape=(3, 3))
    with pytest.raises(TypeError, match="JITC @ JITC"):  # still a TypeError
        J @ J


# ---------------------------------------------------------------------------
# the catalogue of ops
# ---------------------------------------------------------------------------
def test_registry_lists_every_familys_ops():
    from evjax.primitives import compact, csr, delay, dense, fixed, jitc, plasticity, sparse_backward

    registry = evjax.get_registry()
    every = {op.name: op for family in (csr, dense, fixed, jitc, plasticity, delay, compact, sparse_backward)
             for op in family.OPS}
    assert registry == every
    assert evjax.get_all_primitive_names() == sorted(every) == list(registry)
    assert registry["evjax_binary_csrmv"] is evjax.binary_csrmv_p
    registry.clear()  # a copy
    assert evjax.get_registry()


def test_primitives_by_tags():
    by = evjax.get_primitives_by_tags
    assert sorted(by({"csr", "binary"})) == ["evjax_binary_csrmm", "evjax_binary_csrmv", "evjax_binary_csrmv_active"]
    assert set(by("compact")) == {"evjax_active_list"}
    assert set(by({"sparse_backward", "mv"})) == {"evjax_csrmv_nonzero", "evjax_densemv_nonzero"}
    from evjax.primitives import fixed

    assert set(by({"fixed"}).values()) == set(fixed.OPS)
    assert set(by({"jitc", "materialize"}).values()) == {evjax.jits_p, evjax.jitn_p, evjax.jitu_p}
    assert set(by({"normal", "mv"}).values()) == {evjax.jitnmv_p, evjax.binary_jitnmv_p}
    assert set(by("dense")) == {"evjax_binary_densemv", "evjax_binary_densemm", "evjax_binary_dense_outer"}
    assert set(by("plasticity").values()) == {evjax.update_csr_on_binary_pre_p, evjax.update_csr_on_binary_post_p,
                                              evjax.update_dense_on_binary_pre_p, evjax.update_dense_on_binary_post_p}
    assert set(by("delay")) == {"evjax_csr_delay_deliver", "evjax_csr_delay_gather"}
    assert by({"csr", "jitc"}) == {} and by(set()) == evjax.get_registry()
    for name in evjax.get_all_primitive_names():
        tags = evjax.catalog.primitive_tags(name)
        assert len(tags & {"csr", "dense", "jitc", "plasticity", "delay", "compact", "sparse_backward"}) == 1, \
            (name, tags)
        if "delay" not in tags:  # the delay ops take binary or weighted events alike (a per-call parameter)
            assert len(tags & {"binary", "float"}) == 1, (name, tags)
    with pytest.raises(TypeError):
        by({3})
    with pytest.raises(KeyError, match="no op named"):
        evjax.catalog.primitive_tags("csrmv")


# ---------------------------------------------------------------------------
# the migration page covers every public name of brainevent 0.3.0
# ---------------------------------------------------------------------------
def test_migration_page_names_all_174_brainevent_names():
    import pathlib
    import re

    here = pathlib.Path(__file__).resolve().parent
    names = [line.strip() for line in (here / "brainevent_0_3_0_names.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert len(names) == len(set(names)) == 174
    page = (here.parent / "docs" / "migrating_from_brainevent.md").read_text()
    missing = [n for n in names if not re.search(rf"`{n}[`(.]", page)]
    assert not missing, f"docs/migrating_from_brainevent.md does not name: {missing}"


def test_brainevents_retired_names_resolve_as_in_brainevent():
    """Renamed functions warn and are the new ones; removed ones raise an AttributeError naming the
    replacement; an unknown name is a plain AttributeError; importing evjax warns of nothing."""
    for old, new in (("csr_on_pre", "update_csr_on_binary_pre"), ("csr2csc_on_post", "update_csr_on_binary_post"),
                     ("dense_on_pre", "update_dense_on_binary_pre"), ("dense_on_post", "update_dense_on_binary_post")):
        with pytest.warns(DeprecationWarning, match=f"evjax.{old} is deprecated.*evjax.{new}"):
            assert getattr(evjax, old) is getattr(evjax, new)
    for old, token in (("COO", "CSR"), ("binary_coomm_p", "coo2csr"), ("bitpack_binary_fcnmv", "fcnmv"),
                       ("compact_binary_fcnmm_p", "CompactBinary"), ("CscLayout", "FixedNumPerPost")):
        with pytest.raises(AttributeError, match=token):
            getattr(evjax, old)
    with pytest.raises(AttributeError, match="^module 'evjax' has no attribute 'not_a_name'$"):
        evjax.not_a_name  # noqa: B018
    import subprocess
    import sys
    subprocess.run([sys.executable, "-W", "error::DeprecationWarning:evjax", "-c", "import evjax"], check=True,
                   timeout=300)


# ---------------------------------------------------------------------------
# brainevent's names of the pure-JAX implementation
# ---------------------------------------------------------------------------
def _bound_choices(f, *args):
    """The ``backend`` parameter of every evjax op ``f`` binds (nested jaxprs included)."""
    eqns = equations(jax.make_jaxpr(f)(*args).jaxpr)
    return [e.params["backend"] for e in eqns if e.primitive.name.startswith("evjax_")]


@pytest.mark.parametrize("name", ["jax", "jax_raw"])
def test_brainevents_names_of_the_reference_run_the_reference(name):
    data, indices, indptr, dense, shape = _csr()
    x = jnp.asarray(RNG.standard_normal(shape[1]), jnp.float32)
    expected = evjax.csrmv(data, indices, indptr, x, shape=shape, backend=REF)
    # per call, through a function and a class
    f = lambda d: evjax.csrmv(d, indices, indptr, x, shape=shape, backend=name)  # noqa: E731
    assert [c.per_call for c in _bound_choices(f, data)] == [REF]
    np.testing.assert_array_equal(f(data), expected)
    W = evjax.CSR((data, indices, indptr), shape=shape, backend=name)
    assert [c.per_call for c in _bound_choices(lambda v: W @ v, x)] == [REF]
    # in a block, globally, as an op's default, in the resolver
    with evjax.use_backend(name):
        assert evjax.config.choices_snapshot() == (("cpu", REF), ("gpu", REF))
    evjax.set_backend(name)
    try:
        assert evjax.config.choices_snapshot() == (("cpu", REF), ("gpu", REF))
    finally:
        evjax.set_backend(None)
    assert evjax.csrmv_p.resolve_backend("cpu", name) == REF
    op = XLACustomKernel(f"alias_default_{name}")
    op.def_kernel("numba", "cpu", lambda **kw: None)
    op.def_reference(lambda x, *, outs: [x])
    op.set_default("cpu", name)
    assert op.default_backend("cpu") == REF
    # the neuron ops (pure JAX) take it too
    v = jnp.zeros(3)
    np.testing.assert_array_equal(evjax.lif_step(v, v + 2.0, backend=name)[0], evjax.lif_step(v, v + 2.0)[0])
