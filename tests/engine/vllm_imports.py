"""Every `vllm` import in the tree, read with `ast`, checked against the installed vLLM.

An import inside a function runs only when the function does: `OpenAIFrontend.create`
imports vLLM's CLI parser after the model has loaded, so a module vLLM moved between
versions fails a GPU start minutes in, and no test that stops short of the serving layer
sees it. Reading the source finds every import statement wherever it sits (module
level, functions, `TYPE_CHECKING` blocks); each must name a module the installed vLLM
has and, for `from m import a`, an attribute or submodule `a` of it.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The trees whose code imports vLLM: the engine, the gateway, the tools, the benchmarks
#: and the tests.
SWEPT: tuple[str, ...] = ("engine", "gateway", "tools", "bench", "tests")


@dataclass(frozen=True, slots=True)
class VllmImport:
    """One import statement of a `vllm` module (`names` empty for `import vllm.x`)."""

    path: Path
    line: int
    module: str
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        if not self.names:
            return f"{self.path}:{self.line}: import {self.module}"
        return f"{self.path}:{self.line}: from {self.module} import {', '.join(self.names)}"


def _is_vllm(module: str) -> bool:
    return module == "vllm" or module.startswith("vllm.")


def imports_in(source: str, path: Path) -> Iterator[VllmImport]:
    """The `vllm` imports of one file, in source order, at any depth."""
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_vllm(alias.name):
                    yield VllmImport(path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_vllm(node.module or ""):
            names = tuple(alias.name for alias in node.names)
            yield VllmImport(path, node.lineno, str(node.module), names)


def vllm_imports(
    root: Path = REPO_ROOT, trees: Iterable[str] = SWEPT, exclude: Iterable[str] = ()
) -> list[VllmImport]:
    """Every `vllm` import under `root`'s `trees`, but `exclude`d folders (relative paths)."""
    skipped = tuple(root / e for e in exclude)
    found: list[VllmImport] = []
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            if any(path.is_relative_to(s) for s in skipped):
                continue
            relative = path.relative_to(root)
            found.extend(imports_in(path.read_text(encoding="utf-8"), relative))
    return sorted(found, key=lambda i: (str(i.path), i.line))


def problem(imported: VllmImport) -> str | None:
    """What the installed vLLM lacks of one import, or None when it resolves."""
    try:
        module = importlib.import_module(imported.module)
    except ImportError as exc:
        return f"{imported}: {type(exc).__name__}: {exc}"
    missing: list[str] = []
    for name in imported.names:
        if name == "*" or hasattr(module, name):
            continue
        try:  # `from vllm.x import y` where y is a submodule not yet imported
            importlib.import_module(f"{imported.module}.{name}")
        except ImportError:
            missing.append(name)
    if missing:
        return f"{imported}: {imported.module} has no {', '.join(missing)}"
    return None


def unresolved(imports: Iterable[VllmImport]) -> list[str]:
    """One line per import the installed vLLM cannot satisfy."""
    return [p for p in (problem(i) for i in imports) if p is not None]
