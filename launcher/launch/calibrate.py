"""`llmtrain calibrate`: time, on this machine, the operators the planner prices for a config.

What is measured (the shapes come from ``launcher.plan.operators``, the same list the planner looks
up, so a profile of a configuration prices that configuration exactly):
- every distinct GEMM shape of a dense layer, a MoE layer and the output layer, forward and
  backward (data and weight gradients) through ``F.linear`` as the engine's nn.Linear calls it,
  with the engine's mixed precision (fp32 weights under torch.autocast to the compute dtype);
- the attention core (``launcher.train.model.attention_core``, the engine's SDPA call) at the
  configured batch, heads per GPU, sequence per GPU and kernel, forward and backward;
- the element-wise work of one layer (the engine's norms, residual adds, rotary, activation,
  dropout), forward and backward; the loss over the vocabulary (``model.loss_fn``) with the
  embedding lookup, forward and backward;
- the optimizer step as the engine runs it (``train.optim.build_optimizer``, gradient clipping,
  zero_grad) on this rank's share of the parameters;
- when the layout spans several processes on one node: its collectives at their message sizes,
  between 2 local processes (gloo on the CPU, NCCL on GPUs), where the backend supports the kind.
Each figure is the median of repeats after one warm-up call (on a GPU: the median of three batches
of back-to-back calls, each synchronised once, Timer.measure); repeats shrink to keep the whole run
within the time budget. On the CPU, torch uses the threads one process of the run will have
(render/run_files.local_env: cores / processes).

The profile (format: ``launcher.plan.profile``) goes to the cache (keyed by cluster.gpu) and/or to
--out; a file there that is a profile of the same device is merged (new shapes added, measured
ones replaced); anything else there is refused, never overwritten.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from launcher import __version__
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan import measurement_noise as noise
from launcher.plan import profile as prof
from launcher.plan.memory import DTYPE_BYTES
from launcher.plan.operators import Gemm, Operators, elementwise_bytes, operators

Progress = Callable[[str], None]

TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Seconds spent on one operator's repeats (after its warm-up call), and the repeat limits.
OP_BUDGET_S = 0.6
MIN_REPEATS, MAX_REPEATS = 3, 50


class Timer:
    def __init__(self, device: torch.device, deadline: float):
        self.device = device
        self.deadline = deadline
        self.spread = 0.0  # the widest relative spread of repeats since take_spread()

    def take_spread(self) -> float:
        """The widest spread of the repeats measured since the last call (measurement_noise)."""
        spread, self.spread = self.spread, 0.0
        return spread

    def _median(self, samples: list[float]) -> float:
        self.spread = max(self.spread, noise.relative_spread(samples))
        return float(statistics.median(samples))

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def measure(self, fn: Callable[[], Any]) -> float:
        """Median seconds of fn() after one warm-up call."""
        fn()
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        first = time.perf_counter() - start
        left = max(0.0, self.deadline - time.monotonic())
        budget = min(OP_BUDGET_S, left / 4)
        repeats = int(min(MAX_REPEATS, max(MIN_REPEATS, budget / max(first, 1e-6))))
        if self.device.type == "cuda":
            # Back to back, one synchronisation per batch: the host queues the next kernels while
            # the GPU runs these, as it does inside a training step. Synchronising after every
            # call would add the host's launch and dispatch time to each (Python, autograd,
            # autocast), which a step overlaps with the GPU's work: measured on one H100 80GB
            # (2026-11-25), one llama3-1b layer's element-wise work timed that way at 1.5 ms
            # forward for ~0.8 GB of traffic, about 5x what the memory moves in.
            batch = max(1, repeats // 3)
            means = []
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(batch):
                    fn()
                self.sync()
                means.append((time.perf_counter() - start) / batch)
            return self._median(means)
        times = [first]
        for _ in range(repeats - 1):
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        return self._median(times)


def _fwd_bwd(
    timer: Timer,
    forward: Callable[[], list[torch.Tensor]],
    inputs: list[torch.Tensor],
) -> tuple[float, float]:
    """(forward, backward) seconds: forward alone, and forward + backward less it. `forward`
    returns its outputs; the backward starts from gradients of ones and computes the gradients of
    `inputs` (torch.autograd.grad: fresh tensors each time, as a training step's activation
    gradients are, not accumulated into .grad over the repeats)."""
    with torch.no_grad():
        outs = forward()
    seeds = [torch.ones_like(o) for o in outs]

    def fwd() -> None:
        forward()

    def both() -> None:
        torch.autograd.grad(forward(), inputs, seeds)

    f = timer.measure(fwd)
    fb = timer.measure(both)
    return f, max(1e-9, fb - f)


def _autocast(device: torch.device, dtype: torch.dtype) -> Any:
    import contextlib

    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def measure_gemm(
    g: Gemm, timer: Timer, device: torch.device, dtype: torch.dtype, bias: bool
) -> tuple[float, float]:
    x = torch.randn(g.m, g.k, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(g.n, g.k, device=device, dtype=torch.float32, requires_grad=True)
    b = torch.zeros(g.n, device=device, dtype=torch.float32, requires_grad=True) if bias else None

    def forward() -> list[torch.Tensor]:
        with _autocast(device, dtype):
            return [F.linear(x, w, b)]

    return _fwd_bwd(timer, forward, [x, w] + ([b] if b is not None else []))


def measure_attention(
    ops: Operators, timer: Timer, device: torch.device, dtype: torch.dtype, dropout: float
) -> tuple[float, float]:
    from launcher.train.model import attention_core

    a = ops.attention
    q = torch.randn(a.batch, a.heads, a.seq, a.head_dim, device=device, dtype=dtype)
    k = torch.randn(a.batch, a.kv_heads, a.seq, a.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    for t in (q, k, v):
        t.requires_grad_(True)
    return _fwd_bwd(timer, lambda: [attention_core(q, k, v, a.kind, dropout)], [q, k, v])


def measure_elementwise(
    cfg: LLMTrainConfig, ops: Operators, timer: Timer, device: torch.device, dtype: torch.dtype
) -> tuple[float, float]:
    """One layer's element-wise work (operators.elementwise_bytes counts the same ops)."""
    from launcher.train.model import _activate, _norm, apply_rope, rope_tables

    m = cfg.model
    a = ops.attention
    b, s = a.batch, max(1, ops.tokens // max(1, a.batch))
    h, f = ops.hidden, ops.ffn_local
    norm1 = _norm(m.norm, h).to(device)
    norm2 = _norm(m.norm, h).to(device)
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    branch = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    gate = torch.randn(b, s, f, device=device, dtype=dtype, requires_grad=True)
    up = torch.randn_like(gate).requires_grad_(True) if ops.gated else None
    q = torch.randn(b, s, a.heads, a.head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(b, s, a.kv_heads, a.head_dim, device=device, dtype=dtype, requires_grad=True)
    cos, sin = rope_tables(s, a.head_dim, device, None, m.rope_theta)
    p = m.hidden_dropout

    def forward() -> list[torch.Tensor]:
        with _autocast(device, dtype):
            r = x + branch
            outs = [norm1(x), norm2(r), _activate(m.activation, gate, up), r + branch]
            if ops.rope:
                outs += [apply_rope(q, cos, sin), apply_rope(k, cos, sin)]
            if ops.dropout and p > 0:
                outs += [F.dropout(r, p, training=True), F.dropout(outs[3], p, training=True)]
            return outs

    leaves = [x, branch, gate, *list(norm1.parameters()), *list(norm2.parameters())]
    leaves += ([up] if up is not None else []) + ([q, k] if ops.rope else [])
    return _fwd_bwd(timer, forward, leaves)


def measure_loss(
    cfg: LLMTrainConfig, ops: Operators, timer: Timer, device: torch.device, dtype: torch.dtype
) -> tuple[float, float]:
    from launcher.train.model import loss_fn

    a = ops.attention
    b, s = a.batch, max(1, ops.tokens // max(1, a.batch))
    logits = torch.randn(b, s, ops.vocab_local, device=device, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, ops.vocab_local, (b, s), device=device)
    emb = torch.nn.Embedding(ops.vocab_local, ops.hidden).to(device)

    def forward() -> list[torch.Tensor]:
        return [loss_fn(logits, targets), emb(targets)]

    return _fwd_bwd(timer, forward, [logits, emb.weight])


def rank_params(cfg: LLMTrainConfig) -> tuple[int, int]:
    """(parameters this rank's optimizer updates, tensors the optimizer steps), from the plan.
    A backend that flattens the optimizer's partitions (Backend.flat_optimizer_stages: DeepSpeed
    ZeRO-1/2) steps one tensor per parameter group, two (decay / no decay); elsewhere the
    optimizer steps each parameter tensor."""
    from launcher.backends.common import backend_of
    from launcher.plan.memory import bytes_per_param
    from launcher.plan.planner import make_plan

    plan = make_plan(_without_profile(cfg))
    st = plan.memory.heaviest
    per = bytes_per_param(cfg).optimizer
    params = int(st.optimizer / per) if per > 0 else 0
    if cfg.zero.stage in backend_of(cfg).flat_optimizer_stages:
        return params, 2
    return params, max(1, 12 * st.layers + 4)


# Parameters the optimizer is timed on at most: on the CPU a bound on calibrate's time; on a GPU
# what fits in a share of the free memory at OPTIMIZER_BYTES_PER_PARAM (fp32 weight, gradient,
# two Adam states, the gradients' source copy and the foreach temporaries).
CPU_OPTIMIZER_PARAMS = 64_000_000
OPTIMIZER_BYTES_PER_PARAM = 28
OPTIMIZER_MEMORY_SHARE = 0.5


def optimizer_sizes(params: int, tensors: int, device: torch.device) -> tuple[int, int]:
    """(large, small) parameter counts to time the optimizer step at: the rank's own count when
    the device holds it, and a quarter of it, so that the step's fixed cost (a kernel launch per
    tensor and operation, clipping's norm, zero_grad) and its cost per parameter are told apart
    (plan.profile.Rates.optimizer_s fits the line through them)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cap = int(free * OPTIMIZER_MEMORY_SHARE / OPTIMIZER_BYTES_PER_PARAM)
    else:
        cap = CPU_OPTIMIZER_PARAMS
    large = max(tensors, min(params, cap))
    return large, max(tensors, large // 4)


def _time_optimizer(
    cfg: LLMTrainConfig, size: int, tensors: int, fused: bool, timer: Timer, device: torch.device
) -> float:
    from launcher.train.optim import build_optimizer

    weights = [torch.nn.Parameter(torch.randn(size, device=device)) for _ in range(tensors)]
    grads = [torch.randn(size, device=device) * 1e-3 for _ in range(tensors)]
    optimizer = build_optimizer(weights, cfg.optim, fused=fused)
    clip = cfg.optim.grad_clip

    def step() -> None:
        for w, g in zip(weights, grads, strict=True):
            w.grad = g
        if clip and clip > 0:
            torch.nn.utils.clip_grad_norm_(weights, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timer.measure(step)


def measure_optimizer(
    cfg: LLMTrainConfig, params: int, tensors: int, timer: Timer, device: torch.device
) -> list[tuple[int, float]]:
    """[(parameters measured, seconds)] of clip + step + zero_grad as the engines run them (the
    fused Adam kernel on CUDA, train.optim.fused_on), at optimizer_sizes."""
    from launcher.train.optim import fused_on

    fused = fused_on(device)
    out: list[tuple[int, float]] = []
    for measured in optimizer_sizes(params, tensors, device):
        size = max(1, measured // tensors)
        out.append((size * tensors, _time_optimizer(cfg, size, tensors, fused, timer, device)))
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the large size's tensors, freed on return
    return out


# --- collectives between local processes --------------------------------------------------------

_COLLECTIVE_WORKER = r"""
import json, os, statistics, sys, time
import torch, torch.distributed as dist
rank, world, store_path, backend, spec, threads = (
    int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5]),
    int(sys.argv[6]))
if threads:
    torch.set_num_threads(threads)
device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(device)
store = dist.FileStore(store_path, world)
dist.init_process_group(backend, store=store, rank=rank, world_size=world)
out = []
def sync():
    if backend == "nccl":
        torch.cuda.synchronize()
for kind, nbytes in spec:
    n = max(world, int(nbytes) // 4 // world * world)
    x = torch.ones(n, device=device)
    try:
        if kind == "all-reduce":
            fn = lambda: dist.all_reduce(x)
        elif kind == "all-gather":
            part = torch.ones(n // world, device=device)
            fn = lambda: dist.all_gather_into_tensor(x, part)
        elif kind == "reduce-scatter":
            part = torch.ones(n // world, device=device)
            fn = lambda: dist.reduce_scatter_tensor(part, x)
        elif kind == "all-to-all":
            y = torch.empty_like(x)
            fn = lambda: dist.all_to_all_single(y, x)
        elif kind == "p2p":
            def fn():
                if rank == 0:
                    dist.send(x, 1)
                elif rank == 1:
                    dist.recv(x, 0)
        else:
            continue
        fn(); sync(); dist.barrier()
        times = []
        for _ in range(5):
            dist.barrier(); sync()
            t = time.perf_counter(); fn(); sync()
            times.append(time.perf_counter() - t)
        # Every rank's median; the slowest rank is the collective's time.
        got = [None] * world
        dist.all_gather_object(got, statistics.median(times))
        out.append({"kind": kind, "bytes": n * 4, "seconds": max(got)})
    except Exception as exc:
        out.append({"kind": kind, "bytes": n * 4, "error": str(exc).splitlines()[0][:200]})
        dist.barrier()
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def measure_collectives(
    wanted: list[tuple[str, float]], backend: str, threads: int, timeout_s: float
) -> tuple[list[dict[str, Any]], str | None]:
    """Time each (kind, bytes) between 2 local processes (FileStore rendezvous, no port)."""
    import sys

    world = 2
    with tempfile.TemporaryDirectory(prefix="llmtrain-calibrate-") as tmp:
        store = os.path.join(tmp, "store")
        spec = json.dumps(wanted)
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, threads))}
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _COLLECTIVE_WORKER,
                    str(r),
                    str(world),
                    store,
                    backend,
                    spec,
                    str(threads),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for r in range(world)
        ]
        outputs: list[tuple[str, str]] = []
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            return [], f"collectives not measured: no answer within {timeout_s:.0f} s"
        for line in outputs[0][0].splitlines():
            if line.startswith("RESULT "):
                return list(json.loads(line[len("RESULT ") :])), None
        tail = (outputs[0][1] or outputs[-1][1]).strip().splitlines()[-1:] or ["?"]
        return [], f"collectives not measured: {tail[0][:200]}"


