"""The Warp bridge's compiled FFI handlers, driven with hand-built XLA call frames.

No GPU is needed: the CUDA handler is given a fake XLA API (Stream_Get,
DeviceOrdinal_Get, Error_Create) and a fake ``wp_cuda_launch_kernel`` that
records its arguments and performs the kernel's work on the host buffers.  This
checks everything the handler does before the driver: frame decoding, the
parameter block (launch bounds, one ``array_t`` per parameter), stream and
device selection, error reporting and the command-buffer trait.
"""
import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("warp")

from evjax.backends import ffi_abi  # noqa: E402
from evjax.backends import warp as bridge  # noqa: E402

VP = ctypes.c_void_p
ERROR_CREATE = ctypes.CFUNCTYPE(VP, VP)
QUERY = ctypes.CFUNCTYPE(VP, VP)
LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_size_t, VP, VP, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ctypes.c_int, ctypes.POINTER(VP), VP, VP,
)
STREAM, CONTEXT, FUNCTION = 0xABC0, 0xC0C0, 0xF00D


class FakeXla:
    """An XLA_FFI_Api table, a call frame and buffers, all owned by Python."""

    def __init__(self, ordinal=0, stream_error=False):
        self.keep = []
        self.errors = []
        self.api = (ctypes.c_uint8 * 256)()
        self._i64(self.api, 0, 192)
        ctypes.c_int32.from_address(ctypes.addressof(self.api) + 32).value = 0
        ctypes.c_int32.from_address(ctypes.addressof(self.api) + 36).value = 3

        def error_create(args):
            message = ctypes.cast(ctypes.c_void_p.from_address(args + 16).value, ctypes.c_char_p).value
            self.errors.append(message.decode())
            return 0xE0

        def stream_get(args):
            if stream_error:
                return 0xE1
            ctypes.c_uint64.from_address(args + 24).value = STREAM
            return None

        def ordinal_get(args):
            ctypes.c_int32.from_address(args + 24).value = ordinal
            return None

        for offset, (proto, fn) in {
            ffi_abi.API_ERROR_CREATE: (ERROR_CREATE, error_create),
            ffi_abi.API_STREAM_GET: (QUERY, stream_get),
            184: (QUERY, ordinal_get),
        }.items():
            callback = proto(fn)
            self.keep.append(callback)
            self._i64(self.api, offset, ctypes.cast(callback, VP).value)

    @staticmethod
    def _i64(block, offset, value):
        ctypes.c_int64.from_address(ctypes.addressof(block) + offset).value = value

    def buffer(self, array: np.ndarray) -> int:
        dims = (ctypes.c_int64 * max(1, array.ndim))(*array.shape)
        buf = (ctypes.c_uint8 * 48)()
        ctypes.c_int32.from_address(ctypes.addressof(buf) + 16).value = ffi_abi.FFI_DTYPE_CODES[array.dtype]
        self._i64(buf, 24, array.ctypes.data)
        self._i64(buf, 32, array.ndim)
        self._i64(buf, 40, ctypes.addressof(dims))
        self.keep += [dims, buf, array]
        return ctypes.addressof(buf)

    def frame(self, args, rets, attr: np.ndarray, stage=ffi_abi.STAGE_EXECUTE, metadata=None) -> int:
        frame = (ctypes.c_uint8 * 176)()
        self._i64(frame, 0, ffi_abi.CALL_FRAME_STRUCT_SIZE)
        arg_ptrs = (ctypes.c_int64 * max(1, len(args)))(*[self.buffer(a) for a in args])
        ret_ptrs = (ctypes.c_int64 * max(1, len(rets)))(*[self.buffer(r) for r in rets])
        attr = np.ascontiguousarray(attr, np.int64)
        array = (ctypes.c_uint8 * 24)()
        ctypes.c_int32.from_address(ctypes.addressof(array)).value = 5  # S64
        self._i64(array, 8, attr.size)
        self._i64(array, 16, attr.ctypes.data)
        attrs = (ctypes.c_int64 * 1)(ctypes.addressof(array))
        self.keep += [frame, arg_ptrs, ret_ptrs, attr, array, attrs]
        self._i64(frame, 16, ctypes.addressof(self.api))
        self._i64(frame, 24, 0x1234)  # execution context (opaque)
        ctypes.c_int32.from_address(ctypes.addressof(frame) + 32).value = stage
        self._i64(frame, 56, len(args))
        self._i64(frame, 72, ctypes.addressof(arg_ptrs))
        self._i64(frame, 96, len(rets))
        self._i64(frame, 112, ctypes.addressof(ret_ptrs))
        self._i64(frame, 136, 1)
        self._i64(frame, 160, ctypes.addressof(attrs))
        if metadata is not None:
            self._i64(frame, 8, metadata)
        return ctypes.addressof(frame)


