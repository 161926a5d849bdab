"""The relative step costs of a batch bucket that was never measured, from the ones that were.

Start-up calibration measures every depth at a few batch sizes (1..16 by default);
traffic under load runs in larger buckets where mostly one depth is ever timed (and
chunked prefill leaves few clean steps to time). There the cost line's prior shape,
relative slope `prior_k_cost * (1 + b / prior_batch_saturation)`, is a guess that
is wrong by several times on a GPU (1.36 a draft at batch 256 against a measured
0.23 on an MoE target), and it priced every k > 0 out. The measured buckets say
more: the excess e_b(k) = cost(k, b) / cost(0, b) - 1 of a bucket b between two
measured ones is interpolated in log2 b; above the largest measured bucket M (with
M' the one below it) it grows per doubling by g = e_M(k) / e_M'(k), at least MIN_GROWTH (a
bigger batch never makes drafting relatively cheaper, verification turning compute
bound), at most 2 (the compute-bound rate), and never past k (fully compute bound,
a step at k costs k + 1 steps at 0):

    e_b(k) = min(k, e_M(k) * g^(log2 b - log2 M)).

Below the smallest it is the smallest's. A bucket counts as measured where every
depth has at least `MEASURED` filed samples.
"""

from __future__ import annotations

import math

#: Least growth of the excess per doubling above the largest measured bucket: a GPU's
#: verification turns compute bound as batch x (k + 1) grows (Llama-8B on an H100: a
#: draft's excess x1.5 from batch 16 to 64; an MoE target's x1.6), which batch 1..16
#: need not show yet. 1 (flat) underpriced depth at batch 64 on both.
MIN_GROWTH = 1.25
#: Filed (forgetting) samples every depth of a bucket needs for its shape to be lent.
MEASURED = 3.0


def is_measured(table: list[list[float]]) -> bool:
    """Whether a bucket's per-depth table (count, seconds) lends its shape: every depth
    has at least `MEASURED` filed samples and k = 0 has time."""
    return table[0][1] > 0 and all(n >= MEASURED for n, _ in table)


def measured_shapes(per_k: dict[int, list[list[float]]]) -> dict[int, list[float]]:
    """bucket -> e_b(k) for k = 0..K of every measured bucket, from its depths' own means."""
    shapes: dict[int, list[float]] = {}
    for bucket, table in per_k.items():
        if is_measured(table):
            zero = table[0][1] / table[0][0]
            shapes[bucket] = [max(0.0, (t / n) / zero - 1.0) for n, t in table]
    return shapes


def borrowed_shape(
    shapes: dict[int, list[float]], bucket: int, max_k: int
) -> tuple[float, ...] | None:
    """cost(k, b) / cost(0, b) for k = 0..K lent by the measured buckets (the module
    docstring's rule), or None where none is measured or `bucket` itself is."""
    if not shapes or bucket in shapes:
        return None
    known = sorted(shapes)
    below = [m for m in known if m < bucket]
    above = [m for m in known if m > bucket]
    if below and above:
        lo, hi = below[-1], above[0]
        t = (math.log2(bucket) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        excess = [a + t * (b - a) for a, b in zip(shapes[lo], shapes[hi], strict=True)]
    elif above:
        excess = list(shapes[above[0]])
    else:
        top = below[-1]
        doublings = math.log2(bucket) - math.log2(top)
        last = shapes[top]
        prev = shapes[below[-2]] if len(below) > 1 else last
        span = math.log2(top) - math.log2(below[-2]) if len(below) > 1 else 1.0
        excess = []
        for k in range(max_k + 1):
            ratio = last[k] / prev[k] if prev[k] > 0 else 1.0
            growth = min(2.0, max(MIN_GROWTH, ratio ** (1.0 / span)))
            excess.append(min(float(k), last[k] * growth**doublings))
    return tuple(1.0 + e for e in excess)
