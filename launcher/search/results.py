"""What a layout search returns: each layout that fits with the planner's predictions for it
(``Candidate``), and the search's report (``SearchResult``)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from launcher.plan.memory.estimate import MemoryPlan
from launcher.plan.planner import Plan
from launcher.plan.timing.estimate import TimePlan
from launcher.search.space import Choice

MEMORY = "memory"
OUTRANKED = "outranked"


@dataclass(frozen=True)
class Candidate:
    """A layout that fits, with the planner's predictions for it."""

    choice: Choice
    overrides: tuple[str, ...]
    dp: int
    grad_accum: int
    memory_bytes: float  # heaviest GPU, reserved + overhead (the planner's device total)
    capacity_bytes: float
    step_s: float
    tokens_per_s: float
    mfu: float
    bubble_fraction: float
    compute_s: float
    bubble_s: float
    exposed_comm_s: float
    optimizer_s: float

    @property
    def line(self) -> str:
        """The overrides as one shell line (a layout string is quoted)."""
        return " ".join(shlex.quote(word) for word in self.overrides)

    @property
    def backend(self) -> str:
        """The backend this layout is for (the first override names it)."""
        return self.overrides[0].split("=", 1)[1] if self.overrides else ""

    @property
    def headroom(self) -> float:
        """Fraction of the GPU's memory left free on the heaviest rank."""
        return 1.0 - self.memory_bytes / self.capacity_bytes

    def rank_key(self) -> tuple[float, float, str]:
        """Faster first; ties: more headroom, then the override line (deterministic)."""
        return (-self.tokens_per_s, self.memory_bytes, self.line)


@dataclass(frozen=True)
class SearchResult:
    model: str
    gpu: str
    num_nodes: int
    gpus_per_node: int
    global_batch_size: int
    min_headroom: float
    top: int
    candidates: tuple[Candidate, ...]
    space_size: int  # layouts in the grid
    evaluated: int  # layouts whose memory was evaluated
    fitting: int  # of those, the ones that fit
    timed: int  # of those, the ones whose step time was predicted
    rejected: dict[str, int]  # rule name | "memory" | "outranked" -> layouts
    smallest_cluster: int | None  # num_nodes, when nothing fits
    elapsed_s: float
    given: Candidate | None = None  # the configuration as given, when valid and fitting
    given_status: str = ""
    given_rank: int | None = None  # 1-based, when asked for (rank_given=True)
    notes: tuple[str, ...] = field(default_factory=tuple)
    backends: tuple[str, ...] = ()  # the backends searched
    pricing: str = ""  # where the step times come from (planner.pricing_line)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


def candidate_from_plan(plan: Plan, choice: Choice | None, overrides: tuple[str, ...]) -> Candidate:
    """A Candidate with make_plan's numbers (the configuration as given, or a check of a result)."""
    t, mem, lay = plan.time, plan.memory, plan.layout
    return candidate(
        choice
        or Choice(
            lay.tp,
            lay.cp,
            lay.pp,
            lay.ep,
            lay.micro_batch_size,
            plan.config.parallel.pp_schedule,
            lay.vpp,
            plan.config.train.recompute,
            plan.config.zero.stage,
            plan.config.zero.offload_optimizer,
            plan.config.parallel.sequence_parallel,
        ),
        overrides,
        lay.dp,
        lay.grad_accum,
        mem,
        t,
    )


def candidate(
    choice: Choice,
    overrides: tuple[str, ...],
    dp: int,
    grad_accum: int,
    memory: MemoryPlan,
    timing: TimePlan,
) -> Candidate:
    """A Candidate from a layout's memory and time predictions."""
    return Candidate(
        choice=choice,
        overrides=overrides,
        dp=dp,
        grad_accum=grad_accum,
        memory_bytes=memory.heaviest.device_total,
        capacity_bytes=memory.capacity,
        step_s=timing.step_s,
        tokens_per_s=timing.tokens_per_s,
        mfu=timing.mfu,
        bubble_fraction=timing.bubble_fraction,
        compute_s=timing.compute_s,
        bubble_s=timing.bubble_s,
        exposed_comm_s=timing.exposed_comm_s,
        optimizer_s=timing.optimizer_s,
    )
