"""`llmtrain calibrate`: time, on this machine, what the planner prices for a config.

What is measured (the shapes come from ``launcher.plan.operators``, the same list the planner looks
up, so a profile of a configuration prices that configuration exactly):
- the operators of one micro-batch (``launcher.train.op_timing``: every distinct GEMM shape, the
  attention core, one layer's element-wise work, the loss with the embedding lookup) and the
  optimizer step on this rank's share of the parameters;
- when the layout spans several processes on one node: the collectives the plan lists for groups
  of 2 (``launcher.launch.collective_timing``, gloo on the CPU, NCCL on GPUs), each at its message
  size, a quarter of it and the sizes of COLLECTIVE_LADDER, so that the planner's latency +
  bytes / bandwidth line (``profile_rates.Rates.collective_s``) holds for every size between;
- the per-step overhead of the layout (``launcher.launch.step_overhead``): a real run of the
  engine with the configuration's layout, widths and micro-batches on the model cut to one layer
  per pipeline chunk, less the plan of that run priced from the operators and collectives above:
  the waits, small collectives and dispatch the planner's terms leave out.
On the CPU, torch uses the threads one process of the run will have (cores / processes).

The profile (format: ``launcher.plan.hardware.profile``) goes to the cache (keyed by cluster.gpu)
and/or to
--out; a file there that is a profile of the same device is merged (new figures added, measured
ones replaced); anything else there is refused, never overwritten.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from launcher import __version__
from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.launch.collective_timing import measure_collectives
from launcher.plan.hardware import measurement_noise as noise
from launcher.plan.hardware import profile as prof
from launcher.plan.memory.estimate import DTYPE_BYTES
from launcher.plan.operators import Gemm, Operators, elementwise_bytes, operators
from launcher.train.op_timing import (
    TORCH_DTYPE,
    Timer,
    measure_attention,
    measure_elementwise,
    measure_gemm,
    measure_loss,
    measure_optimizer,
)

Progress = Callable[[str], None]
T = TypeVar("T")

# Attempts at one figure whose repeats spread past the noise limit (measurement_noise): on this
# project's quiet 2-core VM (2026-11-27) single operator timings move between regimes (the tiny
# recipe's element-wise forward 0.93 ms in one process, 2.4 ms in another minutes later), and
# 10 of 15 calibrations were refused for one figure straddling two; a figure is only kept when an
# attempt's repeats agree within the limit.
MEASURE_TRIES = 3

# Message sizes every measured collective kind is also timed at, besides the plan's own sizes:
# 4 KiB (where gloo and NCCL are latency-bound) and 1 MiB (well into their bandwidth regime), so
# that the fitted line's latency and bandwidth are both measured, not extrapolated.
COLLECTIVE_LADDER = (4096.0, 1048576.0)
# The least time the 2 collective-timing processes are given (time_collectives).
COLLECTIVES_FLOOR_S = 60.0


def rank_params(cfg: LLMTrainConfig) -> tuple[int, int]:
    """(parameters this rank's optimizer updates, tensors the optimizer steps), from the plan.
    A backend that flattens the optimizer's partitions (Backend.flat_optimizer_stages: DeepSpeed
    ZeRO-1/2) steps one tensor per parameter group, two (decay / no decay); elsewhere the
    optimizer steps each parameter tensor."""
    from launcher.backends.common import backend_of
    from launcher.plan.memory.estimate import bytes_per_param
    from launcher.plan.planner import make_plan

    plan = make_plan(without_profile(cfg))
    st = plan.memory.heaviest
    per = bytes_per_param(cfg).optimizer
    params = int(st.optimizer / per) if per > 0 else 0
    if cfg.zero.stage in backend_of(cfg).flat_optimizer_stages:
        return params, 2
    return params, max(1, 12 * st.layers + 4)


def without_profile(cfg: LLMTrainConfig) -> LLMTrainConfig:
    import dataclasses

    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, profile="none"))


def _device(cfg: LLMTrainConfig) -> torch.device:
    if cfg.cluster.gpu == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(
            f"cluster.gpu={cfg.cluster.gpu}: no CUDA device on this machine, and calibrate "
            "measures the machine it runs on; use cluster=cpu here, or run it on the GPU node"
        )
    return torch.device("cuda", 0)


def _device_info(cfg: LLMTrainConfig, device: torch.device) -> dict[str, Any]:
    if device.type == "cpu":
        return {
            "cluster_gpu": cfg.cluster.gpu,
            "kind": "cpu",
            "name": prof.host_cpu_name() or platform.processor() or "cpu",
            "count": os.cpu_count() or 1,
            "driver": None,
            "memory_bytes": None,
        }
    props = torch.cuda.get_device_properties(device)
    driver = None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        driver = done.stdout.strip().splitlines()[0] if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = None
    return {
        "cluster_gpu": cfg.cluster.gpu,
        "kind": "cuda",
        "name": torch.cuda.get_device_name(device),
        "count": torch.cuda.device_count(),
        "driver": driver,
        "memory_bytes": int(props.total_memory),
    }


def _existing(path: Path, device: dict[str, Any], what: str) -> dict[str, Any] | None:
    """The profile at `path` to merge into, None when there is no file; a file that is not a
    profile of this device is refused (exit 2), never overwritten."""
    if not path.exists():
        return None
    try:
        doc = prof.read(path)
    except prof.ProfileError as exc:
        raise UserError(
            f"{what}={path}: exists and is not a usable llmtrain profile ({exc}); it is left as "
            "it is: choose another path or remove it"
        ) from None
    same = doc["device"].get("name") == device["name"] and (
        doc["device"].get("cluster_gpu") == device["cluster_gpu"]
    )
    if not same:
        raise UserError(
            f"{what}={path}: holds a profile of {doc['device'].get('name')!r} "
            f"(cluster.gpu={doc['device'].get('cluster_gpu')}), not of this device "
            f"({device['name']!r}); choose another path"
        )
    return doc


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".profile-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(prof.dumps(doc))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# --- one calibration: the figures measured so far and the progress lines ----------------------


@dataclass
class Session:
    """What the steps of one calibration share: where they measure, the document they fill, the
    figures judged noise or not physical, and the numbered progress lines."""

    cfg: LLMTrainConfig
    device: torch.device
    timer: Timer
    threads: int
    progress: Progress
    started: float
    steps: int
    doc: dict[str, Any]
    done: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def dtype_name(self) -> str:
        return self.cfg.precision.compute_dtype

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPE[self.dtype_name]

    @property
    def tag(self) -> dict[str, Any]:
        return {"dtype": self.dtype_name, "threads": self.threads}

    def steady(self, measure: Callable[[], T]) -> T:
        """measure() (one figure, timed by self.timer), again when its repeats spread past the
        noise limit, up to MEASURE_TRIES times in all while the time budget lasts: the attempt
        with the narrowest spread is kept and its spread left for judged() to read."""
        best: tuple[T, float] | None = None
        for _ in range(MEASURE_TRIES):
            value = measure()
            spread = self.timer.take_spread()
            if best is None or spread < best[1]:
                best = (value, spread)
            if not noise.is_noise(spread) or time.monotonic() > self.timer.deadline:
                break
        assert best is not None
        self.timer.spread = best[1]
        return best[0]

    def say(self, text: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        self.progress(f"[{self.done:>2}/{self.steps}] {text}  ({elapsed:.1f} s)")

    def judged(self, what: str, entry: dict[str, Any], *, ratio: bool = True) -> str:
        """Record the repeats' spread in `entry`; a problem for a noisy or implausible figure;
        the words the progress line ends with."""
        spread = self.timer.take_spread()
        entry["spread"] = round(spread, 4)
        found = []
        if noise.is_noise(spread):
            found.append(
                f"{what}: repeats spread {spread:.0%} of their median "
                f"(limit {noise.SPREAD_LIMIT:.0%})"
            )
        if ratio:
            odd = noise.ratio_problem(what, entry["fwd_s"], entry["bwd_s"])
            if odd:
                found.append(odd)
        elif entry["bwd_s"] <= 1e-9:  # forward + backward timed faster than the forward alone
            found.append(f"{what}: forward and backward together measured faster than forward")
        self.problems.extend(found)
        return f"  [NOISE: {'; '.join(found)}]" if found else f"  (spread {spread:.0%})"


def distinct_gemms(cfg: LLMTrainConfig, ops: Operators) -> dict[tuple[int, int, int], Gemm]:
    """The GEMM shapes of the layers the model has (dense, MoE) and of the output layer, once
    each."""
    gemms: dict[tuple[int, int, int], Gemm] = {}
    moe_layers = cfg.model.num_layers - cfg.model.moe_dense_layers if ops.moe_gemms else 0
    listed = list(ops.moe_gemms) if moe_layers else []
    if cfg.model.num_layers - moe_layers > 0:
        listed = list(ops.dense_gemms) + listed
    for g in [*listed, ops.head_gemm]:
        gemms.setdefault(g.shape, g)
    return gemms


def time_gemms(s: Session, ops: Operators) -> None:
    for g in distinct_gemms(s.cfg, ops).values():
        bias = s.cfg.model.linear_bias
        f, b = s.steady(functools.partial(measure_gemm, g, s.timer, s.device, s.dtype, bias))
        entry = {**s.tag, "name": g.name, "m": g.m, "n": g.n, "k": g.k, "fwd_s": f, "bwd_s": b}
        s.doc["gemm"].append(entry)
        verdict = s.judged(f"GEMM {g.name} {g.m}x{g.n}x{g.k}", entry)
        s.say(
            f"GEMM {g.name} {g.m}x{g.n}x{g.k}: forward {f * 1e3:.3f} ms, backward "
            f"{b * 1e3:.3f} ms{verdict}"
        )


def time_attention(s: Session, ops: Operators) -> None:
    a = ops.attention
    f, b = s.steady(
        lambda: measure_attention(ops, s.timer, s.device, s.dtype, s.cfg.model.attention_dropout)
    )
    entry = {
        **s.tag,
        "kind": a.kind,
        "batch": a.batch,
        "heads": a.heads,
        "kv_heads": a.kv_heads,
        "seq": a.seq,
        "head_dim": a.head_dim,
        "fwd_s": f,
        "bwd_s": b,
    }
    s.doc["attention"].append(entry)
    verdict = s.judged(f"attention ({a.kind})", entry)
    s.say(
        f"attention ({a.kind}) b={a.batch} heads={a.heads} seq={a.seq} d={a.head_dim}: forward "
        f"{f * 1e3:.3f} ms, backward {b * 1e3:.3f} ms{verdict}"
    )


def time_elementwise(s: Session, ops: Operators) -> None:
    f, b = s.steady(lambda: measure_elementwise(s.cfg, ops, s.timer, s.device, s.dtype))
    nbytes = elementwise_bytes(ops, DTYPE_BYTES[s.dtype_name])
    entry = {
        **s.tag,
        "tokens": ops.tokens,
        "hidden": ops.hidden,
        "ffn": ops.ffn_local,
        "bytes": nbytes,
        "fwd_s": f,
        "bwd_s": b,
    }
    s.doc["elementwise"].append(entry)
    verdict = s.judged("element-wise work of one layer", entry, ratio=False)
    s.say(
        f"element-wise work of one layer: forward {f * 1e3:.3f} ms, backward {b * 1e3:.3f} ms"
        f"{verdict}"
    )


def time_loss(s: Session, ops: Operators) -> None:
    f, b = s.steady(lambda: measure_loss(s.cfg, ops, s.timer, s.device, s.dtype))
    entry = {**s.tag, "tokens": ops.tokens, "vocab": ops.vocab_local, "fwd_s": f, "bwd_s": b}
    s.doc["loss"].append(entry)
    verdict = s.judged("loss", entry, ratio=False)
    s.say(
        f"loss over {ops.vocab_local} logits + embedding: forward {f * 1e3:.3f} ms, "
        f"backward {b * 1e3:.3f} ms{verdict}"
    )


def time_optimizer(s: Session) -> None:
    params, tensors = rank_params(s.cfg)
    if params <= 0:
        s.say("optimizer: no optimizer states on this rank")
        return
    timed = s.steady(lambda: measure_optimizer(s.cfg, params, tensors, s.timer, s.device))
    spread = s.timer.take_spread()
    odd = [f"optimizer step: repeats spread {spread:.0%}"] if noise.is_noise(spread) else []
    if len(timed) == 2:
        line = noise.line_problem("optimizer step", timed[1], timed[0])
        odd += [line] if line else []
    s.problems.extend(odd)
    for n, seconds in timed:
        s.doc["optimizer"].append(
            {
                "threads": s.threads,
                "params": n,
                "tensors": tensors,
                "seconds": seconds,
                "name": s.cfg.optim.name,
                "spread": round(spread, 4),
            }
        )
    s.say(
        f"optimizer step ({s.cfg.optim.name}, clip, zero_grad): "
        + ", ".join(f"{t * 1e3:.3f} ms on {n:,} parameters" for n, t in timed)
        + (f"  [NOISE: {'; '.join(odd)}]" if odd else f"  (spread {spread:.0%})")
    )


def time_operators(s: Session, ops: Operators) -> None:
    """Every operator class of one micro-batch, and the optimizer step."""
    time_gemms(s, ops)
    time_attention(s, ops)
    time_elementwise(s, ops)
    time_loss(s, ops)
    time_optimizer(s)


def collective_sizes(cfg: LLMTrainConfig) -> tuple[list[tuple[str, float]], list[str]]:
    """([(kind, bytes)] to time between 2 local processes, [collectives left to the catalog]):
    each kind the plan lists for a group of 2 on one node at its message sizes, a quarter of them
    and COLLECTIVE_LADDER."""
    from launcher.plan.planner import make_plan

    plan = make_plan(without_profile(cfg))
    wanted: list[tuple[str, float]] = []
    named: list[str] = []
    for c in plan.time.collectives:
        if c.group_size == 2 and c.group_size <= cfg.cluster.gpus_per_node:
            for size in (c.message_bytes, c.message_bytes / 4, *COLLECTIVE_LADDER):
                if (c.kind, size) not in wanted and size >= 4:
                    wanted.append((c.kind, size))
        else:
            named.append(f"{c.name} over {c.group_size} ranks")
    return sorted(wanted), named


def time_collectives(s: Session, layout: Layout, budget_s: float) -> None:
    """The layout's collectives between 2 local processes (nothing for a single process)."""
    if layout.world_size <= 1:
        return
    wanted, named = collective_sizes(s.cfg)
    backend = "gloo" if s.device.type == "cpu" else "nccl"
    visible = (os.cpu_count() or 1) if s.device.type == "cpu" else torch.cuda.device_count()
    if wanted and visible >= 2:
        # What the budget leaves, but never less than the two processes need to start and
        # rendezvous: each imports torch first (6 CPU s apiece on the loaded 2-core box, where a
        # 10 s floor timed out and no collective was measured). A floor, not a wait: they answer
        # as soon as they are done.
        left = max(COLLECTIVES_FLOOR_S, budget_s - (time.monotonic() - s.started))
        rows, problem = measure_collectives(wanted, backend, max(1, s.threads), left)
        for r in rows:
            if "seconds" in r:
                s.doc["collectives"].append(
                    {"threads": s.threads, "ranks": 2, "backend": backend, **r}
                )
            else:
                s.doc["notes"].append(f"{r['kind']}: not measured ({r['error']})")
        if problem:
            s.doc["notes"].append(problem)
        s.say(
            f"collectives ({backend}, 2 processes): "
            + ", ".join(
                f"{r['kind']} {r['bytes'] / 1e6:.3f} MB {r['seconds'] * 1e3:.2f} ms"
                for r in rows
                if "seconds" in r
            )
            or "none measured"
        )
    for text in named:
        s.doc["notes"].append(f"{text}: catalog figures (not measured here)")


