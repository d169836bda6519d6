"""torch_capabilities: what backend=torch refuses, each reason with what would work instead."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.config.compose import compose_config
from launcher.train.engines.capabilities import torch_capabilities

pytestmark = pytest.mark.unit


def reasons(*overrides: str, gpus: int = 2) -> list[str]:
    cfg = compose_config(["recipe=tiny", f"cluster.gpus_per_node={gpus}", *overrides]).config
    return torch_capabilities(cfg)


def test_module_does_not_import_torch() -> None:
    code = (
        "import sys; import launcher.train.engines.capabilities; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(
    "overrides",
    [
        ["zero.stage=0"],
        ["zero.stage=2"],
        ["zero.stage=3"],
        ["zero.stage=3", "zero.offload_params=cpu", "zero.offload_optimizer=cpu"],
        ["zero.stage=3", "zero.offload_params=cpu"],
        ["parallel.tp=2", "parallel.sequence_parallel=true"],
        ["parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2"],
        ["parallel.pp=2", "model.tie_embeddings=false", "parallel.pp_schedule=gpipe"],
        # Interleaved 1F1B runs with fewer micro-batches than stages (measured), 1F1B does not.
        [
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.pp_schedule=interleaved",
            "model.tie_embeddings=false",
            "train.grad_accum=1",
        ],
        [
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.pp_schedule=interleaved",
            "model.tie_embeddings=false",
            "train.grad_accum=4",
        ],
        ["precision=bf16", "train.recompute=selective"],
        ["parallel.tp=2", "model.num_kv_heads=1"],
        ["parallel.tp=2", "model.num_kv_heads=2"],
        ["precision=fp32", "train.recompute=full"],
        ["zero.stage=1"],
        ["precision=fp16", "zero.stage=1"],
        ["precision=fp16", "zero.stage=0"],
        ["precision=fp16", "zero.stage=3", "parallel.tp=2"],
        ["precision=fp16", "parallel.ep=2", "model.num_experts=4", "model.moe_top_k=2"],
        ["parallel.cp=2", "model.position=rope", "model.num_kv_heads=2"],
        ["parallel.cp=2", "zero.stage=1", "precision=fp16", "cluster.gpus_per_node=4"],
        ["parallel.ep=2", "model.num_experts=4", "model.moe_top_k=2"],
    ],
)
def test_accepted(overrides: list[str]) -> None:
    assert reasons(*overrides) == []


@pytest.mark.parametrize(
    ("overrides", "needle", "instead"),
    [
        (["zero.stage=1", "parallel.tp=2"], "zero.stage=1", "backend=deepspeed"),
        (
            ["zero.stage=1", "parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2"],
            "zero.stage=1",
            "parallel.pp=1",
        ),
        (["zero.stage=2", "zero.offload_params=cpu"], "offload_params", "zero.stage=3"),
        (["zero.stage=3", "zero.offload_optimizer=cpu"], "offload_optimizer", "offload_params=cpu"),
        (["parallel.cp=2", "parallel.tp=2"], "parallel.cp=2", "parallel.cp=1"),
        (["parallel.ep=2"], "mixture-of-experts", "parallel.ep=1"),
        (
            ["parallel.ep=2", "model.num_experts=4", "model.moe_top_k=2", "zero.stage=3"],
            "zero.stage=3",
            "zero.stage=0",
        ),
        (["parallel.cp=2", "model.kv_lora_rank=16"], "latent", "parallel.cp=1"),
        (["parallel.cp=2", "backend.compile=true"], "compile", "backend.compile=false"),
        (["parallel.pp=2", "train.grad_accum=2"], "tie_embeddings", "tie_embeddings=false"),
        (
            ["precision=fp16", "parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2"],
            "pipeline schedules",
            "precision=bf16",
        ),
        (["precision=fp8"], "fp8", "precision=bf16"),
        (["optim.name=lion"], "lion", "optim.name=adamw"),
        (
            [
                "parallel.tp=4",
                "model.num_attention_heads=12",
                "model.num_kv_heads=6",
                "model.hidden_size=96",
            ],
            "num_kv_heads=6",
            "parallel.tp in {1, 2, 3, 6, 12}",
        ),
        (
            ["parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=1"],
            "1f1b needs at least pp=2 micro-batches",
            "gpipe",
        ),
        (
            ["parallel.pp=2", "parallel.vpp=2", "model.tie_embeddings=false", "train.grad_accum=2"],
            "interleaved",
            "pp_schedule=interleaved",
        ),
        (
            [
                "parallel.pp=2",
                "parallel.pp_schedule=interleaved",
                "model.tie_embeddings=false",
                "train.grad_accum=5",
            ],
            "in 2 rounds",
            "multiple of pp=2",
        ),
    ],
)
def test_refused_with_alternative(overrides: list[str], needle: str, instead: str) -> None:
    found = reasons(*overrides)
    assert len(found) == 1, found
    assert needle in found[0] and instead in found[0], found[0]


def test_moe_with_tp_and_ep_refused() -> None:
    found = reasons(
        "model.num_experts=4",
        "model.moe_top_k=2",
        "model.moe_ffn_hidden_size=128",
        "parallel.tp=2",
        "parallel.ep=2",
        gpus=4,
    )
    assert any("expert parallel" in r and "parallel.ep=1" in r for r in found), found
    assert any("mixture-of-experts" in r and "parallel.tp=1" in r for r in found), found


def test_fp16_with_pipeline_on_gpu_points_to_deepspeed() -> None:
    assert reasons("precision=fp16", "zero.stage=3", "cluster=h100-80gb") == []
    pipeline = ("parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2")
    (found,) = reasons("precision=fp16", *pipeline, "cluster=h100-80gb")
    assert "backend=deepspeed" in found and "parallel.pp=1" in found


def ds_reasons(*overrides: str) -> list[str]:
    from launcher.launch.preflight import deepspeed_capabilities

    cfg = compose_config(
        ["recipe=tiny", "backend=deepspeed", "cluster.gpus_per_node=2", *overrides]
    ).config
    return deepspeed_capabilities(cfg)


def test_deepspeed_pipeline_accepted_and_its_limits() -> None:
    untied = ("parallel.pp=2", "model.tie_embeddings=false", "precision=bf16")
    assert ds_reasons(*untied) == []
    assert ds_reasons(*untied, "zero.stage=1") == []
    (tied,) = ds_reasons("parallel.pp=2")
    assert "tie_embeddings=false" in tied
    (schedule,) = ds_reasons(*untied, "parallel.pp_schedule=gpipe")
    assert "parallel.pp_schedule=1f1b" in schedule
    (tp,) = ds_reasons("parallel.tp=2")
    assert "backend=torch" in tp and "parallel.tp=1" in tp
