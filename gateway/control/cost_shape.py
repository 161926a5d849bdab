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


#: Filed (forgetting) samples each of at least two depths of an extrapolated bucket
#: needs before their means rescale the lent shape (`fitted_shape`).
FIT_SAMPLES = 16.0


def fitted_shape(
    shapes: dict[int, list[float]],
    bucket: int,
    max_k: int,
    table: list[list[float]] | None,
) -> tuple[float, ...] | None:
    """`borrowed_shape`, with the excess of a bucket above every measured one rescaled
    to the means its own traffic filed.

    Above the largest measured bucket M the growth g per doubling is a guess (MIN_GROWTH
    where the measured buckets show none; a flat MLA target keeps its batch-16 excess at
    batch 64, a dense one grows it by 1.2-1.5 per doubling). Traffic there runs at one or
    two depths, so it can measure the shape's scale though not its k = 0: with m_k the
    bucket's mean at depth k and e_k the lent excess, the weighted least-squares line
    m_k = z + beta * e_k over the depths with at least FIT_SAMPLES gives the scale
    lambda = beta / z, and the excess becomes lambda * e_k, kept between M's own excess
    (flat) and min(k, e_M(k) * 2^doublings) (compute bound)."""
    lent = borrowed_shape(shapes, bucket, max_k)
    if lent is None or table is None or any(m > bucket for m in shapes):
        return lent
    rows = [(n, t / n, lent[k] - 1.0) for k, (n, t) in enumerate(table) if n >= FIT_SAMPLES]
    if len(rows) < 2:
        return lent
    w = sum(n for n, _, _ in rows)
    e_bar = sum(n * e for n, _, e in rows) / w
    m_bar = sum(n * m for n, m, _ in rows) / w
    see = sum(n * (e - e_bar) ** 2 for n, _, e in rows)
    if see <= 1e-12:
        return lent
    beta = sum(n * (e - e_bar) * (m - m_bar) for n, m, e in rows) / see
    z = m_bar - beta * e_bar
    if z <= 0:
        return lent
    scale = beta / z
    top = max(shapes)
    doublings = math.log2(bucket) - math.log2(top)
    flat = shapes[top]
    return tuple(
        1.0 + min(max(scale * (r - 1.0), flat[k]), min(float(k), flat[k] * 2.0**doublings))
        for k, r in enumerate(lent)
    )
