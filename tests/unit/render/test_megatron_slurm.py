"""backend=megatron under SLURM: job.sbatch runs Megatron-LM's pretrain_gpt.py under srun +
torchrun with the rendered arguments and environment (run by bash against stub scontrol/srun
that record what they are given), and `llmtrain submit` refuses without a Megatron-LM checkout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.launch.render_out import write_artifacts
from launcher.render.artifacts import render_artifacts
from launcher.render.megatron_launch import megatron_run_args
from tests.cli import invoke
from tests.unit.render.test_slurm_submit import fake_slurm, stub

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

__all__ = ["fake_slurm"]  # the fixture, used by name below

MEGATRON = [
    "backend=megatron",
    "cluster=h100-80gb",
    "cluster.num_nodes=2",
    "cluster.gpus_per_node=2",
    "parallel.tp=2",
    "train.micro_batch_size=4",
    "train.global_batch_size=8",
]


def _render(tmp_path: Path, overrides: list[str]) -> Path:
    """job.sbatch for `overrides` in tmp_path/run, with stub scontrol/srun in tmp_path/bin. The
    srun stub records its arguments (one per line), then $PYTHONPATH and
    $CUDA_DEVICE_MAX_CONNECTIONS, in tmp_path/srun.args."""
    bin_dir, out = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    stub(
        bin_dir,
        "scontrol",
        'case "$1 $2" in\n'
        '  "show hostnames") echo n1; echo n2;;\n'
        '  "show node") echo "NodeName=$3 NodeAddr=10.1.2.3";;\n'
        "esac\n",
    )
    stub(
        bin_dir,
        "srun",
        'printf "%s\\n" "$@" "PYTHONPATH=$PYTHONPATH" '
        '"CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-}" >"$STUB_LOG"\n',
    )
    composed = compose_config(overrides)
    write_artifacts(
        render_artifacts(composed, str(out), python="python", workdir=str(tmp_path)), str(out)
    )
    return out.resolve()


def _run_job(
    tmp_path: Path, run_dir: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run job.sbatch as SLURM would (job 7 on n1, n2), without MEGATRON_LM_PATH unless `env`
    gives it."""
    job_env = {
        **{k: v for k, v in os.environ.items() if k != "MEGATRON_LM_PATH"},
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "STUB_LOG": str(tmp_path / "srun.args"),
        **env,
    }
    (tmp_path / "srun.args").unlink(missing_ok=True)
    return subprocess.run(
        ["bash", str(run_dir / "job.sbatch")],
        cwd=tmp_path,
        env=job_env,
        capture_output=True,
        text=True,
    )


@pytest.mark.integration
def test_the_job_runs_pretrain_gpt_with_the_rendered_arguments(tmp_path: Path) -> None:
    checkout = tmp_path / "Megatron-LM"
    overrides = [*MEGATRON, f"backend.megatron_path={checkout}"]
    run_dir = _render(tmp_path, overrides)
    done = _run_job(tmp_path, run_dir, {})
    assert done.returncode == 0, done.stderr
    words = (tmp_path / "srun.args").read_text().splitlines()
    start = words.index(f"{checkout}/pretrain_gpt.py")
    cfg = compose_config(overrides).config
    assert words[start + 1 : -2] == megatron_run_args(cfg, str(run_dir))
    assert words[-2:] == [f"PYTHONPATH={checkout}", "CUDA_DEVICE_MAX_CONNECTIONS=1"]
    torchrun = words[:start]
    assert "--nnodes=2" in torchrun and "--nproc-per-node=2" in torchrun
    assert "--rdzv-endpoint=10.1.2.3:" + str(20000 + 7 * 7 % 20000) in torchrun
    # Megatron-LM's checkpoint tracker at the last step: a requeued or chained job stops at once.
    (run_dir / "checkpoints").mkdir()
    tracker = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker.write_text(str(derive_layout(cfg).steps))
    again = _run_job(tmp_path, run_dir, {})
    assert again.returncode == 0 and "steps are done" in again.stdout, again.stderr
    assert not (tmp_path / "srun.args").exists()


@pytest.mark.integration
def test_the_checkout_may_come_from_the_jobs_environment(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, MEGATRON)
    done = _run_job(tmp_path, run_dir, {})
    assert (
        done.returncode == 2 and "set MEGATRON_LM_PATH to your Megatron-LM checkout" in done.stderr
    )
    assert not (tmp_path / "srun.args").exists()
    checkout = tmp_path / "mlm"
    done = _run_job(tmp_path, run_dir, {"MEGATRON_LM_PATH": str(checkout)})
    assert done.returncode == 0, done.stderr
    words = (tmp_path / "srun.args").read_text().splitlines()
    assert f"{checkout}/pretrain_gpt.py" in words and f"PYTHONPATH={checkout}" in words


@pytest.mark.integration
def test_submit_refuses_without_a_checkout_and_submits_with_one(
    tmp_path: Path, fake_slurm: str
) -> None:
    done = invoke("submit", *MEGATRON, cwd=tmp_path, env={"PATH": fake_slurm})
    assert done.returncode == 2, done.stderr
    assert "no Megatron-LM checkout is named" in " ".join(done.stderr.split())
    assert not (tmp_path / "runs").exists()
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("")
    done = invoke(
        "submit",
        *MEGATRON,
        f"backend.megatron_path={checkout}",
        cwd=tmp_path,
        env={"PATH": fake_slurm},
    )
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"{checkout}/pretrain_gpt.py" in (run_dir / "job.sbatch").read_text()
    assert "--tensor-model-parallel-size 2" in (run_dir / "megatron_args.txt").read_text()
