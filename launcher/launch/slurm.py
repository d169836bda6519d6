"""`llmtrain submit | status | logs | cancel`: SLURM jobs through sbatch, scontrol and scancel.

``submit`` validates and plans (``preflight``), checks the cluster (sbatch present, the partition
exists and has enough nodes), renders the run directory (config.yaml, plan.json, ds_config.json,
launch.sh, job.sbatch) and runs ``sbatch --parsable``, plus ``slurm.chain`` continuation jobs with
``--dependency=afterany``. It returns at once. The run directory records the job ids in
``slurm.json``; the other commands take a job id or that run directory. Secrets
(``launcher.config.secrets``) reach the job only through the environment of the ``sbatch`` call
(``--export=ALL``), never through its script.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import fsio, runfiles
from launcher.config.composition.compose import Composed
from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import secret_env
from launcher.errors import UserError, did_you_mean
from launcher.launch.local import place_of, prepare_run_dir, run_dir_for
from launcher.launch.preflight import preflight
from launcher.plan.document import plan_to_json
from launcher.render.run_files import SLURM, run_files
from launcher.rundir import LOGS, SLURM_JOBS, RunDir

JOBS_FILE = SLURM_JOBS
FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UserError(
            f"{name} not found on PATH: SLURM commands need a SLURM client (run on a login node "
            "of the cluster); `llmtrain render --out DIR` writes job.sbatch without one"
        )
    return path


def _run(args: list[str], what: str) -> str:
    try:
        done = subprocess.run(
            [_tool(args[0]), *args[1:]], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: `{shlex.join(args)}` did not answer in 60 s") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()
        raise UserError(f"{what}: `{shlex.join(args)}` failed: {detail}")
    return done.stdout


def _fields(line: str) -> dict[str, str]:
    """KEY=VALUE words of one `scontrol show -o` line (values have no spaces, except the last
    few keys, which we do not read)."""
    out = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            out[key] = value
    return out


# ---- preflight ------------------------------------------------------------------------------


def partitions() -> dict[str, dict[str, str]]:
    text = _run(["scontrol", "show", "partition", "-o"], "cannot list SLURM partitions")
    parts = {}
    for line in text.splitlines():
        fields = _fields(line)
        if "PartitionName" in fields:
            parts[fields["PartitionName"]] = fields
    return parts


def cluster_problems(cfg: LLMTrainConfig) -> list[str]:
    """What this SLURM cluster cannot give the job (partition, node count)."""
    _tool("sbatch")
    parts = partitions()
    name = cfg.slurm.partition
    if name is None:
        defaults = [p for p, f in parts.items() if f.get("Default") == "YES"]
        if not defaults:
            return [
                "slurm.partition is not set and the cluster has no default partition; set "
                f"slurm.partition to one of: {', '.join(sorted(parts)) or '(none)'}"
            ]
        name = defaults[0]
    elif name not in parts:
        return [
            f"slurm.partition={name}: no such partition{did_you_mean(name, parts)}; "
            f"this cluster has: {', '.join(sorted(parts)) or '(none)'}"
        ]
    total = int(parts[name].get("TotalNodes", "0"))
    if cfg.cluster.num_nodes > total:
        return [
            f"cluster.num_nodes={cfg.cluster.num_nodes}: partition {name} has {total} node(s); "
            f"use cluster.num_nodes={total} or less (with more cluster.gpus_per_node), or "
            "another slurm.partition"
        ]
    return []


# ---- submit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    run_dir: Path
    job_ids: list[str]


def read_jobs(run_dir: Path) -> dict[str, Any]:
    """The run directory's SLURM record, validated (launcher.runfiles: bounded size and nesting,
    job ids digits only); a damaged or hostile one is a UserError (exit 2), never a crash."""
    path = RunDir(run_dir).slurm_jobs
    if not path.exists() and not path.is_symlink():
        return {"job_ids": [], "submissions": []}
    try:
        record = runfiles.read_json_object(path)
        ids = record.get("job_ids")
        if not isinstance(ids, list):
            raise runfiles.RunFileError("job_ids is not a list of job ids")
        record["job_ids"] = [runfiles.job_id(i) for i in ids]
        submissions = record.get("submissions", [])
        if not isinstance(submissions, list) or not all(isinstance(s, dict) for s in submissions):
            raise runfiles.RunFileError("submissions is not a list of objects")
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{path}: not a readable SLURM record ({exc}); it should be JSON like "
            '{"job_ids": ["123"], "submissions": []}. Fix or remove it (jobs it named are '
            "still listed by `squeue --me`)"
        ) from None
    return dict(record)


def live_jobs(run_dir: Path) -> list[str]:
    """Jobs of the run directory's slurm.json that SLURM still has queued or running (none when
    there is no record; a record that cannot be checked because no SLURM client is on PATH counts
    as none: the job's own lock on the run directory still keeps a second writer out)."""
    ids = read_jobs(run_dir)["job_ids"]
    if not ids or shutil.which("scontrol") is None:
        return []
    return [j for j in ids if job_state(j) not in FINISHED | {None}]


