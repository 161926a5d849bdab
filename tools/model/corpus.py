"""An offline corpus: functions, signatures and docstrings of the standard library.

The model may only learn from text that ships with the machine, so the corpus is
read from the running interpreter's standard-library sources with `ast` (never
imported: importing arbitrary modules has side effects). Files and functions are
sorted and hashed so that the build is deterministic and the manifest can prove
which data a model saw.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: Standard-library modules read, in this order; small, well documented, present everywhere.
MODULES: tuple[str, ...] = (
    "argparse",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "collections/__init__",
    "colorsys",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "difflib",
    "enum",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html/__init__",
    "imaplib",
    "inspect",
    "ipaddress",
    "json/__init__",
    "json/decoder",
    "json/encoder",
    "locale",
    "logging/__init__",
    "mailbox",
    "mimetypes",
    "netrc",
    "ntpath",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pkgutil",
    "platform",
    "plistlib",
    "posixpath",
    "pprint",
    "queue",
    "quopri",
    "random",
    "reprlib",
    "sched",
    "secrets",
    "selectors",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "socketserver",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "urllib/parse",
    "urllib/request",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "zipfile/__init__",
    "zipimport",
)


class CorpusError(RuntimeError):
    """The standard-library sources needed for the corpus are missing."""


@dataclass(frozen=True, slots=True)
class FunctionDoc:
    """One documented function or method of the standard library."""

    module: str
    name: str
    args: tuple[str, ...]
    summary: str
    source: str

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.args)})"


def stdlib_dir() -> Path:
    """The directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(root: Path | None = None) -> list[FunctionDoc]:
    """All documented functions of `MODULES` under `root`, in a fixed order.

    Raises `CorpusError` when fewer than half the modules are present, which
    means this is not a full CPython install (e.g. a stripped container image).
    """
    root = root or stdlib_dir()
    docs: list[FunctionDoc] = []
    found = 0
    for rel in MODULES:
        path = root / f"{rel}.py"
        if not path.is_file():
            continue
        found += 1
        module = rel.removesuffix("/__init__").replace("/", ".")
        docs.extend(_functions(module, path.read_text(encoding="utf-8", errors="replace")))
    if found < len(MODULES) // 2:
        raise CorpusError(
            f"only {found} of {len(MODULES)} standard-library modules found under {root}; "
            "the build needs a full CPython standard library (sources, not only .pyc)"
        )
    return docs


def corpus_hash(docs: list[FunctionDoc]) -> str:
    """sha256 over every field of every function, in order."""
    h = hashlib.sha256()
    for d in docs:
        for part in (d.module, d.name, *d.args, d.summary, d.source):
            h.update(part.encode("utf-8"))
            h.update(b"\0")
    return h.hexdigest()


def _functions(module: str, text: str) -> list[FunctionDoc]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines()
    out: list[FunctionDoc] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            continue
        summary = " ".join(doc.strip().split("\n\n")[0].split())
        if not 20 <= len(summary) <= 400:
            continue
        args = tuple(a.arg for a in node.args.args if a.arg not in ("self", "cls"))
        end = node.end_lineno or node.lineno
        source = "\n".join(lines[node.lineno - 1 : min(end, node.lineno + 39)])
        out.append(FunctionDoc(module, node.name, args, summary, _dedent(source)))
    out.sort(key=lambda d: (d.module, d.name, d.args, d.summary))
    return out


def _dedent(source: str) -> str:
    import textwrap

    return textwrap.dedent(source)
