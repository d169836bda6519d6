"""The training loop each rank runs: ``python -m launcher.train.loop RUN_DIR`` under torchrun.

Read top to bottom: load the resolved config the launcher wrote into the run directory, join the
process group, build the engine, open the data, resume from the latest valid checkpoint, train the
configured steps (checkpointing every N steps and/or minutes and at the end), write the summary.
Rank 0 reports metrics; every rank logs to ``logs/rank{R}.log``; a failing rank writes
``logs/rank{R}.error.json`` for the launcher to show.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
import yaml

from launcher.config.compose import config_from_values
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import secret_names, secret_status
from launcher.train.checkpoint import PREEMPTED_MARKER, CheckpointWriter, latest_valid
from launcher.train.data import TokenShards, builtin_corpus_dir, check_vocab, default_cache_root
from launcher.train.engines.base import Engine
from launcher.train.engines.dist import init_process_group_from_env
from launcher.train.metrics import MetricsWriter, current_rss, memory_bytes, peak_memory
from launcher.train.model import seed_step
from launcher.train.optim import learning_rate
from launcher.train.sampler import ShardedSampler

# Exit code of a run stopped by SIGUSR1/SIGTERM after writing its checkpoint (SLURM preemption);
# rank 0 also leaves PREEMPTED_MARKER in the run directory, which the launcher looks for.
EXIT_PREEMPTED = 99


def build_engine(cfg: LLMTrainConfig) -> Engine:
    if cfg.backend.name == "deepspeed":
        from launcher.train.engines.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(cfg, seed=cfg.train.seed)
    from launcher.train.engines.torch_engine import TorchEngine

    return TorchEngine(cfg, seed=cfg.train.seed)


class Log:
    """This rank's log file; rank 0 also prints to the terminal."""

    def __init__(self, run_dir: Path, rank: int):
        (run_dir / "logs").mkdir(exist_ok=True)
        self.rank = rank
        self.path = run_dir / "logs" / f"rank{rank}.log"
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        if rank != 0:
            # Everything else this rank prints (libraries included) goes to its log, not the screen.
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self.file.fileno(), 1)
            os.dup2(self.file.fileno(), 2)

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} rank{self.rank} {message}"
        self.file.write(line + "\n")
        self.file.flush()
        if self.rank == 0:
            print(message, flush=True)


