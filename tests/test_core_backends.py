"""Core v2: one backend resolver, strict names, the choice in JAX's config state (honoured under jit),
the lazily chosen GPU default, and import hygiene."""
import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax import XLACustomKernel, registry
from evjax.primitives import csr
from tests.helpers import HANG_GUARD_S

S = jax.ShapeDtypeStruct
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAGS = {"numba": 0.0, "alt": 1000.0, "warp": 2000.0, "numba_cuda": 3000.0, "reference": -1000.0}


def tagging(tag):
    """A generator whose kernel returns ``x + tag``: which backend ran shows in the result."""
    return lambda outs, ins: (lambda x: [x + TAGS[tag]])


def op_tagged_by_backend(name, *gpu):
    op = XLACustomKernel(name)
    op.def_kernel("numba", "cpu", tagging("numba"))
    op.def_kernel("alt", "cpu", tagging("alt"), default=False)
    for backend in gpu:
        op.def_kernel(backend, "gpu", tagging(backend))
    op.def_reference(lambda x, outs: [x + TAGS["reference"]])
    return op


OP = op_tagged_by_backend("core_tagged")


def ran(y) -> str:
    """The backend whose tag ``y`` carries."""
    (name,) = [k for k, v in TAGS.items() if float(np.asarray(y).ravel()[0]) == v]
    return name


def call(x, **kw):
    return OP(x, outs=[S(x.shape, x.dtype)], **kw)[0]


X = jnp.zeros(3, jnp.float32)


@pytest.fixture(autouse=True)
def no_global_choice():
    evjax.set_backend(None)
    yield
    evjax.set_backend(None)


# ---------------------------------------------------------------------------
# strict names
# ---------------------------------------------------------------------------
def test_unknown_names_raise_everywhere():
    w = csr.CSR.fromdense(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError, match="unknown backend 'numbaa'; known backends: .*numba"):
        evjax.csrmv(w.data, w.indices, w.indptr, np.ones(3, np.float32), shape=w.shape, backend="numbaa")
    with pytest.raises(ValueError, match="unknown backend 'numbaa'"):
        with evjax.use_backend("numbaa"):
            pass
    for args in (("numbaa",), ("gpu", "numbaa")):
        with pytest.raises(ValueError, match="unknown backend 'numbaa'"):
            evjax.set_backend(*args)
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        evjax.config.set_backend("tpu", "numba")
    with pytest.raises(ValueError, match="op 'core_tagged' has no backend 'warp'"):
        call(X, backend="warp")
    assert evjax.config.get_backend("cpu") is None  # nothing was set by the failed calls


def test_per_call_backend_must_exist_on_the_platform():
    gpu_only = op_tagged_by_backend("core_gpu_only", "numba_cuda")
    with pytest.raises(ValueError, match="no backend 'numba_cuda' on cpu.*available on cpu: \\['alt', 'numba', "
                                         "'reference'\\]"):
        gpu_only(X, outs=[S((3,), jnp.float32)], backend="numba_cuda")


def test_an_unavailable_backend_raises_naming_op_platform_and_alternatives(monkeypatch):
    op = op_tagged_by_backend("core_with_warp")
    op.def_kernel("warp", "cpu", tagging("warp"), default=False)
    monkeypatch.setitem(registry._missing, "warp", "warp is not installed (pip install 'evjax[warp]' (warp-lang))")
    assert op.available_backends("cpu") == ["alt", "numba", "reference"]
    assert op.backends("cpu") == ["alt", "numba", "warp", "reference"]
    message = "op 'core_with_warp': backend 'warp' .* not available on cpu: warp is not installed.*Available on cpu"
    with pytest.raises(ValueError, match=message):
        op(X, outs=[S((3,), jnp.float32)], backend="warp")
    with pytest.raises(ValueError, match=message):  # a block's choice the op has but cannot run
        with evjax.use_backend("warp"):
            op(X, outs=[S((3,), jnp.float32)])


def test_no_backend_and_no_reference_says_which_op_and_platforms():
    bare = XLACustomKernel("core_bare")
    bare.def_kernel("numba_cuda", "gpu", tagging("numba_cuda"))
    with pytest.raises(NotImplementedError, match="core_bare.*no backend for platform 'cpu'.*on: \\['gpu'\\]"):
        bare(X, outs=[S((3,), jnp.float32)])


