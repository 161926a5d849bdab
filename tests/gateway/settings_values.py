"""A valid value other than the default for every setting, and its spelling per source.

Numbers and booleans are derived from the field (its default nudged within its bounds);
the rest are listed here, so a new setting of another type fails
`test_every_setting_has_a_test_value` until it is given one.
"""

from __future__ import annotations

import json
import typing
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from gateway.config import ServeSettings, SettingDoc

DIGEST = "ab" * 32
#: Values for settings a nudge cannot derive (strings, paths, lists, mappings).
LISTED: dict[str, Any] = {
    "host": "localhost",
    "served_model_name": "served-elsewhere",
    "api_keys": [DIGEST],
    "admin_keys": ["cd" * 32],
    "redis_url": "redis://redis.test:6379/1",
    "redis_username": "gateway",
    "redis_password": "not-in-the-output",
    "redis_password_file": "/run/secrets/redis",
    "redis_tls_ca_file": "/etc/ca.pem",
    "redis_tls_cert_file": "/etc/cert.pem",
    "redis_tls_key_file": "/etc/key.pem",
    "tenants.keys": {"team-a": DIGEST},
    "tenants.overrides": {"team-a": {"weight": 4.0}},
    "namespace": "blue",
    "flags_dir": "/etc/flags",
    "otel_endpoint": "http://collector.test:4318/v1/traces",
    "cors_origins": ["https://app.test"],
    "log_level": "debug",
    "engine.model": "/models/target",
    "engine.drafter": "/models/drafter",
    "served_model_aliases": ["short-name"],
    "engine.max_model_len": 4096,
    "engine.max_num_seqs": 64,
    "engine.enforce_eager": False,
    "engine.tool_call_parser": "llama3_json",
    "engine.reasoning_parser": "qwen3",
    "engine.extra_args": {"enable_prefix_caching": True},
    "engine.spec_tokens_per_batch_size": [[1, 4, 2], [5, 64, 1]],
    "engine.prefill_step_depth": 1,
    "engine.backend": "fake",  # a name in the registry (`engine.backend.PLUGINS`)
    "control.policy": "goodput",  # the only policy: set, and seen as set
    "control.policy_params": {"hysteresis": 0.1},
    "control.calibrate_batches": [1, 2],
    "control.batch_floor": 0.9,
}
#: Comma-separated in flags and the environment (their fields split a string).
CSV = {"api_keys", "admin_keys", "cors_origins", "served_model_aliases"}


def sample_value(doc: SettingDoc) -> Any:
    """A valid value that differs from the default (the listed one, else a nudge)."""
    if doc.key in LISTED:
        return LISTED[doc.key]
    default = doc.default
    literal = _literal_choices(doc)
    if literal:
        return next(v for v in literal if v != default)
    if isinstance(default, bool):
        return not default
    if doc.key == "engine.block_size":
        return 64
    if isinstance(default, int | float):
        for candidate in _nudges(default):
            if _valid(doc, candidate):
                return candidate
    raise LookupError(f"no test value for {doc.key}: list one in LISTED")


def _nudges(default: float) -> list[Any]:
    kind = type(default)
    return [kind(default + 1), kind(default * 2), kind(default / 2), kind(default - 1)]


def _literal_choices(doc: SettingDoc) -> tuple[Any, ...]:
    annotation = _field(doc).annotation
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()


def _field(doc: SettingDoc) -> Any:
    model: Any = ServeSettings
    for part in doc.path[:-1]:
        model = model.model_fields[part].annotation
    return model.model_fields[doc.path[-1]]


def _valid(doc: SettingDoc, value: Any) -> bool:
    """The field's own type and bounds accept `value` (cross-field rules are checked when
    all values are resolved together)."""
    info = _field(doc)
    constrained: Any = Annotated[(info.annotation, *info.metadata)]
    try:
        TypeAdapter(constrained).validate_python(value)
    except ValidationError:
        return False
    return True


def as_text(doc: SettingDoc, value: Any) -> str:
    """The value as a flag or an environment variable spells it."""
    if doc.path[-1] in CSV:
        return ",".join(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def nested(pairs: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """{("engine", "max_depth"): 2} -> {"engine": {"max_depth": 2}}."""
    tree: dict[str, Any] = {}
    for path, value in pairs.items():
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return tree
