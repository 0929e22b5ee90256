"""Numba intrinsics over raw memory: the one set every compiled FFI handler uses.

Addresses are plain ``int64`` values (a pointer read from memory, or a
``void*`` turned into one with :func:`as_int`), so handler code reads like C
with casts: ``load_i64(frame + FRAME_ARGS)``.  Only ``numba.extending.intrinsic``
(Numba's documented extension API) and llvmlite's IR builder are used.
"""
from __future__ import annotations

import ctypes
import hashlib
import sys

from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = [
    "load_i64", "load_i32", "load_i64_unaligned", "store_i64", "store_i32", "store_u16",
    "as_int", "as_voidptr", "typed_pointer", "stack_bytes", "cstring", "constant_cstring", "emit_stack_bytes",
    "emit_call_ptr_ptr", "emit_load", "emit_store", "emit_advise_huge_pages", "emit_store_release_i64",
    "emit_fetch_add_i64",
    "call_ptr_ptr", "call_void_ptr_ptr", "call_i32_ptr", "advise_huge_pages", "own_slot", "load_acquire_i64", "store_release_i64", "fetch_add_i64",
    "prefetch",
]

I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = I8.as_pointer()


def _pointer(builder, address, kind):
    return builder.inttoptr(address, kind.as_pointer())


def emit_load(builder, address, kind):
    """The IR of ``*(kind*)address`` (``address`` an int64 IR value)."""
    return builder.load(_pointer(builder, address, kind))


def emit_store(builder, address, value, kind):
    """The IR of ``*(kind*)address = value`` (a wider integer ``value`` is truncated)."""
    if value.type != kind:
        value = builder.trunc(value, kind)
    builder.store(value, _pointer(builder, address, kind))


def _loader(kind, numba_type, doc):
    def load(typingctx, address):
        def codegen(context, builder, signature, args):
            return emit_load(builder, args[0], kind)

        return numba_type(types.int64), codegen

    load.__doc__ = doc
    return intrinsic(load)


def _storer(kind, numba_type, doc):
    def store(typingctx, address, value):
        def codegen(context, builder, signature, args):
            emit_store(builder, args[0], args[1], kind)  # (narrower stores take a wider integer)

        return types.void(types.int64, numba_type), codegen

    store.__doc__ = doc
    return intrinsic(store)


load_i64 = _loader(I64, types.int64, "``*(int64*)address``.")
load_i32 = _loader(I32, types.int32, "``*(int32*)address``.")


@intrinsic
def load_i64_unaligned(typingctx, address):
    """``*(int64*)address`` at any byte address (a load aligned to 1 byte: eight bytes of a byte array)."""

    def codegen(context, builder, signature, args):
        return builder.load(_pointer(builder, args[0], I64), align=1)

    return types.int64(types.int64), codegen
store_i64 = _storer(I64, types.int64, "``*(int64*)address = value``.")
store_i32 = _storer(I32, types.int32, "``*(int32*)address = value``.")
store_u16 = _storer(I16, types.int64, "``*(uint16*)address = (uint16)value``.")


@intrinsic
def load_acquire_i64(typingctx, address):
    """``*(int64*)address``, an atomic load with acquire ordering (what another thread released)."""

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_pointer(builder, args[0], I64), "acquire", 8)

    return types.int64(types.int64), codegen


@intrinsic
def store_release_i64(typingctx, address, value):
    """``*(int64*)address = value``, an atomic store with release ordering."""

    def codegen(context, builder, signature, args):
        emit_store_release_i64(builder, *args)

    return types.void(types.int64, types.int64), codegen


def emit_store_release_i64(builder, address, value):
    """The IR of :func:`store_release_i64` (int64 IR values)."""
    builder.store_atomic(value, _pointer(builder, address, I64), "release", 8)


@intrinsic
def fetch_add_i64(typingctx, address, value):
    """``*(int64*)address += value``, atomically; the value before."""

    def codegen(context, builder, signature, args):
        return emit_fetch_add_i64(builder, *args)

    return types.int64(types.int64, types.int64), codegen


def emit_fetch_add_i64(builder, address, value):
    """The IR of :func:`fetch_add_i64` (int64 IR values)."""
    return builder.atomic_rmw("add", _pointer(builder, address, I64), value, "monotonic")


