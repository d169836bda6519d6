"""What validate refuses of preference training (exit 2, the key named, a value that works) and
what plan prices: both sequences of a pair, and the LoRA reference's forward."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from tests.cli import invoke

DPO = ["recipe=tiny-dpo-lora", "train.init_from=null"]


@pytest.mark.parametrize(
    ("extra", "key", "fix"),
    [
        (["data.packing=true"], "data.packing", "data.packing=false"),
        (["data.builtin=chat"], "data.builtin", "data.builtin=preference"),
        (["finetune.objective=sft"], "finetune.objective", "finetune.objective=dpo"),
        (["finetune=full", "finetune.objective=dpo", "data.builtin=preference",
          "data.packing=false", "finetune.reference=adapters-off"],
         "finetune.reference", "finetune.reference=precomputed"),
        (["finetune=full", "finetune.objective=dpo", "data.builtin=preference",
          "data.packing=false", "train.eval_every=10"], "train.eval_every", "train.eval_every=0"),
        # auto's pick named, and the reference that serves evaluation offered.
        (["finetune=full", "finetune.objective=dpo", "data.builtin=preference",
          "data.packing=false", "train.eval_every=10"], "finetune.reference=auto picks precomputed",
         "finetune.reference=copy"),
        (["finetune.reference=copy"], "finetune.reference", "finetune.reference=adapters-off"),
        (["finetune.loss_type=ipo", "finetune.label_smoothing=0.1"], "finetune.label_smoothing",
         "finetune.label_smoothing=0"),
        (["parallel.pp=2", "cluster.gpus_per_node=2", "model.tie_embeddings=false"],
         "parallel.pp", "parallel.pp=1"),
        (["parallel.cp=2", "cluster.gpus_per_node=2"], "parallel.cp", "parallel.cp=1"),
        (["backend=deepspeed", "parallel.tp=2", "cluster.gpus_per_node=2"], "parallel.tp",
         "parallel.tp=1"),
        (["backend=megatron"], "backend=megatron", "backend=torch"),
    ],
)  # fmt: skip
def test_validate_refuses_what_cannot_run(extra: list[str], key: str, fix: str) -> None:
    done = invoke("validate", *DPO, *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    text = " ".join((done.stdout + done.stderr).split())
    assert key in text and fix in text
    assert "Traceback" not in text


def test_the_recipe_and_its_relatives_validate() -> None:
    full = ["finetune=full", "finetune.objective=dpo", "data.builtin=preference"]
    relatives = [
        [],
        ["finetune.objective=simpo", "finetune.beta=2.0"],
        ["finetune.objective=orpo"],
        [*full, "data.packing=false"],
        [*full, "data.packing=false", "finetune.reference=copy", "train.eval_every=10"],
    ]
    for extra in relatives:
        done = invoke("validate", *DPO, *extra)
        assert done.returncode == 0, done.stdout + done.stderr


def test_plan_prices_two_sequences_a_pair_and_the_reference() -> None:
    dpo = make_plan(compose_config(DPO).config)
    # The same step on the same pairs without a reference (simpo): the reference's forward is
    # the difference in step time; the same memory (no weights, no saved activations).
    simpo = make_plan(compose_config([*DPO, "finetune.objective=simpo"]).config)
    assert dpo.time.step_s > simpo.time.step_s
    assert dpo.memory.heaviest.device_total == pytest.approx(simpo.memory.heaviest.device_total)
    # Two sequences a pair: the activations of sft on micro-batches of 2 x 8 sequences (the same
    # model and full-logits loss).
    sft = make_plan(
        compose_config([*DPO, "finetune.objective=sft", "train.chunked_loss=false",
                        "train.micro_batch_size=16", "train.global_batch_size=16"]).config
    )  # fmt: skip
    assert simpo.memory.heaviest.activations == pytest.approx(sft.memory.heaviest.activations)
    assert simpo.time.tokens_per_s == pytest.approx(sft.time.tokens_per_s)


def test_plan_prices_the_reference_copy() -> None:
    """finetune.reference=copy: its weights in each rank's memory (fp32 on the CPU, the frozen
    dtype elsewhere; sharded over dp under FSDP2 / ZeRO-3) and its forward in the step;
    precomputed: neither. The plan's line says what auto picked."""
    full = [*DPO, "finetune=full", "data.packing=false"]
    pre = make_plan(compose_config(full).config)
    copy = make_plan(compose_config([*full, "finetune.reference=copy"]).config)
    params = pre.total_params
    added = copy.memory.heaviest.weights - pre.memory.heaviest.weights
    assert added == pytest.approx(params * 4)  # cluster=cpu: fp32
    assert copy.time.step_s > pre.time.step_s
    # On GPUs under FSDP2 (zero.stage=3) over 8 ranks: bf16, an eighth a rank.
    gpu = [*full, "cluster=h100-80gb", "cluster.gpus_per_node=8", "precision=bf16", "zero.stage=3",
           "train.global_batch_size=64"]  # fmt: skip
    pre8 = make_plan(compose_config(gpu).config)
    copy8 = make_plan(compose_config([*gpu, "finetune.reference=copy"]).config)
    added8 = copy8.memory.heaviest.weights - pre8.memory.heaviest.weights
    assert added8 == pytest.approx(params * 2 / 8)
    text = " ".join(invoke("plan", *full).stdout.split())
    assert "precomputed in one pass before step 1 (finetune.reference=auto)" in text
    text = " ".join(invoke("plan", *full, "finetune.reference=copy").stdout.split())
    assert "a frozen copy" in text
