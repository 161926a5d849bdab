"""Typed settings of the embedded engine, read once at start (env `SPECGW_ENGINE_*`).

The `engine:` section of the gateway's settings (`gateway.config`), which resolves it
from flags, the environment and the YAML file; an unknown key is an error.

Nothing here touches the process environment at import: `kv_cache_gib` becomes
`VLLM_CPU_KVCACHE_SPACE` only inside `VLLMEngine.started`, just before vLLM reads it.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from engine.backend import PLUGINS

#: `max_num_seqs` where the settings leave it unset, by vLLM build: the embedded model's
#: on the CPU; on a GPU vLLM's own default for most cards (`EngineArgs`, 256), which an 8B
#: model's KV cache at a few thousand tokens a request fills on one H100.
DEFAULT_MAX_NUM_SEQS = {"cpu": 32, "cuda": 256}


def vllm_build() -> Literal["cpu", "cuda"]:
    """Which vLLM build is installed, from the distributions' metadata (no import):
    `cuda` where upstream `vllm` is, else `cpu` (the `vllm-cpu` rebuild, or no vLLM at
    all, as under the fake backend)."""
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "cpu"
    return "cuda"


#: The name the embedded model is served under (a model named by the operator is served
#: under its own id, as `vllm serve` does).
EMBEDDED_SERVED_NAME = "specgw-default"


class EngineSettings(BaseSettings):
    """Target, drafter, maximum speculation depth K and the vLLM knobs that matter here."""

    model_config = SettingsConfigDict(env_prefix="SPECGW_ENGINE_", extra="forbid")
    #: The served names, set from the gateway's `served_model_name` and aliases
    #: (`ServeSettings`), so that vLLM's metric label and the answers say one name.
    _served: tuple[str, ...] = PrivateAttr(default=())

    backend: str = Field(
        "vllm",
        description=f"Engine backend, by name, one of `engine.backend.PLUGINS` "
        f"({', '.join(PLUGINS)}): `vllm`, the embedded vLLM engine; `fake`, a scripted "
        "engine with no model (the in-process test tier, trials of the gateway).",
        json_schema_extra={"enum": list(PLUGINS)},
    )
    model: Path | None = Field(
        None, description="Target model directory (None = the embedded default model)."
    )
    drafter: Path | None = Field(
        None,
        description="EAGLE 3.1 drafter directory. None with `model` unset = the embedded "
        "default drafter; None with `model` set = no speculation (K = 0).",
    )
    max_depth: int = Field(
        4, ge=0, le=16, description="K: num_speculative_tokens; every request gets k in 0..K."
    )
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        "bfloat16", description="Weights and activations dtype."
    )
    kv_cache_gib: int = Field(
        2, ge=1, le=4096, description="KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE on CPU)."
    )
    max_model_len: int | None = Field(
        None,
        ge=64,
        le=1_048_576,
        description="Longest prompt + completion (tokens); null = the model's own "
        "(`max_position_embeddings`, as vLLM derives it).",
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Most sequences in one engine step; null = 32 on the CPU, vLLM's "
        "platform default on a GPU (256 to 1024 by GPU memory). The gateway's `max_running` "
        "follows it unless set.",
    )
    block_size: int | None = Field(
        None,
        ge=16,
        le=1024,
        description="Tokens per KV-cache block, the prefix cache's unit. Unset: vLLM's platform "
        "default, but 32 on the CPU, where vLLM's 128 makes every prefix-cache hit of a "
        "speculating request recompute up to 255 tokens (vLLM drops the last matched block "
        "on an EAGLE engine).",
    )
    enforce_eager: bool | None = Field(
        None,
        description="Skip torch.compile and CUDA graphs. null = by platform: graphs on CUDA "
        "(the uniform-depth design and Model Runner V2's drafter skip need them), eager on "
        "the CPU (fast start).",
    )
    per_request_metrics: Literal["summary", "detailed"] = Field(
        "detailed",
        description="vLLM per-request spec-decode metrics; `detailed` adds per-step lists, "
        "needed for accepted/drafted counts per draft position.",
    )
    seed: int = Field(0, ge=0, description="Engine seed (sampling reproducibility).")
    warmup_prompts: int = Field(
        2, ge=0, le=64, description="Requests run at start, before the engine reports ready."
    )
    stall_bound_s: float = Field(
        8.0,
        gt=0,
        le=3600,
        description="Work admitted but no output for this long = stalled (not ready).",
    )
    tool_call_parser: str | None = Field(
        "auto",
        description="vLLM tool-call parser for `tool_choice=auto` (`hermes`, `llama3_json`, "
        "`mistral`, ...). `auto`: chosen from the model's chat template and `model_type` "
        "(`engine.vllm.parsers`); a template with tools but no known call format is refused "
        "at start with a request to set this. null = no automatic tool choice.",
    )
    reasoning_parser: str | None = Field(
        "auto",
        description="vLLM reasoning parser (`qwen3`, `deepseek_r1`, ...): `auto` = chosen from "
        "the model's family and template where it thinks (`<think>`), else none; null = none.",
    )
    skip_drafter_at_k0: bool = Field(
        True,
        description="Skip the drafter's forward pass in steps where every request has k = 0 "
        "(k = 0 then costs what no speculation costs).",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs per replica for tensor parallelism (vLLM TP)."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory vLLM may use (GPU only)."
    )
    prefill_step_depth: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Most drafts in a step where a request prefills beside decoding ones: "
        "a newcomer's first token waits for the step's draft passes, so a cap shortens "
        "its TTFT at the cost of the decoders' next verify (`DepthRule.prefill_step_depth`"
        "); null = the step's depth.",
    )
    extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vLLM engine arguments as JSON (e.g. "
        '`{"enable_prefix_caching": true}`); they override the ones derived above.',
    )
    spec_tokens_per_batch_size: list[tuple[int, int, int]] | None = Field(
        None,
        description="vLLM's batch-size schedule (`num_speculative_tokens_per_batch_size`): "
        "`[[lo, hi, k], ...]`, batch sizes inclusive, k <= max_depth. The engine then drafts "
        "the schedule's k for the batch, and each request's own k still caps it.",
    )
    sampled_speculation: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Speculate for sampled (temperature > 0) requests: `off` runs them at "
        "k = 0; `auto` is on where the workers' rejection sampler was checked exact at start "
        "(`engine.vllm.expand_fix`: vllm-cpu 0.32's is mended there; `python -m "
        "bench.sampled_fidelity` measures it), off where it could not be. Greedy requests "
        "are never affected.",
    )
    verify_budget: Literal["off", "on", "vllm-av"] = Field(
        "off",
        description="Verify only the drafts the step's budget admits, from the drafter's "
        "confidence in each (vLLM 0.33's adaptive verification rule, `engine.verify_budget`), "
        "each request's class bound k its cap: `on` one acceptance estimator per class, "
        "`vllm-av` one pooled over every request (vLLM as shipped). CPU: the scheduler trims "
        "the drafts (`engine.vllm.confidence_budget`); CUDA: vLLM's own adaptive verification "
        "(`enable_adaptive_verification`). Outputs never change.",
    )
    scheduler: Literal["auto", "sync", "async"] = Field(
        "auto",
        description="Scheduler flavour: `auto` lets vLLM choose (CPU forces sync, CUDA "
        "defaults to async) and the depth cap follows; `sync` / `async` force one.",
    )

    @field_validator("backend")
    @classmethod
    def _registered(cls, backend: str) -> str:
        if backend not in PLUGINS:
            raise ValueError(f"backend must be one of {', '.join(sorted(PLUGINS))}")
        return backend

    @model_validator(mode="after")
    def _schedule_fits(self) -> EngineSettings:
        for lo, hi, k in self.spec_tokens_per_batch_size or []:
            if not 1 <= lo <= hi or not 0 <= k <= self.max_depth:
                raise ValueError(
                    f"spec_tokens_per_batch_size row {[lo, hi, k]}: need 1 <= lo <= hi "
                    f"and 0 <= k <= max_depth ({self.max_depth})"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, file_secret_settings)

    def resolved_models(self) -> tuple[Path, Path | None]:
        """(target, drafter or None), with the embedded default model filled in."""
        if self.model is not None:
            return self.model, self.drafter
        from engine.model_paths import default_model

        paths = default_model()
        return paths.target, self.drafter if self.drafter is not None else paths.eagle31

    def default_served_name(self) -> str:
        """The model id as given (`--model`), as `vllm serve` names it; the embedded
        model's own name without one, or where `--model` names its directory."""
        if self.model is None:
            return EMBEDDED_SERVED_NAME
        from engine.model_paths import default_model_paths

        embedded = default_model_paths().target.resolve()
        return EMBEDDED_SERVED_NAME if self.model.resolve() == embedded else str(self.model)

    def served_names(self) -> list[str]:
        """The names vLLM serves the model under: the reported one first, then aliases."""
        return list(self._served) or [self.default_served_name()]

    def with_served_names(self, names: list[str]) -> EngineSettings:
        """A copy serving under `names` (the gateway's resolved name and aliases)."""
        copy = self.model_copy()
        copy._served = tuple(names)
        return copy

    def resolved_max_num_seqs(self, device: str | None = None) -> int:
        """`max_num_seqs`, or the default of `device` (`cuda`, `cpu`; None: the installed
        vLLM build's; `DEFAULT_MAX_NUM_SEQS`)."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return DEFAULT_MAX_NUM_SEQS["cuda" if (device or vllm_build()) == "cuda" else "cpu"]

    def effective_depth(self) -> int:
        """K actually configured: 0 without a drafter."""
        return self.max_depth if self.resolved_models()[1] is not None else 0
