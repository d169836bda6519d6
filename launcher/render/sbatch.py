"""The SLURM batch script (job.sbatch) and the multi-node torchrun script (launch.sh) of a run.

Pure functions of the resolved config: the same config renders the same bytes (golden-file tests
in tests/unit/render/test_render_golden.py). Every value that comes from the user is quoted for what
reads it: shell-quoted in the script's body, quoted as sbatch reads ``#SBATCH`` lines in those
(``sbatch_quote``); a value that cannot be written safely (a newline in an ``#SBATCH`` line) is
refused.

How the job works (job.sbatch):

- One ``srun`` task per node (``--ntasks-per-node=1``) runs ``torchrun`` with ``--nnodes`` and
  ``--nproc-per-node``. That task gets the CPUs of all the node's ranks (``node_cpus``), asked
  of sbatch and again of srun, and each rank is told its share (``OMP_NUM_THREADS``). The ranks
  meet through c10d rendezvous on the first node of the
  allocation. Its address is resolved inside the job: the first name of ``scontrol show hostnames
  $SLURM_JOB_NODELIST``, then that node's ``NodeAddr`` from ``scontrol show node`` (a node name
  may not resolve, or resolve to loopback on the node itself). The port is derived from the job
  id (and the restart count, so a requeued job never meets its predecessor's listener).
- Preemption and time limits: ``--signal=B:USR1@GRACE`` delivers USR1 to the batch shell only.
  The shell traps it and sends USR1 to ``srun``, which forwards it to every process of the step.
  The per-node wrapper ignores USR1 for torchrun (an unhandled USR1 would kill the elastic agent
  and with it the step), and the trainer processes install their own handler: at the next step
  boundary they checkpoint, rank 0 writes ``preempted.json`` and every rank exits 99. The batch
  shell then sees the marker and runs ``scontrol requeue $SLURM_JOB_ID`` (``slurm.requeue``);
  the requeued job resumes from the checkpoint. SIGTERM (scancel, ``llmtrain cancel``) is never
  turned into a requeue.
- Chained continuation jobs (``slurm.chain``, submitted with ``--dependency=afterany``) run the
  same script; it exits at once when the last step's checkpoint exists.
- backend=megatron: each torchrun process runs Megatron-LM's ``pretrain_gpt.py`` with the
  arguments of ``launcher.render.megatron_launch`` (the checkout from backend.megatron_path, else
  ``$MEGATRON_LM_PATH``, on PYTHONPATH). Megatron-LM does not answer USR1 (its ranks inherit the
  ignored USR1) but, with ``--exit-signal-handler`` (rendered with --save), saves a checkpoint at
  the next iteration and exits on SIGTERM. So the per-node wrapper (MEGATRON_NODE_WRAPPER) starts
  torchrun in the background and, on USR1, sends SIGTERM to torchrun's children, the ranks, and
  not to torchrun (which would kill its workers after a short grace, mid-save). Megatron-LM
  leaves no marker and exits 0, so the batch shell remembers the notice itself: after a USR1, when
  Megatron-LM's tracker does not show the last step, it requeues like llmtrain's own jobs, and the
  requeued job resumes through --load.
- Secrets (``launcher.config.secrets``) are never exported here: the job inherits them from the
  environment of the ``sbatch`` call (``--export=ALL``), and both scripts stop when one is unset.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from launcher.backends.common import backend_of
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.config.script_values import (
    control_problem,
    data_folders,
    env_name_problem,
    extra_sbatch_problem,
    mount_problem,
)
from launcher.config.secrets import check_lines, public_env, secret_names
from launcher.render.megatron_args import MegatronUnsupported
from launcher.render.megatron_launch import ENTRY, ENV_VAR, megatron_run_args
from launcher.render.torchrun import WORKER_MODULE
from launcher.rundir import CHECKPOINTS, LOCK, LOGS, PREEMPTED, step_dir_name
from launcher.runfiles import LOCK_ENV

# Rendezvous ports are chosen in [PORT_BASE, PORT_BASE + PORT_SPAN) from the job id.
PORT_BASE = 20000
PORT_SPAN = 20000


# Each node's task under srun: torchrun, with USR1 ignored (inherited by torchrun and its ranks;
# an unhandled USR1 would kill the elastic agent); llmtrain's trainers install their own handler.
NODE_WRAPPER = 'trap "" USR1; exec "$@"'
# backend=megatron: the same, but torchrun runs in the background and USR1 becomes SIGTERM for
# torchrun's children (found in /proc: no procps in a container image), which Megatron-LM's
# --exit-signal-handler answers with a checkpoint; then wait for torchrun, exiting with its code.
MEGATRON_NODE_WRAPPER = (
    'trap "" USR1; "$@" & child=$!; '
    "ranks_term() { for s in /proc/[0-9]*/stat; do "
    '{ read -r line <"$s"; } 2>/dev/null || continue; set -- ${line##*) }; '
    '[ "$2" = "$child" ] && kill -TERM "${s//[^0-9]/}"; done; }; '
    "trap ranks_term USR1; "
    'while kill -0 "$child" 2>/dev/null; do wait "$child"; done; wait "$child"'
)


class RenderError(ValueError):
    """A value that cannot be rendered safely; the message names the key. validate reports the
    same problems first (launcher.config.script_values): here they are an invariant."""


def _check_line(key: str, value: str) -> str:
    problem = control_problem(key, value)
    if problem:
        raise RenderError(problem)
    return value


# Characters sbatch's reader takes literally outside quotes (shlex's own safe set, a subset).
_SBATCH_PLAIN = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


def sbatch_quote(text: str) -> str:
    """`text` as one word of an ``#SBATCH`` line. sbatch reads those lines itself, not through a
    shell (SLURM src/sbatch/opt.c, ``get_argument``, slurm-22-05-8-1 to master): words split at
    unquoted whitespace, '...' or "..." group characters, an unquoted ``#`` starts a comment, and
    a backslash takes the next character literally *inside quotes too*, so a shell's
    single-quoting would lose every backslash. Written in double quotes with each backslash and
    double quote escaped, every value without a newline reads back as given."""
    if _SBATCH_PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _directive(option: str, value: str | int | None = None, *, key: str = "") -> str:
    """One ``#SBATCH`` line (``sbatch_quote``)."""
    if value is None:
        return f"#SBATCH {option}"
    text = _check_line(key or option, str(value))
    return f"#SBATCH {option}={sbatch_quote(text)}"


