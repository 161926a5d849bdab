"""The drafter's confidence in each draft, and whether the target accepted it.

Per drafted token the hook keeps the feature vLLM 0.33's adaptive verification scores
drafts by (`vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`, `_predict_kernel`):
the log-odds of the drafter's most likely token,

    f = logit(max q) = m* - log sum_{z != m*} exp(z - m*),   clamped to +-40,

over the drafter's logits divided by the request's temperature (1 for greedy). EAGLE
drafts by argmax in vLLM 0.32 (`draft_sample_method="greedy"`, the default; the install
refuses any other), so `max q` is the drafter's probability of the very token it drafted,
`q = sigmoid(f)`.

The next step grades them: the scheduler verifies the first `verified` of a request's
drafts (it may trim: a class's k, the token budget) and the target accepts the first
`accepted` of those (the step's sampled tokens minus the bonus token). One
`VerifiedDrafts` per request and verify step holds all of it, so either label can be
read: conditional acceptance at position j (defined for j <= accepted, j < verified:
what vLLM 0.33's estimator fits) or survival to j (j < accepted, every verified j).

Drafts not yet verified stay readable per request id (`specgw_draft_confidences`): what
a trim of the next step's drafts from their confidences needs, before it is scheduled.

Mechanism: `specgw_install_draft_confidence` (through `collective_rpc`, mixed into the
worker by `engine.vllm.worker.SpecGatewayWorker`) wraps, on the V1 model runner (vLLM
0.32, synchronous scheduling: each step's `execute_model` and `sample_tokens` run back to
back), the drafter's `propose` (rows in the runner's `input_batch.req_ids` order) and its
model's `compute_logits` (called once per draft position inside `propose`, on one row per
request), and the runner's `execute_model` (which drafts this step verifies) and
`sample_tokens` (how many it accepted). Not installed, nothing runs: it is off by default.
Installed, it costs one log-sum-exp over the drafter's vocabulary per draft token.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the records are read torch-free (`bench.confidence`)
    import torch

#: vLLM 0.33's clamp on the feature (`acceptance_estimator._MAX_LOG_ODDS`): a row with all
#: of its mass on one token has infinite log-odds.
MAX_LOG_ODDS = 40.0
#: Graded records kept between two reads; the oldest go first past this.
RECORD_LIMIT = 1_000_000

#: A record as it crosses `collective_rpc` (plain values: the engine core's wire is msgpack):
#: (request id, log-odds per drafted position, verified, accepted).
Row = tuple[str, list[float], int, int]


@dataclass(frozen=True, slots=True)
class VerifiedDrafts:
    """One request's drafts of one step, as the next step graded them."""

    request_id: str
    #: The feature of each drafted position, in order (the step's full draft, K long).
    log_odds: tuple[float, ...]
    #: How many of them the scheduler sent to verification (a prefix).
    verified: int
    #: How many of those the target accepted (a prefix of the verified).
    accepted: int

    def as_row(self) -> Row:
        return (self.request_id, list(self.log_odds), self.verified, self.accepted)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> VerifiedDrafts:
        request_id, log_odds, verified, accepted = row
        return cls(str(request_id), tuple(float(x) for x in log_odds), int(verified), int(accepted))


@dataclass(frozen=True, slots=True)
class Drafted:
    """A request's drafts of the last step, not yet verified."""

    token_ids: tuple[int, ...]
    log_odds: tuple[float, ...]


