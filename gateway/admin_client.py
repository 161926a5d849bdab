"""HTTP client behind `spec-gateway flags get|set|unset|audit` and `spec-gateway classes`.

The functions take an `httpx.Client` already pointed at a gateway (base URL,
`Authorization: Bearer <admin key>`), so tests can pass any client, including
Starlette's `TestClient`; the typer commands build one from `--url` and
`--admin-key` (or `SPECGW_URL` / `SPECGW_ADMIN_KEY`). Errors come back in
OpenAI's shape and are raised as `AdminClientError` with the server's message.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import httpx
import typer

ACTOR_HEADER = "x-specgw-actor"


class AdminClientError(RuntimeError):
    """A non-2xx answer from the admin API (status and the server's message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def connect(url: str, admin_key: str, timeout_s: float = 10.0) -> httpx.Client:
    """A client for the admin API; the actor header names who runs the CLI (for the audit)."""
    try:
        who = f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        who = "unknown"
    headers = {"authorization": f"Bearer {admin_key}", ACTOR_HEADER: who}
    return httpx.Client(base_url=url, headers=headers, timeout=timeout_s)


def _json(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:500]
    raise AdminClientError(response.status_code, message)


def _target(class_id: str | None, label: str | None) -> dict[str, str]:
    out = {}
    if class_id:
        out["class"] = class_id
    if label:
        out["label"] = label
    return out


def get_flags(
    client: httpx.Client,
    flag: str | None = None,
    class_id: str | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    params = {**_target(class_id, label), **({"flag": flag} if flag else {})}
    result: dict[str, Any] = _json(client.get("/admin/flags", params=params))
    return result


def set_flag(
    client: httpx.Client,
    flag: str,
    value: str | bool | int | float,
    class_id: str | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    body = {"value": value, **_target(class_id, label)}
    result: dict[str, Any] = _json(client.put(f"/admin/flags/{flag}", json=body))
    return result


def unset_flag(
    client: httpx.Client, flag: str, class_id: str | None = None, label: str | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = _json(
        client.delete(f"/admin/flags/{flag}", params=_target(class_id, label))
    )
    return result


def get_audit(client: httpx.Client, count: int = 20) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _json(client.get("/admin/flags/audit", params={"count": count}))[
        "data"
    ]
    return rows


def get_classes(client: httpx.Client) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _json(client.get("/admin/classes"))["data"]
    return rows


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain aligned columns (first row's keys unless given); nested values as compact JSON."""
    if not rows:
        return "(none)"
    cols = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


# ---- typer commands ---------------------------------------------------------------------------
UrlOpt = Annotated[str, typer.Option(envvar="SPECGW_URL", help="Gateway base URL.")]
KeyOpt = Annotated[str, typer.Option(envvar="SPECGW_ADMIN_KEY", help="Admin key (not a user key).")]
ClassOpt = Annotated[str | None, typer.Option("--class", help="Target one class id.")]
LabelOpt = Annotated[str | None, typer.Option(help="Target every class with this label.")]
DEFAULT_URL = "http://127.0.0.1:8000"

flags_app = typer.Typer(no_args_is_help=True, help="Get, set or unset ops flags (all replicas).")


def _run(action: Any) -> None:
    try:
        action()
    except AdminClientError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except httpx.HTTPError as exc:
        typer.echo(f"error: cannot reach the gateway: {exc}", err=True)
        raise typer.Exit(2) from exc


@flags_app.command("get")
def flags_get(
    admin_key: KeyOpt,
    flag: Annotated[str | None, typer.Argument(help="One flag; all if omitted.")] = None,
    class_id: ClassOpt = None,
    label: LabelOpt = None,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Show overrides and the effective values (for a class, with --class/--label)."""

    def action() -> None:
        with connect(url, admin_key) as client:
            result = get_flags(client, flag, class_id, label)
        typer.echo(format_table(result["overrides"], ["flag", "target", "value"]))
        if "effective" in result:
            typer.echo("\neffective: " + json.dumps(result["effective"]))

    _run(action)


@flags_app.command("set")
def flags_set(
    flag: Annotated[str, typer.Argument(help="Flag name, e.g. speculation-enabled.")],
    value: Annotated[str, typer.Argument(help="New value, e.g. false, static, 3, 0.1.")],
    admin_key: KeyOpt,
    class_id: ClassOpt = None,
    label: LabelOpt = None,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Override a flag on every replica (applied within 2 s); audited."""

    def action() -> None:
        with connect(url, admin_key) as client:
            entry = set_flag(client, flag, value, class_id, label)
        typer.echo(f"{entry['flag']} [{entry['target']}]: {entry['old']} -> {entry['new']}")

    _run(action)


@flags_app.command("unset")
def flags_unset(
    flag: Annotated[str, typer.Argument(help="Flag name.")],
    admin_key: KeyOpt,
    class_id: ClassOpt = None,
    label: LabelOpt = None,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Remove an override: the file value or the default applies again; audited."""

    def action() -> None:
        with connect(url, admin_key) as client:
            entry = unset_flag(client, flag, class_id, label)
        typer.echo(f"{entry['flag']} [{entry['target']}]: {entry['old']} -> (unset)")

    _run(action)


@flags_app.command("audit")
def flags_audit(
    admin_key: KeyOpt,
    count: Annotated[int, typer.Option(min=1, max=1000, help="Newest N changes.")] = 20,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Who changed which flag, when, from what to what (newest first)."""

    def action() -> None:
        with connect(url, admin_key) as client:
            rows = get_audit(client, count)
        cols = ["id", "who", "action", "flag", "target", "old", "new"]
        typer.echo(format_table(rows, cols))

    _run(action)


def classes_command(admin_key: KeyOpt, url: UrlOpt = DEFAULT_URL) -> None:
    """Print the cluster-wide class table from /admin/classes."""

    def action() -> None:
        with connect(url, admin_key) as client:
            typer.echo(format_table(get_classes(client)))

    _run(action)
