"""The FFI core: what every XLA FFI handler of evjax does before its own work, written once.

Every handler is a ``@numba.cfunc`` taking XLA's call frame.  They are all made
by :func:`compile_handler`, which first checks the installed jaxlib's FFI
header against evjax's offsets (:func:`evjax.backends.ffi_abi.handler_api_version`,
once per process) and then writes a small module: the same prologue, then the
bridge's own body.  The prologue

1. checks the ABI: a call frame whose ``struct_size`` is not the one evjax
   reads, or an API table of another major version, gets an XLA error
   (``FAILED_PRECONDITION``, naming the jaxlib range evjax supports) instead
   of a handler reading garbage;
2. answers XLA's metadata query: the API version the handlers were built for
   (never XLA's own, which XLA would then accept blindly) and the handler's
   traits;
3. returns at once for a stage other than EXECUTE.

Errors are created here too: :func:`create_error` from a C string, and
:func:`report` from a message that Python composes (a kernel's exception, a
failed launch).  A handler whose work must run in Python (Numba CUDA's Python
launch path) is a :class:`PythonHandler`: the one compiled
:func:`python_target` handler runs the prologue and then calls back into
Python through an address passed as the call's attribute.

The module source is named by a digest of its text, of the sources of this
package's compiled helpers and of the jaxlib/Numba versions, so an edit or an
upgrade never reuses a stale cached handler, and the same handler is loaded
once per process however many times it is asked for.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import itertools
import linecache
import os
import sys
import threading
from typing import Callable

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .. import _disk_cache, _kernel_compat
from . import ffi_abi as abi
from .intrinsics import (
    call_ptr_ptr, constant_cstring, emit_advise_huge_pages, emit_call_ptr_ptr, emit_fetch_add_i64, emit_load,
    emit_stack_bytes, emit_store, emit_store_release_i64, load_i32, load_i64, stack_bytes, store_i64,
)
from .threads import emit_now_ns

__all__ = [
    "cache_dir", "prologue", "create_error", "report", "register_describer", "query_stream",
    "query_device_ordinal", "scalar_attribute", "array_attribute", "compile_handler", "PythonHandler",
    "python_target", "PROCEED",
]

HANDLER_FORMAT = 5  # bump when the generated handler layout changes


def cache_dir() -> str:
    """The evjax cache folder (``$EVJAX_CACHE_DIR``, else ``~/.cache/evjax``).

    Created if it can be; a folder that cannot be written is reported where
    evjax first writes to it, and evjax then compiles in memory.
    """
    root = os.environ.get("EVJAX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "evjax"
    )
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        pass
    return root


# ---------------------------------------------------------------------------
# The prologue and error creation: LLVM IR, written into each handler
#
# These are Numba intrinsics whose code is emitted straight into the calling handler's module (an
# internal function that LLVM inlines): no compile of their own.  As Numba-compiled functions they
# cost a process's first handler about 0.2 s (three pipelines, modules and cache entries for a few
# loads and stores).  Their IR reads as the C it stands for; each emitter's docstring gives that C.
# ---------------------------------------------------------------------------
PROCEED = -1  # the prologue's answer when the handler has its work to do

# The prologue's error messages (constant C strings: the failure path composes nothing).
_FIX = f"Install a jax and jaxlib that evjax supports ({abi.SUPPORTED_JAX})."
_ABI_MESSAGES = (
    f"evjax: XLA passed a call frame (XLA_FFI_CallFrame) whose struct_size is not the "
    f"{abi.CALL_FRAME_STRUCT_SIZE} bytes of the XLA FFI API {abi.API_MAJOR}.{abi.API_MINOR} evjax's handlers "
    f"were built for: the installed jaxlib has another FFI ABI, and the handler would read garbage. {_FIX}",
    f"evjax: XLA's FFI API table (XLA_FFI_Api) has a major version other than {abi.API_MAJOR}, the XLA FFI API "
    f"{abi.API_MAJOR}.{abi.API_MINOR} evjax's handlers were built for: the installed jaxlib has another FFI ABI. "
    f"{_FIX}",
    f"evjax: XLA's metadata query passed an XLA_FFI_Metadata_Extension or XLA_FFI_Metadata smaller than the "
    f"{abi.METADATA_EXTENSION_STRUCT_SIZE} and {abi.METADATA_STRUCT_SIZE} bytes of the XLA FFI API "
    f"{abi.API_MAJOR}.{abi.API_MINOR} evjax's handlers were built for. {_FIX}",
)
FRAME_MISMATCH, API_MISMATCH, METADATA_MISMATCH = range(3)

_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _field(builder, address, offset: int, kind=_I64):
    """``*(kind*)(address + offset)``."""
    return emit_load(builder, builder.add(address, _I64(offset)), kind)


def _set_field(builder, address, offset: int, value, kind=_I64):
    """``*(kind*)(address + offset) = value`` (a wider integer is truncated)."""
    emit_store(builder, builder.add(address, _I64(offset)), value, kind)


def _internal_function(module, name: str, n_args: int, emit_body):
    """The internal function ``int64 name(int64 x n_args)`` of ``module``, defined on first use by
    ``emit_body(builder, args)`` (which ends every path with ``ret``); LLVM inlines it."""
    function = module.globals.get(name)
    if function is None:
        function = ir.Function(module, ir.FunctionType(_I64, [_I64] * n_args), name)
        function.linkage = "internal"
        function.attributes.add("alwaysinline")
        emit_body(ir.IRBuilder(function.append_basic_block("entry")), list(function.args))
    return function


def _emit_create_error(builder, frame, message, errc):
    """``XLA_FFI_Error_Create(&(XLA_FFI_Error_Create_Args){size, NULL, message, errc})`` through the
    frame's API table: an ``XLA_FFI_Error*`` as int64."""
    args = emit_stack_bytes(builder, 32)  # XLA_FFI_Error_Create_Args {struct_size, extension_start, message, errc}
    _set_field(builder, args, 0, _I64(abi.ERROR_CREATE_ARGS_SIZE))
    _set_field(builder, args, abi.ARGS_EXTENSION_START, _I64(0))
    _set_field(builder, args, abi.ERROR_CREATE_MESSAGE, message)
    _set_field(builder, args, abi.ERROR_CREATE_ERRC, errc, _I32)
    create = _field(builder, _field(builder, frame, abi.FRAME_API), abi.API_ERROR_CREATE)
    return emit_call_ptr_ptr(builder, create, args)


