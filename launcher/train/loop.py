"""The training process each rank runs: ``python -m launcher.train.loop RUN_DIR`` under torchrun
(or started by `llmtrain run` itself for a one-process run).

Read top to bottom: die with the parent (no orphans; armed before torch is imported, which takes
seconds: ``launcher.orphans``), set up the Trainer (config, process group,
data, engine, resume from the newest checkpoint that loads), step until done or stopped by a
signal, close (final checkpoint, summary). A failure writes this rank's error file.
See ``launcher.train.trainer`` for the pieces and ``launcher.train.checkpoint.policy`` for
checkpoint cadence.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType

# Nothing heavy at module level: main() arms the parent-death guard first.
from launcher.orphans import arm_rank

__all__ = ["main", "train"]

# A stop signal (Ctrl-C, a closed terminal, SIGTERM, SLURM's SIGUSR1) that came while torch was
# being imported or the engine built: the Trainer's own handler takes it over, and the run stops
# at its first step boundary instead of dying with a traceback.
_STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_early_stop: list[str] = []


def _remember_stop(signum: int, frame: FrameType | None) -> None:
    _early_stop.append(signal.Signals(signum).name)


def train(run_dir: Path) -> int:
    from launcher.train.trainer import Trainer, stop_exit_code

    trainer = Trainer(run_dir, pending_stop=_early_stop[0] if _early_stop else None)
    trainer.setup()
    if trainer.finished:
        trainer.log(f"run already complete: {trainer.start}/{trainer.total} steps")
        if not os.path.lexists(trainer.run.summary):  # its end could not be written (disk full)
            trainer.write_summary()
        return 0
    if trainer.interrupt.agreed(trainer.device):  # asked to stop while it was starting
        trainer.log(
            f"stopped ({trainer.interrupt.requested}) before step {trainer.start + 1}: nothing "
            "new to checkpoint; run the same command again to start it"
        )
        return stop_exit_code()
    while not trainer.finished:
        if not trainer.step():
            return stop_exit_code()
    trainer.close()
    return 0


def main() -> None:
    run_dir = Path(sys.argv[1]).resolve()
    rank = int(os.environ.get("RANK", "0"))
    arm_rank()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _remember_stop)
    from launcher.runfiles import LOCK_ENV, keep_lock_from_children

    keep_lock_from_children(os.environ.get(LOCK_ENV))  # held by a one-process run's rank
    import torch.distributed as dist

    from launcher import fsio
    from launcher.health import EXIT_DIVERGED
    from launcher.rundir import RunDir
    from launcher.train.rank_faults import write_error
    from launcher.train.trainer import EXIT_PREEMPTED, TrainingDiverged

    code = 1
    try:
        code = train(run_dir)
    except BaseException as exc:
        code = (
            130
            if isinstance(exc, KeyboardInterrupt)
            else EXIT_DIVERGED
            if isinstance(exc, TrainingDiverged)
            else 1
        )
        message = fsio.describe_write_error(exc, run_dir) or str(exc)
        write_error(RunDir(run_dir), rank, type(exc).__name__, message, traceback.format_exc())
        if not isinstance(exc, TrainingDiverged):  # the launcher prints its message
            traceback.print_exc()
    finally:
        if dist.is_initialized() and code in (0, EXIT_PREEMPTED):
            dist.destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or terminal: logs have it
            stream.flush()
    # Skip interpreter teardown: DeepSpeed's threads can abort it after the work is done, and a
    # half-dead process group can hang it.
    os._exit(code)


if __name__ == "__main__":
    main()