def test_gpu_default_is_chosen_lazily_from_what_is_installed(monkeypatch):
    for missing, expected in [((), "warp"), (("warp",), "numba_cuda"), (("warp", "numba_cuda"), "reference")]:
        op = op_tagged_by_backend(f"core_gpu_{expected}", "warp", "numba_cuda")  # registered while all look installed
        for name in missing:
            monkeypatch.setitem(registry._missing, name, f"{name} is not installed")
        assert op.default_backend("gpu") == expected and op.resolve_backend("gpu") == expected
        assert op.defaults == {"cpu": "numba", "gpu": expected}
        monkeypatch.undo()
    assert csr.csrmv_p.defaults["cpu"] == "numba"
    assert csr.csrmv_p.available_backends("gpu") == ["numba_cuda", "warp", "reference"]


def test_warp_is_the_cpu_default_only_without_another_cpu_candidate():
    op = XLACustomKernel("core_warp_first")
    op.def_warp_kernel(tagging("warp"))
    assert op.defaults == {"cpu": "warp", "gpu": "warp"}
    op.def_numba_kernel(tagging("numba"))
    assert op.defaults == {"cpu": "numba", "gpu": "warp"}


def test_registration_arguments_are_checked():
    op = XLACustomKernel("core_checked")
    with pytest.raises(TypeError, match="platform must be 'cpu' or 'gpu'"):
        op.def_kernel("numba", 3, tagging("numba"))
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        op.def_kernel("numba", "tpu", tagging("numba"))
    with pytest.raises(TypeError, match="backend name is a non-empty string"):
        op.def_kernel(None, "cpu", tagging("numba"))
    with pytest.raises(TypeError, match="must be callable"):
        op.def_kernel("numba", "cpu", "not a generator")


# ---------------------------------------------------------------------------
# the choice in JAX's config state: honoured under jit, no cache cleared
# ---------------------------------------------------------------------------
def test_use_backend_around_jit_retraces_and_keeps_each_choice(monkeypatch):
    monkeypatch.setattr(jax, "clear_caches", lambda: pytest.fail("evjax cleared JAX's caches"))
    traces = []

    def f(x):
        traces.append(1)
        return call(x)

    before = jax.jit(f)
    assert ran(before(X)) == "numba"  # jitted before the block
    with evjax.use_backend("reference"):
        assert ran(before(X)) == "reference"  # ... is retraced inside it
        inside = jax.jit(f)
        assert ran(inside(X)) == "reference"  # first jitted inside
        with evjax.use_backend("alt", platform="cpu"):
            assert ran(inside(X)) == "alt"  # the innermost block wins
        assert ran(call(X, backend="numba")) == "numba"  # per call beats the block
    assert ran(inside(X)) == "numba" and ran(before(X)) == "numba"  # after the block: the default again
    n = len(traces)
    with evjax.use_backend("reference"):
        assert ran(before(X)) == "reference"
    assert len(traces) == n  # each choice keeps its compiled version


def test_use_backend_inside_a_traced_function_applies_to_ops_traced_after_it():
    @jax.jit
    def f(x):
        with evjax.use_backend("reference"):
            a = call(x)
        return a, call(x)

    a, b = f(X)
    assert (ran(a), ran(b)) == ("reference", "numba")


def test_set_backend_both_forms_and_retrace():
    f = jax.jit(lambda x: call(x))
    assert ran(f(X)) == "numba"
    evjax.config.set_backend("cpu", "alt")  # brainevent's form
    assert evjax.config.get_backend("cpu") == "alt" and evjax.config.get_backend("gpu") is None
    assert ran(f(X)) == "alt"
    evjax.set_backend("reference")  # every platform: replaces the platform's own choice
    assert ran(f(X)) == "reference" and evjax.config.get_backend("gpu") == "reference"
    evjax.config.set_backend("cpu", "alt")  # a platform's own choice comes before the one for all
    assert ran(f(X)) == "alt" and evjax.config.get_backend("gpu") == "reference"
    evjax.config.set_backend("cpu", None)
    assert ran(f(X)) == "reference"
    with evjax.use_backend(None):  # the ops' defaults inside, whatever set_backend says
        assert ran(f(X)) == "numba"
    evjax.set_backend(None)
    assert ran(f(X)) == "numba"


def test_a_choice_applies_only_to_ops_that_have_that_backend():
    with evjax.use_backend("warp"):  # this op has no warp: it keeps its default
        assert ran(call(X)) == "numba"


def test_set_default_retraces_without_clearing_caches(monkeypatch):
    monkeypatch.setattr(jax, "clear_caches", lambda: pytest.fail("evjax cleared JAX's caches"))
    op = op_tagged_by_backend("core_set_default")
    f = jax.jit(lambda x: op(x, outs=[S((3,), jnp.float32)])[0])
    assert ran(f(X)) == "numba"
    op.set_default("cpu", "alt")
    assert ran(f(X)) == "alt"
    with pytest.raises(ValueError, match="has no backend 'warp' on cpu"):
        op.set_default("cpu", "warp")


