"""CUDA shared-memory regions (cudaIpc handles from `tritonclient.utils.cuda_shared_memory`).

The CUDA runtime is imported only when a client registers a region; without it, or
without a device, registration fails with a clear reason and nothing else changes.
Inputs are copied device→host once (the backends compute on the CPU), outputs
host→device once, each after the same bounds check as system shared memory.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
from dataclasses import dataclass

import numpy as np

from .errors import invalid_arg
from .shared_memory import RegionRegistry, check_bounds

IPC_HANDLE_SIZE = 64  # CUDA_IPC_HANDLE_SIZE
# Triton 2.51's words when a region cannot be registered (no GPU, a bad handle), then why.
CANNOT_REGISTER = "failed to register shared memory region: invalid args"
UNAVAILABLE = CANNOT_REGISTER + " (CUDA shared memory is not available: {reason}; use system " \
    "shared memory instead)"
# Triton's HTTP words for a handle that is not 64 bytes of base64.
NOT_A_HANDLE = "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"


def _runtime():
    """cuda-python's runtime module, or INVALID_ARG naming what is missing."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError:
            raise invalid_arg(UNAVAILABLE.format(
                reason="the CUDA runtime bindings are not installed (pip install cuda-python)")
            ) from None
    error, count = cudart.cudaGetDeviceCount()
    if int(error) != 0 or count == 0:
        raise invalid_arg(UNAVAILABLE.format(reason="this server has no CUDA device"))
    return cudart


def _call(result, what: str):
    """Unwrap a cuda-python (error, value...) tuple, raising on a CUDA error."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise invalid_arg(f"{what} failed: CUDA error {int(error)}")
    return values[0] if len(values) == 1 else values


def decode_handle(raw: bytes | str) -> bytes:
    """The 64-byte cudaIpcMemHandle_t, sent raw (gRPC's bytes) or base64-encoded (HTTP's
    text); refused in the words Triton uses on each."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    if len(data) == IPC_HANDLE_SIZE:
        return data
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) != IPC_HANDLE_SIZE:
        words = NOT_A_HANDLE if isinstance(raw, str) else CANNOT_REGISTER
        raise invalid_arg(f"{words} (a CUDA IPC handle has {IPC_HANDLE_SIZE} bytes)")
    return decoded


@dataclass
class CudaRegion:
    name: str
    device_id: int
    byte_size: int
    device_pointer: int
    runtime: object
    users: int = 0  # requests using it now (RegionRegistry.hold/release)

    def status(self) -> dict:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def check(self, offset: int, byte_size: int, what: str) -> None:
        check_bounds(self.name, self.byte_size, offset, byte_size, what)

    def read(self, offset: int, byte_size: int, what: str) -> memoryview:
        self.check(offset, byte_size, what)
        host = np.empty(byte_size, dtype=np.uint8)
        _call(self.runtime.cudaMemcpy(host.ctypes.data, self.device_pointer + offset, byte_size,
                                      self.runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost),
              f"reading {what} from CUDA shared memory region '{self.name}'")
        return memoryview(host)

    def write(self, offset: int, data, what: str) -> None:
        host = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        self.check(offset, host.size, what)
        _call(self.runtime.cudaMemcpy(self.device_pointer + offset, host.ctypes.data, host.size,
                                      self.runtime.cudaMemcpyKind.cudaMemcpyHostToDevice),
              f"writing {what} to CUDA shared memory region '{self.name}'")

    def close(self) -> None:
        self.runtime.cudaIpcCloseMemHandle(self.device_pointer)


class CudaSharedMemoryRegistry(RegionRegistry):
    kind = "cuda"

    def register(self, name: str, raw_handle, device_id: int, byte_size: int) -> None:
        self.check_name(name)
        if byte_size <= 0 or device_id < 0:
            raise invalid_arg("a CUDA shared memory region needs a name, a device id >= 0 "
                              "and a positive byte size")
        handle_bytes = decode_handle(raw_handle)
        cudart = _runtime()
        self._add(name, lambda: _open(cudart, name, handle_bytes, device_id, byte_size))


def _open(cudart, name: str, handle_bytes: bytes, device_id: int,
          byte_size: int) -> CudaRegion:
    _call(cudart.cudaSetDevice(device_id), f"selecting CUDA device {device_id}")
    handle = cudart.cudaIpcMemHandle_t()
    ctypes.memmove(handle.getPtr(), handle_bytes, IPC_HANDLE_SIZE)
    pointer = _call(cudart.cudaIpcOpenMemHandle(handle, cudart.cudaIpcMemLazyEnablePeerAccess),
                    f"opening the CUDA IPC handle of region '{name}'")
    return CudaRegion(name, device_id, byte_size, int(pointer), cudart)
