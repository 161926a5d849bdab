"""What the idle canary costs: CPU seconds per minute of an idle gateway and its engine
core, with the canary at its default period and with it off.

    python -m bench.canary_cost [--seconds 60] [--rounds 1]

For each setting a real gateway (embedded model, drafter) is started, left idle for
`--settle` seconds, then the CPU time (user + system) of the gateway process and of
every descendant (vLLM's EngineCore) is read before and after `--seconds` of idleness
(psutil). The canary (`gateway.engine_watch`) is one `check_health` round trip through
the engine core every `canary_interval_s` while no work is in flight. Prints one JSON
line per run and the difference. A measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil

from bench.gateway_proc import GatewayConfig, model_paths, start_gateway


def cpu_seconds(root: psutil.Process) -> dict[str, float]:
    """User + system CPU seconds of `root` and each descendant, by process name."""
    out: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            name = "gateway" if proc.pid == root.pid else proc.name()
        except psutil.NoSuchProcess:
            continue
        out[name] = out.get(name, 0.0) + times.user + times.system
    return out


def idle_cost(interval_s: float, seconds: float, settle: float, workdir: Path) -> dict[str, object]:
    env = {"SPECGW_CANARY_INTERVAL_S": str(interval_s), "SPECGW_CONTROL_CALIBRATE_BATCHES": "[]"}
    config = GatewayConfig(name=f"canary-{interval_s:g}", env=env)
    gw = start_gateway(config, model_paths(workdir / "tiny"), workdir)
    try:
        time.sleep(settle)
        root = psutil.Process(gw.process.pid)
        before, t0 = cpu_seconds(root), time.monotonic()
        time.sleep(seconds)
        after, t1 = cpu_seconds(root), time.monotonic()
    finally:
        gw.stop()
    per_minute = {k: round((after[k] - before.get(k, 0.0)) * 60 / (t1 - t0), 3) for k in after}
    return {
        "canary_interval_s": interval_s,
        "idle_s": round(t1 - t0, 1),
        "cpu_s_per_min": per_minute,
        "total_cpu_s_per_min": round(sum(per_minute.values()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=2.0, help="canary period when on")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="canary-cost-") as tmp:
        for _ in range(args.rounds):
            on = idle_cost(args.interval, args.seconds, args.settle, Path(tmp))
            off = idle_cost(0.0, args.seconds, args.settle, Path(tmp))
            print(json.dumps(on))
            print(json.dumps(off))
            delta = float(on["total_cpu_s_per_min"]) - float(off["total_cpu_s_per_min"])  # type: ignore[arg-type]
            print(json.dumps({"canary_cpu_s_per_min": round(delta, 3)}))


if __name__ == "__main__":
    main()
