"""Write the Helm chart's README from its values' comments, in the helm-docs style.

helm-docs (a Go tool, not on PyPI) documents a key by the `# -- description` comment
above it, continued by the `#` lines that follow; other comments are notes for the reader
of values.yaml and stay out. This reads `helm/spec-gateway/values.yaml` the same way and
fills the values table (and Chart.yaml's `{{ appVersion }}`) into `README.tmpl.md`, the
chart README's hand-written frame:

    python -m tools.chart_readme            # rewrite helm/spec-gateway/README.md
    python -m tools.chart_readme --check    # exit 1 when the README is stale

A row is every key with a description and every leaf (a scalar, a list, an empty map); a
map's keys always have rows, so a described map's row carries only its description. The
default is the value as values.yaml sets it, written as JSON; the type is the YAML value's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = REPO_ROOT / "helm" / "spec-gateway"
TEMPLATE = "README.tmpl.md"
README = "README.md"
#: Where the generated table goes in the template.
TABLE_MARK = "{{ values_table }}"
#: A mapping key at some indent (`key:` or `key: value`), quoted keys included.
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_./-]+|\"[^\"]+\"):(?:\s|$)")
_DESCRIBE = re.compile(r"^ *# -- ?(?P<text>.*)$")
_CONTINUE = re.compile(r"^ *#(?: (?P<text>.*))?$")


@dataclass(frozen=True, slots=True)
class ValueDoc:
    """One row of the table: a dotted key, its default, its type and its description."""

    key: str
    default: Any
    description: str
    #: A map whose keys have rows of their own: its default is theirs.
    branch: bool = False
    #: The values schema's types for the key, where it names them.
    schema_types: tuple[str, ...] = ()

    @property
    def type_name(self) -> str:
        if self.schema_types:
            return " or ".join(_SCHEMA_TYPES.get(t, t) for t in self.schema_types)
        return _type_name(self.default)


def descriptions(values_text: str) -> dict[str, str]:
    """Dotted key -> the `# --` description written above it."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in values_text.splitlines():
        described = _DESCRIBE.match(line)
        if described:
            pending = [described["text"].strip()]
            continue
        continued = _CONTINUE.match(line)
        if continued:
            if pending is not None:
                pending.append((continued["text"] or "").strip())
            continue
        key = _KEY.match(line)
        if key is None or line.lstrip().startswith("-"):
            pending = None if line.strip() else pending
            continue
        indent = len(key["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key["key"].strip('"')))
        if pending is not None:
            found[".".join(k for _, k in stack)] = " ".join(t for t in pending if t)
            pending = None
    return found


def rows(values_text: str, schema: dict[str, Any] | None = None) -> list[ValueDoc]:
    """The table's rows, in the order values.yaml has its keys; a null default takes its
    type from the values schema."""
    values = yaml.safe_load(values_text)
    assert isinstance(values, dict), "values.yaml is a mapping"
    described = descriptions(values_text)
    out: list[ValueDoc] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            branch = isinstance(value, dict) and bool(value)
            if key in described or not branch:
                types = _schema_types(schema, key) if value is None else ()
                out.append(ValueDoc(key, value, described.get(key, ""), branch, types))
            if branch:
                walk(value, f"{key}.")

    walk(values, "")
    return out


def table(docs: list[ValueDoc]) -> str:
    lines = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for doc in docs:
        default = (
            "" if doc.branch else f"`{_cell(json.dumps(doc.default, separators=(', ', ': ')))}`"
        )
        lines.append(f"| `{doc.key}` | {doc.type_name} | {default} | {_cell(doc.description)} |")
    return "\n".join(lines) + "\n"


def render(chart_dir: Path = CHART_DIR) -> str:
    """The README: the template with the values table filled in."""
    template = (chart_dir / TEMPLATE).read_text(encoding="utf-8")
    assert TABLE_MARK in template, f"{TEMPLATE} has no {TABLE_MARK}"
    values_text = (chart_dir / "values.yaml").read_text(encoding="utf-8")
    schema = json.loads((chart_dir / "values.schema.json").read_text(encoding="utf-8"))
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))
    filled = template.replace("{{ appVersion }}", str(chart["appVersion"]))
    return filled.replace(TABLE_MARK, table(rows(values_text, schema)).rstrip("\n"))


_SCHEMA_TYPES = {"integer": "int", "number": "float", "boolean": "bool", "array": "list"}


def _schema_types(schema: dict[str, Any] | None, dotted: str) -> tuple[str, ...]:
    node: Any = schema
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node.get("properties", {}):
            return ()
        node = node["properties"][part]
    declared = node.get("type", ()) if isinstance(node, dict) else ()
    return (declared,) if isinstance(declared, str) else tuple(declared)


def _cell(text: str) -> str:
    """Markdown table cell: a `|` would end the cell, and a `<name>` placeholder would be
    read as an HTML tag and dropped."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="Only report a stale README (exit 1).")
    parser.add_argument("--chart", type=Path, default=CHART_DIR, help="The chart directory.")
    args = parser.parse_args(argv)
    path: Path = args.chart / README
    expected = render(args.chart)
    current = path.read_text(encoding="utf-8") if path.is_file() else None
    if args.check:
        if current != expected:
            print(f"stale: {path} (python -m tools.chart_readme)")
            return 1
        return 0
    if current != expected:
        path.write_text(expected, encoding="utf-8")
        print(f"wrote: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
