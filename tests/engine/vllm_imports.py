"""Every `vllm` import in the tree, read with `ast`, checked against the installed vLLM.

An import inside a function runs only when the function does: `OpenAIFrontend.create`
imports vLLM's CLI parser after the model has loaded, so a module vLLM moved between
versions fails a GPU start minutes in, and no test that stops short of the serving layer
sees it. Reading the source finds every import statement wherever it sits (module
level, functions, `TYPE_CHECKING` blocks); each must name a module the installed vLLM
has and, for `from m import a`, an attribute or submodule `a` of it.

A module that is there but cannot be imported on this machine (vLLM's CUDA platform
module loads the NVIDIA driver library; on the CPU build it loads kernels the build does
not ship) is checked in its source instead: the file exists and defines the names.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
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


def _absent(exc: ImportError, module: str) -> bool:
    """Whether the import failed because `module` itself (or a package above it) is
    not there, rather than something it imports."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return bool(name) and (module == name or module.startswith(f"{name}."))


def problem(imported: VllmImport) -> str | None:
    """What the installed vLLM lacks of one import, or None when it resolves."""
    try:
        module = importlib.import_module(imported.module)
    except ImportError as exc:
        if _absent(exc, imported.module):
            return f"{imported}: {type(exc).__name__}: {exc}"
        return _source_problem(imported)
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


def _source_problem(imported: VllmImport) -> str | None:
    """`problem` for a module that exists but does not import here, read from its file."""
    spec = importlib.util.find_spec(imported.module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return f"{imported}: {imported.module} not found"
    defined = top_level_names(Path(spec.origin).read_text(encoding="utf-8"))
    # A package's submodules are files beside its __init__ (finding their spec would
    # import the package, which is what fails here).
    folders = [Path(p) for p in spec.submodule_search_locations or ()]
    defined |= {p.stem for f in folders for p in f.iterdir() if p.suffix == ".py" or p.is_dir()}
    missing = [n for n in imported.names if n != "*" and n not in defined]
    if missing:
        return f"{imported}: {imported.module} has no {', '.join(missing)}"
    return None


def top_level_names(source: str) -> set[str]:
    """Names a module binds at its top level, in `if`/`try`/`with` blocks included."""
    names: set[str] = set()
    body = list(ast.parse(source).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody", "handlers"):
                body.extend(getattr(node, block, []))
        elif isinstance(node, ast.ExceptHandler):
            body.extend(node.body)
    return names


def unresolved(imports: Iterable[VllmImport]) -> list[str]:
    """One line per import the installed vLLM cannot satisfy."""
    return [p for p in (problem(i) for i in imports) if p is not None]