def _handler(name):
    """The compiled handler: the shared FFI prologue, then evjax.backends.warp_launch's CPU or CUDA launch."""
    return ctypes.CFUNCTYPE(VP, VP)(bridge.handler_address("cpu" if name == "cpu_handler" else "CUDA"))


def _array_t(address):
    data = ctypes.c_uint64.from_address(address).value
    shape = [ctypes.c_int32.from_address(address + 16 + 4 * d).value for d in range(4)]
    strides = [ctypes.c_int32.from_address(address + 32 + 4 * d).value for d in range(4)]
    ndim = ctypes.c_uint16.from_address(address + 48).value
    return data, shape[:ndim], strides[:ndim], ndim


def test_cuda_handler_builds_the_launch_and_uses_xla_stream_and_device():
    calls = []

    def fake_launch(context, kernel, dim, max_blocks, block_dim, grid_stride, cluster, smem, params, stream, apic):
        bounds = params[0]
        shape = [ctypes.c_uint32.from_address(bounds + 4 * d).value for d in range(2)]
        size = ctypes.c_size_t.from_address(bounds + 8).value
        arrays = [_array_t(params[1 + k]) for k in range(3)]
        calls.append(dict(context=context, kernel=kernel, dim=dim, block_dim=block_dim, grid_stride=grid_stride,
                          cluster=cluster, smem=smem, stream=stream, apic=apic, shape=shape, size=size,
                          arrays=arrays))
        # do the kernel's work (out = a + b) through the array_t data pointers
        (pa, sa, _, _), (pb, _, _, _), (po, _, _, _) = arrays
        n = sa[0] * sa[1]
        a = np.ctypeslib.as_array((ctypes.c_float * n).from_address(pa))
        b = np.ctypeslib.as_array((ctypes.c_float * n).from_address(pb))
        np.ctypeslib.as_array((ctypes.c_float * n).from_address(po))[:] = a + b
        return 0

    launch = LAUNCH(fake_launch)
    fake = FakeXla(ordinal=1)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((3, 4), np.float32)
    out = np.zeros((3, 4), np.float32)
    attr = bridge.launch_attr(3, 0b100, 2, (3, 4), [(0, 0), (FUNCTION, CONTEXT)], block_dim=256, grid_stride=1,
                              cluster_dim=1, smem=16, launch_fn=ctypes.cast(launch, VP).value)
    err = _handler("cuda_handler")(fake.frame([a, b], [out], attr))
    assert not err and not fake.errors
    (call,) = calls
    assert (call["context"], call["kernel"], call["stream"]) == (CONTEXT, FUNCTION, STREAM)
    assert (call["dim"], call["block_dim"], call["grid_stride"], call["cluster"], call["smem"]) == (12, 256, 1, 1, 16)
    assert call["apic"] is None and call["shape"] == [3, 4] and call["size"] == 12
    assert call["arrays"][0] == (a.ctypes.data, [3, 4], [16, 4], 2)
    assert call["arrays"][2][0] == out.ctypes.data
    np.testing.assert_array_equal(out, a + b)


def test_cuda_handler_errors_are_reported_through_xla():
    fake = FakeXla(ordinal=0)
    a = np.zeros(4, np.float32)
    attr = bridge.launch_attr(2, 0b10, 1, (4,), [(0, 0), (FUNCTION, CONTEXT)], launch_fn=1)
    assert _handler("cuda_handler")(fake.frame([a], [a.copy()], attr)) == 0xE0
    assert "not loaded on this device" in fake.errors[-1]
    fake = FakeXla(ordinal=0, stream_error=True)
    assert _handler("cuda_handler")(fake.frame([a], [a.copy()], attr)) == 0xE1  # XLA's own error, passed on
    fake = FakeXla()
    assert _handler("cuda_handler")(fake.frame([a], [a.copy()], np.asarray([7, 1, 2]))) == 0xE0
    assert "malformed launch attribute" in fake.errors[-1]

    def failing(*args):
        return 700  # CUDA_ERROR_ILLEGAL_ADDRESS

    launch = LAUNCH(failing)
    fake = FakeXla()
    attr = bridge.launch_attr(2, 0b10, 1, (4,), [(FUNCTION, CONTEXT)], launch_fn=ctypes.cast(launch, VP).value)
    assert _handler("cuda_handler")(fake.frame([a], [a.copy()], attr)) == 0xE0
    assert "cuLaunchKernel failed" in fake.errors[-1]