@dataclass
class ConfidenceLog:
    """The hook's state in one worker: drafts awaiting verification, graded records."""

    record: bool = True
    pending: dict[str, Drafted] = field(default_factory=dict)
    records: deque[VerifiedDrafts] = field(default_factory=lambda: deque(maxlen=RECORD_LIMIT))
    #: Verified drafts that were not the ones this hook saw drafted (never expected).
    mismatched: int = 0
    #: This step's verification: request id -> (its drafts, how many verified).
    grading: dict[str, tuple[Drafted, int]] = field(default_factory=dict)
    #: Per-position features of the `propose` call in progress (None outside one).
    positions: list[torch.Tensor] | None = None
    temperature: torch.Tensor | None = None
    #: Undoes the install (set by it).
    restore: Callable[[], bool] | None = None

    def verify(
        self,
        scheduled: Sequence[str],
        spec_tokens: dict[str, list[int]],
        finished: Sequence[str],
    ) -> None:
        """A step is scheduled: take the drafts it verifies out of `pending`."""
        for rid in finished:
            self.pending.pop(rid, None)
        self.grading = {}
        for rid in scheduled:
            drafted = self.pending.pop(rid, None)  # drafts not verified now never will be
            ids = spec_tokens.get(rid) or ()
            if drafted is None or not ids:
                continue
            if tuple(ids) != drafted.token_ids[: len(ids)]:
                self.mismatched += 1
                continue
            self.grading[rid] = (drafted, len(ids))

    def graded(self, sampled: dict[str, int]) -> None:
        """The step sampled `sampled[rid]` tokens for each request (bonus token included)."""
        grading, self.grading = self.grading, {}
        if not self.record:
            return
        for rid, (drafted, verified) in grading.items():
            n = sampled.get(rid)
            if n is None:
                continue
            accepted = max(0, min(verified, n - 1))
            self.records.append(VerifiedDrafts(rid, drafted.log_odds, verified, accepted))

    def drafted(self, req_ids: Sequence[str], token_ids: list[list[int]]) -> None:
        """`propose` returned `token_ids` (one row per request of `req_ids`)."""
        positions, self.positions, self.temperature = self.positions, None, None
        if not positions or not token_ids:
            return
        import torch

        k = len(token_ids[0])
        feats = torch.stack(positions[:k], dim=1).tolist() if len(positions) >= k else None
        if feats is None:
            return
        for rid, ids, row in zip(req_ids, token_ids, feats, strict=False):
            self.pending[rid] = Drafted(tuple(ids), tuple(row))


def log_odds_of_max(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """logit(max q) per row of `logits` (the module's docstring), scaled by each row's
    temperature (<= 0 or None: 1, as vLLM's sampler and estimator treat greedy rows)."""
    import torch

    x = logits.float()
    if temperature is not None:
        t = temperature[: x.shape[0]].float().to(x.device)
        x = x / torch.where(t > 0, t, torch.ones_like(t)).unsqueeze(1)
    m = x.max(dim=-1, keepdim=True).values
    # The top token contributes exp(0) = 1 to the sum; the rest is the complement's mass.
    complement = (torch.exp(x - m).sum(dim=-1) - 1.0).clamp_min(0.0)
    return (-torch.log(complement)).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS)


#: Runner methods the hook wraps, and the parameters the wrappers read, checked on the
#: runner's class (another hook, the draft skip's, may have wrapped the instance's).
RUNNER_HOOKS: dict[str, tuple[str, ...]] = {
    "execute_model": ("self", "scheduler_output"),
    "sample_tokens": ("self",),
}


def runner_supports_confidence(runner: Any) -> bool:
    """Whether `runner` is a synchronous V1 runner with an EAGLE drafter that drafts by
    argmax over its model's `compute_logits` (what the hook reads)."""
    spec = getattr(runner, "speculative_config", None)
    drafter = getattr(runner, "drafter", None)
    if spec is None or drafter is None or getattr(runner, "use_async_scheduling", True):
        return False
    if not getattr(spec, "use_eagle", lambda: False)():
        return False
    if getattr(spec, "draft_sample_method", "greedy") != "greedy":
        return False
    if any(
        getattr(drafter, flag, False)
        for flag in ("use_local_argmax_reduction", "use_heterogeneous_vocab", "parallel_drafting")
    ):
        return False
    if not callable(getattr(getattr(drafter, "model", None), "compute_logits", None)):
        return False
    if not callable(getattr(drafter, "propose", None)):
        return False
    for name, params in RUNNER_HOOKS.items():
        try:
            names = list(inspect.signature(getattr(type(runner), name)).parameters)
        except (AttributeError, TypeError, ValueError):
            return False
        if tuple(names[: len(params)]) != params:
            return False
    return True


