"""Megatron-Core's uneven pipeline splits (launcher/config/pipeline_split.py): the layers of each
virtual stage derived by hand from Megatron-Core's rules, the conditions it refuses, the rules,
renderer, backends, memory, bubble and search that follow them."""

from __future__ import annotations

import pytest

from launcher.backends import raw_refusals
from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.config.pipeline_split import (
    FIRST,
    LAYOUT,
    SplitError,
    SplitKeys,
    accepted_splits,
    balanced_layout,
    bubble_scale,
    layers_in_flight,
    layout_stages,
    megatron_split,
)
from launcher.plan.planner import make_plan
from launcher.plan.schedule import chunk_microbatches_in_flight
from launcher.render.megatron_args import megatron_args
from launcher.search.layouts import fixed_keys, search
from launcher.validate.rules import check

pytestmark = pytest.mark.unit

BOTH = SplitKeys(embedding=True, loss=True)


def stages(chunks: tuple[int, ...], pp: int) -> list[int]:
    return [sum(chunks[s::pp]) for s in range(pp)]


# --- the split, by hand -----------------------------------------------------------------------


def test_embedding_and_loss_counted_as_layers() -> None:
    # Llama 3.1 405B at pp 8 x vpp 8: (126 + 2) / 8 = 16 per stage, / 8 = 2 per virtual stage;
    # the first virtual stage of stage 0 and the last of stage 7 build one fewer: 1 each.
    chunks = megatron_split(126, 8, 8, BOTH)
    assert len(chunks) == 64 and chunks[0] == 1 and chunks[-1] == 1
    assert set(chunks[1:-1]) == {2}
    assert stages(chunks, 8) == [15, 16, 16, 16, 16, 16, 16, 15]
    # Qwen3-235B (94 layers) at pp 8 x vpp 4: 96 / 8 = 12, / 4 = 3; ends 2: stages 11, 12 x 6, 11.
    chunks = megatron_split(94, 8, 4, BOTH)
    assert chunks[0] == 2 and chunks[-1] == 2 and set(chunks[1:-1]) == {3}
    assert stages(chunks, 8) == [11, 12, 12, 12, 12, 12, 12, 11]
    # Embedding alone, no virtual stages: (15 + 1) / 4 = 4 per stage, the first builds 3.
    assert megatron_split(15, 4, 1, SplitKeys(embedding=True)) == (3, 4, 4, 4)


def test_first_and_last_stage_counts() -> None:
    # 61 layers at pp 16: 2 + 3 + 14 middle stages x 4 = 61.
    assert megatron_split(61, 16, 1, SplitKeys(first=2, last=3)) == (2,) + (4,) * 14 + (3,)
    # 126 at pp 16 x vpp 2, first 8, last 6: (126 - 14) / 14 = 8 per middle stage; each virtual
    # stage holds half of its stage: 4 | 4 ... 3.
    chunks = megatron_split(126, 16, 2, SplitKeys(first=8, last=6))
    assert chunks[0] == 4 and chunks[16] == 4 and chunks[15] == 3 and chunks[31] == 3
    assert stages(chunks, 16) == [8] + [8] * 14 + [6]
    # Only the first stage given: (32 - 5) / 3 = 9 per other stage.
    assert megatron_split(32, 4, 1, SplitKeys(first=5)) == (5, 9, 9, 9)


def test_layout_string() -> None:
    # DeepSeek-V3's 61 layers at pp 8 x vpp 4 (no key-based split works: 63 is not divisible
    # by 8, and no first/last pair leaves a multiple of 6 x 4): E + 1 layer, 30 x 2, then L alone.
    assert accepted_splits(61, 8, 4) == (SplitKeys(layout="Et|(tt|)*30L"),)
    chunks = megatron_split(61, 8, 4, SplitKeys(layout="Et|(tt|)*30L"))
    assert chunks == (1,) + (2,) * 30 + (0,)
    # Stage 0 holds chunks 0, 8, 16, 24 = 1 + 2 + 2 + 2; stage 7 chunks 7, 15, 23, 31 = 2+2+2+0.
    assert stages(chunks, 8) == [7, 8, 8, 8, 8, 8, 8, 6]
    # Megatron-Core's own docstring example unrolls to 8 stages (pp 2 x vpp 4).
    assert layout_stages("E|(tt|)*2,(t|)*4,mL") == ("E", "tt", "tt", "t", "t", "t", "t", "mL")
    assert layout_stages("Et*3|t*2") == ("Ettt", "tt")


