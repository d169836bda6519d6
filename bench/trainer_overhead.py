"""Trainer overhead: tokens/s of `llmtrain run` against a bare hand-written PyTorch loop.

    python bench/trainer_overhead.py [--steps 60] [--rounds 3]

Same model (the tiny recipe's), same data (the built-in corpus, same sampler order), same batch,
same process count (1), same thread count, fp32 AdamW. The bare loop is what a user would write:
fetch the batch, forward, loss, backward, clip, step. Both rates are wall-clock over whole loop
iterations after the first 5 (data, logging, metrics and the trainer's per-step bookkeeping
included): llmtrain's from the `time` stamps in metrics.jsonl. Target ratio >= 0.95. Rounds
alternate the two so they share the machine's noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 5


def llmtrain_rate(steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "launcher", "run", f"train.steps={steps}"],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        (run_dir,) = (Path(tmp) / "runs").iterdir()
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        first, last = records[WARMUP - 1], records[-1]
        return (last["tokens"] - first["tokens"]) / (last["time"] - first["time"])


BARE = r"""
import os, sys, time, torch
from launcher.cache_dir import cache_root
from launcher.config.composition.compose import compose_config
from launcher.train.data import TokenShards, builtin_corpus_dir
from launcher.train.model.transformer import build_model, loss_fn
from launcher.train.sampler import ShardedSampler
steps, warmup = int(sys.argv[1]), int(sys.argv[2])
cfg = compose_config([]).config
torch.manual_seed(cfg.train.seed)
model = build_model(cfg.model, seed=cfg.train.seed)
opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas))
shards = TokenShards(builtin_corpus_dir(cache_root()))
seq, batch = cfg.model.seq_length, cfg.train.micro_batch_size
sampler = ShardedSampler(shards.num_sequences(seq), 0, 1, batch, cfg.train.seed)
stamps = []
for step in range(steps):
    rows = torch.from_numpy(shards.batch(sampler.next_batch_indices(), seq))
    loss = loss_fn(model(rows[:, :-1]), rows[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    float(loss)
    stamps.append(time.perf_counter())
print((steps - warmup) * batch * seq / (stamps[-1] - stamps[warmup - 1]))
"""


def bare_rate(steps: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    done = subprocess.run(
        [sys.executable, "-c", BARE, str(steps), str(WARMUP)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ours, bare = [], []
    for i in range(args.rounds):
        started = time.perf_counter()
        ours.append(llmtrain_rate(args.steps))
        bare.append(bare_rate(args.steps))
        print(
            f"round {i + 1}: llmtrain {ours[-1]:,.0f} tok/s, bare loop {bare[-1]:,.0f} tok/s "
            f"({time.perf_counter() - started:.0f} s)"
        )
    ratio = statistics.median(ours) / statistics.median(bare)
    print(
        f"median tokens/s: llmtrain run {statistics.median(ours):,.0f}, bare PyTorch loop "
        f"{statistics.median(bare):,.0f}; ratio {ratio:.3f} (target >= 0.95)"
    )


if __name__ == "__main__":
    main()