def test_handlers_reject_buffers_that_do_not_match_the_parameters():
    fake = FakeXla()
    a = np.zeros(4, np.float32)
    attr = bridge.launch_attr(3, 0b100, 1, (4,), [(FUNCTION, 0)])  # 3 params, only 2 buffers
    assert _handler("cpu_handler")(fake.frame([a], [a.copy()], attr)) == 0xE0
    assert "do not match" in fake.errors[-1]
    scalar = np.zeros((), np.float32)  # rank 0 is not a Warp array
    attr = bridge.launch_attr(2, 0b10, 1, (4,), [(FUNCTION, 0)])
    assert _handler("cpu_handler")(fake.frame([scalar], [a], attr)) == 0xE0


@pytest.mark.parametrize("name, traits", [("cpu_handler", 0), ("cuda_handler", ffi_abi.TRAIT_COMMAND_BUFFER_COMPATIBLE)])
def test_metadata_query_declares_command_buffer_compatibility_on_cuda_only(name, traits):
    fake = FakeXla()
    metadata = (ctypes.c_uint8 * 48)()
    ctypes.c_int64.from_address(ctypes.addressof(metadata)).value = ffi_abi.METADATA_STRUCT_SIZE
    extension = (ctypes.c_uint8 * 32)()
    ctypes.c_int64.from_address(ctypes.addressof(extension)).value = ffi_abi.METADATA_EXTENSION_STRUCT_SIZE
    ctypes.c_int32.from_address(ctypes.addressof(extension) + ffi_abi.EXT_TYPE).value = ffi_abi.EXT_TYPE_METADATA
    ctypes.c_int64.from_address(ctypes.addressof(extension) + ffi_abi.EXT_METADATA_PTR).value = ctypes.addressof(metadata)
    ctypes.c_uint32.from_address(ctypes.addressof(metadata) + ffi_abi.METADATA_TRAITS).value = 99
    frame = fake.frame([], [], np.zeros(1, np.int64), metadata=ctypes.addressof(extension))
    assert not _handler(name)(frame)
    assert ctypes.c_uint32.from_address(ctypes.addressof(metadata) + ffi_abi.METADATA_TRAITS).value == traits
    assert ctypes.c_int32.from_address(ctypes.addressof(metadata) + ffi_abi.METADATA_API_MINOR).value == 3


def test_non_execute_stages_do_nothing():
    fake = FakeXla()
    attr = bridge.launch_attr(1, 0, 1, (4,), [(1, 0)], launch_fn=1)  # would crash if it launched
    for stage in (0, 1, 2):
        assert not _handler("cuda_handler")(fake.frame([np.zeros(4, np.float32)], [], attr, stage=stage))
        assert not _handler("cpu_handler")(fake.frame([np.zeros(4, np.float32)], [], attr, stage=stage))


@pytest.mark.parametrize("dims, kdim, expect", [
    ((5,), 1, ((5,), 5, 1)), ((2, 3), 2, ((2, 3), 6, 1)), ((2,), 2, ((2, 1), 2, 1)),
    ((2, 3, 4), 1, ((2,), 24, 12)), ((0, 7), 2, ((0, 7), 0, 1)),
])
def test_launch_bounds_follow_wp_launch(dims, kdim, expect):
    assert bridge.launch_bounds(dims, kdim) == expect


def test_cuda_lowering_is_one_custom_call_with_aliases(monkeypatch):
    """Lower for CUDA without a GPU: Warp's per-device load is faked."""
    import warp as wp

    from tests.warp_kernels_for_tests import scatter_k

    monkeypatch.setattr(bridge, "load_cuda", lambda kernel: (
        [(FUNCTION, CONTEXT)], {"block_dim": 256, "grid_stride": 1, "cluster_dim": 1, "smem": 0}))
    import evjax

    call = evjax.warp_kernel(scatter_k, [], launch_dims=30, in_out_argnames=["acc"])
    args = (jnp.ones(30, jnp.float32), jnp.zeros(30, jnp.int32), jnp.zeros(7, jnp.float32))
    text = jax.jit(call).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call") == 1 and bridge.CUDA_TARGET in text
    assert "output_operand_aliases" in text
    del wp