# --- the command ----------------------------------------------------------------------------------


def _without_profile(cfg: LLMTrainConfig) -> LLMTrainConfig:
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


KEYS: dict[str, tuple[str, ...]] = {
    "gemm": ("dtype", "threads", "m", "n", "k"),
    "attention": ("dtype", "threads", "kind", "batch", "heads", "kv_heads", "seq", "head_dim"),
    "elementwise": ("dtype", "threads", "tokens", "hidden", "ffn", "bytes"),
    "loss": ("dtype", "threads", "tokens", "vocab"),
    "optimizer": ("threads", "params"),
    "collectives": ("threads", "kind", "ranks", "bytes", "backend"),
}


def merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """`new` with the entries of `old` (a profile of the same device) it did not re-measure."""
    if old is None:
        return new
    out = dict(new)
    for section, keys in KEYS.items():
        fresh = {tuple(e.get(k) for k in keys) for e in new.get(section, [])}
        kept = [e for e in old.get(section, []) if tuple(e.get(k) for k in keys) not in fresh]
        out[section] = kept + list(new.get(section, []))
    out["calibrated"] = list(old.get("calibrated", [])) + list(new.get("calibrated", []))
    if isinstance(old.get("quality"), dict) and old["quality"].get("forced"):
        # Figures written with --force earlier may still be in it: it stays marked forced.
        quality = dict(new.get("quality") or {})
        quality["forced"] = True
        quality["problems"] = list(old["quality"].get("problems", [])) + list(
            quality.get("problems", [])
        )
        out["quality"] = quality
    out["digest"] = prof.digest(out)
    return out


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
            fh.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def calibrate(
    cfg: LLMTrainConfig,
    overrides: list[str],
    out: Path | None,
    use_cache: bool,
    progress: Progress,
    budget_s: float,
    force: bool = False,
) -> tuple[dict[str, Any], list[Path]]:
    """Measure, write, return (the profile written, the paths written). A figure whose repeats
    spread too wide, or that no kernel could give (measurement_noise), makes it write nothing
    (UserError naming each) unless `force`; the profile then says it was forced."""
    started = time.monotonic()
    load = noise.Load(os.getloadavg()[0], os.cpu_count() or 1)
    device = _device(cfg)
    layout = derive_layout(cfg)
    threads = prof.cpu_threads(cfg.cluster.gpus_per_node) if device.type == "cpu" else 0
    if threads:
        torch.set_num_threads(threads)
    dev = _device_info(cfg, device)
    targets: list[tuple[Path, str]] = []
    if out is not None:
        targets.append((out, "--out"))
    if use_cache:
        targets.append((prof.cache_path(cfg.cluster.gpu), "the cache"))
    existing = [(p, _existing(p, dev, w)) for p, w in targets]  # refuse before measuring

    dtype_name = cfg.precision.compute_dtype
    dtype = TORCH_DTYPE[dtype_name]
    timer = Timer(device, started + budget_s * 0.85)
    ops = operators(cfg, layout)
    tag = {"dtype": dtype_name, "threads": threads}
    doc: dict[str, Any] = {
        "schema": prof.SCHEMA,
        "version": prof.VERSION,
        "device": dev,
        "software": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "llmtrain": __version__,
        },
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gemm": [],
        "attention": [],
        "elementwise": [],
        "loss": [],
        "optimizer": [],
        "collectives": [],
        "notes": [],
    }
    gemms: dict[tuple[int, int, int], Gemm] = {}
    moe_layers = cfg.model.num_layers - cfg.model.moe_dense_layers if ops.moe_gemms else 0
    listed = list(ops.moe_gemms) if moe_layers else []
    if cfg.model.num_layers - moe_layers > 0:
        listed = list(ops.dense_gemms) + listed
    for g in [*listed, ops.head_gemm]:
        gemms.setdefault(g.shape, g)
    steps = len(gemms) + 4
    done = 0
    problems: list[str] = []  # figures that are noise or not physical

    def say(text: str) -> None:
        nonlocal done
        done += 1
        progress(f"[{done:>2}/{steps}] {text}  ({time.monotonic() - started:.1f} s)")

    def judged(what: str, entry: dict[str, Any], ratio: bool = True) -> str:
        """Record the repeats' spread in `entry`; a problem for a noisy or implausible figure;
        the words the progress line ends with."""
        spread = timer.take_spread()
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
        problems.extend(found)
        return f"  [NOISE: {'; '.join(found)}]" if found else f"  (spread {spread:.0%})"

    timer.take_spread()
    progress(
        f"calibrating {cfg.model.name} on {dev['name']} ({dtype_name}, {load.text()}"
        + (f", {threads} thread(s) per process" if threads else "")
        + f"): {len(gemms)} GEMM shapes, attention, element-wise, loss, optimizer"
        + (", collectives" if layout.world_size > 1 else "")
    )
    for g in gemms.values():
        f, b = measure_gemm(g, timer, device, dtype, cfg.model.linear_bias)
        entry = {**tag, "name": g.name, "m": g.m, "n": g.n, "k": g.k, "fwd_s": f, "bwd_s": b}
        doc["gemm"].append(entry)
        verdict = judged(f"GEMM {g.name} {g.m}x{g.n}x{g.k}", entry)
        say(
            f"GEMM {g.name} {g.m}x{g.n}x{g.k}: forward {f * 1e3:.3f} ms, backward "
            f"{b * 1e3:.3f} ms{verdict}"
        )
    a = ops.attention
    f, b = measure_attention(ops, timer, device, dtype, cfg.model.attention_dropout)
    doc["attention"].append(
        {
            **tag,
            "kind": a.kind,
            "batch": a.batch,
            "heads": a.heads,
            "kv_heads": a.kv_heads,
            "seq": a.seq,
            "head_dim": a.head_dim,
            "fwd_s": f,
            "bwd_s": b,
        }
    )
    verdict = judged(f"attention ({a.kind})", doc["attention"][-1])
    say(
        f"attention ({a.kind}) b={a.batch} heads={a.heads} seq={a.seq} d={a.head_dim}: forward "
        f"{f * 1e3:.3f} ms, backward {b * 1e3:.3f} ms{verdict}"
    )
    f, b = measure_elementwise(cfg, ops, timer, device, dtype)
    nbytes = elementwise_bytes(ops, DTYPE_BYTES[dtype_name])
    doc["elementwise"].append(
        {
            **tag,
            "tokens": ops.tokens,
            "hidden": ops.hidden,
            "ffn": ops.ffn_local,
            "bytes": nbytes,
            "fwd_s": f,
            "bwd_s": b,
        }
    )
    verdict = judged("element-wise work of one layer", doc["elementwise"][-1], ratio=False)
    say(
        f"element-wise work of one layer: forward {f * 1e3:.3f} ms, backward {b * 1e3:.3f} ms"
        f"{verdict}"
    )
    f, b = measure_loss(cfg, ops, timer, device, dtype)
    doc["loss"].append(
        {**tag, "tokens": ops.tokens, "vocab": ops.vocab_local, "fwd_s": f, "bwd_s": b}
    )
    verdict = judged("loss", doc["loss"][-1], ratio=False)
    say(
        f"loss over {ops.vocab_local} logits + embedding: forward {f * 1e3:.3f} ms, "
        f"backward {b * 1e3:.3f} ms{verdict}"
    )
    params, tensors = rank_params(cfg)
    if params > 0:
        timed = measure_optimizer(cfg, params, tensors, timer, device)
        spread = timer.take_spread()
        odd = [f"optimizer step: repeats spread {spread:.0%}"] if noise.is_noise(spread) else []
        if len(timed) == 2:
            line = noise.line_problem("optimizer step", timed[1], timed[0])
            odd += [line] if line else []
        problems.extend(odd)
        for n, s in timed:
            doc["optimizer"].append(
                {
                    "threads": threads,
                    "params": n,
                    "tensors": tensors,
                    "seconds": s,
                    "name": cfg.optim.name,
                    "spread": round(spread, 4),
                }
            )
        say(
            f"optimizer step ({cfg.optim.name}, clip, zero_grad): "
            + ", ".join(f"{s * 1e3:.3f} ms on {n:,} parameters" for n, s in timed)
            + (f"  [NOISE: {'; '.join(odd)}]" if odd else f"  (spread {spread:.0%})")
        )
    else:
        say("optimizer: no optimizer states on this rank")

    if layout.world_size > 1:
        from launcher.plan.planner import make_plan

        plan = make_plan(_without_profile(cfg))
        wanted: list[tuple[str, float]] = []
        named: list[str] = []
        for c in plan.time.collectives:
            if c.group_size == 2 and c.group_size <= cfg.cluster.gpus_per_node:
                for size in (c.message_bytes, c.message_bytes / 4):
                    if (c.kind, size) not in wanted and size >= 4:
                        wanted.append((c.kind, size))
            else:
                named.append(f"{c.name} over {c.group_size} ranks")
        backend = "gloo" if device.type == "cpu" else "nccl"
        visible = (os.cpu_count() or 1) if device.type == "cpu" else torch.cuda.device_count()
        if wanted and visible >= 2:
            left = max(10.0, budget_s - (time.monotonic() - started))
            rows, problem = measure_collectives(wanted, backend, max(1, threads), left)
            for r in rows:
                if "seconds" in r:
                    doc["collectives"].append(
                        {"threads": threads, "ranks": 2, "backend": backend, **r}
                    )
                else:
                    doc["notes"].append(f"{r['kind']}: not measured ({r['error']})")
            if problem:
                doc["notes"].append(problem)
            say(
                f"collectives ({backend}, 2 processes): "
                + ", ".join(
                    f"{r['kind']} {r['bytes'] / 1e6:.2f} MB {r['seconds'] * 1e3:.2f} ms"
                    for r in rows
                    if "seconds" in r
                )
                or "none measured"
            )
        for text in named:
            doc["notes"].append(f"{text}: catalog figures (not measured here)")
    doc["calibrated"] = [
        {
            "overrides": overrides,
            "seconds": round(time.monotonic() - started, 2),
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
    written: list[Path] = []
    final = doc
    for (path, _), old in zip(targets, existing, strict=True):
        final = merge(old[1], doc) if old[1] is not None else doc
        _write(path, final)
        written.append(path)
    return final, written


__all__ = ["calibrate", "merge"]
