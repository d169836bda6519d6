"""Write what the pure commands print, for a fixed set of configurations, into one folder.

Used to show a refactor changed no behaviour: run it before and after, then `diff -r` the two
folders. It covers `plan --json` and `plan` (text) for every shipped recipe on several clusters,
a few hundred layouts drawn over tp/pp/dp/cp/ep/zero/backend/finetune, `validate` of each (exit
code and output), `plan --search --json` for a few recipes, and `render` of each recipe. Runs
in-process through Typer's CliRunner (no torch import): about two minutes on one core.

    python scripts/behaviour_snapshot.py OUT_DIR [--quick]
"""

from __future__ import annotations

import hashlib
import itertools
import random
import sys
import tempfile
from pathlib import Path

from typer.testing import CliRunner

from launcher.cli import app

RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
CLUSTERS = ["h100-80gb", "a100-80gb", "b200", "cpu"]


def layouts(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    grid = {
        "recipe": [
            "gpt-7b",
            "llama3-8b",
            "llama3-70b",
            "mixtral-8x7b",
            "deepseek-v3",
            "gpt-125m",
            "llama3-405b",
        ],
        "parallel.tp": [1, 2, 4, 8, 3],
        "parallel.pp": [1, 2, 4, 8, 6],
        "parallel.cp": [1, 2],
        "parallel.ep": [1, 2, 8],
        "zero.stage": [0, 1, 2, 3],
        "backend": ["torch", "deepspeed", "megatron"],
        "cluster": ["h100-80gb", "a100-80gb", "b200", "h200"],
        "cluster.num_nodes": [1, 2, 4, 16],
        "finetune": ["full", "lora"],
        "train.micro_batch_size": [1, 2, 4],
    }
    out = []
    for _ in range(count):
        args = []
        for key, values in grid.items():
            if rng.random() < 0.55:
                args.append(f"{key}={rng.choice(values)}")
        if not any(a.startswith("recipe=") for a in args):
            args.insert(0, f"recipe={rng.choice(grid['recipe'])}")
        out.append(args)
    return out


def main() -> int:
    out = Path(sys.argv[1])
    quick = "--quick" in sys.argv
    out.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    cases: list[tuple[str, list[str]]] = []
    for recipe, cluster in itertools.product(RECIPES, CLUSTERS):
        base = [f"recipe={recipe}", f"cluster={cluster}"]
        cases.append((f"plan-json/{recipe}@{cluster}", ["plan", "--json", *base]))
        cases.append((f"validate/{recipe}@{cluster}", ["validate", *base]))
    for recipe in RECIPES:
        cases.append((f"plan-text/{recipe}", ["plan", f"recipe={recipe}"]))
        cases.append((f"show/{recipe}", ["show", f"recipe={recipe}"]))
    for i, args in enumerate(layouts(7, 60 if quick else 300)):
        cases.append((f"layout/{i:03d}-plan", ["plan", "--json", *args]))
        cases.append((f"layout/{i:03d}-validate", ["validate", *args]))
    for recipe in ["llama3-70b", "gpt-7b", "mixtral-8x7b"] + (
        [] if quick else ["llama3-405b", "deepseek-v3"]
    ):
        cases.append(
            (
                f"search/{recipe}",
                ["plan", "--search", "--json", f"recipe={recipe}", "cluster=h100-80gb"],
            )
        )
    for i, args in enumerate(layouts(11, 10 if quick else 40)):
        cases.append(
            (f"search-layout/{i:03d}", ["plan", "--search", "--json", "--top", "3", *args])
        )
    index = []
    for name, argv in cases:
        result = runner.invoke(app, argv, env={"COLUMNS": "100", "NO_COLOR": "1"})
        text = f"$ llmtrain {' '.join(argv)}\nexit {result.exit_code}\n{result.output}"
        if result.exception and not isinstance(result.exception, SystemExit):
            text += f"\nEXCEPTION {type(result.exception).__name__}: {result.exception}\n"
        path = out / f"{name}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        index.append(f"{hashlib.sha256(text.encode()).hexdigest()[:16]} {name}")
    for recipe in RECIPES:
        with tempfile.TemporaryDirectory() as tmp:
            result = runner.invoke(
                app, ["render", "--out", tmp, f"recipe={recipe}", "cluster=h100-80gb"]
            )
            folder = out / "render" / recipe
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "exit.txt").write_text(f"exit {result.exit_code}\n")
            for f in sorted(Path(tmp).iterdir()):
                if f.is_file() and f.name != "plan.json":
                    (folder / f.name).write_text(f.read_text().replace(tmp, "OUT"))
            if (Path(tmp) / "plan.json").exists():
                (folder / "plan.json").write_text(
                    (Path(tmp) / "plan.json").read_text().replace(tmp, "OUT")
                )
    (out / "INDEX").write_text("\n".join(index) + "\n")
    print(f"{len(cases)} cases + {len(RECIPES)} renders -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
