"""bench/gpu/gpu_profile.py on the CPU: its --tiny run, its deadline, and its attention.

The GPU run is the lead's; here the script must run end to end, write the profile's shape, stop
cleanly at its deadline, and compute the same attention as repeating K/V for every query head.
No timing is asserted: CPU timings on shared cores say nothing about the GPU's.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu" / "gpu_profile.py"
TINY_BATCHES = ("1", "2")
TINY_KS = ("0", "1", "2", "3")


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script run as the lead runs it, in its own process."""
    out = tmp_path_factory.mktemp("gpu-profile") / "profile.json"
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stderr
    document: dict[str, Any] = json.loads(out.read_text())
    return document


@pytest.fixture(scope="module")
def script() -> ModuleType:
    """The script as a module (run as a script, by its path)."""
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_profile"] = module
    spec.loader.exec_module(module)
    return module


def test_tiny_profile_has_every_batch_and_depth(profile: dict[str, Any]) -> None:
    assert profile["complete"] is True
    assert profile["graphs"] is False
    assert profile["max_k"] == 3
    assert "on cpu" in profile["source"]
    assert "CUDA graphs no" in profile["source"]
    assert set(profile["batch_stats"]) == set(TINY_BATCHES) == set(profile["no_spec_step_ms"])
    assert set(profile["spread"]) == set(TINY_BATCHES)
    for batch in TINY_BATCHES:
        assert tuple(profile["batch_stats"][batch]) == TINY_KS
        assert all(ms > 0 for ms in profile["batch_stats"][batch].values())
        assert profile["no_spec_step_ms"][batch] > 0
        for k in TINY_KS:
            p10, p90 = profile["spread"][batch][k]
            assert 0 < p10 <= p90


def test_tiny_profile_has_prefill_and_first_token_costs(profile: dict[str, Any]) -> None:
    assert set(profile["prefill_ms"]) == {"64", "256"}
    for parts in profile["prefill_ms"].values():
        assert parts["target"] > 0
        assert parts["drafter"] > 0
    per_token = profile["prefill_ms_per_token"]
    assert per_token["target"] == pytest.approx(profile["prefill_ms"]["256"]["target"] / 256, 1e-2)
    assert tuple(profile["first_token_extra_ms"]) == TINY_KS
    assert profile["first_token_extra_ms"]["0"] == 0.0
    assert all(profile["first_token_extra_ms"][k] > 0 for k in TINY_KS[1:])
    assert profile["shape"]["hidden"] == 64
    assert profile["shape"]["context"] == 32