def log_pattern(run_dir: str, suffix: str) -> str:
    """The --output/--error filename pattern of the job's log in RUN_DIR/logs. SLURM expands
    ``%`` symbols there (sbatch(1), "filename pattern": ``%j`` the job id, ``%%`` a ``%``) and
    expands none at all in a pattern holding a backslash (src/slurmd/common/fname.c,
    ``remove_path_slashes``), which would put every job's log in one literal
    ``slurm-%j.out``: such a run directory is refused."""
    if "\\" in run_dir:
        raise RenderError(
            f"run directory {run_dir!r} (run.root_dir, run.name, or render --out): SLURM takes "
            "a log path holding a backslash literally, without the job id; choose a folder "
            "without one"
        )
    return f"{run_dir.replace('%', '%%')}/{LOGS}/slurm-%j.{suffix}"


# Since Slurm 22.05 srun no longer takes --cpus-per-task from sbatch or salloc (RELEASE_NOTES,
# slurm-22-05-0-1: it must be given to srun again or set in SRUN_CPUS_PER_TASK); 23.11 went back
# to reading SLURM_CPUS_PER_TASK and dropped SRUN_CPUS_PER_TASK (RELEASE_NOTES, slurm-23-11-0-1).
# srun's own --cpus-per-task is honoured by every version, so the training step asks with it.
def node_cpus(cfg: LLMTrainConfig) -> int:
    """CPUs of each node's one task, which runs torchrun and all the node's ranks (sbatch's and
    srun's --cpus-per-task): slurm.cpus_per_task, else one CPU per rank plus one per data loader
    worker of each rank, cluster.gpus_per_node x (1 + data.num_workers) (the floor that
    stas00/ml-engineering, orchestration/slurm/performance.md, gives: a core for each GPU's
    process and one for each of its DataLoader workers). SLURM's own default is one CPU per task,
    here one for the whole node (unless the cluster sets DefCpuPerGPU, which a request replaces)."""
    asked = cfg.slurm.cpus_per_task
    return asked if asked is not None else cfg.cluster.gpus_per_node * (1 + cfg.data.num_workers)


