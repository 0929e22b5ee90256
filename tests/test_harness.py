"""Tests of the property harness itself (evjax.testing): planted bugs it must catch.

Each planted bug is a deliberately broken copy of a real op (or of its
wrapper); the harness must fail on it with an AssertionError that names the
check, and pass on the correct copy, on the same arguments.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st

import evjax
from evjax import XLACustomKernel, registry
from evjax.primitives import csr
from evjax.rules import ad as ad_rules
from evjax.rules import batching as batching_rules
from evjax.testing import (
    PROFILES, OpSpec, check_all, check_backend, check_forward, check_vmap, csr_resampler, property_test,
    random_csr, redraw, register_profiles, vmap_cases,
)
from tests.helpers import csr_matmul_spec, structural_matmul

S = jax.ShapeDtypeStruct
SHAPE = (5, 4)


def csr_example(seed=0, nnz=9, rank=1):
    rng = np.random.default_rng(seed)
    indices, indptr = random_csr(rng, *SHAPE, nnz)
    data = rng.uniform(0.5, 1.5, nnz).astype(np.float32)
    x = rng.standard_normal((SHAPE[1],) if rank == 1 else (SHAPE[1], 2)).astype(np.float32)
    return data, indices, indptr, x, SHAPE


# ---------------------------------------------------------------------------
# a copy of csrmv whose batching rule reuses the first batch element's structure
# ---------------------------------------------------------------------------
def csrmv_copy(name, first_structure_only):
    """csrmv's Numba kernel in a new op; its batching rule loops over the batch, correctly or not."""
    op = XLACustomKernel(name)
    op.def_kernel("numba", "cpu", csr.csrmv_p.kernel_generator("cpu", "numba"))
    op.def_reference(lambda d, i, p, x, *, outs, shape, transpose: [
        structural_matmul(d, i, p, x, shape, transpose, False).astype(outs[0].dtype)])
    op.def_jvp_rule2(*ad_rules.linear_jvp_rules(op, 4, (0, 3)))
    op.def_transpose_rule(ad_rules.linear_transpose_rule({
        # y = A(w) x:  x_bar = A.T y_bar,  w_bar_k = y_bar[row k] x[indices[k]]
        0: lambda cts, d, i, p, x, *, outs, shape, transpose, backend: csr.csr_sddmm(
            i, p, cts[0], x, shape=shape, backend=backend),
        3: lambda cts, d, i, p, x, *, outs, shape, transpose, backend: evjax.csrmv(
            d, i, p, cts[0], shape=shape, transpose=True, backend=backend),
    }))

    def batching(args, axes, **params):
        args, axes, size = list(args), list(axes), batching_rules.batch_size(args, axes)
        if first_structure_only:  # the planted bug: element 0's indices and indptr for the whole batch
            for k in (1, 2):
                if axes[k] is not None:
                    args[k], axes[k] = jnp.take(args[k], 0, axis=axes[k]), None
        if all(a is None for a in axes):
            (y,) = op.primitive.bind(*args, **params)
            return [jnp.broadcast_to(y, (size,) + y.shape)], [0]
        return batching_rules.sequential_batch(op.primitive, args, axes, **params)

    op.def_batching_rule(batching)

    def fn(d, i, p, x, shape):
        return op(d, i, p, x, outs=[S((shape[0],), x.dtype)], shape=shape, transpose=False, backend="numba")[0]

    return OpSpec(fn=fn, reference=lambda d, i, p, x, shape: structural_matmul(d, i, p, x, shape, False, False),
                  diff_argnums=(0, 3), static_argnums=(4,), backend="numba",
                  resample=csr_resampler(indices=1, indptr=2, shape=4), batch_size=3, name=name)


CORRECT = csrmv_copy("harness_csrmv_correct", False)
FIRST_STRUCTURE = csrmv_copy("harness_csrmv_first_structure", True)


def test_the_planted_structure_bug_fails_vmap_over_indices_and_over_indptr():
    args = csr_example()
    check_vmap(CORRECT, args)  # the same loop without the bug passes
    for argnum in (1, 2):
        spec = csrmv_copy(f"harness_first_structure_{argnum}", True)
        spec.vmap_argnums = (argnum,)
        with pytest.raises(AssertionError, match=rf"jit\(vmap\) in_axes {{arg {argnum}: 0}}"):
            check_vmap(spec, args)


