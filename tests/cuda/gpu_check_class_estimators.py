"""The per-class estimators' device half on a real GPU (plain torch; vLLM need not be there).

What the CUDA tier cannot show without a GPU: on CUDA tensors the per-class steps
(`engine.vllm.class_estimators`: re-prediction, accumulation, refit) never synchronise
with the host (torch's sync debug mode raises on one), give bit-identical coefficients on
a second run (tensor-parallel ranks must fit alike), agree with the CPU run, and cost a few
tens of microseconds a step. Prints one JSON line; exit 1 on a failed check.

    python -m tests.cuda.gpu_check_class_estimators
"""

from __future__ import annotations

import json
import sys
import time

import torch

from engine.vllm.class_estimators import DEFAULT_GROUPS, ClassAcceptanceEstimators

K, ROWS, STEPS = 7, 256, 300


def run(device: str) -> tuple[ClassAcceptanceEstimators, float]:
    """STEPS steps of ROWS requests in DEFAULT_GROUPS classes; the fit and ms per step."""
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for _ in range(STEPS):
        features = (torch.rand(ROWS, K, generator=gen) * 8 - 2).to(device)
        groups = torch.randint(0, DEFAULT_GROUPS, (ROWS,), generator=gen).to(device)
        sampled = torch.randint(1, K + 2, (ROWS,), generator=gen).to(device)
        inputs.append((features, groups, sampled, (K + 1 - sampled).clamp_max(1)))
    fit = ClassAcceptanceEstimators(
        DEFAULT_GROUPS,
        K,
        slope=0.5,
        intercepts=[-0.2] * K,
        refit_interval=100,
        damping=50.0,
        l2=1e-3,
        device=device,
    )
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    start = time.perf_counter()
    for features, groups, sampled, rejected in inputs:
        predictions = fit.predict(features, groups)
        fit.accumulate(features, predictions, groups, sampled, rejected)
        fit.end_step()
    if device == "cuda":
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    return fit, (time.perf_counter() - start) * 1e3 / STEPS


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 1
    first, ms = run("cuda")
    second, _ = run("cuda")
    cpu, cpu_ms = run("cpu")
    identical = torch.equal(first.slope, second.slope) and torch.equal(
        first.intercepts, second.intercepts
    )
    gap = max(
        float((first.slope.cpu() - cpu.slope).abs().max()),
        float((first.intercepts.cpu() - cpu.intercepts).abs().max()),
    )
    checks = {
        "no_host_sync": True,
        "bit_identical_rerun": identical,
        "cpu_gap_below_1e-4": gap < 1e-4,
    }
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "refits": first.refits,
                "ms_per_step_cuda": round(ms, 4),
                "ms_per_step_cpu": round(cpu_ms, 4),
                "cpu_gap": gap,
                **checks,
            }
        )
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
