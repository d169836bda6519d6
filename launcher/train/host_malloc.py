"""FSDP2 on the CPU gives its freed gathered weights back: glibc's mmap threshold pinned.

On the CPU torch takes every tensor's memory from the C library (c10's alloc_cpu:
posix_memalign, no caching allocator of its own), so glibc's malloc decides what a freed tensor
leaves resident. Requests of M_MMAP_THRESHOLD bytes or more are served by mmap and unmapped when
freed; smaller ones come from malloc's heaps, where freed memory stays resident unless it lies
at a heap's top. The threshold starts at 128 KiB and is dynamic: freeing an mmapped block raises
it to that block's size, up to 32 MiB on 64-bit systems (mallopt(3), M_MMAP_THRESHOLD; glibc
malloc/malloc.c, __libc_free: "See if the dynamic brk/mmap threshold needs adjusting"). FSDP2
frees and allocates every gathered layer's weights again at each layer of each step, so after
the first free the threshold sits at the size of a weight (a 1536-wide attention projection:
9 MiB), the later weights of that size come from the heap, and its freed holes stay resident,
more each step.

So under FSDP2 on the CPU (``torch_engine``) the threshold is pinned (setting M_MMAP_THRESHOLD
turns the dynamic adjustment off, mallopt(3)) at the bytes of the smallest weight FSDP2
gathers that glibc maps at the start (128 KiB or more): each of them is then mapped, and
unmapped when FSDP2 frees it, for good, while smaller tensors (norms, adapters, short
sequences' activations) keep coming from the heap. Pinning lower costs time: at glibc's own
128 KiB every tensor from 128 KiB up is mapped and faulted in afresh (recipe=tiny, one CPU
process, 30 steps: 1.2 million page faults instead of 45,000, 2 s of system time instead of
0.1). A model with no gathered weight of 128 KiB is left alone.

Measured (bench/build_peak.py's model cut to 4 layers, 4 CPU ranks, lora, ZeRO-3; the resident
set above the runtime before the build): tensors allocated at the step's peak 0.58 GiB; peak
resident 0.73-0.85 GiB, different on each rank, and after a step 0.24-0.32 GiB resident with
0.14 GiB of tensors live, growing from step to step. Pinned (at its smallest such weight, the
259 x 1536 fp32 embedding, 1.5 MiB): peak 0.65 GiB on every rank, 0.23 GiB resident after each
of three steps (0.18 once built).

A GPU rank keeps its tensors in the CUDA caching allocator (plan/memory/estimate.py prices its
reserve); only a CPU rank's tensors live in malloc, so only those pin it. Without glibc (musl,
macOS) nothing is set.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Iterable

# glibc's malloc.h: mallopt's parameter number for the mmap threshold.
M_MMAP_THRESHOLD = -3
# mallopt(3): "The initial value of the threshold is 128*1024" (DEFAULT_MMAP_THRESHOLD_MIN).
GLIBC_INITIAL_MMAP_THRESHOLD = 128 * 1024


def gathered_threshold(gathered_bytes: Iterable[int]) -> int | None:
    """The mmap threshold that keeps mapped every gathered weight glibc maps at the start: the
    smallest of `gathered_bytes` (each weight's bytes as FSDP2 gathers it) from glibc's starting
    threshold up; None where none is that large (the module docstring says why)."""
    mapped = [n for n in gathered_bytes if n >= GLIBC_INITIAL_MMAP_THRESHOLD]
    return min(mapped) if mapped else None


def pin_mmap_threshold(threshold: int) -> bool:
    """Pin glibc's mmap threshold at `threshold` bytes, its dynamic adjustment off; True when
    it was set, False without glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
