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

The expert-parallel all-to-all is no ring: what leaves a node crosses the sending GPU's own NIC,
NVLink cannot carry it. A group spanning N nodes with k members per node sends each token once per
remote node it is routed to and forwards it over NVLink there (DeepSeek-V3 report, arXiv
2412.19437 section 3.2.2: IB to the GPU of the same in-node index, then NVLink; DeepEP's internode
kernels, whose bottleneck is the RDMA bandwidth per GPU). With balanced routing of top_k copies
over N nodes a token reaches (N - 1) x (1 - (1 - 1/N)^top_k) remote nodes on average; the NVLink
share is the top_k copies x (n - 1) / n; both links run at once (the slower one sets the time).
That is the node-deduplicating dispatch of DeepEP (Megatron-Core's flex dispatcher, NeMo
AutoModel, torchtitan's DeepEP option), which the published fine-grained runs use; a dispatcher
that sends every copy (torch all_to_all_single, Megatron's alltoall dispatcher) moves up to
top_k x (n - k) / n per token over the NIC, which this does not price (a known under-estimate).
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


def expert_alltoall_bus_gbps(
    place: GroupPlacement, top_k: int, intra_gbps: float, inter_gbps: float
) -> float:
    """Bus bandwidth (collective_time's, all-to-all kind) of a dispatch or combine of top_k copies
    of each token over the expert-parallel group `place` (module docstring). Inside one node, or
    with top_k 1, the ring figure of place_group.

    e.g. ep 64 over 8 nodes of 8 H100s (450 GB/s NVLink, 50 GB/s NIC), top_k 8: a token reaches
    7 x (1 - (7/8)^8) = 4.59 remote nodes; per token-byte the NIC moves 4.59 / 50 and NVLink
    8 x 63/64 / 450, so the NIC sets the time, 0.0919 s per GB; collective_time charges
    8 x 63/64 = 7.875 bytes per token-byte, so the bus bandwidth is 7.875 / 0.0919 = 85.7 GB/s.
    """
    n, k = place.size, place.members_per_node
    if not place.spans_nodes or n <= 1 or top_k <= 1 or k >= n:
        return place.bus_gbps
    nodes = n / k
    remote = (nodes - 1.0) * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    charged = top_k * (n - 1) / n
    seconds_per_gb = max(remote / inter_gbps, charged / intra_gbps)
    return charged / seconds_per_gb


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