def refuse_live_jobs(run_dir: Path) -> None:
    """`llmtrain run` into a run directory whose SLURM job is queued or running: exit 2."""
    active = live_jobs(run_dir)
    if active:
        raise UserError(
            f"{run_dir} belongs to SLURM job(s) {', '.join(active)}, queued or running: two "
            f"writers would corrupt the run. Follow it with `llmtrain status {run_dir}`, stop it "
            f"with `llmtrain cancel {run_dir}` first, or start a separate run with --fresh or "
            "run.name=OTHER"
        )


def _sbatch(script: Path, dependency: str | None, cwd: str, secrets: dict[str, str]) -> str:
    args = ["sbatch", "--parsable"]
    env = None
    if secrets:
        # The job inherits sbatch's environment: the only way secrets reach it. --export=ALL on
        # the command line wins over an SBATCH_EXPORT the user may have set.
        args.append("--export=ALL")
        env = {**os.environ, **secrets}
    if dependency:
        args.append(f"--dependency=afterany:{dependency}")
    args.append(str(script))
    tool = _tool("sbatch")
    done = subprocess.run(
        [tool, *args[1:]], capture_output=True, text=True, cwd=cwd, timeout=60, env=env
    )
    if done.returncode != 0:
        raise UserError(f"sbatch refused the job: {(done.stderr or done.stdout).strip()}")
    job = done.stdout.strip().split(";")[0]
    if not runfiles.is_job_id(job):
        raise UserError(f"sbatch answered {job[:80]!r}, not a job id; the job may still be queued")
    return job


def submit(composed: Composed, force: bool = False, allow_config_change: bool = False) -> Submitted:
    cfg = composed.config
    secrets = secret_env(cfg, os.environ)  # a missing secret stops here, before any write
    plan = preflight(cfg, force=force, local=False)
    problems = cluster_problems(cfg)
    if problems:
        raise UserError("cannot submit this job:\n- " + "\n- ".join(problems))
    run_dir = run_dir_for(composed).resolve()
    workdir = os.getcwd()
    plan_doc = plan_to_json(plan)
    # Rendered once before anything is written or queued: a value that cannot be written safely
    # stops here (validate reports the same, see launcher/config/script_values.py).
    run_files(composed, plan_doc, SLURM, place_of(cfg, run_dir))
    active = live_jobs(run_dir)
    if active:
        raise UserError(
            f"{run_dir} already has job(s) {', '.join(active)} queued or running; follow them "
            f"with `llmtrain status {run_dir}` or stop them with `llmtrain cancel {run_dir}`"
        )
    # Takes the lock and writes the run directory (config.yaml, plan.json, job.sbatch, ...).
    prepared = prepare_run_dir(
        composed, plan_doc, fresh=False, mode=SLURM, allow_config_change=allow_config_change
    )
    try:
        run = RunDir(prepared.run_dir)
        ids = [_sbatch(run.sbatch_script, None, workdir, secrets)]
        for _ in range(cfg.slurm.chain):
            ids.append(_sbatch(run.sbatch_script, ids[-1], workdir, secrets))
        record = read_jobs(run.root)
        record["job_ids"] = [*record["job_ids"], *ids]
        record["submissions"] = [
            *record.get("submissions", []),
            {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "job_ids": ids, "cwd": workdir},
        ]
        fsio.write_text_atomic(run.slurm_jobs, json.dumps(record, indent=2) + "\n", root=run.root)
    finally:
        prepared.release()
    return Submitted(run_dir=run.root, job_ids=ids)


# ---- status / logs / cancel -----------------------------------------------------------------


