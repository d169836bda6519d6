"""The Trainer each rank runs: ``setup`` (config, process group, data, engine, resume), ``step``
(one optimizer step, metrics, checkpoint when the policy says so), ``close`` (final checkpoint and
summary). ``launcher.train.loop`` drives it.

Rank 0 reports metrics; every rank logs to ``logs/rank{R}.log``
(``launcher.train.reporting.rank_log``); a failing rank writes ``logs/rank{R}.error.json`` (with the
time it failed: the launcher names the earliest).
All run-directory writes go through ``launcher.fsio`` (no symlinks followed).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from launcher import fsio, runfiles
from launcher.backends.common import backend_of
from launcher.config.epoch_rows import epoch_steps
from launcher.config.layout import Layout, derive_layout
from launcher.config.run_config import accept_resume, resumable_config
from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import secret_names, secret_status
from launcher.errors import UserError
from launcher.health import DIVERGED, LossSpikes, finite_or_none
from launcher.plan.figures import PlanFigures
from launcher.plan.preference import is_preference, reference_mode
from launcher.rundir import RunDir
from launcher.train.checkpoint.policy import CheckpointPolicy
from launcher.train.checkpoint.safe_load import CheckpointFiles, UnsafeCheckpointError, read_json
from launcher.train.checkpoint.store import (
    TRAINER_STATE,
    CheckpointWriter,
    Found,
    complete_checkpoints,
    valid_checkpoints,
)
from launcher.train.checkpoint.tensor_parts import all_finite
from launcher.train.data import training_data, validation_data
from launcher.train.engines.base import Engine
from launcher.train.engines.dist import init_process_group_from_env
from launcher.train.evaluation import Evaluator, eval_due
from launcher.train.finetune.preference_reference import reference_table
from launcher.train.model.transformer import seed_step
from launcher.train.optim import learning_rate
from launcher.train.rank_faults import Watchdog, fault_injection
from launcher.train.reporting.metrics import MetricsWriter, current_rss, memory_bytes, peak_memory
from launcher.train.reporting.rank_log import rank_logger
from launcher.train.reporting.summary import format_summary, summarize
from launcher.train.reporting.trackers import Trackers
from launcher.train.sampler import ShardedSampler

# Exit code of a run stopped by a signal after writing its checkpoint (SLURM preemption, Ctrl-C);
# rank 0 also leaves the preemption marker (RunDir.preempted), which the launcher looks for.
EXIT_PREEMPTED = 99


class LockLost(RuntimeError):
    """The run directory's lock was deleted or replaced while this run held it."""


class CheckpointLoadError(RuntimeError):
    """Checkpoints exist but none of them could be loaded (refused or unreadable)."""


class TrainingDiverged(RuntimeError):
    """A non-finite loss, gradient norm or weights: the run stops at that step, nothing is
    checkpointed from it; the rank exits with EXIT_DIVERGED (launcher.health)."""


assert TrainingDiverged.__name__ == DIVERGED  # the launcher recognises the rank's error by it


def base_needed_on_resume(cfg: LLMTrainConfig) -> bool:
    """Whether a resumed run still reads train.init_from: its checkpoints hold the adapters alone
    (finetune=lora|qlora), or dpo's reference copy is built from it (never from a checkpoint)."""
    return cfg.finetune.name != "full" or reference_mode(cfg) == "copy"


def build_engine(cfg: LLMTrainConfig, init_state: Any = None) -> Engine:
    """The configured backend's engine (Backend.engine names its class, imported here)."""
    backend = backend_of(cfg)
    if not backend.engine:
        raise ValueError(
            f"backend={backend.name}: its ranks run {backend.entry}, not llmtrain's trainer"
        )
    module, _, name = backend.engine.partition(":")
    engine: Engine = getattr(importlib.import_module(module), name)(
        cfg, seed=cfg.train.seed, init_state=init_state
    )
    return engine


