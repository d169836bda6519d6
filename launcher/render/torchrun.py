"""The torchrun (torch elastic) command for a local run, and the script that records it."""

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
