"""What the engine will run, read before it starts: `spec-gateway plan`.

Two columns. *Here*: the settings' engine arguments resolved by the installed vLLM's
own `VllmConfig` on this machine's platform (no weights are read: configs and
tokenizer only). *CUDA*: the same settings decided for CUDA (`engine_args(...,
device="cuda")`) with vLLM 0.33's CUDA resolutions written out where no GPU is here to
make them: graphs and torch.compile unless eager (`VllmConfig._apply_optimization_level`
-> `FULL_AND_PIECEWISE`), Model Runner V2 (`VllmConfig.use_v2_model_runner`: the
default where Triton runs), async scheduling on (`VllmConfig.__post_init__`: nothing
here is incompatible with it). The CUDA tier builds the same settings into 0.33's real
`VllmConfig` on the CUDA platform's decisions and checks this column against it
(`tests/cuda/test_assembled_startup.py`).

The KV-cache budget is an estimate: GPU memory times `gpu_memory_utilization`, less
the weights (bf16 parameters counted from the configs), vLLM's activation peak and
the CUDA graphs' pool (`ACTIVATION_GIB`, `GRAPH_GIB`, typical of an 8B model at
vLLM's default batch token budget); vLLM measures both at start.

A combination that would lose the feature silently is refused in one line
(`PlanError`): a depth the controller may choose with no FULL graph on CUDA (an
operator's batch-size schedule that leaves it out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from engine.settings import EngineSettings
from engine.vllm.batch_depth import (
    CAPTURE_SCHEDULE_KEY,
    BatchDepthPolicy,
    DepthRule,
    full_batches,
    rule_for,
    vllm_default_sizes,
)
from engine.vllm.engine_args import eager_for, engine_args
from engine.vllm.model_source import hub_token, model_source, read_config
from engine.vllm.parsers import Parsers, resolved_parsers

GIB = 1024**3
#: vLLM's activation peak at its default batch token budget and the CUDA graph pool, for
#: an 8B model (both measured by vLLM at start; these only size the estimate).
ACTIVATION_GIB = 2.0
GRAPH_GIB = 1.5
#: Bytes per parameter and per KV element in bf16 / fp16.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}
#: vLLM's token ceiling on a CUDA graph off Blackwell, where the plan assumes an H100.
CUDA_CAPTURE_CEILING = 512


class PlanError(ValueError):
    """The settings would start an engine that silently loses a feature; one line."""


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The KV cache the settings leave, in tokens, and what it holds at full length."""

    gib: float
    bytes_per_token: int
    tokens: int
    max_model_len: int

    @property
    def full_length_requests(self) -> float:
        return self.tokens / self.max_model_len


@dataclass(frozen=True, slots=True)
class PlatformPlan:
    """One platform's decisions for the settings."""

    platform: str
    eager: bool
    cudagraph_mode: str
    runner: str
    async_scheduling: bool
    policy: BatchDepthPolicy
    #: depth -> the widest batch with a FULL decode graph (empty: no FULL graphs).
    full_batch: dict[int, int]
    step_depths: tuple[int, ...]
    max_num_seqs: int
    max_model_len: int
    kv: KVBudget | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StartupPlan:
    target: str
    drafter: str | None
    max_depth: int
    served_names: list[str]
    parsers: Parsers
    #: The gateway's admission bound; None: each platform's `max_num_seqs`.
    max_running: int | None
    platforms: list[PlatformPlan] = field(default_factory=list)


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def parameter_count(config: Mapping[str, Any]) -> int:
    """Parameters of a Llama-style decoder from its config (embeddings, attention,
    gated MLP, LM head unless tied); norms and biases are below 0.01 %."""
    c = _text_config(config)
    hidden, vocab, layers = int(c["hidden_size"]), int(c["vocab_size"]), c["num_hidden_layers"]
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    inter = int(c["intermediate_size"])
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    per_layer = attention + 3 * hidden * inter
    head = 0 if c.get("tie_word_embeddings") else vocab * hidden
    return vocab * hidden + head + int(layers) * per_layer


