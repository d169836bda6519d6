"""Best-first search over one layout space (launcher/search/space.py): the groups of layouts the
rules allow, visited in decreasing order of a bound on tokens/s, memory before time (the module
docstring of launcher/search/layouts.py explains the bounds and the memoised parts)."""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any

from launcher.backends.common import expert_tensor_parallel
from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.flops import FlopsPerToken, config_flops
from launcher.plan.memory.estimate import (
    HardwareView,
    MemoryPlan,
    StageMemory,
    StageParams,
    StageStates,
    assemble_stage,
    stage_activations,
    stage_buffers,
    stage_not_coexisting,
    stage_params,
    stage_states,
)
from launcher.plan.memory.grad_liveness import reserved_reuses_activations
from launcher.plan.schedule import bubble_overhead
from launcher.plan.timing.estimate import estimate_time, microbatch_compute_s, microbatch_time
from launcher.search.results import MEMORY, OUTRANKED, Candidate, candidate
from launcher.search.space import (
    BASE,
    CP,
    DP,
    EP,
    FREE,
    MBS,
    MICROBATCHES,
    PP,
    SCHEDULE,
    TP,
    Choice,
    LayoutSpace,
)
from launcher.validate.build_rules import build_overflow

# A group: layouts that share everything but the ZeRO stage and offload, and so share the bounds
# on tokens/s. Fields: tp, cp, pp, dp, ep, micro-batch, micro-batches, schedule, vpp, recompute,
# sequence parallel, the allowed (zero stage, offload) pairs.
Group = tuple[int, int, int, int, int, int, int, str, int, str, bool, tuple[tuple[int, str], ...]]

# The rule a layout whose build does not fit is left out by (launcher/validate/build_rules.py).
BUILD_MEMORY = "build-memory"

# Relative slack on the bound, so that rounding never prunes a layout that ties the k-th best.
BOUND_SLACK = 1e-9


