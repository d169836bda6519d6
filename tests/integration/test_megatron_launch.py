"""`llmtrain run` with backend=megatron: the real CLI, preflight and torchrun, launching a
Megatron-LM checkout's pretrain_gpt.py.

Megatron-LM trains on CUDA only, so two things are stood in, and named as such:
- STAND_IN_SCRIPT, written by the test as ``pretrain_gpt.py`` in a folder given as
  backend.megatron_path: a stand-in for Megatron-LM's training script that only records its
  argv, environment and working directory, then exits (with an error code on a chosen rank); asked
  to, it waits for SIGTERM and answers it as Megatron-LM's --exit-signal-handler does (writes the
  checkpoint tracker, exits 0);
- the GPUs: ``CUDA_VISIBLE_DEVICES=0,1`` makes the preflight count two CUDA devices on this
  machine (the stand-in never touches them).
Everything else is real: validation, plan, run directory, torchrun's rendezvous and its failure
report. The preemption test runs the rendered job.sbatch with bash against stub scontrol and srun
(SLURM itself is not here; tests/slurm has the real-cluster tier): the srun stub runs the job's
per-node wrapper with a real torchrun on this machine and forwards USR1 to it, as srun does.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.render.megatron_launch import megatron_run_args
from tests.cli import llmtrain
from tests.integration.test_run import only_run_dir

pytestmark = pytest.mark.integration

STAND_IN_SCRIPT = """\
# Stand-in for Megatron-LM's pretrain_gpt.py (written by tests/integration/test_megatron_launch.py):
# records what it was started with, exits; fails with code 3 on rank $STAND_IN_FAIL_RANK.
# STAND_IN_WAIT_FOR_TERM=ITER: wait (up to 60 s) for SIGTERM; with --exit-signal-handler, rank 0
# then records ITER as the newest checkpoint in --save, as Megatron-LM does. STAND_IN_FINISH_AT=N:
# record N there (training finished).
import json, os, signal, sys, time
rank = os.environ["RANK"]
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
        "CUDA_DEVICE_MAX_CONNECTIONS")
record = {"argv": sys.argv, "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}
here = os.path.dirname(os.path.abspath(__file__))
save = sys.argv[sys.argv.index("--save") + 1] if "--save" in sys.argv else None
tracker = os.path.join(save, "latest_checkpointed_iteration.txt") if save else None
if tracker and os.path.exists(tracker):
    record["tracker_at_start"] = open(tracker).read()
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signal.Signals(signum).name))
checkpoint = os.environ.get("STAND_IN_WAIT_FOR_TERM")
if checkpoint:
    open(os.path.join(here, f"rank{rank}.started"), "w").close()
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    if got and "--exit-signal-handler" in sys.argv and rank == "0":
        os.makedirs(save, exist_ok=True)
        with open(tracker, "w") as f:
            f.write(checkpoint)
elif os.environ.get("STAND_IN_FINISH_AT") and rank == "0":
    os.makedirs(save, exist_ok=True)
    with open(tracker, "w") as f:
        f.write(os.environ["STAND_IN_FINISH_AT"])
