"""The real `spec-gateway` command: a misspelt key stops `serve` with one line naming it,
before anything starts (with and without `--check-config`); `--check-config` prints the
resolved settings; `--version` names the package and the installed vLLM.

Processes of the installed console script; none serves (tests/tier_guard.py allows
`--check-config`, and a `serve` that must refuse runs in `settings_refusal()`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from engine.vllm.compat import installed_vllm_version
from tests.tier_guard import settings_refusal

SPEC_GATEWAY = str(Path(sys.executable).parent / "spec-gateway")
#: Far below the vLLM import alone (tens of seconds): a `serve` that went on would miss it.
TIMEOUT_S = 60


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPECGW_")}
    return subprocess.run(
        args, capture_output=True, text=True, timeout=TIMEOUT_S, env={**clean, **env}
    )


@pytest.fixture
def misspelt(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text("max_running: 4\nengine:\n  max_depht: 2\n", encoding="utf-8")
    return path


NAMED = "spec-gateway: config: engine.max_depht: unknown setting (did you mean max_depth?)"


def test_check_config_refuses_a_misspelt_key_in_one_line(misspelt: Path) -> None:
    done = run(SPEC_GATEWAY, "serve", "--config", str(misspelt), "--check-config")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [NAMED]
    assert done.stdout == ""


def test_serve_refuses_a_misspelt_key_before_it_starts_anything(misspelt: Path) -> None:
    with settings_refusal():
        done = run(SPEC_GATEWAY, "serve", "--config", str(misspelt))
        traced = run(sys.executable, "-X", "importtime", "-m", "gateway.cli", "serve",
                     "--config", str(misspelt))  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [NAMED]
    assert traced.returncode == 2
    assert NAMED in traced.stderr.splitlines()
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in traced.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "gateway.config" in imported
    assert not {m for m in imported if m.split(".")[0] in ("vllm", "torch", "uvicorn")}
    assert "gateway.app" not in imported  # no app, no engine: the settings came first


def test_a_misspelt_flag_or_environment_value_is_named_too() -> None:
    with settings_refusal():
        flag = run(SPEC_GATEWAY, "serve", "--max-runing", "4")
        env = run(SPEC_GATEWAY, "serve", SPECGW_CONTROL_HYSTERESIS="2")
    assert flag.returncode == 2
    assert flag.stderr.splitlines() == [
        "spec-gateway: config: --max-runing: unknown setting (did you mean --max-running?)"
    ]
    assert env.returncode == 2
    assert env.stderr.splitlines() == [
        "spec-gateway: config: control.hysteresis: Input should be less than or equal to 1 "
        "(got '2')"
    ]


def test_check_config_prints_the_resolved_settings(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("max_running: 4\ncontrol:\n  hysteresis: 0.2\n", encoding="utf-8")
    done = run(
        SPEC_GATEWAY, "serve", "--config", str(config), "--check-config",
        "--max-depth", "2", "--control.min-dwell", "9",
        SPECGW_REDIS_PASSWORD="do-not-print", SPECGW_MAX_QUEUED="7",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "do-not-print" not in done.stdout
    resolved = yaml.safe_load(done.stdout)
    assert (resolved["max_running"], resolved["max_queued"]) == (4, 7)
    assert resolved["control"]["hysteresis"] == 0.2
    assert resolved["control"]["min_dwell"] == 9
    assert resolved["engine"]["max_depth"] == 2
    assert resolved["redis_password"] == "<redacted>"
    assert done.stdout.startswith(f"# resolved with {config}:")


def test_version_names_the_package_and_vllm() -> None:
    done = run(SPEC_GATEWAY, "--version")
    assert done.returncode == 0, done.stderr
    expected = f"spec-gateway {metadata.version('spec-gateway')}, vLLM {installed_vllm_version()}"
    assert done.stdout.strip() == expected
