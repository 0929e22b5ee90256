"""The XLA FFI ABI evjax's handlers read: every offset, struct_size and enumerator of
``evjax/backends/ffi_abi.py`` against the header shipped inside the installed jaxlib and against a
real XLA call frame, the registration-time refusal of a jaxlib whose ABI moved, and the prologue's
run-time check (a frame of another ``struct_size`` or API major version gets an XLA error)."""
import ctypes
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evjax.backends import ffi_abi, ffi_core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANDLER_T = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
PTR_T = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


@pytest.fixture(scope="module")
def text():
    with open(ffi_abi.header_path()) as f:
        return f.read()


@pytest.fixture(scope="module")
def header(text):
    return ffi_abi.Header(text)


# ---------------------------------------------------------------------------
# the constants against the installed jaxlib's header
# ---------------------------------------------------------------------------
def test_every_offset_is_its_field_in_the_installed_header(header):
    for constant, struct, path, width in ffi_abi.FIELDS:
        field = header.field(struct, path)
        assert getattr(ffi_abi, constant) == field.offset, f"{constant}: {struct}.{path} is at {field.offset}"
        assert field.size == width, f"{struct}.{path} is {field.size} bytes, evjax reads {width}"


def test_every_offset_constant_is_checked():
    """A new offset in ffi_abi.py must name its field, or the check would not see it move."""
    prefixes = ("FRAME_", "BUFFER_", "EXT_", "METADATA_", "API_", "ARGS_", "ERROR_CREATE_", "STREAM_GET_",
                "DEVICE_ORDINAL_GET_", "SCALAR_", "ARRAY_", "ATTR_", "ERRC_", "STAGE_", "TRAIT_", "FFI_DTYPE_CODES_",
                "CALL_FRAME_", "RETS_", "ATTRS_", "EXTENSION_")
    constants = {name for name, value in vars(ffi_abi).items() if isinstance(value, int) and not isinstance(value, bool)
                 and (name.startswith(prefixes) or name.endswith("_STRUCT_SIZE"))}
    checked = ({c for c, *_ in ffi_abi.FIELDS} | {c for c, *_ in ffi_abi.STRUCTS} | {c for c, _ in ffi_abi.ENUMS}
               | {"API_MAJOR", "API_MINOR"})
    assert constants - checked == set()
    assert len(constants) >= 50


def test_every_struct_size_is_the_installed_headers(header):
    for constant, struct, rule in ffi_abi.STRUCTS:
        size = header.struct(struct).struct_size
        assert size is not None, struct
        if rule == "==":
            assert getattr(ffi_abi, constant) == size, f"{constant}: XLA_FFI_STRUCT_SIZE({struct}) is {size}"
        else:
            assert size >= getattr(ffi_abi, constant), f"{constant}: XLA_FFI_STRUCT_SIZE({struct}) is {size}"
    # the sizes XLA writes in the frames evjax reads, spelled out (jaxlib 0.10, API 0.3)
    assert (ffi_abi.CALL_FRAME_STRUCT_SIZE, ffi_abi.BUFFER_STRUCT_SIZE, ffi_abi.API_STRUCT_SIZE) == (168, 48, 192)


def test_every_enumerator_and_dtype_code_is_the_installed_headers(header):
    for constant, enumerator in ffi_abi.ENUMS:
        assert getattr(ffi_abi, constant) == header.enums[enumerator], constant
    for dtype, code in ffi_abi.FFI_DTYPE_CODES.items():
        assert header.enums[f"XLA_FFI_DataType_{ffi_abi._DTYPE_ENUMS[dtype.name]}"] == code, dtype


def test_the_installed_jaxlib_passes_and_handlers_report_the_api_they_were_built_for(header):
    assert ffi_abi.check(header) == []
    assert header.version[0] == ffi_abi.API_MAJOR
    # a newer minor version (jaxlib 0.11.2: 0.4) appends to the API and renames, lays out the same
    assert ffi_abi.handler_api_version() == min(header.version, (ffi_abi.API_MAJOR, ffi_abi.API_MINOR))


def test_supported_range_is_pyprojects():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert f'"{ffi_abi.SUPPORTED_JAX}"' in f.read()