def _emit_abi_mismatch(builder, frame, which: int):
    """``return frame->api ? create_error(frame, ABI_MESSAGES[which], FAILED_PRECONDITION) : 0``: XLA's
    error for a frame evjax cannot read; 0 (no error, no answer) where the frame has no API table to
    create one with, which leaves a metadata query unanswered: XLA then refuses the handler (API
    version 0.0)."""
    with builder.if_then(builder.icmp_unsigned("==", _field(builder, frame, abi.FRAME_API), _I64(0))):
        builder.ret(_I64(0))
    message = constant_cstring(builder, _ABI_MESSAGES[which])
    builder.ret(_emit_create_error(builder, frame, message, _I64(abi.ERRC_FAILED_PRECONDITION)))


def _emit_prologue(builder, args):
    """The prologue's body (see :func:`prologue`), as C::

        if (frame->struct_size != CALL_FRAME_STRUCT_SIZE) return abi_mismatch(FRAME_MISMATCH);
        if (frame->api && frame->api->api_version.major_version != API_MAJOR)
            return abi_mismatch(API_MISMATCH);
        ext = frame->extension_start;
        if (ext && ext->type == XLA_FFI_Extension_Metadata) {
            if (ext->struct_size < METADATA_EXTENSION_STRUCT_SIZE || ext->metadata->struct_size < METADATA_STRUCT_SIZE)
                return abi_mismatch(METADATA_MISMATCH);
            ext->metadata->api_version = {major, minor}; ext->metadata->traits = traits;
            return 0;
        }
        return frame->stage == EXECUTE ? PROCEED : 0;
    """
    frame, traits, major, minor = args
    zero = _I64(0)

    def fails(condition, which):
        with builder.if_then(condition, likely=False):
            _emit_abi_mismatch(builder, frame, which)

    fails(builder.icmp_unsigned("!=", _field(builder, frame, 0), _I64(abi.CALL_FRAME_STRUCT_SIZE)), FRAME_MISMATCH)
    api = _field(builder, frame, abi.FRAME_API)
    with builder.if_then(builder.icmp_unsigned("!=", api, zero)):
        major_seen = _field(builder, api, abi.API_VERSION_MAJOR, _I32)
        fails(builder.icmp_unsigned("!=", major_seen, _I32(abi.API_MAJOR)), API_MISMATCH)
    ext = _field(builder, frame, abi.FRAME_EXTENSION_START)
    with builder.if_then(builder.icmp_unsigned("!=", ext, zero)):
        with builder.if_then(builder.icmp_unsigned("==", _field(builder, ext, abi.EXT_TYPE, _I32),
                                                   _I32(abi.EXT_TYPE_METADATA))):
            metadata = _field(builder, ext, abi.EXT_METADATA_PTR)
            fails(builder.icmp_signed("<", _field(builder, ext, 0), _I64(abi.METADATA_EXTENSION_STRUCT_SIZE)),
                  METADATA_MISMATCH)
            fails(builder.icmp_signed("<", _field(builder, metadata, 0), _I64(abi.METADATA_STRUCT_SIZE)),
                  METADATA_MISMATCH)
            _set_field(builder, metadata, abi.METADATA_API_MAJOR, major, _I32)
            _set_field(builder, metadata, abi.METADATA_API_MINOR, minor, _I32)
            _set_field(builder, metadata, abi.METADATA_TRAITS, traits, _I32)
            builder.ret(zero)
    executes = builder.icmp_unsigned("==", _field(builder, frame, abi.FRAME_STAGE, _I32), _I32(abi.STAGE_EXECUTE))
    builder.ret(builder.select(executes, _I64(PROCEED), zero))