def test_the_backend_parameter_is_one_frozen_value():
    """Every bound op carries a BackendChoice, whatever the caller passed; anything else raises."""
    from evjax.registry import BackendChoice

    w = csr.CSR.fromdense(np.array([[1.0, 0.0], [2.0, 3.0]], np.float32))
    x = np.array([1.0, 2.0], np.float32)
    for backend, expected in ((None, BackendChoice()), ("reference", BackendChoice(per_call="reference"))):
        jaxpr = jax.make_jaxpr(lambda d: w.with_data(d).__matmul__(x) if backend is None
                               else csr.csrmv(d, w.indices, w.indptr, x, shape=w.shape, backend=backend))(w.data)
        (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name.startswith("evjax_")]
        assert eqn.params["backend"] == expected
        hash(eqn.params["backend"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        BackendChoice().per_call = "numba"
    with pytest.raises(TypeError, match="backend must be a backend name or None"):
        csr.csrmv_p.bind(w.data, w.indices, w.indptr, x, outs=[jax.ShapeDtypeStruct((2,), np.float32)],
                         shape=w.shape, transpose=False, backend=(("cpu", "numba"),))


def test_gradients_follow_the_choice_recorded_when_the_op_was_traced():
    """Rules pass the recorded choice on: the weight gradient (another op, bound while
    transposing, outside the block) runs on the backend chosen around the forward op."""
    w = csr.CSR.fromdense(np.array([[1.0, 0.0], [2.0, 3.0]], np.float32))
    s = np.array([True, True])

    def loss(data):
        with evjax.use_backend("reference"):
            y = s @ w.with_data(data)
        return jnp.sum(y ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(w.data)
    backends = {e.params["backend"] for e in jaxpr.jaxpr.eqns if e.primitive.name.startswith("evjax_")}
    assert {e.primitive.name for e in jaxpr.jaxpr.eqns} >= {"evjax_binary_csrmv", "evjax_csr_sddmm"}
    assert backends == {evjax.registry.BackendChoice(in_force=(("cpu", "reference"), ("gpu", "reference")))}
    np.testing.assert_allclose(jax.grad(loss)(w.data), [2 * 3.0, 2 * 3.0, 2 * 3.0], rtol=1e-6)


def test_environment_sets_the_global_choice():
    code = "import jax.numpy as jnp, evjax; print(evjax.config.get_backend('cpu'), evjax.spike(jnp.ones(2)))"
    env = {**os.environ, "EVJAX_BACKEND": "reference", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT,
                         timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "reference"


# ---------------------------------------------------------------------------
# import hygiene
# ---------------------------------------------------------------------------
IMPORT_CHECK = textwrap.dedent("""
    import sys
    import jax, numba
    from numba import config
    from numba.core import event
    from numba.np.ufunc import parallel

    traces = []
    f = jax.jit(lambda x: (traces.append(1), x + 1)[1])
    f(1.0)
    cleared = []
    jax.clear_caches = lambda: cleared.append(1)
    numba_settings = {k: getattr(config, k) for k in dir(config) if k.isupper()}
    with event.install_recorder("numba:compile") as compiles:
        import evjax
    f(1.0)
    after = {k: getattr(config, k) for k in dir(config) if k.isupper()}
    changed = sorted(k for k in numba_settings if repr(numba_settings[k]) != repr(after[k]))
    loaded = sorted(m for m in sys.modules if m == "warp" or m.startswith("numba.cuda")
                    or m.endswith((".csr.numba", ".csr.warp", ".csr.numba_cuda")))
    print(len(traces), len(cleared), len(compiles.buffer), changed, loaded, parallel._is_initialized)
""")


def test_import_compiles_nothing_clears_nothing_and_loads_no_backend():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", IMPORT_CHECK], env=env, capture_output=True, text=True, cwd=ROOT,
                         timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "1 0 0 [] [] False", out.stdout


@pytest.mark.parametrize("family", ["csr"])
def test_each_backend_module_registers_every_op_of_its_family(family):
    """A family's ops share their backends, so a per-call choice holds for the ops their rules bind."""
    import importlib

    package = importlib.import_module(f"evjax.primitives.{family}")
    all_ops = package.OPS
    for backend, platforms in package.BACKENDS.items():
        if registry.missing_library(backend) is not None:
            continue
        for platform in platforms:
            for op in all_ops:
                generator = op.kernel_generator(platform, backend)  # imports the module on first use
                assert callable(generator), (op.name, platform, backend)
            assert f"evjax.primitives.{family}.{backend}" in sys.modules
