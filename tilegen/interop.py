"""Arrays from elsewhere: torch tensors, JAX arrays, ml_dtypes arrays, anything that speaks
DLPack, the buffer protocol or the array interface, read as NumPy arrays without a copy.

NumPy arrays never come here (the native entry reads them directly). Everything else is
viewed through `numpy.from_dlpack` when it exports DLPack (which also says where its memory
lives: only host memory can be read) and through `numpy.asarray` otherwise; the compiled
function then copies a view only when its layout does not fit (not C-contiguous), as it
does for NumPy. An output must be memory the result can be written into: a view that
`numpy.asarray` might have copied is refused rather than written and dropped.
"""

from __future__ import annotations

import numpy as np

# DLPack device types (dlpack.h, DLDeviceType).
DLPACK_CPU, DLPACK_CUDA_HOST, DLPACK_ROCM_HOST = 1, 3, 11
DLPACK_DEVICES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                  9: "VPI", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI",
                  15: "WebGPU", 16: "Hexagon"}
HOST_DEVICES = (DLPACK_CPU, DLPACK_CUDA_HOST, DLPACK_ROCM_HOST)


def _type_name(obj) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else \
        kind.__qualname__


class ArgumentError(TypeError):
    """A call's arguments do not match the Kina signature."""


def _argument_error(message: str) -> Exception:
    return ArgumentError(message)


def _from_dlpack(obj, what: str) -> np.ndarray:
    try:
        device, _ = obj.__dlpack_device__()
    except Exception as error:  # noqa: BLE001 -- a foreign object's failure is the caller's
        raise _argument_error(f"{what}: cannot tell where this {_type_name(obj)} lives: "
                            f"{error}") from None
    if int(device) not in HOST_DEVICES:
        place = DLPACK_DEVICES.get(int(device), f"DLPack device type {int(device)}")
        raise _argument_error(f"{what} is a {_type_name(obj)} in {place} memory; tilegen runs "
                            "on the CPU: move it to host memory first (e.g. tensor.cpu())")
    try:
        return np.from_dlpack(obj)
    except Exception as error:  # noqa: BLE001 -- unsupported dtype, requires_grad, ...
        raise _argument_error(f"{what}: cannot read this {_type_name(obj)} as an array: "
                            f"{error}") from None


def as_input(obj, what: str) -> np.ndarray:
    """`obj` as a NumPy array (a view where it can be one)."""
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, what)
    try:
        return np.asarray(obj)
    except Exception as error:  # noqa: BLE001 -- any conversion failure is the user's
        raise _argument_error(f"{what} is not an array: {error}") from None


def as_output(obj, what: str) -> np.ndarray:
    """A writable NumPy view of `obj`'s own memory, or an ArgumentError."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        view = _from_dlpack(obj, what)
    elif hasattr(obj, "__array_interface__") or _has_buffer(obj):
        view = np.asarray(obj)  # views the exporter's memory, never a copy
    else:
        raise _argument_error(f"{what} must be an array tilegen can write into (a NumPy array, "
                            f"a DLPack tensor, a buffer), got {_type_name(obj)}")
    if not view.flags.writeable:
        raise _argument_error(f"{what} is read-only")
    return view


def _has_buffer(obj) -> bool:
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True
