"""The chart on a GPU: Llama-3.1-8B-Instruct with an EAGLE-3 head on one H100.

The engine's own defaults decide by platform (graphs on CUDA, eager on the CPU; the model's
own context length; vLLM's platform `max_num_seqs`), so the chart sets none of them unless
the operator does; the `cuda` variant's pod is sized for an 8B model (memory, cache volume,
shared memory), the CPU variant's stays as it was.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from gateway.config import resolve
from gateway.config.model import ServeSettings
from tests.deploy.chart import (
    CHART_DIR,
    PRODUCTION_VALUES,
    RELEASE,
    Rendered,
    env_of,
    gateway_container,
    load_values,
    render,
)

FULLNAME = f"{RELEASE}-spec-gateway"
#: A cuda install that names a Hugging Face id, as the README's quick start does.
CUDA_HF = {
    "image": {"variant": "cuda"},
    "gpu": {"enabled": True},
    "engine": {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "drafter": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    },
}
#: Settings whose null default is the engine's decision by platform or model: an env var
#: the chart sets would win over it (and over `gateway.config`) everywhere.
PLATFORM_DEFAULTED = (
    "SPECGW_ENGINE_ENFORCE_EAGER",
    "SPECGW_ENGINE_MAX_MODEL_LEN",
    "SPECGW_ENGINE_MAX_NUM_SEQS",
    "SPECGW_SERVED_MODEL_NAME",
    "SPECGW_MAX_RUNNING",
)
_QUANTITY = re.compile(r"^([0-9.]+)([KMGTPE]i?)?$")
_FACTOR = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_FACTOR |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _bytes(quantity: str | int) -> float:
    match = _QUANTITY.match(str(quantity))
    assert match, quantity
    return float(match.group(1)) * _FACTOR[match.group(2)]


def _pod(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    return spec


def _volumes(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _pod(rendered)["volumes"]}


@pytest.mark.parametrize(
    "values",
    [None, CUDA_HF, load_values(PRODUCTION_VALUES)],
    ids=["default", "cuda", "production"],
)
def test_the_chart_leaves_platform_defaults_to_the_engine(values: dict[str, Any] | None) -> None:
    env = env_of(gateway_container(render(values)))
    assert sorted(set(PLATFORM_DEFAULTED) & set(env)) == []


def test_engine_values_the_operator_sets_reach_the_engine() -> None:
    """`false` included: a `with` or `if` on the value would drop it."""
    engine = {"enforceEager": False, "maxModelLen": 8192, "maxNumSeqs": 128}
    env = env_of(gateway_container(render({"engine": engine})))
    assert env["SPECGW_ENGINE_ENFORCE_EAGER"]["value"] == "false"
    assert env["SPECGW_ENGINE_MAX_MODEL_LEN"]["value"] == "8192"
    assert env["SPECGW_ENGINE_MAX_NUM_SEQS"]["value"] == "128"
    env = env_of(gateway_container(render({"engine": {"enforceEager": True}})))
    assert env["SPECGW_ENGINE_ENFORCE_EAGER"]["value"] == "true"


def _pod_settings(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> ServeSettings:
    """`ServeSettings` as the pod resolves them: the container's plain SPECGW_* env (a digest
    for the Secret-held keys) over the chart's config.yaml."""
    for name in [n for n in os.environ if n.startswith("SPECGW_")]:
        monkeypatch.delenv(name)
    for name, var in env_of(gateway_container(rendered)).items():
        if name.startswith("SPECGW_") and "value" in var:
            monkeypatch.setenv(name, var["value"])
    monkeypatch.setenv("SPECGW_API_KEYS", "a" * 64)
    text = rendered.one("ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return resolve(["--host", "0.0.0.0"], config_file=path)


def test_production_pod_resolves_graphs_and_the_models_own_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = load_values(PRODUCTION_VALUES)
    settings = _pod_settings(render(values), tmp_path, monkeypatch)
    assert settings.engine.enforce_eager is None  # graphs on CUDA
    assert settings.engine.max_model_len is None  # the model's own
    assert settings.engine.max_num_seqs is None  # vLLM's platform default
    assert settings.engine.tensor_parallel_size == 1
    assert settings.served_model_name == values["gateway"]["config"]["served_model_name"]


def test_engine_values_reach_the_pod_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine.* is the one place for these (gateway.config refuses them:
    test_chart_precedence.py)."""
    engine = {"maxModelLen": 4096, "maxNumSeqs": 64, "enforceEager": False}
    settings = _pod_settings(render({"engine": engine}), tmp_path, monkeypatch)
    assert settings.engine.max_model_len == 4096
    assert settings.engine.max_num_seqs == 64
    assert settings.engine.enforce_eager is False


def test_production_values_run_an_8b_model_on_one_gpu() -> None:
    values = load_values(PRODUCTION_VALUES)
    assert values["engine"]["tensorParallelSize"] == 1
    container = gateway_container(render(values))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # max_num_seqs through extraArgs would bypass the gateway's max_running, which follows
    # engine.max_num_seqs.
    assert "max_num_seqs" not in values["engine"].get("extraArgs", {})
    # Clients name the model by its Hugging Face id, not the directory it is mounted at.
    assert values["gateway"]["config"]["served_model_name"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_cuda_variant_pod_is_sized_for_an_8b_model() -> None:
    """~16 GB of bf16 weights plus the drafter in the cache (a Hugging Face id downloads
    there) next to the Inductor, Triton and vLLM caches; two Python processes with torch
    and vLLM plus the page cache of mmap'd safetensors in memory."""
    rendered = render(CUDA_HF)
    resources = gateway_container(rendered)["resources"]
    assert _bytes(resources["limits"]["memory"]) >= 48 * 2**30
    assert _bytes(resources["requests"]["memory"]) >= 32 * 2**30
    assert _bytes(resources["requests"]["memory"]) <= _bytes(resources["limits"]["memory"])
    assert resources["limits"]["nvidia.com/gpu"] == 1
    volumes = _volumes(rendered)
    assert _bytes(volumes["cache"]["emptyDir"]["sizeLimit"]) >= 80 * 2**30
    assert _bytes(volumes["dshm"]["emptyDir"]["sizeLimit"]) >= 8 * 2**30


def test_cpu_variant_keeps_its_sizes() -> None:
    rendered = render()
    assert gateway_container(rendered)["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"memory": "16Gi"},
    }
    volumes = _volumes(rendered)
    assert volumes["cache"]["emptyDir"]["sizeLimit"] == "20Gi"
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}


