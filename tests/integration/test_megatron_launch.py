"""`llmtrain run` with backend=megatron: the real CLI, preflight and torchrun, launching a
Megatron-LM checkout's pretrain_gpt.py.

Megatron-LM trains on CUDA only, so two things are stood in, and named as such:
- STAND_IN_SCRIPT, written by the test as ``pretrain_gpt.py`` in a folder given as
  backend.megatron_path: a stand-in for Megatron-LM's training script that only records its
  argv, environment and working directory, then exits (with an error code on a chosen rank);
- the GPUs: ``CUDA_VISIBLE_DEVICES=0,1`` makes the preflight count two CUDA devices on this
  machine (the stand-in never touches them).
Everything else is real: validation, plan, run directory, torchrun's rendezvous and its failure
report.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose_config
from launcher.render.megatron_launch import megatron_run_args
from tests.integration.test_run import llmtrain, only_run_dir

pytestmark = pytest.mark.integration

STAND_IN_SCRIPT = """\
# Stand-in for Megatron-LM's pretrain_gpt.py (written by tests/integration/test_megatron_launch.py):
# records what it was started with, exits; fails with code 3 on rank $STAND_IN_FAIL_RANK.
import json, os, sys
rank = os.environ["RANK"]
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
        "CUDA_DEVICE_MAX_CONNECTIONS")
record = {"argv": sys.argv, "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
if os.environ.get("STAND_IN_FAIL_RANK") == rank:
    print("stand-in pretrain_gpt.py: simulated failure", file=sys.stderr)
    sys.exit(3)
"""

# The tiny model on two "H100s" (CUDA_VISIBLE_DEVICES stands in for them), tensor parallel 2.
OVERRIDES = [
    "backend=megatron",
    "cluster=h100-80gb",
    "cluster.gpus_per_node=2",
    "parallel.tp=2",
    "train.steps=5",
    "train.micro_batch_size=4",
    "train.global_batch_size=4",
]
FAKE_GPUS = {"CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.fixture
def megatron_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "Megatron-LM"
    folder.mkdir()
    (folder / "pretrain_gpt.py").write_text(STAND_IN_SCRIPT)
    return folder


def _records(folder: Path) -> list[dict[str, object]]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def test_run_launches_pretrain_gpt_under_torchrun(tmp_path: Path, megatron_dir: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    overrides = [*OVERRIDES, f"backend.megatron_path={megatron_dir}"]
    done = llmtrain(work, "run", *overrides, env=FAKE_GPUS, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(work)
    cfg = compose_config(overrides).config
    expected = [str(megatron_dir / "pretrain_gpt.py"), *megatron_run_args(cfg, str(run_dir))]
    records = _records(megatron_dir)
    for rank, record in enumerate(records):
        assert record["argv"] == expected
        assert record["cwd"] == str(work)
        env = record["env"]
        assert isinstance(env, dict)
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] and env["MASTER_PORT"]  # torchrun's rendezvous
        assert env["PYTHONPATH"] == str(megatron_dir)
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # Megatron-LM with tp > 1
    argv = records[0]["argv"]
    assert isinstance(argv, list)
    text = " ".join(argv)
    assert "--tensor-model-parallel-size 2" in text and "--mock-data" in text
    assert f"--save {run_dir}/checkpoints --load {run_dir}/checkpoints" in text
    # launch.sh holds the exact command, megatron_args.txt the config's arguments.
    script = (run_dir / "launch.sh").read_text()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node=2", "--max-restarts=0"]
    assert shlex.split(script.splitlines()[-1]) == ["exec", *torchrun, *expected]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    assert f"export PYTHONPATH={megatron_dir}" in script
    assert "--tensor-model-parallel-size 2" in (run_dir / "megatron_args.txt").read_text()


def test_a_failing_rank_is_reported_like_other_rank_failures(
    tmp_path: Path, megatron_dir: Path
) -> None:
    overrides = [*OVERRIDES, "parallel.tp=1", "train.global_batch_size=8"]
    overrides.append(f"backend.megatron_path={megatron_dir}")
    env = {**FAKE_GPUS, "STAND_IN_FAIL_RANK": "1"}
    done = llmtrain(tmp_path, "run", *overrides, env=env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "rank 1 failed first: exited with code 3" in done.stderr
    run_dir = only_run_dir(tmp_path)
    assert (
        "stand-in pretrain_gpt.py: simulated failure"
        in (run_dir / "logs" / "torchrun.log").read_text()
    )
    # tp=1: no CUDA_DEVICE_MAX_CONNECTIONS; extra arguments are not given, so --mock-data.
    assert _records(megatron_dir)[0]["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] is None


def test_without_megatron_lm_run_refuses_and_writes_nothing(tmp_path: Path) -> None:
    env = {**FAKE_GPUS, "MEGATRON_LM_PATH": ""}
    done = llmtrain(tmp_path, "run", *OVERRIDES, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    message = " ".join(done.stderr.split())
    assert "no Megatron-LM checkout is named" in message
    assert "backend.megatron_path=/path/to/Megatron-LM" in message
    assert "git clone --branch core_v0.16.1" in message and "MEGATRON_LM_PATH" in message
    assert not (tmp_path / "runs").exists()