def test_the_planted_structure_bug_fails_check_all_and_a_property_test():
    with pytest.raises(AssertionError, match="vmap"):
        check_all(FIRST_STRUCTURE, csr_example(seed=1))
    spec = csrmv_copy("harness_first_structure_property", True)
    settings.register_profile("harness-no-shrink", settings.get_profile("default"), phases=[Phase.generate])
    settings.load_profile("harness-no-shrink")  # the default profile's examples, without the slow shrinking
    try:
        with pytest.raises(AssertionError, match="vmap"):
            property_test(spec, st.integers(0, 2**16).map(csr_example))()
    finally:
        register_profiles()


def test_batch_elements_get_their_own_valid_structures():
    rng = np.random.default_rng(0)
    args = csr_example()
    data, indices, indptr, x, shape = args
    resample = csr_resampler(indices=1, indptr=2, shape=4)
    seen_indices, seen_indptr = set(), set()
    for argnums in [(1,), (2,), (1, 2)]:
        for _ in range(5):
            new = resample(rng, args, argnums)
            i, p = new[1], new[2]
            assert i.shape == indices.shape and p.shape == indptr.shape and i.dtype == indices.dtype
            assert p[0] == 0 and p[-1] == len(i) and np.all(np.diff(p) >= 0) and np.all((0 <= i) & (i < shape[1]))
            assert (1 in argnums) or np.array_equal(i, indices)  # what is not batched is kept
            assert (2 in argnums) or np.array_equal(p, indptr)
            seen_indices.add(i.tobytes())
            seen_indptr.add(p.tobytes())
    assert len(seen_indices) > 3 and len(seen_indptr) > 3


def test_vmap_over_an_integer_argument_needs_resample():
    spec = csr_matmul_spec(1, False, False, "reference")
    spec.resample = None
    with pytest.raises(ValueError, match="resample"):
        check_vmap(spec, csr_example())
    with pytest.raises(ValueError, match="integer argument"):
        redraw(np.random.default_rng(0), csr_example(), (1,))


# ---------------------------------------------------------------------------
# dtypes, output axes, backends
# ---------------------------------------------------------------------------
def test_a_wrong_result_dtype_fails_before_values():
    data, indices, indptr, x, shape = csr_example()
    args = (data.astype(np.float16), indices, indptr, x.astype(np.float16), shape)
    right = csr_matmul_spec(1, False, False, "numba")
    check_forward(right, args)
    wrong = csr_matmul_spec(1, False, False, "numba")  # forgets to round the float32 result back to float16
    wrong.fn = lambda d, i, p, x, shape: evjax.csrmv(d.astype(jnp.float32), i, p, x.astype(jnp.float32),
                                                     shape=shape, backend="numba")
    with pytest.raises(AssertionError, match="eager forward.*dtype float32 != expected float16"):
        check_forward(wrong, args)


def doubling_op(name, reports_axis_zero):
    """y = 2 x elementwise, with a batching rule that reports its output axis right or always as 0."""
    op = XLACustomKernel(name)
    op.def_reference(lambda x, *, outs: [2 * x])

    def batching(args, axes, *, outs, **params):
        (x,), (axis,) = args, axes
        return [2 * x], [0 if reports_axis_zero else axis]  # the bug: the batch stays where it came in

    op.def_batching_rule(batching)
    return OpSpec(fn=lambda x: op(x, outs=[S(x.shape, x.dtype)], backend="reference")[0],
                  reference=lambda x: 2 * x, backend="reference", batch_size=3, name=name)


def test_a_wrong_output_batch_axis_fails():
    x = np.arange(9, dtype=np.float32).reshape(3, 3)  # square, batch of 3: only the values can tell
    check_vmap(doubling_op("harness_doubling", False), (x,))
    with pytest.raises(AssertionError, match=r"in_axes {arg 0: 1}"):
        check_vmap(doubling_op("harness_doubling_axis_zero", True), (x,))


