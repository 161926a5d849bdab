"""bench/gpu/gpu_pieces.py on the CPU: its --tiny run, and the mixed step's one attention call.

The GPU run is the lead's (its output is in bench/twin/measurements); here the script must run
end to end and write every row, the piecewise stages must compute what the whole step computes,
and scattering a mixed batch into one padded attention call must give each sequence what it
gets without neighbours of another width. No timing is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.gpu import gpu_pieces
from bench.gpu.gpu_profile import TINY, TINY_MOE, Twin


def test_tiny_run_writes_every_row_with_the_same_drafts_both_ways(tmp_path: Path) -> None:
    out = tmp_path / "mixed.json"
    assert gpu_pieces.main(["--tiny", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["complete"] is True
    assert document["graphs"] is False
    # batches 2 and 4, depths 1 and 3, shares 0 / 0.25 / 0.5 / 0.75 of the batch at k = 0
    cells = {(r["batch"], r["k"], r["zero"]) for r in document["rows"]}
    assert cells == {
        (b, k, z) for k in (1, 3) for b, zs in ((2, (0, 1)), (4, (0, 1, 2, 3))) for z in zs
    }
    for row in document["rows"]:
        assert row["same_drafts"] is True
        assert row["full_ms"] > 0
        assert row["piecewise_ms"] > 0
        if row["zero"] == 0:
            assert row["piecewise_over_uniform"] == row["piecewise_over_full"]


@pytest.mark.parametrize("moe", [False, True])
def test_a_mixed_batch_gives_each_sequence_what_it_gets_alone(moe: bool) -> None:
    torch.manual_seed(0)
    args = gpu_pieces.parse_args(["--tiny", "--batches", "4"] + ["--moe"] * moe)
    twin = Twin(TINY_MOE if moe else TINY, args, torch.device("cpu"), torch.float32)
    last = f"x{twin.shape.layers - 1}"
    with torch.inference_mode():
        mixed = gpu_pieces.MixedStep(twin, 1, 2, 3)  # rows: [k = 0 | 4 + 4 drafting]
        mixed.whole()
        zero = gpu_pieces.MixedStep(twin, 1, 0, 3)
        zero.ids.copy_(mixed.ids[:1])
        zero.whole()
        drafting = gpu_pieces.MixedStep(twin, 0, 2, 3)
        drafting.ids.copy_(mixed.ids[1:])
        drafting.whole()
    assert mixed.rows == 9
    torch.testing.assert_close(mixed.state[last][:1], zero.state[last])
    torch.testing.assert_close(mixed.state[last][1:], drafting.state[last])
    assert torch.equal(mixed.state["draft"][:1], zero.state["draft"])
    assert torch.equal(mixed.state["draft"][1:], drafting.state["draft"])


def test_the_shares_give_whole_requests_and_keep_one_drafting() -> None:
    assert gpu_pieces.zeros(4, [0.0, 0.25, 0.5, 0.75]) == [0, 1, 2, 3]
    assert gpu_pieces.zeros(2, [0.0, 0.25, 0.5, 0.75]) == [0, 1]  # 0.75 of 2 rounds to 2
    assert gpu_pieces.zeros(64, [0.25, 1.0]) == [16]
