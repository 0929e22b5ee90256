"""The CUDA bridge's handlers, exercised on CPU with fake frames and a fake driver.

What a GPU would add (the driver really launching) is in test_numba_cuda_gpu.py.
"""
from __future__ import annotations

import ctypes
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evjax.backends import ffi_abi, ffi_core
from evjax.backends import numba_cuda as bridge
from evjax.backends import numba_cuda_launch as launch

sys.path.insert(0, os.path.dirname(__file__))
from numba_cuda_fakes import (  # noqa: E402
    FakeApi, FakeDriver, Frame, HostViews, address, call_handler, duck_device_array,
)

_KEEP: list = []  # handlers registered with XLA must outlive the process's calls
SPECS = [((3, 4), np.dtype(np.float32)), ((5,), np.dtype(np.int64)), ((3, 4), np.dtype(np.float32))]


def _arrays():
    return [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(5, dtype=np.int64),
            np.zeros((3, 4), np.float32)]


def _frame(handler, api, arrays, **kwargs) -> Frame:
    """A frame over ``arrays`` (2 inputs, 1 output) carrying ``handler``'s plan attribute."""
    return Frame(api, arrays[:2], arrays[2:], attributes=handler.attributes, **kwargs)


def _build(driver: FakeDriver, *, grid=(2, 1, 1), block=(128, 1, 1), shared=64, context=0, describe=None):
    values, slots = bridge.pack_plan(SPECS, 2)
    plan = launch.LaunchPlan(
        tuple(values), tuple(slots), grid, block, shared, 0x1234, context, address(driver.launch),
        address(driver.get_current), address(driver.push), address(driver.pop),
    )
    return launch.build(plan, describe or (lambda status: f"kernel 'k' failed: CUresult {status}"))


def test_array_params_match_numpy_layout():
    for shape, dtype in [((7,), np.float32), ((3, 4), np.float64), ((2, 3, 5), np.int8), ((), np.float32)]:
        a = np.empty(shape, dtype)
        assert launch.array_params(shape, a.itemsize) == [0, 0, a.size, a.itemsize, 0, *a.shape, *a.strides]
    # empty arrays: C strides as Numba computes them for device arrays
    assert launch.array_params((0, 3), 4) == [0, 0, 0, 4, 0, 0, 3, 12, 4]


def test_packing_equals_numbas_own():
    """Our parameter layout equals what the installed Numba's _Kernel._prepare_args passes."""
    from numba.cuda.dispatcher import _Kernel

    fake = types.SimpleNamespace(extensions=[])
    overload = types.SimpleNamespace(_prepare_args=types.MethodType(_Kernel._prepare_args, fake))
    specs = [((3, 4), np.dtype(np.float32)), ((5,), np.dtype(np.bool_)), ((2, 3, 4), np.dtype(np.int64)),
             ((6,), np.dtype(np.float16))]
    base = 0x7F00_0000_1000
    assert bridge.packing_agrees(overload, specs, 2, lambda s: duck_device_array(s[0], s[1], base), base)
    wrong = lambda s: duck_device_array(tuple(d + 1 for d in s[0]), s[1], base)  # noqa: E731
    assert not bridge.packing_agrees(overload, specs, 2, wrong, base)


