"""Settings that refuse mistakes: unknown keys named with their path, one precedence for
every setting (controller, flags, state and tenants included), the resolved YAML.

In process: `gateway.config.resolve` is what `spec-gateway serve` calls first
(tests/gateway/test_config_cli.py runs the real command).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, ServeSettings, resolve, resolved_yaml, setting_docs
from gateway.config.catalogue import SettingDoc
from gateway.config.render import resolved_tree
from tests.gateway.settings_values import as_text, nested, sample_value

#: `config_file` names the file: it is set by a flag or the environment, never inside it.
LEAVES = [doc for doc in setting_docs() if doc.key != "config_file"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SPECGW_")]:
        monkeypatch.delenv(name)


def write(tmp_path: Path, tree: dict[str, Any]) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return path


def refusal(**kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        resolve(**kwargs)
    return caught.value.lines


@pytest.mark.parametrize(
    ("tree", "line"),
    [
        ({"max_runing": 4}, "max_runing: unknown setting (did you mean max_running?)"),
        (
            {"engine": {"max_depht": 2}},
            "engine.max_depht: unknown setting (did you mean max_depth?)",
        ),
        (
            {"control": {"hysteresys": 0.2}},
            "control.hysteresys: unknown setting (did you mean hysteresis?)",
        ),
        (
            {"flags": {"op_timeout": 1}},
            "flags.op_timeout: unknown setting (did you mean op_timeout_s?)",
        ),
        (
            {"state": {"flush_intervall_s": 1}},
            "state.flush_intervall_s: unknown setting (did you mean flush_interval_s?)",
        ),
        (
            {"tenants": {"default": {"wieght": 2}}},
            "tenants.default.wieght: unknown setting (did you mean weight?)",
        ),
        (
            {"tenants": {"keys": {"a": "ab" * 32}, "overrides": {"a": {"weigth": 2}}}},
            "tenants.overrides.a.weigth: unknown setting (did you mean weight?)",
        ),
        ({"enigne": {"max_depth": 2}}, "enigne: unknown setting (did you mean engine?)"),
        ({"zzz": 1}, "zzz: unknown setting"),
    ],
)
def test_an_unknown_key_is_named_with_its_path(
    tmp_path: Path, tree: dict[str, Any], line: str
) -> None:
    assert refusal(config_file=write(tmp_path, tree)) == [line]


def test_every_unknown_key_is_named_once(tmp_path: Path) -> None:
    tree = {"max_runing": 4, "engine": {"max_depht": 2}, "control": {"hysteresis": 2}}
    lines = refusal(config_file=write(tmp_path, tree))
    assert sorted(line.split(":")[0] for line in lines) == [
        "control.hysteresis",
        "engine.max_depht",
        "max_runing",
    ]


@pytest.mark.parametrize(
    ("tree", "start"),
    [
        ({"max_running": 0}, "max_running: Input should be greater than or equal to 1 (got 0)"),
        ({"engine": {"backend": "fak"}}, "engine.backend: backend must be one of fake, vllm"),
        ({"control": {"default_k": 9}}, "control: default_k must be <= max_k"),
        ({"flags": {"namespace": "x"}}, "flags.namespace: set it once, at the top level"),
        ({"state": {"redis_url": "redis://x"}}, "state.redis_url: set it once, at the top level"),
        ({"host": "0.0.0.0"}, "host: refusing to bind '0.0.0.0' without API keys"),
    ],
)
def test_a_bad_value_is_named_with_its_path(
    tmp_path: Path, tree: dict[str, Any], start: str
) -> None:
    (line,) = refusal(config_file=write(tmp_path, tree))
    assert line.startswith(start), line


def test_a_file_that_is_not_settings_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert refusal(config_file=missing) == [f"config_file: {missing}: no such file"]
    listed = tmp_path / "list.yaml"
    listed.write_text("- max_running\n")
    assert refusal(config_file=listed) == [
        f"{listed}: expected a mapping of settings at the top level"
    ]


def test_an_unknown_flag_is_named_and_abbreviations_are_not_guessed() -> None:
    assert refusal(args=["--max-runing", "3"]) == [
        "--max-runing: unknown setting (did you mean --max-running?)"
    ]
    assert refusal(args=["--max-run", "3"])[0].startswith("--max-run: unknown setting")
    assert refusal(args=["--engine.max-depht=2"])[0].startswith("--engine.max-depht: unknown")


def _check_all_set(settings: ServeSettings, leaves: list[SettingDoc]) -> None:
    dumped = resolved_tree(settings)
    for doc in leaves:
        expected = yaml.safe_load(yaml.safe_dump(sample_value(doc)))  # tuples -> lists
        node: Any = dumped
        model: Any = settings
        for part in doc.path[:-1]:
            node, model = node[part], getattr(model, part)
        value = getattr(model, doc.path[-1])
        got = value.get_secret_value() if doc.secret else node[doc.path[-1]]
        assert got == expected, doc.key
        assert doc.path[-1] in model.model_fields_set, doc.key


def test_every_setting_has_a_test_value() -> None:
    for doc in LEAVES:
        assert sample_value(doc) != doc.default or doc.key == "control.policy", doc.key


def test_every_setting_is_read_from_the_yaml_file(tmp_path: Path) -> None:
    tree = nested({doc.path: sample_value(doc) for doc in LEAVES})
    _check_all_set(resolve(config_file=write(tmp_path, tree)), LEAVES)


def test_every_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks: dict[str, dict[tuple[str, ...], Any]] = {}
    for doc in LEAVES:
        if len(doc.path) > 2 or (len(doc.path) == 2 and doc.path[0] == "tenants"):
            blocks.setdefault(doc.env[0], {})[doc.path[1:]] = sample_value(doc)
        else:
            monkeypatch.setenv(doc.env[0], as_text(doc, sample_value(doc)))
    for name, block in blocks.items():  # a nested block is one JSON variable
        monkeypatch.setenv(name, as_text(LEAVES[0], nested(block)))
    _check_all_set(resolve(), LEAVES)


def test_every_setting_is_read_from_its_flag() -> None:
    args = [part for doc in LEAVES for part in (doc.flag, as_text(doc, sample_value(doc)))]
    _check_all_set(resolve(args), LEAVES)


def test_one_precedence_for_every_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """File < environment < flag, key by key, in every section."""
    keys = ["max_running", "engine.max_depth", "control.hysteresis", "flags.op_timeout_s"]
    keys += ["state.flush_interval_s", "canary_timeout_s"]
    docs = {doc.key: doc for doc in LEAVES}
    file_values = {docs[k].path: sample_value(docs[k]) for k in keys}
    config = write(tmp_path, nested(file_values))
    env_doc, flag_doc = docs["control.hysteresis"], docs["engine.max_depth"]
    monkeypatch.setenv(env_doc.env[0], "0.5")
    monkeypatch.setenv(flag_doc.env[0], "1")
    settings = resolve([flag_doc.flag, "2"], config)
    assert settings.control.hysteresis == 0.5  # environment over file
    assert settings.engine.max_depth == 2  # flag over environment over file
    assert settings.max_running == sample_value(docs["max_running"])  # file over default
    assert settings.flags.op_timeout_s == sample_value(docs["flags.op_timeout_s"])
    assert settings.state.flush_interval_s == sample_value(docs["state.flush_interval_s"])
    monkeypatch.setenv("SPECGW_CONFIG_FILE", str(config))  # the file named by environment
    assert resolve().canary_timeout_s == sample_value(docs["canary_timeout_s"])


def test_the_shared_keys_set_every_section(monkeypatch: pytest.MonkeyPatch) -> None:
    """One Redis and one namespace, set at the top level, reach the flags and state."""
    monkeypatch.setenv("SPECGW_NAMESPACE", "green")
    monkeypatch.setenv("SPECGW_REDIS_URL", "redis://r.test:6379/0")
    monkeypatch.setenv("SPECGW_STATE_FLUSH_INTERVAL_S", "2")
    settings = resolve()
    assert settings.state.flush_interval_s == 2.0
    assert {settings.namespace, settings.flags.namespace, settings.state.namespace} == {"green"}
    assert settings.flags.redis_url == settings.state.redis_url == "redis://r.test:6379/0"
    assert settings.flags.key_prefix() == settings.state.key_prefix() == "specgw:{green}"


def test_each_environment_name_sets_one_setting() -> None:
    """A section's own names are unique (tests/gateway/test_config_keys_and_names.py
    refuses the bare names two sections once shared)."""
    own = [doc.env[0] for doc in setting_docs() if len(doc.path) <= 2]
    own = [name for name in own if name != "SPECGW_TENANTS"]
    assert len(own) == len(set(own))


def test_the_resolved_yaml_reads_back_as_the_same_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECGW_REDIS_PASSWORD", "hunter2-secret")
    monkeypatch.setenv("SPECGW_OTEL_ENDPOINT", "https://user:tok3n@otel.test/v1/traces")
    config = write(tmp_path, {"max_running": 3, "control": {"hysteresis": 0.2}})
    settings = resolve(["--engine.max-depth", "2"], config)
    text = resolved_yaml(settings)
    assert "hunter2-secret" not in text
    assert "tok3n" not in text
    tree = yaml.safe_load(text)
    assert tree["redis_password"] == "<redacted>"
    assert tree["otel_endpoint"] == "https://user:<redacted>@otel.test/v1/traces"
    assert (tree["max_running"], tree["engine"]["max_depth"]) == (3, 2)
    assert tree["control"]["hysteresis"] == 0.2
    for name in [n for n in os.environ if n.startswith("SPECGW_")]:
        monkeypatch.delenv(name)
    del tree["redis_password"], tree["otel_endpoint"]
    again = resolve(config_file=write(tmp_path, tree))
    expected = settings.model_dump(exclude={"config_file", "redis_password", "otel_endpoint"})
    assert again.model_dump(exclude={"config_file", "redis_password", "otel_endpoint"}) == (
        expected
    )
