"""The precomputed reference of dpo (finetune.reference=precomputed, the way finetune=full runs
dpo): one pass over the training pairs before step 1, with the model as built (the base of
train.init_from, before any update), stores each pair's summed response log-probabilities
(chosen, rejected) in the run directory, ``reference_logps.json``, with what they were made from:
the sha256 of the weights (``Engine.weights_digest``), train.init_from, the data and the row
settings. TRL's ``precompute_ref_log_probs`` does the same into its dataset.

- A fresh start reuses the file when the weights' digest and the data agree (a rerun with
  ``--fresh``), else computes it again (a changed base is never used with old log-probs).
- A resume (its checkpoints hold updated weights, not the base) reads the file and refuses one
  made for another train.init_from or other data (the key named, exit 2).

Each data-parallel rank computes its share of the pairs (all ranks the same number of forwards,
the last ones wrapping around), and every rank receives the whole table; rank 0 writes it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from launcher import fsio
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan.preference import reference_mode

REFERENCE_FILE = "reference_logps.json"
BLOCK_PAIRS = 256  # pairs a rank sends through the model per call (bounds the host memory)


class ReferenceTable:
    """The reference's summed log-probs of every training pair, [pairs, 2] (chosen, rejected)."""

    def __init__(self, values: np.ndarray):
        self.values = np.asarray(values, dtype=np.float64)

    def lookup(self, indices: Sequence[int] | np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.values[np.asarray(indices, dtype=np.int64)])


def identity(cfg: LLMTrainConfig, pairs: int) -> dict[str, Any]:
    """What the table's rows depend on besides the weights."""
    d = cfg.data
    return {
        "data": d.path if d.path is not None else f"data.builtin={d.builtin}",
        "pairs": pairs,
        "seq_length": cfg.model.seq_length,
        "overlong": d.overlong,
    }


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and isinstance(saved.get("logps"), list) else None


def resume_problem(
    saved: dict[str, Any] | None, cfg: LLMTrainConfig, pairs: int, path: Path
) -> str | None:
    """Why a resumed run cannot use the stored reference (None: it can)."""
    if saved is None:
        return (
            f"{path}: missing or unreadable; this dpo run's checkpoints were trained against it. "
            "Start over with `llmtrain run --fresh`"
        )
    if saved.get("init_from") != cfg.train.init_from:
        return (
            f"train.init_from={cfg.train.init_from}: the run's reference log-probabilities "
            f"({path}) were computed from train.init_from={saved.get('init_from')}; set it back, "
            "or start over with `llmtrain run --fresh`"
        )
    if saved.get("identity") != identity(cfg, pairs):
        return (
            f"data: the run's reference log-probabilities ({path}) were computed for "
            f"{saved.get('identity')}, this configuration reads {identity(cfg, pairs)}; set "
            "data.* and model.seq_length back, or start over with `llmtrain run --fresh`"
        )
    return None


def _compute(engine: Any, data: Any, seq: int, pairs: int) -> np.ndarray:
    """Every pair's log-probs, each dp rank its share, gathered on every rank."""
    info = engine.info
    count = math.ceil(pairs / info.dp_size)
    mine = [(info.dp_rank + k * info.dp_size) % pairs for k in range(count)]
    parts = []
    for start in range(0, len(mine), BLOCK_PAIRS):
        block = mine[start : start + BLOCK_PAIRS]
        rows = torch.from_numpy(data.batch(block, seq))
        parts.append(engine.reference_logps(rows).numpy())
    values = np.concatenate(parts) if parts else np.zeros((0, 2))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, values.tolist()))
    table = np.full((pairs, 2), np.nan)
    for indices, logps in everyone:
        table[np.asarray(indices, dtype=np.int64)] = np.asarray(logps, dtype=np.float64)
    return table


def reference_table(
    cfg: LLMTrainConfig,
    run_root: Path,
    engine: Any,
    data: Any,
    resuming: bool,
    log: Callable[[str], None],
) -> ReferenceTable | None:
    """The table a dpo run with a precomputed reference steps with (module docstring); None
    for any other run. A collective on a fresh start."""
    if reference_mode(cfg) != "precomputed":
        return None
    seq = cfg.model.seq_length
    pairs = int(data.num_sequences(seq))
    path = Path(run_root) / REFERENCE_FILE
    saved = _read(path)
    if resuming:
        problem = resume_problem(saved, cfg, pairs, path)
        if problem is not None:
            raise UserError(problem)
        assert saved is not None
        return ReferenceTable(np.asarray(saved["logps"]))
    digest = engine.weights_digest()
    if (
        saved is not None
        and saved.get("weights_sha256") == digest
        and saved.get("identity") == identity(cfg, pairs)
    ):
        log(f"reference: the log-probabilities of {pairs:,} pairs from {path} (same weights)")
        return ReferenceTable(np.asarray(saved["logps"]))
    began = time.perf_counter()
    table = _compute(engine, data, seq, pairs)
    if dist.get_rank() == 0:
        record = {
            "weights_sha256": digest,
            "init_from": cfg.train.init_from,
            "identity": identity(cfg, pairs),
            "logps": table.tolist(),
        }
        fsio.write_json_atomic(path, record, root=Path(run_root))
    dist.barrier()
    log(
        f"reference: the log-probabilities of {pairs:,} pairs computed in "
        f"{time.perf_counter() - began:.1f} s (one forward each, weights {digest[:12]}), "
        f"kept in {path}"
    )
    return ReferenceTable(table)