def time_overhead(s: Session, overrides: list[str]) -> None:
    """The layout's per-step overhead beyond the planner's terms (launch/step_overhead.py): two
    real runs of the model cut to a layer or two per pipeline chunk (step_overhead.cut_variants),
    each less its plan priced from the figures measured above."""
    from launcher.launch import step_overhead

    said = []
    for variant, layers in step_overhead.cut_variants(s.cfg, overrides):
        run = step_overhead.run_cut(s.cfg, variant, layers, s.progress)
        if isinstance(run, str):
            s.doc["notes"].append(f"per-step overhead not measured: {run}")
            said.append(f"not measured ({run})")
            break
        planned = step_overhead.planned_step_s(run, s.doc)
        entry = step_overhead.overhead_entry(run, planned, s.threads)
        s.doc["overhead"].append(entry)
        if noise.is_noise(run.spread):
            s.problems.append(
                f"per-step overhead: the cut run's steps spread {run.spread:.0%} of their median "
                f"(limit {noise.SPREAD_LIMIT:.0%})"
            )
        said.append(
            f"{run.config.model.num_layers} layer(s) x {run.layout.num_microbatches} "
            f"micro-batch(es): {run.measured_s * 1e3:.1f} ms a step, "
            f"its plan {planned * 1e3:.1f} ms, {entry['seconds'] * 1e3:.1f} ms at "
            f"{entry['units']} synchronisation(s) (spread {run.spread:.0%})"
        )
    family = s.doc["overhead"][-1]["layout"] if s.doc["overhead"] else "layout"
    s.say(f"per-step overhead ({family}, cut runs): " + "; ".join(said))


