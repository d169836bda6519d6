"""Where it runs: `cluster.*`, `slurm.*` and `launcher.*`."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import bounds, one_of
from launcher.config.schema.common import (
    ABOVE_0,
    AT_LEAST_0,
    AT_LEAST_1,
    GPUS_PER_NODE_TYPO,
    NODES_TYPO,
)


@dataclass
class ClusterConfig:
    """Hardware: which accelerator, how many, and figures that override the catalog's defaults."""

    name: str = "cpu"
    """The cluster's name (the conf/cluster option it came from)."""
    gpu: str = "cpu"
    """The accelerator, a name of the GPU catalog (launcher.plan.hardware.lookup)."""
    num_nodes: int = field(default=1, metadata=bounds(ge=1, typo_above=NODES_TYPO))
    """Nodes of the job."""
    gpus_per_node: int = field(default=1, metadata=bounds(ge=1, typo_above=GPUS_PER_NODE_TYPO))
    """Accelerators per node."""
    intra_node_bandwidth_gbps: float | None = field(default=None, metadata=ABOVE_0)
    """Bandwidth between the GPUs of a node, GB/s; None: the GPU catalog's figure."""
    inter_node_bandwidth_gbps: float | None = field(default=None, metadata=ABOVE_0)
    """Bandwidth between nodes per GPU, GB/s; None: the GPU catalog's figure."""
    price_per_gpu_hour: float | None = field(default=None, metadata=AT_LEAST_0)
    """Price of one GPU hour; None: the GPU catalog's figure."""
    storage_write_gbps: float = field(default=10.0, metadata=ABOVE_0)
    """Aggregate write bandwidth of the checkpoint storage, GB/s."""
    power_limit_w: float | None = None
    """GPU board power cap in watts (nvidia-smi -pl); None: the catalog's TDP. The planner slows
    compute by the clock a lower cap leaves (launcher.plan.timing.kernels.clock_factor)."""
    gpu_request: str = field(default="gpus-per-node", metadata=one_of("gpus-per-node", "gres"))
    """How the SLURM job asks for GPUs: --gpus-per-node or --gres."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the ranks (a name saying KEY, TOKEN, SECRET, ... is a secret)."""
    profile: str | None = None
    """Operator profile `llmtrain calibrate` wrote (a JSON file) for `plan` to price from; None:
    the cached profile of cluster.gpu when there is one (~/.cache/llmtrain/profiles/GPU.json),
    "none": published figures only."""


@dataclass
class SlurmConfig:
    """The SLURM job `llmtrain submit` writes (launcher=slurm)."""

    job_name: str | None = None
    """None: the run's name (its directory's name), so jobs of different runs tell apart in
    squeue."""
    partition: str | None = None
    """sbatch --partition; None: the cluster's default."""
    account: str | None = None
    """sbatch --account; None: your default account."""
    qos: str | None = None
    """sbatch --qos; None: the default quality of service."""
    time: str = "01:00:00"
    """Wall-time limit of each job (sbatch --time)."""
    cpus_per_task: int | None = field(default=None, metadata=AT_LEAST_1)
    """sbatch --cpus-per-task; None: SLURM's default."""
    signal_grace_s: int = field(default=120, metadata=AT_LEAST_0)
    """Seconds before the time limit at which SLURM sends USR1 (checkpoint and requeue)."""
    requeue: bool = True
    """Requeue the job when it is preempted or reaches its time limit."""
    chain: int = field(default=0, metadata=AT_LEAST_0)
    """Continuation jobs chained with --dependency=afterany to train past the wall-time limit."""
    extra_sbatch_args: list[str] = field(default_factory=list)
    """Further sbatch options, as written on sbatch's command line."""
    extra_srun_args: list[str] = field(default_factory=list)
    """Further srun options of the training step."""
    container_image: str | None = None
    """pyxis/enroot container for the training step. The job then runs the image's own Python
    (container_python, which must have llmtrain installed), mounts the run directory, the data
    and the working directory at the same paths, and starts in the working directory."""
    container_mounts: str | None = None
    """Further pyxis --container-mounts (SRC:DST[,...])."""
    container_python: str = "python3"
    """The container's Python interpreter."""


@dataclass
class LauncherConfig:
    """Where the run starts."""

    name: str = field(default="local", metadata=one_of("local", "slurm"))
    """local (this machine, torchrun) or slurm (sbatch)."""
