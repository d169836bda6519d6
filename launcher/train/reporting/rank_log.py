"""Each rank's log file, ``logs/rank{R}.log``, written through the standard library's logging:
one ``HH:MM:SS rank{R} message`` line per message.

No rank writes to the terminal: ``llmtrain run`` (and ``llmtrain logs``) show rank 0's log as it
grows (``launcher.launch.console``, which strips the ``HH:MM:SS rank0`` prefix), so a closed
terminal or pipe can never stop training, and what the screen showed is in the file. An
``ERROR:`` line is left off the screen: the launcher reports the failure itself, from the rank's
error file. Ranks other than 0 also send their stdout and stderr (libraries' prints) to their log.
"""

from __future__ import annotations

import logging
import os
import sys

from launcher import fsio
from launcher.rundir import RunDir

# The time of a line as launcher.launch.console expects it at the start of each line.
DATE_FORMAT = "%H:%M:%S"


class _FileHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes and flushes each line; a write that fails (a full disk) raises, as a plain write
    would, instead of logging's default of printing a traceback to stderr and going on."""

    def handleError(self, record: logging.LogRecord) -> None:
        raise  # emit calls this inside its except clause: the write's own error goes on up


def rank_logger(run: RunDir, rank: int) -> logging.Logger:
    """The logger of rank `rank`, writing (only) to its log file in `run`; calling it again
    replaces the previous file handler rather than adding a second."""
    fsio.check_inside(run.logs, run.root)
    run.logs.mkdir(exist_ok=True)
    stream = fsio.open_append(run.rank_log(rank), root=run.root)
    if rank != 0:
        # Everything else this rank prints (libraries included) goes to its log, not the screen.
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
    logger = logging.getLogger(f"llmtrain.rank{rank}")
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    handler = _FileHandler(stream)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(message)s", DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # never to the root logger's handlers (the screen)
    return logger