# llvm.prefetch is overloaded on its pointer type: "p0" where llvmlite's pointers are opaque (llvmlite
# 0.50, checked), "p0i8" where they are typed (llvmlite 0.43 with numba 0.60, checked).
_PREFETCH = "llvm.prefetch.p0" if str(PTR) == "ptr" else "llvm.prefetch.p0i8"


@intrinsic
def prefetch(typingctx, address):
    """A hint that the cache line at ``address`` will be read soon (``llvm.prefetch``: a read, kept
    in every cache level, data): it changes no value, and no address faults."""

    def codegen(context, builder, signature, args):
        function = builder.module.globals.get(_PREFETCH)
        if function is None:
            function = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]), _PREFETCH)
        builder.call(function, [builder.inttoptr(args[0], PTR), I32(0), I32(3), I32(1)])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


OWN_SLOT = "evjax_own_slot"
OWN_SLOT_WORDS = 2


@intrinsic
def own_slot(typingctx):
    """The int64 address of :data:`OWN_SLOT_WORDS` int64 of the calling function's own module, 0 when
    its code is loaded.

    A private global (internal linkage) of the module being compiled: each
    compiled handler that calls this gets a slot of its own, fresh in every
    process (also when its machine code comes from Numba's disk cache).  Call it
    in the handler's own body, not in a helper compiled separately (that
    helper's module would own the slot, shared by every caller).
    """

    def codegen(context, builder, signature, args):
        module = builder.module
        try:
            variable = module.get_global(OWN_SLOT)
        except KeyError:
            kind = ir.ArrayType(I64, OWN_SLOT_WORDS)
            variable = ir.GlobalVariable(module, kind, name=OWN_SLOT)
            variable.linkage = "internal"
            variable.initializer = ir.Constant(kind, [I64(0)] * OWN_SLOT_WORDS)
            variable.align = 8
        return builder.ptrtoint(variable, I64)

    return types.int64(), codegen


@intrinsic
def as_int(typingctx, pointer):
    """A ``void*`` as an int64 address."""

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], I64)

    return types.int64(types.voidptr), codegen


@intrinsic
def as_voidptr(typingctx, address):
    """An int64 address as a ``void*`` (a handler's return value)."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], PTR)

    return types.voidptr(types.int64), codegen


@intrinsic
def typed_pointer(typingctx, address, dtype):
    """An int64 address as a pointer to ``dtype``'s scalars (for ``numba.carray``)."""
    pointer_type = types.CPointer(dtype.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer_type))

    return pointer_type(types.int64, dtype), codegen


@intrinsic(prefer_literal=True)
def stack_bytes(typingctx, size):
    """The int64 address of ``size`` (a literal) bytes on the calling function's stack, 16-aligned.

    The space is reserved in the function's entry block, so a call in a loop
    reuses it; it lives until the (inlined-into) function returns.
    """
    if not isinstance(size, types.IntegerLiteral):
        return None
    n = int(size.literal_value)

    def codegen(context, builder, signature, args):
        return emit_stack_bytes(builder, n)

    return types.int64(size), codegen


def emit_stack_bytes(builder, n: int):
    """The IR of :func:`stack_bytes`: ``n`` bytes reserved in the entry block, 16-aligned, as an int64."""
    with builder.goto_entry_block():
        slot = builder.alloca(ir.ArrayType(I8, n), name="evjax_stack")
        slot.align = 16
    return builder.ptrtoint(slot, I64)


def constant_cstring(builder, text: str):
    """The int64 address of a constant NUL-terminated copy of ``text`` in the builder's module (one
    per distinct text and module): the IR behind :func:`cstring`."""
    data = bytearray(text.encode("utf-8")) + b"\0"
    module = builder.module
    name = "evjax_cstring_" + hashlib.sha1(bytes(data)).hexdigest()[:16]
    try:
        variable = module.get_global(name)
    except KeyError:
        constant = ir.Constant(ir.ArrayType(I8, len(data)), data)
        variable = ir.GlobalVariable(module, constant.type, name=name)
        variable.global_constant = True
        variable.linkage = "internal"
        variable.initializer = constant
    return builder.ptrtoint(variable, I64)


@intrinsic
def cstring(typingctx, text):
    """The int64 address of a constant NUL-terminated copy of ``text`` (a string literal)."""
    if not isinstance(text, types.StringLiteral):
        return None
    value = text.literal_value

    def codegen(context, builder, signature, args):
        return constant_cstring(builder, value)

    return types.int64(text), codegen


