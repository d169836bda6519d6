"""DeepSpeed hostfiles (``HOST slots=N`` per line).

The real host names of a SLURM run are known only inside the allocation: job.sbatch writes
``$RUN_DIR/hostfile`` from ``scontrol show hostnames $SLURM_JOB_NODELIST`` (see
``launcher.render.sbatch``), with ``slurm_hostfile_command``'s text. ``static_hostfile`` renders
one from the config alone (``llmtrain render``), with placeholder names to replace.
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.config.schema import LLMTrainConfig


def hostfile(hosts: Sequence[str], slots: int) -> str:
    for host in hosts:
        if not host or any(ch.isspace() for ch in host):
            raise ValueError(f"host name {host!r}: empty or contains whitespace")
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def static_hostfile(cfg: LLMTrainConfig) -> str:
    """node1..nodeN with gpus_per_node slots each; a comment says to replace the names."""
    n = cfg.cluster.num_nodes
    width = len(str(n))
    hosts = [f"node{i:0{width}d}" for i in range(1, n + 1)]
    return (
        f"# {n} node(s) x {cfg.cluster.gpus_per_node} slot(s): replace the placeholder names with "
        "your hosts (job.sbatch writes the real ones inside a SLURM job).\n"
        + hostfile(hosts, cfg.cluster.gpus_per_node)
    )
