"""`llmtrain submit` on a real SLURM cluster: slurmctld + two slurmd nodes on this machine.

The session fixture starts the cluster with scripts/slurm/start-cluster.sh (root and apt or an
installed slurm needed; skipped with the reason otherwise) and stops it afterwards if it started
it. Every test submits through the CLI from its own temporary folder, polls `scontrol show job`
(never `sbatch --wait`), and bounds every wait.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli import llmtrain

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "slurm"
CLUSTER_DIR = Path(os.environ.get("LLMTRAIN_SLURM_DIR", "/tmp/llmtrain-slurm-cluster"))
SLURM_CONF = CLUSTER_DIR / "etc" / "slurm.conf"

# The cluster binds each job to the CPUs it was given (TaskPlugin=task/affinity), and its two
# nodes share this machine, each counting from CPU 0: with one CPU per node both ranks of a job
# would share CPU 0. So the jobs of JOB take two CPUs per node (the whole node when nproc is 2)
# and keep one thread per rank, as these tests ran before the binding; a test that runs two jobs
# at once asks for one CPU per node.
NODE_CPUS = min(2, len(os.sched_getaffinity(0)))
ONE_THREAD = "+cluster.env.OMP_NUM_THREADS=1"
# The tiny recipe, shortened, as one job over two nodes with one (gloo) process each.
JOB = [
    "model.seq_length=64",
    "train.micro_batch_size=4",
    "optim.warmup_steps=2",
    "train.log_every=10",
    "launcher=slurm",
    "cluster=cpu",
    "cluster.num_nodes=2",
    "cluster.gpus_per_node=1",
    f"slurm.cpus_per_task={NODE_CPUS}",
    ONE_THREAD,
]


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ours_running() -> bool:
    try:
        pid = int((CLUSTER_DIR / "slurmctld.pid").read_text())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("SLURM tests start slurmctld/slurmd and install packages: they need root")
    if shutil.which("slurmctld", path="/usr/sbin:/usr/bin") is None and not shutil.which("apt-get"):
        pytest.skip("SLURM is not installed and apt-get is not available to install it")
    was_running = _ours_running()
    if not was_running and _port_in_use(6817):
        pytest.skip("another SLURM controller already listens on port 6817 (one per machine)")
    started = subprocess.run(
        [str(SCRIPTS / "start-cluster.sh")], capture_output=True, text=True, timeout=600
    )
    if started.returncode != 0:
        if "apt-get install failed" in started.stderr:
            pytest.skip(f"cannot install SLURM: {started.stderr[-500:]}")
        pytest.fail(f"start-cluster.sh failed:\n{started.stdout}\n{started.stderr}")
    env = {**os.environ, "SLURM_CONF": str(SLURM_CONF)}
    env["PATH"] = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin"
    yield env
    if not was_running:
        subprocess.run([str(SCRIPTS / "stop-cluster.sh")], capture_output=True, timeout=120)


def submit(env: dict[str, str], cwd: Path, *overrides: str) -> tuple[str, Path]:
    done = llmtrain("submit", *JOB, *overrides, cwd=cwd, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    job = done.stdout.split("submitted job ")[1].split()[0]
    run_dir = Path(done.stdout.split("run directory ")[1].split("\n")[0].strip())
    assert json.loads((run_dir / "slurm.json").read_text())["job_ids"] == [job]
    return job, run_dir


def job_fields(env: dict[str, str], job: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True, timeout=30
    ).stdout
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def wait_for_state(env: dict[str, str], job: str, states: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = job_fields(env, job)
        if fields.get("JobState") in states:
            return fields
        time.sleep(0.5)
    pytest.fail(f"job {job} not in {states} after {timeout}s: {fields}")


def metric_steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_steps(run_dir: Path, steps: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(metric_steps(run_dir)) >= steps:
            return
        time.sleep(0.2)
    pytest.fail(f"{run_dir}: fewer than {steps} steps after {timeout}s")


def slurm_output(run_dir: Path, job: str) -> str:
    logs = run_dir / "logs"
    return "".join(
        p.read_text(errors="replace")
        for p in (logs / f"slurm-{job}.out", logs / f"slurm-{job}.err")
        if p.is_file()
    )


def trainer_processes(run_dir: Path) -> list[str]:
    """Live processes of this run: trainers and torchrun agents whose command names it."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(run_dir) in cmd and ("launcher.train.loop" in cmd or "torch.distributed" in cmd):
            found.append(f"{proc.name}: {cmd}")
    return found