def test_a_backend_that_did_not_run_fails():
    args = csr_example()
    assert check_backend(csr_matmul_spec(1, False, False, "numba"), args) == {"numba"}
    assert check_backend(csr_matmul_spec(1, False, False, "reference"), args) == {"reference"}
    falls_back = csr_matmul_spec(1, False, False, "numba")  # the wrapper quietly picks the reference
    falls_back.fn = lambda d, i, p, x, shape: evjax.csrmv(d, i, p, x, shape=shape, backend="reference")
    with pytest.raises(AssertionError, match="asked for backend 'numba', but the program binds evjax_csrmv"):
        check_backend(falls_back, args)
    runs_numba = csr_matmul_spec(1, False, False, "reference")  # the spec says reference, numba runs
    runs_numba.fn = lambda d, i, p, x, shape: evjax.csrmv(d, i, p, x, shape=shape, backend="numba")
    with pytest.raises(AssertionError, match="backend 'reference'"):
        check_backend(runs_numba, args)


def test_a_kernel_backend_that_lowers_to_plain_jax_fails():
    op = XLACustomKernel("harness_fake_numba")
    op.def_kernel("numba", "cpu", lambda outs, ins: (lambda x: [2 * x]))  # registered as numba, runs no kernel
    op.def_reference(lambda x, *, outs: [2 * x])
    spec = OpSpec(fn=lambda x: op(x, outs=[S(x.shape, x.dtype)], backend="numba")[0], reference=lambda x: 2 * x,
                  backend="numba", name="fake_numba")
    with pytest.raises(AssertionError, match="calls none of its kernels"):
        check_backend(spec, (np.ones(3, np.float32),))


def test_a_missing_backend_is_a_skip_not_a_pass(monkeypatch):
    monkeypatch.setitem(registry._missing, "warp", "warp is not installed (pip install warp-lang)")
    spec = csr_matmul_spec(1, False, False, "warp")
    with pytest.raises(pytest.skip.Exception, match="backend 'warp' cannot run here"):
        check_all(spec, csr_example())
    test = property_test(lambda b: csr_matmul_spec(1, False, False, b), None, backends=["warp"])
    with pytest.raises(pytest.skip.Exception):
        test("warp")


def test_property_tests_are_one_per_backend_named_by_it():
    test = property_test(lambda b: csr_matmul_spec(1, False, False, b), None, backends=["numba", "reference"])
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    assert mark.args == ("backend", ["numba", "reference"])


# ---------------------------------------------------------------------------
# vmap cases, non-finite mode, profiles
# ---------------------------------------------------------------------------
def test_vmap_cases_cover_negative_axes_pytrees_and_out_axes():
    spec = csr_matmul_spec(2, False, True, "reference")
    data, indices, indptr, x, shape = csr_example(rank=2)
    cases = vmap_cases(spec, (data, indices, np.zeros(shape[0] + 1, np.int32), np.zeros((shape[0], 2)), shape))
    in_axes = {(i, a) for c in cases for i, a in c.in_axes}
    assert {(3, 0), (3, 1), (3, -1), (1, -1), (2, 0), (0, -1)} <= in_axes
    assert {c.out_axes for c in cases} == {0, 1, -1}
    (tree,) = [c for c in cases if c.pytree]
    assert tree.argnums == (0, 1, 2, 3)


def where_events(d, i, p, e, shape):
    return structural_matmul(d, i, p, e, shape, True, True)


def multiply_events(d, i, p, e, shape):  # the planted bug: w * e, so inf * 0 = NaN for silent events
    rows = jnp.sum(jnp.arange(i.shape[0])[:, None] >= p[None, 1:], axis=1)
    return jax.ops.segment_sum(d * e[rows].astype(d.dtype), i, num_segments=shape[1])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nonfinite_mode_catches_multiplied_events():
    rng = np.random.default_rng(2)
    indices, indptr = random_csr(rng, *SHAPE, 9)
    spikes = np.array([False, True, True, False, False])  # row 0 (6 of the 9 weights) silent
    args = (np.ones(9, np.float32), indices, indptr, spikes, SHAPE)
    spec = OpSpec(fn=where_events, reference=where_events, diff_argnums=(0,), static_argnums=(4,), nonfinite=True,
                  resample=csr_resampler(indices=1, indptr=2, shape=4), name="select")
    check_all(spec, args)
    spec.fn = multiply_events
    with pytest.raises(AssertionError, match="NaN positions differ"):
        check_all(spec, args, skip=("vmap", "nested_vmap", "jit_grad_vmap"))


def test_assert_close_compares_nonfinite_values_exactly():
    from evjax.testing import assert_close

    ref = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert_close(ref.copy(), ref)
    for bad in ([np.nan, np.inf, np.inf, 1.0], [0.0, np.inf, -np.inf, 1.0], [np.nan, np.nan, -np.inf, 1.0]):
        with pytest.raises(AssertionError):
            assert_close(np.array(bad, np.float32), ref)