def drafter_parameter_count(config: Mapping[str, Any]) -> int:
    """An EAGLE-3 head: one decoder layer whose attention reads [embeddings; hidden]
    (2H in), the fc from three target layers (3H -> H), its own LM head over the draft
    vocabulary; it shares the target's embeddings."""
    c = config.get("transformer_layer_config") or config
    hidden = int(c["hidden_size"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    draft_vocab = int(
        config.get("draft_vocab_size") or c.get("draft_vocab_size") or c["vocab_size"]
    )
    target_hidden = int(config.get("target_hidden_size") or hidden)
    attention = 2 * hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
    mlp = 3 * hidden * int(c["intermediate_size"])
    return attention + mlp + 3 * target_hidden * hidden + draft_vocab * hidden


def kv_bytes_per_token(
    config: Mapping[str, Any], dtype_bytes: int, layers: int | None = None
) -> int:
    c = _text_config(config)
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    return (
        2
        * int(layers if layers is not None else c["num_hidden_layers"])
        * kv_heads
        * head_dim
        * dtype_bytes
    )


def kv_budget(
    settings: EngineSettings,
    target: Mapping[str, Any],
    drafter: Mapping[str, Any] | None,
    gpu_memory_gib: float,
    max_model_len: int,
) -> KVBudget:
    """The CUDA KV cache the settings leave on one GPU of `gpu_memory_gib` (TP shards
    the weights and the KV heads alike, so the per-GPU figures divide by it)."""
    width = DTYPE_BYTES[settings.dtype]
    tp = settings.tensor_parallel_size
    weights = parameter_count(target) * width
    per_token = kv_bytes_per_token(target, width)
    if drafter is not None:
        weights += drafter_parameter_count(drafter) * width
        per_token += kv_bytes_per_token(
            drafter.get("transformer_layer_config") or drafter, width, 1
        )
    free = gpu_memory_gib * settings.gpu_memory_utilization * GIB
    free -= weights / tp + (ACTIVATION_GIB + GRAPH_GIB) * GIB
    per_gpu_token = per_token // tp
    tokens = max(0, int(free // per_gpu_token))
    return KVBudget(max(0.0, free / GIB), per_gpu_token, tokens, max_model_len)


def cuda_plan(
    settings: EngineSettings,
    target: Mapping[str, Any],
    drafter: Mapping[str, Any] | None,
    gpu_memory_gib: float,
) -> PlatformPlan:
    """The CUDA column (see the module docstring)."""
    args = engine_args(settings, device="cuda")
    eager = eager_for(settings, "cuda")
    max_len = settings.max_model_len or int(_text_config(target).get("max_position_embeddings", 0))
    spec = args.speculative_config or {}
    k_max = int(spec.get("num_speculative_tokens", 0)) if spec else 0
    mode = "NONE" if eager else "FULL_AND_PIECEWISE"
    schedule = spec.get("num_speculative_tokens_per_batch_size") or []
    seqs = int(args.max_num_seqs or 0)
    sizes: list[int] = []
    if not eager:
        own = list(args.compilation_config.cudagraph_capture_sizes or [])
        sizes = own or vllm_default_sizes(k_max, seqs, schedule, CUDA_CAPTURE_CEILING)
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k_max) if k_max else None,
        compilation_config=SimpleNamespace(
            cudagraph_mode=SimpleNamespace(name=mode), cudagraph_capture_sizes=sizes
        ),
        model_config=SimpleNamespace(enforce_eager=eager),
        scheduler_config=SimpleNamespace(max_num_seqs=seqs),
        additional_config=args.additional_config or {},
        use_v2_model_runner=True,
    )
    depths = {int(row[2]) for row in schedule}
    rule = rule_for(config, "cuda", depths)
    # V2's decode widths: 1 + K, and 1 + k for each k of a schedule (0 included).
    widths = full_batches(sorted({k_max, *depths}), sizes, seqs) if sizes and k_max else {}
    notes = []
    if CAPTURE_SCHEDULE_KEY in (args.additional_config or {}):
        notes.append("capture schedule: the gateway's (every width 1 + k, no ceiling on k)")
    return PlatformPlan(
        platform="cuda",
        eager=eager,
        cudagraph_mode=mode,
        runner="V2",
        async_scheduling=settings.scheduler != "sync",
        policy=rule.policy,
        full_batch=widths,
        step_depths=_step_depths(rule),
        max_num_seqs=seqs,
        max_model_len=max_len,
        kv=kv_budget(settings, target, drafter, gpu_memory_gib, max_len) if max_len else None,
        notes=tuple(notes),
    )


def _step_depths(rule: DepthRule) -> tuple[int, ...]:
    """The depths a step may run at: 0 and, under the uniform rule, the captured ones."""
    if rule.max_depth == 0:
        return (0,)
    if rule.policy is BatchDepthPolicy.UNIFORM:
        return (0, *rule.captured)
    return tuple(range(rule.max_depth + 1))


def here_plan(settings: EngineSettings) -> PlatformPlan:
    """This machine's column: the installed vLLM resolves the engine arguments."""
    from vllm.platforms import current_platform

    from engine.vllm.engine_args import checked_engine_args

    config = checked_engine_args(settings).create_engine_config()
    device = current_platform.device_type
    spec = config.speculative_config
    lookup_depths: set[int] = set()
    if spec is not None and spec.num_speculative_tokens_per_batch_size:
        lookup_depths = {int(row[2]) for row in spec.num_speculative_tokens_per_batch_size}
    rule = rule_for(config, device, lookup_depths)
    mode = str(getattr(config.compilation_config.cudagraph_mode, "name", "NONE"))
    return PlatformPlan(
        platform=device,
        eager=bool(config.model_config.enforce_eager),
        cudagraph_mode=mode,
        runner="V2" if config.use_v2_model_runner else "V1",
        async_scheduling=bool(config.scheduler_config.async_scheduling),
        policy=rule.policy,
        full_batch=dict(rule.full_batch or {}),
        step_depths=_step_depths(rule),
        max_num_seqs=int(config.scheduler_config.max_num_seqs),
        max_model_len=int(config.model_config.max_model_len),
        kv=None,
        notes=(f"KV cache: {settings.kv_cache_gib} GiB (engine.kv_cache_gib)",)
        if device == "cpu"
        else (),
    )


def check_capture(settings: EngineSettings, plan: PlatformPlan) -> None:
    """Refuse a CUDA plan in which a depth the controller may choose has no FULL graph
    (only an operator's schedule can leave one out; the gateway's holds them all)."""
    if plan.eager or plan.policy is not BatchDepthPolicy.UNIFORM:
        return
    missing = [d for d in range(1, settings.max_depth + 1) if d not in plan.full_batch]
    if settings.spec_tokens_per_batch_size and missing:
        raise PlanError(
            f"engine.spec_tokens_per_batch_size gives depths {missing} no FULL decode graph "
            "on CUDA (Model Runner V2 captures only the schedule's depths), so the "
            "controller's choice of them would run without graphs: add rows for them, "
            "or leave the schedule unset (the gateway then captures every width)"
        )


def startup_plan(
    settings: EngineSettings,
    max_running: int | None,
    environ: Mapping[str, str],
    *,
    gpu_memory_gib: float = 80.0,
    here: bool = True,
) -> StartupPlan:
    """Both columns, the parsers and the names; `PlanError` where CUDA would lose a feature."""
    target_ref, drafter_ref = settings.resolved_models()
    token = hub_token(environ)
    target = read_config(model_source(target_ref, "target"), token)
    drafter = None
    if drafter_ref is not None and settings.max_depth > 0:
        drafter = read_config(model_source(drafter_ref, "drafter"), token)
    cuda = cuda_plan(settings, target, drafter, gpu_memory_gib)
    check_capture(settings, cuda)
    platforms = [cuda]
    if here:
        local = here_plan(settings)
        if local.platform != "cuda":
            platforms.insert(0, local)
        else:
            platforms = [local]
    return StartupPlan(
        target=str(target_ref),
        drafter=None if drafter is None else str(drafter_ref),
        max_depth=settings.effective_depth(),
        served_names=settings.served_names(),
        parsers=resolved_parsers(settings, environ),
        max_running=max_running,
        platforms=platforms,
    )


def render(plan: StartupPlan, gpu_memory_gib: float) -> str:
    """The plan as the text `spec-gateway plan` prints."""
    lines = [
        f"target: {plan.target}",
        f"drafter: {plan.drafter or 'none (no speculation)'}  K = {plan.max_depth}",
        f"served model names: {', '.join(plan.served_names)}",
        f"tool-call parser: {plan.parsers.tool_call or 'none'}  "
        f"reasoning parser: {plan.parsers.reasoning or 'none'}",
    ]
    for p in plan.platforms:
        label = "this machine" if p.platform != "cuda" else f"CUDA (one {gpu_memory_gib:g} GiB GPU)"
        lines += [
            "",
            f"[{label}: {p.platform}]",
            f"  execution: {'eager' if p.eager else 'torch.compile + CUDA graphs'} "
            f"(cudagraph_mode {p.cudagraph_mode}), model runner {p.runner}, "
            f"async scheduling {'on' if p.async_scheduling else 'off'}",
            f"  batch-depth rule: {p.policy.value}; step depths: "
            f"{', '.join(str(d) for d in p.step_depths)}",
            f"  max_num_seqs {p.max_num_seqs}, max_model_len {p.max_model_len}, gateway "
            f"max_running {plan.max_running or p.max_num_seqs}",
        ]
        if p.full_batch:
            widths = ", ".join(
                f"k={d} (width {d + 1}) to batch {b}" for d, b in sorted(p.full_batch.items())
            )
            lines.append(f"  FULL decode graphs: {widths}")
        else:
            lines.append("  FULL decode graphs: none")
        if p.kv is not None:
            kv = p.kv
            lines.append(
                f"  KV cache (estimate): {kv.gib:.1f} GiB, {kv.bytes_per_token // 1024} KiB a "
                f"token, {kv.tokens:,} tokens = {kv.full_length_requests:.1f} requests at "
                f"max_model_len"
            )
        lines += [f"  {note}" for note in p.notes]
    return "\n".join(lines) + "\n"


__all__ = [
    "KVBudget",
    "PlanError",
    "PlatformPlan",
    "StartupPlan",
    "cuda_plan",
    "kv_budget",
    "parameter_count",
    "render",
    "startup_plan",
]