@pytest.mark.parametrize(("layers", "pp", "vpp"), [(61, 8, 4), (126, 16, 1), (80, 7, 3), (5, 4, 1)])
def test_balanced_layout_round_trips(layers: int, pp: int, vpp: int) -> None:
    chunks = megatron_split(layers, pp, vpp, SplitKeys(layout=balanced_layout(layers, pp, vpp)))
    assert len(chunks) == pp * vpp and sum(chunks) == layers
    # E and L count as one layer each: every virtual stage holds (layers + 2) / chunks, +-1.
    units = list(chunks)
    units[0] += 1
    units[-1] += 1
    assert max(units) - min(units) <= 1


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "keys", "named"),
    [
        (126, 8, 8, SplitKeys(), "model.num_layers"),  # 126 / 64 uneven, no key
        (126, 8, 8, SplitKeys(embedding=True), "parallel.account_for_embedding"),  # 127
        (126, 16, 2, SplitKeys(first=7, last=7), "parallel.vpp"),  # 7 not a multiple of 2
        (126, 16, 1, SplitKeys(first=6, last=6), FIRST),  # 114 / 14 uneven
        (32, 2, 1, SplitKeys(first=10, last=10), FIRST),  # 12 left, no middle stage
        (32, 4, 1, SplitKeys(first=0), FIRST),  # must be > 0
        (32, 4, 1, SplitKeys(first=8, embedding=True), "parallel.account_for_embedding"),
        (32, 4, 1, SplitKeys(layout="E(t*8|)*4L", loss=True), LAYOUT),
        (32, 1, 1, SplitKeys(embedding=True), "parallel.pp"),
        (61, 8, 4, SplitKeys(layout="Et|(tt|)*29L"), LAYOUT),  # 31 stages
        (61, 8, 2, SplitKeys(layout="Et|(tt|)*30L"), "parallel.vpp"),  # 32 = 8 x 4
        (61, 8, 4, SplitKeys(layout="Et*3|(tt|)*29m|L"), LAYOUT),  # no MTP layers here
        (61, 8, 4, SplitKeys(layout="t|(tt|)*30EL"), LAYOUT),  # E not first
        (61, 8, 4, SplitKeys(layout="Et|(tt|)*30tL"), LAYOUT),  # 62 t
        (61, 8, 4, SplitKeys(layout="Ex|(tt|)*30L"), LAYOUT),  # unknown character
    ],
)
def test_megatron_refusals_name_the_key(
    layers: int, pp: int, vpp: int, keys: SplitKeys, named: str
) -> None:
    with pytest.raises(SplitError) as info:
        megatron_split(layers, pp, vpp, keys)
    assert any(k.startswith(named) for k in info.value.keys), info.value.keys


def test_refusal_names_splits_that_work() -> None:
    with pytest.raises(SplitError) as info:
        megatron_split(126, 8, 8, SplitKeys())
    message = info.value.message
    assert "account_for_embedding_in_pipeline_split=true" in message
    assert 'pipeline_layout="Et|(tt|)*62tL"' in message


# --- the schedule on an uneven split --------------------------------------------------------------


def test_layers_in_flight_interleaved_uneven() -> None:
    # pp 2, vpp 2, 4 micro-batches, stage 0 with virtual stages of 1 and 2 layers: warm-up
    # (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards of chunks 0, 0, 1, 1 -> 1 + 1 + 2 + 2 = 6 alive;
    # steady state: +F(chunk 0) = 7 (peak), -B(chunk 1) = 5, +F(0) = 6, -B(1) = 4, +F(1) = 6,
    # -B(0) = 5, +F(1) = 7, -B(0) = 6. Peak 7.
    assert layers_in_flight("interleaved", 2, 4, 2, 0, (1, 2)) == 7
    # Equal chunks: the chunk micro-batches in flight (warm-up + 1 = 5) x 2 layers.
    assert chunk_microbatches_in_flight("interleaved", 2, 4, 2, 0) == 5
    assert layers_in_flight("interleaved", 2, 4, 2, 0, (2, 2)) == 10
    # 1F1B: stage 1 of 4 holds min(m, pp - 1) = 3 micro-batches of its 5 layers.
    assert layers_in_flight("1f1b", 4, 8, 1, 1, (5,)) == 15
    assert layers_in_flight("gpipe", 4, 8, 1, 1, (5,)) == 40


def test_bubble_scale() -> None:
    # Llama 3 405B's 7, 8 x 14, 7: fill and drain cost (126 - 8) / (15 x 8) of an even split's.
    assert bubble_scale((7,) + (8,) * 14 + (7,)) == pytest.approx(118 / 120)
    assert bubble_scale((4, 4, 4)) == 1.0
    assert bubble_scale((6, 10, 10, 6)) == pytest.approx(22 / 30)


