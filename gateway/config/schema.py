"""The JSON schema of the `--config` file, in the form the Helm chart embeds it.

The chart writes `gateway.config` to the file `serve --config` reads, so its
`values.schema.json` holds this schema at `properties.gateway.properties.config`
(`deploy/sync_chart_assets.py` writes it; a test keeps the two equal). Helm validates
values against draft-07 with every `$ref` relative to the chart's whole schema, so the
model's `$defs` are inlined, tuple items are written as draft-07 `items` arrays, and
pydantic's titles are dropped (the descriptions stay). `config_file` (the file's own
name) and the keys a section takes from the top level are not keys of the file.
"""

from __future__ import annotations

from typing import Any

from gateway.config.environment import shared_keys
from gateway.config.model import ServeSettings

DESCRIPTION = (
    "Settings written to the file `spec-gateway serve --config` reads: gateway keys at the "
    "top level; engine, control, flags, state and tenants sections. Generated from "
    "gateway.config.ServeSettings by deploy/sync_chart_assets.py; unknown keys fail."
)


def chart_schema() -> dict[str, Any]:
    """`ServeSettings`' JSON schema, self-contained and draft-07 shaped."""
    raw = ServeSettings.model_json_schema()
    definitions: dict[str, Any] = raw.pop("$defs", {})
    schema = _draft07(raw, definitions)
    properties: dict[str, Any] = schema["properties"]
    properties.pop("config_file")
    for section, keys in shared_keys(ServeSettings).items():
        for key in keys:
            properties[section]["properties"].pop(key)
    return {**schema, "description": DESCRIPTION}


def _draft07(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_draft07(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _draft07(merged, definitions)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "prefixItems":
            out["items"] = _draft07(value, definitions)
        elif key == "properties":
            out[key] = {name: _draft07(sub, definitions) for name, sub in value.items()}
        else:
            out[key] = _draft07(value, definitions)
    return out
