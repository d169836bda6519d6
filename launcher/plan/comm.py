"""Collective costs and the bandwidth a process group gets from where its ranks sit.

Cost model (bandwidth term only; per-call latency is ignored, which is fine for the megabyte-sized
messages of training): ring all-reduce moves 2(n-1)/n of the message per GPU (the "bus factor" of
nccl-tests), reduce-scatter and all-gather (n-1)/n, all-to-all (n-1)/n, point-to-point the message.
Time = bytes moved per GPU / bus bandwidth per GPU.

Rank placement (Megatron-LM order, innermost first): tp, cp, dp (ep carved out of dp), pp. A group's
stride is the product of the degrees inside it: tp 1, cp tp, dp tp*cp, pp tp*cp*dp. A group lies in
one node when stride * size <= gpus_per_node; then it uses the intra-node (NVLink) bandwidth. A
group
that spans nodes with k members per node runs k rail-aligned rings (NCCL), one per member's NIC, so
its bus bandwidth is min(intra, k * inter) where inter is the per-GPU network bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass


def bus_factor(kind: str, n: int) -> float:
    """Bytes each GPU moves per byte of message (nccl-tests' bus bandwidth factor)."""
    if kind == "all-reduce":
        return 2.0 * (n - 1) / n
    if kind in ("reduce-scatter", "all-gather", "all-to-all"):
        return (n - 1) / n
    if kind == "p2p":
        return 1.0
    raise ValueError(f"unknown collective {kind!r}")


def collective_time(kind: str, message_bytes: float, group_size: int, bus_gbps: float) -> float:
    """Seconds for one collective of `message_bytes` (the full buffer) over `group_size` ranks."""
    if group_size <= 1 and kind != "p2p":
        return 0.0
    return bus_factor(kind, group_size) * message_bytes / (bus_gbps * 1e9)


@dataclass(frozen=True)
class GroupPlacement:
    size: int
    stride: int
    spans_nodes: bool
    members_per_node: int
    bus_gbps: float


def place_group(
    size: int, stride: int, gpus_per_node: int, intra_gbps: float, inter_gbps: float
) -> GroupPlacement:
    """Bandwidth of a group of `size` ranks spaced `stride` apart (see the module docstring)."""
    gpn = max(1, gpus_per_node)
    if size <= 1:
        return GroupPlacement(size, stride, False, 1, intra_gbps)
    if stride * size <= gpn:
        return GroupPlacement(size, stride, False, size, intra_gbps)
    per_node = max(1, min(size, gpn // stride)) if stride < gpn else 1
    return GroupPlacement(size, stride, True, per_node, min(intra_gbps, per_node * inter_gbps))


@dataclass(frozen=True)
class Collective:
    """One row of the per-collective table: totals per optimizer step on the heaviest stage."""

    name: str
    kind: str
    group: str
    group_size: int
    message_bytes: float
    calls_per_step: int
    bus_gbps: float
    time_s: float
    exposed_s: float
    note: str

    @property
    def hidden(self) -> bool:
        return self.exposed_s <= 1e-12
