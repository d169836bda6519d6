"""The PyTorch-native engine trains on CPU with gloo, in every layout it accepts.

Each case launches N processes in-process with torch elastic (rendezvous on localhost:0), builds a
tiny model, feeds the same deterministic rows to ranks of the same dp index and returns the losses
of every rank. Shapes are tiny (2-4 layers, hidden 64, seq 32) so the file runs in a few minutes on
two cores. Launches are the cost: a layout that is also checked for resume and against one process
does all three in one launch (test_trains_resumes_matches_one_process), its one-process reference
launched once per session per config; layouts only checked to train run one launch each.
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.elastic import run_ranks

pytestmark = pytest.mark.integration

TINY = [
    "recipe=tiny",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.num_attention_heads=4",
    "model.seq_length=32",
    "optim.lr=3e-3",
    "optim.grad_clip=1.0",
]


def _rows(step: int, global_batch: int, seq: int, vocab: int) -> Any:
    """Learnable deterministic rows for one step: arithmetic sequences mod a small alphabet."""
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, 64, (global_batch, 1), generator=g)
    stride = torch.randint(1, 4, (global_batch, 1), generator=g)
    return (start + stride * torch.arange(seq + 1)) % min(64, vocab)


def _train(overrides: list[str], nproc: int, steps: int, opts: dict[str, Any]) -> dict[str, Any]:
    """One rank: build the engine, optionally load, run steps, optionally save; return losses.

    opts: first_step (default 0), save_at (save after that many steps) with save_dir, load_dir.
    """
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.trainer import build_engine

    first_step = opts.get("first_step", 0)
    save_at, save_dir, load_dir = opts.get("save_at"), opts.get("save_dir"), opts.get("load_dir")
    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    os.environ["DS_ACCELERATOR"] = "cpu"
    cfg = compose_config([*overrides, f"cluster.gpus_per_node={nproc}"]).config
    init_process_group_from_env()
    try:
        engine = build_engine(cfg)  # backend=torch unless the overrides say deepspeed
        if load_dir is not None:
            from launcher.train.checkpoint.safe_load import CheckpointFiles

            engine.load(Path(load_dir), CheckpointFiles.unchecked(Path(load_dir)))
        lay = derive_layout(cfg)
        per_dp = lay.grad_accum * lay.micro_batch_size
        losses, norms, files = [], [], []
        for step in range(first_step, first_step + steps):
            rows = _rows(step, lay.global_batch_size, lay.seq_length, cfg.model.vocab_size)
            mine = rows[engine.info.dp_rank * per_dp : (engine.info.dp_rank + 1) * per_dp]
            result = engine.step(mine, lr=cfg.optim.lr)
            losses.append(result.loss)
            norms.append(result.grad_norm)
            if save_at is not None and step + 1 == save_at:
                assert save_dir is not None
                files = [str(p) for p in engine.save(Path(save_dir))]
        info, extra = engine.info, engine.extra_state()
        engine.close()
        return {"losses": losses, "norms": norms, "files": files, "info": info, "extra": extra}
    finally:
        dist.destroy_process_group()


def _train_and_resume(
    overrides: list[str], nproc: int, steps: int, opts: dict[str, Any]
) -> dict[str, Any]:
    """One rank, one launch for three checks: train `steps` steps saving after opts["save_at"],
    then a fresh engine loads that checkpoint and runs the remaining steps again.

    Returns the losses and gradient norms of both runs, the files this rank saved, and the
    engine's extra state (loss scale, mesh, schedule) as saved and as loaded back."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.trainer import build_engine

    save_at, save_dir = opts["save_at"], Path(opts["save_dir"])
    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    os.environ["DS_ACCELERATOR"] = "cpu"
    cfg = compose_config([*overrides, f"cluster.gpus_per_node={nproc}"]).config
    lay = derive_layout(cfg)
    per_dp = lay.grad_accum * lay.micro_batch_size
    init_process_group_from_env()
    saved: dict[str, Any] = {}

    def run(engine: Any, first: int) -> tuple[list[float], list[float]]:
        losses, norms = [], []
        for step in range(first, steps):
            rows = _rows(step, lay.global_batch_size, lay.seq_length, cfg.model.vocab_size)
            mine = rows[engine.info.dp_rank * per_dp : (engine.info.dp_rank + 1) * per_dp]
            result = engine.step(mine, lr=cfg.optim.lr)
            losses.append(result.loss)
            norms.append(result.grad_norm)
            if step + 1 == save_at and first == 0:
                saved["files"] = [str(p) for p in engine.save(save_dir)]
                saved["extra"] = engine.extra_state()
        return losses, norms

    try:
        engine = build_engine(cfg)
        losses, norms = run(engine, 0)
        extra = engine.extra_state()
        engine.close()
        fresh = build_engine(cfg)
        from launcher.train.checkpoint.safe_load import CheckpointFiles

        fresh.load(save_dir, CheckpointFiles.unchecked(save_dir))
        loaded_extra = fresh.extra_state()
        resumed, resumed_norms = run(fresh, save_at)
        fresh.close()
        return {
            "losses": losses,
            "norms": norms,
            "resumed": resumed,
            "resumed_norms": resumed_norms,
            "files": saved["files"],
            "saved_extra": saved["extra"],
            "loaded_extra": loaded_extra,
            "extra": extra,
            "info": engine.info,
        }
    finally:
        dist.destroy_process_group()