def new_document(device: dict[str, Any], created: str) -> dict[str, Any]:
    """An empty profile of `device` (its sections filled by the steps)."""
    return {
        "schema": prof.SCHEMA,
        "version": prof.VERSION,
        "device": device,
        "software": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "llmtrain": __version__,
        },
        "created": created,
        **{section: [] for section in prof.SECTIONS},
        "notes": [],
    }


def _targets(
    out: Path | None, use_cache: bool, cluster_gpu: str, device: dict[str, Any]
) -> list[tuple[Path, dict[str, Any] | None]]:
    """[(path to write, the profile there to merge into)]; a file there that is not a profile of
    this device is refused before anything is measured."""
    targets: list[tuple[Path, str]] = []
    if out is not None:
        targets.append((out, "--out"))
    if use_cache:
        targets.append((prof.cache_path(cluster_gpu), "the cache"))
    return [(p, _existing(p, device, w)) for p, w in targets]


def _finish(s: Session, overrides: list[str], load: noise.Load, *, force: bool) -> None:
    """The calibration record and quality verdict; refuse (UserError) to write noise unless
    `force`."""
    doc, problems = s.doc, s.problems
    doc["calibrated"] = [
        {
            "overrides": overrides,
            "seconds": round(time.monotonic() - s.started, 2),
            "created": doc["created"],
        }
    ]
    doc["quality"] = {
        "load1": round(load.load1, 2),
        "cores": load.cores,
        "busy": load.busy,
        "spread_limit": noise.SPREAD_LIMIT,
        "problems": problems,
        "forced": bool(problems) and force,
    }
    if problems and not force:
        shown = "; ".join(problems[:3]) + (
            f"; and {len(problems) - 3} more" if problems[3:] else ""
        )
        raise UserError(
            f"calibrate: {len(problems)} figure(s) are noise or not physical, so no profile was "
            f"written ({load.text()} when it started): {shown}. Rerun it on a quiet machine "
            "(nothing else running), or pass --force to write them anyway (plan then says it "
            "prices from forced figures)"
        )
    doc["digest"] = prof.digest(doc)