def test_operator_sizes_win_key_by_key_over_the_variant_defaults() -> None:
    values = {
        **CUDA_HF,
        "resources": {"limits": {"memory": "100Gi"}},
        "shm": {"sizeLimit": "4Gi"},
        "scratch": {"cacheSizeLimit": "200Gi"},
    }
    rendered = render(values)
    resources = gateway_container(rendered)["resources"]
    cuda_default = gateway_container(render(CUDA_HF))["resources"]
    assert resources["limits"]["memory"] == "100Gi"
    assert resources["requests"] == cuda_default["requests"]
    assert _bytes(resources["requests"]["memory"]) >= 32 * 2**30
    volumes = _volumes(rendered)
    assert volumes["cache"]["emptyDir"]["sizeLimit"] == "200Gi"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "4Gi"


def test_the_cache_can_live_on_a_claim() -> None:
    """Weights and compiled graphs then survive a restart instead of downloading again."""
    rendered = render({**CUDA_HF, "scratch": {"cacheExistingClaim": "specgw-cache"}})
    assert _volumes(rendered)["cache"] == {
        "name": "cache",
        "persistentVolumeClaim": {"claimName": "specgw-cache"},
    }


def test_a_hugging_face_token_comes_from_a_secret() -> None:
    values = {**CUDA_HF, "models": {"huggingFaceToken": {"existingSecret": "hf"}}}
    env = env_of(gateway_container(render(values)))
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    assert "HF_TOKEN" not in env_of(gateway_container(render(CUDA_HF)))


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("max_num_seqs", "maxNumSeqs"),
        ("max_model_len", "maxModelLen"),
        ("enforce_eager", "enforceEager"),
        ("tensor_parallel_size", "tensorParallelSize"),
        ("gpu_memory_utilization", "gpuMemoryUtilization"),
        ("served_model_name", "served_model_name"),
    ],
)
def test_extra_args_may_not_shadow_a_chart_value(argument: str, value: str) -> None:
    """extraArgs override the engine's arguments after the settings: the gateway's own copy
    (max_running from max_num_seqs, the GPU count from TP, the served name) would disagree."""
    with pytest.raises(helm_python.HelmError) as exc:
        render({"engine": {"extraArgs": {argument: 1}}})
    assert value in str(exc.value)


@pytest.mark.parametrize(
    "bad",
    [
        {"engine": {"maxModelLen": 32}},
        {"engine": {"maxNumSeqs": 0}},
        {"engine": {"enforceEager": "no"}},
        {"scratch": {"cacheSizeLimit": "lots"}},
    ],
)
def test_schema_bounds_the_engine_and_sizing_values(bad: dict[str, Any]) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(
            {"engine": {"maxModelLen": 131072, "maxNumSeqs": 4096, "enforceEager": False}}
        )
        with pytest.raises(helm_python.HelmValuesError):
            chart.validate_schema(bad)


def test_values_yaml_defaults_are_null_for_platform_defaulted_settings() -> None:
    engine = yaml.safe_load((CHART_DIR / "values.yaml").read_text(encoding="utf-8"))["engine"]
    assert engine["enforceEager"] is None
    assert engine["maxModelLen"] is None
    assert engine["maxNumSeqs"] is None


def test_notes_name_the_driver_floor_on_the_cuda_variant() -> None:
    notes = render(CUDA_HF).templates["spec-gateway/templates/NOTES.txt"]
    assert "NVIDIA driver 580 or newer" in " ".join(notes.split())
    assert "NVIDIA driver" not in render().templates["spec-gateway/templates/NOTES.txt"]