def job_info(job_id: str) -> dict[str, str] | None:
    """`scontrol show job -o` fields, or None when SLURM no longer knows the job."""
    tool = _tool("scontrol")
    done = subprocess.run(
        [tool, "show", "job", "-o", "--", runfiles.job_id(job_id)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return _fields(done.stdout.splitlines()[0])


def job_state(job_id: str) -> str | None:
    info = job_info(job_id)
    return info.get("JobState") if info else None


@dataclass(frozen=True)
class Target:
    run_dir: Path | None
    job_ids: list[str]


def resolve(target: str) -> Target:
    """A job id or a run directory -> the run directory and its job ids."""
    path = Path(target).expanduser()
    if path.is_dir():
        ids = read_jobs(path)["job_ids"]
        if not ids:
            raise UserError(f"{target}: no SLURM jobs recorded in {path / JOBS_FILE}")
        return Target(path.resolve(), list(ids))
    if not runfiles.is_job_id(target):
        raise UserError(f"{target}: neither a SLURM job id nor a run directory")
    info = job_info(target)
    if info is None:
        raise UserError(f"job {target}: SLURM does not know it (finished long ago, or a typo?)")
    run_dir = None
    stdout = info.get("StdOut")
    if stdout and Path(stdout).parent.name == LOGS:
        candidate = Path(stdout).parent.parent
        if (candidate / JOBS_FILE).is_file():
            run_dir = candidate
    return Target(run_dir, [target])


def progress(run_dir: Path) -> str | None:
    """ "step N, loss L" from the last line of metrics.jsonl (read back bounded and checked)."""
    metrics = RunDir(run_dir).metrics
    if not metrics.is_file() and not metrics.is_symlink():
        return None
    try:
        line = runfiles.last_line(metrics)
        last = runfiles.loads(line, max_bytes=65536) if line else None
    except (OSError, ValueError):  # a line being written, a damaged or hostile file
        return "progress unknown (last line of metrics.jsonl is not a metrics record)"
    if not isinstance(last, dict):
        return None
    step, loss = last.get("step"), last.get("loss")
    if isinstance(step, bool) or not isinstance(step, int):
        return "progress unknown (last line of metrics.jsonl has no step number)"
    if isinstance(loss, bool) or not isinstance(loss, int | float):
        return f"step {step}"
    return f"step {step}, loss {loss:.4f}"


def status_document(target: Target) -> dict[str, Any]:
    """The run directory's progress and each job's SLURM state (`status --json`)."""
    doc: dict[str, Any] = {"run_dir": str(target.run_dir) if target.run_dir else None}
    if target.run_dir is not None:
        doc["progress"] = progress(target.run_dir)
        doc["finished"] = RunDir(target.run_dir).summary.is_file()
    jobs = []
    for job in target.job_ids:
        info = job_info(job)
        if info is None:
            jobs.append({"job": job, "state": None})
            continue
        reason = info.get("Reason", "None")
        jobs.append(
            {
                "job": job,
                "state": info.get("JobState"),
                "reason": reason if reason not in ("None", "") else None,
                "nodes": info.get("NodeList", "?"),
                "elapsed": info.get("RunTime", "?"),
                "restarts": info.get("Restarts", "0"),
                "exit": info.get("ExitCode", "?"),
            }
        )
    doc["jobs"] = jobs
    return doc


def status_lines(target: Target) -> list[str]:
    doc = status_document(target)
    lines = []
    if doc["run_dir"] is not None:
        lines.append(f"run directory {doc['run_dir']}")
        if doc["progress"]:
            lines.append(f"progress: {doc['progress']}")
        if doc["finished"]:
            lines.append("summary.json written: training finished")
    for job in doc["jobs"]:
        if job["state"] is None:
            lines.append(f"job {job['job']}: unknown to SLURM now")
            continue
        lines.append(
            f"job {job['job']}: {job['state']}"
            + (f" ({job['reason']})" if job["reason"] else "")
            + f", nodes {job['nodes']}, elapsed {job['elapsed']}, "
            f"restarts {job['restarts']}, exit {job['exit']}"
        )
    return lines


def log_files(target: Target) -> list[Path]:
    files = []
    for job in target.job_ids:
        info = job_info(job) or {}
        for key, suffix in (("StdOut", "out"), ("StdErr", "err")):
            path = info.get(key)
            if path:
                files.append(Path(path.replace("%j", job)))
            elif target.run_dir is not None:
                files.append(RunDir(target.run_dir).slurm_log(job, suffix))
    if target.run_dir is not None:
        # The ranks write to their own logs, never to the job's stdout: rank 0's holds the step
        # lines and the summary (launcher.launch.console copies it to a terminal for local runs).
        files.append(RunDir(target.run_dir).rank_log(0))
    return list(dict.fromkeys(files))


def still_listed(job_ids: list[str]) -> list[str]:
    """Jobs squeue still lists: pending, running, or completing (processes being stopped)."""
    tool = _tool("squeue")
    done = subprocess.run(
        [tool, "-h", "-o", "%i %T", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def cancel(target: Target, wait_s: float = 60.0) -> list[str]:
    """scancel every job of the target, then wait (bounded) until SLURM has stopped every process
    of them (no longer listed as completing). Returns one status line per job."""
    ids = [runfiles.job_id(j) for j in target.job_ids]
    _run(["scancel", "--", *ids], "scancel failed")
    deadline = time.monotonic() + wait_s
    while still_listed(target.job_ids) and time.monotonic() < deadline:
        time.sleep(0.3)
    left = set(still_listed(target.job_ids))
    return [
        f"job {j}: {job_state(j) or 'gone'}" + (" (still stopping)" if j in left else "")
        for j in target.job_ids
    ]
