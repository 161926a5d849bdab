"""The resolved settings as YAML (`serve --check-config`), secrets redacted.

The output is the configuration file the gateway would have run with: every key, in the
layout `--config` reads, so it can be diffed, reviewed, or kept as a starting file.
Redacted are the secret fields (`redis_password`) and a password inside any URL
(`redis://user:<redacted>@host`); API keys appear only as the SHA-256 digests the
settings hold anyway.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from gateway.config.catalogue import setting_docs
from gateway.config.environment import shared_keys
from gateway.config.model import ServeSettings

REDACTED = "<redacted>"
_URL_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:)[^/@]*(?P<at>@)")


def resolved_yaml(settings: ServeSettings) -> str:
    """`settings` as a YAML document in the `--config` layout, secrets redacted."""
    source = f" with {settings.config_file}" if settings.config_file is not None else ""
    head = f"# resolved{source}: flags > environment > YAML file > defaults\n"
    return head + yaml.safe_dump(resolved_tree(settings), sort_keys=False)


def resolved_tree(settings: ServeSettings) -> dict[str, Any]:
    """`settings` as file keys: no `config_file`, no section copies of top-level keys."""
    tree: dict[str, Any] = settings.model_dump(mode="json", exclude={"config_file"})
    # An override lists only what differs from `tenants.default`; a field written out at
    # its default would pin it and stop it following the default.
    tree["tenants"]["overrides"] = {
        label: policy.model_dump(mode="json", exclude_unset=True)
        for label, policy in settings.tenants.overrides.items()
    }
    for section, keys in shared_keys(ServeSettings).items():
        for key in keys:
            tree[section].pop(key, None)
    for doc in setting_docs():
        if doc.secret:
            parent = _parent(tree, doc.path)
            if parent.get(doc.path[-1]) is not None:
                parent[doc.path[-1]] = REDACTED
    redacted = _redact_urls(tree)
    assert isinstance(redacted, dict)
    return redacted


def _parent(tree: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = tree
    for part in path[:-1]:
        node = node[part]
    return node


def _redact_urls(value: Any) -> Any:
    if isinstance(value, str):
        return _URL_PASSWORD.sub(rf"\g<head>{REDACTED}\g<at>", value)
    if isinstance(value, dict):
        return {key: _redact_urls(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_urls(item) for item in value]
    return value
