"""optim.in_backward checkpoints resume bit for bit: DCP saves the per-parameter optimizers of
``InBackwardOptimizer`` as a list (launcher/train/optim_in_backward.py); N steps straight and N/2,
save, a fresh engine loads, N/2 more end with the same weights and the same optimizer state,
every tensor ``torch.equal``. One rank launched once (tests/elastic.py) for fp32, bf16 and
8-bit states, and with optim.offload=cpu (states on the host between updates); one layer, 4
steps each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.elastic import run_ranks
from tests.integration.test_torch_engine import TINY, _rows

pytestmark = pytest.mark.integration

STEPS, SAVE_AT = 4, 2
IN_BACKWARD = [
    "model.num_layers=1",
    "optim.in_backward=true",
    "optim.grad_clip=0",
    "optim.warmup_steps=1",
    "train.micro_batch_size=2",
    "train.global_batch_size=2",
    "cluster.gpus_per_node=1",
]


class _Copies(list[Any]):
    """The plain tensors one state entry holds, copied."""


def _flat(state: dict[str, Any]) -> dict[str, Any]:
    """{"model": ..., "optim": ...} as one flat dict of values; each tensor as a _Copies of
    of its plain tensors (torchao's 8-bit state: its codes, block scales and code map)."""
    out: dict[str, Any] = {}
    for part, entries in state.items():
        for key, value in entries.items():
            if hasattr(value, "__tensor_flatten__"):
                names, _ = value.__tensor_flatten__()
                value = _Copies(getattr(value, name).detach().clone() for name in names)
            elif hasattr(value, "detach"):
                value = _Copies([value.detach().clone()])
            out[f"{part}/{key}"] = value
    return out


def _equal(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, _Copies) and isinstance(b, _Copies):
        return len(a) == len(b) and all(
            x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True)
        )
    return bool(a == b)


def _straight_and_resumed(cases: dict[str, list[str]], save_root: str) -> dict[str, Any]:
    """One rank, every case in turn: STEPS steps saving after SAVE_AT, then a fresh engine loads
    that checkpoint and runs the rest; the losses and which state entries differ come back."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.train.checkpoint.safe_load import CheckpointFiles
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.engines.torch_state import engine_state
    from launcher.train.optim_in_backward import InBackwardOptimizer
    from launcher.train.optim_offload import StepInTurn
    from launcher.train.trainer import build_engine

    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    init_process_group_from_env()

    def run(engine: Any, cfg: Any, first: int, save_dir: Path) -> tuple[list[float], Any]:
        losses = []
        for step in range(first, STEPS):
            rows = _rows(step, 2, cfg.model.seq_length, cfg.model.vocab_size)
            losses.append(engine.step(rows, lr=cfg.optim.lr).loss)
            if step + 1 == SAVE_AT and first == 0:
                engine.save(save_dir)
        return losses, _flat(engine_state(engine.parts, engine.optimizer, False))

    results: dict[str, Any] = {}
    try:
        for name, overrides in cases.items():
            cfg, save_dir = compose_config(overrides).config, Path(save_root) / name
            engine = build_engine(cfg)
            assert isinstance(engine.optimizer, (InBackwardOptimizer, StepInTurn))
            losses, straight = run(engine, cfg, 0, save_dir)
            engine.close()
            fresh = build_engine(cfg)
            fresh.load(save_dir, CheckpointFiles.unchecked(save_dir))
            resumed_losses, resumed = run(fresh, cfg, SAVE_AT, save_dir)
            fresh.close()
            results[name] = {
                "losses": losses,
                "resumed": resumed_losses,
                "differ": sorted(
                    key
                    for key in straight.keys() | resumed.keys()
                    if key not in straight
                    or key not in resumed
                    or not _equal(straight[key], resumed[key])
                ),
                "optim_state_keys": sum(key.startswith("optim/state.") for key in straight),
                "params": sum(key.startswith("model/") for key in straight),
            }
        return results
    finally:
        dist.destroy_process_group()


# fp32 states; bf16 states (they came back fp32 from load_state_dict before); 8-bit states.
# One launch for the three (a launch costs more than the 4 steps of each).
# optim.offload=cpu: the states on the host between updates (launcher/train/optim_offload.py),
# in the backward and, without it, stepped in turn after it.
CASES = {
    "fp32": ["optim.state_dtype=fp32"],
    "bf16": ["optim.state_dtype=bf16"],
    "8bit": ["optim.name=adamw8bit"],
    "bf16-offload": ["optim.state_dtype=bf16", "optim.offload=cpu"],
    "8bit-offload": ["optim.name=adamw8bit", "optim.offload=cpu"],
}
# The same without optim.in_backward: one optimizer a parameter, stepped in turn after it.
AFTER_BACKWARD = {"8bit-offload-after": ["optim.name=adamw8bit", "optim.offload=cpu"]}


def test_in_backward_resume_is_bit_identical(tmp_path: Path) -> None:
    cases = {name: [*TINY, *IN_BACKWARD, *extra] for name, extra in CASES.items()}
    after = [o for o in IN_BACKWARD if o != "optim.in_backward=true"]
    cases |= {name: [*TINY, *after, *extra] for name, extra in AFTER_BACKWARD.items()}
    (results,) = run_ranks(1, _straight_and_resumed, cases, str(tmp_path))
    for name, result in results.items():
        assert result["resumed"] == result["losses"][SAVE_AT:], (name, result)
        assert result["losses"][-1] < result["losses"][0], (name, result)
        # exp_avg, exp_avg_sq and step of every parameter: each per-parameter optimizer's state
        assert result["optim_state_keys"] == 3 * result["params"], (name, result)
        assert result["differ"] == [], (name, result["differ"])
