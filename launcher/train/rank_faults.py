"""A rank's failures made visible: the error file the launcher reads to say which rank failed first
and why (``write_error``), the watchdog that declares a rank hung (train.hang_timeout_s), and the
test hook that makes a rank fail or hang at a given step (``fault_injection``)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from launcher import fsio
from launcher.rundir import RunDir


class Watchdog:
    """Declares this rank hung when ``beat()`` has not been called for `timeout_s` seconds: writes
    this rank's error file (which the launcher shows) and exits; torchrun stops the others (a
    one-process run has none)."""

    def __init__(self, timeout_s: float, run: RunDir, rank: int):
        self.timeout_s = timeout_s
        self.run, self.rank = run, rank
        self.last = time.monotonic()
        self.step = 0
        if timeout_s > 0:
            threading.Thread(target=self._watch, name="llmtrain-watchdog", daemon=True).start()

    def beat(self, step: int) -> None:
        self.last, self.step = time.monotonic(), step

    def _watch(self) -> None:
        while True:
            time.sleep(min(5.0, self.timeout_s / 4))
            idle = time.monotonic() - self.last
            if idle > self.timeout_s:
                message = (
                    f"no training progress for {idle:.0f} s after step {self.step} "
                    f"(train.hang_timeout_s={self.timeout_s:g}); the run is stopped"
                )
                write_error(self.run, self.rank, "HangDetected", message, "")
                print(f"rank {self.rank}: {message}", file=sys.stderr, flush=True)
                os._exit(1)


def write_error(run: RunDir, rank: int, kind: str, message: str, trace: str) -> None:
    """The error file the launcher reads to say which rank failed first and why."""
    error = {
        "rank": rank,
        "time": time.time(),
        "type": kind,
        "message": message,
        "traceback": trace,
    }
    try:
        run.logs.mkdir(exist_ok=True)
        fsio.write_text_atomic(run.rank_error(rank), json.dumps(error, indent=1), root=run.root)
    except OSError as exc:  # a full disk: stderr (torchrun.log) is all that is left
        print(
            f"rank {rank}: cannot write its error file ({exc}): {kind}: {message}", file=sys.stderr
        )


def fault_injection(rank: int) -> int | None:
    """Test hook: LLMTRAIN_FAIL_AT_STEP=N (and LLMTRAIN_FAIL_RANK=R, default 0) makes rank R fail
    before step N: it raises, or with LLMTRAIN_FAIL_MODE=hang it stops making progress."""
    step = os.environ.get("LLMTRAIN_FAIL_AT_STEP")
    if step and int(os.environ.get("LLMTRAIN_FAIL_RANK", "0")) == rank:
        return int(step)
    return None
