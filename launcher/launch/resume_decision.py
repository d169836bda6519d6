"""What `run` and `submit` do in a run directory that may already hold a run: resume it, start a
new one, or refuse (exit 2, nothing written). Decided under the run directory's lock, before any
file is written (``launcher.launch.local.prepare_run_dir``).

- A run file the decision needs that is there but is not a regular file (config.yaml,
  config_history.jsonl or a staged config_history.next.jsonl that is a FIFO, a link to
  /dev/zero, a folder, a symbolic link): refused as unreadable. Before, `is_file()` said "no
  run here", so a FIFO or /dev/zero config.yaml let a resume change lr and steps unchecked and
  unrecorded, and a FIFO config_history.jsonl blocked `run` forever while it held the lock.
- checkpoint.resume=false over a run that holds checkpoints: refused. Training again from step
  0 in place would replace its checkpoints, write two runs into one metrics.jsonl and rewrite
  config.yaml; `--fresh` starts the new run in a new folder. (A brand-new folder is unaffected.)
- A resume (checkpoint.resume, config.yaml and checkpoints there) whose configuration changes
  what is trained: refused unless `--allow-config-change` (``launcher.launch.resume_refusal``).
  Accepted changes are staged as one line (``history_line``) that rank 0 appends to
  config_history.jsonl only once the checkpoint loaded (``accept_resume`` in
  launcher/config/run_config.py), so a resume that fails (another base under LoRA adapters,
  another shape) records nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import time
from dataclasses import dataclass, field

from launcher import bounded_read
from launcher.config.composition.compose import Composed
from launcher.config.run_config import ALLOW_CHANGE_FLAG, Change
from launcher.errors import UserError
from launcher.launch.resume_refusal import command_word, has_checkpoints, hide_secrets, resume_of
from launcher.render.run_files import LOCAL
from launcher.rundir import RunDir


@dataclass(frozen=True)
class Decision:
    resuming: bool  # config.next.yaml is staged; rank 0 accepts it once the checkpoint loaded
    changes: list[Change] = field(default_factory=list)


def unreadable(run: RunDir) -> str | None:
    """Why a run file the decision reads or appends to cannot be used (None: each is absent or a
    regular file). Only the kind is looked at (lstat); nothing is opened."""
    for path in (run.config, run.config_history, run.pending_history):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{path} cannot be examined ({exc.strerror})"
        if not stat.S_ISREG(mode):
            return f"{path} is {bounded_read.kind(mode)}, not a regular file"
    return None


def _refuse_unreadable(run: RunDir, problem: str, composed: Composed, mode: str) -> UserError:
    word = ["llmtrain", command_word(mode)]
    overrides = hide_secrets(composed, list(composed.overrides))
    fresh = (
        f"start a new run instead:  {shlex.join([*word, *overrides])} --fresh"
        if mode == LOCAL
        else "start a new run instead: give it another run.name"
    )
    return UserError(
        f"{run.root}: {problem}. llmtrain cannot tell what this run trained or record what a "
        "resume changes, so it neither resumes it nor starts over there; nothing was started "
        f"or written. Put the run's own file back (or remove what is in its place), or {fresh}"
    )


def _refuse_restart(run: RunDir, composed: Composed, mode: str) -> UserError:
    word = ["llmtrain", command_word(mode)]
    overrides = hide_secrets(composed, list(composed.overrides))
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "checkpoint.resume"]
    fresh = (
        f"  to start a new run in a new folder:  {shlex.join([*word, *overrides])} --fresh"
        if mode == LOCAL
        else "  to start a new run: give it another run.name"
    )
    return UserError(
        f"{run.root} holds a run (checkpoints in {run.checkpoints}); checkpoint.resume=false "
        "would train it again from step 0 in this folder, replacing its checkpoints, appending "
        "a second run to its metrics.jsonl and rewriting its config.yaml. Nothing was started "
        f"or written.\n{fresh}\n"
        f"  to resume it instead:  {shlex.join([*word, *kept])}\n"
        f"  ({ALLOW_CHANGE_FLAG} continues a run with new values; it never starts one over in "
        "place)"
    )


def refusal_before_resume(run: RunDir, composed: Composed, mode: str) -> UserError | None:
    """The refusal that comes before any resume is weighed (an unreadable run file,
    checkpoint.resume=false over a run's checkpoints), or None. `run` raises it under the lock;
    the dry runs and `diff` (launcher.verdict.with_resume) show it."""
    problem = unreadable(run)
    if problem is not None:
        return _refuse_unreadable(run, problem, composed, mode)
    if not composed.config.checkpoint.resume and has_checkpoints(run):
        return _refuse_restart(run, composed, mode)
    return None


def decide(run: RunDir, composed: Composed, *, allow_config_change: bool, mode: str) -> Decision:
    """Resume, start, or refuse (UserError, exit 2): see the module docstring. The resume itself
    is weighed by ``resume_refusal.resume_of``, the decision the dry runs and `diff` show."""
    refused = refusal_before_resume(run, composed, mode)
    if refused is not None:
        raise refused
    # Resuming a run an older llmtrain started: exit 2 naming the keys this one does not know
    # (launcher.config.run_config), before anything is written or started.
    resume = resume_of(run, composed, mode, allow_config_change=allow_config_change)
    if resume is None:
        return Decision(resuming=False)
    if resume.refusal is not None:
        raise UserError(resume.refusal)
    return Decision(resuming=True, changes=resume.changes)


def history_line(changes: list[Change]) -> str:
    """The config_history.jsonl line of a resume that accepted `changes`."""
    trajectory = [c.key for c in changes if c.trajectory]
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "event": "resume",
        "accepted": ALLOW_CHANGE_FLAG if trajectory else "no change to what is trained",
        "trajectory_keys": trajectory,
        "changes": [
            {"key": c.key, "old": c.old, "new": c.new, "trajectory": c.trajectory} for c in changes
        ],
    }
    return json.dumps(entry, sort_keys=False, default=str) + "\n"
