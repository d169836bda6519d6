"""launcher/backends/: what each backend refuses, each reason with what would work instead."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.backends import all_backends, launch_refusal, raw_refusals, refusals
from launcher.backends.common import backend_of
from launcher.config.composition.compose import compose_config
from launcher.config.schema.key_info import choices
from launcher.plan.memory.estimate import bytes_per_param, fp8_weight_copy_bytes
from launcher.plan.timing.kernels import attention_kernel
from launcher.render.run_files import BACKEND_FILES
from launcher.validate.rules import check

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.


def reasons(*overrides: str, gpus: int = 2) -> list[str]:
    cfg = compose_config(["recipe=tiny", f"cluster.gpus_per_node={gpus}", *overrides]).config
    return [r.message for r in refusals(cfg)]


@pytest.mark.integration
def test_module_does_not_import_torch() -> None:
    code = (
        "import sys; import launcher.backends; launcher.backends.all_backends(); "
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
        ["parallel.cp=2", "parallel.tp=2", "cluster.gpus_per_node=4"],
    ],
)
def test_accepted(overrides: list[str]) -> None:
    assert reasons(*overrides) == []


@pytest.mark.parametrize(
    ("overrides", "needle", "instead"),
    [
        (["zero.stage=1", "parallel.tp=2"], "zero.stage=1", "parallel.tp=1"),
        (
            ["zero.stage=1", "parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2"],
            "zero.stage=1",
            "parallel.pp=1",
        ),
        (["zero.stage=2", "zero.offload_params=cpu"], "offload_params", "zero.stage=3"),
        (["zero.stage=3", "zero.offload_optimizer=cpu"], "offload_optimizer", "offload_params=cpu"),
        (
            ["parallel.cp=2", "parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2"],
            "parallel.cp=2",
            "parallel.cp=1",
        ),
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


def test_moe_and_mla_with_tp_and_ep_run_but_not_with_zero_sharding() -> None:
    moe = ("model.num_experts=4", "model.moe_top_k=2", "model.moe_ffn_hidden_size=128")
    mla = ("model.kv_lora_rank=16", "model.qk_rope_head_dim=8", "model.position=rope")
    assert reasons(*moe, *mla, "parallel.tp=2", "parallel.ep=2", gpus=4) == []
    found = reasons(*moe, "parallel.tp=2", "parallel.ep=2", "zero.stage=2", gpus=4)
    assert len(found) == 1, found
    assert "expert parallel" in found[0] and "zero.stage=0" in found[0], found


def test_fp16_with_pipeline_on_gpu_points_to_deepspeed() -> None:
    assert reasons("precision=fp16", "zero.stage=3", "cluster=h100-80gb") == []
    pipeline = ("parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2")
    (found,) = reasons("precision=fp16", *pipeline, "cluster=h100-80gb")
    assert "backend=deepspeed" in found and "parallel.pp=1" in found


def ds(*overrides: str, gpus: int = 2) -> list[str]:
    return reasons("backend=deepspeed", *overrides, gpus=gpus)


def mg(*overrides: str) -> list[str]:
    return reasons("backend=megatron", "cluster=h100-80gb", *overrides, gpus=8)


def test_every_backend_is_found_and_launchable() -> None:
    backends = all_backends()
    assert set(backends) == {"torch", "deepspeed", "megatron"}
    assert all(b.launchable for b in backends.values())
    # Megatron-LM is launched from the user's checkout (launcher.launch.preflight).
    assert "backend.megatron_path" in backends["megatron"].needs


def test_deepspeed_runs_zero_pipeline_and_autotp() -> None:
    for stage in range(4):
        assert ds(f"zero.stage={stage}") == []
    assert ds("zero.stage=2", "zero.offload_optimizer=cpu") == []
    assert ds("zero.stage=3", "zero.offload_params=cpu", "zero.offload_optimizer=cpu") == []
    untied = ("parallel.pp=2", "model.tie_embeddings=false", "precision=bf16")
    assert ds(*untied) == []
    assert ds(*untied, "zero.stage=1") == []
    (tied,) = ds("parallel.pp=2", "precision=bf16")
    assert "tie_embeddings=false" in tied
    (schedule,) = ds(*untied, "parallel.pp_schedule=gpipe")
    assert "parallel.pp_schedule=1f1b" in schedule
    (zero2,) = ds(*untied, "zero.stage=2")
    assert "ZeRO stage 0 or 1" in zero2 and "zero.stage=1" in zero2
    (fp16,) = ds("precision=fp16")
    assert "fp16" in fp16 and "precision=bf16" in fp16
    # AutoTP tensor parallel, with every ZeRO stage, not inside a pipeline.
    for stage in range(4):
        assert ds("parallel.tp=2", f"zero.stage={stage}") == []
    (found,) = ds("parallel.tp=2", *untied)
    assert "without a pipeline" in found and "parallel.pp=1" in found
    (found,) = ds("parallel.tp=2", "model.num_kv_heads=1")
    assert "parallel.tp that divides model.num_kv_heads" in found
    assert "backend=torch" in found  # torch replicates the kv head
    (found,) = ds("parallel.cp=2", "model.seq_length=64")
    assert "data parallel (ZeRO), pipeline parallel and AutoTP" in found
    assert "parallel.cp=1" in found
    (found,) = ds("zero.stage=0", "zero.offload_optimizer=cpu")
    assert "zero.stage=1 or 2 or 3" in found


def test_alternatives_are_backends_that_run_the_whole_configuration() -> None:
    # cp=2 with pp=2 on CPU: deepspeed has no cp, megatron needs CUDA: nobody to advise.
    found = reasons(
        "parallel.cp=2", "parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2"
    )
    assert found and all("backend=" not in f.split(";", 1)[1] for f in found), found
    # zero.stage=1 with tp=2 on torch: deepspeed runs it as is (AutoTP with ZeRO-1) ...
    found = reasons("zero.stage=1", "parallel.tp=2")
    assert found and all("backend=deepspeed" in f for f in found), found
    # ... but zero.stage=1 with pp=2 is run by deepspeed as is.
    (found,) = reasons(
        "zero.stage=1", "parallel.pp=2", "model.tie_embeddings=false", "train.grad_accum=2"
    )
    assert "backend=deepspeed" in found and "backend=megatron" not in found


def test_megatron_table() -> None:
    assert mg("zero.stage=1") == []
    assert mg("zero.stage=3") == []  # Megatron-FSDP
    (found,) = mg("zero.stage=2")
    assert "zero.stage=0 or 1 or 3" in found
    (found,) = mg("zero.stage=3", "zero.offload_params=cpu")
    assert "never" in found
    (found,) = mg("optim.name=lion")
    assert "optim.name=adamw" in found
    assert any("CUDA" in r for r in reasons("backend=megatron"))
    assert raw_refusals("megatron", compose_config(["backend=megatron"]).config, device=False) == []


def test_megatron_moe_parallel_folding() -> None:
    moe = ["recipe=mixtral-8x7b", "cluster.num_nodes=1", "parallel.pp=1", "parallel.tp=8"]
    moe += ["train.global_batch_size=8", "parallel.cp=1"]
    # dp = 1: ep = 8 folds onto the 8 tensor-parallel ranks (tp x cp x dp = 8).
    cfg = compose_config([*moe, "parallel.ep=8"]).config
    assert not [v for v in check(cfg) if v.rule == "expert-parallel" and v.is_error]
    # The same layout on the DP-only engines: ep must divide dp x cp = 1.
    cfg = compose_config([*moe, "parallel.ep=8", "backend=torch"]).config
    errors = [v.message for v in check(cfg) if v.rule == "expert-parallel" and v.is_error]
    assert errors and "dp x cp" in errors[0]


def test_no_backend_is_plan_only() -> None:
    for name in all_backends():
        assert launch_refusal(compose_config([f"backend={name}"]).config) is None


def test_megatron_args_render_fsdp_and_parallel_folding() -> None:
    from launcher.render.megatron_args import megatron_args

    moe = ["recipe=mixtral-8x7b", "cluster.num_nodes=1", "parallel.pp=1", "parallel.tp=8"]
    moe += ["train.global_batch_size=8", "parallel.cp=1", "parallel.ep=8", "zero.stage=3"]
    args = megatron_args(compose_config(moe).config)
    assert "--use-megatron-fsdp" in args and "--use-distributed-optimizer" not in args
    assert args[args.index("--expert-model-parallel-size") + 1] == "8"
    assert args[args.index("--expert-tensor-parallel-size") + 1] == "1"  # ep spans tp ranks


# --- one object answers every backend question (issue 20) ---------------------------------------

LAUNCHER = Path(__file__).resolve().parents[3] / "launcher"
# A behaviour chosen by comparing the backend's name (==, !=, in (...)), outside launcher/backends/.
NAME_BRANCH = re.compile(r"backend\.name\s*(==|!=|\bin\b|\bnot in\b)|==\s*cfg\.backend\.name")


def test_nothing_outside_the_backends_branches_on_a_backend_name() -> None:
    found = [
        f"{path.relative_to(LAUNCHER.parent)}:{n}: {line.strip()}"
        for path in sorted(LAUNCHER.rglob("*.py"))
        if "backends" not in path.relative_to(LAUNCHER).parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_BRANCH.search(line)
    ]
    assert found == []


def test_the_backend_choices_are_the_backend_modules() -> None:
    assert choices()["backend.name"] == tuple(all_backends())
    for name, backend in all_backends().items():
        assert backend.name == name


def test_engine_and_artifact_names_resolve() -> None:
    for backend in all_backends().values():
        # Each rank runs llmtrain's engine or the backend's own script, not both, not neither.
        assert bool(backend.engine) != bool(backend.entry), backend.name
        if backend.engine:
            module, _, cls = backend.engine.partition(":")
            source = LAUNCHER.parent / (module.replace(".", "/") + ".py")
            assert f"class {cls}(" in source.read_text(), backend.engine
        assert set(backend.artifacts) <= set(BACKEND_FILES), backend.name


def test_behaviour_comes_from_the_backend() -> None:
    torch_fp8 = compose_config(["recipe=llama3-8b", "precision=fp8"]).config
    megatron_fp8 = compose_config(["recipe=llama3-8b", "precision=fp8", "backend=megatron"]).config
    assert fp8_weight_copy_bytes(torch_fp8) == 0.0
    assert fp8_weight_copy_bytes(megatron_fp8) == 2.0
    assert attention_kernel(torch_fp8) == "sdpa" and attention_kernel(megatron_fp8) == "te"
    zero3 = compose_config(["recipe=llama3-8b", "zero.stage=3"]).config
    ds_zero3 = compose_config(["recipe=llama3-8b", "zero.stage=3", "backend=deepspeed"]).config
    assert bytes_per_param(zero3).weights == 4.0 and bytes_per_param(ds_zero3).weights == 2.0
    assert backend_of(megatron_fp8).env(compose_config(["parallel.tp=2"]).config) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1"
    }