record["signals"] = got
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
    # A PYTHONPATH of its own (megatron-core installed with pip --target) stays after the checkout.
    site = tmp_path / "site"
    done = llmtrain(
        "run", *overrides, cwd=work, env={**FAKE_GPUS, "PYTHONPATH": str(site)}, timeout=300
    )
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
        assert env["PYTHONPATH"] == f"{megatron_dir}:{site}"
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # Megatron-LM with tp > 1
    argv = records[0]["argv"]
    assert isinstance(argv, list)
    text = " ".join(argv)
    assert "--tensor-model-parallel-size 2" in text and "--mock-data" in text
    assert f"--save {run_dir}/checkpoints --load {run_dir}/checkpoints" in text
    assert "--exit-signal-handler" in argv  # checkpoint and exit on SIGTERM
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
    done = llmtrain("run", *overrides, cwd=tmp_path, env=env, timeout=300)
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
    done = llmtrain("run", *OVERRIDES, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    message = " ".join(done.stderr.split())
    assert "no Megatron-LM checkout is named" in message
    assert "backend.megatron_path=/path/to/Megatron-LM" in message
    assert "git clone --branch core_v0.16.1" in message and "MEGATRON_LM_PATH" in message
    assert not (tmp_path / "runs").exists()


SRUN_STUB = r"""#!/bin/bash
# Stand-in for srun on one node: runs the job's task (the per-node wrapper around torchrun) on this
# machine, torchrun --standalone (rendezvous on localhost:0) instead of the allocation's endpoint,
# and forwards USR1 to the task as srun forwards signals to its tasks.
while [ "${1#--}" != "$1" ]; do shift; done  # srun's options
wrapper=$3 name=$4 python=$5
shift 7  # bash -c WRAPPER NAME PYTHON -m torch.distributed.run
while [ "${1#--}" != "$1" ]; do shift; done  # torchrun's options, all --key=value
bash -c "$wrapper" "$name" "$python" -m torch.distributed.run --standalone \
    --nproc-per-node=2 --max-restarts=0 "$@" &
task=$!
trap 'kill -USR1 "$task"' USR1
while kill -0 "$task" 2>/dev/null; do wait "$task"; done
wait "$task"
"""

SCONTROL_STUB = r"""#!/bin/bash
case "$1 $2" in
  "show hostnames") echo n1;;
  "show node") echo "NodeName=$3 NodeAddr=127.0.0.1";;
  requeue*) echo "requeue $2" >>"$STUB_LOG";;
esac
"""


def test_a_preempted_megatron_job_checkpoints_on_sigterm_and_requeues(
    tmp_path: Path, megatron_dir: Path
) -> None:
    import os
    import signal
    import subprocess
    import time

    from launcher.render.artifacts import render_artifacts, write_artifacts

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN_STUB), ("scontrol", SCONTROL_STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    overrides = [*OVERRIDES, "cluster.num_nodes=1", f"backend.megatron_path={megatron_dir}"]
    composed = compose_config(overrides)
    run_dir = tmp_path / "run"
    files = render_artifacts(composed, str(run_dir), python=sys.executable, workdir=str(tmp_path))
    write_artifacts(files, str(run_dir))
    log = tmp_path / "scontrol.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n1",
        "STUB_LOG": str(log),
    }

    # The job, and SLURM's preemption notice (--signal=B:USR1) once both ranks are training.
    job = subprocess.Popen(
        ["bash", str(run_dir / "job.sbatch")],
        cwd=tmp_path,
        env={**env, "STAND_IN_WAIT_FOR_TERM": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        started = [megatron_dir / f"rank{r}.started" for r in range(2)]
        while not all(p.exists() for p in started) and job.poll() is None:
            assert time.monotonic() < deadline, "the stand-in ranks never started"
            time.sleep(0.1)
        job.send_signal(signal.SIGUSR1)
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, out + err
    for record in _records(megatron_dir):
        assert record["signals"] == ["SIGTERM"]  # USR1 reached every rank as SIGTERM
        argv = record["argv"]
        assert isinstance(argv, list) and "--exit-signal-handler" in argv
    assert "Megatron-LM stopped on a preemption signal (newest checkpoint: iteration 2)" in out
    assert log.read_text() == "requeue 7\n"

    # The requeued job resumes through --load and finishes: no second requeue.
    steps = 5
    done = subprocess.run(
        ["bash", str(run_dir / "job.sbatch")],
        cwd=tmp_path,
        env={**env, "SLURM_RESTART_COUNT": "1", "STAND_IN_FINISH_AT": str(steps)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = _records(megatron_dir)[0]
    argv = record["argv"]
    assert isinstance(argv, list)
    assert argv[argv.index("--load") + 1] == f"{run_dir}/checkpoints"
    assert record["tracker_at_start"] == "2" and record["signals"] == []
    assert "training step exited with code 0" in done.stdout
    assert log.read_text() == "requeue 7\n"
