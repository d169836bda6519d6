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
whether its update was withheld (strict JSON: never NaN). Every `train.log_every` steps (and at
the last step, and on steps that evaluated) rank 0 writes one line to its log (``interval_line``:
step, loss, lr, grad norm, tokens/s, MFU, memory, eta); ``llmtrain run`` and ``llmtrain logs``
show that log, so the screen and the file say the same (the ranks never write to the terminal:
``launcher.launch.console``).
"""

from __future__ import annotations

import json
import os
import resource
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
        self.interval = Interval(total_steps, start_step, self.log_every)

    def write(self, record: dict[str, Any]) -> str | None:
        """Record one step; returns the log line of a log interval's last step (else None),
        which the trainer writes to rank 0's log (and so to the screen, see ``launcher.launch
        .console``)."""
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
                if record.get(key) is not None:
                    self.tb.add_scalar(f"train/{key}", record[key], record["step"])
            for key in ("val_loss", "val_ppl"):
                if record.get(key) is not None:
                    self.tb.add_scalar(f"val/{key[4:]}", record[key], record["step"])
        return self.interval.line(record)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


class Interval:
    """One line every `log_every` steps (and at the last step, and on steps that evaluated), as
    Megatron-LM and torchtitan print: the step's figures and the time left at the pace so far."""

    def __init__(self, total_steps: int, start_step: int, log_every: int):
        self.total = total_steps
        self.log_every = max(1, log_every)
        self.started = time.monotonic()
        self.start_step = start_step

    def line(self, record: dict[str, Any]) -> str | None:
        step = record["step"]
        if step % self.log_every and step != self.total and "val_loss" not in record:
            return None
        done = step - self.start_step
        eta = (time.monotonic() - self.started) / max(1, done) * (self.total - step)
        return interval_line(record, self.total, eta)


def interval_line(record: dict[str, Any], total: int, eta_s: float | None) -> str:
    """``step 40/300 | loss 4.1234 | lr 3.00e-04 | grad norm 0.912 | 5,120 tok/s | MFU 1.2% |
    mem 0.41 GiB | eta 1m05s`` (a figure the record lacks is left out; a non-finite loss is
    NOT FINITE), then `` | val loss 4.2000 (ppl 66.69)`` on a step that evaluated."""
    loss = record.get("loss")  # None: not finite (the record's "nonfinite" says which)
    parts = [
        f"step {record['step']}/{total}",
        f"loss {loss:.4f}" if loss is not None else "loss NOT FINITE",
    ]
    if record.get("lr") is not None:
        parts.append(f"lr {record['lr']:.2e}")
    grad = record.get("grad_norm")
    if grad is not None:
        parts.append(f"grad norm {grad:.3f}")
    elif "grad_norm" in (record.get("nonfinite") or ()):
        parts.append("grad norm NOT FINITE")
    if record.get("tokens_per_s") is not None:
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    if record.get("mfu") is not None:
        parts.append(f"MFU {record['mfu']:.1%}")
    if record.get("memory_bytes") is not None:
        parts.append(f"mem {record['memory_bytes'] / 2**30:.2f} GiB")
    if record.get("skipped"):
        parts.append("update skipped")
    if eta_s is not None and record["step"] < total:
        parts.append(f"eta {duration(eta_s)}")
    if record.get("val_loss") is not None:
        ppl = record.get("val_ppl")
        parts.append(
            f"val loss {record['val_loss']:.4f}" + (f" (ppl {ppl:.2f})" if ppl is not None else "")
        )
    return " | ".join(parts)


def duration(seconds: float) -> str:
    """12s, 4m05s, 3h07m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
