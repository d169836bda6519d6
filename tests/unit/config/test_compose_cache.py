"""The compose cache returns what Hydra composed, and any edit to a config file invalidates it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from launcher import resources
from launcher.config.composition import compose_cache
from launcher.config.composition.compose import compose_config

pytestmark = pytest.mark.unit


@pytest.fixture
def data_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "data"
    shutil.copytree(resources.conf_dir(), root / "conf")
    shutil.copytree(resources.recipes_dir(), root / "recipes")
    monkeypatch.setattr(resources, "data_root", lambda: root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMTRAIN_NO_CACHE", raising=False)
    return root


def test_cached_result_equals_hydra_result(data_copy: Path) -> None:
    overrides = ("recipe=llama3-70b", "parallel.tp=4")
    assert compose_cache.load(overrides) is None
    fresh = compose_config(overrides)
    assert compose_cache.load(overrides) is not None
    cached = compose_config(overrides)
    assert cached.config == fresh.config
    assert cached.choices == fresh.choices

    # `show` prints values in their order: the cached composition keeps Hydra's key order
    # (sorted keys made the second `show` differ from the first).
    def order(node: object) -> list[str]:
        if not isinstance(node, dict):
            return []
        return [k for key, value in node.items() for k in (key, *order(value))]

    assert order(cached.values) == order(fresh.values)


def test_editing_a_config_file_invalidates(data_copy: Path) -> None:
    compose_config(["recipe=tiny"])
    before = compose_cache.key(("recipe=tiny",))
    model = data_copy / "conf" / "model" / "tiny.yaml"
    model.write_text(model.read_text().replace("num_layers: 4", "num_layers: 6"))
    os.utime(model, ns=(1, 1))  # a different mtime even on coarse clocks
    assert compose_cache.key(("recipe=tiny",)) != before
    assert compose_config(["recipe=tiny"]).config.model.num_layers == 6


def test_errors_are_not_cached_and_cache_can_be_disabled(
    data_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(Exception, match="unknown key"):
        compose_config(["+parallel.nope=1"])
    assert compose_cache.load(("+parallel.nope=1",)) is None
    monkeypatch.setenv("LLMTRAIN_NO_CACHE", "1")
    compose_config(["recipe=tiny"])
    assert not (Path(os.environ["XDG_CACHE_HOME"]) / "llmtrain" / "compose").exists()


def test_oc_env_values_key_the_cache(data_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value resolved from ${oc.env:...} is never served stale after the variable changes."""
    overrides = ("recipe=tiny", "run.root_dir=${oc.env:LLMTRAIN_TEST_ROOT,runs}")
    monkeypatch.setenv("LLMTRAIN_TEST_ROOT", "/first")
    assert compose_config(overrides).config.run.root_dir == "/first"
    monkeypatch.setenv("LLMTRAIN_TEST_ROOT", "/second")
    assert compose_config(overrides).config.run.root_dir == "/second"
    monkeypatch.delenv("LLMTRAIN_TEST_ROOT")
    assert compose_config(overrides).config.run.root_dir == "runs"
    assert compose_cache.env_references(["a: ${oc.env:HOME}", "${oc.env:'X_Y',1}"]) == [
        "HOME",
        "X_Y",
    ]


@pytest.mark.parametrize("entry", ["[1, 2]", '{"values": [], "choices": {}}', "{not json", ""])
def test_a_wrong_shaped_cache_entry_is_rebuilt(data_copy: Path, entry: str) -> None:
    overrides = ("recipe=tiny",)
    expected = compose_config(overrides).config
    path = compose_cache.cache_dir() / f"{compose_cache.key(overrides)}.json"
    path.write_text(entry)
    assert compose_cache.load(overrides) is None
    assert compose_config(overrides).config == expected
    assert compose_cache.load(overrides) is not None


def test_schema_code_keys_as_this_process_imported_it(
    data_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade while a command runs: the schema's files change on disk under a process that
    imported the old ones. Its compositions (old schema) must not be stored under the new code's
    key, or later commands read entries that lack the new keys (a KeyError traceback, seen when a
    new model key landed under a running process)."""
    before = compose_cache.key(("recipe=tiny",))
    schema_dir = Path(compose_cache.schema.__file__).parent
    real_stat = Path.stat

    def newer(path: Path, *args: object, **kwargs: object) -> os.stat_result:
        result = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        if path.parent == schema_dir or path.name == "compose.py":
            fields = list(result)
            fields[8] += 60  # st_mtime: the file was replaced a minute later
            return os.stat_result(fields)
        return result

    monkeypatch.setattr(Path, "stat", newer)
    assert compose_cache.key(("recipe=tiny",)) == before


def test_an_entry_of_another_schema_is_composed_again(data_copy: Path) -> None:
    """An entry whose values lack a key of this schema (written by an older llmtrain) is not a
    traceback: Hydra composes again."""
    import json

    overrides = ("recipe=tiny",)
    fresh = compose_config(overrides)
    entry = compose_cache.cache_dir() / f"{compose_cache.key(overrides)}.json"
    document = json.loads(entry.read_text())
    text = json.dumps(document)
    assert '"num_layers"' in text
    entry.write_text(text.replace('"num_layers"', '"num_layers_old"'))
    assert compose_config(overrides).config == fresh.config