def test_layout_computer_agrees_with_ctypes(header):
    """Every struct of the header laid out by ffi_abi.Header as ctypes (the platform's C ABI) lays it out."""

    def as_ctypes(name, made={}):  # noqa: B006 - a cache
        if name not in made:
            layout = header.struct(name)
            scalars = {8: ctypes.c_int64, 4: ctypes.c_int32, 2: ctypes.c_int16, 1: ctypes.c_int8}
            fields = [(f, as_ctypes(v.type) if v.type else scalars[v.size]) for f, v in layout.fields.items()]
            made[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
        return made[name]

    names = sorted(set(header._bodies))
    assert len(names) >= 30
    for name in names:
        layout, c = header.struct(name), as_ctypes(name)
        assert ctypes.sizeof(c) == layout.size and ctypes.alignment(c) == layout.align, name
        assert {f: getattr(c, f).offset for f in layout.fields} == {f: v.offset for f, v in layout.fields.items()}
    assert header.struct("XLA_FFI_CallFrame").size == 176  # sizeof counts `future`; struct_size stops at attrs


# ---------------------------------------------------------------------------
# the constants against a real XLA call
# ---------------------------------------------------------------------------
def test_a_real_xla_call_frame_has_the_sizes_evjax_expects():
    """What XLA writes, seen by a ctypes handler: the frame's and its structs' struct_size, the API
    table's version and size, the metadata query's structs, one buffer."""
    i64 = lambda a: ctypes.c_int64.from_address(a).value  # noqa: E731
    i32 = lambda a: ctypes.c_int32.from_address(a).value  # noqa: E731
    seen = []

    def probe(frame):
        api, ext = i64(frame + ffi_abi.FRAME_API), i64(frame + ffi_abi.FRAME_EXTENSION_START)
        record = dict(frame=i64(frame), args=i64(frame + ffi_abi.FRAME_ARGS_SIZE - 16),
                      rets=i64(frame + ffi_abi.FRAME_RETS_SIZE - 16), attrs=i64(frame + ffi_abi.FRAME_ATTRS_SIZE - 16),
                      major=i32(api + ffi_abi.API_VERSION_MAJOR), minor=i32(api + ffi_abi.API_VERSION_MINOR),
                      api=i64(api), stage=i32(frame + ffi_abi.FRAME_STAGE))
        if ext and i32(ext + ffi_abi.EXT_TYPE) == ffi_abi.EXT_TYPE_METADATA:
            metadata = i64(ext + ffi_abi.EXT_METADATA_PTR)
            record.update(ext=i64(ext), metadata=i64(metadata))
            ctypes.c_int32.from_address(metadata + ffi_abi.METADATA_API_MAJOR).value = ffi_abi.API_MAJOR
            ctypes.c_int32.from_address(metadata + ffi_abi.METADATA_API_MINOR).value = ffi_abi.API_MINOR
        else:
            record.update(buffer=i64(i64(i64(frame + ffi_abi.FRAME_ARGS))), n=i64(frame + ffi_abi.FRAME_ARGS_SIZE))
        seen.append(record)
        return None

    callback = HANDLER_T(probe)
    jax.ffi.register_ffi_target("evjax_test_abi_probe", jax.ffi.pycapsule(ctypes.cast(callback, ctypes.c_void_p).value),
                                platform="cpu")
    out = jax.ffi.ffi_call("evjax_test_abi_probe", jax.ShapeDtypeStruct((4,), jnp.float32))(jnp.ones(4, jnp.float32))
    jax.block_until_ready(out)
    query, call = [r for r in seen if "ext" in r], [r for r in seen if "buffer" in r]
    assert query and call, seen
    for record in query + call:
        assert record["frame"] == ffi_abi.CALL_FRAME_STRUCT_SIZE
        assert (record["args"], record["rets"], record["attrs"]) == (
            ffi_abi.ARGS_STRUCT_SIZE, ffi_abi.RETS_STRUCT_SIZE, ffi_abi.ATTRS_STRUCT_SIZE)
        assert record["major"] == ffi_abi.API_MAJOR and record["api"] >= ffi_abi.API_STRUCT_SIZE
        assert record["stage"] == ffi_abi.STAGE_EXECUTE
    assert (query[0]["ext"], query[0]["metadata"]) == (ffi_abi.METADATA_EXTENSION_STRUCT_SIZE,
                                                       ffi_abi.METADATA_STRUCT_SIZE)
    assert (call[0]["buffer"], call[0]["n"]) == (ffi_abi.BUFFER_STRUCT_SIZE, 1)
    test_a_real_xla_call_frame_has_the_sizes_evjax_expects.keep = callback


# ---------------------------------------------------------------------------
# a jaxlib whose ABI moved is refused before any handler is made
# ---------------------------------------------------------------------------
def _mutated(text, old, new):
    assert old in text, old
    return text.replace(old, new, 1)


MUTATIONS = {  # what a jaxlib that changed its ABI could ship -> what the check must name
    "a field inserted in XLA_FFI_Buffer": (
        "  XLA_FFI_DataType dtype;\n  void* data;", "  XLA_FFI_DataType dtype;\n  void* layout;\n  void* data;",
        ["XLA_FFI_Buffer.data: offset 32 in the header, evjax reads it at 24 (BUFFER_DATA)",
         "XLA_FFI_Buffer: struct_size 56 in the header, evjax expects 48 (BUFFER_STRUCT_SIZE)"]),
    "the call frame's struct_size grown": (
        "XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_CallFrame, attrs);",
        "XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_CallFrame, future);",
        ["XLA_FFI_CallFrame: struct_size 176 in the header, evjax expects 168 (CALL_FRAME_STRUCT_SIZE)"]),
    "a new API major version": (
        "#define XLA_FFI_API_MAJOR 0", "#define XLA_FFI_API_MAJOR 1",
        ["XLA FFI API major version 1 in the header, evjax is built for 0 (API_MAJOR)"]),
    "the stages renumbered": (
        "XLA_FFI_ExecutionStage_EXECUTE = 3", "XLA_FFI_ExecutionStage_EXECUTE = 2",
        ["XLA_FFI_ExecutionStage_EXECUTE = 2 in the header, evjax uses 3 (STAGE_EXECUTE)"]),
    "an API entry inserted": (
        "  _XLA_FFI_API_STRUCT_FIELD(XLA_FFI_Error_Create);",
        "  _XLA_FFI_API_STRUCT_FIELD(XLA_FFI_Error_Inserted);\n  _XLA_FFI_API_STRUCT_FIELD(XLA_FFI_Error_Create);",
        ["XLA_FFI_Api.XLA_FFI_Error_Create: offset 56 in the header, evjax reads it at 48 (API_ERROR_CREATE)",
         "XLA_FFI_Api.XLA_FFI_Stream_Get: offset 88 in the header, evjax reads it at 80 (API_STREAM_GET)"]),
    "the extension header grown": (  # API 0.4's rename alone is not a difference; a new field is
        "_Type type;", "_Type type;\n  int64_t tag;",
        ["XLA_FFI_Extension_Base: struct_size 32 in the header, evjax expects 24 (EXTENSION_BASE_STRUCT_SIZE)"]),
    "a field's type narrowed": (
        "  int64_t rank;\n  int64_t* dims;", "  int32_t rank;\n  int64_t* dims;",
        ["XLA_FFI_Buffer.rank: 4 bytes in the header, evjax reads 8"]),
}


@pytest.mark.parametrize("change", sorted(MUTATIONS))
def test_check_names_each_difference(text, change):
    old, new, expected = MUTATIONS[change]
    problems = ffi_abi.check(ffi_abi.Header(_mutated(text, old, new)))
    for line in expected:
        assert line in problems, problems


def test_check_sees_a_mutated_constant(header):
    constants = dict(vars(ffi_abi), BUFFER_DATA=32, CALL_FRAME_STRUCT_SIZE=176, STAGE_EXECUTE=2,
                     FFI_DTYPE_CODES={**ffi_abi.FFI_DTYPE_CODES, np.dtype(np.float32): 12})
    problems = ffi_abi.check(header, constants)
    assert problems == [
        "XLA_FFI_Buffer.data: offset 24 in the header, evjax reads it at 32 (BUFFER_DATA)",
        "XLA_FFI_CallFrame: struct_size 168 in the header, evjax expects 176 (CALL_FRAME_STRUCT_SIZE)",
        "XLA_FFI_ExecutionStage_EXECUTE = 3 in the header, evjax uses 2 (STAGE_EXECUTE)",
        "XLA_FFI_DataType_F32 = 11 in the header, evjax uses 12 (FFI_DTYPE_CODES[float32])",
    ]


def test_a_struct_missing_from_the_header_is_a_difference_not_a_crash(text):
    gone = re.sub(r"struct XLA_FFI_Metadata \{.*?\};", "", text, count=1, flags=re.S)
    problems = ffi_abi.check(ffi_abi.Header(gone))
    assert any(p.startswith("XLA_FFI_Metadata.traits (METADATA_TRAITS): struct XLA_FFI_Metadata is not defined")
               for p in problems), problems


@pytest.fixture
def installed_header(monkeypatch, tmp_path):
    """Point evjax at a header of our making (the check runs again for it)."""

    def install(contents):
        path = tmp_path / "c_api.h"
        path.write_text(contents)
        monkeypatch.setattr(ffi_abi, "header_path", lambda: str(path))
        ffi_abi.handler_api_version.cache_clear()
        return str(path)

    yield install
    monkeypatch.undo()
    ffi_abi.handler_api_version.cache_clear()


def test_registration_refuses_a_jaxlib_of_another_abi(text, installed_header):
    import importlib.metadata

    path = installed_header(_mutated(text, *MUTATIONS["a field inserted in XLA_FFI_Buffer"][:2]))
    with pytest.raises(ffi_abi.FFIABIError) as caught:
        ffi_core.compile_handler("    return as_voidptr(0)\n", cache=False)
    message = str(caught.value)
    for part in (f"jaxlib {importlib.metadata.version('jaxlib')}", path, "API 0.3",
                 "XLA_FFI_Buffer: struct_size 56 in the header, evjax expects 48 (BUFFER_STRUCT_SIZE)",
                 'pip install "jax>=0.10,<0.12" "jaxlib>=0.10,<0.12"'):
        assert part in message, message
    assert isinstance(caught.value, RuntimeError)


def test_an_older_compatible_header_is_the_version_reported(text, installed_header):
    """XLA accepts a handler's version only up to its own: where the installed header is older and
    lays out all evjax reads the same way, handlers report the header's version."""
    def with_minor(minor):
        return re.sub(r"#define XLA_FFI_API_MINOR \d+", f"#define XLA_FFI_API_MINOR {minor}", text, count=1)

    installed_header(with_minor(2))
    assert ffi_abi.handler_api_version() == (0, 2)
    installed_header(with_minor(ffi_abi.API_MINOR + 1))
    assert ffi_abi.handler_api_version() == (0, ffi_abi.API_MINOR)  # a newer one: what evjax was built for


def test_a_jaxlib_without_the_header_warns_and_uses_evjax_s_version(monkeypatch, installed_header):
    installed_header("")
    monkeypatch.setattr(ffi_abi, "header_path", lambda: "/nonexistent/c_api.h")
    with pytest.warns(RuntimeWarning, match="ships no XLA FFI header"):
        assert ffi_abi.handler_api_version() == (ffi_abi.API_MAJOR, ffi_abi.API_MINOR)


# ---------------------------------------------------------------------------
# the prologue's run-time check
# ---------------------------------------------------------------------------
class _Api:
    """An API table of major version ``major`` whose XLA_FFI_Error_Create records (message, errc)."""

    def __init__(self, major=ffi_abi.API_MAJOR):
        self.errors = []
        self.table = (ctypes.c_int64 * (ffi_abi.API_STRUCT_SIZE // 8))()
        self.table[0] = ffi_abi.API_STRUCT_SIZE
        base = ctypes.addressof(self.table)
        ctypes.c_int32.from_address(base + ffi_abi.API_VERSION_MAJOR).value = major
        ctypes.c_int32.from_address(base + ffi_abi.API_VERSION_MINOR).value = ffi_abi.API_MINOR

        @PTR_T
        def error_create(args):
            message = ctypes.c_char_p.from_address(args + ffi_abi.ERROR_CREATE_MESSAGE).value.decode()
            self.errors.append((message, ctypes.c_int32.from_address(args + ffi_abi.ERROR_CREATE_ERRC).value))
            return 0xE000 + len(self.errors)

        self._keep = error_create
        self.table[ffi_abi.API_ERROR_CREATE // 8] = ctypes.cast(error_create, ctypes.c_void_p).value


class _Frame:
    def __init__(self, api, size=ffi_abi.CALL_FRAME_STRUCT_SIZE, metadata=False, ext_size=None, md_size=None):
        self.raw = (ctypes.c_int64 * 24)()
        self.raw[0] = size
        self.raw[ffi_abi.FRAME_API // 8] = ctypes.addressof(api.table) if api else 0
        ctypes.c_int32.from_address(ctypes.addressof(self.raw) + ffi_abi.FRAME_STAGE).value = ffi_abi.STAGE_EXECUTE
        self.metadata = (ctypes.c_int32 * 16)()
        if metadata:
            ctypes.c_int64.from_address(ctypes.addressof(self.metadata)).value = (
                ffi_abi.METADATA_STRUCT_SIZE if md_size is None else md_size)
            self.ext = (ctypes.c_int64 * 4)()
            self.ext[0] = ffi_abi.METADATA_EXTENSION_STRUCT_SIZE if ext_size is None else ext_size
            ctypes.c_int32.from_address(ctypes.addressof(self.ext) + ffi_abi.EXT_TYPE).value = ffi_abi.EXT_TYPE_METADATA
            self.ext[ffi_abi.EXT_METADATA_PTR // 8] = ctypes.addressof(self.metadata)
            self.raw[ffi_abi.FRAME_EXTENSION_START // 8] = ctypes.addressof(self.ext)

    def call(self, address):
        return int(HANDLER_T(address)(ctypes.addressof(self.raw)) or 0)

    def answer(self):
        m = self.metadata
        return m[ffi_abi.METADATA_API_MAJOR // 4], m[ffi_abi.METADATA_API_MINOR // 4]


@pytest.fixture(scope="module")
def trampoline():
    """A compiled handler (the Python trampoline): past the prologue, a frame without attributes gets
    its 'called without its attribute' error."""
    return ffi_core.PythonHandler("abi probe", lambda frame: 0, platform="cpu").address


def test_a_well_formed_frame_passes_the_prologue(trampoline):
    api = _Api()
    assert _Frame(api).call(trampoline) == 0xE001
    assert "without its 'evjax_callback' attribute" in api.errors[0][0]
    query = _Frame(api, metadata=True)
    assert query.call(trampoline) == 0 and query.answer() == ffi_abi.handler_api_version()


@pytest.mark.parametrize("size", [0, ffi_abi.CALL_FRAME_STRUCT_SIZE - 8, ffi_abi.CALL_FRAME_STRUCT_SIZE + 8])
def test_a_call_frame_of_another_struct_size_gets_an_error(trampoline, size):
    api = _Api()
    assert _Frame(api, size=size).call(trampoline) == 0xE001
    ((message, errc),) = api.errors
    assert errc == ffi_abi.ERRC_FAILED_PRECONDITION
    for part in ("XLA_FFI_CallFrame", "struct_size", f"{ffi_abi.CALL_FRAME_STRUCT_SIZE} bytes", "API 0.3",
                 ffi_abi.SUPPORTED_JAX):
        assert part in message, message
    # the metadata query too: an error, and no answer
    query = _Frame(api, size=size, metadata=True)
    assert query.call(trampoline) == 0xE002 and query.answer() == (0, 0)


def test_an_api_table_of_another_major_version_gets_an_error(trampoline):
    api = _Api(major=ffi_abi.API_MAJOR + 1)
    assert _Frame(api).call(trampoline) == 0xE001
    ((message, errc),) = api.errors
    assert errc == ffi_abi.ERRC_FAILED_PRECONDITION
    assert "XLA_FFI_Api" in message and "major version other than 0" in message and ffi_abi.SUPPORTED_JAX in message
    query = _Frame(api, metadata=True)
    assert query.call(trampoline) == 0xE002 and query.answer() == (0, 0)


def test_a_metadata_query_with_short_structs_gets_an_error(trampoline):
    for sizes in (dict(ext_size=ffi_abi.METADATA_EXTENSION_STRUCT_SIZE - 8),
                  dict(md_size=ffi_abi.METADATA_STRUCT_SIZE - 4)):
        api = _Api()
        query = _Frame(api, metadata=True, **sizes)
        assert query.call(trampoline) == 0xE001 and query.answer() == (0, 0)
        assert "XLA_FFI_Metadata" in api.errors[0][0]


def test_a_bad_frame_without_an_api_table_is_left_unanswered(trampoline):
    """No API table, no way to create an error: the metadata query goes unanswered, and XLA refuses a
    handler of API version 0.0 (below every version it supports)."""
    query = _Frame(None, size=ffi_abi.CALL_FRAME_STRUCT_SIZE + 8, metadata=True)
    assert query.call(trampoline) == 0 and query.answer() == (0, 0)
    fine = _Frame(None, metadata=True)
    assert fine.call(trampoline) == 0 and fine.answer() == ffi_abi.handler_api_version()