# --- through the config: rules, layout, backends, renderer, planner, search -----------------------

L405 = (
    "recipe=llama3-405b",
    "backend=megatron",
    "zero.stage=1",
    "parallel.tp=8",
    "parallel.pp=8",
    "parallel.vpp=8",
    "parallel.pp_schedule=interleaved",
    "parallel.pp_layers=null",
)
E_AND_L = (
    "parallel.account_for_embedding_in_pipeline_split=true",
    "parallel.account_for_loss_in_pipeline_split=true",
)


def cfg_of(*overrides: str):  # type: ignore[no-untyped-def]
    return compose_config(list(overrides)).config


def test_405b_at_pp8_vpp8_is_refused_without_keys_and_accepted_with_them() -> None:
    refusals = [r.message for r in raw_refusals("megatron", cfg_of(*L405))]
    assert any("account_for_embedding_in_pipeline_split=true" in m for m in refusals), refusals
    cfg = cfg_of(*L405, *E_AND_L)
    assert not [v for v in check(cfg) if v.is_error]
    layout = derive_layout(cfg)
    assert layout.explicit_split and layout.stage_layers == (15, 16, 16, 16, 16, 16, 16, 15)
    args = megatron_args(cfg, None, None)
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args
    i = args.index("--num-virtual-stages-per-pipeline-rank")
    assert args[i + 1] == "8"


def test_rule_reports_megatron_conditions() -> None:
    found = [
        v for v in check(cfg_of(*L405, "parallel.account_for_embedding_in_pipeline_split=true"))
    ]
    errors = [v for v in found if v.is_error and v.rule == "pipeline-split"]
    assert errors and "127" in errors[0].message
    both = check(cfg_of(*L405, *E_AND_L, "parallel.pp_layers=[63,63]"))
    assert any("parallel.pp_layers and Megatron-Core" in v.message for v in both if v.is_error)


def test_layout_string_renders_alone() -> None:
    cfg = cfg_of(
        "recipe=deepseek-v3",
        "parallel.pp=8",
        "parallel.vpp=4",
        "parallel.pp_schedule=interleaved",
        "parallel.pp_layers=null",
        "train.global_batch_size=15360",
        "cluster.num_nodes=64",
        "parallel.ep=8",
        'parallel.pipeline_layout="Et|(tt|)*30L"',
    )
    assert not [v.message for v in check(cfg) if v.is_error and v.rule == "pipeline-split"]
    assert derive_layout(cfg).stage_layers == (7, 8, 8, 8, 8, 8, 8, 6)
    args = megatron_args(cfg, None, None)
    i = args.index("--pipeline-model-parallel-layout")
    assert args[i + 1] == "Et|(tt|)*30L"
    assert "--num-virtual-stages-per-pipeline-rank" not in args


def test_deepspeed_refuses_and_torch_follows() -> None:
    base = ("recipe=llama3-8b", "parallel.pp=4", "cluster.num_nodes=1")
    keys = (
        "parallel.num_layers_in_first_pipeline_stage=6",
        "parallel.num_layers_in_last_pipeline_stage=6",
    )
    ds = raw_refusals("deepspeed", cfg_of(*base, "backend=deepspeed", *keys))
    assert any("PipelineModule places the layers itself" in r.message for r in ds)
    cfg = cfg_of(*base, "backend=torch", *keys)
    assert not raw_refusals("torch", cfg)
    assert derive_layout(cfg).chunk_layers == (6, 10, 10, 6)  # (32 - 12) / 2 = 10 in the middle
    # A virtual stage with no transformer layer (L alone) is not built by the torch engine.
    empty = cfg_of(
        *base,
        "backend=torch",
        "parallel.pp=2",
        "parallel.vpp=2",
        "parallel.pp_schedule=interleaved",
        'parallel.pipeline_layout="Et*10|t*11|t*11|L"',
    )
    assert any("needs a transformer layer" in r.message for r in raw_refusals("torch", empty))


