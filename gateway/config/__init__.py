"""The settings of `spec-gateway serve`, resolved once: flags > environment > YAML > defaults.

`resolve(args, config_file)` builds `ServeSettings` from the three sources
(`gateway.config.sources`) and turns any mistake into a `ConfigError` whose lines name
the offending keys by their YAML path (`engine.max_depht: unknown setting (did you mean
max_depth?)`). `resolved_yaml` prints the result with secrets redacted
(`serve --check-config`); `setting_docs` lists every setting for `--help`;
`chart_schema` is the JSON schema of the file, which the Helm chart checks
`gateway.config` against (`deploy/sync_chart_assets.py`).
"""

from __future__ import annotations

from gateway.config.catalogue import SettingDoc, setting_docs
from gateway.config.errors import ConfigError
from gateway.config.model import ServeSettings
from gateway.config.render import resolved_yaml
from gateway.config.resolve import resolve
from gateway.config.schema import chart_schema

__all__ = [
    "ConfigError",
    "ServeSettings",
    "SettingDoc",
    "chart_schema",
    "resolve",
    "resolved_yaml",
    "setting_docs",
]
