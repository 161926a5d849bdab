"""The scheduler's side of the step-depth rule: votes and step costs in, a depth out.

A request may carry a vote (`extra_args[SPEC_VOTE_ARG]`: its class's live acceptance
p_1..p_K, `engine.step_rule.StepVote`) and the gateway's step costs
(`extra_args[SPEC_COSTS_ARG]`; the newest that parse are kept). The voters of a step
then run at the rule's depth (`engine.step_rule.vote_step_depth`), each at most its own
k; under the uniform batch-depth rule only depths with a FULL decode graph are chosen.
A rider's vote (`StepVote.rides`) counts in that depth without a say in it: it verifies
the voters' depth, none in a step without voters, and none for good once a step skips
the drafter (its drafter KV then has a gap). A rider keeps no drafter running, so its
blocks go to the k = 0 prefix-cache namespace (`engine.vllm.scheduler`): a k > 0 request
never reuses a prompt whose drafter KV a rider's step skipped; a rider that hits blocks
there drafts from what drafter KV they have (lower acceptance, never another output).
Mixed into `engine.vllm.scheduler`'s schedulers, which own k (`_depth`) and the depth rule.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.request import Request

from engine.step_rule import (
    GUARD,
    RETIRE_AFTER,
    SPEC_COSTS_ARG,
    SPEC_NEWS_ARG,
    SPEC_VOTE_ARG,
    Estimates,
    StepCostTable,
    StepVote,
    held_after,
    news_from_arg,
    vote_step_depth,
)
from engine.vllm.batch_depth import BatchDepthPolicy, DepthRule


class StepVotes:
    """Votes, the newest step costs and the voters' depth of the step last scheduled."""

    specgw_depth_rule: DepthRule
    #: The request's k (`engine.vllm.scheduler._DepthCap._depth`).
    _depth: Callable[[Request], int]
    #: Lowers a request's k for the rest of its life (`engine.vllm.scheduler._DepthCap._lower`).
    _lower: Callable[[Request, int], None]

    def _init_votes(self) -> None:
        #: The newest step costs a request brought, raw and parsed.
        self._costs_raw: object = None
        self.specgw_costs: StepCostTable | None = None
        #: The depth the rule gave the voters of the step last scheduled (None: no
        #: voters, or no costs yet), and how many steps it chose each depth for.
        self._voted: int | None = None
        self.specgw_voted_steps: dict[int, int] = {}
        #: Voters retired after `RETIRE_AFTER` steps held at depth 0 (k = 0 since).
        self.specgw_retired = 0
        #: Riders set to k = 0 for good by a step that skipped the drafter.
        self.specgw_riders_dropped = 0
        #: Each class's newest estimates, as the voters brought them.
        self.specgw_estimates = Estimates()

    def _take_step_args(self, request: Request) -> None:
        """Keep what a newcomer brings: the step costs, when they parse (else the last ones),
        its class's estimates and the other classes' newer ones."""
        params = request.sampling_params
        extra = params.extra_args if params is not None and params.extra_args else {}
        vote = self._vote(request)
        if vote is not None:
            self.specgw_estimates.take(vote, news_from_arg(extra.get(SPEC_NEWS_ARG)))
        raw = extra.get(SPEC_COSTS_ARG)
        if raw is None or raw == self._costs_raw:
            return
        table = StepCostTable.from_arg(raw)
        if table is not None:
            self._costs_raw, self.specgw_costs = raw, table

    def _vote(self, request: Request) -> StepVote | None:
        # Cached on the request, as its k is: extra_args never change after admission.
        if not hasattr(request, "_specgw_vote"):
            params = request.sampling_params
            raw = params.extra_args.get(SPEC_VOTE_ARG) if params and params.extra_args else None
            request._specgw_vote = StepVote.from_arg(raw) if raw is not None else None  # type: ignore[attr-defined]
        vote: StepVote | None = request._specgw_vote  # type: ignore[attr-defined]
        return vote

    def _step_k(self, request: Request) -> int:
        """What the request asks of this step: its k, or for a voter at most the rule's
        depth; a rider (`StepVote.rides`) verifies that depth, and none without voters."""
        k = self._depth(request)
        if k > 0 and (vote := self._vote(request)) is not None:
            if vote.rides and self._voted is None:
                return 0
            if self._voted is not None:
                return min(k, self._voted)
        return k

    def _drafts_later(self, request: Request) -> bool:
        """Whether the request keeps the drafter running in its step: k > 0, not a rider."""
        return self._depth(request) > 0 and not self._rides(request)

    def _rides(self, request: Request) -> bool:
        vote = self._vote(request)
        return vote is not None and vote.rides

    def _drop_riders(self, scheduled: list[Request]) -> None:
        """The drafter skips this step: its riders' drafter KV will have a gap, so they run
        at k = 0 for the rest of their life (drafts from a gap would mostly be rejected)."""
        for request in scheduled:
            if self._rides(request) and self._depth(request) > 0:
                self._lower(request, 0)
                self.specgw_riders_dropped += 1

    def _vote_depth(self, scheduled: list[Request], newcomers: bool) -> int | None:
        """The step rule's depth for the step's voters (None: none, or no costs yet),
        beside its requests at k = 0, which pay the step's time and verify none."""
        table = self.specgw_costs
        if table is None:
            return None
        voters: list[tuple[Request, StepVote]] = []
        riding: list[StepVote] = []
        for request in scheduled:
            vote = self._vote(request)
            if vote is None or self._depth(request) <= 0:
                continue
            if vote.rides:
                riding.append(vote)
            else:
                voters.append((request, vote))
        if not voters:
            return None
        votes = [vote for _, vote in voters] + riding
        rule = self.specgw_depth_rule
        allowed: tuple[int, ...] | None = None
        if rule.policy is BatchDepthPolicy.UNIFORM:
            # No width captured at this batch size: every depth runs without the graph.
            allowed = rule.captured_at(len(scheduled)) or None
        depth = vote_step_depth(
            votes,
            table,
            len(scheduled),
            newcomers,
            allowed,
            GUARD,
            self.specgw_estimates,
            sum(1 for request in scheduled if self._depth(request) == 0),
        )
        self.specgw_voted_steps[depth] = self.specgw_voted_steps.get(depth, 0) + 1
        return depth if self._retire_held(voters, depth) else None

    def _retire_held(self, voters: list[tuple[Request, StepVote]], depth: int) -> bool:
        """Count each voter's steps held at depth 0; one held `RETIRE_AFTER` steps runs at
        k = 0 from this step on, as under a cap to 0. Returns whether a voter is left."""
        left = False
        for request, _ in voters:
            held = held_after(getattr(request, "_specgw_held", 0), depth)
            request._specgw_held = held  # type: ignore[attr-defined]
            if held < RETIRE_AFTER:
                left = True
                continue
            self._lower(request, 0)
            self.specgw_retired += 1
        return left
