"""Names and keys that cannot surprise an operator at start.

- A plaintext API key where a SHA-256 digest belongs is refused in one line that says how
  to make a digest, and the key never appears in the output.
- A `SPECGW_*` variable nothing reads is named on stderr with the closest known name (a
  warning, as vLLM gives for `VLLM_*`); the variables the project reads outside the
  settings are known.
- The bare names the flags and state sections once shared are refused, each naming the
  variable to set; no environment name sets two settings.

In process: `gateway.config.resolve`, and the real command through typer's `CliRunner`
(`serve` with and without `--check-config`; each refuses before anything starts).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from gateway.auth import digest
from gateway.cli import app
from gateway.config import ConfigError, ServeSettings, resolve, setting_docs
from gateway.config.environment import known_env, legacy_env, unknown_variables
from tests.tier_guard import settings_refusal

PLAINTEXT = "sk-plaintext-Key-0123"
#: A plaintext key; hex one byte short and one byte long; 64 characters that are not hex.
NOT_DIGESTS = [PLAINTEXT, "ab" * 31, "ab" * 33, "zz" * 32]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.upper().startswith("SPECGW_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def refusing() -> Iterator[None]:
    with settings_refusal():
        yield


def serve(*args: str, **env: str) -> Result:
    return CliRunner().invoke(app, ["serve", *args], env=env)


def refusal(**kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        resolve(**kwargs)  # type: ignore[arg-type]
    return caught.value.lines


@pytest.mark.parametrize("key", NOT_DIGESTS)
@pytest.mark.parametrize("setting", ["api_keys", "admin_keys"])
def test_a_key_that_is_not_a_digest_is_refused_without_showing_it(setting: str, key: str) -> None:
    flag = "--" + setting.replace("_", "-")
    (line,) = refusal(args=[flag, f"{digest('fine')},{key}"])
    assert line.startswith(f"{setting}: entry 2 of 2 is not a SHA-256 hex digest")
    assert "spec-gateway keys hash KEY" in line
    assert key not in line
    assert key[:8] not in line


@pytest.mark.parametrize("check", [["--check-config"], []], ids=["check-config", "serve"])
@pytest.mark.usefixtures("refusing")
def test_serve_refuses_a_plaintext_key_in_one_line(check: list[str]) -> None:
    result = serve(*check, "--host", "0.0.0.0", SPECGW_API_KEYS=PLAINTEXT)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        "spec-gateway: config: api_keys: entry 1 of 1 is not a SHA-256 hex digest "
        "(64 hex characters): give `spec-gateway keys hash KEY`'s output, never the key"
    ]
    assert PLAINTEXT not in result.output
    assert "plaintext" not in result.output


def test_a_digest_is_taken_in_any_case_and_kept_in_lower_case() -> None:
    key = digest("team-a")
    settings = resolve(["--api-keys", f" {key.upper()} ", "--admin-keys", key])
    assert settings.api_keys == settings.admin_keys == [key]


def test_check_config_prints_a_digest_not_a_key() -> None:
    key = digest(PLAINTEXT)
    result = serve("--check-config", SPECGW_API_KEYS=key)
    assert result.exit_code == 0, result.output
    assert key in result.stdout
    assert PLAINTEXT not in result.output


def test_a_tenant_key_that_is_not_a_digest_is_refused_by_label_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECGW_TENANTS", json.dumps({"keys": {"team-a": PLAINTEXT}}))
    (line,) = refusal()
    assert line.startswith("tenants.keys: key 'team-a': expected a SHA-256 hex digest")
    assert PLAINTEXT not in line


def test_an_unknown_variable_is_named_with_the_closest_known_one() -> None:
    environ = {
        "SPECGW_MAX_RUNING": "4",
        "SPECGW_ENGINE_MAX_DEPHT": "9",
        "SPECGW_API_KEY": PLAINTEXT,
        "SPECGW_FLAGS_REDIS_URL": "redis://r.test",  # shared: only the top level's name
        "SPECGW_NOTHING_LIKE_IT": "1",
        "PATH": "/bin",
    }
    assert unknown_variables(environ, ServeSettings) == [
        "SPECGW_API_KEY: unknown environment variable, ignored (did you mean SPECGW_API_KEYS?)",
        "SPECGW_ENGINE_MAX_DEPHT: unknown environment variable, ignored "
        "(did you mean SPECGW_ENGINE_MAX_DEPTH?)",
        "SPECGW_FLAGS_REDIS_URL: unknown environment variable, ignored "
        "(did you mean SPECGW_REDIS_URL?)",
        "SPECGW_MAX_RUNING: unknown environment variable, ignored "
        "(did you mean SPECGW_MAX_RUNNING?)",
        "SPECGW_NOTHING_LIKE_IT: unknown environment variable, ignored",
    ]


def test_serve_warns_of_an_unknown_variable_on_stderr_and_goes_on() -> None:
    result = serve("--check-config", SPECGW_MAX_RUNING="4", SPECGW_API_KEY=PLAINTEXT)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "spec-gateway: warning: SPECGW_API_KEY: unknown environment variable, ignored "
        "(did you mean SPECGW_API_KEYS?)",
        "spec-gateway: warning: SPECGW_MAX_RUNING: unknown environment variable, ignored "
        "(did you mean SPECGW_MAX_RUNNING?)",
    ]
    assert PLAINTEXT not in result.output
    assert "warning" not in result.stdout  # the resolved YAML stays parseable


def test_every_setting_and_the_projects_own_variables_are_known() -> None:
    own = ["SPECGW_URL", "SPECGW_ADMIN_KEY", "SPECGW_TEST_MODELS", "SPECGW_UPDATE_GOLDEN"]
    own += ["SPECGW_LONG_TESTS", "SPECGW_SCHEMATHESIS_CASES", "SPECGW_MODELS_DIR"]
    names = [name for doc in setting_docs() for name in doc.env] + own
    assert set(names) <= known_env(ServeSettings)
    assert unknown_variables(names, ServeSettings) == []
    assert unknown_variables([n.lower() for n in names], ServeSettings) == []


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "SPECGW_OP_TIMEOUT_S",
            "SPECGW_OP_TIMEOUT_S: no longer read (it set flags.op_timeout_s and "
            "state.op_timeout_s); set SPECGW_FLAGS_OP_TIMEOUT_S, SPECGW_STATE_OP_TIMEOUT_S "
            "or both",
        ),
        (
            "SPECGW_MAX_CLASSES",
            "SPECGW_MAX_CLASSES: no longer read (it set state.max_classes, the Redis store's "
            "cap, not the controller's); set SPECGW_CONTROL_MAX_CLASSES (the controller's "
            "cap) or SPECGW_STATE_MAX_CLASSES (the store's)",
        ),
        (
            "SPECGW_FILE_POLL_INTERVAL_S",
            "SPECGW_FILE_POLL_INTERVAL_S: no longer read (it set "
            "flags.file_poll_interval_s); set SPECGW_FLAGS_FILE_POLL_INTERVAL_S",
        ),
    ],
)
def test_a_bare_name_the_sections_once_shared_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, line: str
) -> None:
    monkeypatch.setenv(name, "2")
    assert refusal() == [line]
    assert unknown_variables([name], ServeSettings) == []  # refused, not warned twice


@pytest.mark.usefixtures("refusing")
def test_serve_refuses_a_bare_shared_name_in_one_line() -> None:
    result = serve(SPECGW_BACKOFF_MAX_S="3")
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        "spec-gateway: config: SPECGW_BACKOFF_MAX_S: no longer read (it set "
        "flags.backoff_max_s and state.backoff_max_s); set SPECGW_FLAGS_BACKOFF_MAX_S, "
        "SPECGW_STATE_BACKOFF_MAX_S or both"
    ]


def test_each_section_name_sets_its_own_setting_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGW_FLAGS_OP_TIMEOUT_S", "0.7")
    monkeypatch.setenv("SPECGW_STATE_OP_TIMEOUT_S", "0.9")
    monkeypatch.setenv("SPECGW_CONTROL_MAX_CLASSES", "32")
    settings = resolve()
    assert (settings.flags.op_timeout_s, settings.state.op_timeout_s) == (0.7, 0.9)
    assert (settings.control.max_classes, settings.state.max_classes) == (32, 1024)


def test_no_environment_name_sets_two_settings() -> None:
    names = [name for doc in setting_docs() for name in doc.env]
    assert all(len(doc.env) == 1 for doc in setting_docs())
    shared_json = {"SPECGW_TENANTS"}  # one JSON block for the whole tenants section
    assert len([n for n in names if n not in shared_json]) == len(
        {n for n in names if n not in shared_json}
    )
    assert not set(legacy_env(ServeSettings)) & set(names)
