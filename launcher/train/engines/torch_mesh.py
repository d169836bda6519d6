"""The torch engine's device meshes, made once from the layout: the main mesh ("pp", "dp", "cp",
"tp"), tp innermost and pp outermost, so global rank = ((pp_rank * dp + dp_rank) * cp + cp_rank)
* tp + tp_rank (the order ``plan`` and ``launcher.validate.rules`` assume); the ranks gradients are
averaged over (dp, or dp x cp flattened to "dp_cp": cp ranks see different tokens); and under
expert parallel a second mesh ("pp", "edp", "ep", "cp", "tp") over the same ranks, the dp dim split
into groups of ep consecutive dp ranks (the other dims, and so each rank's place, unchanged).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from launcher.config.layout import Layout
from launcher.train.engines.base import RankInfo
from launcher.train.engines.torch_parallelize import TorchEngineError


@dataclass(frozen=True)
class TorchMeshes:
    mesh: DeviceMesh  # ("pp", "dp", "cp", "tp")
    dp_mesh: DeviceMesh  # gradients are averaged over it: "dp", or "dp_cp" with context parallel
    ep_mesh: DeviceMesh | None  # ("pp", "edp", "ep", "cp", "tp") under expert parallel
    info: RankInfo


def build_meshes(lay: Layout, device: torch.device) -> TorchMeshes:
    """The meshes of `lay` over the initialised process group, whose size must be
    pp x dp x cp x tp (else a TorchEngineError naming each degree)."""
    world = dist.get_world_size()
    ranks = lay.pp * lay.dp * lay.cp * lay.tp
    if ranks != world:
        raise TorchEngineError(
            f"pp={lay.pp} x dp={lay.dp} x cp={lay.cp} x tp={lay.tp} = {ranks} ranks, "
            f"but the process group has {world}"
        )
    mesh = init_device_mesh(
        device.type, (lay.pp, lay.dp, lay.cp, lay.tp), mesh_dim_names=("pp", "dp", "cp", "tp")
    )
    dp_mesh = mesh["dp"] if lay.cp == 1 else mesh["dp", "cp"]._flatten("dp_cp")
    info = RankInfo(
        rank=dist.get_rank(),
        world_size=world,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        dp_rank=mesh.get_local_rank("dp"),
        dp_size=lay.dp,
        tp_rank=mesh.get_local_rank("tp"),
        pp_rank=mesh.get_local_rank("pp"),
        cp_rank=mesh.get_local_rank("cp"),
    )
    ep_mesh = None
    if lay.ep > 1:
        grid = torch.arange(world).view(lay.pp, lay.dp // lay.ep, lay.ep, lay.cp, lay.tp)
        ep_mesh = DeviceMesh(device.type, grid, mesh_dim_names=("pp", "edp", "ep", "cp", "tp"))
    return TorchMeshes(mesh, dp_mesh, ep_mesh, info)
