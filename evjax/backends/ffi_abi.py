"""The typed XLA FFI call frame: offsets, dtype codes, the check of both against jaxlib, and a ``ctypes`` decoder.

The offsets are those of ``xla/ffi/api/c_api.h`` on LP64 platforms, XLA FFI
API 0.3 (jaxlib 0.10).  Nothing in XLA's call frame tells a handler where a
field is, so each constant names its field (:data:`FIELDS`, :data:`STRUCTS`,
:data:`ENUMS`) and :func:`handler_api_version`, run before the first handler
is compiled, lays out the header shipped inside the installed jaxlib and
compares: a jaxlib whose ABI moved raises :class:`FFIABIError` instead of
letting every handler read garbage.  Compiled handlers read the frame with
:mod:`evjax.backends.intrinsics` and share the prologue of
:mod:`evjax.backends.ffi_core`, which checks the frame's ``struct_size`` and
the API table's major version on every call; the ``ctypes`` view here
(:func:`decode_frame`, :func:`get_stream`) serves the rare paths that run
Python: describing a kernel's exception and Numba CUDA's Python launch path.
"""
from __future__ import annotations

import ast
import ctypes
import functools
import os
import re
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import KernelError

# --- The API evjax's handlers are built for ---------------------------------
API_MAJOR = 0  # XLA_FFI_API_MAJOR: a jaxlib with another major version moved the ABI
API_MINOR = 3  # XLA_FFI_API_MINOR of the header these constants were written from
SUPPORTED_JAX = "jax>=0.10,<0.12"  # the jax/jaxlib range of pyproject.toml

# --- XLA_FFI_CallFrame ------------------------------------------------------
FRAME_EXTENSION_START = 8
FRAME_API = 16
FRAME_CTX = 24
FRAME_STAGE = 32
FRAME_ARGS_SIZE = 56
FRAME_ARGS_TYPES = 64
FRAME_ARGS = 72
FRAME_RETS_SIZE = 96
FRAME_RETS_TYPES = 104
FRAME_RETS = 112
FRAME_ATTRS_SIZE = 136
FRAME_ATTRS_TYPES = 144
FRAME_ATTRS_NAMES = 152
FRAME_ATTRS = 160
STAGE_EXECUTE = 3

# --- XLA_FFI_Buffer ---------------------------------------------------------
BUFFER_DTYPE = 16
BUFFER_DATA = 24
BUFFER_RANK = 32
BUFFER_DIMS = 40

# --- Metadata extension -----------------------------------------------------
EXT_TYPE = 8
EXT_TYPE_METADATA = 1
EXT_METADATA_PTR = 24
METADATA_API_MAJOR = 24
METADATA_API_MINOR = 28
METADATA_TRAITS = 32
TRAIT_COMMAND_BUFFER_COMPATIBLE = 1

# --- XLA_FFI_Api ------------------------------------------------------------
API_VERSION_MAJOR = 32
API_VERSION_MINOR = 36
API_ERROR_CREATE = 48
API_STREAM_GET = 80
API_DEVICE_ORDINAL_GET = 184  # optional: used only where the table's struct_size covers it
ARGS_EXTENSION_START = 8  # extension_start of the argument structs below
ERROR_CREATE_MESSAGE = 16
ERROR_CREATE_ERRC = 24
ERROR_CREATE_ARGS_SIZE = 28  # XLA_FFI_STRUCT_SIZE(XLA_FFI_Error_Create_Args, errc)
STREAM_GET_CTX = 16
STREAM_GET_STREAM = 24
STREAM_GET_ARGS_SIZE = 32  # XLA_FFI_STRUCT_SIZE(XLA_FFI_Stream_Get_Args, stream)
DEVICE_ORDINAL_GET_CTX = 16
DEVICE_ORDINAL_GET_ORDINAL = 24
DEVICE_ORDINAL_GET_ARGS_SIZE = 28  # XLA_FFI_STRUCT_SIZE(XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal)

# --- Attributes ---------------------------------------------------------------
ATTR_DTYPE = 0  # offset of the dtype in XLA_FFI_Scalar and XLA_FFI_Array
SCALAR_VALUE = 8  # offset of ``void* value`` in XLA_FFI_Scalar {int32 dtype; void* value}
ARRAY_SIZE = 8  # XLA_FFI_Array {int32 dtype; size_t size; void* data}
ARRAY_DATA = 16
FFI_DTYPE_CODES_S64 = 5  # XLA_FFI_DataType of int64
ERRC_INVALID_ARGUMENT = 3
ERRC_FAILED_PRECONDITION = 9
ERRC_INTERNAL = 13