def launch(
    nproc: int, overrides: list[str], steps: int, entrypoint: Any = None, **kw: Any
) -> list[dict[str, Any]]:
    return run_ranks(nproc, entrypoint or _train, [*TINY, *overrides], nproc, steps, kw)


def assert_trains(results: list[dict[str, Any]]) -> list[float]:
    losses = results[0]["losses"]
    for r in results[1:]:
        assert r["losses"] == losses, "ranks disagree on the loss"
        assert r["norms"] == results[0]["norms"], "ranks disagree on the gradient norm"
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.3, losses
    return losses


B4 = ["train.micro_batch_size=2", "train.global_batch_size=4"]
UNTIED = "model.tie_embeddings=false"
LLAMA = ["model.norm=rmsnorm", "model.position=rope", "model.activation=swiglu"]
MOE = ["model.num_experts=4", "model.moe_top_k=2", "model.moe_ffn_hidden_size=64"]

# name: (processes, overrides). The tiny recipe ties embeddings, uses LayerNorm, GELU and learned
# positions; pipeline cases untie (refused otherwise), some cases switch to the Llama block.
# Layouts that are also checked against one process and for resume are in ONE_LAUNCH_CASES.
CASES: dict[str, tuple[int, list[str]]] = {
    # FSDP2 ZeRO-2 alone: test_fsdp_reduce_scatters_every_micro_batch[2] here, and through the CLI
    # test_kill_resume.py (dp=2, bitwise resume twice) and test_tiny_dpo.py.
    "fsdp-zero3-offload-bf16-recompute": (
        2,
        ["zero.stage=3", "zero.offload_params=cpu", "precision=bf16", "train.recompute=full", *B4],
    ),
    "pp2xdp2-gpipe-ddp": (
        4,
        ["parallel.pp=2", "parallel.pp_schedule=gpipe", UNTIED, "train.micro_batch_size=2"],
    ),
    "pp2-interleaved-vpp2": (
        2,
        [
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.pp_schedule=interleaved",
            "model.num_layers=4",
            UNTIED,
            *B4,
        ],
    ),
    "dp2xtp2-fsdp-llama": (4, ["parallel.tp=2", "zero.stage=3", *LLAMA, *B4]),
    "dp2xtp2-ddp-selective": (
        4,
        ["parallel.tp=2", "zero.stage=0", "train.recompute=selective", *B4],
    ),
    "pp2xtp2-sp": (
        4,
        ["parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true", UNTIED, *B4],
    ),
    # Gradients averaged over dp x cp; optimizer states sharded over the 4 ranks; fp16 scaler;
    # the ring attention inside op-level selective checkpointing (dense blocks).
    "dp2xcp2-zero1-fp16-selective": (
        4,
        ["parallel.cp=2", "zero.stage=1", "precision=fp16", "train.recompute=selective", *B4],
    ),
    # fp16 parameters under FSDP2 (shard-aware scaler), and with DTensor tensor parallel.
    "fp16-fsdp-zero2": (2, ["precision=fp16", "zero.stage=2", *B4]),
    "fp16-dp2xtp2-zero3": (4, ["precision=fp16", "zero.stage=3", "parallel.tp=2", *B4]),
    # Two experts per rank, tokens by all-to-all; with 4 ranks each expert has an edp peer;
    # selective recompute of MoE blocks: the attention core and the shared expert's activation.
    "moe-dp4-ep2-shared-selective": (
        4,
        [
            "parallel.ep=2",
            *MOE,
            "model.moe_shared_experts=1",
            "train.micro_batch_size=1",
            "train.recompute=selective",
            *LLAMA,
        ],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_layout_trains(name: str) -> None:
    nproc, overrides = CASES[name]
    results = launch(nproc, overrides, steps=8)
    losses = assert_trains(results)
    # Under tp the logits stay split over the vocabulary (torch's loss_parallel), never gathered.
    if any(o.startswith("parallel.tp=") for o in overrides):
        assert results[0]["extra"]["loss"] == "vocab-parallel", results[0]["extra"]
    print(f"{name}: first {losses[0]:.4f} last {losses[-1]:.4f}")


def _overflow(overrides: list[str], nproc: int, steps: int, opts: dict[str, Any]) -> dict[str, Any]:
    """One rank: a loss scale so large that the fp16 gradients overflow, one step, save, reload."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.engines.torch_engine import TorchEngine

    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    cfg = compose_config([*overrides, f"cluster.gpus_per_node={nproc}"]).config
    init_process_group_from_env()
    try:
        engine = TorchEngine(cfg, seed=cfg.train.seed)
        assert engine.scaler is not None
        state = engine.scaler.state_dict()
        engine.scaler.load_state_dict({**state, "scale": 2.0**60})
        lay = derive_layout(cfg)
        per_dp = lay.grad_accum * lay.micro_batch_size
        rows = _rows(0, lay.global_batch_size, lay.seq_length, cfg.model.vocab_size)
        mine = rows[engine.info.dp_rank * per_dp : (engine.info.dp_rank + 1) * per_dp]
        before = engine.weights_digest()
        result = engine.step(mine, lr=cfg.optim.lr)
        after = engine.weights_digest()
        engine.save(Path(opts["save_dir"]))
        fresh = TorchEngine(cfg, seed=cfg.train.seed)
        from launcher.train.checkpoint.safe_load import CheckpointFiles

        fresh.load(Path(opts["save_dir"]), CheckpointFiles.unchecked(Path(opts["save_dir"])))
        return {
            "skipped": before == after,
            "grad_norm": result.grad_norm,
            "scale": engine.extra_state()["loss_scale"],
            "reloaded_scale": fresh.extra_state()["loss_scale"],
        }
    finally:
        dist.destroy_process_group()


def test_fp16_overflow_skips_the_step_on_every_rank(tmp_path: Path) -> None:
    """Dynamic loss scaling: an inf gradient skips the step everywhere and halves the scale, and
    the scale is restored from the checkpoint."""
    results = launch(
        2, ["precision=fp16", "zero.stage=1", *B4], 1, _overflow, save_dir=str(tmp_path)
    )
    for r in results:
        assert r["skipped"] and not math.isfinite(r["grad_norm"]), r
        assert r["scale"] == 2.0**59 and r["reloaded_scale"] == 2.0**59, r


def _fsdp_reductions(
    overrides: list[str], nproc: int, steps: int, opts: dict[str, Any]
) -> dict[str, int]:
    """One rank, one step under the profiler: how many times FSDP2's parameter groups ran a
    backward, and how many of those backwards reduce-scattered their gradients."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.engines.torch_engine import TorchEngine

    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    cfg = compose_config([*overrides, f"cluster.gpus_per_node={nproc}"]).config
    init_process_group_from_env()
    try:
        engine = TorchEngine(cfg, seed=cfg.train.seed)
        lay = derive_layout(cfg)
        per_dp = lay.grad_accum * lay.micro_batch_size
        rows = _rows(0, lay.global_batch_size, lay.seq_length, cfg.model.vocab_size)
        mine = rows[engine.info.dp_rank * per_dp : (engine.info.dp_rank + 1) * per_dp]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            engine.step(mine, lr=cfg.optim.lr)
        names = [e.name for e in prof.events()]
        engine.close()
        return {
            "accum": lay.grad_accum,
            "backwards": sum(n.startswith("FSDP::post_backward_accumulate") for n in names),
            "reduces": sum(n.startswith("FSDP::post_backward_reduce") for n in names),
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("stage", [2, 3])
def test_fsdp_reduce_scatters_every_micro_batch(stage: int) -> None:
    """ZeRO-2/3 keep gradients sharded through accumulation, as plan counts them: with 2
    micro-batches per rank, every backward of every FSDP group reduce-scatters (turning the sync
    off for the first micro-batch would halve the reductions and hold unsharded fp32 gradients)."""
    for r in launch(2, [f"zero.stage={stage}", *B8], 1, _fsdp_reductions):
        assert r["accum"] == 2, r
        assert r["backwards"] > 0 and r["reduces"] == r["backwards"], r


MLA = ["model.kv_lora_rank=16", "model.qk_rope_head_dim=8", "model.v_head_dim=16"]
B8 = ["train.micro_batch_size=2", "train.global_batch_size=8"]  # 2 micro-batches per rank at dp=2
# name: (processes, parallel overrides, shared overrides, tolerance). The shared overrides (model,
# precision, batch) are also those of the one-process reference. The tolerance bounds both
# |loss - single process| and the relative gradient-norm difference. Derivation: the parallel run
# sums the same fp32 terms in another order (dp and tp all-reduces, all-to-all, ring merges,
# pipeline micro-batch means), each sum off by a few ulps (eps 1.2e-7) of values ~1-5, so ~1e-6 per
# step; Adam's update has size ~lr whatever the gradient's scale, so five steps keep it near that
# (measured at most 9.5e-7 on the loss, 6e-6 on the norm). 1e-4 leaves room for other CPUs'
# kernels, while a missing or doubled gradient reduction, a wrong head or expert shard, or a token
# routed to another expert on one tp rank moves the loss or the norm by 1e-3 or more (the doubled
# cp reduction: norms x2). Plain dp and ZeRO-1 only reorder one all-reduce: 1e-5. fp16 rounds
# each activation to 11 bits (eps 9.8e-4), so a reordered sum can flip a rounding: 2e-3.
ONE_LAUNCH_CASES: dict[str, tuple[int, list[str], list[str], float]] = {
    # The loss and gradient averaging over dp (the global-batch mean), with grad accumulation.
    "ddp": (2, ["zero.stage=0"], B8, 1e-5),
    # Sharded optimizer states: each rank updates its share, then broadcasts it.
    "zero1": (2, ["zero.stage=1"], B8, 1e-5),
    # fp16 activations and the dynamic loss scaler (its state saved and loaded back).
    "fp16": (2, ["zero.stage=0"], ["precision=fp16", *B4], 2e-3),
    # Sharded heads (one kv head: each rank keeps a replica), sequence-parallel norms, the tied
    # head run on DTensors.
    "tp2-sp-kv1": (
        2,
        ["parallel.tp=2", "parallel.sequence_parallel=true"],
        ["model.num_kv_heads=1", *B4],
        1e-4,
    ),
    # Stages built from one seed equal the unsplit model; the pipeline's loss is the mean.
    "pp2-1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"], [UNTIED, *B4], 1e-4),
    # An uneven split with Megatron-Core's key: 1 layer on the first stage, 4 - 1 = 3 on the last.
    "pp2-1f1b-first1": (
        2,
        ["parallel.pp=2", "parallel.num_layers_in_first_pipeline_stage=1"],
        [UNTIED, *B4],
        1e-4,
    ),
    # The same pipeline with each stage under FSDP2.
    "pp2-1f1b-zero3": (2, ["parallel.pp=2", "zero.stage=3"], [UNTIED, *B4], 1e-4),
    # Ring attention over load-balanced chunks, learned positions at the rank's tokens, GQA.
    "cp2-gqa": (2, ["parallel.cp=2"], ["model.num_kv_heads=2", *B4], 1e-4),
    # Experts split over ep, dispatched by all-to-all, gradients reduced per expert.
    "moe-ep2": (2, ["parallel.ep=2"], [*MOE, *B4], 1e-4),
    # DeepSeek-style: a dense first layer, then MoE with a shared expert; MLA with a q bottleneck;
    # sequence parallel gathers the sequence before the router and the heads.
    "moe-mla-tp2-sp": (
        2,
        ["parallel.tp=2", "parallel.sequence_parallel=true"],
        [
            *LLAMA,
            *MOE,
            *MLA,
            "model.q_lora_rank=32",
            "model.moe_shared_experts=1",
            "model.moe_dense_layers=1",
            UNTIED,
            *B4,
        ],
        1e-4,
    ),
    # Expert groups of 2 dp ranks (tp peers exchange identical tokens), experts tensor-parallel
    # inside each; MLA without the q bottleneck.
    "moe-ep2xtp2-mla": (4, ["parallel.tp=2", "parallel.ep=2"], [*LLAMA, *MOE, *MLA, *B4], 1e-4),
    # Ring attention over the local heads, the cp-local sequence sharded again by sequence
    # parallel; gradients averaged over cp by the engine (tp parameters are DTensors).
    "cp2xtp2-sp-gqa": (
        4,
        ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
        [*LLAMA, "model.num_kv_heads=2", *B4],
        1e-4,
    ),
}


def _zero1_shards(results: list[dict[str, Any]]) -> None:
    """ZeRO-1: every rank writes its own optimizer shard next to the DCP files."""
    for rank, r in enumerate(results):
        assert r["saved_extra"]["data_parallel"] == "ddp+zero1", r["saved_extra"]
        assert f"zero1_optim_rank{rank}.pt" in {Path(f).name for f in r["files"]}, r["files"]


def _fp16_scaler(results: list[dict[str, Any]]) -> None:
    """The loss scaler: rank 0 saves its state, and the fresh engine loads the scale back."""
    assert "loss_scaler.json" in {Path(f).name for f in results[0]["files"]}, results[0]["files"]
    for r in results:
        scale = r["saved_extra"]["loss_scale"]
        assert scale is not None and math.isfinite(scale) and scale > 0, r["saved_extra"]
        assert r["loaded_extra"]["loss_scale"] == scale


def _pipeline(schedule: str, data_parallel: str) -> Any:
    def check(results: list[dict[str, Any]]) -> None:
        """Two stages, one per rank, under the named schedule and data-parallel wrapper."""
        for r in results:
            assert r["extra"]["mesh"]["pp"] == 2 and r["extra"]["pp_schedule"] == schedule
            assert r["extra"]["data_parallel"] == data_parallel, r["extra"]
        assert {r["info"].pp_rank for r in results} == {0, 1}

    return check


# Checks only some cases have, on top of those every case gets.
EXTRA_CHECKS: dict[str, Any] = {
    "zero1": _zero1_shards,
    "fp16": _fp16_scaler,
    "pp2-1f1b": _pipeline("1f1b", "none"),
    "pp2-1f1b-zero3": _pipeline("1f1b", "fsdp2"),
}


def _same(a: list[float], b: list[float]) -> bool:
    """Bitwise equal lists (NaN equal to NaN: an fp16 step may overflow)."""
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
    )


