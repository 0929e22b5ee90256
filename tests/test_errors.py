"""evjax.errors and the diagnostics of XLACustomKernel: registration, generators, lowering, ``outs``."""
from __future__ import annotations

import ast
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax import XLACustomKernel, errors, registry
from evjax.errors import BackendNotAvailableError, KernelCompilationError, KernelError, KernelNotFoundError

S = jax.ShapeDtypeStruct
F3 = [S((3,), jnp.float32)]


def _double_reference(x, *, outs):
    return [x * 2]


def _chain(err):
    """``err`` and the exceptions it was raised from (JAX inserts its own stack-trace note in between)."""
    while err is not None:
        yield err
        err = err.__cause__ or err.__context__


# ---------------------------------------------------------------------------
# the hierarchy
# ---------------------------------------------------------------------------
def test_hierarchy_subclasses_the_builtins_users_catch():
    assert issubclass(KernelCompilationError, KernelError) and issubclass(KernelCompilationError, RuntimeError)
    assert issubclass(BackendNotAvailableError, KernelError) and issubclass(BackendNotAvailableError, ValueError)
    assert issubclass(KernelNotFoundError, BackendNotAvailableError)
    assert issubclass(KernelNotFoundError, NotImplementedError)  # what the resolver raised before
    assert not issubclass(KernelCompilationError, ValueError) and not issubclass(BackendNotAvailableError, RuntimeError)
    assert evjax.errors is errors and "errors" in evjax.__all__
    assert set(errors.__all__) == {n for n, v in vars(errors).items() if inspect.isclass(v)}


def test_errors_module_imports_nothing():
    tree = ast.parse(inspect.getsource(errors))
    imported = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [node.module for node in imported] == ["__future__"]


# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------
def test_def_kernel_with_a_bad_platform_backend_or_default_type_raises_type_error():
    op = XLACustomKernel("err_registration")
    gen = lambda outs, ins: (lambda x: [x])  # noqa: E731
    for bad_platform in (3, None, ("cpu",), b"cpu"):
        with pytest.raises(TypeError, match="platform must be 'cpu' or 'gpu'"):
            op.def_kernel("numba", bad_platform, gen)
    for bad_backend in (3, None, ""):
        with pytest.raises(TypeError, match="backend name is a non-empty string"):
            op.def_kernel(bad_backend, "cpu", gen)
    with pytest.raises(TypeError, match="default must be True, False or None, got 'yes'"):
        op.def_kernel("numba", "cpu", gen, default="yes")
    with pytest.raises(TypeError, match="default must be"):
        op.def_numba_kernel(gen, default=1)
    with pytest.raises(TypeError, match="must be callable"):
        op.def_kernel("numba", "cpu", 42)
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        op.def_kernel("numba", "tpu", gen)
    with pytest.raises(TypeError, match="backend table"):
        op.declare_backends({"numba": lambda: None}, {"numba": "cpu"})
    with pytest.raises(TypeError, match="loaders must be"):
        op.declare_backends("some.package", {"numba": {"cpu": True}})
    with pytest.raises(TypeError, match=r"backends \['warp'\] of the table have no loader"):
        op.declare_backends({"numba": lambda: None}, {"warp": {"cpu": True}})
    assert op.backends("cpu") == []  # nothing was registered by the failed calls
    with pytest.raises(TypeError, match="a platform is a string"):
        op.backends(0)
    with pytest.raises(TypeError, match="a platform is a string"):
        evjax.set_backend(0, "numba")


# ---------------------------------------------------------------------------
# kernel generators
# ---------------------------------------------------------------------------
def test_an_exception_in_a_generator_names_op_platform_backend_and_alternatives():
    op = XLACustomKernel("err_generator")
    calls = []

    def broken(outs, ins, factor):
        calls.append(factor)
        raise ZeroDivisionError("the generator's own message")

    op.def_kernel("alt", "cpu", broken)
    op.def_kernel("other", "cpu", lambda outs, ins, factor: (lambda x: [x * 3]), default=False)
    op.def_reference(lambda x, *, outs, factor: _double_reference(x, outs=outs))
    with pytest.raises(KernelCompilationError) as info:
        op(jnp.ones(3), outs=F3, backend="alt", factor=2)
    message = str(info.value)
    for part in ("op 'err_generator'", "backend 'alt'", "on cpu", "ZeroDivisionError",
                 "the generator's own message", "float32[3]", "['other', 'reference']"):
        assert part in message, (part, message)
    assert isinstance(info.value, RuntimeError)
    assert any(isinstance(e, ZeroDivisionError) for e in _chain(info.value))  # raised from the original
    # nothing was cached: the generator runs again, and the other backends still work
    with pytest.raises(KernelCompilationError):
        op(jnp.ones(3), outs=F3, backend="alt", factor=2)
    assert calls == [2, 2]
    np.testing.assert_array_equal(op(jnp.ones(3), outs=F3, backend="other", factor=2)[0], [3, 3, 3])
    np.testing.assert_array_equal(op(jnp.ones(3), outs=F3, backend="reference", factor=2)[0], [2, 2, 2])
    with pytest.raises(KernelCompilationError, match="raised ZeroDivisionError"):
        op.kernel_for("cpu", "alt", [S((3,), jnp.float32)], F3, {"factor": 5})