# --- struct_size: XLA_FFI_STRUCT_SIZE(struct, last field), what XLA writes in a struct's first field
CALL_FRAME_STRUCT_SIZE = 168  # the prologue compares every call frame's with this
ARGS_STRUCT_SIZE = 40
RETS_STRUCT_SIZE = 40
ATTRS_STRUCT_SIZE = 48
BUFFER_STRUCT_SIZE = 48
EXTENSION_BASE_STRUCT_SIZE = 24
METADATA_EXTENSION_STRUCT_SIZE = 32  # the prologue wants at least this much of the metadata query's
METADATA_STRUCT_SIZE = 36  # ... and of its XLA_FFI_Metadata
API_VERSION_STRUCT_SIZE = 24
API_STRUCT_SIZE = 192  # the API table grows with minor versions: the header's may be larger

# Which field of ``c_api.h`` each offset above is, and how many bytes evjax reads or writes there.
FIELDS: tuple[tuple[str, str, str, int], ...] = (
    ("FRAME_EXTENSION_START", "XLA_FFI_CallFrame", "extension_start", 8),
    ("FRAME_API", "XLA_FFI_CallFrame", "api", 8),
    ("FRAME_CTX", "XLA_FFI_CallFrame", "ctx", 8),
    ("FRAME_STAGE", "XLA_FFI_CallFrame", "stage", 4),
    ("FRAME_ARGS_SIZE", "XLA_FFI_CallFrame", "args.size", 8),
    ("FRAME_ARGS_TYPES", "XLA_FFI_CallFrame", "args.types", 8),
    ("FRAME_ARGS", "XLA_FFI_CallFrame", "args.args", 8),
    ("FRAME_RETS_SIZE", "XLA_FFI_CallFrame", "rets.size", 8),
    ("FRAME_RETS_TYPES", "XLA_FFI_CallFrame", "rets.types", 8),
    ("FRAME_RETS", "XLA_FFI_CallFrame", "rets.rets", 8),
    ("FRAME_ATTRS_SIZE", "XLA_FFI_CallFrame", "attrs.size", 8),
    ("FRAME_ATTRS_TYPES", "XLA_FFI_CallFrame", "attrs.types", 8),
    ("FRAME_ATTRS_NAMES", "XLA_FFI_CallFrame", "attrs.names", 8),
    ("FRAME_ATTRS", "XLA_FFI_CallFrame", "attrs.attrs", 8),
    ("BUFFER_DTYPE", "XLA_FFI_Buffer", "dtype", 4),
    ("BUFFER_DATA", "XLA_FFI_Buffer", "data", 8),
    ("BUFFER_RANK", "XLA_FFI_Buffer", "rank", 8),
    ("BUFFER_DIMS", "XLA_FFI_Buffer", "dims", 8),
    ("EXT_TYPE", "XLA_FFI_Extension_Base", "type", 4),
    ("EXT_METADATA_PTR", "XLA_FFI_Metadata_Extension", "metadata", 8),
    ("METADATA_API_MAJOR", "XLA_FFI_Metadata", "api_version.major_version", 4),
    ("METADATA_API_MINOR", "XLA_FFI_Metadata", "api_version.minor_version", 4),
    ("METADATA_TRAITS", "XLA_FFI_Metadata", "traits", 4),
    ("API_VERSION_MAJOR", "XLA_FFI_Api", "api_version.major_version", 4),
    ("API_VERSION_MINOR", "XLA_FFI_Api", "api_version.minor_version", 4),
    ("API_ERROR_CREATE", "XLA_FFI_Api", "XLA_FFI_Error_Create", 8),
    ("API_STREAM_GET", "XLA_FFI_Api", "XLA_FFI_Stream_Get", 8),
    ("API_DEVICE_ORDINAL_GET", "XLA_FFI_Api", "XLA_FFI_DeviceOrdinal_Get", 8),
    ("ARGS_EXTENSION_START", "XLA_FFI_Error_Create_Args", "extension_start", 8),
    ("ERROR_CREATE_MESSAGE", "XLA_FFI_Error_Create_Args", "message", 8),
    ("ERROR_CREATE_ERRC", "XLA_FFI_Error_Create_Args", "errc", 4),
    ("ARGS_EXTENSION_START", "XLA_FFI_Stream_Get_Args", "extension_start", 8),
    ("STREAM_GET_CTX", "XLA_FFI_Stream_Get_Args", "ctx", 8),
    ("STREAM_GET_STREAM", "XLA_FFI_Stream_Get_Args", "stream", 8),
    ("ARGS_EXTENSION_START", "XLA_FFI_DeviceOrdinal_Get_Args", "extension_start", 8),
    ("DEVICE_ORDINAL_GET_CTX", "XLA_FFI_DeviceOrdinal_Get_Args", "ctx", 8),
    ("DEVICE_ORDINAL_GET_ORDINAL", "XLA_FFI_DeviceOrdinal_Get_Args", "device_ordinal", 4),
    ("ATTR_DTYPE", "XLA_FFI_Scalar", "dtype", 4),
    ("SCALAR_VALUE", "XLA_FFI_Scalar", "value", 8),
    ("ATTR_DTYPE", "XLA_FFI_Array", "dtype", 4),
    ("ARRAY_SIZE", "XLA_FFI_Array", "size", 8),
    ("ARRAY_DATA", "XLA_FFI_Array", "data", 8),
)

