"""One run handle for `status`, `logs` and `cancel` (launcher.launch.handles): a name, a run
directory or a job id resolves to a LocalRun or a SlurmJob; logs are read and followed by one
function (launcher.launch.run_logs); how a local run ended is read by named steps
(launcher.launch.run_outcome); plan's decisions are launcher.verdict's; a refused resume offers
the command built by the one builder (launcher.launch.run_record.resume_command)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.run_config import config_changes
from launcher.errors import UserError
from launcher.launch import run_logs
from launcher.launch.handles import LocalRun, SlurmJob, open_run
from launcher.launch.resume_refusal import as_started
from launcher.launch.run_outcome import (
    Launch,
    RunDiverged,
    RunFailed,
    RunInterrupted,
    RunPreempted,
    Stops,
    finished,
    raise_failure,
    raise_stopped,
)
from launcher.launch.run_record import record_command
from launcher.rundir import RunDir


def make_run(root: Path, name: str, *, steps: int = 3, jobs: list[str] | None = None) -> Path:
    folder = root / name
    (folder / "logs").mkdir(parents=True)
    (folder / "config.yaml").write_text("recipe: tiny\ntrain:\n  steps: 10\n")
    lines = [json.dumps({"step": s, "loss": 5.0 - s}) for s in range(1, steps + 1)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if jobs is not None:
        (folder / "slurm.json").write_text(json.dumps({"job_ids": jobs, "submissions": []}))
    return folder


@pytest.mark.integration  # starts a process (scontrol / a lock holder)
def test_a_name_resolves_to_a_local_run_and_a_submitted_run_to_its_jobs(tmp_path: Path) -> None:
    make_run(tmp_path, "tiny-aaaa1111")
    make_run(tmp_path, "other-bbbb2222", jobs=["4242"])
    notes: list[str] = []
    local = open_run("tiny", tmp_path, note=notes.append)
    assert isinstance(local, LocalRun) and local.info.name == "tiny-aaaa1111"
    assert local.units == "runs" and notes == []
    submitted = open_run("other-bbbb2222", tmp_path)
    assert isinstance(submitted, SlurmJob) and submitted.units == "jobs"
    assert submitted.target.job_ids == ["4242"]
    assert submitted.target.run_dir == (tmp_path / "other-bbbb2222").resolve()
    assert submitted.resume_command() is None
    with pytest.raises(UserError, match="neither a run directory nor a SLURM job id"):
        open_run("nothing-here", tmp_path)


def test_a_name_several_runs_begin_with_is_resolved_with_a_note(tmp_path: Path) -> None:
    older, newer = make_run(tmp_path, "tiny-aaaa1111"), make_run(tmp_path, "tiny-bbbb2222")
    os.utime(older / "config.yaml", (time.time() - 100, time.time() - 100))
    notes: list[str] = []
    run = open_run("tiny", tmp_path, note=notes.append)
    assert isinstance(run, LocalRun) and run.info.folder == newer.resolve()
    assert len(notes) == 1 and "tiny names 2 runs; using tiny-bbbb2222" in notes[0]


def test_a_local_run_s_status_has_its_losses_and_the_command_that_resumes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_run(tmp_path, "tiny-aaaa1111")
    monkeypatch.chdir(tmp_path)
    record_command(folder, typed=["train.steps=10"], overrides=["train.steps=10"], values={},
                   fresh=True, detach=False)  # fmt: skip
    run = open_run(str(folder), tmp_path)
    document = run.status_document()
    assert document["losses"] == [[1, 4.0], [2, 3.0], [3, 2.0]]
    assert document["status"] == "interrupted"
    resume = "llmtrain run train.steps=10 run.name=tiny-aaaa1111"  # --fresh: its name given
    assert document["resume_command"] == resume
    assert f"resume it (from its newest checkpoint, if any): {resume}" in run.status_lines()
    assert run.resume_command("/elsewhere") == f"cd {tmp_path} && {resume}"
    with pytest.raises(UserError, match="is not running"):
        run.cancel()


def test_logs_are_followed_until_the_run_stops_and_start_at_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_logs, "LOG_TAIL_BYTES", 10)
    log = tmp_path / "logs" / "rank0.log"
    log.parent.mkdir()
    log.write_bytes(b"0123456789abcdefghij")  # 20 bytes: the first 10 are not shown
    rounds: list[int] = []

    def going() -> bool:
        rounds.append(1)
        if len(rounds) == 1:
            with log.open("ab") as f:
                f.write(b"-more\n")  # written while the run still runs
            return True
        return False

    shown: list[str] = []
    run_logs.follow_logs(
        lambda: [log], tmp_path, shown.append, follow=True, going=going, tail=True, poll_s=0
    )
    text = "".join(shown)
    assert text.startswith("[llmtrain: the first 10 bytes of")
    assert text.endswith("]\nabcdefghij-more\n") and len(rounds) == 2
    texts = run_logs.log_texts([log, tmp_path / "absent.log"], tmp_path, tail=False)
    assert texts == [(log, b"0123456789abcdefghij-more\n"), (tmp_path / "absent.log", None)]


def test_a_log_that_is_a_link_inside_the_run_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "secret").write_text("not the run's")
    (tmp_path / "logs" / "rank0.log").symlink_to(tmp_path / "secret")
    with pytest.raises(UserError, match="symbolic link inside the run directory"):
        run_logs.read_log(tmp_path / "logs" / "rank0.log", tmp_path)


def launched(tmp_path: Path) -> Launch:
    run = RunDir(tmp_path)
    run.logs.mkdir(exist_ok=True)
    run.checkpoints.mkdir(exist_ok=True)
    run.torchrun_log.write_text("")
    return Launch(run, time.time() - 1, 0)


def test_how_a_run_ended_done_interrupted_preempted(tmp_path: Path) -> None:
    started = launched(tmp_path)
    assert finished(started, 0, Stops())
    assert not finished(started, 0, Stops(interrupted=[signal.SIGINT]))
    started.run.summary.write_text("{}")  # the last step came before the stop
    assert finished(started, 0, Stops(interrupted=[signal.SIGINT]))
    started.run.preempted.write_text(json.dumps({"step": 7}))
    assert not finished(started, 0, Stops())
    with pytest.raises(RunInterrupted, match="checkpoint at step 7") as caught:
        raise_stopped(started, Stops(interrupted=[signal.SIGINT]))
    assert caught.value.exit_code == 130
    with pytest.raises(RunPreempted):
        raise_stopped(started, Stops(forwarded=[signal.SIGUSR1]))
    started.run.preempted.unlink()
    with pytest.raises(RunInterrupted, match="before a checkpoint") as caught:
        raise_stopped(started, Stops(forwarded=[signal.SIGTERM]))
    assert caught.value.exit_code == 128 + signal.SIGTERM
    raise_stopped(started, Stops())  # not stopped: nothing raised, a failure is looked for


def test_a_failure_names_the_rank_that_failed_first(tmp_path: Path) -> None:
    started = launched(tmp_path)
    now = time.time()
    for rank, when, kind in ((1, now + 1, "RuntimeError"), (0, now, "ValueError")):
        error = {"time": when, "rank": rank, "type": kind, "message": f"rank {rank} broke"}
        started.run.rank_error(rank).write_text(json.dumps(error))
    with pytest.raises(RunFailed, match="rank 0 failed first: ValueError: rank 0 broke"):
        raise_failure(started, 1)
    diverged = {"time": now - 0.5, "rank": 2, "type": "TrainingDiverged", "message": "nan at 5"}
    started.run.rank_error(2).write_text(json.dumps(diverged))
    with pytest.raises(RunDiverged, match="nan at 5") as caught:
        raise_failure(started, 1)
    assert caught.value.exit_code == 3
    for path in started.run.rank_errors():
        path.unlink()
    started.run.torchrun_log.write_text(
        "Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n[0]:\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 99)\n"
    )
    with pytest.raises(RunFailed, match="rank 1 failed first: killed by SIGKILL"):
        raise_failure(started, 1)


def test_a_one_process_run_s_failure_is_read_from_its_own_exit_code(tmp_path: Path) -> None:
    """Without torchrun there is no failure report: the one rank's exit code says it."""
    alone = Launch(launched(tmp_path).run, time.time() - 1, 0, alone=True)
    # Killed by the OOM killer or a user: -9 from subprocess, not a stop llmtrain asked for.
    with pytest.raises(RunFailed, match="rank 0 failed first: killed by SIGKILL"):
        raise_failure(alone, -signal.SIGKILL)
    # Exited with a code of its own and no error report (a library's os._exit, say).
    with pytest.raises(RunFailed, match="rank 0 failed: exited with code 7 without an llmtrain"):
        raise_failure(alone, 7)
    # A stop signal llmtrain did not send is not "killed by": it is named as a stop.
    with pytest.raises(RunFailed, match=r"^rank 0 was stopped by SIGTERM, which llmtrain did not"):
        raise_failure(alone, -signal.SIGTERM)
    # A number that names no signal is still a signal that killed it.
    with pytest.raises(RunFailed, match="rank 0 failed first: killed by signal 200"):
        raise_failure(alone, -200)
    # torchrun's report in the log is not read for a launch without torchrun.
    alone.run.torchrun_log.write_text(
        "Failures:\nRoot Cause (first observed failure):\n[0]:\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 99)\n"
    )
    with pytest.raises(RunFailed, match=r"^rank 0 was stopped by SIGHUP"):
        raise_failure(alone, -signal.SIGHUP)


