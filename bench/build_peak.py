"""Each rank's peak memory while a sharded run builds, loads and takes its first steps, against
the plan's per-rank figure (issue #39's acceptance).

    python bench/build_peak.py [--cases full-random,full-init,lora-random,lora-init] [--steps 1]

The model of issue #39: recipe=tiny-sft-lora widened to 20 layers, hidden 1536, ffn 6144
(755M parameters, 2.81 GiB in fp32), 4 CPU processes (gloo), zero.stage=3 on backend=torch,
fp32, seq 32, micro-batch 1. Cases: full training or finetune=lora, each from random init or
with train.init_from an HF export of the same model (written once, fp32 safetensors, into a
temporary folder). Each case runs in fresh processes (torchrun): every rank builds the engine
(``trainer.build_engine``: meta, FSDP2, its shard materialised and filled), takes `--steps`
steps and reports its peak resident set (``ru_maxrss``). `plan --json` prices the same
configuration; its per-rank figure is ``device_bytes`` (allocated x fragmentation + the
runtime's own overhead, what a process holds in all). The resident set holds the runtime too, so
nothing is subtracted: on `cluster=cpu` the overhead is the GPU catalog's 0.5 GiB for the process
itself (launcher/plan/hardware/gpu_catalog.py), against the 0.27 GiB measured before the build
(printed per rank as "runtime") plus what the runtime adds during the step besides tensors.

Exit status: 1 when a rank's peak exceeds 1.2 x the plan's figure, or its peak once built (before
the first step: full training's optimizer states then add 8 bytes a parameter / 4 ranks, more than
half the model in all) exceeds half the whole fp32 model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
GIB = 2**30
RANKS = 4
LIMIT = 1.2

MODEL = [
    "recipe=tiny-sft-lora",
    "train.init_from=null",
    "model.num_layers=20",
    "model.hidden_size=1536",
    "model.ffn_hidden_size=6144",
    "model.num_attention_heads=12",
    "model.seq_length=32",
    "train.micro_batch_size=1",
    f"train.global_batch_size={RANKS}",
    f"cluster.gpus_per_node={RANKS}",
    "zero.stage=3",
    "backend=torch",
]
CASES = {
    "full-random": ["finetune=full"],
    "full-init": ["finetune=full"],
    "lora-random": ["finetune=lora", "finetune.targets=[q,k,v,o]"],
    "lora-init": ["finetune=lora", "finetune.targets=[q,k,v,o]"],
}


def rank_main(overrides: list[str], steps: int, out: str) -> None:
    """One rank (under torchrun): build, step, write its peak RSS."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.checkpoint.init_from import open_source
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.reporting.metrics import current_rss
    from launcher.train.trainer import build_engine

    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    torch.set_num_threads(1)
    cfg = compose_config(overrides).config
    init_process_group_from_env()
    runtime = current_rss() or 0
    source = open_source(cfg) if cfg.train.init_from else None
    engine = build_engine(cfg, source)
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    lay = derive_layout(cfg)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        rows = torch.randint(0, cfg.model.vocab_size, (lay.global_batch_size, 33), generator=g)
        per = lay.micro_batch_size * lay.grad_accum
        rank = engine.info.dp_rank
        engine.step(rows[rank * per : (rank + 1) * per], lr=1e-4)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record = {"rank": dist.get_rank(), "runtime": runtime, "built": built, "peak": peak}
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def plan_bytes(overrides: list[str]) -> dict[str, Any]:
    text = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", *overrides, "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout
    document = json.loads(text)
    memory, model = document["memory"], document["model"]
    return {"device": memory["device_bytes"], "params": model["total_params"]}


def write_export(folder: Path) -> None:
    """The model as a Hugging Face folder (fp32 safetensors), built one block at a time."""
    import torch
    from safetensors.torch import save_file

    from launcher.config.composition.compose import compose_config
    from launcher.export.hf_layout import hf_renames
    from launcher.train.model.transformer import build_model

    cfg = compose_config([*MODEL, "finetune=full"]).config
    renames = hf_renames(cfg.model)
    assert renames is not None
    model = build_model(cfg.model, "cpu", seed=11)
    state = {renames[k]: v.detach().contiguous() for k, v in model.state_dict().items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}\n")
    del model, state
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


def run_case(name: str, steps: int, export: Path, scratch: Path) -> list[dict[str, Any]]:
    overrides = [*MODEL, *CASES[name]]
    if name.endswith("-init"):
        overrides.append(f"train.init_from={export}")
    out = scratch / name
    out.mkdir()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={RANKS}",
        str(Path(__file__).resolve()),
        "--rank-body",
        json.dumps(overrides),
        "--steps",
        str(steps),
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMTRAIN_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--rank-body", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_body is not None:
        rank_main(json.loads(args.rank_body), args.steps, args.out)
        return 0
    missed = False
    with tempfile.TemporaryDirectory(prefix="build-peak-") as tmp:
        scratch, export = Path(tmp), Path(tmp) / "export"
        for name in args.cases.split(","):
            if name.endswith("-init") and not export.exists():
                write_export(export)
            plan = plan_bytes([*MODEL, *CASES[name]])
            whole = plan["params"] * 4
            print(
                f"{name}: plan {plan['device'] / GIB:.2f} GiB per rank; "
                f"whole fp32 model {whole / GIB:.2f} GiB"
            )
            for r in run_case(name, args.steps, export, scratch):
                ratio = r["peak"] / plan["device"]
                ok = ratio <= LIMIT and r["built"] < 0.5 * whole
                missed |= not ok
                print(
                    f"  rank {r['rank']}: peak {r['peak'] / GIB:.2f} GiB "
                    f"(after build {r['built'] / GIB:.2f}, runtime {r['runtime'] / GIB:.2f}) "
                    f"= {ratio:.2f} x plan; built at {r['built'] / whole:.0%} of the whole model"
                    + ("" if ok else "  MISS")
                )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