def test_xla_passes_an_int64_attribute_as_a_scalar_pointer():
    """The ABI the compiled handlers rely on to find their attribute, seen from a real XLA call: the
    trampoline of a PythonHandler found its callback through it, and the callback sees it too."""
    seen = []

    def run(frame):
        words = (ctypes.c_int64 * 21).from_address(frame)
        n, types_, attrs = words[ffi_abi.FRAME_ATTRS_SIZE // 8], words[144 // 8], words[ffi_abi.FRAME_ATTRS // 8]
        scalar = ctypes.c_int64.from_address(attrs).value
        value = ctypes.c_int64.from_address(ctypes.c_int64.from_address(scalar + ffi_abi.SCALAR_VALUE).value).value
        seen.append((n, ctypes.c_int32.from_address(types_).value, ctypes.c_int32.from_address(scalar).value, value))
        return 0

    handler = ffi_core.PythonHandler("attribute probe", run, platform="cpu")
    out = jax.ShapeDtypeStruct((2,), jnp.float32)
    call = jax.ffi.ffi_call(handler.target_name, out, vmap_method="sequential")
    jax.block_until_ready(jax.jit(lambda x: call(x, **handler.attributes))(jnp.ones(2, jnp.float32)))
    assert seen == [(1, 3, ffi_abi.FFI_DTYPE_CODES[np.dtype(np.int64)], handler.callback_address)]
    _KEEP.append(handler)


def test_compiled_handler_launches_with_frame_buffers_and_stream():
    ins_outs = _arrays()
    driver = FakeDriver(n_params=len(bridge.pack_plan(SPECS, 2)[0]))
    handler = _build(driver)
    api = FakeApi(stream=0xABC0)
    assert call_handler(handler.address, _frame(handler, api, ins_outs)) == 0
    (launch,) = driver.launches
    assert launch["function"] == 0x1234
    assert launch["grid"] == (2, 1, 1) and launch["block"] == (128, 1, 1) and launch["shared"] == 64
    assert launch["stream"] == 0xABC0 and launch["extra"] is None
    expected = []
    for a in ins_outs:
        expected += [0, 0, a.size, a.itemsize, a.ctypes.data, *a.shape, *a.strides]
    assert launch["values"] == expected
    assert driver.pushed == [] and api.messages == []


def test_compiled_handler_makes_the_kernel_context_current():
    driver = FakeDriver(n_params=len(bridge.pack_plan(SPECS, 2)[0]), current_context=0x5555)
    handler = _build(driver, context=0x9999)
    arrays = _arrays()
    assert call_handler(handler.address, _frame(handler, FakeApi(), arrays)) == 0
    assert driver.pushed == [0x9999] and driver.popped == 1 and len(driver.launches) == 1

    same = FakeDriver(n_params=driver.n_params, current_context=0x9999)
    handler = _build(same, context=0x9999)
    assert call_handler(handler.address, _frame(handler, FakeApi(), arrays)) == 0
    assert same.pushed == [] and same.popped == 0
    assert handler.address == _build(driver).address  # one generic handler; the plans differ


def test_compiled_handler_reports_a_failed_launch():
    driver = FakeDriver(n_params=len(bridge.pack_plan(SPECS, 2)[0]), status=701)
    handler = _build(driver, describe=lambda status: f"evjax: kernel 'k' failed to launch: CUresult {status}")
    api = FakeApi()
    arrays = _arrays()
    error = call_handler(handler.address, _frame(handler, api, arrays))
    assert error == 0xE001
    assert api.messages == ["evjax: kernel 'k' failed to launch: CUresult 701"]


def test_compiled_handler_passes_on_stream_errors_and_skips_empty_launches():
    driver = FakeDriver(n_params=len(bridge.pack_plan(SPECS, 2)[0]))
    arrays = _arrays()
    handler = _build(driver)
    assert call_handler(handler.address, _frame(handler, FakeApi(stream_error=0xBAD), arrays)) == 0xBAD
    empty = _build(driver, grid=(0, 1, 1))
    assert call_handler(empty.address, _frame(empty, FakeApi(), arrays)) == 0
    assert call_handler(handler.address, _frame(handler, FakeApi(), arrays, stage=1)) == 0
    assert driver.launches == []
    api = FakeApi()
    assert call_handler(handler.address, Frame(api, arrays[:2], arrays[2:])) == 0xE001  # no plan attribute
    assert "without its single 'evjax_plan' attribute" in api.messages[0]


def test_compiled_handler_answers_the_metadata_query():
    driver = FakeDriver(n_params=len(bridge.pack_plan(SPECS, 2)[0]))
    handler = _build(driver)
    arrays = _arrays()
    api = FakeApi()
    ctypes.c_int32.from_address(ctypes.addressof(api.table) + ffi_abi.API_VERSION_MAJOR).value = 0
    ctypes.c_int32.from_address(ctypes.addressof(api.table) + ffi_abi.API_VERSION_MINOR).value = 3
    frame = _frame(handler, api, arrays, metadata=True)
    assert call_handler(handler.address, frame) == 0
    md = frame.metadata
    assert (md[ffi_abi.METADATA_API_MAJOR // 4], md[ffi_abi.METADATA_API_MINOR // 4]) == (0, 3)
    # no synchronisation, no allocation: it may be recorded into a CUDA graph (XLA's command buffers)
    assert md[ffi_abi.METADATA_TRAITS // 4] == ffi_abi.TRAIT_COMMAND_BUFFER_COMPATIBLE and driver.launches == []


def test_python_launch_path_launches_the_overload_on_the_stream():
    launched = []

    class FakeOverload:
        def launch(self, arrays, grid, block, stream, shared):
            launched.append((grid, block, stream, shared))
            arrays[2][...] = arrays[0] * 2

    arrays = _arrays()
    run = bridge.PythonLaunch(FakeOverload(), HostViews(SPECS), 2, 1, (3, 1, 1), (32, 1, 1), 16,
                              stream_of=ffi_abi.get_stream, wrap_stream=lambda s: ("stream", s))
    handler = bridge.PythonHandler("numba_cuda_kernel 'k'", run)
    frame = Frame(FakeApi(stream=0x42), arrays[:2], arrays[2:], attributes=handler.attributes)
    assert call_handler(handler.address, frame) == 0
    assert launched == [((3, 1, 1), (32, 1, 1), ("stream", 0x42), 16)]
    np.testing.assert_array_equal(arrays[2], arrays[0] * 2)


def test_python_handler_turns_exceptions_into_xla_errors():
    def run(frame):
        raise ValueError("bad launch config")

    api = FakeApi()
    arrays = _arrays()
    handler = bridge.PythonHandler("numba_cuda_kernel 'k'", run)
    assert call_handler(handler.address, Frame(api, arrays[:2], arrays[2:], attributes=handler.attributes)) == 0xE001
    assert api.messages == ["evjax: numba_cuda_kernel 'k' raised ValueError: bad launch config"]
    # without its attribute the trampoline reports that, and runs nothing
    assert call_handler(handler.address, Frame(api, arrays[:2], arrays[2:])) == 0xE002
    assert "without its 'evjax_callback' attribute" in api.messages[-1]


def test_callable_handler_runs_under_jit_through_xla():
    """The Python handler, registered on CPU with host views, inside jax.jit."""
    seen = []

    def double_then_add(x, y, out, scratch, stream):
        seen.append(stream)
        scratch[...] = 2 * x
        out[...] = scratch + y

    in_specs = [((6,), np.float32), ((6,), np.float32)]
    out_specs = [((6,), np.float32), ((6,), np.float32)]
    handler = bridge.callable_handler(
        double_then_add, in_specs, out_specs, "numba_cuda_callable 'double_then_add'", platform="cpu",
        views=HostViews, stream_of=lambda frame: (0x99, 0), wrap_stream=lambda s: ("stream", s),
    )
    outs = [jax.ShapeDtypeStruct((6,), jnp.float32)] * 2
    call = jax.jit(lambda x, y: jax.ffi.ffi_call(handler.target_name, outs)(x, y, **handler.attributes)[0])
    x = jnp.arange(6, dtype=jnp.float32)
    np.testing.assert_allclose(call(x, x + 1), 3 * np.arange(6) + 1)
    assert seen == [("stream", 0x99)]


def test_callable_handler_errors_reach_python():
    def broken(x, out, stream):
        raise RuntimeError("kernel config rejected")

    handler = bridge.callable_handler(
        broken, [((4,), np.float32)], [((4,), np.float32)], "numba_cuda_callable 'broken'", platform="cpu",
        views=HostViews, stream_of=lambda frame: (0, 0), wrap_stream=lambda s: s,
    )
    out = jax.ShapeDtypeStruct((4,), jnp.float32)
    call = jax.jit(lambda x: jax.ffi.ffi_call(handler.target_name, out)(x, **handler.attributes))
    with pytest.raises(Exception, match="numba_cuda_callable 'broken' raised RuntimeError: kernel config rejected"):
        jax.block_until_ready(call(jnp.ones(4, jnp.float32)))


def test_buffer_pointers_checks_the_frame_arity():
    arrays = _arrays()
    frame = Frame(FakeApi(), arrays[:2], arrays[2:])
    assert bridge.buffer_pointers(frame.address, 2, 1) == [a.ctypes.data for a in arrays]
    with pytest.raises(RuntimeError, match="expected 3, 1"):
        bridge.buffer_pointers(frame.address, 3, 1)


def test_launch_mode_env(monkeypatch):
    monkeypatch.setenv(bridge.LAUNCH_ENV, "python")
    assert bridge.launch_mode() == "python"
    monkeypatch.setenv(bridge.LAUNCH_ENV, "fast")
    with pytest.raises(ValueError, match="auto"):
        bridge.launch_mode()


def test_compiled_handler_reads_its_plan_through_xla():
    """Registered on CPU and called by XLA: an empty-grid plan returns at once; a real
    plan goes on to ask XLA for a stream, which XLA's CPU runtime refuses (on a GPU the
    handler would launch there) -- so the plan was found through the call's attribute."""
    driver = FakeDriver(n_params=len(bridge.pack_plan(SPECS, 2)[0]))
    empty, real = _build(driver, grid=(0, 1, 1)), _build(driver)
    jax.ffi.register_ffi_target("evjax_test_compiled_on_cpu", jax.ffi.pycapsule(empty.address), platform="cpu")
    out = jax.ShapeDtypeStruct((3, 4), jnp.float32)
    call = jax.ffi.ffi_call("evjax_test_compiled_on_cpu", out)
    x, y = jnp.ones((3, 4), jnp.float32), jnp.ones(5, jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
    jax.block_until_ready(jax.jit(lambda a, b: call(a, b, **empty.attributes))(x, y))
    with pytest.raises(Exception, match="GPU context is not available"):  # from XLA_FFI_Stream_Get
        jax.block_until_ready(jax.jit(lambda a, b: call(a, b, **real.attributes))(x, y))
    assert driver.launches == []
    _KEEP.extend([empty, real])
