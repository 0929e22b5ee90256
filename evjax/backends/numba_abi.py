"""Numba intrinsics that read and write raw memory of the XLA FFI call frame.

They let a ``@numba.cfunc`` be the FFI handler itself: the frame is decoded by
compiled code and no Python runs on the per-call path.  Offsets come from
:mod:`evjax.backends.ffi_abi`.
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _byte_address(builder, base, offset):
    raw = builder.bitcast(base, cgutils.int8_t.as_pointer())
    return builder.gep(raw, [offset])


def _make_loader(llvm_type, numba_type):
    @intrinsic
    def load(typingctx, base, offset):
        def codegen(context, builder, signature, args):
            address = _byte_address(builder, args[0], args[1])
            return builder.load(builder.bitcast(address, llvm_type.as_pointer()))

        return numba_type(types.voidptr, types.int64), codegen

    return load


load_i64 = _make_loader(cgutils.intp_t, types.int64)
load_i32 = _make_loader(cgutils.int32_t, types.int32)


@intrinsic
def store_i32(typingctx, base, offset, value):
    """``*(int32*)(base + offset) = value``."""

    def codegen(context, builder, signature, args):
        address = _byte_address(builder, args[0], args[1])
        builder.store(args[2], builder.bitcast(address, cgutils.int32_t.as_pointer()))

    return types.void(types.voidptr, types.int64, types.int32), codegen


@intrinsic
def to_voidptr(typingctx, address):
    """Reinterpret an int64 as a ``void*``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@intrinsic
def voidptr_to_int(typingctx, pointer):
    """Reinterpret a ``void*`` as an int64."""

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], cgutils.intp_t)

    return types.int64(types.voidptr), codegen


@intrinsic
def typed_pointer(typingctx, address, dtype):
    """Reinterpret an int64 as a pointer to ``dtype`` (for ``numba.carray``)."""
    pointer_type = types.CPointer(dtype.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer_type))

    return pointer_type(types.int64, dtype), codegen
