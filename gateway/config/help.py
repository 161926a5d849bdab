"""The settings part of `serve --help`: by section, the common settings of each; `--help-all`
lists every one.

A section is a block of `ServeSettings` (engine, control, tenants, flags, state) or the
gateway's own top-level keys. Which settings count as common is chosen here, by YAML key;
`tests/gateway/test_cli.py` checks that every key named here exists, so a renamed setting
fails a test rather than falling out of the help.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.markup import escape as rich_escape

from gateway.config.catalogue import SettingDoc, setting_docs
from gateway.config.environment import SECTION_ENV
from gateway.config.model import ServeSettings

GATEWAY = "gateway"
#: Section -> its heading, in print order. Nested sections add their field's description.
SECTIONS: dict[str, str] = {
    GATEWAY: "top-level keys, SPECGW_<KEY>: binding, served names, keys, admission, "
    "timeouts, request bounds, Redis, telemetry",
    "engine": f"{SECTION_ENV['engine']}<KEY>",
    "control": f"{SECTION_ENV['control']}<KEY>",
    "tenants": "SPECGW_TENANTS as JSON",
    "flags": f"{SECTION_ENV['flags']}<KEY>",
    "state": f"{SECTION_ENV['state']}<KEY>",
}
#: Top-level keys listed under a section they configure.
_TOP_LEVEL_IN = {"flags_dir": "flags", "namespace": "state"}
#: The settings `serve --help` shows, by section: what a first deployment sets.
COMMON: dict[str, tuple[str, ...]] = {
    GATEWAY: (
        "host",
        "port",
        "config_file",
        "served_model_name",
        "served_model_aliases",
        "api_keys",
        "admin_keys",
        "max_running",
        "max_queued",
        "redis_url",
        "redis_password_file",
        "otel_endpoint",
        "log_level",
    ),
    "engine": (
        "engine.backend",
        "engine.model",
        "engine.drafter",
        "engine.max_depth",
        "engine.max_model_len",
        "engine.max_num_seqs",
        "engine.kv_cache_gib",
        "engine.tensor_parallel_size",
        "engine.gpu_memory_utilization",
        "engine.extra_args",
    ),
    "control": ("control.max_classes", "control.default_k", "control.policy"),
    "tenants": (
        "tenants.keys",
        "tenants.default.requests_per_minute",
        "tenants.default.tokens_per_minute",
        "tenants.default.max_concurrent",
        "tenants.overrides",
        "tenants.replicas",
    ),
    "flags": ("flags_dir",),
    "state": ("namespace", "state.max_classes", "state.live_window_s"),
}

_PREAMBLE = (
    "Every setting is a YAML key (--config), a flag and environment variables "
    "(the first listed wins). Precedence: flags > environment > YAML file > defaults; "
    "an unknown key is an error. Nested blocks (tenants) take JSON in the environment."
)


def section_of(doc: SettingDoc) -> str:
    """The section `doc` is listed under."""
    if len(doc.path) == 1:
        return _TOP_LEVEL_IN.get(doc.path[0], GATEWAY)
    return doc.path[0]


def by_section(docs: Iterable[SettingDoc]) -> dict[str, list[SettingDoc]]:
    """`docs` grouped by section, sections in `SECTIONS` order, settings in field order."""
    grouped: dict[str, list[SettingDoc]] = {section: [] for section in SECTIONS}
    for doc in docs:
        grouped[section_of(doc)].append(doc)
    return grouped


def entry(doc: SettingDoc) -> str:
    """One setting: `engine.max_depth: --engine.max-depth, SPECGW_ENGINE_MAX_DEPTH
    (default 4). K: ...`."""
    names = ", ".join(doc.env)
    return f"{doc.key}: {doc.flag}, {names} (default {doc.default!r}). {doc.description}"


def settings_help(every: bool) -> str:
    """The settings listing, rich-escaped: one paragraph per section, one line per setting.

    `every`: all settings (`--help-all`); else each section's `COMMON` ones, with a count
    of the rest.
    """
    docs = setting_docs()
    if every:
        lines = [_PREAMBLE]
    else:
        lines = [
            f"{_PREAMBLE} The common ones of each section follow ({len(docs)} with --help-all)."
        ]
    for section, members in by_section(docs).items():
        shown = members if every else [d for d in members if d.key in COMMON[section]]
        hidden = len(members) - len(shown)
        more = f"; {hidden} more with --help-all" if hidden else ""
        head = f"{section.upper()} ({_heading(section)}; {len(members)} settings{more})"
        lines.append("\n".join([head, *(f"  {entry(doc)}" for doc in shown)]))
    return rich_escape("\n\n".join(lines))


def _heading(section: str) -> str:
    field = ServeSettings.model_fields.get(section)
    described = f"{field.description.rstrip('.')}; " if field and field.description else ""
    return described + SECTIONS[section]