@intrinsic
def prologue(typingctx, frame, traits, major, minor):
    """What every handler does first; :data:`PROCEED` when it has its own work to do, else what it returns.

    Checks the call frame's ``struct_size`` (XLA's own C++ handlers want it exact too) and, where
    XLA passes an API table, its major version; answers XLA's metadata query with API version
    ``(major, minor)``, the one the handlers were built for (:func:`ffi_abi.handler_api_version`),
    and ``traits``; returns 0 at once for a stage other than EXECUTE.  (IR: :func:`_emit_prologue`.)
    """

    def codegen(context, builder, signature, args):
        function = _internal_function(builder.module, "evjax_ffi_prologue", 4, _emit_prologue)
        return builder.call(function, args)

    return types.int64(types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def create_error(typingctx, frame, message, errc):
    """An ``XLA_FFI_Error*`` (as int64) carrying the C string at address ``message``, of error code
    ``errc`` (an integer; XLA's ``XLA_FFI_Error_Code``).  (IR: :func:`_emit_create_error`.)"""

    def codegen(context, builder, signature, args):
        return _emit_create_error(builder, *args)

    return types.int64(types.int64, types.int64, types.int64), codegen


# ---------------------------------------------------------------------------
# Compiled helpers of the GPU and Python handlers
#
# Compiled once per process (or loaded from Numba's disk cache), then linked into each handler that
# calls them.  Call them with int64 arguments, never bare constants (``numba.int64(13)``, not ``13``):
# Numba compiles a function anew for each literal value it is passed.  They have no Python entry
# point (``_kernel_compat.COMPILED_CODE_ONLY``), which Numba would compile for nothing.
# ---------------------------------------------------------------------------
@numba.njit(nogil=True, cache=True, **_kernel_compat.COMPILED_CODE_ONLY)
def query_stream(frame):
    """``(error, stream)``: XLA's stream for this call (``XLA_FFI_Stream_Get``; GPU only)."""
    args = stack_bytes(32)  # XLA_FFI_Stream_Get_Args {struct_size, extension_start, ctx, stream (out)}
    store_i64(args, abi.STREAM_GET_ARGS_SIZE)
    store_i64(args + abi.ARGS_EXTENSION_START, 0)
    store_i64(args + abi.STREAM_GET_CTX, load_i64(frame + abi.FRAME_CTX))
    store_i64(args + abi.STREAM_GET_STREAM, 0)
    api = load_i64(frame + abi.FRAME_API)
    error = call_ptr_ptr(load_i64(api + abi.API_STREAM_GET), args)
    return error, load_i64(args + abi.STREAM_GET_STREAM)


@numba.njit(nogil=True, cache=True, **_kernel_compat.COMPILED_CODE_ONLY)
def query_device_ordinal(frame):
    """``(error, ordinal)``: the device of this call (``XLA_FFI_DeviceOrdinal_Get``; 0 where the
    API table predates it)."""
    api = load_i64(frame + abi.FRAME_API)
    if load_i64(api) < abi.API_DEVICE_ORDINAL_GET + 8 or load_i64(api + abi.API_DEVICE_ORDINAL_GET) == 0:
        return 0, 0
    args = stack_bytes(32)  # XLA_FFI_DeviceOrdinal_Get_Args {struct_size, extension_start, ctx, int32 (out)}
    store_i64(args, abi.DEVICE_ORDINAL_GET_ARGS_SIZE)
    store_i64(args + abi.ARGS_EXTENSION_START, 0)
    store_i64(args + abi.DEVICE_ORDINAL_GET_CTX, load_i64(frame + abi.FRAME_CTX))
    store_i64(args + abi.DEVICE_ORDINAL_GET_ORDINAL, 0)
    error = call_ptr_ptr(load_i64(api + abi.API_DEVICE_ORDINAL_GET), args)
    return error, np.int64(load_i32(args + abi.DEVICE_ORDINAL_GET_ORDINAL))


@numba.njit(nogil=True, cache=True, **_kernel_compat.COMPILED_CODE_ONLY)
def scalar_attribute(frame):
    """The int64 value of the call's only attribute, an int64 scalar (0 if there is not exactly one)."""
    if load_i64(frame + abi.FRAME_ATTRS_SIZE) != 1:
        return 0
    scalar = load_i64(load_i64(frame + abi.FRAME_ATTRS))  # XLA_FFI_Scalar {int32 dtype, void* value}
    if load_i32(scalar + abi.ATTR_DTYPE) != abi.FFI_DTYPE_CODES_S64:
        return 0
    return load_i64(load_i64(scalar + abi.SCALAR_VALUE))


@numba.njit(nogil=True, cache=True, **_kernel_compat.COMPILED_CODE_ONLY)
def array_attribute(frame):
    """``(size, data address)`` of the call's only attribute, an int64 array ((0, 0) otherwise)."""
    if load_i64(frame + abi.FRAME_ATTRS_SIZE) != 1:
        return 0, 0
    array = load_i64(load_i64(frame + abi.FRAME_ATTRS))  # XLA_FFI_Array {int32 dtype, size, data}
    if load_i32(array + abi.ATTR_DTYPE) != abi.FFI_DTYPE_CODES_S64:
        return 0, 0
    return load_i64(array + abi.ARRAY_SIZE), load_i64(array + abi.ARRAY_DATA)


# ---------------------------------------------------------------------------
# Errors described in Python
# ---------------------------------------------------------------------------
_describers: dict[int, Callable[[int, int], str]] = {}
_keys = itertools.count(1)
_local = threading.local()
PYTHON_EXCEPTION = 0  # key of the message a PythonHandler left for its thread


def register_describer(describe: Callable[[int, int], str], key: int | None = None) -> int:
    """Register ``describe(frame, detail) -> message`` for :func:`report`; return its key."""
    key = next(_keys) if key is None else int(key)
    _describers[key] = describe
    return key


def _pending_message(frame: int, detail: int) -> str:
    return getattr(_local, "pending", None) or "evjax: a Python handler failed"


_describers[PYTHON_EXCEPTION] = _pending_message


def _message_address(frame: int, key: int, detail: int) -> int:
    """Compose the message of key ``key`` and return the address of its C string.

    The buffer stays alive until the thread's next message; XLA copies it at once.
    Called from compiled code through :data:`MESSAGE_SYMBOL` (a ctypes callback,
    which takes the GIL): it never raises.
    """
    try:
        try:
            describe = _describers.get(key)
            text = describe(frame, detail) if describe else f"evjax: a kernel failed (no description for key {key})"
        except Exception as exc:  # noqa: BLE001 - reported to the caller instead
            text = f"evjax: a kernel failed ({exc!r} while describing the failure)"
        _local.buffer = ctypes.create_string_buffer(text.encode("utf-8", "replace"))
        return ctypes.addressof(_local.buffer)
    except BaseException:  # noqa: BLE001 - must not unwind into compiled code
        return ctypes.addressof(_FALLBACK_MESSAGE)


_FALLBACK_MESSAGE = ctypes.create_string_buffer(b"evjax: a kernel failed (its message could not be composed)")
_ENTRY_TYPE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
_entries: list = []  # the ctypes callbacks behind the symbols, kept alive for the process


def _python_entry(symbol: str, function: Callable[[int, int, int], int]) -> None:
    """Let compiled code call ``function(a, b, c)`` (int64 arguments and result; it must never
    raise) as :func:`_emit_python_call` ``(builder, symbol, ...)``: a ctypes callback, which takes
    the GIL, under the linker symbol ``symbol``.  The symbol is resolved when a handler's machine
    code is linked (compiled or loaded from Numba's disk cache): no address is baked into the code,
    and no object-mode block has to be compiled into each handler."""
    callback = _ENTRY_TYPE(function)
    _entries.append(callback)
    llvm.add_symbol(symbol, ctypes.cast(callback, ctypes.c_void_p).value)


def _emit_python_call(builder, symbol: str, a, b, c):
    """``symbol(a, b, c)``: the call of a function registered by :func:`_python_entry` (int64s)."""
    callee = builder.module.globals.get(symbol)
    if callee is None:
        callee = ir.Function(builder.module, ir.FunctionType(_I64, [_I64] * 3), symbol)
    return builder.call(callee, [a, b, c])


MESSAGE_SYMBOL = "evjax_compose_message"
_python_entry(MESSAGE_SYMBOL, _message_address)  # (frame, key, detail) -> char*


@intrinsic
def report(typingctx, frame, key, detail, errc):
    """An ``XLA_FFI_Error*`` whose message the describer registered under ``key`` composes
    in Python (only on a failure path: the call takes the GIL); int64 arguments."""

    def codegen(context, builder, signature, args):
        return emit_report(builder, *args)

    return types.int64(types.int64, types.int64, types.int64, types.int64), codegen


def emit_report(builder, frame, key, detail, errc):
    """The IR of :func:`report` (int64 IR values)."""
    message = _emit_python_call(builder, MESSAGE_SYMBOL, frame, key, detail)
    return _emit_create_error(builder, frame, message, errc)


@intrinsic(prefer_literal=True)
def frame_array(typingctx, frame, table, index, dtype, ndim, advise):
    """Buffer ``index`` of the call frame's arguments (``table`` :data:`ffi_abi.FRAME_ARGS`) or results
    (:data:`ffi_abi.FRAME_RETS`) as a C-contiguous array of ``dtype`` (a Numba type) and ``ndim``
    dimensions, over XLA's memory (not memory-managed); with ``advise`` 1 a large one is advised to
    huge pages first (:func:`evjax.backends.intrinsics.advise_huge_pages`).  ``table``, ``index``,
    ``ndim`` and ``advise`` are literals.

    One intrinsic per buffer, not a handler's statements loading the buffer, its data and extents and
    viewing them: Numba's typing and lowering of each statement cost every handler's compile."""
    literals = (table, index, ndim, advise)
    if not all(isinstance(v, types.IntegerLiteral) for v in literals) \
            or not isinstance(getattr(dtype, "dtype", None), types.Type):
        return None
    array_type = types.Array(dtype.dtype, ndim.literal_value, "C")

    def codegen(context, builder, signature, args):
        buffer = _field(builder, _field(builder, args[0], table.literal_value), 8 * index.literal_value)
        data = _field(builder, buffer, abi.BUFFER_DATA)
        extents = builder.inttoptr(_field(builder, buffer, abi.BUFFER_DIMS), _I64.as_pointer())
        shape = [builder.load(builder.gep(extents, [_I64(d)])) for d in range(array_type.ndim)]
        item = context.get_data_type(array_type.dtype)
        if advise.literal_value:
            size = _I64(context.get_abi_sizeof(item))
            for extent in shape:
                size = builder.mul(size, extent)
            emit_advise_huge_pages(builder, data, size)
        return _kernel_compat.c_array_value(context, builder, array_type, builder.inttoptr(data, item.as_pointer()),
                                            shape)

    return array_type(types.int64, table, index, dtype, ndim, advise), codegen


# ---------------------------------------------------------------------------
# Tiers: a handler that asks Python for the handler that takes over from it
# ---------------------------------------------------------------------------
_upgraders: dict[int, Callable[[bool, int], int]] = {}
_upgrade_errors: dict[int, BaseException] = {}


def register_upgrader(key: int, upgrade: Callable[[bool, int], int]) -> None:
    """Register ``upgrade(compile, slot) -> address`` for the handler of key ``key``: the address of
    the handler that takes over from that one, compiled or loaded; with ``compile`` False, 0 unless
    that costs no compile (see :func:`upgrade`).  ``slot`` is the address where the handler keeps it."""
    _upgraders[int(key)] = upgrade


def upgrade_error(key: int) -> BaseException | None:
    """Why the last upgrade of the handler of key ``key`` failed (None if it did not)."""
    return _upgrade_errors.get(int(key))


def _upgrade_address(key: int, compile: int, slot: int) -> int:
    """The address of the handler that takes over from the one of key ``key`` (with ``compile`` 0: only
    if that costs no compile); 0 if not, or if it could not be made (the error is kept for
    :func:`upgrade_error`).  Called from compiled code through :data:`UPGRADE_SYMBOL` (a ctypes
    callback, which takes the GIL): it never raises."""
    try:
        address = int(_upgraders[key](bool(compile), slot))
        _upgrade_errors.pop(key, None)
        return address
    except BaseException as exc:  # noqa: BLE001 - must not unwind into compiled code; reported by the handler
        _upgrade_errors[key] = exc
        return 0


UPGRADE_SYMBOL = "evjax_upgrade_handler"
_python_entry(UPGRADE_SYMBOL, _upgrade_address)  # (key, compile, slot) -> address


@intrinsic
def upgrade(typingctx, key, compile, slot):
    """The address of the handler that takes over from the handler of key ``key`` (compiled or loaded
    by the Python function registered with :func:`register_upgrader`; the call takes the GIL); 0 if
    that failed or, with ``compile`` 0, would need a compile.  The caller keeps the address at
    ``slot`` (which Python learns here, to hand a compiled one over itself)."""

    def codegen(context, builder, signature, args):
        return emit_upgrade(builder, *args)

    return types.int64(types.int64, types.int64, types.int64), codegen


def emit_upgrade(builder, key, compile, slot):
    """The IR of :func:`upgrade` (int64 IR values)."""
    return _emit_python_call(builder, UPGRADE_SYMBOL, key, compile, slot)


# What a serial tier returns (an int64): it did the call; it did, but what comes after it does the call
# faster (the full kernel would have split the work across threads, or a later tier runs a faster loop:
# same bits, only slower); it declined (wrote nothing: the next tier or the full kernel does it, e.g. a
# sum split into parts).  (evjax.backends.numba_cpu.call describes the tiers.)
DONE, SPLITTABLE, DECLINED = 0, 1, 2
KERNEL_RAISED, UPGRADE_FAILED = 0, 1  # what a tiered handler's error report says went wrong


@intrinsic
def after_tier(typingctx, frame, key, slot, outcome, start, hot_ns):
    """What a tiered handler returns (an ``XLA_FFI_Error*`` as int64, 0: done) once its serial tier,
    started at ``start`` (ns, :func:`evjax.backends.threads.now_ns`), returned ``outcome``; ``slot``
    is the handler's own slot (:func:`evjax.backends.intrinsics.own_slot`: the address of the
    handler that takes over, and the tier's time on splittable calls so far), ``key`` its key,
    ``hot_ns`` the time after which splittable calls compile the next handler
    (:data:`evjax.backends.numba_cpu.HOT_NS`, a constant of the handler's source).

    * DONE: 0.  A negative outcome (the tier raised): the error :func:`report` composes.
    * SPLITTABLE: 0; the first such call takes the next handler if that costs no compile
      (:func:`upgrade` with ``compile`` 0); once such calls have kept the tier busy
      ``hot_ns``, the next handler is compiled and kept in the slot.
    * DECLINED: the next handler is compiled (or loaded), kept in the slot, and does the call.

    One intrinsic, not the same steps as handler source: Numba's typing and lowering of each
    statement cost every tiered handler's compile (docs/performance.md has the figures)."""

    def codegen(context, builder, signature, args):
        frame, key, slot, outcome, start, hot_ns = args
        function = builder.function
        blocks = {name: function.append_basic_block(f"tier_{name}") for name in (
            "not_done", "raised", "not_raised", "splittable", "first", "first_found", "not_first",
            "compile", "failed", "found", "pass_on", "zero", "end")}
        end = blocks["end"]
        with builder.goto_entry_block():
            result = builder.alloca(_I64)

        def finish(value):
            builder.store(value, result)
            builder.branch(end)

        builder.cbranch(builder.icmp_signed("==", outcome, _I64(DONE)), blocks["zero"], blocks["not_done"])
        builder.position_at_end(blocks["not_done"])
        builder.cbranch(builder.icmp_signed("<", outcome, _I64(0)), blocks["raised"], blocks["not_raised"])
        builder.position_at_end(blocks["raised"])
        finish(emit_report(builder, frame, key, _I64(KERNEL_RAISED), _I64(abi.ERRC_INTERNAL)))
        builder.position_at_end(blocks["not_raised"])
        splittable = builder.icmp_signed("==", outcome, _I64(SPLITTABLE))
        builder.cbranch(splittable, blocks["splittable"], blocks["compile"])

        builder.position_at_end(blocks["splittable"])
        spent = builder.sub(emit_now_ns(builder), start)
        spent = builder.select(builder.icmp_signed(">", spent, _I64(0)), spent, _I64(1))
        before = emit_fetch_add_i64(builder, builder.add(slot, _I64(8)), spent)  # the tier's time so far
        builder.cbranch(builder.icmp_signed("==", before, _I64(0)), blocks["first"], blocks["not_first"])
        builder.position_at_end(blocks["first"])  # the next handler now, if that costs no compile
        full = emit_upgrade(builder, key, _I64(0), slot)
        builder.cbranch(builder.icmp_signed("!=", full, _I64(0)), blocks["first_found"], blocks["zero"])
        builder.position_at_end(blocks["first_found"])
        emit_store_release_i64(builder, slot, full)
        builder.branch(blocks["zero"])
        builder.position_at_end(blocks["not_first"])
        hot = builder.icmp_signed(">=", builder.add(before, spent), hot_ns)
        builder.cbranch(hot, blocks["compile"], blocks["zero"])

        builder.position_at_end(blocks["compile"])
        full = emit_upgrade(builder, key, _I64(1), slot)
        builder.cbranch(builder.icmp_signed("==", full, _I64(0)), blocks["failed"], blocks["found"])
        builder.position_at_end(blocks["failed"])
        finish(emit_report(builder, frame, key, _I64(UPGRADE_FAILED), _I64(abi.ERRC_INTERNAL)))
        builder.position_at_end(blocks["found"])
        emit_store_release_i64(builder, slot, full)
        builder.cbranch(splittable, blocks["zero"], blocks["pass_on"])
        builder.position_at_end(blocks["pass_on"])  # a declined call: the next handler does it
        finish(emit_call_ptr_ptr(builder, full, frame))
        builder.position_at_end(blocks["zero"])
        finish(_I64(0))
        builder.position_at_end(end)
        return builder.load(result)

    return types.int64(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64), codegen


# ---------------------------------------------------------------------------
# Handler modules
# ---------------------------------------------------------------------------
_TEMPLATE = '''\
# Generated by evjax.backends.ffi_core: an XLA FFI handler as a numba cfunc.
import numba
from numba import types
from evjax.backends.intrinsics import *  # noqa: F403
from evjax.backends.ffi_core import prologue, PROCEED, create_error, report, upgrade, after_tier, frame_array, \\
    query_stream, query_device_ordinal, scalar_attribute, array_attribute
{imports}
{preamble}

@{decorator}(types.voidptr(types.voidptr), cache={cache}, nogil=True)
def handler(frame_pointer):
    frame = as_int(frame_pointer)
    prologue_result = prologue(frame, numba.int64({traits}), numba.int64({major}), numba.int64({minor}))
    if prologue_result != PROCEED:
        return as_voidptr(prologue_result)
{body}
'''
_CORE_SOURCES = ("ffi_abi.py", "intrinsics.py", "ffi_core.py", "threads.py")  # what handlers compile in
_modules: dict[str, object] = {}
_lock = threading.RLock()


@functools.lru_cache(maxsize=None)
def _sources_fingerprint(paths: tuple[str, ...]) -> str:
    """A digest of the files' contents, read once per process."""
    digest = hashlib.sha1()
    for path in paths:
        try:
            with open(path, "rb") as f:
                digest.update(f.read())
        except OSError:
            digest.update(path.encode())
    return digest.hexdigest()


def compile_handler(body: str, *, traits: int = 0, imports: str = "", preamble: str = "",
                    namespace: dict | None = None, cache: bool = True, fingerprint: str = "",
                    depends=(), lazy: bool = False) -> tuple[object, str]:
    """Write (once), load (once per process) and return a handler module and its digest.

    Args:
        body: the handler's statements after the prologue, indented by 4
            spaces; ``frame`` is the call frame's address; each path returns
            ``as_voidptr(error_or_0)``.
        traits: the FFI traits the metadata query declares (1: CUDA-graph safe).
        imports, preamble: module-level source before the handler.
        namespace: globals to inject before the module runs (e.g. the kernel).
        cache: let Numba cache the compiled handler on disk.
        fingerprint: whatever else the handler's machine code depends on (a
            kernel's source and closure); with ``cache=False`` the module is
            named for this process only, and its file removed once loaded.
        depends: modules whose compiled helpers the handler inlines.
        lazy: leave ``module.handler`` uncompiled (a
            :func:`evjax._kernel_compat.lazy_cfunc`): the caller compiles it
            with :func:`evjax._kernel_compat.compile_cfunc`, maybe on another
            thread, after asking :func:`evjax._kernel_compat.cfunc_in_disk_cache`.

    Returns:
        ``(module, digest)``; the compiled handler is ``module.handler``, and
        ``module.HANDLER_KEY`` (an int derived from the digest, the same in every
        process) is the key to register a describer of its errors under.

    Raises:
        evjax.backends.ffi_abi.FFIABIError: the installed jaxlib's FFI header lays
            out the call frame differently from evjax's offsets.
    """
    major, minor = abi.handler_api_version()  # raises FFIABIError for a jaxlib of another ABI
    decorator = "_lazy_cfunc" if lazy else "numba.cfunc"
    if lazy:
        imports = "from evjax._kernel_compat import lazy_cfunc as _lazy_cfunc\n" + imports
    source = _TEMPLATE.format(imports=imports, preamble=preamble, decorator=decorator, cache=cache,
                              traits=int(traits), major=major, minor=minor, body=body.rstrip())
    here = os.path.dirname(os.path.abspath(__file__))
    paths = tuple(os.path.join(here, name) for name in _CORE_SOURCES) + tuple(m.__file__ for m in depends)
    digest = hashlib.sha1("\n".join([
        source, fingerprint, _sources_fingerprint(paths), numba.__version__, f"format={HANDLER_FORMAT}",
    ]).encode()).hexdigest()[:20]
    if not cache:  # not cached on disk: a module of this process only (same content, same module)
        digest = f"{digest}_{os.getpid()}"
    name = f"_evjax_handler_{digest}"
    with _lock:
        module = _modules.get(name)
        if module is None:
            namespace = dict(namespace or {}, HANDLER_KEY=int(digest[:15], 16))
            module = _modules[name] = _load(name, source, namespace, keep_file=cache)
    return module, digest


def _load(module_name: str, source: str, namespace: dict, *, keep_file: bool):
    """Run the handler module ``module_name`` from its file in the cache folder (written if
    missing or corrupted), or in memory where that folder cannot be written.

    The module's code is compiled from ``source`` itself, never from the file
    or a ``.pyc``: the file is there for Numba's cache, which is keyed by it.
    """
    path = _write_module(module_name, source)
    if path is None:  # not writable: compiled in memory, and Numba caches none of it
        filename = _disk_cache.in_memory_filename(module_name)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(module_name, None, origin=filename))
        module.__file__ = filename
    else:
        filename = path
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(module_name, path))
    module.__dict__.update(namespace)
    sys.modules[module_name] = module
    try:
        code = compile(source, filename, "exec")
        with _kernel_compat.quiet_numba_compile(), _disk_cache.compiling():
            exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    if not keep_file and path is not None:
        _disk_cache.remove(path)
    return module


