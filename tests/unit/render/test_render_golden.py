"""The renderers are pure and deterministic: their output for a few configs is pinned in
tests/golden/CASE/FILE. After an intended change: LLMTRAIN_UPDATE_GOLDEN=1 pytest this file,
then read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.render.artifacts import render_artifacts
from launcher.render.megatron_args import MegatronUnsupported, megatron_args

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
PYTHON, WORKDIR = "/opt/llmtrain/venv/bin/python", "/home/me/project"

CASES = {
    "tiny-cpu-2-nodes": ["cluster.num_nodes=2", "train.micro_batch_size=4", "launcher=slurm"],
    "llama3-70b-h100-gres": [
        "recipe=llama3-70b",
        "cluster=a100-80gb",
        "slurm.partition=gpu",
        "slurm.account=proj-42",
        "slurm.qos=high",
        "slurm.time=2-00:00:00",
        "slurm.cpus_per_task=96",
        "slurm.chain=2",
        "slurm.container_image='nvcr.io#nvidia/pytorch:24.05-py3'",
        "slurm.container_mounts=/scratch:/scratch",
        'slurm.extra_sbatch_args=["--exclusive","--mem=0"]',
        'slurm.extra_srun_args=["--cpu-bind=none"]',
    ],
    "deepseek-v3-megatron": ["recipe=deepseek-v3"],
    "gpt-deepspeed-zero3": ["recipe=gpt-125m", "backend=deepspeed", "zero=stage3", "zero.stage=3"],
    # AutoTP: the ds_config carries the "tensor_parallel" block.
    "gpt-deepspeed-tp2": ["recipe=gpt-125m", "backend=deepspeed", "parallel.tp=2", "zero.stage=1"],
}


def render_case(name: str) -> dict[str, str]:
    composed = compose_config(CASES[name])
    return render_artifacts(composed, f"/scratch/runs/{name}", python=PYTHON, workdir=WORKDIR)


@pytest.mark.parametrize("name", sorted(CASES))
def test_artifacts_match_golden_files(name: str) -> None:
    files = render_case(name)
    files.pop("config.yaml")  # the composed config itself: pinned by the compose tests
    folder = GOLDEN / name
    if os.environ.get("LLMTRAIN_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for file, text in files.items():
            (folder / file).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for file, text in files.items():
        assert (folder / file).read_text() == text, f"{name}/{file} differs from the golden file"


def test_rendering_is_deterministic() -> None:
    assert render_case("llama3-70b-h100-gres") == render_case("llama3-70b-h100-gres")


def test_gpu_request_styles() -> None:
    gres = render_case("llama3-70b-h100-gres")["job.sbatch"]
    assert "#SBATCH --gres=gpu:8\n" in gres and "--gpus-per-node" not in gres
    composed = compose_config(
        ["recipe=llama3-70b", "cluster=a100-80gb", "cluster.gpu_request=gpus-per-node"]
    )
    per_node = render_artifacts(composed, "/r", python=PYTHON, workdir=WORKDIR)["job.sbatch"]
    assert "#SBATCH --gpus-per-node=8\n" in per_node and "--gres" not in per_node
    cpu = render_case("tiny-cpu-2-nodes")["job.sbatch"]
    assert "--gres" not in cpu and "--gpus-per-node" not in cpu


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["zero.stage=2"], "zero.stage=2"),
        (["zero.stage=3", "zero.offload_params=cpu"], "offload"),
        (["parallel.tp=2", "model.num_kv_heads=1"], "tp > num_kv_heads"),
        (["optim.name=lion"], "optim.name=lion"),
        (
            [
                "model.num_layers=8",
                "cluster.gpus_per_node=4",
                "parallel.pp=4",
                "parallel.pp_layers=[1,3,2,2]",
            ],
            "inner stages",
        ),
    ],
)
def test_megatron_refuses_what_it_cannot_express(overrides: list[str], reason: str) -> None:
    cfg = compose_config(overrides).config
    with pytest.raises(MegatronUnsupported, match=reason.replace("[", r"\[")):
        megatron_args(cfg)


def test_megatron_uneven_first_and_last_stage() -> None:
    cfg = compose_config(
        [
            "model.num_layers=8",
            "cluster.gpus_per_node=4",
            "parallel.pp=4",
            "parallel.pp_layers=[1,2,2,3]",
            "train.micro_batch_size=1",
            "train.global_batch_size=8",
        ]
    ).config
    args = megatron_args(cfg)
    i = args.index("--decoder-first-pipeline-num-layers")
    assert args[i : i + 4] == [
        "--decoder-first-pipeline-num-layers",
        "1",
        "--decoder-last-pipeline-num-layers",
        "3",
    ]