def test_two_nodes_train_with_falling_loss(cluster: dict[str, str], tmp_path: Path) -> None:
    # A shell would run parts of it; sbatch's own reader would drop a single-quoted backslash.
    name = "x; touch PWNED $(touch PWNED2) `touch PWNED3` a\\b"
    job, run_dir = submit(cluster, tmp_path, "train.steps=40", f"slurm.job_name='{name}'")
    fields = wait_for_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert fields["JobState"] == "COMPLETED", slurm_output(run_dir, job)
    assert fields["NumNodes"] == "2" and fields["NodeList"] == "n[1-2]"
    # The job name reached SLURM as the literal string, and nothing in it ran.
    names = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job, "-o", "%j"],
        env=cluster,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    assert names == name
    assert not any((tmp_path / f).exists() for f in ("PWNED", "PWNED2", "PWNED3"))
    assert not any(Path(os.path.expanduser("~"), f).exists() for f in ("PWNED", "PWNED2"))

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    losses = [m["loss"] for m in metric_steps(run_dir)]
    assert len(losses) == 40 and losses[-1] < losses[0] - 0.5, losses
    assert (run_dir / "hostfile").read_text() == "n1 slots=1\nn2 slots=1\n"
    assert "rendezvous 127.0.0.1:" in slurm_output(run_dir, job)
    status = llmtrain("status", job, cwd=tmp_path, env=cluster)
    assert status.returncode == 0 and "COMPLETED" in status.stdout and "step 40" in status.stdout
    logs = llmtrain("logs", str(run_dir), cwd=tmp_path, env=cluster)
    assert "done: 40 steps" in logs.stdout