class Search:
    """One search over one space: memoized parts, counters, the best layouts found.

    `first_fit` (with `exhaustive`) only answers whether any layout fits (``fitting``): it asks
    the backend's refusals after memory, of the few layouts that fit, so its rejection counts
    differ from a full search's and are never reported.
    """

    def __init__(
        self,
        space: LayoutSpace,
        hw: HardwareView,
        headroom: float,
        top: int,
        *,
        exhaustive: bool,
        first_fit: bool,
        given: Candidate | None,
    ) -> None:
        self.space = space
        self.hw = hw
        self.headroom = headroom
        self.top = top
        self.exhaustive = exhaustive
        self.first_fit = first_fit
        self.given = given
        self.usable = MemoryPlan((), float(hw.memory_bytes), headroom).usable
        self.rejected: dict[str, int] = {}
        self.evaluated = 0
        self.fitting = 0
        self.timed = 0
        self.better_than_given = 0
        self.best: list[Candidate] = []
        self.threshold = -math.inf
        self._flops: dict[str, FlopsPerToken] = {}
        self._unit_compute: dict[tuple[int, str, int, str], float] = {}
        self._states: dict[tuple[int, ...], tuple[StageStates, ...]] = {}
        self._states_bound: dict[tuple[int, ...], float] = {}
        self._acts: dict[tuple[object, ...], tuple[float, int]] = {}
        self._params: dict[tuple[int, ...], StageParams] = {}
        self._layers: dict[tuple[int, int], tuple[int, ...]] = {}
        self._built: dict[tuple[object, ...], tuple[LLMTrainConfig, Layout]] = {}
        self._tight: dict[tuple[object, ...], float] = {}
        self._bufs: dict[tuple[object, ...], float] = {}

    def reject(self, rule: str, count: int) -> None:
        if count:
            self.rejected[rule] = self.rejected.get(rule, 0) + count

    def flops(self, recompute: str) -> FlopsPerToken:
        if recompute not in self._flops:
            self._flops[recompute] = config_flops(self.space.base, recompute)
        return self._flops[recompute]

    # Bound ---------------------------------------------------------------------------------------
    def unit_compute_s(self, pp: int, sched: str, vpp: int, recompute: str) -> float:
        """Compute of one micro-batch on the heaviest stage at tp = cp = 1, one sequence."""
        key = (pp, sched, vpp, recompute)
        if key not in self._unit_compute:
            choice = Choice(1, 1, pp, 1, 1, sched, vpp, recompute, 0, "none", False)
            cfg = self.space.apply(choice)
            layout = derive_layout(cfg)
            seconds, _, _ = microbatch_compute_s(cfg, layout, self.hw, self.flops(recompute))
            self._unit_compute[key] = seconds
        return self._unit_compute[key]

    def bound(
        self, tp: int, cp: int, pp: int, mbs: int, m: int, sched: str, vpp: int, recompute: str
    ) -> float:
        """Upper bound on tokens/s: the step is at least m x compute x (1 + bubble overhead)."""
        compute = self.unit_compute_s(pp, sched, vpp, recompute) * mbs / (cp * tp)
        bubble = bubble_overhead(pp, m, vpp) * self.space.bubble_scale(pp, vpp)
        step = compute * m * (1.0 + bubble)
        tokens = self.space.global_batch_size * self.space.base.model.seq_length
        return tokens / step * (1.0 + BOUND_SLACK) if step > 0 else math.inf

    def base(self, g: Group) -> tuple[LLMTrainConfig, Layout]:
        """The configuration and layout of a group's first layout (the others differ in zero)."""
        key = g[:11]
        if key not in self._built:
            tp, cp, pp, _, ep, mbs, _, sched, vpp, r, sp, free = g
            z, off = free[0]
            self._built[key] = self.build(Choice(tp, cp, pp, ep, mbs, sched, vpp, r, z, off, sp))
        return self._built[key]

    def tight_bound(self, g: Group) -> float:
        """Upper bound on tokens/s with the exposed per-micro-batch communication counted too.

        Computed at one sequence per micro-batch and scaled by the micro-batch size: every term
        of ``timing.microbatch_time`` (compute, the TP/EP/PP messages, the CP ring and the
        attention it hides behind) is proportional to the tokens of a micro-batch.
        """
        tp, cp, pp, dp, ep, mbs, m, sched, vpp, r, sp, free = g
        key = (tp, cp, pp, dp, ep, vpp, r, sp)  # gpipe and 1f1b time the same
        if key not in self._tight:
            z, off = free[0]
            cfg, layout = self.build(Choice(tp, cp, pp, ep, 1, sched, vpp, r, z, off, sp))
            per_mb = microbatch_time(cfg, layout, self.hw, self.flops(r))
            self._tight[key] = per_mb.compute_s + per_mb.exposed_s
        bubble = bubble_overhead(pp, m, vpp) * self.space.bubble_scale(pp, vpp)
        step = self._tight[key] * mbs * m * (1.0 + bubble)
        tokens = self.space.global_batch_size * self.space.base.model.seq_length
        return tokens / step * (1.0 + BOUND_SLACK) if step > 0 else math.inf

    # Enumeration ---------------------------------------------------------------------------------
    def groups(self) -> list[tuple[float, Group]]:
        """Every group the rules allow with its compute bound, counting the excluded layouts
        against the rule that excludes them (``LayoutSpace.refused``, level by level)."""
        sp = self.space
        rule = sp.refused(BASE, {})
        if rule:
            self.reject(rule, sp.size())
            return []
        sched_total = sum(len(sp.schedules(pp)) for pp in sp.pp)
        out: list[tuple[float, Group]] = []
        for tp in sp.tp:
            # Layouts under one (tp, cp): every schedule, ep, micro-batch, recompute and free value.
            per_cp = sched_total * len(sp.ep) * len(sp.micro_batch_size) * len(sp.recompute)
            per_cp *= len(sp.free_options(tp))
            if self.pruned(TP, {"tp": tp}, len(sp.cp) * per_cp):
                continue
            for cp in sp.cp:
                if self.pruned(CP, {"tp": tp, "cp": cp}, per_cp):
                    continue
                for pp in sp.pp:
                    out += self.pipeline_groups({"tp": tp, "cp": cp, "pp": pp})
        return out

    def pruned(self, level: int, values: dict[str, Any], count: int) -> bool:
        """True (and the `count` layouts under `values` counted) when a rule of this level
        refuses them."""
        rule = self.space.refused(level, values)
        if rule:
            self.reject(rule, count)
        return rule is not None

    def pipeline_groups(self, values: dict[str, Any]) -> list[tuple[float, Group]]:
        """The groups under one (tp, cp, pp): dp derived, then every ep and micro-batch size."""
        sp = self.space
        tp, cp, pp = values["tp"], values["cp"], values["pp"]
        per_mbs = len(sp.schedules(pp)) * len(sp.recompute) * len(sp.free_options(tp))
        per_pp = len(sp.ep) * len(sp.micro_batch_size) * per_mbs
        if self.pruned(PP, values, per_pp):
            return []
        dp = sp.dp_of(tp, cp, pp)
        if dp is None:
            raise AssertionError(f"tp={tp} cp={cp} pp={pp} passed the world-size rule without dp")
        values = {**values, "dp": dp}
        if self.pruned(DP, values, per_pp):
            return []
        out: list[tuple[float, Group]] = []
        for ep in sp.ep:
            with_ep = {**values, "ep": ep}
            if self.pruned(EP, with_ep, len(sp.micro_batch_size) * per_mbs):
                continue
            for mbs in sp.micro_batch_size:
                with_mbs = {**with_ep, "micro_batch_size": mbs}
                if self.pruned(MBS, with_mbs, per_mbs):
                    continue
                with_mbs["microbatches"] = sp.microbatches(mbs, dp)
                if with_mbs["microbatches"] is None:
                    raise AssertionError(f"{with_mbs} passed the batch rules without micro-batches")
                if self.pruned(MICROBATCHES, with_mbs, per_mbs):
                    continue
                out += self.schedule_groups(with_mbs)
        return out

    def schedule_groups(self, values: dict[str, Any]) -> list[tuple[float, Group]]:
        """The groups under one layout fixed through its micro-batches: every schedule the rules
        allow, every recomputation, and the free values (sequence parallel, ZeRO, offload) the
        rules and the backend allow."""
        sp = self.space
        tp, cp, pp, dp, ep = (values[k] for k in ("tp", "cp", "pp", "dp", "ep"))
        mbs, m, n_r = values["micro_batch_size"], values["microbatches"], len(sp.recompute)
        frees = sp.free_options(tp)
        scheds, refused = sp.allowed(SCHEDULE, values, sp.schedules(pp))
        for rule, count in refused.items():
            self.reject(rule, count * n_r * len(frees))
        out: list[tuple[float, Group]] = []
        for sched, vpp in scheds:
            kept, refused = sp.allowed(FREE, {**values, "pp_schedule": sched, "vpp": vpp}, frees)
            for rule, count in refused.items():
                self.reject(rule, count * n_r)
            free: list[tuple[bool, tuple[tuple[int, str], ...]]] = []
            for s in sp.sequence_parallel(tp):
                pairs = tuple((z, off) for s_, z, off in kept if s_ == s)
                if pairs:
                    free.append((s, pairs))
            # First fit asks the backend only about layouts that fit.
            runnable = free
            if not self.first_fit:
                runnable = self.backend_pairs(tp, cp, pp, ep, mbs, m, sched, vpp, free)
            for r in sp.recompute:
                ub = self.bound(tp, cp, pp, mbs, m, sched, vpp, r)
                for s, pairs_t in runnable:
                    out.append((ub, (tp, cp, pp, dp, ep, mbs, m, sched, vpp, r, s, pairs_t)))
        return out

    def backend_pairs(
        self,
        tp: int,
        cp: int,
        pp: int,
        ep: int,
        mbs: int,
        m: int,
        sched: str,
        vpp: int,
        free: list[tuple[bool, tuple[tuple[int, str], ...]]],
    ) -> list[tuple[bool, tuple[tuple[int, str], ...]]]:
        """The (sequence parallel, zero/offload pairs) the backend runs; the others are counted
        (once per recomputation choice) against backend-capabilities."""
        sp = self.space
        out = []
        refused = 0
        for s, pairs in free:
            kept = []
            for z, off in pairs:
                choice = Choice(tp, cp, pp, ep, mbs, sched, vpp, "none", z, off, s)
                if sp.backend_rule(choice, m):
                    refused += 1
                else:
                    kept.append((z, off))
            if kept:
                out.append((s, tuple(kept)))
        self.reject("backend-capabilities", refused * len(sp.recompute))
        return out

    # Evaluation ----------------------------------------------------------------------------------
    def run(self) -> None:
        groups = self.groups()
        if self.exhaustive:
            for ub, g in groups:
                self.evaluate_group(g, ub)
                if self.first_fit and self.fitting:
                    return
            self.trim()
            return
        # Best first: pop the largest bound; a compute-only bound is first tightened with the
        # group's communication and pushed back; a tight bound is evaluated. Stop when the
        # largest bound cannot reach the k-th best.
        heap: list[tuple[float, int, int, Group]] = [
            (-ub, 0, i, g) for i, (ub, g) in enumerate(groups)
        ]
        heapq.heapify(heap)
        while heap:
            neg, tight, i, g = heap[0]
            if -neg < self.cutoff():
                self.reject(OUTRANKED, sum(len(item[3][11]) for item in heap))
                break
            heapq.heappop(heap)
            if not tight:
                if self.overflows(g):
                    continue
                heapq.heappush(heap, (-min(-neg, self.tight_bound(g)), 1, i, g))
                continue
            self.evaluate_group(g, -neg)
            self.trim()
        self.trim()

    def cutoff(self) -> float:
        if self.given is not None:
            return min(self.threshold, self.given.tokens_per_s)
        return self.threshold

    def trim(self) -> None:
        if len(self.best) >= self.top:
            self.best.sort(key=Candidate.rank_key)
            del self.best[self.top :]
            self.threshold = self.best[-1].tokens_per_s

    def overflows(self, g: Group) -> bool:
        """True (and counted) when the model states alone overflow for every pair of the group.

        Only looks at states already computed for other groups, so it costs no planning.
        """
        tp, cp, pp, dp, ep, _, _, _, vpp, _, _, pairs = g
        for zero, offload in pairs:
            bound = self._states_bound.get((tp, cp, pp, vpp, ep, dp, zero, offload == "cpu"))
            if bound is None or bound <= self.usable:
                return False
        self.evaluated += len(pairs)
        self.reject(MEMORY, len(pairs))
        return True

    def evaluate_group(self, g: Group, bound: float) -> None:
        if self.overflows(g):
            return
        cfg, layout = self.base(g)
        self._built.pop(g[:11], None)
        for zero, offload in g[11]:
            self.evaluate(g, zero, offload, bound, cfg, layout)
            if self.first_fit and self.fitting:
                return

    def evaluate(
        self,
        g: Group,
        zero: int,
        offload: str,
        bound: float,
        base_cfg: LLMTrainConfig,
        layout: Layout,
    ) -> None:
        """Memory (stopping at the first stage that overflows), then time if it fits."""
        tp, cp, pp, dp, ep, mbs, m, sched, vpp, r, sp, _ = g
        self.evaluated += 1
        cfg: LLMTrainConfig | None = None
        if base_cfg.zero.stage == zero and base_cfg.zero.offload_optimizer == offload:
            cfg = base_cfg

        def with_zero() -> LLMTrainConfig:
            zc = dataclasses.replace(base_cfg.zero, stage=zero, offload_optimizer=offload)
            return dataclasses.replace(base_cfg, zero=zc)

        skey = (tp, cp, pp, vpp, ep, dp, zero, offload == "cpu")
        if skey not in self._states_bound:
            cfg = cfg or with_zero()
            self.states_for(skey, cfg, layout)
        if self._states_bound[skey] > self.usable:
            self.reject(MEMORY, 1)
            return
        states = self._states[skey]
        bkey = (zero, sp, mbs, tp, cp, pp, ep)  # ZeRO-3 gathers 1/ep of the experts
        if bkey not in self._bufs:
            cfg = cfg or with_zero()
            self._bufs[bkey] = stage_buffers(cfg, layout)
        buffers = self._bufs[bkey]
        layers = self.stage_layers(layout)
        stages: list[StageMemory | None] = [None] * pp
        for stage in (0, *range(pp - 1, 0, -1)):
            # ep: the MoE dispatcher's buffers (memory.dispatcher_bytes).
            # The ZeRO stage too: FSDP2 (2, 3) keeps a bf16 residual stream where autocast keeps
            # an fp32 one (layer_activations.residual_stream).
            akey = (mbs, m, tp, cp, pp, vpp, ep, sched, sp, r, stage, zero)
            act = self._acts.get(akey)
            if act is None:
                cfg = cfg or with_zero()
                act = self._acts[akey] = stage_activations(cfg, layout, stage)
            lazy, reused = 0.0, True
            # Gradients made during the backward (plan/memory/grad_liveness.py).
            if layout.pp == 1 and layout.num_microbatches == 1:
                cfg = cfg or with_zero()
                lazy = stage_not_coexisting(cfg, layout, stage, states[stage], buffers)
                reused = reserved_reuses_activations(cfg)
            mem = assemble_stage(
                stage, layers[stage], self.hw, states[stage], act, buffers, lazy, reused
            )
            if mem.device_total > self.usable:
                self.reject(MEMORY, 1)
                return
            stages[stage] = mem
        memory = MemoryPlan(
            tuple(s for s in stages if s is not None), float(self.hw.memory_bytes), self.headroom
        )
        choice = Choice(tp, cp, pp, ep, mbs, sched, vpp, r, zero, offload, sp)
        # validate's build-memory: training fits, but building the model on the device does not.
        cfg = cfg or with_zero()
        if build_overflow(cfg, layout, memory.heaviest, float(self.hw.memory_bytes)):
            self.reject(BUILD_MEMORY, 1)
            return
        if self.first_fit:
            # groups() left the backend's refusals to here: asked only of layouts that fit.
            rule = self.space.backend_rule(choice, m)
            if rule:
                self.reject(rule, 1)
                return
            self.fitting += 1
            return
        self.fitting += 1
        timing = estimate_time(cfg, layout, self.hw, self.flops(r), memory.stages)
        self.timed += 1
        if timing.tokens_per_s > bound:
            raise AssertionError(
                f"search bound violated for {choice}: {timing.tokens_per_s} > {bound} tokens/s"
            )
        if self.given is not None and (
            timing.tokens_per_s > self.given.tokens_per_s
            or (
                timing.tokens_per_s == self.given.tokens_per_s
                and memory.heaviest.device_total < self.given.memory_bytes
            )
        ):
            self.better_than_given += 1
        if timing.tokens_per_s < self.threshold:
            return
        self.best.append(candidate(choice, self.space.overrides(choice), dp, m, memory, timing))

    def build(self, choice: Choice) -> tuple[LLMTrainConfig, Layout]:
        cfg = self.space.apply(choice)
        return cfg, derive_layout(cfg)

    def stage_layers(self, layout: Layout) -> tuple[int, ...]:
        key = (layout.pp, layout.vpp)
        if key not in self._layers:
            self._layers[key] = layout.stage_layers
        return self._layers[key]

    def states_for(self, skey: tuple[int, ...], cfg: LLMTrainConfig, layout: Layout) -> None:
        """The model states of every stage, and the memory they alone take on the heaviest.

        Activations and buffers are never negative: the states alone bound the memory below. The
        stages likeliest to be heaviest (the first and last, with the embedding and the output
        layer, and one with the most layers) are looked at first; when one of them already
        overflows, that partial maximum is the bound (still a lower bound on the layout's memory)
        and the other stages are never computed.
        """
        layers = self.stage_layers(layout)

        def one(s: int) -> StageStates:
            # The expert tensor parallel size folds in dp x cp (backends.expert_tensor_parallel).
            etp = expert_tensor_parallel(cfg, layout)
            pkey = (layout.tp, layout.ep, etp, layout.pp, layout.vpp, s)
            if pkey not in self._params:
                self._params[pkey] = stage_params(cfg, layout, s)
            return stage_states(cfg, layout, s, self._params[pkey])

        def alone(s: int, st: StageStates) -> float:
            # Gradients made during the backward may never coexist with the rest (memory.
            # stage_not_coexisting): leaving them out keeps the bound a lower bound.
            lazy = st.gradients if layout.pp == 1 and layout.num_microbatches == 1 else 0.0
            return assemble_stage(s, layers[s], self.hw, st, (0.0, 0), 0.0, lazy).device_total

        probe = {s: one(s) for s in {0, layout.pp - 1, layers.index(max(layers))}}
        bound = max(alone(s, st) for s, st in probe.items())
        if bound > self.usable:
            self._states_bound[skey] = bound
            return
        states = tuple(probe[s] if s in probe else one(s) for s in range(layout.pp))
        self._states[skey] = states
        self._states_bound[skey] = max(alone(s, st) for s, st in enumerate(states))
