"""The training process each rank runs: ``python -m launcher.train.loop RUN_DIR`` under torchrun.

Read top to bottom: die with the parent (no orphans; armed before torch is imported, which takes
seconds: ``launcher.orphans``), set up the Trainer (config, process group,
data, engine, resume from the newest checkpoint that loads), step until done or stopped by a
signal, close (final checkpoint, summary). A failure writes this rank's error file.
See ``launcher.train.trainer`` for the pieces and ``launcher.train.policy`` for checkpoint cadence.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

# Nothing heavy at module level: main() arms the parent-death guard first.
from launcher.orphans import arm_rank

__all__ = ["main", "train"]


def train(run_dir: Path) -> int:
    from launcher.train.trainer import EXIT_PREEMPTED, Trainer

    trainer = Trainer(run_dir)
    trainer.setup()
    if trainer.finished:
        trainer.log(f"run already complete: {trainer.start}/{trainer.total} steps")
        return 0
    while not trainer.finished:
        if not trainer.step():
            return EXIT_PREEMPTED
    trainer.close()
    return 0


def main() -> None:
    run_dir = Path(sys.argv[1]).resolve()
    rank = int(os.environ.get("RANK", "0"))
    arm_rank()
    import torch.distributed as dist

    from launcher import fsio
    from launcher.health import EXIT_DIVERGED
    from launcher.rundir import RunDir
    from launcher.train.trainer import EXIT_PREEMPTED, TrainingDiverged, write_error

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
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: DeepSpeed's threads can abort it after the work is done, and a
    # half-dead process group can hang it.
    os._exit(code)


if __name__ == "__main__":
    main()
