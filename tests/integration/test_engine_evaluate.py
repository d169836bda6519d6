"""``Engine.evaluate``: the validation loss of every engine and layout, on CPU with gloo.

Uses the torch engine tests' harness (in-process torch elastic launch on localhost:0, the tiny
model, deterministic rows). Each case evaluates fixed rows before training and after two steps,
twice each, with dropout configured: the two evaluations must agree bit for bit (eval mode, no
dropout, no RNG drawn), every rank must report the same value, training must not notice (the
gradients stay empty, the model is back in train mode), and the value must match one process
without parallelism (the same weights, seeded alike).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from tests.integration.test_torch_engine import B4, MOE, UNTIED, _rows, launch

pytestmark = pytest.mark.integration

DROPOUT = ["model.hidden_dropout=0.1", "model.attention_dropout=0.1"]


def _evaluate(overrides: list[str], nproc: int, steps: int, opts: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.trainer import build_engine

    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    os.environ["DS_ACCELERATOR"] = "cpu"
    cfg = compose_config([*overrides, f"cluster.gpus_per_node={nproc}"]).config
    init_process_group_from_env()
    try:
        engine = build_engine(cfg)
        lay = derive_layout(cfg)
        per_dp = lay.grad_accum * lay.micro_batch_size
        r = engine.info.dp_rank

        def mine(step: int) -> Any:
            rows = _rows(step, lay.global_batch_size, lay.seq_length, cfg.model.vocab_size)
            return rows[r * per_dp : (r + 1) * per_dp]

        held_out = mine(10_000)
        before = [engine.evaluate(held_out), engine.evaluate(held_out)]
        for step in range(steps):
            engine.step(mine(step), lr=cfg.optim.lr)
        after = [engine.evaluate(held_out), engine.evaluate(held_out)]
        modules = [m for m in engine.__dict__.values() if isinstance(m, torch.nn.Module)]
        modules += list(getattr(engine, "parts", []))
        training = all(m.training for m in modules)
        grads = [
            p.grad for m in modules for p in m.parameters() if getattr(p, "grad", None) is not None
        ]
        engine.close()
        return {"before": before, "after": after, "training": training, "grads": len(grads)}
    finally:
        dist.destroy_process_group()


CASES: dict[str, tuple[int, list[str], list[str]]] = {
    # name: (processes, layout, model overrides also given to the single-process reference)
    "ddp": (2, ["zero.stage=0"], []),
    "fsdp-zero3": (2, ["zero.stage=3"], []),
    "tp2-sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"], []),
    "pp2-1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"], [UNTIED]),
    "cp2": (2, ["parallel.cp=2"], []),
    "moe-ep2": (2, ["parallel.ep=2"], MOE),
    "deepspeed-zero2": (2, ["backend=deepspeed", "zero.stage=2"], []),
    "deepspeed-pipeline-pp2": (2, ["backend=deepspeed", "parallel.pp=2", "zero.stage=0"], [UNTIED]),
}


@pytest.fixture(scope="module")
def one_process() -> Any:
    """The one-process reference, launched once per module for each (backend, model): the cases
    that share one (4 torch layouts of the plain model) compare with the same launch."""
    cache: dict[tuple[str, ...], dict[str, Any]] = {}

    def reference(overrides: list[str]) -> dict[str, Any]:
        key = tuple(overrides)
        if key not in cache:
            cache[key] = launch(1, overrides, 2, entrypoint=_evaluate)[0]
        return copy.deepcopy(cache[key])

    return reference


@pytest.mark.parametrize("name", list(CASES))
def test_evaluate_is_fixed_agreed_and_matches_one_process(name: str, one_process: Any) -> None:
    nproc, layout, model = CASES[name]
    backend = [o for o in layout if o.startswith("backend=")]
    parallel = launch(nproc, [*layout, *model, *DROPOUT, *B4], 2, entrypoint=_evaluate)
    single = one_process([*backend, *model, *DROPOUT, *B4])
    for rank in parallel:
        assert rank["before"] == parallel[0]["before"] and rank["after"] == parallel[0]["after"]
        assert rank["before"][0] == rank["before"][1] and rank["after"][0] == rank["after"][1]
        assert rank["training"] and rank["grads"] == 0
    got, want = parallel[0], single
    print(f"{name}: eval {got['before'][0]:.6f} -> {got['after'][0]:.6f}, single "
          f"{want['before'][0]:.6f} -> {want['after'][0]:.6f}")  # fmt: skip
    assert abs(got["before"][0] - want["before"][0]) < 1e-4
    # After two steps with dropout drawn differently per layout, the weights differ a little.
    assert abs(got["after"][0] - want["after"][0]) < 5e-2
    assert got["after"][0] < got["before"][0]
