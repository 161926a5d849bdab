"""What a twin run leaves behind: one record per finished request, and the run's totals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one finished request did, for the report (times in virtual seconds)."""

    index: int
    class_index: int
    phase: int
    segment: int
    arrival_s: float
    first_s: float
    last_s: float
    output_tokens: int
    k: int
    #: The depth its class chose at its load (`Plan.chosen`); k is what it ran.
    chosen: int
    verify_steps: int
    draft_tokens: int
    accepted_tokens: int
    #: The batch it was planned for (requests in the engine at its arrival, itself included).
    load: int = 1


@dataclass(frozen=True, slots=True)
class RunResult:
    """A run's records in finishing order, its virtual makespan (first arrival to last
    token) and its engine steps; tokens/s is output tokens over the makespan."""

    records: list[RequestRecord]
    makespan_s: float
    steps: int

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(r.output_tokens for r in self.records)
        return tokens / self.makespan_s if self.makespan_s > 0 else 0.0
