"""The command of a local run (torchrun, torch elastic, for several processes; the trainer itself
for one), and the script that records it."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from launcher.config.secrets import check_lines

WORKER_MODULE = "launcher.train.loop"


def torchrun_command(
    python: str, nproc_per_node: int, run_dir: str, worker: Sequence[str] = ()
) -> list[str]:
    """One node, `nproc_per_node` processes, c10d rendezvous on localhost:0 (a free port). Each
    process runs llmtrain's trainer on `run_dir`, or `worker` (a script and its arguments, e.g.
    Megatron-LM's pretrain_gpt.py) when given."""
    command = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc_per_node}",
        "--max-restarts=0",
    ]
    return command + (list(worker) if worker else ["-m", WORKER_MODULE, run_dir])


# What torchrun would set for the only process of a one-node, one-process run, so the trainer
# (and DeepSpeed's init_distributed, which requires the first five) reads the same contract
# either way. MASTER_PORT 0: rank 0's TCP store listens on a free port; no other rank connects.
SINGLE_PROCESS_ENV = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "0",
    "LOCAL_WORLD_SIZE": "1",
    "GROUP_RANK": "0",
    # torchrun sets it for its workers; inherited as True (llmtrain started from inside a torchrun
    # worker), env:// would connect to an agent's store at MASTER_PORT instead of starting one.
    "TORCHELASTIC_USE_AGENT_STORE": "False",
}


def single_process_command(python: str, run_dir: str) -> list[str]:
    """The trainer as its own process, without torchrun's agent: a one-process run has no peer to
    rendezvous with or restart, and the agent (a second Python that imports torch) cost 3.5-5.6
    CPU s and seconds of wall time a launch on a 2-core box (bench/one_process_launch.py,
    docs/training.md). torchtune's `tune run` starts its single-device recipes the same way.
    ``-u`` as torchrun passes it."""
    return [python, "-u", "-m", WORKER_MODULE, run_dir]


def is_single_process(command: Sequence[str]) -> bool:
    """Whether `command` starts the trainer itself (``single_process_command``), not an agent."""
    return len(command) >= 4 and list(command[1:4]) == ["-u", "-m", WORKER_MODULE]


def launch_script(
    command: Sequence[str], env: Mapping[str, str], cwd: str, secrets: Sequence[str] = ()
) -> str:
    """A bash script that re-runs exactly `command` with `env` from `cwd`; every value quoted.
    The `secrets` are named, not exported: the script checks they are in its environment."""
    lines = [
        "#!/usr/bin/env bash",
        "# The exact command `llmtrain run` launched.",
        "set -euo pipefail",
    ]
    lines.append(f"cd {shlex.quote(cwd)}")
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    lines += check_lines(secrets, "export it before running this script")
    lines.append("exec " + shlex.join(command))
    return "\n".join(lines) + "\n"
