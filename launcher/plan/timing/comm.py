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
NVLink cannot carry it. How much leaves depends on the dispatcher (backend.moe_dispatcher,
launcher/backends/common.py); with balanced routing each of a token's top_k copies goes to any of
the group's n ranks alike, and a group spanning N = n / k nodes holds k of them per node:
- flex (node-deduplicating: DeepEP, Megatron-Core's flex dispatcher, NeMo AutoModel, torchtitan's
  DeepEP option; what the published fine-grained runs use) sends each token once per remote node
  it is routed to and forwards it over NVLink there (DeepSeek-V3 report, arXiv 2412.19437 section
  3.2.2: IB to the GPU of the same in-node index, then NVLink; DeepEP's internode kernels, whose
  bottleneck is the RDMA bandwidth per GPU). A token reaches (N - 1) x (1 - (1 - 1/N)^top_k)
  remote nodes on average: each of the N - 1 other nodes is missed by all top_k copies with
  probability (1 - 1/N)^top_k.
- alltoall (every copy sent: torch all_to_all_single, which llmtrain's torch engine runs,
  launcher/train/parallel/expert_parallel.py; Megatron-Core's alltoall dispatcher) sends each copy
  whose rank is on another node through the NIC: a copy lands off-node with probability (n - k) / n,
  so a token moves top_k x (n - k) / n over the NIC, two copies for one node crossing twice.
In both the NVLink share is taken as all top_k copies x (n - 1) / n (flex forwards every copy
over NVLink; NCCL's PXN routes alltoall's remote copies through the GPU on the destination's rail,
an upper bound either way); both links run at once (the slower one sets the time). Inside one
node the two are the same all-to-all.
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
    place: GroupPlacement,
    top_k: int,
    intra_gbps: float,
    inter_gbps: float,
    dispatcher: str = "flex",
) -> float:
    """Bus bandwidth (collective_time's, all-to-all kind) of a dispatch or combine of top_k copies
    of each token over the expert-parallel group `place` by `dispatcher` ("flex" or "alltoall",
    module docstring). Inside one node the ring figure of place_group.

    e.g. ep 64 over 8 nodes of 8 H100s (450 GB/s NVLink, 50 GB/s NIC), top_k 8; collective_time
    charges 8 x 63/64 = 7.875 bytes per token-byte, which NVLink moves in 7.875 / 450 = 0.0175 s
    per GB.
    - flex: a token reaches 7 x (1 - (7/8)^8) = 4.59 remote nodes; the NIC moves 4.59 / 50 =
      0.0919 s per GB and sets the time, so the bus bandwidth is 7.875 / 0.0919 = 85.7 GB/s.
    - alltoall: 8 x 56/64 = 7.0 copies leave the node; the NIC moves 7.0 / 50 = 0.14 s per GB,
      so the bus bandwidth is 7.875 / 0.14 = 56.25 GB/s (1.52x the time of flex). top_k cancels:
      NIC-bound it is (n - 1) / (n - k) x the NIC bandwidth for any top_k.
    With top_k 1 there is nothing to deduplicate and both give that 56.25 GB/s (a token reaches
    7 x (1 - 7/8) = 0.875 remote nodes, the 56/64 of alltoall).
    """
    if dispatcher not in ("flex", "alltoall"):
        raise ValueError(f"unknown all-to-all dispatcher {dispatcher!r}")
    n, k = place.size, place.members_per_node
    if not place.spans_nodes or n <= 1 or k >= n:
        return place.bus_gbps
    top_k = max(1, top_k)
    if dispatcher == "flex":
        nodes = n / k
        remote = (nodes - 1.0) * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    else:
        remote = top_k * (n - k) / n
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
