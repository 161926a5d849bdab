"""Replica sharing of the cost model: flat counters out, other replicas' increments in.

Every counter is a raw (unforgotten) sum, so replicas add them up: per bucket b,
the line's sums (`n:b4`, `sk:b4`, ... `skt:b4`), each depth's filed count and
seconds (`kn2:b4`, `kt2:b4`) and the requests run at each own k (`ks2:b4`, which
only count runs for exploration and price nothing). `Controller.export_deltas`
ships them under the pseudo-class `_cost`; `Controller.merge` hands back the
increase of the other replicas' totals since its last merge.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.control.cost_steps import StepCosts, Sums, batch_bucket

#: The line's sums, by their `Sums` field names.
SUM_FIELDS = ("n", "sk", "skk", "st", "skt")


def export_counters(steps: StepCosts) -> dict[str, float]:
    """What was filed since the last export, as flat counters; resets it."""
    out: dict[str, float] = {}
    for bucket, sums in steps.pending.items():
        for name in SUM_FIELDS:
            out[f"{name}:b{bucket}"] = getattr(sums, name)
    for bucket, table in steps.pending_k.items():
        for k, (n, t) in enumerate(table):
            if n:
                out[f"kn{k}:b{bucket}"] = n
                out[f"kt{k}:b{bucket}"] = t
    for bucket, row in steps.pending_runs.items():
        for k, n in enumerate(row):
            if n:
                out[f"ks{k}:b{bucket}"] = n
    steps.pending.clear()
    steps.pending_k.clear()
    steps.pending_runs.clear()
    return out


def merge_counters(steps: StepCosts, increments: Mapping[str, float]) -> set[int]:
    """Add other replicas' sums (increments since the last merge); returns the buckets
    whose costs they moved (their lines are dropped for a refit)."""
    touched: set[int] = set()
    for name, value in increments.items():
        field_name, _, bucket_text = name.partition(":b")
        if not bucket_text.isdigit():
            continue
        bucket = batch_bucket(int(bucket_text))
        if field_name in SUM_FIELDS:
            sums = steps.sums.setdefault(bucket, Sums())
            setattr(sums, field_name, getattr(sums, field_name) + float(value))
        elif field_name[:2] in ("kn", "kt", "ks") and field_name[2:].isdigit():
            k = int(field_name[2:])
            if k > steps.max_k:
                continue
            if field_name[:2] == "ks":
                steps.runs_row(bucket)[k] += float(value)
                continue  # run counts: no cost to refresh
            column = 0 if field_name[:2] == "kn" else 1
            steps.depth_table(steps.per_k, bucket)[k][column] += float(value)
        else:
            continue
        touched.add(bucket)
    for bucket in touched:
        steps.lines.pop(bucket, None)
    return touched
