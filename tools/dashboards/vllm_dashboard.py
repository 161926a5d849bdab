"""vLLM's own engine dashboard, generated like the others, on the `vllm:*` series that
vLLM registers on the gateway's `/metrics` (one endpoint, one scrape).

The panels follow vLLM's example Grafana dashboard (its `prometheus_grafana` example):
request and token throughput, TTFT, inter-token and end-to-end latency and queue time
from vLLM's histograms, the scheduler's running and waiting requests, KV cache usage,
prefix cache hits, preemptions; and speculative decoding from the
`vllm:spec_decode_*` counters: acceptance length (1 + accepted / drafts, bonus token
included), draft acceptance rate (accepted / draft tokens) and per-position
acceptance (accepted at position p / drafts), as vLLM's `SpecDecodingLogging` computes
them. Every query carries the dashboard's `namespace`, `job` and `instance`.
"""

from __future__ import annotations

from gateway.observability.promql import RI, S, ratio, total_rate
from tools.dashboards.grafana import Dashboard, Panel, Target

DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{S}{RI})))"


def _latency(title: str, histogram: str, grid: tuple[int, int, int, int], note: str) -> Panel:
    return Panel(
        title,
        "timeseries",
        tuple(
            Target(_quantile(q, histogram), f"p{round(q * 100)}", chr(ord("A") + i))
            for i, q in enumerate((0.5, 0.95, 0.99))
        ),
        grid,
        note,
        unit="s",
        min=0,
    )


def _spec_decode_panels() -> tuple[Panel, ...]:
    per_position = (
        f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{S}{RI}))\n"
        f"  / on () group_left () ({total_rate(DRAFTS)} > 0)"
    )
    return (
        Panel("Speculative decoding: acceptance length", "timeseries", (
            Target("1 + " + ratio(total_rate(ACCEPTED), total_rate(DRAFTS)), "acceptance length"),
        ), (0, 24, 8, 8), "1 + accepted / drafts (one draft per request per verify step): "
            "tokens per target forward pass.", decimals=2, min=1),
        Panel("Speculative decoding: draft acceptance rate", "timeseries", (
            Target(ratio(total_rate(ACCEPTED),
                         total_rate("vllm:spec_decode_num_draft_tokens_total")), "accepted"),
        ), (8, 24, 8, 8), "Accepted draft tokens / proposed draft tokens.",
            unit="percentunit", min=0, max=1),
        Panel("Speculative decoding: acceptance by draft position", "timeseries", (
            Target(per_position, "position {{position}}"),
        ), (16, 24, 8, 8), "Accepted at draft position p / drafts (position 0 is the first "
            "draft token); non-increasing in p.", unit="percentunit", min=0, max=1),
    )  # fmt: skip


def vllm_dashboard() -> Dashboard:
    """The embedded vLLM engine, from its own series."""
    tokens = (
        Target(total_rate("vllm:prompt_tokens_total"), "prompt"),
        Target(total_rate("vllm:generation_tokens_total"), "generation", "B"),
    )
    prefix_hits = ratio(
        total_rate("vllm:prefix_cache_hits_total"), total_rate("vllm:prefix_cache_queries_total")
    )
    return Dashboard(
        uid="specgw-vllm",
        title="spec-gateway / vLLM engine",
        description="vLLM's own metrics of the engines behind the gateway: throughput, "
        "latency, scheduler, KV cache, speculative decoding.",
        panels=(
            Panel("Requests/s by finish reason", "timeseries", (
                Target(f"sum by (finished_reason) (rate(vllm:request_success_total{S}{RI}))",
                       "{{finished_reason}}"),
            ), (0, 0, 8, 8), "Finished requests (the gateway's own, calibration and warm-up "
                "included).", unit="reqps", min=0),
            Panel("Tokens/s", "timeseries", tokens, (8, 0, 8, 8), unit="short", min=0),
            Panel("Requests in the engine", "timeseries", (
                Target(f"sum(vllm:num_requests_running{S})", "running"),
                Target(f"sum(vllm:num_requests_waiting{S})", "waiting", "B"),
            ), (16, 0, 8, 8), "The scheduler's running and waiting requests.", min=0),
            _latency("Time to first token", "vllm:time_to_first_token_seconds",
                     (0, 8, 8, 8), "From vLLM's arrival stamp to the first token."),
            _latency("Inter-token latency", "vllm:inter_token_latency_seconds", (8, 8, 8, 8),
                     "Between consecutive output chunks of a request (several tokens per "
                     "chunk when drafts are accepted)."),
            _latency("End-to-end request latency", "vllm:e2e_request_latency_seconds",
                     (16, 8, 8, 8), "From vLLM's arrival stamp to the last token."),
            _latency("Queue time", "vllm:request_queue_time_seconds", (0, 16, 8, 8),
                     "Time in vLLM's waiting queue before the first schedule."),
            Panel("KV cache usage", "timeseries", (
                Target(f"max by (instance) (vllm:kv_cache_usage_perc{S})", "{{instance}}"),
            ), (8, 16, 8, 8), "Share of KV cache blocks in use (1 = full: preemptions follow).",
                unit="percentunit", min=0, max=1),
            Panel("Prefix cache hit rate and preemptions", "timeseries", (
                Target(prefix_hits, "prefix cache hits / queries"),
                Target(total_rate("vllm:num_preemptions_total"), "preemptions/s", "B"),
            ), (16, 16, 8, 8), "Prompt tokens found in the prefix cache; requests "
                "preempted for KV space.", min=0),
            *_spec_decode_panels(),
        ),
        class_variable=False,
        scope_metric="vllm:num_requests_running",
    )  # fmt: skip
