"""A compiled XLA FFI handler that launches CUDA kernels with no Python per call.

Everything a launch needs is known once a call is traced, except the buffers'
device addresses and XLA's stream: the ``CUfunction``, grid, block, dynamic
shared memory and the kernel's parameters in Numba's CUDA array ABI (per
array: meminfo, parent, nitems, itemsize, data, shape..., strides...; every
field 8 bytes and passed as its own parameter).  That is written once per
signature into a *plan*, an int64 array whose address travels to the handler
as an FFI attribute of the call.

One generic handler (the shared prologue of :mod:`evjax.backends.ffi_core`,
then :func:`launch`) serves every kernel.  Per call it

1. reads the plan's address from the call's only attribute;
2. asks XLA for the stream;
3. copies the plan's parameters to its own stack, fills in the data pointers
   read from the call frame, and builds the parameter pointer array;
4. makes the kernel's CUDA context current if XLA's thread has another one,
   and calls the driver's ``cuLaunchKernel`` through its address.

Nothing here synchronises or allocates, so the handler declares itself
command-buffer (CUDA graph) compatible: XLA may record its launch into a CUDA
graph with the fusions around it (a ``lax.scan`` body, say) and replay the
graph, one host launch for many kernels.  A failed launch becomes an XLA error
carrying the driver's error name (that path enters Python to format the
message).  Nothing
here needs a GPU to be imported or compiled: the driver's functions are
addresses in the plan, so the tests run the handler on CPU with fakes.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import ffi_abi as abi
from . import ffi_core
from .ffi_core import create_error, query_stream, report, scalar_attribute
from .intrinsics import I32, PTR, call_i32_ptr, cstring, load_i64, stack_bytes, store_i64

# Plan words (int64), then ``values`` and 3 words per data slot.
P_LAUNCH, P_FUNCTION, P_CONTEXT, P_CTX_GET, P_CTX_PUSH, P_CTX_POP = range(6)
P_GRID, P_BLOCK, P_SHARED, P_N_VALUES, P_N_SLOTS, P_KEY = 6, 9, 12, 13, 14, 15
PLAN_HEADER = 16
MAX_PARAMS = 512  # kernel parameters (8 bytes each) the handler packs on its stack
PARAM_BYTES = 8 * MAX_PARAMS
PLAN_ATTRIBUTE = "evjax_plan"  # the FFI attribute carrying the plan's address
DATA_FIELD = 4  # position of the data pointer among an array's parameters (see array_params)


@intrinsic
def call_launch(typingctx, function, kernel, gx, gy, gz, bx, by, bz, shared, stream, params):
    """Call ``cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL)``."""
    sig = types.int32(*([types.int64] * 11))

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(I32, [PTR] + [I32] * 7 + [PTR, PTR, PTR])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        dims = [builder.trunc(a, I32) for a in args[2:9]]
        call_args = [builder.inttoptr(args[1], PTR)] + dims + [
            builder.inttoptr(args[9], PTR), builder.inttoptr(args[10], PTR), ir.Constant(PTR, None),
        ]
        return builder.call(callee, call_args)

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def launch(frame):
    """Launch the kernel of the call's plan on XLA's stream; an XLA error (int64) or 0."""
    plan = scalar_attribute(frame)
    if plan == 0:
        return create_error(frame, cstring("evjax: the CUDA launch handler was called without its single "
                                           "'evjax_plan' attribute; call it through evjax.numba_cuda_kernel"),
                            abi.ERRC_INVALID_ARGUMENT)
    gx = load_i64(plan + 8 * P_GRID)
    gy = load_i64(plan + 8 * (P_GRID + 1))
    gz = load_i64(plan + 8 * (P_GRID + 2))
    if gx == 0 or gy == 0 or gz == 0:  # an empty launch: nothing to do
        return 0
    error, stream = query_stream(frame)
    if error != 0:
        return error
    args = load_i64(frame + abi.FRAME_ARGS)
    rets = load_i64(frame + abi.FRAME_RETS)
    n_values = load_i64(plan + 8 * P_N_VALUES)
    n_slots = load_i64(plan + 8 * P_N_SLOTS)
    values = stack_bytes(PARAM_BYTES)
    params = stack_bytes(PARAM_BYTES)
    for k in range(n_values):
        store_i64(values + 8 * k, load_i64(plan + 8 * PLAN_HEADER + 8 * k))
        store_i64(params + 8 * k, values + 8 * k)
    slots = plan + 8 * PLAN_HEADER + 8 * n_values
    for j in range(n_slots):
        slot = load_i64(slots + 24 * j)
        table = rets if load_i64(slots + 24 * j + 8) != 0 else args
        buffer = load_i64(table + 8 * load_i64(slots + 24 * j + 16))
        store_i64(values + 8 * slot, load_i64(buffer + abi.BUFFER_DATA))
    key = load_i64(plan + 8 * P_KEY)
    context = load_i64(plan + 8 * P_CONTEXT)
    current = stack_bytes(8)
    pushed = False
    if context != 0:
        store_i64(current, 0)
        call_i32_ptr(load_i64(plan + 8 * P_CTX_GET), current)
        if load_i64(current) != context:
            status = call_i32_ptr(load_i64(plan + 8 * P_CTX_PUSH), context)
            if status != 0:
                return report(frame, key, status, abi.ERRC_INTERNAL)
            pushed = True
    status = call_launch(load_i64(plan + 8 * P_LAUNCH), load_i64(plan + 8 * P_FUNCTION), gx, gy, gz,
                         load_i64(plan + 8 * P_BLOCK), load_i64(plan + 8 * (P_BLOCK + 1)),
                         load_i64(plan + 8 * (P_BLOCK + 2)), load_i64(plan + 8 * P_SHARED), stream, params)
    if pushed:
        call_i32_ptr(load_i64(plan + 8 * P_CTX_POP), current)
    if status != 0:
        return report(frame, key, status, abi.ERRC_INTERNAL)
    return 0


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one launch needs except the buffers' addresses and the stream.

    Attributes:
        values: the kernel parameters, 8 bytes each, with 0 in data slots.
        data_slots: ``(slot, is_result, buffer_index)`` per array parameter:
            where the buffer's device address goes.
        grid: ``(gx, gy, gz)``; a zero means "launch nothing".
        block: ``(bx, by, bz)``.
        shared_mem: dynamic shared memory in bytes.
        function: the ``CUfunction`` (or ``CUkernel``) address.
        context: the CUDA context to make current (0: leave as it is).
        launch: address of ``cuLaunchKernel``.
        ctx_get_current, ctx_push, ctx_pop: addresses of the driver's context
            functions (used when ``context`` is not 0).
    """

    values: tuple[int, ...]
    data_slots: tuple[tuple[int, bool, int], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    function: int
    context: int
    launch: int
    ctx_get_current: int = 0
    ctx_push: int = 0
    ctx_pop: int = 0

    def words(self, key: int) -> np.ndarray:
        """The plan as the int64 array the handler reads."""
        if len(self.values) > MAX_PARAMS:
            raise ValueError(f"{len(self.values)} kernel parameters; the compiled launch packs at most {MAX_PARAMS}")
        header = [0] * PLAN_HEADER
        header[P_LAUNCH], header[P_FUNCTION], header[P_CONTEXT] = self.launch, self.function, self.context
        header[P_CTX_GET], header[P_CTX_PUSH], header[P_CTX_POP] = self.ctx_get_current, self.ctx_push, self.ctx_pop
        header[P_GRID:P_GRID + 3] = self.grid
        header[P_BLOCK:P_BLOCK + 3] = self.block
        header[P_SHARED], header[P_N_VALUES], header[P_N_SLOTS] = self.shared_mem, len(self.values), len(self.data_slots)
        header[P_KEY] = key
        slots = [int(x) for slot in self.data_slots for x in slot]
        return np.array(header + [int(v) for v in self.values] + slots, dtype=np.int64)


_lock = threading.Lock()
_BODY = "    return as_voidptr(numba_cuda_launch.launch(frame))"
_IMPORTS = "from evjax.backends import numba_cuda_launch"


def handler_address() -> int:
    """The address of the generic launch handler (compiled once, cached on disk)."""
    module, _ = ffi_core.compile_handler(_BODY, traits=abi.TRAIT_COMMAND_BUFFER_COMPATIBLE, imports=_IMPORTS,
                                         depends=(sys.modules[__name__],))
    return int(module.handler.address)


@dataclass
class CompiledLaunch:
    """A launch plan for the generic handler; keep it alive as long as XLA may call it.

    Attributes:
        address: the handler's address (the same for every plan).
        key: identifies the plan's error message.
        words: the plan (int64 array) the handler reads.
        attributes: the FFI attributes to pass with each call (the plan's address).
    """

    address: int
    key: int
    words: np.ndarray
    attributes: dict


def build(plan: LaunchPlan, describe: Callable[[int], str]) -> CompiledLaunch:
    """Prepare ``plan`` for the generic handler.

    Args:
        plan: the launch.
        describe: ``describe(status)`` formats the message of a failed launch
            (``status`` is the driver's ``CUresult``).
    """
    with _lock:
        key = ffi_core.register_describer(lambda frame, status: describe(status))
    words = plan.words(key)
    return CompiledLaunch(handler_address(), key, words, {PLAN_ATTRIBUTE: np.int64(words.ctypes.data)})


def array_params(shape: Sequence[int], itemsize: int) -> list[int]:
    """Numba's CUDA ABI for one C-contiguous array, with 0 for the data pointer.

    Per array: meminfo, parent, nitems, itemsize, data, shape..., strides...
    (see :data:`DATA_FIELD` for the data pointer's position).
    """
    shape = [int(d) for d in shape]
    strides = [0] * len(shape)
    step = int(itemsize)
    for axis in range(len(shape) - 1, -1, -1):  # C order, as Numba's from_cuda_array_interface
        strides[axis] = step
        step *= shape[axis]
    nitems = 1
    for d in shape:
        nitems *= d
    return [0, 0, nitems, int(itemsize), 0, *shape, *strides]