@pytest.fixture(scope="session")
def one_process() -> Any:
    """The one-process reference run, launched once per session for each shared config."""
    cache: dict[tuple[tuple[str, ...], int], dict[str, Any]] = {}

    def reference(shared: list[str], steps: int) -> dict[str, Any]:
        key = (tuple(shared), steps)
        if key not in cache:
            cache[key] = launch(1, shared, steps)[0]
        return copy.deepcopy(cache[key])

    return reference


@pytest.mark.parametrize("name", list(ONE_LAUNCH_CASES))
def test_trains_resumes_matches_one_process(tmp_path: Path, name: str, one_process: Any) -> None:
    """In one launch the loss falls and a fresh engine resumes bitwise (loss and gradient norm)
    from the mid-run checkpoint, with the engine state it saved; a one-process launch (shared
    between cases with the same shared overrides) gives the loss and gradient norm to match."""
    nproc, layout, shared, tolerance = ONE_LAUNCH_CASES[name]
    steps, save_at = 5, 3
    results = launch(
        nproc,
        [*layout, *shared],
        steps,
        _train_and_resume,
        save_at=save_at,
        save_dir=str(tmp_path / "ckpt"),
    )
    losses = assert_trains(results)
    for r in results:
        assert r["resumed"] == r["losses"][save_at:], (r["losses"], r["resumed"])
        assert _same(r["resumed_norms"], r["norms"][save_at:]), (r["norms"], r["resumed_norms"])
        assert r["loaded_extra"] == r["saved_extra"], (r["saved_extra"], r["loaded_extra"])
        assert r["files"] and all(Path(f).is_file() for f in r["files"]), r["files"]
    assert ".metadata" in {Path(f).name for f in results[0]["files"]}, results[0]["files"]
    EXTRA_CHECKS.get(name, lambda _: None)(results)
    one = one_process(shared, steps)
    single, single_norms = one["losses"], one["norms"]
    diff = max(abs(x - y) for x, y in zip(losses, single, strict=True))
    # The gradient norm too (relative): Adam and clipping hide a gradient scaled by a constant
    # factor from the loss, not from the norm.
    norm_diff = max(abs(x - y) / y for x, y in zip(results[0]["norms"], single_norms, strict=True))
    print(
        f"{name}: first {losses[0]:.4f} last {losses[-1]:.4f}; max |loss - single| {diff:.2e}, "
        f"max relative |grad norm - single| {norm_diff:.2e}"
    )
    assert single[-1] < single[0] - 0.3, single
    assert diff < tolerance, (losses, single)
    assert norm_diff < tolerance, (results[0]["norms"], single_norms)
