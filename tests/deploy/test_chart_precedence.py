"""One place per knob: `gateway.config` refuses what the Deployment sets, and secrets.

The Deployment passes `--host`, `--port` and `--config`, and sets `SPECGW_*` variables from
the chart's own values; pydantic-settings lets the environment win over the config file, so
the same key in `gateway.config` would be ignored without a word. The values schema refuses
each such key (and every secret, which belongs in a Secret, not in the config ConfigMap).
The keys are found here from a rendered Deployment with every optional variable set, so a
variable added to the Deployment without a refusal fails this test.
"""

from __future__ import annotations

import json
from typing import Any

import helm_python
import jsonschema
import pytest

from gateway.config import chart_schema
from gateway.config.environment import ENV_PREFIX, section_env
from gateway.config.model import ServeSettings
from tests.deploy.chart import CHART_DIR, env_of, gateway_container, render

#: Values under which the Deployment sets every variable it can set.
EVERY_VARIABLE: dict[str, Any] = {
    "engine": {
        "model": "org/target",
        "drafter": "org/drafter",
        "maxModelLen": 4096,
        "maxNumSeqs": 8,
        "enforceEager": False,
        "extraArgs": {"enable_prefix_caching": True},
    },
    "externalRedis": {
        "url": "rediss://redis:6380/0",
        "username": "specgw",
        "passwordSecret": "redis-password",
        "tls": {"existingSecret": "redis-tls", "clientCertificate": True},
    },
    "otel": {"endpoint": "http://collector:4318/v1/traces"},
}
#: Flags the Deployment passes -> the setting each sets (`--config` names the file itself).
ARGS = {"--host": "host", "--port": "port"}
#: Keys set only on the GPU variant's pods.
GPU_ONLY = {"engine.gpu_memory_utilization"}


def _set_keys() -> set[str]:
    """Dotted settings the Deployment sets, from its args and `SPECGW_*` variables."""
    sections = section_env(ServeSettings)
    top = {f"{ENV_PREFIX}{key}".upper(): key for key in ServeSettings.model_fields}
    keys: set[str] = set()
    for values in (EVERY_VARIABLE, {**EVERY_VARIABLE, "gpu": {"enabled": True}}):
        container = gateway_container(render(values))
        keys.update(ARGS[a] for a in container["args"] if a in ARGS)
        for name in env_of(container):
            if name.startswith(ENV_PREFIX):
                found = sections.get(name) or top.get(name)
                assert found, f"{name}: the Deployment sets a variable no setting reads"
                keys.add(found)
    return keys


SET_KEYS = sorted(_set_keys())
SECRETS = ["api_keys", "admin_keys", "redis_password", "redis_url"]


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    node: Any = value
    for part in reversed(dotted.split(".")):
        node = {part: node}
    assert isinstance(node, dict)
    return node


def _example(dotted: str) -> Any:
    """A value the gateway's own schema accepts for the key, so only the chart refuses it."""
    examples = {
        "api_keys": ["a" * 64],
        "admin_keys": ["b" * 64],
        "redis_password": "hunter2",
        "redis_url": "redis://:hunter2@redis:6379/0",
        "port": 8080,
        "host": "0.0.0.0",
        "log_level": "debug",
        "engine.max_depth": 2,
        "engine.tensor_parallel_size": 2,
        "engine.max_model_len": 2048,
        "engine.max_num_seqs": 4,
        "engine.enforce_eager": True,
        "engine.gpu_memory_utilization": 0.8,
        "engine.kv_cache_gib": 4,
        "engine.extra_args": {"enable_prefix_caching": True},
        "redis_tls_check_hostname": False,
    }
    return examples.get(dotted, "/some/path" if dotted.endswith(("_file", "_dir")) else "x")


def test_the_deployment_sets_the_keys_this_test_expects() -> None:
    """The derivation is not empty: the engine, Redis and bind keys are all found."""
    assert {"port", "host", "engine.max_depth", "engine.model", "redis_url"} <= set(SET_KEYS)
    assert set(SET_KEYS) >= GPU_ONLY


@pytest.mark.parametrize("dotted", SET_KEYS + [s for s in SECRETS if s not in SET_KEYS])
def test_gateway_config_refuses_a_key_the_deployment_sets_or_a_secret(dotted: str) -> None:
    config = _nested(dotted, _example(dotted))
    # The gateway itself would take it: without the chart's refusal it would pass.
    jsonschema.Draft7Validator(chart_schema()).validate(config)
    with (
        helm_python.Chart.load(CHART_DIR) as chart,
        pytest.raises(helm_python.HelmValuesError) as exc,
    ):
        chart.validate_schema({"gateway": {"config": config}})
    assert f"/gateway/config/{dotted.replace('.', '/')}" in str(exc.value)


def test_every_refusal_says_which_value_to_set() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text(encoding="utf-8"))
    [overlay] = schema["properties"]["gateway"]["allOf"]
    refused = overlay["properties"]["config"]["properties"]
    for dotted in SET_KEYS + SECRETS:
        node = refused
        *sections, key = dotted.split(".")
        for section in sections:
            node = node[section]["properties"]
        assert node[key]["description"].startswith("Set "), dotted


@pytest.mark.parametrize(
    "config",
    [
        {"served_model_name": "meta-llama/Llama-3.1-8B-Instruct"},
        {"max_running": 8, "engine": {"spec_tokens_per_batch_size": [[1, 4, 3]]}},
        {"tenants": {"keys": {"team-a": "c" * 64}}},
    ],
)
def test_keys_only_the_config_sets_still_pass(config: dict[str, Any]) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema({"gateway": {"config": config}})


def test_a_hugging_face_token_has_no_place_in_gateway_config() -> None:
    with (
        helm_python.Chart.load(CHART_DIR) as chart,
        pytest.raises(helm_python.HelmValuesError) as exc,
    ):
        chart.validate_schema({"gateway": {"config": {"hf_token": "hf_abc"}}})
    assert "hf_token" in str(exc.value)


@pytest.mark.parametrize("name", ["HF_TOKEN", "SPECGW_REDIS_PASSWORD", "SPECGW_API_KEYS"])
def test_a_secret_in_extra_env_must_come_from_a_secret(name: str) -> None:
    plain = {"gateway": {"extraEnv": [{"name": name, "value": "hunter2"}]}}
    ref = {"secretKeyRef": {"name": "s", "key": "k"}}
    from_secret = {"gateway": {"extraEnv": [{"name": name, "valueFrom": ref}]}}
    with helm_python.Chart.load(CHART_DIR) as chart:
        with pytest.raises(helm_python.HelmValuesError) as exc:
            chart.validate_schema(plain)
        assert "/gateway/extraEnv/0" in str(exc.value)
        chart.validate_schema(from_secret)
        chart.validate_schema({"gateway": {"extraEnv": [{"name": "LOG_FORMAT", "value": "x"}]}})
