"""The command line as a user meets it: exit codes, JSON, messages, no tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import invoke, shown
from tests.cli import invoke as llmtrain

pytestmark = pytest.mark.unit


def test_help_lists_commands() -> None:
    result = invoke("--help")
    assert result.returncode == 0
    for command in ("show", "validate", "recipes"):
        assert command in shown(result)


def test_show_json_is_the_resolved_config() -> None:
    result = invoke("show", "recipe=gpt-7b", "zero.stage=3", "--json")
    assert result.returncode == 0, shown(result)
    doc = json.loads(result.stdout)
    assert doc["zero"]["stage"] == 3
    assert doc["recipe"] == "gpt-7b"


def test_show_sources_json() -> None:
    result = invoke("show", "parallel.tp=1", "--sources", "--json")
    doc = json.loads(result.stdout)
    assert doc["sources"]["parallel.tp"] == "command line"


def test_show_sources_table_has_a_source_column() -> None:
    result = invoke("show", "--sources")
    assert result.returncode == 0
    assert "schema default" in shown(result)


def test_validate_ok_and_json() -> None:
    result = invoke("validate", "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["valid"] is True and doc["layout"]["dp"] == 1


def test_validate_errors_exit_2_and_name_the_key() -> None:
    result = llmtrain("validate", "recipe=llama3-8b", "parallel.tp=6")
    assert result.returncode == 2
    assert "parallel.tp=6 does not divide model.num_attention_heads=32" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_unknown_key_exit_2_no_traceback() -> None:
    result = llmtrain("show", "+parallel.tpp=2")
    assert result.returncode == 2
    assert "parallel.tpp: unknown key (did you mean 'tp'?)" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_group_option_exit_2() -> None:
    result = llmtrain("show", "cluster=h100-8gb")
    assert result.returncode == 2
    assert "no such cluster (did you mean 'h100-80gb'?)" in result.stderr
    # A prefix of option names suggests those options, not a look-alike ('h800').
    prefix = llmtrain("show", "cluster=h100")
    assert prefix.returncode == 2
    assert "(did you mean 'h100-80gb' or 'h100-96gb' or 'h100-pcie'?)" in prefix.stderr


def test_unknown_option_is_a_usage_error() -> None:
    result = llmtrain("show", "--sourcs")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_recipes_table_and_json() -> None:
    result = invoke("recipes", "--json")
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["llama3-405b"]["gpus"] == 16384
    assert rows["llama3-405b"]["tp"] == 8 and rows["llama3-405b"]["pp"] == 16
    assert all(row["valid"] for row in rows.values())
    table = invoke("recipes")
    assert "llama3-405b" in shown(table) and "406B" in shown(table)


def test_plan_json_has_the_contract_keys() -> None:
    result = invoke("plan", "recipe=llama3-8b", "--json")
    assert result.returncode == 0, shown(result)
    doc = json.loads(result.stdout)
    assert doc["memory"]["fits"] in (True, False)
    assert doc["time"]["step_s"] > 0


@pytest.mark.parametrize("command", [["plan", "--measure"], ["calibrate"]])
def test_measuring_commands_refuse_an_invalid_config_as_json(command: list[str]) -> None:
    # Nothing is measured: the world-size and head rules refuse tp=3 before any process starts.
    result = invoke(*command, "parallel.tp=3", "--json")
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    assert doc["valid"] is False
    assert {"world-size", "attention-heads"} <= {e["rule"] for e in doc["errors"]}


def test_plan_search_keeps_fixed_keys() -> None:
    result = invoke("plan", "--search", "recipe=llama3-8b", "parallel.tp=2", "--top", "3", "--json")
    assert result.returncode == 0, shown(result)
    doc = json.loads(result.stdout)
    assert 1 <= len(doc["candidates"]) <= 3
    assert all("parallel.tp=2" in c["overrides"] for c in doc["candidates"])


def test_plan_refuses_an_invalid_layout_but_search_takes_it() -> None:
    bad = llmtrain("plan", "recipe=llama3-8b", "parallel.tp=6")
    assert bad.returncode == 2 and "valid tp" in bad.stderr
    searched = invoke("plan", "--search", "recipe=llama3-8b", "parallel.tp=6")
    assert searched.returncode in (0, 2), shown(searched)


def test_run_dry_run_answers_with_the_plan_and_the_folder_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before the script: the plan's verdict, memory, step time and MFU, then the run directory
    # it would use (not a RUN_DIR placeholder); --json carries both, and nothing is written.
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "--dry-run", "train.steps=5")
    assert result.returncode == 0, shown(result)
    lines = shown(result).splitlines()
    assert lines[0].startswith("plan: fits, ") and "MFU" in shown(result)
    assert f"(in {tmp_path}/runs/tiny-" in shown(result) and "RUN_DIR" not in shown(result)
    doc = json.loads(invoke("run", "--dry-run", "--json").stdout)
    assert doc["run_dir"].startswith(f"{tmp_path}/runs/tiny-")
    assert doc["plan"]["memory"]["verdict"] == "fits" and doc["plan"]["time"]["mfu"] > 0
    assert not (tmp_path / "runs").exists()