class Preemption:
    """SIGUSR1 (SLURM's warning before the time limit) or SIGTERM: checkpoint at the next step
    boundary and exit with EXIT_PREEMPTED. Every rank agrees through an all-reduce."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


class Watchdog:
    """Declares this rank hung when ``beat()`` has not been called for `timeout_s` seconds.

    A hung rank (a deadlock, a collective a peer never joins, a stuck file system) would otherwise
    wait forever: NCCL/gloo timeouts are long and not every hang is in a collective. On timeout
    the watchdog writes this rank's error file (which the launcher shows) and exits the process;
    torchrun then stops every other rank.
    """

    def __init__(self, timeout_s: float, run_dir: Path, rank: int):
        self.timeout_s = timeout_s
        self.run_dir, self.rank = run_dir, rank
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
                write_error(self.run_dir, self.rank, "HangDetected", message, "")
                print(f"rank {self.rank}: {message}", file=sys.stderr, flush=True)
                os._exit(1)


def write_error(run_dir: Path, rank: int, kind: str, message: str, trace: str) -> None:
    """The error file the launcher reads to say which rank failed and why."""
    error = {
        "rank": rank,
        "time": time.time(),
        "type": kind,
        "message": message,
        "traceback": trace,
    }
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "logs" / f"rank{rank}.error.json").write_text(json.dumps(error, indent=1))


def fault_injection(rank: int) -> int | None:
    """Test hook: LLMTRAIN_FAIL_AT_STEP=N (and LLMTRAIN_FAIL_RANK=R, default 0) makes rank R fail
    before step N, to exercise the launcher's teardown: it raises, or with LLMTRAIN_FAIL_MODE=hang
    it stops making progress (sleeps), to exercise the hang watchdog."""
    step = os.environ.get("LLMTRAIN_FAIL_AT_STEP")
    if step and int(os.environ.get("LLMTRAIN_FAIL_RANK", "0")) == rank:
        return int(step)
    return None


def data_dir(cfg: LLMTrainConfig) -> Path:
    if cfg.data.path is not None:
        return Path(cfg.data.path).expanduser()
    return builtin_corpus_dir(default_cache_root())


def peak_flops_total(cfg: LLMTrainConfig, world_size: int) -> float | None:
    from launcher.plan.hardware import get_gpu

    gpu = get_gpu(cfg.cluster.gpu)
    dtype = "fp8" if cfg.precision.fp8 else cfg.precision.compute_dtype
    peak = gpu.peak_tflops.get(dtype)
    return peak * 1e12 * world_size if peak else None


def train(run_dir: Path) -> int:
    values = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    cfg = config_from_values(values)
    plan_path = run_dir / "plan.json"
    plan = json.loads(plan_path.read_text()) if plan_path.is_file() else {}
    layout = derive_layout(cfg)
    init_process_group_from_env()
    rank = dist.get_rank()
    log = Log(run_dir, rank)
    if secret_names(cfg):  # config.yaml has them as ***: the values come from the environment
        log(secret_status(secret_names(cfg), os.environ))
    preemption = Preemption()
    torch.manual_seed(cfg.train.seed)

    shards = TokenShards(data_dir(cfg))
    check_vocab(shards.index, cfg.model.vocab_size)
    runtime_rss = current_rss()  # Python, torch, process group: before the model exists
    engine = build_engine(cfg)
    info = engine.info
    seq = cfg.model.seq_length
    sampler = ShardedSampler(
        shards.num_sequences(seq),
        info.dp_rank,
        info.dp_size,
        layout.micro_batch_size * layout.grad_accum,
        cfg.train.seed,
    )
    ckpt_root = run_dir / "checkpoints"
    writer = CheckpointWriter(ckpt_root, rank, cfg.checkpoint.keep_last, dist.barrier)
    start, losses = 0, []
    if cfg.checkpoint.resume:
        found = latest_valid(ckpt_root, log)
        if found is not None:
            engine.load(found.engine_dir)
            sampler.load_state_dict(found.trainer_state["sampler"])
            start = found.step
            losses = list(found.trainer_state.get("losses", []))
            log(f"resumed from {found.path} (step {start})")
    total = layout.steps
    if start >= total:
        log(f"run already complete: {start}/{total} steps (checkpoint in {ckpt_root})")
        return 0

    def save(step: int) -> None:
        state = {"step": step, "sampler": sampler.state_dict(), "losses": losses}
        path = writer.save(step, engine.save, state)
        log(f"checkpoint {path}")

    metrics = MetricsWriter(run_dir, total, start, cfg.train.log_every) if rank == 0 else None
    flops_per_token = plan.get("flops", {}).get("per_token_model")
    peak = peak_flops_total(cfg, info.world_size)
    tokens_per_step = layout.global_batch_size * seq
    step_times: list[float] = []
    last_save = time.monotonic()
    device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    log(
        f"training {cfg.model.name} for steps {start + 1}..{total} on {info.world_size} "
        f"process(es): {layout.global_batch_size} x {seq} tokens per step"
    )
    fail_at = fault_injection(rank)
    watchdog = Watchdog(cfg.train.hang_timeout_s, run_dir, rank)
    for step in range(start, total):
        if step + 1 == fail_at:
            if os.environ.get("LLMTRAIN_FAIL_MODE") == "hang":
                while True:
                    time.sleep(60)
            raise RuntimeError(f"injected failure at step {fail_at} (LLMTRAIN_FAIL_AT_STEP)")
        lr = learning_rate(cfg.optim, step, total)
        if cfg.model.attention_dropout or cfg.model.hidden_dropout:
            # By data-parallel rank: tensor-parallel peers must draw the same masks for the
            # activations they hold replicated.
            seed_step(cfg.train.seed, step, info.dp_rank)
        rows = torch.from_numpy(shards.batch(sampler.next_batch_indices(), seq))
        began = time.perf_counter()
        result = engine.step(rows, lr)
        elapsed = time.perf_counter() - began
        step_times.append(elapsed)
        losses.append(result.loss)
        done = step + 1
        if metrics is not None:
            tokens_per_s = tokens_per_step / elapsed
            metrics.write(
                {
                    "step": done,
                    "loss": result.loss,
                    "lr": lr,
                    "grad_norm": result.grad_norm,
                    "tokens": done * tokens_per_step,
                    "step_time_s": elapsed,
                    "tokens_per_s": tokens_per_s,
                    "mfu": tokens_per_s * flops_per_token / peak
                    if flops_per_token and peak
                    else None,
                    "memory_bytes": memory_bytes(peak_memory()),
                    "elapsed_s": sum(step_times),
                    "time": time.time(),
                }
            )
        every = cfg.checkpoint.every_steps
        minutes = cfg.checkpoint.every_minutes
        due = bool(every and done % every == 0 and done < total)
        if minutes and done < total:
            due = due or time.monotonic() - last_save >= 60 * minutes
            # Clocks differ between ranks: rank 0 decides for everyone.
            flag = torch.tensor([1.0 if due else 0.0], device=device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item() > 0)
        if preemption.agreed(device):
            save(done)
            if rank == 0:
                marker = {"step": done, "time": time.time()}
                (run_dir / PREEMPTED_MARKER).write_text(json.dumps(marker) + "\n")
            log(f"preempted: checkpoint written at step {done}; exiting for requeue")
            return EXIT_PREEMPTED
        if due:
            save(done)
            last_save = time.monotonic()
        watchdog.beat(done)
    save(total)
    if metrics is not None:
        metrics.close()
    summary = summarize(cfg, plan, losses, step_times, start, info.world_size, runtime_rss)
    summary["weights_sha256"] = engine.weights_digest()
    if rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log(format_summary(summary))
    return 0


def summarize(
    cfg: LLMTrainConfig,
    plan: dict[str, Any],
    losses: list[float],
    step_times: list[float],
    start: int,
    world_size: int,
    runtime_rss: int | None = None,
) -> dict[str, Any]:
    # The first step of a process includes warm-up (allocation, JIT, DeepSpeed hooks).
    steady = step_times[1:] or step_times
    return {
        "steps": len(losses),
        "resumed_at": start,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "measured_step_s": statistics.median(steady) if steady else None,
        "predicted_step_s": plan.get("time", {}).get("step_s"),
        "measured_peak_memory": peak_memory(runtime_rss),
        "predicted_memory_allocated_bytes": plan.get("memory", {}).get("allocated_bytes"),
        "predicted_memory_reserved_bytes": plan.get("memory", {}).get("reserved_bytes"),
        "world_size": world_size,
        "recipe": cfg.recipe,
    }


def format_summary(s: dict[str, Any]) -> str:
    def num(x: Any, fmt: str) -> str:
        return format(x, fmt) if isinstance(x, int | float) else "n/a"

    memory = s["measured_peak_memory"]
    gib = 2**30

    def predicted(key: str) -> str:
        value = s.get(f"predicted_memory_{key}_bytes")
        return num(value / gib if value else None, ".2f")

    if "max_allocated" in memory:
        mem_line = (
            f"memory per GPU: max allocated {memory['max_allocated'] / gib:.2f} GiB (predicted "
            f"{predicted('allocated')}), max reserved {memory['max_reserved'] / gib:.2f} GiB "
            f"(predicted {predicted('reserved')})"
        )
    elif "baseline_rss" in memory:
        runtime, peak = memory["baseline_rss"], memory["max_rss"]
        mem_line = (
            f"memory per process: peak RSS {peak / gib:.2f} GiB = runtime "
            f"{runtime / gib:.2f} GiB (Python, torch, before the model) + training "
            f"{max(0, peak - runtime) / gib:.2f} GiB; predicted {predicted('allocated')} GiB "
            "allocated"
        )
    else:
        mem_line = (
            f"memory per process: peak RSS {memory.get('max_rss', 0) / gib:.2f} GiB; predicted "
            f"{predicted('allocated')} GiB allocated"
        )
    return (
        f"done: {s['steps']} steps, loss {num(s['first_loss'], '.4f')} -> "
        f"{num(s['last_loss'], '.4f')}\n"
        f"step time: measured {num(s['measured_step_s'], '.4f')} s (median), predicted "
        f"{num(s['predicted_step_s'], '.4f')} s\n{mem_line}"
    )


def main() -> None:
    run_dir = Path(sys.argv[1]).resolve()
    rank = int(os.environ.get("RANK", "0"))
    code = 1
    try:
        code = train(run_dir)
    except BaseException as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        write_error(run_dir, rank, type(exc).__name__, str(exc), traceback.format_exc())
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