class DraftConfidenceExtension:
    """Worker extension (mixed into vLLM's worker class by `worker_extension_cls`)."""

    def specgw_install_draft_confidence(self, record: bool = True) -> bool:
        """Install the hook; `record=False` keeps only the drafts awaiting verification."""
        runner: Any = getattr(self, "model_runner", None)
        if runner is None or getattr(runner, "_specgw_confidence", None) is not None:
            return False
        if not runner_supports_confidence(runner):
            return False
        log = ConfidenceLog(record=record)
        _install(runner, log)
        return True

    def specgw_remove_draft_confidence(self) -> bool:
        """Put back what the install wrapped, where nothing has wrapped it since."""
        log = _log(self)
        if log is None or log.restore is None:
            return False
        return log.restore()

    def specgw_draft_confidence_records(self, clear: bool = True) -> list[Row]:
        """Graded records so far (oldest first), emptied when `clear`."""
        log = _log(self)
        if log is None:
            return []
        rows = [r.as_row() for r in log.records]
        if clear:
            log.records.clear()
        return rows

    def specgw_draft_confidences(self) -> dict[str, list[float]]:
        """Each request's last drafts not yet verified: their log-odds by position."""
        log = _log(self)
        return {} if log is None else {r: list(d.log_odds) for r, d in log.pending.items()}

    def specgw_draft_confidence_mismatches(self) -> int:
        log = _log(self)
        return 0 if log is None else log.mismatched


def _log(worker: Any) -> ConfidenceLog | None:
    log = getattr(getattr(worker, "model_runner", None), "_specgw_confidence", None)
    return log if isinstance(log, ConfidenceLog) else None


def _install(runner: Any, log: ConfidenceLog) -> None:
    import torch

    drafter = runner.drafter
    model = drafter.model
    propose = drafter.propose
    compute_logits = model.compute_logits
    execute_model = runner.execute_model
    sample_tokens = runner.sample_tokens

    def propose_noting(*args: Any, **kwargs: Any) -> Any:
        metadata = kwargs.get("sampling_metadata")
        log.positions = []
        log.temperature = getattr(metadata, "temperature", None)
        try:
            drafts = propose(*args, **kwargs)
        except BaseException:
            log.positions, log.temperature = None, None
            raise
        if isinstance(drafts, torch.Tensor) and drafts.dim() == 2 and drafts.shape[1] > 0:
            req_ids = list(runner.input_batch.req_ids)[: drafts.shape[0]]
            log.drafted(req_ids, drafts.tolist())
        else:
            log.positions, log.temperature = None, None
        return drafts

    def logits_noting(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        logits = compute_logits(hidden_states, *args, **kwargs)
        if log.positions is not None and isinstance(logits, torch.Tensor):
            log.positions.append(log_odds_of_max(logits, log.temperature))
        return logits

    def execute_noting(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        log.verify(
            list(getattr(scheduler_output, "num_scheduled_tokens", {}) or {}),
            dict(getattr(scheduler_output, "scheduled_spec_decode_tokens", {}) or {}),
            list(getattr(scheduler_output, "finished_req_ids", ()) or ()),
        )
        return execute_model(scheduler_output, *args, **kwargs)

    def sample_noting(*args: Any, **kwargs: Any) -> Any:
        output = sample_tokens(*args, **kwargs)
        if log.grading:
            log.graded(_sampled_counts(output))
        return output

    wrapped: tuple[tuple[Any, str, Callable[..., Any]], ...] = (
        (drafter, "propose", propose_noting),
        (model, "compute_logits", logits_noting),
        (runner, "execute_model", execute_noting),
        (runner, "sample_tokens", sample_noting),
    )
    # What each name was on its instance before (another hook's wrapper, e.g. the draft
    # skip's), or None where the class's method showed through.
    before = [vars(owner).get(name) for owner, name, _ in wrapped]
    for owner, name, wrapper in wrapped:
        setattr(owner, name, wrapper)

    def restore() -> bool:
        if any(getattr(owner, name, None) is not wrapper for owner, name, wrapper in wrapped):
            return False  # wrapped again since: removing this layer would drop the other
        for (owner, name, _), old in zip(wrapped, before, strict=True):
            if old is None:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        runner._specgw_confidence = None
        return True

    log.restore = restore
    runner._specgw_confidence = log


def _sampled_counts(output: Any) -> dict[str, int]:
    """Tokens sampled per request id in a `ModelRunnerOutput` (rejected drafts removed)."""
    index: dict[str, int] | None = getattr(output, "req_id_to_index", None)
    sampled: list[list[int]] | None = getattr(output, "sampled_token_ids", None)
    if not index or sampled is None:
        return {}
    return {rid: len(sampled[i]) for rid, i in index.items() if i < len(sampled)}
