"""Every `plan --search` top-5 layout passes `run --dry-run` (or, for a GPU cluster this machine
does not have, `submit --dry-run` plus a run refused for this machine's hardware alone) with the
backend its override line names."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.launch.preflight import hardware_problems
from launcher.verdict import assess
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit


def top5(*overrides: str) -> list[dict[str, object]]:
    result = invoke("plan", "--search", "--top", "5", "--json", *overrides)
    assert result.returncode == 0, shown(result)
    candidates: list[dict[str, object]] = json.loads(result.stdout)["candidates"]
    assert candidates
    return candidates


@pytest.mark.parametrize(
    "base",
    [
        ("recipe=tiny", "cluster=cpu", "cluster.gpus_per_node=4", "train.global_batch_size=16"),
        ("recipe=tiny", "backend=deepspeed", "cluster.gpus_per_node=4"),
    ],
)
def test_top5_on_this_machine_pass_run_dry_run(base: tuple[str, ...]) -> None:
    backend = compose_config(base).config.backend.name
    for cand in top5(*base):
        line = shlex.split(str(cand["overrides"]))  # a shell line (layout strings quoted)
        assert line[0] == f"backend={backend}" and cand["backend"] == backend
        verdict = assess([*base, *line])
        assert verdict.exit_code("run") == 0, (line, verdict.errors, verdict.refusals)


@pytest.mark.parametrize(
    ("base", "any_backend"),
    [
        (("recipe=llama3-8b", "cluster.num_nodes=2"), False),
        (("recipe=mixtral-8x7b", "cluster.num_nodes=4", "train.global_batch_size=64"), True),
    ],
)
def test_top5_on_gpu_clusters_pass_the_dry_runs(
    base: tuple[str, ...], any_backend: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Megatron-LM checkout (its entry script is all that is checked before launch), so that a
    # Megatron layout the search proposes is judged on the layout, not on a missing checkout.
    (tmp_path / "pretrain_gpt.py").write_text("")
    monkeypatch.setenv("MEGATRON_LM_PATH", str(tmp_path))
    for cand in top5(*base, *(["--any-backend"] if any_backend else [])):
        line = shlex.split(str(cand["overrides"]))  # a shell line (layout strings quoted)
        assert line[0].startswith("backend=")
        verdict = assess([*base, *line])
        assert verdict.valid, (line, [v.message for v in verdict.errors])
        cfg = verdict.composed.config if verdict.composed else None
        assert cfg is not None and cfg.backend.name == cand["backend"]
        preset = [n for n in verdict.notes if n.startswith("planning preset")]
        # What run refuses is this machine (no such GPUs here) or a plan-only backend; submit the
        # same minus the hardware: never the layout itself.
        allowed = set(hardware_problems(cfg))
        for command in ("run", "submit"):
            for problem in verdict.refusals[command]:
                assert problem in allowed or (preset and "backend=megatron" in problem), problem


def test_any_backend_widens_and_never_loses_the_best() -> None:
    base = ("recipe=tiny", "cluster.gpus_per_node=4", "train.global_batch_size=16")
    one = top5(*base)
    every = top5(*base, "--any-backend")
    assert every[0]["tokens_per_s"] >= one[0]["tokens_per_s"]  # type: ignore[operator]
    assert {c["backend"] for c in every} <= {"torch", "deepspeed"}  # megatron needs CUDA
    result = invoke("plan", "--search", "--any-backend", *base, "precision=fp8")
    assert result.returncode == 2, shown(result)
    assert "no backend can run this request" in result.stderr, shown(result)


def test_screen_lines_hold_only_what_changes_the_given_configuration() -> None:
    # The screen's line to copy keeps backend= and the keys that differ from the configuration as
    # given (it repeated all ten keys, ~230 characters); added to the command it gives the same
    # configuration as the full line in --json.
    base = ("recipe=llama3-8b",)
    full = [str(c["overrides"]) for c in top5(*base)]
    screen = invoke("plan", "--search", "--top", "5", *base)
    assert screen.returncode == 0, shown(screen)
    lines = shown(screen).split("Override lines to copy", 1)[1].splitlines()[1:6]
    short = [line.split(None, 1)[1] for line in lines]
    for line, whole in zip(short, full, strict=True):
        assert line.startswith("backend=") and len(line) < len(whole)
        assert compose_config([*base, *shlex.split(line)]).config == (
            compose_config([*base, *shlex.split(whole)]).config
        )
