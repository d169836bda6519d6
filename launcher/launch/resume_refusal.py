"""Why `run` or `submit` refuses to resume a run whose recorded configuration differs from the
command's in what it trains (launcher.config.run_config.changes_trajectory), and what to type
instead: the command that resumes it as it was started (built by the one builder of resume
commands, launch.run_record.resume_command, and checked by composing it), the flag that accepts
the change, a new run."""

from __future__ import annotations

import os
import shlex
from typing import Any

from launcher.config.composition.compose import Composed, compose_config
from launcher.config.run_config import (
    ALLOW_CHANGE_FLAG,
    Change,
    config_changes,
    restoring_overrides,
)
from launcher.config.secrets import secret_env
from launcher.errors import UserError
from launcher.launch.run_record import REDACTED, read_command, resume_command
from launcher.render.run_files import LOCAL
from launcher.rundir import RunDir


def command_word(mode: str) -> str:
    return "run" if mode == LOCAL else "submit"


def hide_secrets(composed: Composed, overrides: list[str]) -> list[str]:
    """`overrides` as a message may repeat them: a secret's value never printed (its variable
    instead where the environment holds it, else ***)."""
    for name, value in secret_env(composed.config, os.environ).items():
        if len(value) >= 4:
            shown = f"${{oc.env:{name}}}" if os.environ.get(name) == value else "***"
            overrides = [o.replace(value, shown) for o in overrides]
    return overrides


def composes_back(recorded: dict[str, Any], overrides: list[str]) -> bool:
    """Whether `overrides` compose to the run's recorded trajectory (`recorded`: config.yaml)."""
    try:
        again = compose_config(overrides)
    except UserError:
        return False
    return not any(c.trajectory for c in config_changes(recorded, again.values))


def as_started(
    run: RunDir, recorded: dict[str, Any], composed: Composed, changes: list[Change], mode: str
) -> str | None:
    """The command that resumes the run as it was started, or None when none composes back to
    its trajectory: this command with each changed key set back to the run's value, else the
    command the run recorded (command.json) when it was started by this command word."""
    cwd = os.getcwd()
    word = command_word(mode)
    restored = restoring_overrides(composed.overrides, changes)
    candidates = [({"command": word, "typed": hide_secrets(composed, restored)}, restored)]
    own = read_command(run.root)
    # A record with a secret REDACTED in it is not runnable as recorded.
    if own is not None and own["command"] == word and not any(REDACTED in t for t in own["typed"]):
        candidates.append((own, own["overrides"]))
    for record, overrides in candidates:
        if composes_back(recorded, overrides):
            full = {"detach": False, "fresh": False, "cwd": cwd, **record}
            return resume_command(full, run.root, cwd)
    return None


def resume_refusal(
    run: RunDir, recorded: dict[str, Any], composed: Composed, changes: list[Change], mode: str
) -> str:
    """Why this resume is refused, and what to type instead: the command that resumes the run as
    it was (``as_started``), the flag that accepts the change, a new run."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in composed.overrides}
    lines = []
    for change in changes:
        if change.trajectory:
            named = change.key in given or change.key.split(".")[0] in given  # key or its group
            why = "" if named else " (not set on this command: the recipe's value)"
            lines.append(f"  {change.line()}{why}")
    word = ["llmtrain", command_word(mode)]
    again = as_started(run, recorded, composed, changes, mode)
    # The commands repeat the user's overrides: a secret given there is never printed.
    overrides = hide_secrets(composed, list(composed.overrides))
    resume = (
        f"  to resume it as it was started:  {again}\n"
        if again is not None
        else "  to resume it as it was started: set each key above back to its old value\n"
    )
    given_args = shlex.join([*word, *overrides, ALLOW_CHANGE_FLAG])
    fresh = (
        f"  to start a new run instead:  {shlex.join([*word, *overrides])} --fresh"
        if mode == LOCAL
        else "  to start a new run instead: give it another run.name"
    )
    return (
        f"{run.root} holds a run (checkpoints in {run.checkpoints}) whose configuration "
        f"({run.config}) differs from this command's in what it trains:\n"
        + "\n".join(lines)
        + "\nNothing was started or written.\n"
        + resume
        + f"  to continue it with the new values:  {given_args}  (recorded in "
        f"{run.config_history})\n" + fresh
    )