# The struct_size of each struct evjax reads or fills, and how the header's must compare with it:
# "==", or ">=" for the API table (minor versions append entries to it).
STRUCTS: tuple[tuple[str, str, str], ...] = (
    ("CALL_FRAME_STRUCT_SIZE", "XLA_FFI_CallFrame", "=="),
    ("ARGS_STRUCT_SIZE", "XLA_FFI_Args", "=="),
    ("RETS_STRUCT_SIZE", "XLA_FFI_Rets", "=="),
    ("ATTRS_STRUCT_SIZE", "XLA_FFI_Attrs", "=="),
    ("BUFFER_STRUCT_SIZE", "XLA_FFI_Buffer", "=="),
    ("EXTENSION_BASE_STRUCT_SIZE", "XLA_FFI_Extension_Base", "=="),
    ("METADATA_EXTENSION_STRUCT_SIZE", "XLA_FFI_Metadata_Extension", "=="),
    ("METADATA_STRUCT_SIZE", "XLA_FFI_Metadata", "=="),
    ("API_VERSION_STRUCT_SIZE", "XLA_FFI_Api_Version", "=="),
    ("API_STRUCT_SIZE", "XLA_FFI_Api", ">="),
    ("ERROR_CREATE_ARGS_SIZE", "XLA_FFI_Error_Create_Args", "=="),
    ("STREAM_GET_ARGS_SIZE", "XLA_FFI_Stream_Get_Args", "=="),
    ("DEVICE_ORDINAL_GET_ARGS_SIZE", "XLA_FFI_DeviceOrdinal_Get_Args", "=="),
)

# The enumerators evjax compares with or passes.
ENUMS: tuple[tuple[str, str], ...] = (
    ("STAGE_EXECUTE", "XLA_FFI_ExecutionStage_EXECUTE"),
    ("EXT_TYPE_METADATA", "XLA_FFI_Extension_Metadata"),
    ("TRAIT_COMMAND_BUFFER_COMPATIBLE", "XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE"),
    ("FFI_DTYPE_CODES_S64", "XLA_FFI_DataType_S64"),
    ("ERRC_INVALID_ARGUMENT", "XLA_FFI_Error_Code_INVALID_ARGUMENT"),
    ("ERRC_FAILED_PRECONDITION", "XLA_FFI_Error_Code_FAILED_PRECONDITION"),
    ("ERRC_INTERNAL", "XLA_FFI_Error_Code_INTERNAL"),
)

# The dtypes every kernel backend (Numba CPU and CUDA, Warp) takes: bool, signed and
# unsigned integers of 8 to 64 bits, float16/32/64.  Each backend keeps its own
# mapping to type names and adds what only it supports (Numba: complex).
COMMON_KERNEL_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(name)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    + ("float16", "float32", "float64")
)

