"""`plan --search`: equal to brute force; returns only layouts that validate and fit."""

from __future__ import annotations

import io
import json
from collections import Counter
from typing import Any

import pytest
from rich.console import Console

from launcher.config.composition.compose import compose_config
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan.planner import make_plan
from launcher.search.layouts import (
    MEMORY,
    OUTRANKED,
    Choice,
    LayoutSpace,
    SearchResult,
    fixed_keys,
    search,
    search_space,
)
from launcher.validate.rules import check
from launcher.views.search import render_search, search_to_json
from tests.unit.plan.memory.test_build_peak import BIG_BLOCK
from tests.unit.validate.test_plan_fixes_valid import RTX4090_7B

pytestmark = pytest.mark.unit

HEADROOM = 0.10


def compose(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def brute_force(
    space: LayoutSpace, headroom: float
) -> tuple[list[tuple[float, float, str]], int, Counter[str]]:
    """check() + make_plan() on every layout of the grid: ranked fits, memory misses, rules."""
    fits: list[tuple[float, float, str]] = []
    memory = 0
    rules: Counter[str] = Counter()
    for choice in space.choices():
        cfg = space.apply(choice)
        errors = {v.rule for v in check(cfg) if v.is_error}
        mine = space.violated_rule(choice)
        # The search's arithmetic excludes exactly the layouts check() rejects, by a true reason.
        assert (mine is None) == (not errors), (choice, mine, errors)
        if mine is not None:
            assert mine in errors, (choice, mine, errors)
            rules[mine] += 1
            continue
        plan = make_plan(cfg, headroom=headroom)
        if not plan.memory.fits:
            memory += 1
            continue
        line = " ".join(space.overrides(choice))
        fits.append((-plan.time.tokens_per_s, plan.memory.heaviest.device_total, line))
    fits.sort()
    return fits, memory, rules


def ranked(result: SearchResult) -> list[tuple[float, float, str]]:
    return [(-c.tokens_per_s, c.memory_bytes, c.line) for c in result.candidates]


SMALL = [
    # Llama 3.2 1B on one node of 8 H100, torch backend (FSDP: every ZeRO stage with pipelining).
    pytest.param(
        (
            "recipe=llama3-1b",
            "cluster.num_nodes=1",
            "train.global_batch_size=16",
        ),
        {"max_cp": 2, "max_vpp": 2, "max_micro_batch_size": 2},
        id="llama3-1b-8xh100-torch",
    ),
    # Llama 3 8B on 2 nodes x 8 A100-40GB, deepspeed backend (zero >= 2 only without pp, no cp).
    pytest.param(
        (
            "recipe=llama3-8b",
            "cluster=a100-40gb",
            "cluster.num_nodes=2",
            "backend=deepspeed",
            "train.global_batch_size=32",
        ),
        {"max_vpp": 2, "max_micro_batch_size": 2, "max_pp": 4},
        id="llama3-8b-16xa100-deepspeed",
    ),
    # Mixtral 8x7B on 2 nodes x 8 H100: expert parallel among the divisors of 8 and of dp x cp.
    pytest.param(
        (
            "recipe=mixtral-8x7b",
            "cluster=h100-80gb",
            "cluster.num_nodes=2",
            "train.global_batch_size=32",
            "train.recompute=full",
            "parallel.sequence_parallel=true",
        ),
        {"max_vpp": 2, "max_micro_batch_size": 1, "max_cp": 1},
        id="mixtral-16xh100-ep",
    ),
    # The same with Megatron-Core's expert all-to-all overlap: layouts with pp > 1 need virtual
    # stages, and each layout's hidden share depends on its micro-batches (4k tokens: with
    # Megatron's selective recompute, the attention core only, 32k-token layouts do not fit 16).
    pytest.param(
        (
            "recipe=mixtral-8x7b",
            "cluster=h100-80gb",
            "cluster.num_nodes=2",
            "train.global_batch_size=64",
            "train.recompute=selective",
            "backend.moe_comm_overlap=true",
            "model.seq_length=4096",
        ),
        {"max_vpp": 2, "max_micro_batch_size": 2, "max_cp": 1},
        id="mixtral-16xh100-ep-a2a-overlap",
    ),
]


@pytest.mark.parametrize(("overrides", "limits"), SMALL)
def test_search_equals_brute_force(overrides: tuple[str, ...], limits: dict[str, Any]) -> None:
    cfg = compose(*overrides)
    fixed = fixed_keys(overrides[1:])
    space = search_space(cfg, fixed=fixed, **limits)
    fits, memory, rules = brute_force(space, HEADROOM)
    assert fits, "the small cases are chosen so that some layouts fit"
    top = 8
    result = search(cfg, top=top, min_headroom=HEADROOM, fixed=fixed, **limits)
    # Same layouts in the same order, with make_plan's own numbers.
    assert ranked(result) == fits[:top]
    # Every layout of the grid is accounted for.
    assert result.space_size == sum(1 for _ in space.choices())
    assert sum(result.rejected.values()) + result.fitting == result.space_size
    for rule, count in rules.items():
        assert result.rejected[rule] == count
    # Without the bound, every valid layout is evaluated: the memory rejections match too.
    full = search(cfg, top=top, min_headroom=HEADROOM, fixed=fixed, exhaustive=True, **limits)
    assert ranked(full) == fits[:top]
    assert full.rejected.get(MEMORY, 0) == memory
    assert OUTRANKED not in full.rejected
    assert full.fitting == len(fits)
    assert full.evaluated == len(fits) + memory


def test_returned_layouts_compose_validate_and_fit() -> None:
    """The printed override lines, pasted after the recipe, give layouts that pass and fit."""
    base = ("recipe=llama3-8b", "cluster.num_nodes=2")
    result = search(compose(*base), top=3)
    assert len(result.candidates) == 3
    for cand in result.candidates:
        cfg = compose(*base, *cand.overrides)
        assert not [v for v in check(cfg) if v.is_error], cand.line
        plan = make_plan(cfg, headroom=HEADROOM)
        assert plan.memory.fits
        assert plan.time.tokens_per_s == pytest.approx(cand.tokens_per_s, rel=1e-12)
        assert plan.memory.heaviest.device_total == pytest.approx(cand.memory_bytes, rel=1e-12)
        assert cand.headroom >= HEADROOM
    speeds = [c.tokens_per_s for c in result.candidates]
    assert speeds == sorted(speeds, reverse=True)


def test_fixed_keys_and_max_tp_are_respected() -> None:
    overrides = ("recipe=llama3-8b", "cluster.num_nodes=2", "parallel.tp=2", "zero.stage=3")
    fixed = fixed_keys(overrides[1:])
    assert fixed == {"cluster.num_nodes", "parallel.tp", "zero.stage"}
    result = search(compose(*overrides), fixed=fixed, top=5)
    assert result.candidates
    for cand in result.candidates:
        assert cand.choice.tp == 2
        assert cand.choice.zero_stage == 3
        assert cand.overrides[0] == "backend=torch"
    unfixed = search(compose(*overrides), top=5)
    assert {c.choice.zero_stage for c in unfixed.candidates} != {3}
    # Fixed values the backend refuses together (torch's ZeRO-1 is data parallel only, no tp):
    # nothing is proposed.
    refused = search(
        compose(*overrides[:3], "zero.stage=1"), fixed={"zero.stage", "parallel.tp"}, top=5
    )
    assert not refused.candidates and refused.rejected.get("backend-capabilities")
    capped = search(compose("recipe=llama3-8b", "cluster.num_nodes=2"), max_tp=2, top=10)
    assert capped.candidates
    assert all(c.choice.tp <= 2 for c in capped.candidates)
    pp_capped = search(compose("recipe=llama3-8b", "cluster.num_nodes=2"), max_pp=1, top=5)
    assert all(c.choice.pp == 1 for c in pp_capped.candidates)


def test_fixed_keys_parsing() -> None:
    assert fixed_keys(["parallel.tp=8", "+zero.stage=1", "~train.grad_accum", "zero=stage3"]) == {
        "parallel.tp",
        "zero.stage",
        "train.grad_accum",
        "zero.offload_optimizer",
        "zero.offload_params",
    }


def test_impossible_request_reports_the_smallest_cluster() -> None:
    overrides = ("recipe=llama3-70b", "cluster=a100-40gb", "cluster.num_nodes=1")
    result = search(compose(*overrides))
    assert result.candidates == ()
    assert result.fitting == 0
    assert result.rejected[MEMORY] == result.evaluated > 0
    # Not valid as given (world-size): the memory savers are not tried, nor said not to fit.
    assert result.given_status.startswith("not valid")
    assert not [n for n in result.notes if "memory savers" in n], result.notes
    nodes = result.smallest_cluster
    assert nodes is not None and nodes > 1
    # It fits there, and not on one node fewer (the scan went upward from 2 nodes).
    there = search(compose(*overrides[:2], f"cluster.num_nodes={nodes}"), top=1)
    assert there.candidates
    below = compose(*overrides[:2], f"cluster.num_nodes={nodes - 1}")
    assert search(below, top=1, max_nodes=nodes - 1).candidates == ()
    out = io.StringIO()
    render_search(result, Console(file=out, width=200))
    assert f"cluster.num_nodes={nodes}" in out.getvalue()


def test_llama3_405b_published_layout_is_ranked_among_the_fitting_ones() -> None:
    """Llama 3 405B, 8K sequences, 16,384 H100 (Table 4: TP8 PP16 DP128, interleaved)."""
    cfg = compose("recipe=llama3-405b")
    result = search(cfg, rank_given=True)
    assert result.given is not None and result.given_status == "fits"
    assert result.given_rank is not None
    top = result.candidates[0]
    assert top.tokens_per_s >= result.given.tokens_per_s
    # The published layout is in the grid, allowed by the rules, and planned identically there.
    space = search_space(cfg)
    published = Choice(8, 1, 16, 1, 1, "interleaved", 4, "selective", 2, "none", True)
    assert space.violated_rule(published) is None
    plan = make_plan(space.apply(published), headroom=HEADROOM)
    assert plan.layout.dp == 128
    assert plan.memory.fits
    assert plan.time.tokens_per_s == result.given.tokens_per_s
    assert result.given_rank <= result.fitting
    # The rank counts the fitting layouts strictly faster than it: with torch's pipelining
    # reducing FSDP gradients once per step, Meta's layout is near the top (3rd when written).
    assert result.given_rank <= len(result.candidates)
    faster = result.candidates[: result.given_rank - 1]
    assert all(c.tokens_per_s > result.given.tokens_per_s for c in faster)
    assert result.candidates[result.given_rank - 1].tokens_per_s <= result.given.tokens_per_s


def test_json_document_is_stable() -> None:
    result = search(compose("recipe=llama3-1b", "cluster.num_nodes=1"), top=3)
    doc = search_to_json(result)
    assert {"evaluated", "candidates", "rejected", "smallest_cluster", "elapsed_s"} <= set(doc)
    assert doc["smallest_cluster"] is None
    assert len(doc["candidates"]) == 3
    assert set(doc["candidates"][0]) >= {
        "overrides",
        "memory_bytes",
        "step_s",
        "tokens_per_s",
        "mfu",
        "bubble_fraction",
        "headroom",
    }
    json.dumps(doc)
    out = io.StringIO()
    render_search(result, Console(file=out, width=240))
    text = out.getvalue()
    assert result.candidates[0].overrides[0] in text
    assert "Left out" in text


def test_bad_arguments_are_user_errors() -> None:
    cfg = compose("recipe=llama3-1b", "cluster.num_nodes=1")
    with pytest.raises(UserError, match="--top"):
        search(cfg, top=0)
    with pytest.raises(UserError, match="--headroom"):
        search(cfg, min_headroom=1.0)
    with pytest.raises(UserError, match="--max-tp"):
        search(cfg, max_tp=0)
    # A fixed key beyond its cap is a contradiction, not a silent preference for the key.
    fixed = compose("recipe=llama3-1b", "cluster.num_nodes=1", "parallel.tp=8")
    with pytest.raises(UserError, match=r"parallel.tp=8 is fixed .* --max-tp=4"):
        search(fixed, max_tp=4, fixed=["parallel.tp"])
    assert search(fixed, max_tp=8, fixed=["parallel.tp"]).candidates


def h100_profile(path: Any) -> str:
    """A made-up profile of an H100 (cluster.gpu=h100-sxm) for llama3-1b in bf16: two shapes per
    class at different rates, so the search's optimistic bound (the fastest rate of each class)
    differs from the exact lookups it must bound. Written to `path`; returns the override."""
    from launcher.plan.hardware import profile as prof

    tag = {"dtype": "bf16", "threads": 0}
    # A quarter of a millisecond: faster than the catalog's H100 figures, so a bound priced from
    # the catalog would not bound these either.
    ms = 0.25e-3
    doc: dict[str, Any] = {
        "schema": prof.SCHEMA,
        "version": prof.VERSION,
        "device": {"cluster_gpu": "h100-sxm", "kind": "cuda", "name": "NVIDIA H100 (test)"},
        "software": {"torch": "test"},
        "created": "2026-11-27T00:00:00Z",
        # 8192x2048x2048 (1x work) 0.2 ms; 8192x8192x2048 (4x work) 0.5 ms: 1.6x the rate;
        # 16384x2048x2048 (micro-batch 2, 2x work) 0.3 ms: faster per token than micro-batch 1,
        # so micro-batch 1's exact price scaled by 2 would not bound it.
        "gemm": [
            {**tag, "m": 16384, "n": 2048, "k": 2048, "fwd_s": 0.3 * ms, "bwd_s": 0.6 * ms},
            {**tag, "m": 8192, "n": 2048, "k": 2048, "fwd_s": 0.2 * ms, "bwd_s": 0.4 * ms},
            {**tag, "m": 8192, "n": 8192, "k": 2048, "fwd_s": 0.5 * ms, "bwd_s": 1.1 * ms},
        ],
        # seq 4096 is a quarter of seq 8192's work but takes a third of its time.
        "attention": [
            {
                **tag,
                "kind": "flash",
                "batch": 1,
                "heads": 32,
                "kv_heads": 8,
                "seq": seq,
                "head_dim": 64,
                "fwd_s": f * ms,
                "bwd_s": 2.5 * f * ms,
            }
            for seq, f in ((8192, 3.0), (4096, 1.0))
        ],
        "elementwise": [
            {
                **tag,
                "tokens": 8192,
                "hidden": 2048,
                "ffn": 8192,
                "bytes": 4e8,
                "fwd_s": 0.2 * ms,
                "bwd_s": 0.4 * ms,
            },
            {
                **tag,
                "tokens": 4096,
                "hidden": 2048,
                "ffn": 8192,
                "bytes": 2e8,
                "fwd_s": 0.13 * ms,
                "bwd_s": 0.25 * ms,
            },
        ],
        "loss": [
            {**tag, "tokens": 8192, "vocab": 128256, "fwd_s": 2.0 * ms, "bwd_s": 3.0 * ms},
            {**tag, "tokens": 4096, "vocab": 128256, "fwd_s": 1.2 * ms, "bwd_s": 1.6 * ms},
        ],
        "optimizer": [
            {"threads": 0, "params": 1.2e9, "seconds": 20 * ms},
            {"threads": 0, "params": 3e8, "seconds": 8 * ms},
        ],
        "collectives": [],
    }
    doc["digest"] = prof.digest(doc)
    path.write_text(json.dumps(doc))
    return f"cluster.profile={path}"


def test_search_prices_from_the_profile_and_equals_brute_force(tmp_path: Any) -> None:
    """plan --search with a profile: the step times are the profile's (as make_plan prices them,
    the brute force below), the optimistic bound never cuts a layout that belongs in the top k
    (search() raises if a timed layout beats its bound), and the report names the profile."""
    overrides, limits = SMALL[0].values
    profile = h100_profile(tmp_path / "h100.json")
    cfg = compose(*overrides, profile)
    fixed = fixed_keys(overrides[1:])
    space = search_space(cfg, fixed=fixed, **limits)
    fits, _, _ = brute_force(space, HEADROOM)
    result = search(cfg, top=8, min_headroom=HEADROOM, fixed=fixed, **limits)
    assert ranked(result) == fits[:8]
    assert result.pricing.startswith("measured on this machine, profile ")
    assert search_to_json(result)["pricing"] == result.pricing
    # The profile changed the ranking's numbers: without it the step times are the catalog's.
    published = search(compose(*overrides), top=8, min_headroom=HEADROOM, fixed=fixed, **limits)
    assert published.pricing.startswith("priced from published figures")
    assert [c.tokens_per_s for c in published.candidates] != [
        c.tokens_per_s for c in result.candidates
    ]
    out = io.StringIO()
    render_search(result, Console(file=out, width=200))
    assert "measured on this machine" in out.getvalue()


def test_layouts_whose_build_does_not_fit_are_left_out() -> None:
    """validate's build-memory (launcher/validate/build_rules.py): training fits one 40 GB A100
    at 5% headroom (36.2 GiB) but one qlora block in fp32 before NF4 does not (47.3 GiB); the
    search leaves those layouts out by the rule instead of proposing them (it used to stop in
    _verified's AssertionError) and proposes FSDP2 on the one GPU, which quantizes on the host."""
    result = search(compose(*BIG_BLOCK), min_headroom=0.05, top=3)
    assert result.rejected.get("build-memory", 0) >= 1, result.rejected
    assert result.candidates
    for cand in result.candidates:
        assert cand.choice.zero_stage >= 2, cand.line
        assert not [v for v in check(compose(*BIG_BLOCK, *cand.overrides)) if v.is_error]
    out = io.StringIO()
    render_search(result, Console(file=out, width=200))
    assert "rule build-memory" in out.getvalue()


def test_no_layout_fits_names_the_memory_savers_plan_finds() -> None:
    """Issue #40's Llama 2 7B on one RTX 4090: the search varies the layout, not the savers, so
    nothing fits; its report names the savers and what `plan` finds with them, and the scan for
    a larger cluster stops at once on optim.in_backward's one-GPU rule (it scanned 1024 node
    counts, minutes, to say 'no layout fits on up to 1024 nodes')."""
    result = search(compose(*RTX4090_7B), fixed=fixed_keys(RTX4090_7B))
    assert result.candidates == () and result.smallest_cluster is None
    notes = " ".join(result.notes)
    assert "on more nodes, [backend-capabilities] optim.in_backward=true" in notes, notes
    assert "not the memory savers (precision=bf16-pure" in notes, notes
    assert "precision=bf16-pure optim.offload=cpu train.activation_offload=true (20.1 GiB" in notes


@pytest.mark.parametrize("extra", [["cluster=tpu-v4"], ["cluster=a100-40gb", "precision=fp16"]])
def test_preference_objectives_are_refused_by_name_not_with_a_traceback(extra: list[str]) -> None:
    # The search prices single sequences; make_plan prices dpo's pairs and its reference. These
    # two requests used to end in `AssertionError: search and make_plan disagree` (exit 1).
    from tests.cli import invoke

    done = invoke("plan", "--search", "recipe=tiny-dpo-lora", *extra)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "finetune.objective=dpo" in done.stderr and "parallel.tp=" in done.stderr
