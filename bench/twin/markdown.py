"""The Markdown pieces the twin's report is built of (`bench.twin.report`, `verify_report`)."""

from __future__ import annotations

from collections.abc import Sequence


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure at `digits` decimals; "-" where there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
