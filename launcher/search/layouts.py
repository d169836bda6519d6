"""Search the layouts the configured backend runs and the validation rules allow for the fastest
one that fits: `plan --search` (``search``), or over every backend (``search_backends``,
`--any-backend`). Every proposed override line names its backend (``backend=NAME``).

The space (``search_space``): tp, cp and pp among the divisors of the world size (tp up to
``max_tp``, by default the GPUs of one node; cp up to ``max_cp``, by default seq_length / 1024:
at least 1024 tokens per rank; pp up to the layer count), dp implied, ep among the
divisors of the expert count (MoE models), the micro-batch size among the divisors of the global
batch (which stays as configured), the pipeline schedule (gpipe, 1f1b, interleaved with vpp 2 to
``max_vpp``), recomputation, sequence parallelism (with tp > 1), ZeRO stage and optimizer offload.
A key the user fixed on the command line keeps its configured value. The backend's table
(launcher/backends/) restricts the values of keys not fixed: only the degrees, ZeRO stages,
offloads, schedules and sequence parallelism it runs are in the space.

How it stays fast while using the planner's own formulas (nothing is re-derived here):
1. Rule pruning, level by level (tp, cp, pp, dp, ep, micro-batch, micro-batches, schedule, then
   sequence parallel/zero/offload, ``space.LEVELS``): every error condition validate declares
   (``launcher.validate.rule.LayoutRule``) prunes at the first level where the values it reads are
   fixed (``LayoutSpace.refused``); a pruned value counts every layout under it against that rule.
   Then the backend's own refusals (``backends.raw_refusals``, the function validate's
   backend-capabilities rule calls), memoised on the values they depend on. Tests compare this
   with ``check()`` on every layout of small spaces, and every layout returned is checked with
   ``check()`` again.
2. Best-first with bounds: a step is never shorter than (compute + exposed TP/CP/EP/PP
   communication of one micro-batch) x micro-batches x (1 + bubble overhead)
   (``timing.microbatch_compute_s``, ``timing.microbatch_time``, ``schedule.bubble_overhead``).
   Groups of layouts (same everything but ZeRO stage and offload) are visited in decreasing order
   of that bound on tokens/s, first with compute alone, then with the communication added; the
   search stops when the bound falls below the k-th best found (``outranked``: they cannot enter
   the top k). Both terms are proportional to the tokens of a micro-batch, so they are computed
   once at one sequence per micro-batch and scaled; every timed layout asserts that its tokens/s
   respects its bound, and every returned layout is re-planned with ``check()`` + ``make_plan()``.
3. Memory before time: the model states (``memory.stage_states``) shared by many layouts are
   computed once and reject, on their own, every layout they overflow; otherwise stages are
   assembled from memoized parts (``stage_states``, ``stage_activations``, ``stage_buffers``,
   ``assemble_stage``: the pieces ``stage_memory`` is made of), the first and last stage first,
   stopping at the first that overflows. A layout that fits whose build does not (validate's
   build-memory, ``build_rules.build_overflow``) is left out by that rule. Only layouts that fit
   are timed (``estimate_time``).
4. The smallest cluster, when nothing fits: node counts upward from one more than configured, each
   asked only whether any layout fits (``first_fit``): the model states of the first, last and
   largest stages reject most layouts before the other stages are computed, and the backend's
   refusals are asked only of the layouts that fit.
Step times are priced as `plan` prices them (``planner.priced_hardware``): from a profile of
``llmtrain calibrate`` when one is chosen, and then the bound takes every measured operator class
at its fastest measured rate (``profile.Rates.optimistic``), so it still bounds.
Pass ``exhaustive=True`` to switch the bound off (every valid layout's memory is evaluated).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable

from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan.fixes import SAVERS, is_saver, suggest_fixes
from launcher.plan.memory.estimate import VERDICT_WORDS, HardwareView
from launcher.plan.planner import hardware_view, make_plan, priced_hardware, pricing_line
from launcher.plan.preference import is_preference
from launcher.search.best_first import Search
from launcher.search.results import (
    MEMORY,
    OUTRANKED,
    Candidate,
    SearchResult,
    candidate_from_plan,
)
from launcher.search.space import (
    SEARCH_KEYS,
    Choice,
    LayoutSpace,
    fixed_keys,
    search_space,
)
from launcher.validate.rules import check, passes

__all__ = [
    "MEMORY",
    "OUTRANKED",
    "Candidate",
    "Choice",
    "LayoutSpace",
    "SearchResult",
    "fixed_keys",
    "search",
    "search_backends",
    "search_space",
]

# Keys whose violations the search can change; any other error is the configuration's own (a
# backend refusal of a non-layout key, e.g. optim.name, included: --any-backend may fix those).
_LAYOUT_KEYS = SEARCH_KEYS | {"train.global_batch_size", "cluster.num_nodes"}


# The status of a configuration as given that validate refuses.
NOT_VALID = "not valid"


def _config_errors(cfg: LLMTrainConfig) -> list[str]:
    # A value out of its key's range (parallel.tp=0, cluster.num_nodes=1250000, optim.lr=1e39)
    # is the configuration's own error even on a layout key: `plan` exits 2 on it, so does this.
    return [
        f"[{v.rule}] {v.message}"
        for v in check(cfg)
        if v.is_error
        and (v.rule == "positive-values" or not (set(v.keys) - {"backend"}) & _LAYOUT_KEYS)
    ]


def _given(cfg: LLMTrainConfig, headroom: float) -> tuple[Candidate | None, str]:
    """The configuration as given: its Candidate when valid and fitting, and a status line."""
    errors = sorted({v.rule for v in check(cfg) if v.is_error})
    if errors:
        return None, f"{NOT_VALID} (" + ", ".join(errors) + ")"
    plan = make_plan(cfg, headroom=headroom, with_fixes=False, padded_batches=False)
    # The word `plan` prints for the same configuration (MemoryPlan.verdict): tight is over the
    # headroom, allocated + overhead within the GPU's memory; the search ranks only layouts that
    # fit.
    verdict = VERDICT_WORDS[plan.memory.verdict]
    if not plan.memory.fits:
        return None, verdict
    return candidate_from_plan(plan, None, ()), verdict


def _verified(space: LayoutSpace, cand: Candidate, headroom: float) -> Candidate:
    """Re-plan a result from scratch: it must pass check() and make_plan must agree."""
    cfg = space.apply(cand.choice)
    errors = [v for v in check(cfg) if v.is_error]
    if errors:
        raise AssertionError(f"search returned an invalid layout {cand.line}: {errors[0].message}")
    plan = make_plan(cfg, headroom=headroom, padded_batches=False)
    again = candidate_from_plan(plan, cand.choice, cand.overrides)
    if not plan.memory.fits or not math.isclose(again.tokens_per_s, cand.tokens_per_s):
        raise AssertionError(f"search and make_plan disagree on {cand.line}")
    return again


def _smallest_cluster(
    cfg: LLMTrainConfig, space_args: dict[str, object], headroom: float, limit: int
) -> tuple[int | None, str | None]:
    """The fewest nodes (from one more than configured, up to `limit`) on which a layout fits,
    or None and, when every node count has errors no layout can fix (optim.in_backward=true on
    more than one GPU), the first of them: those counts are not searched."""
    hw = hardware_view(cfg)
    blocked: str | None = None
    searched = False
    for nodes in range(cfg.cluster.num_nodes + 1, limit + 1):
        bigger = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, num_nodes=nodes))
        errors = _config_errors(bigger)
        if errors:
            blocked = blocked or errors[0]
            continue
        searched = True
        space = search_space(bigger, **space_args)  # type: ignore[arg-type]
        run = Search(space, hw, headroom, 1, exhaustive=True, first_fit=True, given=None)
        run.run()
        if run.fitting:
            return nodes, None
    return None, None if searched else blocked


def _saver_note(cfg: LLMTrainConfig, hw: HardwareView, headroom: float) -> str:
    """When no layout fits: what `plan` finds with the memory savers, which the search does not
    vary (it keeps the configured precision and optimizer: pure bf16 and 8-bit states change
    the numbers trained, the offloads trade PCIe time), or that none of them fits either."""
    words = ", ".join(SAVERS)
    fixes = [
        f
        for f in suggest_fixes(cfg, hw, headroom, limit=3, accept=passes)
        if any(is_saver(word) for word in f.overrides)
    ]
    if not fixes:
        return (
            f"the search varies the layout only; the memory savers ({words}) where "
            f"backend={cfg.backend.name} runs them, up to three together, do not fit either"
        )
    found = "; ".join(
        f"{f.line} ({f.device_bytes / 2**30:.1f} GiB, step {f.step_s:.2f} s)" for f in fixes
    )
    return (
        f"the search varies the layout only, not the memory savers ({words}); with them "
        f"`llmtrain plan` finds: {found}"
    )


def _check_request(
    cfg: LLMTrainConfig,
    top: int,
    min_headroom: float,
    caps: dict[str, int | None],
    fixed: frozenset[str],
) -> None:
    """UserError for options out of range, caps below a fixed degree, and configuration errors
    no layout can fix."""
    if top < 1:
        raise UserError(f"--top={top}: must be at least 1")
    if not 0.0 <= min_headroom < 1.0:
        raise UserError(f"--headroom={min_headroom}: must be a fraction in [0, 1), e.g. 0.10")
    for degree, cap in caps.items():
        if cap is not None and cap < 1:
            raise UserError(f"--max-{degree}={cap}: must be at least 1")
    for degree, cap in caps.items():
        key, name = f"parallel.{degree}", f"--max-{degree}"
        value = getattr(cfg.parallel, degree)
        if key in fixed and cap is not None and value > cap:
            raise UserError(
                f"{key}={value} is fixed on the command line but {name}={cap} allows at most "
                f"{cap}; drop one of them, e.g. {name}={value} or {key}={cap}"
            )
    if is_preference(cfg):
        layout = (
            f"parallel.tp={cfg.parallel.tp} parallel.pp={cfg.parallel.pp} "
            f"zero.stage={cfg.zero.stage} train.micro_batch_size={cfg.train.micro_batch_size}"
        )
        raise UserError(
            f"finetune.objective={cfg.finetune.objective}: plan --search prices steps of single "
            "sequences, not preference pairs (two sequences each) with the reference model's "
            "forward; `llmtrain plan` (without --search) prices those for one layout: the same "
            f"command with the layout's keys, e.g. {layout}"
        )
    problems = _config_errors(cfg)
    if problems:
        hint = (
            f"\n(no layout of backend={cfg.backend.name} fixes these; --any-backend searches every "
            "backend)"
            if any(p.startswith("[backend-capabilities]") for p in problems)
            else ""
        )
        raise UserError(
            "the configuration has errors no layout can fix:\n  " + "\n  ".join(problems) + hint
        )


def search(
    cfg: LLMTrainConfig,
    *,
    top: int = 10,
    min_headroom: float = 0.10,
    max_tp: int | None = None,
    max_pp: int | None = None,
    max_cp: int | None = None,
    max_vpp: int = 8,
    max_micro_batch_size: int | None = None,
    fixed: Iterable[str] = (),
    exhaustive: bool = False,
    rank_given: bool = False,
    max_nodes: int = 1024,
) -> SearchResult:
    """The `top` fastest layouts of `cfg`'s model on its cluster that fit with `min_headroom`.

    `fixed`: dotted keys the user set (see ``fixed_keys``); they keep their configured value.
    `rank_given`: also rank the configuration as given among all fitting layouts (slower: every
    layout faster than it is evaluated). When nothing fits, the smallest cluster that fits is
    searched up to `max_nodes` nodes.
    """
    start = time.perf_counter()
    fixed = frozenset(fixed)
    _check_request(cfg, top, min_headroom, {"tp": max_tp, "pp": max_pp, "cp": max_cp}, fixed)
    space_args: dict[str, object] = {
        "fixed": fixed,
        "max_tp": max_tp,
        "max_pp": max_pp,
        "max_cp": max_cp,
        "max_vpp": max_vpp,
        "max_micro_batch_size": max_micro_batch_size,
    }
    space = search_space(cfg, **space_args)  # type: ignore[arg-type]
    # Priced as `plan` prices (a profile from llmtrain calibrate when one is chosen).
    hw, profile, profile_note = priced_hardware(cfg)
    given, given_status = _given(cfg, min_headroom)
    run = Search(
        space,
        hw,
        min_headroom,
        top,
        exhaustive=exhaustive,
        first_fit=False,
        given=given if rank_given else None,
    )
    run.run()
    best = tuple(_verified(space, c, min_headroom) for c in run.best)
    smallest = None
    notes: list[str] = []
    if not best:
        if run.evaluated:
            smallest, blocked = _smallest_cluster(cfg, space_args, min_headroom, max_nodes)
            if smallest is None:
                why = f": on more nodes, {blocked}" if blocked else ""
                notes.append(f"no layout fits on up to {max_nodes} nodes{why}")
        else:
            notes.append("no layout passes the validation rules; see the rejections")
        if not given_status.startswith(NOT_VALID):  # the savers are tried on a valid config
            notes.append(_saver_note(cfg, hw, min_headroom))
    return SearchResult(
        model=cfg.model.name,
        gpu=hw.name,
        num_nodes=cfg.cluster.num_nodes,
        gpus_per_node=cfg.cluster.gpus_per_node,
        global_batch_size=space.global_batch_size,
        min_headroom=min_headroom,
        top=top,
        candidates=best,
        space_size=space.size(),
        evaluated=run.evaluated,
        fitting=run.fitting,
        timed=run.timed,
        rejected=dict(sorted(run.rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
        smallest_cluster=smallest,
        elapsed_s=time.perf_counter() - start,
        given=given,
        given_status=given_status,
        given_rank=1 + run.better_than_given if rank_given and given is not None else None,
        notes=tuple(notes) + ((profile_note,) if profile_note else ()),
        backends=(cfg.backend.name,),
        pricing=pricing_line(profile),
    )


def search_backends(configs: dict[str, LLMTrainConfig], **options: object) -> SearchResult:
    """`--any-backend`: search each backend's configuration (the same request composed with
    backend=NAME) and rank all their layouts together. The first configuration is the one as
    given (its status heads the report). A backend that cannot run the request at all (a config
    error no layout fixes) is left out with a note; if every one is, the first error is raised."""
    results: list[SearchResult] = []
    skipped: list[str] = []
    first_error: UserError | None = None
    for name, cfg in configs.items():
        try:
            results.append(search(cfg, **options))  # type: ignore[arg-type]
        except UserError as exc:
            first_error = first_error or exc
            lines = str(exc).splitlines()
            reason = (lines[1] if len(lines) > 1 else lines[0]).strip()
            skipped.append(f"backend={name} left out: {reason}")
    if not results:
        assert first_error is not None
        raise UserError("no backend can run this request:\n  " + "\n  ".join(skipped))
    top = results[0].top
    merged = sorted((c for r in results for c in r.candidates), key=Candidate.rank_key)[:top]
    rejected: dict[str, int] = {}
    for r in results:
        for rule, count in r.rejected.items():
            rejected[rule] = rejected.get(rule, 0) + count
    base = results[0]
    return dataclasses.replace(
        base,
        candidates=tuple(merged),
        space_size=sum(r.space_size for r in results),
        evaluated=sum(r.evaluated for r in results),
        fitting=sum(r.fitting for r in results),
        timed=sum(r.timed for r in results),
        rejected=dict(sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
        smallest_cluster=min(
            (r.smallest_cluster for r in results if r.smallest_cluster is not None), default=None
        ),
        elapsed_s=sum(r.elapsed_s for r in results),
        given_rank=None,
        notes=tuple(f"backend={r.backends[0]}: {n}" for r in results for n in r.notes)
        + tuple(skipped),
        backends=tuple(n for r in results for n in r.backends),
    )
