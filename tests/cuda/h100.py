"""vLLM 0.33's own CUDA platform on a machine without a GPU, answering as H100s would.

vLLM decides at start-up, from its platform (`vllm.platforms.current_platform`), how
the engine runs: the model runner, async scheduling, torch.compile, the CUDA-graph
mode and capture sizes, the attention and fusion passes. The tier runs on the CPU
platform (tests/cuda/conftest.py); `cuda_platform` swaps in the real CUDA platform
class (`vllm.platforms.cuda.NvmlCudaPlatform`, the one an NVIDIA host resolves) for
its duration, with three things stood in, each because no GPU is here:

* the NVIDIA driver library (`libcuda.so.1`): vLLM's kernel libraries link against
  it, and loading them registers the custom ops that config resolution reads (the
  fusion passes look up `torch.ops._C.*` at import). The stand-in exports the
  driver entry points those libraries name and answers every call with
  CUDA_ERROR_NO_DEVICE; nothing the tests run calls one.
* NVML (`pynvml` as `vllm.platforms.cuda` uses it): compute capability 9.0, the
  name and memory of an H100 80GB HBM3, NVLink between all GPUs, and the GPU count
  the pod is given (`_cuda_device_count_stateless`, which reads NVML too).
* Triton's active driver: vLLM looks for one when it imports `vllm.triton_utils` and,
  finding none without a GPU, sets `HAS_TRITON` false and `triton` to a placeholder;
  the config reads its own copy of the flag (Model Runner V2 requires Triton), which
  is set true. The flag in `vllm.triton_utils` stays false, so a kernel module first
  imported meanwhile sees a flag that matches the placeholder it gets.

Modules bind `current_platform` when they import it, so the swap rebinds every
module's reference to the CPU platform object and rebinds them back on exit
(including modules first imported meanwhile).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CAPABILITY = (9, 0)
NAME = "NVIDIA H100 80GB HBM3"
#: What NVML reports as an H100 80GB's total memory (81,559 MiB).
MEMORY_BYTES = 81559 * 2**20
#: CUresult CUDA_ERROR_NO_DEVICE.
NO_DEVICE = 100
#: The driver entry points vLLM 0.33's kernel libraries link against (`nm -D
#: --undefined-only vllm/*.so | grep ' cu[A-Z]'`), and those a loader asks for first.
DRIVER_SYMBOLS = (
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDevicePrimaryCtxRetain",
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuInit",
    "cuMemAddressFree",
    "cuMemAddressReserve",
    "cuMemCreate",
    "cuMemGetAllocationGranularity",
    "cuMemMap",
    "cuMemRelease",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuPointerGetAttribute",
    "cuTensorMapEncodeTiled",
)

_driver: ctypes.CDLL | None = None


def load_driver_stand_in(workdir: Path) -> None:
    """Build and load (once per process) a `libcuda.so.1` that reports no device.

    Loaded with RTLD_GLOBAL under its soname, so the dynamic loader resolves the kernel
    libraries' `libcuda.so.1` dependency to it.
    """
    global _driver
    if _driver is not None:
        return
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("the CUDA platform tests build a driver stand-in: install a C compiler")
    source = workdir / "libcuda_stand_in.c"
    source.write_text(
        "".join(f"int {name}(void) {{ return {NO_DEVICE}; }}\n" for name in DRIVER_SYMBOLS),
        encoding="utf-8",
    )
    library = workdir / "libcuda.so.1"
    command = [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library)]
    command.append(str(source))
    subprocess.run(command, check=True, capture_output=True)
    _driver = ctypes.CDLL(str(library), mode=os.RTLD_GLOBAL)


@dataclass(frozen=True)
class _Memory:
    total: int = MEMORY_BYTES
    free: int = MEMORY_BYTES
    used: int = 0


class H100Nvml:
    """The NVML calls `vllm.platforms.cuda` makes, answered as `gpus` H100s would;
    a device handle is the device's index."""

    def __init__(self, real: Any, gpus: int) -> None:
        self.NVMLError = real.NVMLError
        self.NVML_P2P_CAPS_INDEX_NVLINK = real.NVML_P2P_CAPS_INDEX_NVLINK
        self.NVML_P2P_STATUS_OK = real.NVML_P2P_STATUS_OK
        self.gpus = gpus

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.gpus:
            raise self.NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return CAPABILITY

    def nvmlDeviceGetName(self, handle: int) -> str:
        return NAME

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-00000000-0000-0000-0000-{handle:012d}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        return _Memory()

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return int(self.NVML_P2P_STATUS_OK)


def _rebind(old: object, new: object) -> int:
    """Every module global that is `old` set to `new` (aliases included)."""
    count = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None) if isinstance(module, ModuleType) else None
        if not namespace:
            continue
        for name, value in list(namespace.items()):
            if value is old:
                namespace[name] = new
                count += 1
    return count


@contextmanager
def cuda_platform(gpus: int, workdir: Path) -> Iterator[Any]:
    """vLLM's current platform is its CUDA platform on `gpus` H100s inside the block."""
    load_driver_stand_in(workdir)
    import vllm.config.vllm as config_module
    import vllm.platforms as platforms
    import vllm.platforms.cuda as cuda

    cpu = platforms.current_platform
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cuda, "pynvml", H100Nvml(cuda.pynvml, gpus))
        patch.setattr(cuda, "_cuda_device_count_stateless", lambda *_: gpus)
        patch.setattr(config_module, "HAS_TRITON", True)
        platform = cuda.NvmlCudaPlatform()
        _rebind(cpu, platform)
        try:
            yield platform
        finally:
            _rebind(platform, cpu)
            # Cached per class: a later swap may answer for another GPU count.
            cuda.NvmlCudaPlatform.get_device_capability.cache_clear()
