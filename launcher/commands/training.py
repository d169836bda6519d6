"""`run` (train on this machine, in the foreground or `--detach`ed) and `submit` (a SLURM batch
job): the commands that start training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from launcher.commands.common import (
    AllowConfigChange,
    ConfigFile,
    DryRun,
    JsonFlag,
    Overrides,
    err,
    out,
    print_json,
    tell,
    with_config,
)
from launcher.commands.config import verdict

if TYPE_CHECKING:
    from launcher.config.composition.compose import Composed
    from launcher.launch.local import Prepared

Force = Annotated[
    bool, typer.Option("--force", help="Launch even if the plan predicts it will not fit.")
]
Fresh = Annotated[
    bool, typer.Option("--fresh", help="Start over in a new run directory (no resume).")
]
Detach = Annotated[
    bool,
    typer.Option(
        "--detach",
        "-d",
        help="Run in the background (its own session, output in the run directory): it "
        "survives the terminal; follow it with `llmtrain logs NAME --follow`.",
    ),
]
DetachedChild = Annotated[bool, typer.Option("--detached-child", hidden=True)]


def run(
    overrides: Overrides = None,
    config: ConfigFile = None,
    force: Force = False,
    fresh: Fresh = False,
    detach: Detach = False,
    detached_child: DetachedChild = False,
    allow_config_change: AllowConfigChange = False,
    dry_run: DryRun = False,
    as_json: JsonFlag = False,
) -> None:
    """Train on this machine, one process per device (default: the tiny recipe on the CPU)."""
    typed = [
        *(["--config", config] if config else []),
        *(["--force"] if force else []),
        *(overrides or []),
    ]
    overrides = with_config(config, overrides)
    if dry_run:
        verdict(
            "run",
            overrides or [],
            force=force,
            as_json=as_json,
            fresh=fresh,
            allow_config_change=allow_config_change,
        )
        return
    if detach and not detached_child:
        run_detached([*(["--fresh"] if fresh else []), *typed], as_json=as_json)
        return
    from launcher.config.composition.compose import compose_config
    from launcher.launch.local import prepare_run_dir
    from launcher.launch.preflight import preflight
    from launcher.launch.slurm import refuse_live_jobs
    from launcher.plan.document import plan_to_json

    composed = compose_config(overrides or [])
    plan_result = preflight(composed.config, force=force)
    # Holds the run directory's lock (exit 2 naming the holder when another run has it), and
    # refuses a run directory whose SLURM job is queued or running.
    prepared = prepare_run_dir(
        composed,
        plan_to_json(plan_result),
        fresh=fresh,
        guard=refuse_live_jobs,
        allow_config_change=allow_config_change,
    )
    try:
        train_here(
            prepared,
            composed,
            typed=typed,
            overrides=list(overrides or []),
            fresh=fresh,
            child=detached_child,
            as_json=as_json,
        )
    finally:
        prepared.release()
    if as_json:
        summary = summary_of(prepared)
        print_json({"run_dir": str(prepared.run_dir), "exit_code": 0, "summary": summary})


def train_here(
    prepared: Prepared,
    composed: Composed,
    *,
    typed: list[str],
    overrides: list[str],
    fresh: bool,
    child: bool,
    as_json: bool,
) -> None:
    """Record the command, then train in the prepared run directory until the run ends; a run
    that failed, was preempted or interrupted says how to resume it and exits with its code."""
    from launcher.launch.local import describe, launch
    from launcher.launch.run_outcome import RunFailed, RunInterrupted, RunPreempted
    from launcher.launch.run_record import read_command, record_command, resume_command

    try:
        try:  # command.json: what `status` shows and the command that resumes the run
            record_command(
                prepared.run_dir,
                typed=typed,
                overrides=overrides,
                values=composed.values,
                fresh=fresh,
                detach=child,
            )
        except OSError as exc:
            tell(err, Text(f"note: command.json not written ({exc})", style="yellow"))
        if prepared.lock is not None and prepared.lock.note:
            tell(err, Text(f"note: {prepared.lock.note}", style="yellow"))
        if child:  # from here on, output goes to logs/launcher.log
            from launcher.launch.detach import hand_over

            hand_over(prepared.run_dir)
        tell(err, Text(describe(prepared), style="dim"))
        # With --json, rank 0's progress goes to stderr and stdout gets one document at the end;
        # a detached run writes no progress (its rank-0 log has it).
        launch(prepared, progress_to_stderr=as_json, screen=not child)
    except (RunFailed, RunPreempted, RunInterrupted) as exc:
        again = resume_command(read_command(prepared.run_dir), prepared.run_dir)
        if as_json:
            print_json(
                {
                    "run_dir": str(prepared.run_dir),
                    "error": str(exc),
                    "exit_code": exc.exit_code,
                    "resume_command": again,
                }
            )
        else:
            label = "error: " if isinstance(exc, RunFailed) else ""
            tell(err, Text(label, style="bold red") + Text(str(exc)))
            tell(err, Text(f"resume: {again}", style="dim"))
        raise typer.Exit(exc.exit_code) from None


def summary_of(prepared: Prepared) -> object:
    """summary.json of a finished run (None when absent or unreadable), for `run --json`."""
    from launcher import runfiles
    from launcher.rundir import RunDir

    summary_path = RunDir(prepared.run_dir).summary
    try:
        return runfiles.read_json_object(summary_path) if summary_path.is_file() else None
    except (OSError, ValueError):
        return None


def run_detached(args: list[str], *, as_json: bool) -> None:
    """`run --detach`: start the run in the background and say how to follow and stop it."""
    from launcher.launch.detach import Refused, launcher_log, start

    started = start(args, relay=not as_json)
    if isinstance(started, Refused):  # refused or failed before it held the run directory
        if as_json:
            print_json({"error": started.said.strip(), "exit_code": started.exit_code})
        raise typer.Exit(started.exit_code)
    name = started.name
    document = {
        "run_dir": str(started.run_dir),
        "name": name,
        "pid": started.pid,
        "log": str(launcher_log(started.run_dir)),
        "follow": f"llmtrain logs {name} --follow",
        "cancel": f"llmtrain cancel {name}",
    }
    if as_json:
        print_json(document)
        return
    out.print(f"started {name} in the background (pid {started.pid})", markup=False)
    out.print(f"follow it: llmtrain logs {name} --follow", markup=False)
    out.print(f"stop it:   llmtrain cancel {name}", markup=False)


def submit(
    overrides: Overrides = None,
    config: ConfigFile = None,
    force: Annotated[
        bool, typer.Option("--force", help="Submit even if the plan predicts it will not fit.")
    ] = False,
    allow_config_change: AllowConfigChange = False,
    dry_run: DryRun = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit the run as a SLURM batch job (sbatch); print the job id and run directory."""
    overrides = with_config(config, overrides)
    if dry_run:
        verdict(
            "submit",
            overrides or [],
            force=force,
            as_json=as_json,
            allow_config_change=allow_config_change,
        )
        return
    from launcher.config.composition.compose import compose_config
    from launcher.launch.slurm import submit as submit_job

    composed = compose_config(overrides or [])
    done = submit_job(composed, force=force, allow_config_change=allow_config_change)
    if as_json:
        print_json({"job_ids": list(done.job_ids), "run_dir": str(done.run_dir)})
        return
    out.print(f"submitted job {' '.join(done.job_ids)}")
    out.print(f"run directory {done.run_dir}")
    err.print(
        Text(
            f"follow it: llmtrain status {done.job_ids[0]}; llmtrain logs --follow "
            f"{done.job_ids[0]}",
            style="dim",
        )
    )
