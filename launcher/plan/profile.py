"""Operator profiles: what ``llmtrain calibrate`` measured on a machine, read back by ``plan``.

A profile is one plain JSON file (no torch needed to read it):

    {"schema": "llmtrain-profile", "version": 1,
     "device": {"cluster_gpu": "cpu", "name": "...", "kind": "cpu" | "cuda", "count": 1,
                "driver": null, "memory_bytes": ...},
     "software": {"torch": "2.13.0", "cuda": null, "python": "3.11.2", "llmtrain": "..."},
     "created": "2026-11-25T14:00:00Z",
     "calibrated": [{"overrides": [...], "seconds": 12.3, "created": "..."}],
     "gemm": [{"name", "dtype", "threads", "m", "n", "k", "fwd_s", "bwd_s"}],
     "attention": [{"dtype", "threads", "kind", "batch", "heads", "kv_heads", "seq", "head_dim",
                    "fwd_s", "bwd_s"}],
     "elementwise": [{"dtype", "threads", "tokens", "hidden", "ffn", "bytes", "fwd_s", "bwd_s"}],
     "loss": [{"dtype", "threads", "tokens", "vocab", "fwd_s", "bwd_s"}],
     "optimizer": [{"threads", "params", "tensors", "seconds"}],
     "collectives": [{"kind", "ranks", "bytes", "seconds", "backend", "threads"}],
     "digest": "sha256:<hex of the canonical JSON of everything else>"}

Times are seconds per call (the median of the repeats). `threads` is the CPU threads per process the
figure was measured with (torch.get_num_threads(); 0 on a GPU, where it does not matter): a CPU
run with two processes on two cores gives each process one thread (launch/local.worker_env), so a
figure measured with two threads does not price it.

The digest catches a file edited by hand or cut short (it is no signature: anyone can recompute
it). A profile is refused when its schema, version or digest is wrong or when it was measured on
another device (``device.cluster_gpu`` differs from ``cluster.gpu``).

Since a digest proves nothing, every figure must also be physically possible (``_check_physics``):
a positive, finite number of seconds, at most ``MAX_SECONDS``, and no faster than the device can
go: a GEMM or attention call's FLOPs per second at most ``MARGIN`` times the device's highest dense
peak in the catalog (launcher/plan/hardware.py), element-wise, loss, optimizer and collective work
at most ``MARGIN`` times its memory (or link) bandwidth. On the CPU, whose catalog entry is an
estimate for a small workstation, the ceiling also grows with the threads the figure was measured
with (``CPU_FLOPS_PER_THREAD``, ``CPU_BYTES_PER_THREAD``). A backward figure is judged as the
forward + backward call calibrate measured it in. A forged profile claiming 1e-300 s per call is
refused, exit 2, naming cluster.profile and the entry.

The file itself is read bounded (``launcher.bounded_read``): a regular file of at most
``MAX_BYTES``, opened without blocking (a FIFO or /dev/zero is refused, never read), JSON nested at
most ``MAX_DEPTH`` deep. Messages name the entry and the key, quoting a value only as a short,
escaped excerpt (``launcher.excerpt``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from launcher import bounded_read
from launcher.cache_dir import cache_root
from launcher.excerpt import excerpt
from launcher.excerpt import name as shown

SCHEMA = "llmtrain-profile"
VERSION = 1
SECTIONS = ("gemm", "attention", "elementwise", "loss", "optimizer", "collectives")
MAX_BYTES = 16 << 20
MAX_DEPTH = 8
# Slowest single call a profile may hold: calibrate times each operator in well under a minute.
MAX_SECONDS = 3600.0
# How far past the catalog's peak a measured rate may look before it is refused as impossible: a
# timer's resolution and caches let small calls look somewhat faster than the datasheet's peak,
# never by more than this. (A forged figure is off by many orders of magnitude.)
MARGIN = 4.0
# CPU ceilings per thread measured with: Intel AMX does 1024 bf16 FLOP per cycle per core
# (Intel 64 and IA-32 Architectures Optimization Reference Manual, ch. "Intel AMX"), ~4 GHz -> ~4
# TFLOP/s; L1 cache bandwidth, 128 bytes per cycle per core at ~4 GHz -> ~0.5 TB/s.
CPU_FLOPS_PER_THREAD = 4.1e12
CPU_BYTES_PER_THREAD = 5.1e11
MAX_THREADS = 4096


class ProfileError(Exception):
    """A profile that cannot be used: the message says why."""


def cache_dir() -> Path:
    """$LLMTRAIN_PROFILE_DIR, else profiles/ in llmtrain's cache (launcher.cache_dir)."""
    explicit = os.environ.get("LLMTRAIN_PROFILE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return cache_root() / "profiles"


def cache_path(cluster_gpu: str) -> Path:
    """The cached profile of cluster.gpu, e.g. ~/.cache/llmtrain/profiles/cpu.json."""
    return cache_dir() / f"{cluster_gpu}.json"


def canonical(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def digest(doc: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical(doc)).hexdigest()


def host_cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it ('' where there is none); no torch."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_threads(gpus_per_node: int) -> int:
    """CPU threads per process of a local CPU run (launch/local.worker_env's OMP_NUM_THREADS)."""
    return max(1, (os.cpu_count() or 1) // max(1, gpus_per_node))


def _positive(value: Any) -> TypeGuard[float]:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


_TIMES = {"fwd_s", "bwd_s", "seconds"}
_NUMBERS = {
    "gemm": ("fwd_s", "bwd_s", "m", "n", "k"),
    "attention": ("fwd_s", "bwd_s", "batch", "heads", "seq", "head_dim"),
    "elementwise": ("fwd_s", "bwd_s", "bytes", "tokens"),
    "loss": ("fwd_s", "bwd_s", "tokens", "vocab"),
    "optimizer": ("seconds", "params"),
    "collectives": ("seconds", "bytes", "ranks"),
}
_INTEGERS = {"m", "n", "k", "batch", "heads", "kv_heads", "seq", "head_dim", "tokens", "ranks"}
_STRINGS = ("dtype", "kind", "backend")


def _check_entries(doc: dict[str, Any]) -> None:
    """Every figure rates() reads is there and of its type: numbers positive and finite (sizes
    whole numbers below 2^53), times at most MAX_SECONDS, threads a count, names short text."""
    for section, keys in _NUMBERS.items():
        entries = doc.get(section, [])
        if not isinstance(entries, list):
            raise ProfileError(f"'{section}' is not a list")
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise ProfileError(f"{section}[{i}] is not an object")
            for key in (*keys, *(("kv_heads",) if "kv_heads" in e else ())):
                value = e.get(key)
                if not _positive(value):
                    raise ProfileError(
                        f"{section}[{i}].{key} = {excerpt(value)}: not a positive number"
                    )
                if key in _INTEGERS and (float(value) != int(value) or value >= 2**53):
                    raise ProfileError(
                        f"{section}[{i}].{key} = {excerpt(value)}: not a whole number"
                    )
                if key in _TIMES and value > MAX_SECONDS:
                    raise ProfileError(
                        f"{section}[{i}].{key} = {excerpt(value)} s: longer than any call "
                        f"calibrate times ({MAX_SECONDS:.0f} s)"
                    )
            threads = e.get("threads", 0)
            if (
                isinstance(threads, bool)
                or not isinstance(threads, int)
                or not 0 <= threads <= MAX_THREADS
            ):
                raise ProfileError(
                    f"{section}[{i}].threads = {excerpt(threads)}: not a thread count "
                    f"(0 to {MAX_THREADS})"
                )
            for key in _STRINGS:
                if key in e and not (isinstance(e[key], str) and 0 < len(e[key]) <= 64):
                    raise ProfileError(f"{section}[{i}].{key} = {excerpt(e[key])}: not a name")


def _ceilings(cluster_gpu: str, threads: int) -> tuple[float, float]:
    """(FLOP/s, bytes/s) no figure measured on `cluster_gpu` with `threads` threads can beat."""
    from launcher.plan.hardware import CATALOG, UnknownGPUError, get_gpu

    try:
        specs = [get_gpu(cluster_gpu)]
    except UnknownGPUError:  # refused by check_device anyway: bound it by the fastest device
        specs = list(CATALOG.values())
    flops = max(max(s.peak_tflops.values()) for s in specs) * 1e12 * MARGIN
    nbytes = (
        max(max(s.memory_bandwidth_gbps, s.intra_node_bandwidth_gbps) for s in specs) * 1e9 * MARGIN
    )
    if any(s.arch == "cpu" for s in specs):
        flops = max(flops, CPU_FLOPS_PER_THREAD * max(1, threads))
        nbytes = max(nbytes, CPU_BYTES_PER_THREAD * max(1, threads))
    return flops, nbytes


def _work(section: str, e: dict[str, Any]) -> tuple[float, float]:
    """(least FLOPs, least bytes) one call of entry `e` must do: GEMM 2mnk; attention 2 x batch x
    heads x seq^2 x head_dim (causal, half of 4bhs^2d); element-wise its bytes; the loss reads
    tokens x vocab logits of 2 bytes at least; the optimizer 4 bytes per parameter at least; a
    collective its bytes."""
    if section == "gemm":
        return 2.0 * e["m"] * e["n"] * e["k"], 0.0
    if section == "attention":
        return 2.0 * e["batch"] * e["heads"] * e["seq"] ** 2 * e["head_dim"], 0.0
    if section == "elementwise":
        return 0.0, float(e["bytes"])
    if section == "loss":
        return 0.0, 2.0 * e["tokens"] * e["vocab"]
    if section == "optimizer":
        return 0.0, 4.0 * e["params"]
    return 0.0, float(e["bytes"])


def _check_physics(doc: dict[str, Any]) -> None:
    """Refuse a figure faster than the device can go (see the module docstring)."""
    cluster_gpu = doc["device"]["cluster_gpu"]
    for section, keys in _NUMBERS.items():
        for i, e in enumerate(doc.get(section, [])):
            flops, nbytes = _work(section, e)
            most_flops, most_bytes = _ceilings(cluster_gpu, e.get("threads", 0))
            for key in (k for k in keys if k in _TIMES):
                # calibrate times the forward, and forward + backward as one call; its backward
                # is their difference, which timer noise can bring near zero (it writes 1e-9 s
                # then): the backward is judged as the forward + backward it was measured as.
                seconds = float(e[key]) + (float(e["fwd_s"]) if key == "bwd_s" else 0.0)
                if flops / seconds > most_flops or nbytes / seconds > most_bytes:
                    rate = (
                        f"{flops / seconds / 1e12:.3g} TFLOP/s"
                        if flops
                        else f"{nbytes / seconds / 1e9:.3g} GB/s"
                    )
                    raise ProfileError(
                        f"{section}[{i}].{key} = {excerpt(e[key])} s: {rate}, faster than "
                        f"{excerpt(cluster_gpu)} can go (at most {MARGIN:g}x its catalog "
                        "peak); not a measurement (run `llmtrain calibrate` again)"
                    )


def validate(doc: Any) -> dict[str, Any]:
    """The document when it is a profile of this schema and version with a matching digest."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ProfileError(f'not an llmtrain profile (no "schema": "{SCHEMA}")')
    if doc.get("version") != VERSION:
        raise ProfileError(
            f"profile version {excerpt(doc.get('version'))}; this llmtrain reads version "
            f"{VERSION} (run `llmtrain calibrate` again)"
        )
    if doc.get("digest") != digest(doc):
        raise ProfileError(
            "its digest does not match its contents (edited or cut short since calibrate wrote "
            "it; run `llmtrain calibrate` again)"
        )
    device = doc.get("device")
    if not isinstance(device, dict) or not isinstance(device.get("cluster_gpu"), str):
        raise ProfileError("no device.cluster_gpu")
    for key in ("cluster_gpu", "name", "kind"):
        value = device.get(key)
        if value is not None and not (
            isinstance(value, str) and len(value) <= 200 and value.isprintable()
        ):
            raise ProfileError(f"device.{key} = {excerpt(value)}: not a short line of text")
    _check_entries(doc)
    _check_physics(doc)
    return doc


def read(path: Path) -> dict[str, Any]:
    """The profile at `path`, read bounded and validated (see the module docstring)."""
    try:
        doc = bounded_read.read_json(
            path, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, follow_symlinks=True
        )
    except FileNotFoundError:
        raise ProfileError("no such file") from None
    except OSError as exc:
        raise ProfileError(f"cannot read it: {exc.strerror or exc}") from None
    except bounded_read.FileRefused as exc:
        raise ProfileError(f"it {exc}") from None
    return validate(doc)


# --- looking measured figures up --------------------------------------------------------------


def _log_distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(
        abs(math.log(max(1.0, x)) - math.log(max(1.0, y))) for x, y in zip(a, b, strict=True)
    )


@dataclass(frozen=True)
class Rates:
    """A profile's figures for one dtype and thread count, in hashable form (the planner's
    memoisation keys hold it). Every lookup returns None when nothing of its class was measured."""

    dtype: str
    threads: int
    gemms: tuple[tuple[int, int, int, float, float], ...]  # m, n, k, fwd_s, bwd_s
    attention: tuple[tuple[str, int, int, int, int, int, float, float], ...]
    elementwise: tuple[tuple[int, float, float, float], ...]  # tokens, bytes, fwd_s, bwd_s
    loss: tuple[tuple[float, float, float], ...]  # tokens x vocab, fwd_s, bwd_s
    optimizer: tuple[tuple[float, float], ...]  # params, seconds
    collectives: tuple[tuple[str, int, float, float], ...]  # kind, ranks, bytes, seconds
    # True: every compute lookup at the fastest rate measured in its class (``optimistic``).
    bound: bool = False

    def optimistic(self) -> Rates:
        """These figures with every compute lookup (GEMM, attention, element-wise, loss) at the
        fastest rate measured in its class, whatever the shape: never slower than the exact
        lookups, and proportional to the work, so a step priced from it at one sequence per
        micro-batch and scaled bounds every larger micro-batch (the layout search's bound,
        search/layouts.py).

        e.g. GEMMs measured at 100 and 400 GFLOP/s forward: every forward GEMM is priced at 400.
        """
        return dataclasses.replace(self, bound=True)

    def gemm(self, m: float, n: float, k: float) -> tuple[float, float, bool] | None:
        """(forward, backward seconds, measured exactly) of one m x n x k GEMM: the measured
        figure for that shape, else the nearest measured shape's (log distance over m, n, k) at
        its FLOP rate.

        e.g. measured 2048 x 128 x 128 in 1.0 ms forward: 2048 x 128 x 256 (twice the FLOPs,
        not measured) is priced 2.0 ms.
        """
        if not self.gemms:
            return None
        if self.bound:
            work = m * n * k
            return (
                work * min(g[3] / (g[0] * g[1] * g[2]) for g in self.gemms),
                work * min(g[4] / (g[0] * g[1] * g[2]) for g in self.gemms),
                False,
            )
        for gm, gn, gk, f, b in self.gemms:
            if (gm, gn, gk) == (round(m), round(n), round(k)):
                return f, b, True
        near = min(self.gemms, key=lambda g: _log_distance((g[0], g[1], g[2]), (m, n, k)))
        scale = (m * n * k) / (near[0] * near[1] * near[2])
        return near[3] * scale, near[4] * scale, False

    def attention_s(
        self, kind: str, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int
    ) -> tuple[float, float, bool] | None:
        """(forward, backward, exact) of the attention core; other shapes scale by the FLOPs of
        the nearest measured one (batch x heads x seq^2 x head_dim)."""
        same = [a for a in self.attention if a[0] == kind] or list(self.attention)
        if not same:
            return None
        if self.bound:
            work = batch * heads * seq * seq * head_dim
            per = [a[1] * a[2] * a[4] ** 2 * a[5] for a in same]
            return (
                work * min(a[6] / w for a, w in zip(same, per, strict=True)),
                work * min(a[7] / w for a, w in zip(same, per, strict=True)),
                False,
            )
        for a in same:
            if a[1:6] == (batch, heads, kv_heads, seq, head_dim) and a[0] == kind:
                return a[6], a[7], True
        near = min(same, key=lambda a: _log_distance((a[4], a[5], a[2]), (seq, head_dim, heads)))
        scale = (batch * heads * seq * seq * head_dim) / (
            near[1] * near[2] * near[4] ** 2 * near[5]
        )
        return near[6] * scale, near[7] * scale, False

    def elementwise_per_byte(self, nbytes: float) -> tuple[float, float] | None:
        """(forward, backward) seconds per forward byte of element-wise work, from the measured
        layer nearest in size."""
        if not self.elementwise:
            return None
        if self.bound:
            return (
                min(e[2] / e[1] for e in self.elementwise),
                min(e[3] / e[1] for e in self.elementwise),
            )
        near = min(self.elementwise, key=lambda e: abs(math.log(e[1] / max(1.0, nbytes))))
        return near[2] / near[1], near[3] / near[1]

    def loss_s(self, tokens: float, vocab: float) -> tuple[float, float] | None:
        """(forward, backward) of the loss (and embedding lookup), scaled by tokens x vocab."""
        if not self.loss:
            return None
        size = tokens * vocab
        if self.bound:
            return size * min(e[1] / e[0] for e in self.loss), size * min(
                e[2] / e[0] for e in self.loss
            )
        near = min(self.loss, key=lambda e: abs(math.log(e[0] / max(1.0, size))))
        return near[1] * size / near[0], near[2] * size / near[0]

    def optimizer_s(self, params: float) -> float | None:
        """Seconds of one optimizer step (with gradient clipping and zero_grad) on `params`
        parameters: the line (fixed cost + cost per parameter, least squares) through the sizes
        measured; with one size only, its seconds per parameter.

        e.g. measured 10 ms on 1e9 and 4 ms on 2.5e8 parameters: 2 ms fixed + 8 ms per 1e9, so
        2e9 parameters are priced 18 ms (proportional scaling from 2.5e8 would say 32 ms).
        """
        if not self.optimizer or params <= 0:
            return None
        return _line(list(self.optimizer), params)

    def collective_s(self, kind: str, ranks: int, nbytes: float) -> float | None:
        """Seconds of one collective: latency + bytes / bandwidth fitted (least squares) to the
        sizes measured for this kind and group size; None when none was."""
        rows = [(b, s) for k, r, b, s in self.collectives if k == kind and r == ranks]
        if not rows:
            return None
        return _line(rows, nbytes)


def _line(rows: list[tuple[float, float]], x: float) -> float:
    """y at x of the least-squares line (intercept >= 0, slope >= 0) through (x, y) rows; one
    row: y proportional to x."""
    if len(rows) == 1:
        return rows[0][1] * x / rows[0][0]
    n = len(rows)
    mx = sum(b for b, _ in rows) / n
    my = sum(s for _, s in rows) / n
    var = sum((b - mx) ** 2 for b, _ in rows)
    slope = sum((b - mx) * (s - my) for b, s in rows) / var if var > 0 else 0.0
    slope = max(0.0, slope)
    alpha = max(0.0, my - slope * mx)
    return alpha + slope * x


def rates(doc: dict[str, Any], dtype: str, threads: int) -> Rates:
    def ok(e: dict[str, Any], with_dtype: bool = True) -> bool:
        return (not with_dtype or e.get("dtype") == dtype) and int(e.get("threads", 0)) == threads

    return Rates(
        dtype=dtype,
        threads=threads,
        gemms=tuple(
            sorted(
                (int(e["m"]), int(e["n"]), int(e["k"]), float(e["fwd_s"]), float(e["bwd_s"]))
                for e in doc.get("gemm", [])
                if ok(e)
            )
        ),
        attention=tuple(
            sorted(
                (
                    str(e.get("kind", "flash")),
                    int(e["batch"]),
                    int(e["heads"]),
                    int(e.get("kv_heads", e["heads"])),
                    int(e["seq"]),
                    int(e["head_dim"]),
                    float(e["fwd_s"]),
                    float(e["bwd_s"]),
                )
                for e in doc.get("attention", [])
                if ok(e)
            )
        ),
        elementwise=tuple(
            sorted(
                (int(e["tokens"]), float(e["bytes"]), float(e["fwd_s"]), float(e["bwd_s"]))
                for e in doc.get("elementwise", [])
                if ok(e)
            )
        ),
        loss=tuple(
            sorted(
                (float(e["tokens"]) * float(e["vocab"]), float(e["fwd_s"]), float(e["bwd_s"]))
                for e in doc.get("loss", [])
                if ok(e)
            )
        ),
        optimizer=tuple(
            sorted(
                (float(e["params"]), float(e["seconds"]))
                for e in doc.get("optimizer", [])
                if ok(e, with_dtype=False)
            )
        ),
        collectives=tuple(
            sorted(
                (str(e["kind"]), int(e["ranks"]), float(e["bytes"]), float(e["seconds"]))
                for e in doc.get("collectives", [])
                if ok(e, with_dtype=False)
            )
        ),
    )


# --- choosing the profile a plan uses ---------------------------------------------------------


@dataclass(frozen=True)
class ProfileChoice:
    """The profile a plan prices from: where it came from and its figures for the plan's dtype."""

    path: str
    origin: str  # "cluster.profile" | "cache"
    created: str
    device: str
    rates: Rates

    @property
    def line(self) -> str:
        return f"measured on this machine, profile {self.path}, {self.created}"


@functools.lru_cache(maxsize=32)
def _read_cached(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    return read(Path(path))


def load(path: Path) -> dict[str, Any]:
    """read(path), memoised on the file's modification time and size (plan reads it often)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ProfileError("no such file") from None
    except OSError as exc:
        raise ProfileError(f"cannot read it: {exc.strerror or exc}") from None
    return _read_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


def check_device(doc: dict[str, Any], cluster_gpu: str) -> None:
    measured = doc["device"]["cluster_gpu"]
    if measured != cluster_gpu:
        raise ProfileError(
            f"measured on {excerpt(doc['device'].get('name', measured))} (cluster.gpu="
            f"{excerpt(measured)}), not on cluster.gpu={cluster_gpu}"
        )


def choose(
    cluster_gpu: str, explicit: str | None, dtype: str, threads: int
) -> tuple[ProfileChoice | None, str | None]:
    """(the profile to price from or None, a note for the user or None).

    explicit (cluster.profile): "none"/"off" uses no profile; a path must be a valid profile of
    this device, else ProfileError (the caller exits 2 naming cluster.profile). Without it, the
    cache's profile of cluster.gpu is used when valid and of this device; otherwise it is
    ignored with a note.
    """
    if explicit is not None and explicit.strip().lower() in ("none", "off", "false", ""):
        return None, None
    if explicit is not None:
        path = Path(explicit).expanduser()
        doc = load(path)
        check_device(doc, cluster_gpu)
        origin = "cluster.profile"
    else:
        path = cache_path(cluster_gpu)
        if not path.is_file():
            return None, None
        try:
            doc = load(path)
            check_device(doc, cluster_gpu)
            if doc["device"].get("kind") == "cpu":
                here = host_cpu_name()
                there = doc["device"].get("name", "")
                if here and there and here != there:
                    raise ProfileError(
                        f"measured on {excerpt(there)}, this machine is {excerpt(here)}"
                    )
        except ProfileError as exc:
            return None, f"cached profile {path} ignored: {exc}; priced from published figures"
        origin = "cache"
    forced = quality_note(doc)
    if forced is not None and not forced[1]:  # noisy figures nobody chose to keep
        if origin == "cluster.profile":
            raise ProfileError(forced[0])
        return None, f"cached profile {path} ignored: {forced[0]}; priced from published figures"
    found = rates(doc, dtype, threads)
    if not (found.gemms or found.attention or found.elementwise or found.loss):
        return None, (
            f"profile {path} holds no figures for {dtype} with {threads} thread(s) per process "
            "(calibrate this configuration to add them); priced from published figures"
        )
    note = f"profile {path}: {forced[0]}" if forced is not None else None
    return (
        ProfileChoice(
            path=str(path),
            origin=origin,
            created=shown(str(doc.get("created", "?")), 40),
            device=shown(str(doc["device"].get("name") or doc["device"]["cluster_gpu"]), 60),
            rates=found,
        ),
        note,
    )


def quality_note(doc: dict[str, Any]) -> tuple[str, bool] | None:
    """(what is wrong with the profile's figures, whether calibrate --force kept them), or None
    when calibrate found every figure steady and physical (launcher.plan.measurement_noise)."""
    quality = doc.get("quality")
    if not isinstance(quality, dict):
        return None
    problems = [str(p) for p in quality.get("problems") or []]
    if not problems:
        return None
    first = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    if quality.get("forced"):
        return (
            f"written with calibrate --force over {len(problems)} figure(s) that are noise or "
            f"not physical ({first}); its prices may be noise too",
            True,
        )
    return f"{len(problems)} of its figures are noise or not physical ({first})", False


__all__ = [
    "SCHEMA",
    "VERSION",
    "ProfileChoice",
    "ProfileError",
    "Rates",
    "cache_dir",
    "cache_path",
    "choose",
    "cpu_threads",
    "digest",
    "host_cpu_name",
    "load",
    "rates",
    "read",
    "validate",
]
