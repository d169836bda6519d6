"""The profile format: what ``llmtrain calibrate`` measured on a machine, read back by ``plan``.

This module is the format's one home: its layout, reading and checking a file, merging new
figures into an existing profile (``merge``), and choosing the profile a plan prices from
(``choose``). The figures' lookups are ``launcher.plan.hardware.profile_rates``; the measuring is
``launcher.launch.calibrate``.

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
     "overhead": [{"layout", "threads", "ranks", "units", "seconds", "measured_s", "planned_s"}],
     "notes": ["what was not measured, and why"],
     "quality": {"load1", "cores", "busy", "spread_limit", "problems": [...], "forced": false},
     "digest": "sha256:<hex of the canonical JSON of everything else>"}

Times are seconds per call (the median of the repeats); an overhead entry is seconds per step of a
layout family (``profile_rates.layout_family``) beyond the planner's terms, at `units` = the
synchronisations of a step (``profile_rates.overhead_units``, ``launch/step_overhead.py``). A
profile without an "overhead" section (written before it existed) is read as one that measured
none. `threads` is the CPU threads per process the figure was measured with
(torch.get_num_threads(); 0 on a GPU, where it does not matter): a CPU run with two processes on
two cores gives each process one thread (launch/local.worker_env), so a figure measured with two
threads does not price it.

The digest catches a file edited by hand or cut short (it is no signature: anyone can recompute
it). A profile is refused when its schema, version or digest is wrong or when it was measured on
another device (``device.cluster_gpu`` differs from ``cluster.gpu``).

Since a digest proves nothing, every figure must also be physically possible (``_check_physics``):
a positive, finite number of seconds, at most ``MAX_SECONDS``, and no faster than the device can
go: a GEMM or attention call's FLOPs per second at most ``MARGIN`` times the device's highest dense
peak in the catalog (launcher/plan/hardware/lookup.py), element-wise, loss, optimizer and collective
work at most ``MARGIN`` times its memory (or link) bandwidth. On the CPU, whose catalog entry is an
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
from launcher.plan.hardware.profile_rates import Rates, rates

SCHEMA = "llmtrain-profile"
VERSION = 1
SECTIONS = ("gemm", "attention", "elementwise", "loss", "optimizer", "collectives", "overhead")
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


def dumps(doc: dict[str, Any]) -> str:
    """The file's text: indented JSON, keys sorted, one final newline."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


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


def _check_overhead(doc: dict[str, Any]) -> None:
    """The "overhead" entries (launch/step_overhead.py): a layout family's name, a thread count,
    its ranks and units (whole numbers), and seconds per step between 0 and MAX_SECONDS (0: the
    planner's terms already cover the shrunk run)."""
    entries = doc.get("overhead", [])
    if not isinstance(entries, list):
        raise ProfileError("'overhead' is not a list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ProfileError(f"overhead[{i}] is not an object")
        layout = e.get("layout")
        if not (isinstance(layout, str) and 0 < len(layout) <= 64 and layout.isprintable()):
            raise ProfileError(f"overhead[{i}].layout = {excerpt(layout)}: not a name")
        for key in ("units", "ranks"):
            value = e.get(key)
            if not _positive(value) or float(value) != int(value) or value >= 2**53:
                raise ProfileError(f"overhead[{i}].{key} = {excerpt(value)}: not a count")
        seconds, threads = e.get("seconds"), e.get("threads", 0)
        if not (_positive(seconds) or seconds == 0) or isinstance(seconds, bool):
            raise ProfileError(f"overhead[{i}].seconds = {excerpt(seconds)}: not a time")
        if seconds > MAX_SECONDS:
            raise ProfileError(
                f"overhead[{i}].seconds = {excerpt(seconds)} s: longer than any step calibrate "
                f"times ({MAX_SECONDS:.0f} s)"
            )
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise ProfileError(f"overhead[{i}].threads = {excerpt(threads)}: not a thread count")
        if not 0 <= threads <= MAX_THREADS:
            raise ProfileError(f"overhead[{i}].threads = {excerpt(threads)}: not a thread count")


def _ceilings(cluster_gpu: str, threads: int) -> tuple[float, float]:
    """(FLOP/s, bytes/s) no figure measured on `cluster_gpu` with `threads` threads can beat."""
    from launcher.plan.hardware.lookup import CATALOG, UnknownGPUError, get_gpu

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
    _check_overhead(doc)
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


# The key of an entry in each section: calibrate's new figures replace the old ones of the same
# key when it merges into an existing profile of the same device (``merge``).
KEYS: dict[str, tuple[str, ...]] = {
    "gemm": ("dtype", "threads", "m", "n", "k"),
    "attention": ("dtype", "threads", "kind", "batch", "heads", "kv_heads", "seq", "head_dim"),
    "elementwise": ("dtype", "threads", "tokens", "hidden", "ffn", "bytes"),
    "loss": ("dtype", "threads", "tokens", "vocab"),
    "optimizer": ("threads", "params"),
    "collectives": ("threads", "kind", "ranks", "bytes", "backend"),
    "overhead": ("threads", "layout", "units"),
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
    out["digest"] = digest(out)
    return out


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
    when calibrate found every figure steady and physical
    (launcher.plan.hardware.measurement_noise)."""
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
    "KEYS",
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
    "dumps",
    "host_cpu_name",
    "load",
    "merge",
    "rates",
    "read",
    "validate",
]