class Interrupt:
    """SIGUSR1 (SLURM's warning before the time limit), SIGTERM, SIGINT (Ctrl-C) or SIGHUP (the
    terminal closed): checkpoint at the next step boundary and stop. Every rank agrees through an
    all-reduce. A signal that came before this object existed (while torch was imported: see
    ``launcher.train.loop``) is `pending`."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self, pending: str | None = None) -> None:
        self.requested: str | None = pending
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = signal.Signals(signum).name

    def agreed(self, device: torch.device) -> bool:
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


def stop_exit_code() -> int:
    """The exit code of a rank that checkpointed and stopped on a signal: 0 under `llmtrain run`
    (which tells an interruption from a finished run by preempted.json, and so torchrun has no
    failure to report: no traceback for a requested stop), EXIT_PREEMPTED elsewhere (a SLURM
    job's batch script requeues on it)."""
    from launcher.orphans import LAUNCHER_PID_ENV

    return 0 if os.environ.get(LAUNCHER_PID_ENV) else EXIT_PREEMPTED


@dataclass
class StepRecord:
    done: int
    loss: float
    elapsed: float


class Trainer:
    """One rank's training: ``setup()``, ``step()`` until it returns False, ``close()``."""

    def __init__(self, run_dir: Path, pending_stop: str | None = None):
        self.run = RunDir(run_dir)
        self.pending_stop = pending_stop  # a stop signal received before setup (loop.py)
        self.losses: list[float] = []
        self.step_times: list[float] = []
        self.start = 0
        self.done = 0
        self.skips = 0  # non-finite steps skipped so far (train.max_nonfinite_skips)
        self.last_good: tuple[int, Path] | None = None  # the newest checkpoint this run trusts

    # --- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        run = self.run
        # An older llmtrain's config.yaml: added keys take defaults, removed ones refuse by name.
        # A resume's new configuration waits in config.next.yaml until its checkpoint loads.
        source = run.pending_config if run.pending_config.is_file() else run.config
        stored = resumable_config(source)
        self.cfg = cfg = stored.config
        self.values = stored.values
        try:  # read back bounded and checked (launcher.runfiles): a run file anyone may edit
            self.plan = PlanFigures.from_json(
                runfiles.read_json_object(run.plan, max_bytes=16 << 20)
                if run.plan.is_file()
                else {}
            )
        except ValueError as exc:
            raise UserError(f"{run.plan}: not a plan.json written by llmtrain ({exc})") from None
        self.layout: Layout = derive_layout(cfg)
        init_process_group_from_env()
        self.rank = dist.get_rank()
        self.logger = rank_logger(run, self.rank)
        self.log = self.logger.info
        notes = [f"defaults for {', '.join(stored.missing)}"] if stored.missing else []
        notes += [f"dropped (harmless) {', '.join(stored.harmless)}"] if stored.harmless else []
        if notes:
            self.log(f"{run.config} was written by an older llmtrain: {'; '.join(notes)}")
        if secret_names(cfg):  # config.yaml has them as ***: the values come from the environment
            self.log(secret_status(secret_names(cfg), os.environ))
        self.interrupt = Interrupt(self.pending_stop)
        torch.manual_seed(cfg.train.seed)
        self.shards = training_data(cfg)
        self.trained_total = 0  # trained (unmasked) targets so far; fine-tuning data counts fewer
        packing = getattr(self.shards, "report", None)
        if packing is not None:
            self.log(f"chat data: {packing.line()}")
        self.runtime_rss = current_rss()  # Python, torch, process group: before the model exists
        self.engine = build_engine(cfg, self._init_state())
        info = self.engine.info
        self.sampler = ShardedSampler(
            self.shards.num_sequences(cfg.model.seq_length),
            info.dp_rank,
            info.dp_size,
            self.layout.micro_batch_size * self.layout.grad_accum,
            cfg.train.seed,
        )
        self.evaluator = self._evaluator()
        self.val: dict[str, float] = {}
        self.writer = CheckpointWriter(
            run.checkpoints, self.rank, cfg.checkpoint.keep_last, dist.barrier
        )
        # dpo with a precomputed reference: one pass before step 1 (or the run's stored table).
        resuming = cfg.checkpoint.resume and bool(complete_checkpoints(run.checkpoints))
        self.reference = reference_table(
            cfg, run.root, self.engine, self.shards, resuming, self.log
        )
        self.device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
        self.total = self.layout.steps
        if cfg.train.epochs is not None:  # the rows counted on the opened data (epoch_rows.py)
            rows = self.shards.num_sequences(cfg.model.seq_length)
            self.total = epoch_steps(cfg.train.epochs, rows, self.layout.global_batch_size)
            self.log(f"train.epochs={cfg.train.epochs:g} over {rows:,} rows: {self.total} steps")
        if cfg.checkpoint.resume:
            self._resume()
        if self.rank == 0 and source == run.pending_config:
            # Resume accepted (every rank loaded the checkpoint): its history line is recorded
            # and the new configuration becomes config.yaml.
            accept_resume(run)
        self.done = self.start
        self.spikes = LossSpikes(
            cfg.train.loss_spike_window,
            cfg.train.loss_spike_zscore,
            self.losses[-cfg.train.loss_spike_window :],
        )
        self.policy = CheckpointPolicy.from_config(cfg.checkpoint, self.plan, self.total)
        self.metrics = (
            MetricsWriter(run.root, self.total, self.start, cfg.train.log_every)
            if self.rank == 0 and self.start < self.total
            else None
        )
        self.trackers = (  # W&B / MLflow (logging.*), rank 0
            Trackers(cfg, run.root, self.values, self.log) if self.metrics is not None else None
        )
        self.flops_per_token = self.plan.flops_per_token
        peak = self.plan.peak_flops
        self.peak_total = peak * info.world_size if peak else None
        # Preference pairs: two sequences a pair (launcher.train.finetune.preference).
        pair = 2 if is_preference(cfg) else 1
        self.tokens_per_step = self.layout.global_batch_size * cfg.model.seq_length * pair
        self.fail_at = fault_injection(self.rank)
        self.watchdog = Watchdog(cfg.train.hang_timeout_s, run, self.rank)
        if self.start < self.total:
            self.log(
                f"training {cfg.model.name} for steps {self.start + 1}..{self.total} on "
                f"{info.world_size} process(es): {self.layout.global_batch_size} x "
                f"{cfg.model.seq_length} tokens per step; {self.policy.describe()}"
            )

    def _evaluator(self) -> Evaluator | None:
        """train.eval_every's evaluator over this rank's share of the validation data."""
        cfg, info = self.cfg, self.engine.info
        if not cfg.train.eval_every:
            return None
        per_rank = self.layout.micro_batch_size * self.layout.grad_accum
        valid = validation_data(cfg, cfg.train.eval_steps * per_rank * info.dp_size)
        if valid is None:
            raise UserError(f"train.eval_every={cfg.train.eval_every}: no validation data")
        return Evaluator(valid, cfg.train.eval_steps, per_rank, info.dp_rank, info.dp_size)

    def _init_state(self) -> Any:
        """train.init_from's weights, unless this run has checkpoints to resume (resume wins)."""
        source = self.cfg.train.init_from
        if source is None:
            return None
        if (
            self.cfg.checkpoint.resume
            and complete_checkpoints(self.run.checkpoints)
            and not base_needed_on_resume(self.cfg)
        ):
            self.log(f"train.init_from={source} ignored: resuming this run from its checkpoints")
            return None
        from launcher.train.checkpoint.init_from import open_source

        # Each rank reads the slices it holds (train/parallel/build.py), not the whole checkpoint.
        state = open_source(self.cfg)
        self.log(f"initialised from {source} ({len(state)} tensors; step 0, fresh optimizer)")
        return state

    def _candidates(self) -> tuple[list[Found], int]:
        """(valid checkpoints newest first, number of checkpoint folders), as rank 0 sees them
        (every rank gets the same answer)."""
        found: list[Any] = [None]
        if self.rank == 0:
            folders = len(complete_checkpoints(self.run.checkpoints))
            found = [(list(valid_checkpoints(self.run.checkpoints, self.log)), folders)]
        dist.broadcast_object_list(found, src=0)
        valid, folders = found[0]
        return list(valid), int(folders)

    def _resume(self) -> None:
        """Load the newest checkpoint that loads on every rank; fall back to older ones. When
        there are checkpoints and none loads, stop (never silently start over)."""
        candidates, folders = self._candidates()
        if folders and not candidates:
            raise CheckpointLoadError(
                f"{self.run.checkpoints} holds {folders} checkpoint folder(s) and none verifies "
                "(see the warnings above); remove them, or start over with `llmtrain run --fresh`"
            )
        failures = []
        for found in candidates:
            problem = None
            trainer_state: Any = {}
            try:
                # Every file read once, checked against the (signed) manifest and loaded from
                # that buffer: a file swapped after the verify above is refused, not loaded.
                files = CheckpointFiles.verified(found.path)
                trainer_state = read_json(files, found.path / TRAINER_STATE)
                if not isinstance(trainer_state, dict):
                    raise UnsafeCheckpointError(f"{TRAINER_STATE}: not a JSON object")
                self.engine.load(found.engine_dir, files)
                self.sampler.load_state_dict(trainer_state["sampler"])
            except Exception as exc:  # a refused or unreadable checkpoint: try an older one
                problem = f"{type(exc).__name__}: {exc}"
            flag = torch.tensor([1.0 if problem else 0.0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() == 0:
                self.start = found.step
                self.losses = list(trainer_state.get("losses", []))
                self.skips = int(trainer_state.get("nonfinite_skips", 0))
                self.trained_total = int(trainer_state.get("trained_tokens", 0))
                self.last_good = (found.step, found.path)
                self.log(f"resumed from {found.path} (step {self.start})")
                return
            failures.append(f"{found.path.name}: {problem or 'failed on another rank'}")
            self.log(
                f"WARNING: could not load checkpoint {found.path} "
                f"({problem or 'failed on another rank'}); trying an older one"
            )
        if failures:
            raise CheckpointLoadError(
                f"no checkpoint in {self.run.checkpoints} could be loaded, refused: "
                + "; ".join(failures)
                + ". Remove them, or start over with `llmtrain run --fresh`"
            )
        self.start, self.losses = 0, []

    # --- steps ---------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def save(self, step: int) -> None:
        # One writer per run directory: a lock file deleted or replaced under this run may have let
        # another llmtrain in; stop before writing anything more (launcher.runfiles.lock_problem).
        lost = runfiles.lock_problem(self.run.lock, os.environ.get(runfiles.LOCK_ENV))
        if lost is not None:
            raise LockLost(
                f"{lost}; another llmtrain may be writing into {self.run.root} now, so this run "
                f"stops before writing checkpoint step {step} (its last checkpoint is kept). "
                "Stop the other run, or let it go on alone"
            )
        if not self._weights_finite():
            raise TrainingDiverged(
                f"step {step}: the weights hold NaN or infinite values; checkpoint not written. "
                + self._last_good_text()
            )
        state = {
            "step": step,
            "sampler": self.sampler.state_dict(),
            "losses": self.losses,
            "nonfinite_skips": self.skips,
            "trained_tokens": self.trained_total,
        }
        path = self.writer.save(step, self.engine.save, state)
        self.last_good = (step, path)
        self.policy.saved()
        self.log(f"checkpoint {path}")

    def _weights_finite(self) -> bool:
        """Every rank's parameters are finite (a collective): a non-finite state is never
        checkpointed, so it can never prune a good checkpoint either."""
        # Every kind of tensor the engines hold (NF4 bases, DTensor shards, fp8 weights): their
        # stored parts, never dequantized (launcher.train.checkpoint.tensor_parts).
        bad = not all_finite(self.engine.local_tensors())
        flag = torch.tensor([1.0 if bad else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() == 0

    def _last_good_text(self) -> str:
        if self.last_good is None:
            return "No checkpoint was written before it (a rerun starts from step 0)."
        step, path = self.last_good
        return (
            f"The last good checkpoint is {path} (step {step}); the same command resumes from it."
        )

    def _diverged(self, done: int, bad: tuple[str, ...], applied: bool, values: str) -> str:
        what = " and ".join("the gradient norm" if q == "grad_norm" else "the loss" for q in bad)
        limit = self.cfg.train.max_nonfinite_skips
        why = (
            f"train.max_nonfinite_skips={limit} exceeded ({self.skips} skipped before)"
            if limit and not applied
            else "the update was already applied (it cannot be skipped)"
            if applied
            else "stopping (train.max_nonfinite_skips=0)"
        )
        return (
            f"training diverged at step {done}: {what} is not finite ({values}); {why}. "
            f"Nothing is checkpointed from this step on. {self._last_good_text()} "
            "To go on: lower optim.lr, keep optim.grad_clip > 0 (e.g. 1.0), or set "
            "train.max_nonfinite_skips=N to skip up to N such steps"
        )

    def step(self) -> bool:
        """One optimizer step; False when the run must stop now (preempted or interrupted)."""
        step = self.done
        if step + 1 == self.fail_at:
            if os.environ.get("LLMTRAIN_FAIL_MODE") == "hang":
                while True:
                    time.sleep(60)
            raise RuntimeError(f"injected failure at step {self.fail_at} (LLMTRAIN_FAIL_AT_STEP)")
        lr = learning_rate(self.cfg.optim, step, self.total)
        m = self.cfg.model
        if m.attention_dropout or m.hidden_dropout:
            # By data-parallel rank: tensor-parallel peers must draw the same masks for the
            # activations they hold replicated.
            seed_step(self.cfg.train.seed, step, self.engine.info.dp_rank)
        indices = self.sampler.next_batch_indices()
        rows = torch.from_numpy(self.shards.batch(indices, self.cfg.model.seq_length))
        reference = None if self.reference is None else self.reference.lookup(indices)
        began = time.perf_counter()
        result = self.engine.step(rows, lr, reference)
        elapsed = time.perf_counter() - began
        self.step_times.append(elapsed)
        self.losses.append(result.loss)
        self.trained_total += result.trained_tokens or 0
        self.step_trained = result.trained_tokens
        self.step_rewards = result.preference  # dpo, simpo, orpo: rewards/* of the step
        self.done = done = step + 1
        health: dict[str, Any] = {}
        if result.nonfinite:  # identical on every rank: they stop, or skip, together
            values = f"loss {result.loss}, grad norm {result.grad_norm}"
            health = {"nonfinite": list(result.nonfinite), "skipped": not result.applied}
            if result.applied or self.skips >= self.cfg.train.max_nonfinite_skips:
                message = self._diverged(done, result.nonfinite, result.applied, values)
                self._report(done, lr, result.loss, result.grad_norm, elapsed, None, health)
                self.log(f"ERROR: {message}")  # off the screen: the launcher prints it
                raise TrainingDiverged(message)
            self.skips += 1
            self.log(
                f"WARNING: step {done}: {' and '.join(result.nonfinite)} not finite ({values}); "
                f"update skipped ({self.skips} of train.max_nonfinite_skips="
                f"{self.cfg.train.max_nonfinite_skips})"
            )
        health["nonfinite_skips"] = self.skips
        val = None
        if self.evaluator is not None and eval_due(done, self.total, self.cfg.train.eval_every):
            self.val = val = self.evaluator.run(self.engine, self.cfg.model.seq_length)
        self._report(done, lr, result.loss, result.grad_norm, elapsed, val, health)
        if self.interrupt.agreed(self.device):
            self.save(done)
            if self.rank == 0:
                marker = {"step": done, "time": time.time(), "signal": self.interrupt.requested}
                fsio.write_json_atomic(self.run.preempted, marker, root=self.run.root)
            if self.interrupt.requested in ("SIGINT", "SIGHUP") or not os.environ.get(
                "SLURM_JOB_ID"
            ):
                # Ctrl-C reaches the ranks as the launcher's SIGTERM: outside a SLURM job a
                # stop is an interruption, never a requeue.
                self.log(
                    f"stopped ({self.interrupt.requested}): checkpoint written at step {done}; "
                    "run the same command again to resume"
                )
            else:
                self.log(f"preempted: checkpoint written at step {done}; exiting for requeue")
            return False
        if self._due(done):
            self.save(done)
        self.watchdog.beat(done)
        return True

    def _due(self, done: int) -> bool:
        due = self.policy.due(done) is not None
        if self.policy.time_based and not self.finished:
            # Clocks differ between ranks: rank 0 decides for everyone.
            flag = torch.tensor([1.0 if due else 0.0], device=self.device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item() > 0)
        return due

    def _report(
        self,
        done: int,
        lr: float,
        loss: float,
        grad_norm: float | None,
        elapsed: float,
        val: dict[str, float] | None = None,
        health: dict[str, Any] | None = None,
    ) -> None:
        z, spike = self.spikes.observe(loss)  # on every rank: the window stays the same
        if self.metrics is None:
            return
        if spike:
            self.log(
                f"WARNING: loss spike at step {done}: loss {loss:.4f} is {z:.1f} robust standard "
                f"deviations above the median of the last {len(self.spikes.window) - 1} steps "
                f"(train.loss_spike_zscore={self.cfg.train.loss_spike_zscore:g})"
            )
        tokens_per_s = self.tokens_per_step / elapsed
        mfu = None
        if self.flops_per_token and self.peak_total:
            mfu = tokens_per_s * self.flops_per_token / self.peak_total
        record = {
            "step": done,
            "loss": finite_or_none(loss),
            "lr": lr,
            "grad_norm": finite_or_none(grad_norm),
            "loss_zscore": z,
            **({"loss_spike": True} if spike else {}),
            **(health or {}),
            "tokens": done * self.tokens_per_step,
            # Targets that carried loss: all of them on pre-training data, the unmasked ones on
            # fine-tuning data (launcher.train.finetune.masked_loss), this step and so far.
            "trained_tokens": getattr(self, "step_trained", None),
            "trained_tokens_total": self.trained_total,
            "step_time_s": elapsed,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu,
            "memory_bytes": memory_bytes(peak_memory()),
            "elapsed_s": sum(self.step_times),
            "time": time.time(),
            **(getattr(self, "step_rewards", None) or {}),
            **(val or {}),
        }
        line = self.metrics.write(record)
        if line is not None:
            self.log(line)
        if self.trackers is not None:
            self.trackers.log(record)

    # --- close ---------------------------------------------------------------------------------
    def close(self) -> dict[str, Any]:
        """Final checkpoint and summary (rank 0 writes summary.json); returns the summary."""
        self.save(self.total)
        if self.metrics is not None:
            self.metrics.close()
        if self.trackers is not None:
            self.trackers.close()
        return self.write_summary()

    def write_summary(self) -> dict[str, Any]:
        """summary.json (rank 0; every rank joins the weights digest). Also for a finished run
        whose summary was never written (the disk filled after its last checkpoint), so that a
        finished run does not stay "interrupted" for ever."""
        summary = summarize(
            self.cfg,
            self.plan,
            self.losses,
            self.step_times,
            self.start,
            self.engine.info.world_size,
            self.runtime_rss,
        )
        summary["weights_sha256"] = self.engine.weights_digest()
        if self.val:
            summary["last_val_loss"] = self.val["val_loss"]
        if self.rank == 0:
            text = json.dumps(summary, indent=2) + "\n"
            fsio.write_text_atomic(self.run.summary, text, root=self.run.root)
            self.log(format_summary(summary))
        return summary