def test_deadline_writes_what_was_measured(script: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "cut.json"
    assert script.main(["--tiny", "--out", str(out), "--deadline-s", "0"]) == 0
    document = json.loads(out.read_text())
    assert document["complete"] is False
    assert document["batch_stats"] == {}
    assert document["no_spec_step_ms"] == {}
    assert set(document["prefill_ms"]) == {"64", "256"}


@pytest.mark.parametrize("new_tokens", [1, 4])
def test_folded_attention_equals_repeated_kv(script: ModuleType, new_tokens: int) -> None:
    """Folding the query heads of each KV head into the query length is exact GQA attention
    with a causal mask aligned to the end of the cache."""
    torch.manual_seed(1)
    batch, heads, kv_heads, dim, context = 2, 8, 2, 16, 10
    q = torch.randn(batch, new_tokens, heads, dim)
    k, v = (torch.randn(batch, new_tokens, kv_heads, dim) for _ in "kv")
    cache = tuple(torch.randn(batch + 1, kv_heads, context + 8, dim) for _ in "kv")
    old = tuple(c[:batch, :, :context].clone() for c in cache)
    mask = script.fold_mask(heads // kv_heads, new_tokens, context, q.device, q.dtype)
    got = script.attend_cached(q, k, v, cache, context, mask)

    keys = torch.cat((old[0], k.transpose(1, 2)), dim=2).repeat_interleave(4, dim=1)
    values = torch.cat((old[1], v.transpose(1, 2)), dim=2).repeat_interleave(4, dim=1)
    visible = torch.ones(new_tokens, context + new_tokens, dtype=torch.bool).tril(context)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=visible)
    assert got.shape == (batch, new_tokens, heads * dim)
    torch.testing.assert_close(got, want.transpose(1, 2).reshape(batch, new_tokens, -1))


def test_tiny_moe_profile_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "moe.json"
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--moe", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["complete"] is True
    assert "MoE" in document["source"]
    assert document["shape"]["experts"] == 8
    assert set(document["batch_stats"]) == set(TINY_BATCHES)
    assert document["moe_check"]["max_abs_error"] <= 1e-4 * document["moe_check"]["max_abs_output"]


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_grouped_experts_equal_the_per_expert_loop(script: ModuleType, tokens: int) -> None:
    """Sorting the token-expert pairs by expert and running grouped GEMMs computes the same
    layer as visiting each expert in turn (experts that no token chose included)."""
    torch.manual_seed(2)
    experts, hidden, width, top_k = 6, 16, 8, 2
    layer = script.Layer(
        in_norm=torch.ones(hidden),
        qkv=torch.empty(0),
        o=torch.empty(0),
        post_norm=torch.ones(hidden),
        gate_up=torch.randn(experts, 2 * width, hidden),
        down=torch.randn(experts, hidden, width),
        router=torch.randn(experts, hidden),
    )
    x = torch.randn(tokens, hidden)
    got = script.moe(x, layer, top_k)
    want = torch.zeros(tokens, hidden)
    probs = F.linear(x, layer.router).softmax(-1)
    for row in range(tokens):
        top = probs[row].topk(top_k)
        shares = top.values / top.values.sum()
        for weight, expert in zip(shares, top.indices.tolist(), strict=True):
            gate, up = (layer.gate_up[expert] @ x[row]).chunk(2)
            want[row] += weight * (layer.down[expert] @ (F.silu(gate) * up))
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    assert torch.allclose(script.moe_reference(x, layer, top_k), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("moe", [False, True])
def test_a_mixed_step_layer_computes_each_part_as_alone(script: ModuleType, moe: bool) -> None:
    """Flattening decoders and a prefilling prompt into one row set changes what the
    linear layers batch, not what any token computes."""
    torch.manual_seed(3)
    args = script.parse_args(["--tiny", "--max-k", "2", "--batches", "2"] + ["--moe"] * moe)
    shape = script.TINY_MOE if moe else script.TINY
    twin = script.Twin(shape, args, torch.device("cpu"), torch.float32)
    layer, s, c, t, prompt = twin.layers[0], shape, shape.context, 3, 5
    dec = torch.randn(2, t, s.hidden)
    pre = torch.randn(1, prompt, s.hidden)
    cache = twin.caches[0]
    saved = tuple(x.clone() for x in cache)
    attend = twin._cached(c, t, cache)
    rot_dec, rot_pre = twin.rot[:, c : c + t], twin.rot[:, :prompt]
    alone_dec = script.decoder_layer(
        layer, script.rms_norm(dec, layer.in_norm, s.eps), dec, s, rot_dec, attend
    )
    alone_pre = script.decoder_layer(
        layer, script.rms_norm(pre, layer.in_norm, s.eps), pre, s, rot_pre, script.attend_causal
    )
    for x, y in zip(cache, saved, strict=True):
        x.copy_(y)
    flat = torch.cat((dec.reshape(2 * t, -1), pre.reshape(prompt, -1)))
    parts = [(2, t, rot_dec, attend), (1, prompt, rot_pre, script.attend_causal)]
    mixed = script.mixed_layer(layer, flat, s, parts)
    want = torch.cat((alone_dec.reshape(2 * t, -1), alone_pre.reshape(prompt, -1)))
    assert torch.allclose(mixed, want, rtol=1e-4, atol=1e-5)


def test_tiny_mixed_run_prices_each_step_and_its_parts(tmp_path: Path) -> None:
    out = tmp_path / "mixed.json"
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--mixed", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["mixed"]
    assert {(r["batch"], r["k"], r["prompt"]) for r in rows} == {
        (b, k, p) for b in (1, 2) for k in (0, 3) for p in (16, 64)
    }
    for row in rows:
        assert min(row["mixed_ms"], row["decode_ms"], row["prefill_ms"]) > 0
        total = row["decode_ms"] + row["prefill_ms"]
        # The parts are written rounded to 0.1 us (`gpu_profile.ms`), and the ratio, from the
        # unrounded times, to four decimals. The parts' rounding moves the ratio recomputed
        # here by up to (5e-5 / mixed + 1e-4 / total) of itself, and the ratio's own rounding
        # adds up to 5e-5: the two errors add, so the bound is their sum, not the larger.
        expected = row["mixed_ms"] / total
        bound = (5e-5 / row["mixed_ms"] + 1e-4 / total) * expected + 5e-5
        assert abs(row["mixed_over_sum"] - expected) <= bound * (1 + 1e-9), row