def test_profiles_set_the_number_of_examples(monkeypatch):
    try:
        for name, count in PROFILES.items():
            monkeypatch.setenv("HYPOTHESIS_PROFILE", name)
            assert register_profiles() == name and settings().max_examples == count
            assert settings().derandomize is False and settings().deadline is None
        with pytest.raises(ValueError, match="unknown Hypothesis profile"):
            register_profiles("fast")
    finally:
        monkeypatch.undo()
        register_profiles()
    assert PROFILES["thorough"] >= 100 > PROFILES["default"]


def test_testing_docs_run():
    from .doc_runner import run_markdown

    run_markdown("docs/testing.md")


def test_the_harness_clears_jax_caches_before_the_process_runs_out_of_memory_mappings(monkeypatch):
    # thorough runs compile thousands of programs: XLA crashed at the kernel's mapping limit
    from evjax import _testing_core as core

    cleared = []
    monkeypatch.setattr(core.jax, "clear_caches", lambda: cleared.append(True))
    monkeypatch.setattr(core, "_uses", 0)
    monkeypatch.setattr(core, "MAX_MAPPINGS", 10**9)
    for _ in range(core.CHECK_EVERY):
        core._relieve_mappings()
    assert cleared == []
    if core._mappings() == 0:
        pytest.skip("no /proc/self/maps here")
    monkeypatch.setattr(core, "MAX_MAPPINGS", 1)
    for _ in range(core.CHECK_EVERY):
        core._relieve_mappings()
    assert cleared == [True]


# ---------------------------------------------------------------------------
# reference programs shared between specs
# ---------------------------------------------------------------------------
class Traces:
    """Counts a reference's traces; hashed by identity, so a closure over it can be a sharing key."""

    def __init__(self):
        self.count = 0


def scaled_reference(factor, traces):
    """A reference ``x * factor`` that counts its traces (a Python side effect runs only when traced)."""
    def reference(x):
        traces.count += 1
        return x * factor

    return reference


def test_specs_with_the_same_reference_share_its_programs():
    traces = Traces()
    x = np.arange(3.0, dtype=np.float32)
    specs = [OpSpec(fn=lambda x: x * 2.0, reference=scaled_reference(2.0, traces), diff_argnums=(0,),
                    name=f"backend {k}") for k in range(3)]
    for spec in specs:  # one spec per backend around the same reference: one compile
        np.testing.assert_array_equal(spec.expected((x,)), x * 2.0)
    assert traces.count == 2  # the program's trace, and the output dtypes' eval_shape inside it
    np.testing.assert_array_equal(specs[2].expected((x + 1,)), (x + 1) * 2.0)  # same shapes: no trace
    assert traces.count == 2


def test_specs_whose_references_differ_do_not_share():
    traces = Traces()
    x = np.arange(3.0, dtype=np.float32)
    for factor in (2.0, 3.0):  # the same code, another closure value
        spec = OpSpec(fn=lambda x: x, reference=scaled_reference(factor, traces), name=f"times {factor}")
        np.testing.assert_array_equal(spec.expected((x,)), x * factor)
    assert traces.count == 4
    unhashable = np.float32([4.0])  # an array in the closure: shared only by the same function object
    for _ in range(2):
        spec = OpSpec(fn=lambda x: x, reference=lambda x: x * unhashable[0])
        np.testing.assert_array_equal(spec.expected((x,)), x * 4.0)
    unhashable[0] = 5.0
    spec = OpSpec(fn=lambda x: x, reference=lambda x: x * unhashable[0])
    np.testing.assert_array_equal(spec.expected((x,)), x * 5.0)
    # values count with their types: x * 2 keeps an integer dtype, x * 2.0 does not
    ints = np.arange(3, dtype=np.int32)
    for factor in (2, 2.0):
        spec = OpSpec(fn=lambda x: x, reference=scaled_reference(factor, traces))
        assert spec.expected((ints,)).dtype == np.asarray(jnp.asarray(ints) * factor).dtype
    # the output dtype rule is part of the key
    spec = OpSpec(fn=lambda x: x, reference=scaled_reference(2.0, traces), out_dtype=lambda x: np.float16)
    assert spec.expected((x,)).dtype == np.float16