# XLA_FFI_DataType codes <-> numpy dtypes.
FFI_DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.bool_): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.uint8): 6,
    np.dtype(np.uint16): 7,
    np.dtype(np.uint32): 8,
    np.dtype(np.uint64): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float32): 11,
    np.dtype(np.float64): 12,
    np.dtype(np.complex64): 15,
    np.dtype(np.complex128): 18,
}
CODE_TO_DTYPE = {code: dt for dt, code in FFI_DTYPE_CODES.items()}
_DTYPE_ENUMS = {"bool": "PRED", "int8": "S8", "int16": "S16", "int32": "S32", "int64": "S64", "uint8": "U8",
                "uint16": "U16", "uint32": "U32", "uint64": "U64", "float16": "F16", "float32": "F32",
                "float64": "F64", "complex64": "C64", "complex128": "C128"}  # XLA_FFI_DataType_<name>


# --------------------------------------------------------------------------
# ctypes view (Python paths only)
# --------------------------------------------------------------------------
def _i64(addr: int) -> int:
    return ctypes.c_int64.from_address(addr).value


def _i32(addr: int) -> int:
    return ctypes.c_int32.from_address(addr).value


@dataclass
class BufferView:
    """One decoded ``XLA_FFI_Buffer``."""

    dtype: np.dtype
    data: int
    shape: tuple[int, ...]

    def as_numpy(self) -> np.ndarray:
        """A zero-copy numpy view of a host buffer."""
        count = int(np.prod(self.shape, dtype=np.int64))
        if count == 0 or self.data == 0:
            return np.zeros(self.shape, self.dtype)
        raw = (ctypes.c_char * (count * self.dtype.itemsize)).from_address(self.data)
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.shape)


def _decode_buffers(frame: int, size_off: int, ptrs_off: int) -> list[BufferView]:
    count = _i64(frame + size_off)
    ptrs = _i64(frame + ptrs_off)
    out = []
    for k in range(count):
        buf = _i64(ptrs + 8 * k)
        rank = _i64(buf + BUFFER_RANK)
        dims = _i64(buf + BUFFER_DIMS)
        shape = tuple(_i64(dims + 8 * d) for d in range(rank))
        dtype = CODE_TO_DTYPE.get(_i32(buf + BUFFER_DTYPE), np.dtype(np.uint8))
        out.append(BufferView(dtype, _i64(buf + BUFFER_DATA), shape))
    return out


def decode_frame(frame: int) -> tuple[list[BufferView], list[BufferView]]:
    """Decode the argument and result buffers of a call frame (ctypes)."""
    return (
        _decode_buffers(frame, FRAME_ARGS_SIZE, FRAME_ARGS),
        _decode_buffers(frame, FRAME_RETS_SIZE, FRAME_RETS),
    )