def test_memory_and_bubble_follow_the_actual_split() -> None:
    # llama3-8b, pp 4 with first = last = 6: stages 6, 10, 10, 6. 1F1B holds min(m, 4 - s)
    # micro-batches: 6 x 4 = 24, 10 x 3 = 30, 10 x 2 = 20, 6 x 1 = 6 layer-forwards.
    cfg = cfg_of(
        "recipe=llama3-8b",
        "backend=torch",
        "cluster.num_nodes=1",
        "parallel.pp=4",
        "train.recompute=none",
        "train.global_batch_size=32",
        "parallel.num_layers_in_first_pipeline_stage=6",
        "parallel.num_layers_in_last_pipeline_stage=6",
    )
    plan = make_plan(cfg)
    acts = [s.activations for s in plan.memory.stages]
    assert acts[1] / acts[0] == pytest.approx(30 / 24)
    assert acts[2] / acts[0] == pytest.approx(20 / 24)
    # Bubble: (p - 1) / m of the heaviest stage's time, scaled by (32 - 10) / (3 x 10).
    t = plan.time
    m = derive_layout(cfg).num_microbatches
    assert t.bubble_s == pytest.approx(t.microbatch_s * m * (3 / m) * 22 / 30)


def test_search_proposes_the_split_megatron_accepts() -> None:
    fixed = ("parallel.tp=8", "parallel.cp=1", "train.micro_batch_size=1", "train.recompute=full")
    result = search(cfg_of(*L405, *fixed), fixed=fixed_keys([*L405[1:], *fixed]), top=2)
    assert result.candidates
    for cand in result.candidates:
        assert "parallel.account_for_embedding_in_pipeline_split=true" in cand.overrides
        assert "parallel.account_for_loss_in_pipeline_split=true" in cand.overrides


def test_interleaved_memory_counts_the_lighter_first_virtual_stage() -> None:
    # 405B at pp 8 x vpp 8 with E and L counted, dp 256, 2048 / 256 = 8 micro-batches: 64
    # chunk forwards per stage, fewer than the warm-up (stage 0: 2 x 7 + 7 x 8 = 70; stage 1: 68),
    # so all are alive at the peak: stage 0 holds 8 x 15 layers, stage 1 8 x 16 (the old count,
    # the largest virtual stage x chunks in flight, gave stage 0 8 x 8 x 2 = 128 too).
    plan = make_plan(cfg_of(*L405, *E_AND_L, "train.recompute=none"))
    acts = [s.activations for s in plan.memory.stages]
    assert acts[0] / acts[1] == pytest.approx(120 / 128)


def test_megatron_renders_the_automatic_first_last_split() -> None:
    # 126 layers at pp 16 without virtual stages and without keys: the automatic split is 7,
    # 8 x 14, 7 (equal inner stages), which Megatron-LM takes as first/last stage counts; it
    # rendered no split flag before, and Megatron-LM would have refused 126 % 16.
    cfg = cfg_of(
        "recipe=llama3-405b",
        "backend=megatron",
        "zero.stage=1",
        "parallel.pp_layers=null",
        "parallel.vpp=1",
        "parallel.pp_schedule=1f1b",
    )
    assert not raw_refusals("megatron", cfg)
    args = megatron_args(cfg)
    i = args.index("--decoder-first-pipeline-num-layers")
    j = args.index("--decoder-last-pipeline-num-layers")
    assert (args[i + 1], args[j + 1]) == ("7", "7")
    # An automatic split with unequal inner stages is refused with the keys that work.
    # 30 layers at pp 7: 32 slots / 7 = 4 rest 4, the 4 extra slots to 4 of the 5 middle stages,
    # the ends give back their slot -> 3, 5, 5, 5, 5, 4, 3 (inner stages unequal).
    odd = cfg_of(
        "recipe=llama3-8b",
        "backend=megatron",
        "model.num_layers=30",
        "parallel.pp=7",
        "cluster.num_nodes=7",
    )
    found = [r.message for r in raw_refusals("megatron", odd)]
    assert any("splits that work" in m for m in found), found


@pytest.mark.parametrize(
    ("layers", "pp", "vpp"), [(61, 16, 1), (30, 7, 1), (126, 16, 2), (80, 4, 2)]
)
def test_first_last_suggestion_is_the_most_even(layers: int, pp: int, vpp: int) -> None:
    # Every first/last pair Megatron-Core takes, by brute force: the suggested one has the
    # smallest heaviest stage.
    def heaviest(keys: SplitKeys) -> int:
        return max(stages(megatron_split(layers, pp, vpp, keys), pp))

    counts = [None, *range(vpp, layers + 1, vpp)]
    best = min(
        heaviest(SplitKeys(first=f, last=t))
        for f in counts
        for t in counts
        if (f, t) != (None, None) and _takes(layers, pp, vpp, SplitKeys(first=f, last=t))
    )
    chosen = [k for k in accepted_splits(layers, pp, vpp) if k.first or k.last]
    assert chosen and heaviest(chosen[0]) == best


def _takes(layers: int, pp: int, vpp: int, keys: SplitKeys) -> bool:
    try:
        megatron_split(layers, pp, vpp, keys, explain=False)
    except SplitError:
        return False
    return True