def job_env(cfg: LLMTrainConfig) -> dict[str, str]:
    """Environment of the trainer processes: deterministic (no probing of this machine). Secrets
    are left out: they are never written into a script."""
    env = {"PYTHONUNBUFFERED": "1"}
    if cfg.cluster.gpu == "cpu":
        env["LLMTRAIN_DEVICE"] = "cpu"
        env["DS_ACCELERATOR"] = "cpu"
    # Each rank's share of its node's CPUs (torchrun would otherwise set 1).
    env["OMP_NUM_THREADS"] = str(max(1, node_cpus(cfg) // cfg.cluster.gpus_per_node))
    env.update(backend_of(cfg).env(cfg))  # e.g. Megatron-LM's with tensor parallel
    env.update(public_env(cfg))
    for key, value in env.items():
        problem = env_name_problem(key)
        if problem:
            raise RenderError(problem)
        _check_line(f"cluster.env.{key}", value)
    return env


def _exports(env: Mapping[str, str]) -> list[str]:
    return [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]


def _megatron_root(cfg: LLMTrainConfig) -> str:
    """Shell text of the Megatron-LM checkout: backend.megatron_path, else $MEGATRON_LM_PATH."""
    path = cfg.backend.megatron_path
    return shlex.quote(_check_line("backend.megatron_path", path)) if path else f'"${ENV_VAR}"'


def megatron_lines(cfg: LLMTrainConfig) -> list[str]:
    """Script lines that give the Megatron-LM ranks their checkout on PYTHONPATH (stopping with
    exit 2 when $MEGATRON_LM_PATH is needed and unset); none for backends whose ranks run
    llmtrain's trainer."""
    if not backend_of(cfg).entry:
        return []
    lines = []
    if not cfg.backend.megatron_path:
        lines += [
            f'if [ -z "${{{ENV_VAR}:-}}" ]; then',
            f'  echo "llmtrain: set {ENV_VAR} to your Megatron-LM checkout (the folder holding '
            f'{ENTRY}), or backend.megatron_path" >&2',
            "  exit 2",
            "fi",
        ]
    return [*lines, f"export PYTHONPATH={_megatron_root(cfg)}"]


def _option_lines(words: Sequence[str]) -> list[str]:
    """Quoted arguments, an option and its value per line."""
    lines: list[str] = []
    for word in words:
        if lines and not word.startswith("--") and " " not in lines[-1]:
            lines[-1] += " " + shlex.quote(word)
        else:
            lines.append(shlex.quote(word))
    return lines


def worker_words(cfg: LLMTrainConfig, run_dir: str) -> list[str]:
    """What each torchrun process runs: llmtrain's trainer on the run directory, or for
    backend=megatron Megatron-LM's pretrain_gpt.py with its arguments (megatron_launch)."""
    if not backend_of(cfg).entry:
        return [f"-m {WORKER_MODULE} {shlex.quote(run_dir)}"]
    script = f"{_megatron_root(cfg)}/{ENTRY}"
    try:
        args = megatron_run_args(cfg, run_dir)
    except MegatronUnsupported as exc:
        raise RenderError(f"backend=megatron: {exc}") from None
    return [script, *_option_lines(args)]


def torchrun_words(
    cfg: LLMTrainConfig, python: str, run_dir: str, endpoint: str, rdzv_id: str
) -> list[str]:
    """The torchrun command, one line's worth of shell words per item. `endpoint` and `rdzv_id`
    are shell text (they refer to variables set in the script); the rest is quoted here."""
    q = shlex.quote
    return [
        f"{q(python)} -m torch.distributed.run",
        f"--nnodes={cfg.cluster.num_nodes}",
        f"--nproc-per-node={cfg.cluster.gpus_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        "--max-restarts=0",
        *worker_words(cfg, run_dir),
    ]


def _continued(words: Sequence[str], indent: str = "    ") -> str:
    return (" \\\n" + indent).join(words)


def render_launch_sh(cfg: LLMTrainConfig, *, python: str, run_dir: str, workdir: str) -> str:
    """torchrun with c10d rendezvous, to run once on every node by hand (or by another
    scheduler): the same endpoint on all of them, the first node's address."""
    n = cfg.cluster.num_nodes
    lines = [
        "#!/usr/bin/env bash",
        f"# Run this on each of the {n} node(s), the same RDZV_ENDPOINT everywhere: the first",
        "# node's address and a free port there, e.g. RDZV_ENDPOINT=10.0.0.1:29500 ./launch.sh",
        "# (under SLURM, job.sbatch does this for you).",
        "set -euo pipefail",
        f"cd {shlex.quote(_check_line('workdir', workdir))}",
        *_exports(job_env(cfg)),
        *check_lines(secret_names(cfg), "export it on every node before running this script"),
        *megatron_lines(cfg),
        'RDZV_ENDPOINT="${RDZV_ENDPOINT:-127.0.0.1:29500}"',
        'RDZV_ID="${RDZV_ID:-llmtrain}"',
    ]
    words = torchrun_words(
        cfg, python, _check_line("run_dir", run_dir), '"$RDZV_ENDPOINT"', '"$RDZV_ID"'
    )
    lines.append("exec " + _continued(words))
    return "\n".join(lines) + "\n"


def container_mounts(cfg: LLMTrainConfig, run_dir: str, workdir: str) -> str:
    """pyxis --container-mounts: the user's mounts, then the run directory, the working directory
    and the folders holding the data at their own paths (a folder already under a mount is not
    repeated)."""
    mounts = [m for m in (cfg.slurm.container_mounts or "").split(",") if m]
    targets = [m.split(":")[1] if ":" in m else m for m in mounts]
    wanted = [run_dir, workdir] + [folder for _, folder in data_folders(cfg)]
    for path in wanted:
        if not PurePosixPath(path).is_absolute():
            continue  # relative to the working directory, which is mounted
        problem = mount_problem(path)
        if problem:
            raise RenderError(problem)
        if any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets):
            continue
        mounts.append(f"{path}:{path}")
        targets.append(path)
    return _check_line("slurm.container_mounts", ",".join(mounts))


def lock_lines() -> list[str]:
    """Batch-script lines that take the run directory's lock (the one `llmtrain run` takes,
    launcher.launch.runlock) with flock(1) and hold it, on fd 9, until the job ends: a run or a job
    already writing there stops this job (exit 2) before it writes anything. The lock's record
    names the job; its identity (inode and a random token) goes to the ranks, which check it
    before every checkpoint (launcher.runfiles.lock_problem)."""
    return [
        "# One writer per run directory: hold its lock (as `llmtrain run` does) to the job's end.",
        f'lock="$RUN_DIR/{LOCK}"',
        "if ! command -v flock >/dev/null; then",
        '  echo "llmtrain: flock (util-linux) is not installed on $(hostname): cannot lock '
        '$RUN_DIR" >&2',
        "  exit 2",
        "fi",
        'if [ -L "$lock" ]; then',
        '  echo "llmtrain: $lock is a symbolic link; remove it (llmtrain never follows it)" >&2',
        "  exit 2",
        "fi",
        'if ! exec 9<>"$lock"; then',
        '  echo "llmtrain: cannot open the run directory\'s lock $lock" >&2',
        "  exit 2",
        "fi",
        "# A requeued job may start while its previous instance is still being torn down, and a",
        "# new one on an idle cluster before the `llmtrain submit` that queued it has let go.",
        'lock_wait=0; [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && lock_wait=60',
        'grep -qs \'"command": "llmtrain submit"\' "$lock" && lock_wait=60',
        'if ! flock -w "$lock_wait" 9; then',
        '  holder=$(head -c 512 "$lock" | tr -cd \'[:alnum:] ._:,"{}-\')',
        '  echo "llmtrain: run directory $RUN_DIR is in use by another llmtrain run or job'
        ' ($holder); this job stops without writing anything" >&2',
        "  exit 2",
        "fi",
        'lock_token="job${SLURM_JOB_ID:-}-$$-$RANDOM$RANDOM"',
        'printf \'{"pid": %d, "host": "%s", "time": %d, "command": "job.sbatch", '
        '"slurm_job": "%s", "token": "%s"}\\n\' "$$" '
        '"$(hostname | tr -cd \'A-Za-z0-9._-\')" "$(date +%s)" "${SLURM_JOB_ID:-}" "$lock_token"'
        ' >"$lock"',
        f'export {LOCK_ENV}="$(stat -c %i "$lock"):$lock_token"',
    ]


def render_sbatch(
    cfg: LLMTrainConfig, *, python: str, run_dir: str, workdir: str, run_name: str | None = None
) -> str:
    """job.sbatch for `cfg`: see the module docstring for how it runs, preempts and requeues.
    The job is named slurm.job_name, else `run_name` (the run's name), else RUN_DIR's name."""
    run_dir = _check_line("run_dir", run_dir)
    head = _sbatch_directives(cfg, run_dir, workdir, run_name or PurePosixPath(run_dir).name)
    srun = _srun_words(cfg, python, run_dir, workdir)
    stop = _stop_shell(cfg, run_dir)
    body = [
        "",
        "set -uo pipefail",
        f"RUN_DIR={shlex.quote(run_dir)}",
        *_exports(job_env(cfg)),
        *check_lines(secret_names(cfg), "llmtrain submit passes it in the environment of sbatch"),
        *megatron_lines(cfg),
        "",
        *lock_lines(),
        "",
        *_done_already_lines(stop),
        "",
        *_rendezvous_lines(cfg),
        f"rm -f {stop.marker}",
        "",
        *_training_step_lines(srun, stop),
        "",
        *_exit_lines(cfg, stop),
    ]
    return "\n".join(head + body) + "\n"


def _sbatch_directives(cfg: LLMTrainConfig, run_dir: str, workdir: str, run_name: str) -> list[str]:
    """The script's first lines: what it runs, then its ``#SBATCH`` directives (name, nodes,
    GPUs, CPUs, time, logs, the preemption signal, requeue, slurm.extra_sbatch_args)."""
    s, c = cfg.slurm, cfg.cluster
    q = shlex.quote
    steps = derive_layout(cfg).steps
    n, g = c.num_nodes, c.gpus_per_node
    head = [
        "#!/bin/bash",
        f"# llmtrain: {cfg.model.name} on {n} node(s) x {g} process(es), {steps} steps.",
        f"# Submit with `llmtrain submit` (or: sbatch {q(run_dir + '/job.sbatch')}).",
        _directive("--job-name", s.job_name or run_name, key="slurm.job_name"),
        f"#SBATCH --nodes={n}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if c.gpu != "cpu":
        head.append(
            f"#SBATCH --gres=gpu:{g}" if c.gpu_request == "gres" else f"#SBATCH --gpus-per-node={g}"
        )
    head.append(f"#SBATCH --cpus-per-task={node_cpus(cfg)}")
    head.append(_directive("--time", s.time, key="slurm.time"))
    for key in ("partition", "account", "qos"):
        value = getattr(s, key)
        if value is not None:
            head.append(_directive(f"--{key}", value, key=f"slurm.{key}"))
    head += [
        _directive("--output", log_pattern(run_dir, "out"), key="run_dir"),
        _directive("--error", log_pattern(run_dir, "err"), key="run_dir"),
        "#SBATCH --open-mode=append",
        _directive("--chdir", workdir, key="workdir"),
        f"#SBATCH --signal=B:USR1@{s.signal_grace_s}",
        "#SBATCH --requeue" if s.requeue else "#SBATCH --no-requeue",
    ]
    for arg in s.extra_sbatch_args:
        problem = extra_sbatch_problem(cfg, arg)
        if problem:
            raise RenderError(problem)
        head.append(f"#SBATCH {sbatch_quote(arg)}")
    return head


def _srun_words(cfg: LLMTrainConfig, python: str, run_dir: str, workdir: str) -> list[str]:
    """The training step: srun (one task per node, in the container when there is one), the
    per-node wrapper, and torchrun with the ranks' command, one line's worth per item."""
    s, n = cfg.slurm, cfg.cluster.num_nodes
    q = shlex.quote
    srun = [
        "srun",
        f"--nodes={n}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={node_cpus(cfg)}",  # not inherited from sbatch since 22.05 (node_cpus)
        "--kill-on-bad-exit=1",
    ]
    if s.container_image is not None:
        python = _check_line("slurm.container_python", s.container_python)
        srun += [
            f"--container-image={q(_check_line('slurm.container_image', s.container_image))}",
            f"--container-mounts={q(container_mounts(cfg, run_dir, workdir))}",
            f"--container-workdir={q(workdir)}",
        ]
    srun += [q(_check_line("slurm.extra_srun_args", a)) for a in s.extra_srun_args]
    node_wrapper = q(MEGATRON_NODE_WRAPPER if _ranks_get_term(cfg) else NODE_WRAPPER)
    srun.append(f"bash -c {node_wrapper} llmtrain-node")
    srun += torchrun_words(cfg, python, run_dir, '"$rdzv_addr:$rdzv_port"', '"$SLURM_JOB_ID"')
    return srun


def _ranks_get_term(cfg: LLMTrainConfig) -> bool:
    """Ranks that do not answer USR1 themselves get SIGTERM on a preemption notice instead."""
    return not backend_of(cfg).answers_usr1


@dataclass(frozen=True)
class _StopShell:
    """Shell text of how the job knows it is done or was stopped by a preemption notice."""

    term_ranks: bool  # the ranks get SIGTERM on a preemption notice (_ranks_get_term)
    steps: int
    final: str  # the quoted path that shows the last step's checkpoint
    done: str  # a test: the last step's checkpoint exists
    marker: str  # the quoted path of the trainer's preemption marker
    usr1: str  # the USR1 trap's command
    preempted: str  # a test: the ranks stopped on a preemption notice
    stopped: str  # the line that says so, before the requeue


def _stop_shell(cfg: LLMTrainConfig, run_dir: str) -> _StopShell:
    """llmtrain's trainer leaves a marker after its checkpoint on USR1; Megatron-LM's ranks get
    SIGTERM instead, leave none, and are told done by the iteration in their tracker file."""
    q = shlex.quote
    steps = derive_layout(cfg).steps
    backend = backend_of(cfg)
    final = q(f"{run_dir}/{CHECKPOINTS}/{step_dir_name(steps)}")
    done = f"[ -d {final} ]"
    if backend.checkpoint_tracker:
        # Megatron-LM records its newest checkpoint's iteration in this file.
        final = q(f"{run_dir}/{CHECKPOINTS}/{backend.checkpoint_tracker}")
        done = f'[ "$(cat {final} 2>/dev/null)" = {steps} ]'
    marker = q(f"{run_dir}/{PREEMPTED}")
    if not _ranks_get_term(cfg):
        return _StopShell(
            term_ranks=False,
            steps=steps,
            final=final,
            done=done,
            marker=marker,
            usr1='echo "llmtrain: USR1: checkpoint and stop"; forward USR1',
            preempted=f"[ -f {marker} ]",
            stopped='  echo "llmtrain: checkpointed on a preemption signal; requeueing '
            '$SLURM_JOB_ID"',
        )
    return _StopShell(
        term_ranks=True,
        steps=steps,
        final=final,
        done=done,
        marker=marker,
        usr1='preempted=1; echo "llmtrain: USR1: Megatron-LM ranks get SIGTERM (checkpoint and '
        'stop)"; forward USR1',
        preempted=f'[ "$preempted" = 1 ] && ! {done}',
        stopped='  echo "llmtrain: Megatron-LM stopped on a preemption signal (newest checkpoint: '
        f'iteration $(cat {final} 2>/dev/null || echo none)); requeueing $SLURM_JOB_ID"',
    )


def _done_already_lines(stop: _StopShell) -> list[str]:
    """Stop at once when the last step's checkpoint exists."""
    return [
        "# Done already (a chained continuation job, or a requeue after the last step): stop.",
        f"if {stop.done}; then",
        f'  echo "llmtrain: all {stop.steps} steps are done ({stop.final})"',
        "  exit 0",
        "fi",
    ]


def _rendezvous_lines(cfg: LLMTrainConfig) -> list[str]:
    """The first node's address and a port from the job id (and restart count); the hostfile."""
    g = cfg.cluster.gpus_per_node
    return [
        "# Rendezvous on the first node's address as SLURM knows it (NodeAddr), not its name.",
        'rdzv_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'rdzv_addr=$(scontrol show node "$rdzv_node" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")',
        "rdzv_addr=${rdzv_addr:-$rdzv_node}",
        f"rdzv_port=$(( {PORT_BASE} + (SLURM_JOB_ID * 7 + ${{SLURM_RESTART_COUNT:-0}}) "
        f"% {PORT_SPAN} ))",
        "# The DeepSpeed launcher's view of this allocation.",
        f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/ slots={g}/" '
        '>"$RUN_DIR/hostfile"',
        'echo "llmtrain: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on '
        '$SLURM_JOB_NODELIST, rendezvous $rdzv_addr:$rdzv_port"',
    ]


def _training_step_lines(srun: list[str], stop: _StopShell) -> list[str]:
    """srun in the background with the signal traps, waited for until it has exited."""
    return [
        "srun_pid=",
        "cancelled=0",
        *(["preempted=0"] if stop.term_ranks else []),
        "forward() {  # forward SIG: hand a signal to every process of the training step",
        '  [ -n "$srun_pid" ] && kill -"$1" "$srun_pid" 2>/dev/null',
        "}",
        f"trap {shlex.quote(stop.usr1)} USR1",
        "trap 'cancelled=1; forward TERM' TERM INT",
        _continued(srun) + " &",
        "srun_pid=$!",
        "# A trapped signal interrupts `wait`: wait again until srun itself has exited.",
        'while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; done',
        'wait "$srun_pid"',
        "rc=$?",
    ]


def _exit_lines(cfg: LLMTrainConfig, stop: _StopShell) -> list[str]:
    """After srun: cancelled, preempted (requeue, or stop when slurm.requeue is off), or the
    training step's own exit code."""
    requeue = (
        [
            stop.stopped,
            '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
            '  echo "llmtrain: scontrol requeue failed; resubmit to resume" >&2',
            "  exit 99",
        ]
        if cfg.slurm.requeue
        else [
            '  echo "llmtrain: checkpointed after a preemption signal; slurm.requeue is off"',
            "  exit 0  # a chained continuation job (if any) resumes from the checkpoint",
        ]
    )
    return [
        'if [ "$cancelled" = 1 ]; then',
        '  echo "llmtrain: cancelled"',
        "  exit 143",
        "fi",
        f"if {stop.preempted}; then",
        *requeue,
        "fi",
        'echo "llmtrain: training step exited with code $rc"',
        'exit "$rc"',
    ]
