"""Collective timing for `llmtrain calibrate`: the engine's collectives between 2 local processes.

Two fresh Python processes rendezvous through a FileStore in a private temporary directory (no
port) and time each (kind, bytes) asked for with the backend the engine uses on the device (gloo
on the CPU, NCCL on GPUs): one warm-up call, then the median of the repeats that fit in REPEAT_S
= 0.3 s (5 to 25: a median of a few is at the mercy of a busy machine's scheduler), each started
after a barrier; the slowest rank's median is the collective's time. A kind the backend cannot
run is returned with its error instead of a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

WORKER = r"""
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
REPEAT_S = 0.3
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
        t = time.perf_counter(); fn(); sync()
        # As many repeats as fit in REPEAT_S (from the warm-up call), 5 to 25; the same count on
        # every rank (the slowest rank's), or the calls would not pair up.
        first = torch.tensor([time.perf_counter() - t], dtype=torch.float64, device=device)
        dist.all_reduce(first, op=dist.ReduceOp.MAX)
        repeats = int(min(25, max(5, REPEAT_S / max(float(first), 1e-6))))
        dist.barrier()
        times = []
        for _ in range(repeats):
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
                    WORKER,
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


__all__ = ["measure_collectives"]