def test_plan_substitutes_a_backend_that_runs_the_layout_and_refuses_errors() -> None:
    from launcher.verdict import plan_verdict, search_configs

    # BLOOM's layout (tied embeddings, tp4 x pp12): torch refuses it, Megatron runs it.
    composed = compose_config(["recipe=bloom-176b", "backend=torch"])
    found = plan_verdict(composed)
    assert found.plan is not None and found.substitute is not None
    assert (found.substitute.requested, found.substitute.planned) == ("torch", "megatron")
    assert found.plan.config.backend.name == "megatron"
    assert not any(v.is_error for v in found.violations)
    # Arithmetic errors are never planned around.
    bad = plan_verdict(compose_config([*composed.overrides, "train.global_batch_size=2047"]))
    assert bad.plan is None and bad.substitute is None
    assert any(v.is_error and v.rule != "backend-capabilities" for v in bad.violations)
    configs = search_configs(composed, composed.overrides, any_backend=True)
    assert next(iter(configs)) == "torch" and len(configs) > 1
    assert {cfg.backend.name for cfg in configs.values()} == set(configs)
    assert list(search_configs(composed, composed.overrides, any_backend=False)) == ["torch"]


def test_a_refused_resume_offers_the_run_s_recorded_command_when_the_rebuilt_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = RunDir(tmp_path / "runs" / "d")
    run.root.mkdir(parents=True)
    first = ["run.name=d", "train.steps=3"]
    recorded = compose_config(first).values
    now = compose_config(["run.name=d"])
    changes = config_changes(recorded, now.values)
    assert as_started(run, recorded, now, changes, "local") == (
        "llmtrain run run.name=d train.steps=3"  # this command with the changed key set back
    )
    # Nothing set back (no changes known) composes to another trajectory: without a record of
    # the run's own command, no command is offered; with one, the recorded command is.
    assert as_started(run, recorded, now, [], "local") is None
    record_command(run.root, typed=first, overrides=first, values=recorded, fresh=False,
                   detach=False)  # fmt: skip
    assert as_started(run, recorded, now, [], "local") == "llmtrain run run.name=d train.steps=3"
    assert as_started(run, recorded, now, [], "slurm") is None  # `run` does not resume a submit
    redacted = ["run.name=d", "train.steps=3", "+cluster.env.WANDB_API_KEY=REDACTED"]
    record_command(run.root, typed=redacted, overrides=redacted, values=recorded, fresh=False,
                   detach=False)  # fmt: skip
    assert as_started(run, recorded, now, [], "local") is None  # not runnable as recorded
