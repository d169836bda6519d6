"""What `plan`, `validate` and the search know about finetune=lora|qlora (pure; no torch).

Each expected value is written term by term from launcher/plan/finetune.py's formulas."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.plan import finetune
from launcher.plan.flops import config_flops
from launcher.plan.memory.estimate import stage_states
from launcher.plan.model_shape import ModelShape
from launcher.plan.planner import make_plan
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit

EIGHT_B = ["recipe=llama3-8b", "cluster.num_nodes=1", "cluster.gpus_per_node=1", "zero.stage=0"]
SMALL = ["train.global_batch_size=8", "train.steps=10", "train.tokens=null"]


def _cfg(*overrides: str):  # type: ignore[no-untyped-def]
    return compose_config([*EIGHT_B, *SMALL, *overrides]).config


def test_adapter_parameters_are_r_times_in_plus_out_per_target() -> None:
    cfg = _cfg("finetune=lora", "zero.stage=0", "finetune.rank=16", "finetune.targets=[q,v]")
    h, kv = 4096, 8 * 128  # Llama 3 8B: hidden 4096, 8 kv heads of 128
    per_layer = 16 * (h + h) + 16 * (h + kv)
    assert finetune.adapter_params(cfg) == 32 * per_layer
    # Under tp=2 (both column-parallel): A whole, B split.
    assert finetune.adapter_params_per_layer(cfg, 2) == 16 * (h + h / 2) + 16 * (h + kv / 2)
    o = dataclasses.replace(cfg, finetune=dataclasses.replace(cfg.finetune, targets=["o"]))
    assert finetune.adapter_params_per_layer(o, 2) == 16 * (h / 2 + h)  # row-parallel: A split


def test_frozen_weights_have_no_gradients_or_optimizer_states() -> None:
    full, lora = _cfg(), _cfg("finetune=lora", "zero.stage=0")
    layout = derive_layout(lora)
    total = ModelShape(lora.model).total_params()
    adapters = finetune.adapter_params(lora)
    st = stage_states(lora, layout, 0)
    assert st.weights == pytest.approx(2.0 * total + 4.0 * adapters)  # bf16 base, fp32 adapters
    assert st.gradients == pytest.approx(4.0 * adapters)
    assert st.optimizer == pytest.approx(8.0 * adapters)  # AdamW m and v
    full_st = stage_states(full, derive_layout(full), 0)
    assert full_st.gradients + full_st.optimizer > 50 * (st.gradients + st.optimizer)


def test_qlora_stores_targets_in_nf4() -> None:
    nf4 = finetune.NF4_BYTES_PER_WEIGHT
    assert nf4 == pytest.approx(0.5 + 1 / 64 + 2 / 16384)
    lora = _cfg("finetune=lora", "zero.stage=0", "finetune.targets=[all-linear]")
    qlora = _cfg("finetune=qlora")
    w_lora = stage_states(lora, derive_layout(lora), 0).weights
    w_qlora = stage_states(qlora, derive_layout(qlora), 0).weights
    targets = 32 * finetune.target_weights_per_layer(qlora)
    assert w_lora - w_qlora == pytest.approx(targets * (2.0 - finetune.NF4_BYTES_PER_WEIGHT))


def test_frozen_layers_skip_weight_gradients_in_flops_and_time() -> None:
    full, lora = _cfg(), _cfg("finetune=lora", "zero.stage=0")
    f, t = config_flops(full), config_flops(lora)
    adapters = 3.0 * 32 * finetune.adapter_flops_per_token_layer(lora)
    assert t.matmul == pytest.approx(f.matmul * 2 / 3 + adapters)
    assert make_plan(lora).time.step_s < make_plan(full).time.step_s


def test_lora_plan_is_smaller_and_says_what_trains() -> None:
    full, lora = make_plan(_cfg()), make_plan(_cfg("finetune=lora", "zero.stage=0"))
    assert lora.memory.heaviest.allocated < full.memory.heaviest.allocated
    line = finetune.summary(lora.config)
    assert line is not None and "finetune=lora" in line and "trainable" in line
    assert finetune.summary(full.config) is None


def test_plan_answers_llama3_70b_lora_on_one_node_in_its_first_lines() -> None:
    args = ["plan", "recipe=llama3-70b", "finetune=lora", "cluster=a100-80gb"]
    result = invoke(*args, "cluster.num_nodes=1", env={"COLUMNS": "200"})
    assert result.returncode == 0, shown(result)
    head = "\n".join(shown(result).splitlines()[:8])
    assert "finetune=lora" in head and "trainable of 70.6B" in head, head
    assert "fits" in head or "does not fit" in head or "tight" in head


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["finetune=lora", "finetune.rank=0"], "finetune.rank"),
        (["finetune=lora", "finetune.rank=5000"], "finetune.rank"),
        (["finetune=lora", "finetune.alpha=-1"], "finetune.alpha"),
        (["finetune=lora", "finetune.targets=[qq]"], "finetune.targets"),
        (["finetune=lora", "finetune.targets=[gate]"], "finetune.targets"),  # GELU: no gate
        (["finetune=qlora", "parallel.tp=2", "cluster.gpus_per_node=2"], "parallel.tp=1"),
        (
            ["finetune=qlora", "zero.stage=3", "zero.offload_params=cpu"],
            "zero.offload_params=none",
        ),
        (  # FSDP2 over 6: 8192 rows do not split in 6 (launcher.validate.finetune_rules)
            ["recipe=llama3-70b-qlora", "zero.stage=3", "cluster.gpus_per_node=6"],
            "zero.stage=0",
        ),
        (["finetune=lora", "model.num_experts=4", "model.moe_top_k=2"], "finetune=full"),
        (["finetune=lora", "backend=deepspeed", "parallel.tp=2", "cluster.gpus_per_node=2"], "tp"),
        (
            ["finetune=lora", "parallel.tp=2", "parallel.sequence_parallel=true"],
            "sequence_parallel",
        ),
    ],
)
def test_bad_finetune_keys_exit_2_naming_the_key(overrides: list[str], key: str) -> None:
    result = invoke("validate", *overrides, env={"COLUMNS": "200"})
    assert result.returncode == 2, shown(result)
    assert key in shown(result) and "Traceback" not in shown(result), shown(result)


def test_qlora_runs_under_fsdp2() -> None:
    """The NF4 base sharded by FSDP2 (torchao's NF4 all-gather hooks): 8 x 8192 rows of whole
    NF4 blocks, accepted (before: refused as zero.stage >= 2)."""
    args = ["validate", "recipe=llama3-70b-qlora", "zero.stage=3", "cluster.gpus_per_node=8"]
    result = invoke(*args, env={"COLUMNS": "200"})
    assert result.returncode == 0, shown(result)


def test_search_prices_and_prunes_finetune_layouts() -> None:
    result = invoke(
        "plan",
        "recipe=llama3-8b",
        "finetune=lora",
        "cluster.num_nodes=1",
        "--search",
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, shown(result)
    proposed = [line for line in shown(result).splitlines() if "backend=torch" in line]
    assert proposed, shown(result)
    for line in proposed:  # the engine refuses sequence parallel with adapters under tp
        assert not ("parallel.tp=" in line and "sequence_parallel=true" in line), line


# bench/build_peak.py's model (issue #39) cut to 4 layers: 4 CPU ranks, ZeRO-3 (FSDP2), fp32.
CPU_ZERO3 = [
    "recipe=tiny-sft-lora",
    "train.init_from=null",
    "model.num_layers=4",
    "model.hidden_size=1536",
    "model.ffn_hidden_size=6144",
    "model.num_attention_heads=12",
    "model.seq_length=32",
    "train.micro_batch_size=1",
    "zero.stage=3",
    "backend=torch",
]


@pytest.mark.parametrize("method", ["lora", "full"])
def test_zero3_on_the_cpu_prices_gloos_staging_copy_of_the_gathered_layer(method: str) -> None:
    """Over gloo the all-gather gathers into a flat tensor of its own before copying into
    FSDP2's output (comm_buffers.gloo_staging_layers): 3 gathered layers at the backward
    prefetch, where NCCL (and one rank, no collective) holds 2."""
    from launcher.plan.memory.comm_buffers import gloo_staging_layers, stage_buffers

    ranks = ["train.global_batch_size=4", "cluster.gpus_per_node=4"]
    one = ["train.global_batch_size=1", "cluster.gpus_per_node=1"]
    picked = [f"finetune={method}", *(["finetune.targets=[q,k,v,o]"] if method == "lora" else [])]
    four = compose_config([*CPU_ZERO3, *ranks, *picked]).config
    single = compose_config([*CPU_ZERO3, *one, *picked]).config
    gpu = compose_config([*CPU_ZERO3, "cluster=h100-80gb", *ranks, *picked]).config
    h, ffn = 1536, 6144
    layer = 4 * h * h + 3 * h * ffn + 2 * h  # q, k, v, o; gate, up, down; two RMSNorm weights
    if method == "lora":
        adapters = 4 * 8 * (h + h)  # rank 8 on q, k, v, o: r * (in + out) each
        bucket = 4.0 * min(25_000_000, 4 * adapters)  # the adapters' gradient bucket, fp32
        gathered = 4.0 * layer + 4.0 * adapters  # the frozen layer (fp32 on the CPU) + adapters
        expected = bucket + 3 * gathered + 4.0 * adapters  # + one layer's adapter gradients
    else:
        bucket = 4.0 * min(25_000_000, ModelShape(four.model).total_params())
        expected = bucket + layer * (3 * 4.0 + 4.0)  # 3 gathered layers + one layer's gradients
    assert stage_buffers(four, derive_layout(four)) == pytest.approx(expected)
    assert gloo_staging_layers(four, derive_layout(four)) == 1
    assert gloo_staging_layers(single, derive_layout(single)) == 0
    assert gloo_staging_layers(gpu, derive_layout(gpu)) == 0
