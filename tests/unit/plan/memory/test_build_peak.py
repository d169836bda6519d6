"""The plan prices the build (plan/memory/build_peak.py): each rank's peak while building and
loading beside the steady state, host memory per node, and validate's build-memory rule. Bytes
derived by hand from the mechanism (launcher/train/parallel/build.py) in the comments."""

from __future__ import annotations

import json

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.plan.memory.build_peak import build_peak, largest_tensor
from tests.cli import invoke

GIB = 1024**3
# Llama 3 70B: V 128256 x h 8192 embedding = 1,050,673,152 elements, the largest tensor.
EMBED = 128256 * 8192


def _peak(*overrides: str):  # type: ignore[no-untyped-def]
    cfg = compose_config(list(overrides)).config
    return cfg, build_peak(cfg, derive_layout(cfg), weights=0.0)


def test_fsdp2_lora_holds_one_box_on_the_device_and_whole_tensors_on_the_host() -> None:
    cfg, peak = _peak("recipe=llama3-70b-lora")
    assert largest_tensor(cfg) == EMBED
    # FSDP2 over 8: a box of 1,050,673,152 / 8 = 131,334,144 fp32 elements = 525,336,576 B.
    assert peak.device_transient == 525_336_576
    # Host (the recipe sets train.init_from): the box + the base digest's chunk of rows, read
    # and as fp32, 2 x 64 MiB = 134,217,728 B; x 8 ranks a node.
    assert peak.host_per_rank == 525_336_576 + 134_217_728
    assert peak.host_per_node == 8 * (525_336_576 + 134_217_728)


def test_qlora_without_fsdp_holds_a_block_in_fp32() -> None:
    _, peak = _peak("recipe=llama3-70b-qlora")
    # all-linear, one block: q, o 8192 x 8192 (67,108,864 each); k, v 8192 x 1024 (8,388,608
    # each); gate, up, down 8192 x 28672 (234,881,024 each): 855,638,016 elements at 4 B
    # = 3,422,552,064 B, plus the largest's bf16 copy 469,762,048 B, plus torchao's to_nf4
    # temporaries for it: the scaled bf16 copy (2 B) and the uint8 codes (1 B) a weight,
    # 3 x 234,881,024 = 704,643,072 B, and one 2^20-value chunk's distances to the 16 NF4
    # values, their difference and its absolute value in bf16: 2 x 16 x 2 x 2^20 = 67,108,864 B.
    assert peak.device_transient == 3_422_552_064 + 469_762_048 + 704_643_072 + 67_108_864
    assert peak.mechanism == "a block in fp32 before NF4"


def test_qlora_under_fsdp2_quantizes_on_the_host() -> None:
    _, peak = _peak(
        "recipe=llama3-70b-qlora", "zero.stage=3", "cluster.gpus_per_node=8", "train.init_from=null"
    )
    nf4 = 0.5 + 1 / 64 + 2 / (64 * 256)  # bytes a weight: codes, scalers, factors
    assert peak.device_transient == EMBED / 8 * nf4
    # Host: the whole fp32 tensor, its bf16 copy and NF4, and the box; and to_nf4's
    # temporaries for the largest quantized weight (gate/up/down, 8192 x 28672): 3 B a weight
    # and one chunk's distances, 67,108,864 B (as above).
    temporaries = 3 * 8192 * 28672 + 67_108_864
    assert peak.host_per_rank == EMBED * (4 + 2 + nf4) + EMBED / 8 * 4 + temporaries


def test_init_from_full_training_reads_the_box_alone() -> None:
    _, drawn = _peak("recipe=llama3-70b", "finetune=full", "zero.stage=3")
    _, read = _peak("recipe=llama3-70b", "finetune=full", "zero.stage=3", "train.init_from=/x")
    assert drawn.host_per_rank - read.host_per_rank == EMBED * 4  # no whole tensor drawn


def test_the_70b_recipes_plan_a_build_that_fits() -> None:
    for recipe in ("llama3-70b-qlora", "llama3-70b-lora"):
        done = invoke("plan", f"recipe={recipe}", "--json")
        assert done.returncode == 0, done.stderr
        memory = json.loads(done.stdout)["memory"]
        build = memory["build"]
        assert 0 < build["device_bytes"] <= memory["capacity_bytes"], (recipe, build)
        assert build["host_bytes_per_node"] > 0


# qlora, 2 blocks of h 16384 and ffn 98304 on a 40 GB A100: training fits (36.2 GiB), but one
# block in fp32 before NF4 (5.6e9 elements: 21 GiB) on top of the rest does not.
BIG_BLOCK = [
    "recipe=llama3-70b-qlora",
    "model.num_layers=2",
    "model.hidden_size=16384",
    "model.ffn_hidden_size=98304",
    "model.num_attention_heads=128",
    "cluster.gpu=a100-40gb",
]


def test_validate_refuses_a_build_that_cannot_fit_naming_a_layout_that_does() -> None:
    done = invoke("validate", *BIG_BLOCK, env={"COLUMNS": "300"})
    assert done.returncode == 2, done.stdout + done.stderr
    text = " ".join((done.stdout + done.stderr).split())
    assert "build-memory" in text and "Traceback" not in text, text
    fix = "cluster.gpus_per_node=2 zero.stage=3"
    assert f"would fit (36.2 GiB): {fix}" in text, text
    again = invoke("validate", *BIG_BLOCK, *fix.split(), env={"COLUMNS": "300"})
    assert again.returncode == 0, again.stdout + again.stderr
