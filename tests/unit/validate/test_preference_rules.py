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
