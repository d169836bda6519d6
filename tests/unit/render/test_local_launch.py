"""The command `llmtrain run` starts on this machine (launcher.render.run_files.local_launch):
torchrun for several processes or a backend's own script, the trainer itself for one process,
with the environment torchrun would have given it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.render.run_files import Place, local_launch
from launcher.render.torchrun import SINGLE_PROCESS_ENV, is_single_process

PLACE = Place(run_dir="/r/run", python="/venv/bin/python", workdir="/w", cpus=2)


def test_one_process_starts_the_trainer_itself_with_torchrun_s_environment() -> None:
    launch = local_launch(compose_config([]).config, PLACE)
    assert launch.command == ["/venv/bin/python", "-u", "-m", "launcher.train.loop", "/r/run"]
    assert is_single_process(launch.command)
    # What DeepSpeed's init_distributed requires, and env:// reads, for world size 1.
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        assert launch.env[key] == value
    assert {"MASTER_ADDR", "MASTER_PORT"} <= set(launch.env)
    assert launch.env["OMP_NUM_THREADS"] == "2"  # both CPUs for the one rank


def test_several_processes_run_under_torchrun() -> None:
    launch = local_launch(compose_config(["cluster.gpus_per_node=2"]).config, PLACE)
    assert launch.command[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in launch.command and not is_single_process(launch.command)
    assert not set(SINGLE_PROCESS_ENV) & set(launch.env)  # torchrun sets them per rank
    assert launch.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.integration  # two Python processes
def test_the_single_process_environment_initialises_a_process_group(tmp_path: Path) -> None:
    """MASTER_PORT=0: rank 0's store takes a free port, so two runs at once never collide (each
    process holds its group until both have one: a fixed port fails the second). An inherited
    TORCHELASTIC_USE_AGENT_STORE=True (llmtrain started inside a torchrun worker) is overridden."""
    code = (
        "import sys, time, torch, torch.distributed as dist\n"
        "from pathlib import Path\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(3)\n"
        "dist.all_reduce(t)\n"
        "me, other = Path(sys.argv[1]), Path(sys.argv[2])\n"
        "me.touch()\n"
        "deadline = time.monotonic() + 60\n"
        "while not other.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(dist.get_rank(), dist.get_world_size(), t.tolist(), other.exists())\n"
        "dist.destroy_process_group()\n"
    )
    env = {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "True", **SINGLE_PROCESS_ENV}
    marks = [str(tmp_path / "a"), str(tmp_path / "b")]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *pair],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pair in (marks, marks[::-1])
    ]
    try:
        for run in runs:
            out, err = run.communicate(timeout=180)
            assert run.returncode == 0 and out.strip() == "0 1 [1.0, 1.0, 1.0] True", err[-2000:]
    finally:  # a child that hangs (waiting for a store that never answers) is not left behind
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