_STREAM_GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_STREAM_ARGS = ctypes.c_int64 * (STREAM_GET_ARGS_SIZE // 8)  # XLA_FFI_Stream_Get_Args, as int64 words
_stream_getters: dict[int, object] = {}


def get_stream(frame: int) -> tuple[int, int]:
    """``(stream, error)`` of the frame's execution context (``XLA_FFI_Stream_Get``; GPU only)."""
    api = _i64(frame + FRAME_API)
    getter = _stream_getters.get(api)
    if getter is None:
        getter = _stream_getters[api] = _STREAM_GET(_i64(api + API_STREAM_GET))
    args = _STREAM_ARGS()
    args[0] = STREAM_GET_ARGS_SIZE
    args[STREAM_GET_CTX // 8] = _i64(frame + FRAME_CTX)
    error = getter(ctypes.addressof(args))
    return int(args[STREAM_GET_STREAM // 8]), int(error or 0)


# --------------------------------------------------------------------------
# The check against the installed jaxlib's header
# --------------------------------------------------------------------------
class FFIABIError(KernelError, RuntimeError):
    """The installed jaxlib's XLA FFI ABI is not the one evjax's handlers were built for.

    The message names the jaxlib version, each struct, field or constant that
    differs (what evjax expects, what the header declares) and the fix.
    """


_SCALARS = {
    "size_t": 8, "ptrdiff_t": 8, "intptr_t": 8, "uintptr_t": 8, "int64_t": 8, "uint64_t": 8, "long": 8,
    "long long": 8, "unsigned long": 8, "unsigned long long": 8, "long int": 8, "double": 8,
    "int32_t": 4, "uint32_t": 4, "int": 4, "unsigned": 4, "unsigned int": 4, "float": 4,
    "int16_t": 2, "uint16_t": 2, "short": 2, "unsigned short": 2,
    "int8_t": 1, "uint8_t": 1, "char": 1, "unsigned char": 1, "bool": 1, "_Bool": 1,
}  # LP64; an enum is 4 bytes, a pointer 8
_QUALIFIERS = {"const", "volatile", "struct", "enum", "signed", "union"}


@dataclass(frozen=True)
class Field:
    offset: int
    size: int
    type: str  # the struct it is, if any ("" for scalars and pointers)


@dataclass(frozen=True)
class Struct:
    """A struct of the header laid out for LP64."""

    name: str
    size: int  # sizeof
    align: int
    fields: dict  # name -> Field
    struct_size: int | None  # XLA_FFI_STRUCT_SIZE(name, last field) where XLA_FFI_DEFINE_STRUCT_TRAITS declares it


# Structs a later header renamed without changing their layout: old name -> new name.  XLA FFI API
# 0.4 (jaxlib 0.11.2) calls the extension header ``XLA_FFI_InternalExtension``; the check lays out
# whichever the header defines, so a layout change under the new name is still caught.
RENAMED_STRUCTS: dict[str, str] = {"XLA_FFI_Extension_Base": "XLA_FFI_InternalExtension"}


class HeaderError(ValueError):
    """A struct or enumerator the check needs is missing from the header or cannot be laid out."""


class Header:
    """The structs, enumerators and API version of an ``xla/ffi/api/c_api.h``, read from its text.

    A C-struct layout computer for exactly what this header uses: structs of
    scalars, enums, pointers (function pointers included) and nested structs,
    typedefs, and the header's one-line function-like macros
    (``_XLA_FFI_API_STRUCT_FIELD``).
    """

    def __init__(self, text: str):
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", "", text).replace("\\\n", " ")
        defines = dict(re.findall(r"^\s*#\s*define\s+(\w+)[ \t]+(\S[^\n]*)$", text, flags=re.M))
        try:
            self.version = (int(defines["XLA_FFI_API_MAJOR"]), int(defines["XLA_FFI_API_MINOR"]))
        except (KeyError, ValueError):
            self.version = None
        macros = {name: ([p.strip() for p in params.split(",")], body) for name, params, body in
                  re.findall(r"^\s*#\s*define\s+(\w+)\(([^)]*)\)[ \t]*([^\n]*)$", text, flags=re.M)}
        text = re.sub(r"^\s*#[^\n]*$", "", text, flags=re.M)
        self.traits = dict(re.findall(r"XLA_FFI_DEFINE_STRUCT_TRAITS\(\s*(\w+)\s*,\s*(\w+)\s*\)", text))
        for name, (params, body) in macros.items():
            if name.startswith("XLA_FFI_DEFINE_STRUCT_TRAITS") or name == "XLA_FFI_STRUCT_SIZE":
                continue

            def expand(match, params=params, body=body):
                values = dict(zip(params, (a.strip() for a in match.group(1).split(","))))
                return re.sub(r"\w+", lambda w: values.get(w.group(0), w.group(0)), body)

            text = re.sub(rf"\b{name}\(([^()]*)\)", expand, text)
        self.enums: dict[str, int] = {}
        self._enum_types: set[str] = set()
        for tag, body, alias in re.findall(r"\benum\s*(\w*)\s*\{([^{}]*)\}\s*(\w*)\s*;", text):
            self._enum_types.update(n for n in (tag, alias) if n)
            value = -1
            for item in filter(None, (i.strip() for i in body.split(","))):
                name, _, expr = item.partition("=")
                value = self._evaluate(expr) if expr.strip() else value + 1
                self.enums[name.strip()] = value
        self._bodies: dict[str, str] = {}
        for tag, body, alias in re.findall(r"\bstruct\s*(\w*)\s*\{([^{}]*)\}\s*(\w*)\s*;", text):
            for name in (tag, alias):
                if name:
                    self._bodies[name] = body
        self._aliases = {name: "void*" if stars else base for base, stars, name in
                         re.findall(r"\btypedef\s+((?:\w+\s+)*?\w+)\s*(\**)\s*(\w+)\s*;", text)
                         if stars or base.split()[-1] != name}
        self._structs: dict[str, Struct] = {}

    def _evaluate(self, expr: str) -> int:
        expr = re.sub(r"\b(\d+)[uUlL]*\b", r"\1", expr.strip())

        def value(node):
            if isinstance(node, ast.Constant) and isinstance(node.value, int):
                return node.value
            if isinstance(node, ast.Name) and node.id in self.enums:
                return self.enums[node.id]
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                return -value(node.operand)
            ops = {ast.LShift: lambda a, b: a << b, ast.BitOr: lambda a, b: a | b,
                   ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b}
            if isinstance(node, ast.BinOp) and type(node.op) in ops:
                return ops[type(node.op)](value(node.left), value(node.right))
            raise HeaderError(f"cannot evaluate the enumerator value {expr!r}")

        return value(ast.parse(expr, mode="eval").body)

    def struct(self, name: str) -> Struct:
        """The layout of struct ``name`` (tag or typedef name)."""
        if name not in self._bodies and RENAMED_STRUCTS.get(name) in self._bodies:
            name = RENAMED_STRUCTS[name]
        if name not in self._structs:
            if name not in self._bodies:
                raise HeaderError(f"struct {name} is not defined in the header")
            offset, align, fields = 0, 1, {}
            for declaration in filter(None, (d.strip() for d in self._bodies[name].split(";"))):
                field, size, field_align, kind = self._member(declaration, name)
                offset = -(-offset // field_align) * field_align
                fields[field] = Field(offset, size, kind)
                offset += size
                align = max(align, field_align)
            last = fields.get(self.traits.get(name, ""))
            self._structs[name] = Struct(name, -(-offset // align) * align, align, fields,
                                         None if last is None else last.offset + last.size)
        return self._structs[name]

    def _member(self, declaration: str, owner: str) -> tuple[str, int, int, str]:
        function_pointer = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", declaration)
        if function_pointer:
            return function_pointer.group(1), 8, 8, ""
        match = re.fullmatch(r"(.*?)\b(\w+)\s*((?:\[\s*\d+\s*\]\s*)*)", declaration, flags=re.S)
        if not match or not re.search(r"\w", match.group(1)):
            raise HeaderError(f"cannot read the member {declaration!r} of struct {owner}")
        base, field, dims = match.groups()
        count = int(np.prod([int(d) for d in re.findall(r"\d+", dims)] or [1]))
        if "*" in base:
            return field, 8 * count, 8, ""
        size, align, kind = self._type(" ".join(w for w in re.findall(r"\w+", base) if w not in _QUALIFIERS), owner)
        return field, size * count, align, kind

    def _type(self, name: str, owner: str) -> tuple[int, int, str]:
        for _ in range(16):  # follow typedefs
            if name in _SCALARS:
                return _SCALARS[name], _SCALARS[name], ""
            if name in self._enum_types:
                return 4, 4, ""
            if name in self._bodies:
                struct = self.struct(name)
                return struct.size, struct.align, struct.name
            if name not in self._aliases:
                break
            if self._aliases[name] == "void*":
                return 8, 8, ""
            name = " ".join(w for w in self._aliases[name].split() if w not in _QUALIFIERS)
        raise HeaderError(f"struct {owner} has a member of type {name!r}, which the header does not define")

    def field(self, struct: str, path: str) -> Field:
        """The field at dotted ``path`` of ``struct`` (``"args.size"``), its offset from the outer struct's start."""
        offset, field = 0, None
        for part in path.split("."):
            layout = self.struct(field.type if field else struct)
            if part not in layout.fields:
                raise HeaderError(f"{layout.name} has no field {part!r}")
            field = layout.fields[part]
            offset += field.offset
        return Field(offset, field.size, field.type)


def check(header: Header, constants: dict | None = None) -> list[str]:
    """Where ``header`` disagrees with evjax's constants (``constants``: this module's, by default).

    Returns one line per difference: an offset or width of a field evjax reads
    (:data:`FIELDS`), a ``struct_size`` (:data:`STRUCTS`), an enumerator
    (:data:`ENUMS` and the dtype codes) or the API major version.
    """
    c = globals() if constants is None else constants
    problems = []
    if header.version is None:
        problems.append("the header defines no XLA_FFI_API_MAJOR/XLA_FFI_API_MINOR")
    elif header.version[0] != c["API_MAJOR"]:
        problems.append(f"XLA FFI API major version {header.version[0]} in the header, evjax is built for "
                        f"{c['API_MAJOR']} (API_MAJOR)")
    for constant, struct, path, width in FIELDS:
        try:
            field = header.field(struct, path)
        except HeaderError as exc:
            problems.append(f"{struct}.{path} ({constant}): {exc}")
            continue
        if field.offset != c[constant]:
            problems.append(f"{struct}.{path}: offset {field.offset} in the header, evjax reads it at "
                            f"{c[constant]} ({constant})")
        if field.size != width:
            problems.append(f"{struct}.{path}: {field.size} bytes in the header, evjax reads {width}")
    for constant, struct, rule in STRUCTS:
        try:
            size = header.struct(struct).struct_size
        except HeaderError as exc:
            problems.append(f"{struct} ({constant}): {exc}")
            continue
        if size is None:
            problems.append(f"{struct}: the header declares no struct_size (XLA_FFI_DEFINE_STRUCT_TRAITS)")
        elif not (size == c[constant] if rule == "==" else size >= c[constant]):
            expected = c[constant] if rule == "==" else f"at least {c[constant]}"
            problems.append(f"{struct}: struct_size {size} in the header, evjax expects {expected} ({constant})")
    codes = {f"FFI_DTYPE_CODES[{dtype}]": (f"XLA_FFI_DataType_{_DTYPE_ENUMS[dtype.name]}", code)
             for dtype, code in c["FFI_DTYPE_CODES"].items()}
    for constant, (enumerator, value) in {**{k: (e, c[k]) for k, e in ENUMS}, **codes}.items():
        if enumerator not in header.enums:
            problems.append(f"{enumerator} ({constant}) is not defined in the header")
        elif header.enums[enumerator] != value:
            problems.append(f"{enumerator} = {header.enums[enumerator]} in the header, evjax uses {value} ({constant})")
    return problems


def header_path() -> str:
    """The XLA FFI C API header shipped inside the installed jaxlib."""
    import jax

    return os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")


def _jaxlib_version() -> str:
    try:
        from importlib.metadata import version

        return version("jaxlib")
    except Exception:  # noqa: BLE001 - only for the message
        return "(unknown version)"


def mismatch_message(problems: list[str], path: str, version, jaxlib: str) -> str:
    """The :class:`FFIABIError` message: the jaxlib, each difference, and the fix."""
    api = f"API {version[0]}.{version[1]}" if version else "no API version"
    lines = "\n".join(f"  - {p}" for p in problems)
    return (f"evjax cannot give its XLA FFI handlers to the installed jaxlib {jaxlib}: the XLA FFI C API "
            f"header it ships ({path}, {api}) describes the call frame differently from the XLA FFI API "
            f"{API_MAJOR}.{API_MINOR} evjax's handlers were built for, so they would read garbage:\n{lines}\n"
            f"Install a jax and jaxlib that evjax supports: pip install \"{SUPPORTED_JAX}\" "
            f"\"{SUPPORTED_JAX.replace('jax', 'jaxlib', 1)}\" (or an evjax release made for jaxlib {jaxlib}).")


@functools.lru_cache(maxsize=None)
def handler_api_version() -> tuple[int, int]:
    """The XLA FFI API version evjax's handlers tell XLA they were built for, once the installed
    jaxlib's header is checked (once per process, before the first handler is compiled).

    That is :data:`API_MAJOR`.:data:`API_MINOR`, or the header's own version where it is older
    and lays out all evjax reads the same way: XLA accepts a handler whose version lies between
    its oldest supported one and its own, so the answer must not be newer than the installed XLA.

    Raises:
        FFIABIError: the header's layout, or its major version, differs from evjax's constants.
    """
    path = header_path()
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        warnings.warn(f"evjax: the installed jaxlib ships no XLA FFI header at {path}, so evjax cannot check "
                      f"that its handlers' call-frame layout (XLA FFI API {API_MAJOR}.{API_MINOR}) is jaxlib's; "
                      f"evjax supports {SUPPORTED_JAX}", RuntimeWarning, stacklevel=2)
        return API_MAJOR, API_MINOR
    header = Header(text)
    problems = check(header)
    if problems:
        raise FFIABIError(mismatch_message(problems, path, header.version, _jaxlib_version()))
    return min((API_MAJOR, API_MINOR), header.version)