def _write_module(module_name: str, source: str) -> str | None:
    """The path of the module's file in the cache folder, written unless it holds ``source``
    already; None (with one logged line per process) where the folder cannot be written.

    A file of that name holding anything else is corrupted (the name is a
    digest of the content): it is replaced, with one logged line.
    """
    root = cache_dir()
    folder = os.path.join(root, "handlers")
    path = os.path.join(folder, module_name + ".py")
    text = source.encode("utf-8")
    try:
        with open(path, "rb") as f:
            found = f.read()
    except OSError:
        found = None
    if found == text:
        return path
    if found is not None:
        _disk_cache.discarded(path, ValueError("it does not hold the module's generated source"))
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        _disk_cache.remove(tmp)
        _disk_cache.unwritable(root, exc)
        return None
    return path


# ---------------------------------------------------------------------------
# Handlers that run Python (through one compiled trampoline)
# ---------------------------------------------------------------------------
CALLBACK_ATTRIBUTE = "evjax_callback"  # the attribute carrying a PythonHandler's callback address
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
_TRAMPOLINE_BODY = f"""\
    callback = scalar_attribute(frame)
    if callback == 0:
        return as_voidptr(create_error(frame, cstring("evjax: a Python handler was called without its "
                                                     "'{CALLBACK_ATTRIBUTE}' attribute"),
                                       numba.int64({abi.ERRC_INVALID_ARGUMENT})))
    status = call_ptr_ptr(callback, frame)
    if status == -1:
        return as_voidptr(report(frame, numba.int64({PYTHON_EXCEPTION}), numba.int64(0),
                                 numba.int64({abi.ERRC_INTERNAL})))
    return as_voidptr(status)
"""
_registered_targets: set[str] = set()