def calibrate(
    cfg: LLMTrainConfig,
    overrides: list[str],
    *,
    out: Path | None,
    use_cache: bool,
    progress: Progress,
    budget_s: float,
    force: bool = False,
    overhead: bool = True,
) -> tuple[dict[str, Any], list[Path]]:
    """Measure, write, return (the profile written, the paths written). A figure whose repeats
    spread too wide, or that no kernel could give (measurement_noise), makes it write nothing
    (UserError naming each) unless `force`; the profile then says it was forced. `overhead`
    False leaves out the two cut runs of the per-step overhead (the profile then has none, and
    plan prices the step from the operators and collectives alone)."""
    started = time.monotonic()
    load = noise.Load(os.getloadavg()[0], os.cpu_count() or 1)
    device = _device(cfg)
    layout = derive_layout(cfg)
    threads = prof.cpu_threads(cfg.cluster.gpus_per_node) if device.type == "cpu" else 0
    if threads:
        torch.set_num_threads(threads)
    dev = _device_info(cfg, device)
    targets = _targets(out, use_cache, cfg.cluster.gpu, dev)
    ops = operators(cfg, layout)
    gemms = distinct_gemms(cfg, ops)
    created = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    s = Session(
        cfg=cfg,
        device=device,
        timer=Timer(device, started + budget_s * 0.85),
        threads=threads,
        progress=progress,
        started=started,
        steps=len(gemms) + 5 + (layout.world_size > 1),
        doc=new_document(dev, created),
    )
    s.timer.take_spread()
    progress(
        f"calibrating {cfg.model.name} on {dev['name']} ({s.dtype_name}, {load.text()}"
        + (f", {threads} thread(s) per process" if threads else "")
        + f"): {len(gemms)} GEMM shapes, attention, element-wise, loss, optimizer"
        + (", collectives" if layout.world_size > 1 else "")
        + (", per-step overhead" if overhead else "")
    )
    time_operators(s, ops)
    time_collectives(s, layout, budget_s)
    if overhead:
        time_overhead(s, overrides)
    _finish(s, overrides, load, force=force)
    written: list[Path] = []
    final = s.doc
    for path, old in targets:
        final = prof.merge(old, s.doc) if old is not None else s.doc
        _write(path, final)
        written.append(path)
    return final, written


__all__ = ["calibrate", "collective_sizes", "new_document", "rank_params", "without_profile"]