def test_a_kernel_error_from_a_generator_is_not_rewrapped():
    op = XLACustomKernel("err_generator_refuses")

    def refuses(outs, ins):
        raise BackendNotAvailableError("err_generator_refuses: too large for this backend; use another")

    op.def_kernel("alt", "cpu", refuses)
    with pytest.raises(BackendNotAvailableError, match="^err_generator_refuses: too large for this backend"):
        op(jnp.ones(3), outs=F3)


def test_a_generator_returning_no_kernel_is_a_compilation_error():
    op = XLACustomKernel("err_generator_none")
    op.def_kernel("alt", "cpu", lambda outs, ins: None)
    with pytest.raises(KernelCompilationError, match="err_generator_none.*'alt'.*returned NoneType, not a callable"):
        op(jnp.ones(3), outs=F3)


# ---------------------------------------------------------------------------
# backends that cannot run
# ---------------------------------------------------------------------------
def test_lowering_with_no_kernel_and_no_reference_names_the_op_and_its_platforms():
    op = XLACustomKernel("err_gpu_only")
    op.def_kernel("numba_cuda", "gpu", lambda outs, ins: (lambda x: [x]))
    with pytest.raises(KernelNotFoundError, match="'err_gpu_only' has no backend for platform 'cpu'.*on: \\['gpu'\\]"):
        op(jnp.ones(3), outs=F3)
    with pytest.raises(KernelNotFoundError, match="err_gpu_only"):
        jax.jit(lambda x: op(x, outs=F3)[0]).lower(jnp.ones(3))
    empty = XLACustomKernel("err_nothing")
    with pytest.raises(KernelNotFoundError, match="'err_nothing'.*on: no platform"):
        empty(jnp.ones(3), outs=F3)


def test_unavailable_backends_raise_backend_not_available(monkeypatch):
    op = XLACustomKernel("err_unavailable")
    op.def_kernel("warp", "cpu", lambda outs, ins: (lambda x: [x]), default=False)
    op.def_reference(_double_reference)
    with pytest.raises(BackendNotAvailableError, match="no backend 'numba_cuda'"):
        op(jnp.ones(3), outs=F3, backend="numba_cuda")
    with pytest.raises(BackendNotAvailableError, match="unknown backend 'numbaa'"):
        op(jnp.ones(3), outs=F3, backend="numbaa")
    with pytest.raises(BackendNotAvailableError, match="unknown backend 'numbaa'"):
        evjax.set_backend("numbaa")
    with pytest.raises(BackendNotAvailableError, match="has no backend 'alt' on cpu"):
        op.set_default("cpu", "alt")
    with pytest.raises(BackendNotAvailableError, match="has no backend 'reference' on cpu"):
        op.kernel_generator("cpu", "reference")
    monkeypatch.setitem(registry._missing, "warp", "warp is not installed")
    with pytest.raises(BackendNotAvailableError, match="backend 'warp' .*not available on cpu: warp is not installed"):
        op(jnp.ones(3), outs=F3, backend="warp")
    with pytest.raises(ValueError):  # still caught as before
        op(jnp.ones(3), outs=F3, backend="warp")


# ---------------------------------------------------------------------------
# outs
# ---------------------------------------------------------------------------
def test_negative_or_non_integer_output_sizes_name_outs():
    op = XLACustomKernel("err_outs")
    op.def_reference(_double_reference)
    with pytest.raises(ValueError, match="op 'err_outs': outs\\[0\\] has shape \\(-3,\\); dimensions must be >= 0"):
        op(jnp.ones(3), outs=[S((-3,), jnp.float32)])
    with pytest.raises(ValueError, match="outs\\[1\\] has shape \\(3, -1\\)"):
        op(jnp.ones(3), outs=[S((3,), jnp.float32), S((3, -1), jnp.float32)])

    class Spec:  # an array-like spec whose size is not an integer
        shape, dtype = (2.5,), np.float32

    with pytest.raises(ValueError, match="outs\\[0\\].*must be an integer, got float 2.5"):
        op(jnp.ones(3), outs=[Spec()])
    Spec.shape = (np.int64(3),)  # NumPy integers are integers
    np.testing.assert_array_equal(op(jnp.ones(3), outs=[Spec()])[0], [2, 2, 2])
    with pytest.raises(ValueError, match="numba_kernel: outs\\[0\\] has shape \\(-1,\\)"):
        evjax.numba_kernel(_njit_copy(), outs=S((-1,), jnp.float32))


def _njit_copy():
    import numba

    @numba.njit
    def copy(x, out):
        out[:] = x

    return copy


def test_unknown_backend_error_lists_brainevents_names_of_the_reference():
    import evjax

    with pytest.raises(ValueError, match="unknown backend 'jaxx'.*brainevent's 'jax_raw', 'jax' for 'reference'"):
        with evjax.use_backend("jaxx"):
            pass
