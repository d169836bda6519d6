"""What rank 0 reports while training: metrics.jsonl, TensorBoard events, the progress display.

metrics.jsonl holds one JSON object per optimizer step: step, loss, lr, grad_norm, tokens (seen so
far), trained_tokens and trained_tokens_total (the targets that carried loss, this step and so far:
all of them on pre-training data, the unmasked ones on fine-tuning data), step_time_s,
tokens_per_s, mfu (model FLOPs / peak of all devices, PaLM convention, see
``launcher.plan.flops``), memory_bytes (peak so far: RSS on CPU, max allocated on GPU), elapsed_s
(the sum of step times) and time (wall clock at the end of the step), plus val_loss and val_ppl
on the steps that evaluated (``train.eval_every``). Training health (``launcher.health``):
grad_norm is the global gradient norm before clipping (null where the engine cannot tell),
loss_zscore the loss's robust z-score against the previous train.loss_spike_window steps (null
until 10 are known), loss_spike true on a spike, nonfinite_skips the steps skipped so far; a
non-finite step writes null for the quantities its "nonfinite" list names and "skipped" says
whether its update was withheld (strict JSON: never NaN). The progress display is a
Rich bar on a terminal and a plain line per log interval otherwise (logs, CI).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import IO, Any

import torch

from launcher import fsio
from launcher.rundir import RunDir


def current_rss() -> int | None:
    """Resident memory of this process now, in bytes (Linux /proc), or None elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_memory(baseline_rss: int | None = None) -> dict[str, int]:
    """Peak memory of this process: max allocated/reserved on GPU, max RSS on CPU (bytes), with
    ``baseline_rss`` (the runtime's RSS before the model existed, see ``current_rss``) when given,
    so that on CPU the training's own memory can be compared with the plan's `allocated`."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return {
            "max_allocated": int(torch.cuda.max_memory_allocated()),
            "max_reserved": int(torch.cuda.max_memory_reserved()),
        }
    # ru_maxrss is in KiB on Linux.
    out = {"max_rss": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    if baseline_rss is not None:
        out["baseline_rss"] = baseline_rss
    return out


def memory_bytes(peak: dict[str, int]) -> int:
    return peak.get("max_allocated", peak.get("max_rss", 0))


class MetricsWriter:
    """Rank 0's sink for per-step metrics (the other ranks don't create one)."""

    def __init__(self, run_dir: Path, total_steps: int, start_step: int, log_every: int):
        run = RunDir(run_dir)
        self.file: IO[Any] = fsio.open_append(run.metrics, root=run.root)
        self.log_every = max(1, log_every)
        self.total_steps = total_steps
        self.tb: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            fsio.check_inside(run.tensorboard, run.root)
            self.tb = SummaryWriter(log_dir=str(run.tensorboard))
        except ImportError:  # tensorboard is in the train extra; without it only jsonl is written
            self.tb = None
        self.display = Display(total_steps, start_step, self.log_every)

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
                if record.get(key) is not None:
                    self.tb.add_scalar(f"train/{key}", record[key], record["step"])
            for key in ("val_loss", "val_ppl"):
                if record.get(key) is not None:
                    self.tb.add_scalar(f"val/{key[4:]}", record[key], record["step"])
        self.display.update(record)

    def close(self) -> None:
        self.display.close()
        self.file.close()
        if self.tb is not None:
            self.tb.close()


class Display:
    """Rich progress bar on a terminal; otherwise one plain line every `log_every` steps."""

    def __init__(self, total_steps: int, start_step: int, log_every: int):
        self.total = total_steps
        self.log_every = log_every
        self.started = time.monotonic()
        self.start_step = start_step
        self.progress: Any = None
        if sys.stdout.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
            )
            self.task = self.progress.add_task(
                "train", total=total_steps, completed=start_step, stats=""
            )
            self.progress.start()

    @staticmethod
    def stats(record: dict[str, Any]) -> str:
        mfu = record.get("mfu")
        loss = record["loss"]  # None: not finite (the record's "nonfinite" says which)
        text = (
            f"loss {loss:.4f}" if loss is not None else "loss NOT FINITE"
        ) + f"  {record['tokens_per_s']:,.0f} tok/s  mem {record['memory_bytes'] / 2**30:.2f} GiB"
        text += f"  MFU {mfu:.1%}" if mfu is not None else ""
        if record.get("val_loss") is not None:
            text += f"  val_loss {record['val_loss']:.4f} (ppl {record['val_ppl']:.2f})"
        return text

    def update(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if self.progress is not None:
            self.progress.update(self.task, completed=step, stats=self.stats(record))
        elif step % self.log_every == 0 or step == self.total or "val_loss" in record:
            done = step - self.start_step
            rate = (time.monotonic() - self.started) / max(1, done)
            eta = rate * (self.total - step)
            print(f"step {step}/{self.total}  {self.stats(record)}  eta {eta:.0f}s", flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