def cpus_allowed(pid: str) -> int:
    """How many CPUs process `pid` may run on (its affinity mask, /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    listed = re.search(r"^Cpus_allowed_list:\s*(\S+)$", status, re.M)[1]
    ranges = [part.split("-") for part in listed.split(",")]
    return sum(int(r[-1]) - int(r[0]) + 1 for r in ranges)


def rank_environ(pid: str) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(v.decode(errors="replace").split("=", 1) for v in raw if b"=" in v)


def rank_pids(run_dir: Path) -> list[str]:
    """The trainer ranks of this run (not the torchrun agents or their wrappers)."""
    return [
        line.split(":")[0]
        for line in trainer_processes(run_dir)
        if "torch.distributed" not in line and "launcher.train.loop" in line
    ]


def test_a_rendered_job_runs_as_is_and_each_rank_gets_its_cpus(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """Issue 42 items 8-9: `render --out DIR`, then plain `sbatch DIR/job.sbatch`. The job runs as
    written (SLURM creates no folder for --output: render made logs/), it is named after the run,
    and srun hands each node's torchrun the CPUs the job asked: slurm.cpus_per_task unset, so one
    per rank, 2 per node here. What a rank sees is read from outside, in /proc: its CPU affinity
    (the test cluster runs TaskPlugin=task/affinity, which binds each task with sched_setaffinity;
    its ranks inherit the mask) and OMP_NUM_THREADS. Without cgroups nothing stops a process
    from widening its own mask again; the check is that SLURM gave what was asked."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the nodes need 2 CPUs each (CPUS=nproc in start-cluster.sh)")
    out = tmp_path / "job dir"  # a space: --output and --chdir quoted as sbatch reads them
    mine = ("cluster.gpus_per_node=1", "train.micro_batch_size=4", ONE_THREAD)
    job_cfg = [k for k in JOB if k not in mine and not k.startswith("slurm.cpus_per_task=")]
    job_cfg += ["cluster.gpus_per_node=2", "train.micro_batch_size=2", "train.steps=100000"]
    job_cfg.append("run.name=cpus run")
    done = llmtrain("render", *job_cfg, "--out", str(out), cwd=tmp_path, env=cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    sent = subprocess.run(
        ["sbatch", "--parsable", str(out / "job.sbatch")],
        cwd=tmp_path,
        env=cluster,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    job = sent.stdout.strip().split(";")[0]
    try:
        fields = wait_for_state(cluster, job, {"RUNNING", "FAILED", "COMPLETED"}, timeout=120)
        assert fields["JobState"] == "RUNNING", (fields, slurm_output(out, job))
        name = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%j"],
            env=cluster,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        assert name == "cpus run"
        deadline = time.monotonic() + 180
        while len(ranks := rank_pids(out)) < 4:  # 2 nodes x 2 ranks, started by torchrun
            assert time.monotonic() < deadline, (trainer_processes(out), slurm_output(out, job))
            time.sleep(0.3)
        seen = {pid: (cpus_allowed(pid), rank_environ(pid).get("OMP_NUM_THREADS")) for pid in ranks}
        assert set(seen.values()) == {(2, "1")}, seen
        assert "rendezvous 127.0.0.1:" in slurm_output(out, job)
    finally:
        subprocess.run(["scancel", job], env=cluster, timeout=30)
        wait_for_state(cluster, job, {"CANCELLED", "FAILED", "COMPLETED"}, timeout=120)
    deadline = time.monotonic() + 60
    while trainer_processes(out) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not trainer_processes(out)


def test_usr1_preemption_requeues_and_resumes(cluster: dict[str, str], tmp_path: Path) -> None:
    total = 150  # the signal lands after step 30, its checkpoint within a few steps
    job, run_dir = submit(cluster, tmp_path, f"train.steps={total}", "checkpoint.every_steps=50")
    wait_for_state(cluster, job, {"RUNNING"}, timeout=120)
    wait_for_steps(run_dir, 30, timeout=180)
    # What SLURM does --signal=B:USR1@grace before the time limit: USR1 to the batch shell only.
    subprocess.run(
        ["scancel", "--signal=USR1", "--batch", job], env=cluster, check=True, timeout=30
    )
    fields = wait_for_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=400)
    output = slurm_output(run_dir, job)
    assert fields["JobState"] == "COMPLETED", output
    assert int(fields["Restarts"]) == 1, fields
    assert "requeueing" in output and "restart 1" in output

    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert "preempted: checkpoint written at step" in rank0, rank0
    stopped = int(re.search(r"preempted: checkpoint written at step (\d+)", rank0)[1])
    assert 30 <= stopped < total, "the preemption should land mid-run"
    assert f"(step {stopped})" in rank0  # "resumed from .../step_... (step K)"
    # Nothing lost and nothing repeated: the requeued job went on from the step it stopped at
    # (the checkpoint written on the signal), so every step was trained exactly once.
    steps = [m["step"] for m in metric_steps(run_dir)]
    assert steps == list(range(1, total + 1)), steps
    assert (run_dir / "checkpoints" / f"step_{total:08d}").is_dir()
    assert not trainer_processes(run_dir)


def test_cancel_stops_every_process(cluster: dict[str, str], tmp_path: Path) -> None:
    job, run_dir = submit(cluster, tmp_path, "train.steps=100000")
    wait_for_state(cluster, job, {"RUNNING"}, timeout=120)
    wait_for_steps(run_dir, 5, timeout=180)
    assert len(trainer_processes(run_dir)) >= 4  # 2 torchrun agents + 2 trainers
    done = llmtrain("cancel", str(run_dir), cwd=tmp_path, env=cluster)
    assert done.returncode == 0, done.stderr
    assert f"job {job}: CANCELLED" in done.stdout
    assert job_fields(cluster, job)["JobState"] == "CANCELLED"
    left = trainer_processes(run_dir)
    assert not left, left
    # A cancelled job is not requeued.
    time.sleep(2)
    assert job_fields(cluster, job)["JobState"] == "CANCELLED"


def test_chained_jobs_continue_past_a_time_limit(cluster: dict[str, str], tmp_path: Path) -> None:
    # slurm.requeue=false, slurm.chain=2: three jobs, each after the previous (afterany). Job 1
    # gets USR1 on its batch shell, as --signal=B:USR1@grace does before the time limit, writes a
    # checkpoint and ends; job 2 resumes from it and finishes the run; job 3 finds the last
    # step's checkpoint and ends at once.
    total = 150  # the signal lands after step 30, its checkpoint within a few steps
    done = llmtrain(
        "submit",
        *JOB,
        f"train.steps={total}",
        "checkpoint.every_steps=50",
        "slurm.requeue=false",
        "slurm.chain=2",
        cwd=tmp_path,
        env=cluster,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = Path(done.stdout.split("run directory ")[1].split("\n")[0].strip())
    first, second, third = json.loads((run_dir / "slurm.json").read_text())["job_ids"]
    assert f"afterany:{first}" in job_fields(cluster, second).get("Dependency", "")
    assert f"afterany:{second}" in job_fields(cluster, third).get("Dependency", "")

    wait_for_state(cluster, first, {"RUNNING"}, timeout=120)
    wait_for_steps(run_dir, 30, timeout=180)
    subprocess.run(
        ["scancel", "--signal=USR1", "--batch", first], env=cluster, check=True, timeout=30
    )
    for job in (first, second, third):
        fields = wait_for_state(cluster, job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=400)
        assert fields["JobState"] == "COMPLETED", slurm_output(run_dir, job)
        assert int(fields["Restarts"]) == 0, fields
    assert "slurm.requeue is off" in slurm_output(run_dir, first)
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    stopped = int(re.search(r"preempted: checkpoint written at step (\d+)", rank0)[1])
    assert 30 <= stopped < total, "the signal should land mid-run"
    assert f"(step {stopped})" in rank0  # job 2: "resumed from .../step_... (step K)"
    assert f"all {total} steps are done" in slurm_output(run_dir, third)
    steps = [m["step"] for m in metric_steps(run_dir)]
    assert steps == list(range(1, total + 1)), steps
    assert not trainer_processes(run_dir)


def test_one_writer_per_run_directory_across_jobs_and_local_runs(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    # The reproduction: a SLURM job and a local `run` of the same configuration both trained into
    # one run directory. Now the job's batch script holds the run directory's lock (flock) and
    # `run` refuses while slurm.json shows a live job; a job started by hand (sbatch job.sbatch,
    # not in slurm.json) meets the lock of a job or a local run and stops without writing.
    # One CPU per node: the second job (sbatch by hand) must start while the first one runs.
    shared = ["run.name=shared", "checkpoint.every_steps=5", "slurm.cpus_per_task=1"]
    local = [
        "model.seq_length=64",
        "train.micro_batch_size=4",
        "optim.warmup_steps=2",
        "cluster=cpu",
        "cluster.gpus_per_node=1",
        *shared,
    ]
    # Held (pending): no lock is taken yet, slurm.json is what refuses a local run.
    held = "slurm.extra_sbatch_args=[--hold]"
    job, run_dir = submit(cluster, tmp_path, "train.steps=100000", held, *shared)
    jobs = [job]
    try:
        refused = llmtrain("run", *local, "train.steps=3", cwd=tmp_path, env=cluster)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"belongs to SLURM job(s) {job}, queued or running" in refused.stderr
        subprocess.run(["scontrol", "release", job], env=cluster, check=True, timeout=30)
        wait_for_state(cluster, job, {"RUNNING"}, timeout=120)
        # A checkpoint passed the ranks' lock identity check (inode and token from job.sbatch).
        deadline = time.monotonic() + 180
        while not (run_dir / "checkpoints" / "step_00000005").is_dir():
            assert time.monotonic() < deadline, slurm_output(run_dir, job)
            time.sleep(0.3)
        record = json.loads((run_dir / ".llmtrain.lock").read_text())
        assert record["slurm_job"] == job and record["command"] == "job.sbatch"

        # Running: the job's lock refuses a local run, naming the job.
        refused = llmtrain("run", *local, "train.steps=3", cwd=tmp_path, env=cluster)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"in use by another llmtrain run: SLURM job {job} (batch script" in refused.stderr

        def by_hand() -> str:
            """job.sbatch sent with plain sbatch: not in slurm.json, only the lock stops it."""
            out = subprocess.run(
                ["sbatch", "--parsable", str(run_dir / "job.sbatch")],
                cwd=tmp_path,
                env=cluster,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            second = out.strip().split(";")[0]
            jobs.append(second)
            # The script holds the test's `#SBATCH --hold`: release it.
            subprocess.run(["scontrol", "release", second], env=cluster, check=True, timeout=30)
            fields = wait_for_state(cluster, second, {"COMPLETED", "FAILED", "CANCELLED"}, 180)
            assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", fields
            return slurm_output(run_dir, second)

        output = by_hand()
        assert "is in use by another llmtrain run or job" in output
        assert f'"slurm_job": "{job}"' in output and "stops without writing anything" in output

        done = llmtrain("cancel", str(run_dir), cwd=tmp_path, env=cluster)
        assert done.returncode == 0 and f"job {job}: CANCELLED" in done.stdout, done.stderr

        # A local run holds the lock now (the record's jobs are finished, so `run` goes ahead; it
        # starts over rather than resume the two-node job's checkpoint on one process: those are
        # removed first, as checkpoint.resume=false over a run's checkpoints is refused).
        shutil.rmtree(run_dir / "checkpoints")
        holder = subprocess.Popen(
            [sys.executable, "-m", "launcher", "run", *local, "train.steps=100000"],
            cwd=tmp_path,
            env=cluster,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while f'"pid": {holder.pid},' not in (run_dir / ".llmtrain.lock").read_text():
                assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
                time.sleep(0.2)
            output = by_hand()
            assert holder.poll() is None, holder.communicate()
            assert f'"pid": {holder.pid}' in output and "stops without writing" in output
        finally:
            holder.terminate()  # SIGTERM: checkpoint and exit 99
            try:
                holder.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.communicate()
        assert not trainer_processes(run_dir)
    finally:  # nothing of this test outlives it
        subprocess.run(["scancel", "--", *jobs], env=cluster, timeout=30)


def test_submit_refuses_to_resume_a_local_run_on_another_layout(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    # Issue 30 item 6 across launchers: a run trained locally (one process), then `submit` of
    # the same run as a two-node job would continue its checkpoint on another layout. Refused
    # (exit 2) naming the difference, before anything is written or queued.
    local = [k for k in JOB if k not in ("launcher=slurm", "cluster.num_nodes=2")]
    first = llmtrain("run", *local, "train.steps=2", "run.name=mixed", cwd=tmp_path, env=cluster)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = tmp_path / "runs" / "mixed"
    config = (run_dir / "config.yaml").read_bytes()
    refused = llmtrain("submit", *JOB, "train.steps=2", "run.name=mixed", cwd=tmp_path, env=cluster)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    assert "cluster.num_nodes: 1 -> 2" in message, message
    assert "llmtrain submit" in message and "--allow-config-change" in message
    assert (run_dir / "config.yaml").read_bytes() == config
    assert not (run_dir / "slurm.json").exists() and not (run_dir / "job.sbatch").exists()