def python_target(platform: str) -> str:
    """The FFI target of the compiled trampoline into Python on ``platform`` ("cpu" or "CUDA").

    Registered once per process and platform; each call passes its
    :class:`PythonHandler`'s attributes.
    """
    import jax

    name = f"evjax_python_{platform.lower()}"
    with _lock:
        if name not in _registered_targets:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(_trampoline_address()), platform=platform)
            _registered_targets.add(name)
    return name


def _trampoline_address() -> int:
    return int(compile_handler(_TRAMPOLINE_BODY)[0].handler.address)


class PythonHandler:
    """A handler whose work is ``run(frame) -> XLA error address or 0``, in Python.

    Call its :attr:`target_name` with ``**handler.attributes``.  An exception
    in ``run`` becomes an XLA error carrying ``who`` and the exception's text.
    Keep the object alive as long as XLA may call it.
    """

    def __init__(self, who: str, run: Callable[[int], int], platform: str = "CUDA"):
        self.who = who
        self.run = run
        self.callback = _CALLBACK(self._call)
        self.callback_address = int(ctypes.cast(self.callback, ctypes.c_void_p).value)
        self.target_name = python_target(platform)
        self.attributes = {CALLBACK_ATTRIBUTE: np.int64(self.callback_address)}
        self.address = _trampoline_address()

    def _call(self, frame: int) -> int:
        try:
            return int(self.run(frame) or 0)
        except BaseException as exc:  # noqa: BLE001 - must not unwind into XLA
            _local.pending = f"evjax: {self.who} raised {type(exc).__name__}: {exc}"
            return -1