@intrinsic
def call_ptr_ptr(typingctx, function, argument):
    """Call ``void* function(void*)`` (XLA's API entries take one argument struct); int64 result."""

    def codegen(context, builder, signature, args):
        return emit_call_ptr_ptr(builder, *args)

    return types.int64(types.int64, types.int64), codegen


def emit_call_ptr_ptr(builder, function, argument):
    """The IR of :func:`call_ptr_ptr`: ``((void* (*)(void*)) function)((void*) argument)`` as an int64."""
    result = builder.call(_pointer(builder, function, ir.FunctionType(PTR, [PTR])), [builder.inttoptr(argument, PTR)])
    return builder.ptrtoint(result, I64)


@intrinsic
def call_void_ptr_ptr(typingctx, function, first, second):
    """Call ``void function(void*, void*)``."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR])
        builder.call(_pointer(builder, args[0], fnty),
                     [builder.inttoptr(args[1], PTR), builder.inttoptr(args[2], PTR)])

    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def call_i32_ptr(typingctx, function, argument):
    """Call ``int function(void*)`` (e.g. the CUDA driver's ``cuCtxGetCurrent``)."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(I32, [PTR])
        return builder.call(_pointer(builder, args[0], fnty), [builder.inttoptr(args[1], PTR)])

    return types.int32(types.int64, types.int64), codegen


# ---------------------------------------------------------------------------
# Transparent huge pages for large outputs (Linux)
# ---------------------------------------------------------------------------
HUGE_PAGE = 1 << 21  # bytes of an x86-64 / arm64 transparent huge page
HUGE_PAGE_MIN_BYTES = 1 << 22  # advise buffers of at least this size, as NumPy does for its own (4 MiB)
MADV_HUGEPAGE = 14
MADVISE_SYMBOL = "evjax_madvise"


def _madvise_address() -> int:
    """The address of libc's ``madvise`` (Linux), else 0."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return int(ctypes.cast(ctypes.CDLL(None).madvise, ctypes.c_void_p).value or 0)
    except (OSError, AttributeError):
        return 0


_MADVISE = _madvise_address()
if _MADVISE:
    # resolved when a handler's machine code is linked (compiled, or loaded from the disk cache)
    llvm.add_symbol(MADVISE_SYMBOL, _MADVISE)


@intrinsic
def advise_huge_pages(typingctx, address, nbytes):
    """``madvise(MADV_HUGEPAGE)`` over the whole 2 MiB pages inside ``[address, address + nbytes)``,
    where ``nbytes >= HUGE_PAGE_MIN_BYTES`` (Linux; elsewhere nothing).

    XLA allocates a large output buffer afresh at each call, and the kernel's
    first write to each 4 KiB page costs a page fault: 16384 of them for 64 MiB,
    most of the time of a memory-bound kernel such as a dense weight gradient.
    Linux's ``transparent_hugepage=madvise`` mode (the common default) maps 2 MiB
    pages only where asked, as NumPy asks for its own large arrays.  A hint: the
    contents and the results do not change, and a failed call changes nothing.
    """

    def codegen(context, builder, signature, args):
        emit_advise_huge_pages(builder, *args)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


def emit_advise_huge_pages(builder, start_address, size):
    """The IR of :func:`advise_huge_pages` (int64 IR values; nothing where libc has no ``madvise``)."""
    if not _MADVISE:
        return
    mask = I64(~(HUGE_PAGE - 1))
    start = builder.and_(builder.add(start_address, I64(HUGE_PAGE - 1)), mask)
    end = builder.and_(builder.add(start_address, size), mask)
    large = builder.icmp_signed(">=", size, I64(HUGE_PAGE_MIN_BYTES))
    whole_pages = builder.icmp_signed(">", end, start)
    with builder.if_then(builder.and_(large, whole_pages), likely=False):
        callee = builder.module.globals.get(MADVISE_SYMBOL)
        if callee is None:
            callee = ir.Function(builder.module, ir.FunctionType(I32, [I64, I64, I32]), MADVISE_SYMBOL)
        builder.call(callee, [start, builder.sub(end, start), I32(MADV_HUGEPAGE)])
