"""Compose a configuration from conf/, a recipe and command-line overrides, strictly.

Hydra does the composition (defaults lists, group options, override grammar). On top of it we:
- register the schema and every recipe in Hydra's ConfigStore (recipes live in recipes/, outside the
  config dir, as group `recipe` with package `_global_`, so a recipe can `override /model: ...`);
- check group options before composing, so a typo lists the available options with a suggestion;
- reject unknown keys, also those added with `+` (Hydra accepts those silently on structured
  configs), naming the valid keys of that node;
- turn OmegaConf's type errors into one line naming the key and the expected type;
- check the fixed-choice keys (``key_info.choices``, declared on the schema's fields).
Every problem found is raised together as one ``ConfigError`` (exit code 2, no traceback).

Hydra and OmegaConf are imported inside the functions that use them: a composition found in
``compose_cache`` needs neither, which keeps `show` and `plan` fast.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import resources
from launcher.config.composition import compose_cache, config_file, hf_model, hydra_tree
from launcher.config.composition.compose_messages import (
    INDEX,
    expected_type,
    explain,
    nest,
    not_mapping_files,
    yaml_problem,
)
from launcher.config.composition.group_options import group_options
from launcher.config.composition.overrides import override_key
from launcher.config.schema import LLMTrainConfig, key_info
from launcher.config.schema.keys import (
    BUDGET_PARTNER,
    IN_BACKWARD_SETS,
    all_schema_keys,
    dataclass_of,
    field_type,
    groups,
    is_mapping_field,
    schema_fields,
    unknown_key_problems,
)
from launcher.config.secrets import (
    mask_environment_values,
    mask_secret_overrides,
    redact,
    spread_problems,
)
from launcher.errors import ConfigError, did_you_mean

DEFAULT_RECIPE = "tiny"


@dataclass(frozen=True)
class Composed:
    """A composed, checked configuration and how it was chosen."""

    config: LLMTrainConfig
    # Plain nested dict of every key, as `show` prints it and config.yaml holds it: secrets'
    # values are redacted here (launcher.config.secrets); only `config` has them.
    values: dict[str, Any]
    # Group -> chosen option (model: llama3-70b, recipe: llama3-70b, ...).
    choices: dict[str, str]
    overrides: tuple[str, ...]
    # What a model.from_hf config.json sets that is not carried over (hf_model._dropped), and
    # values taken from elsewhere than the configuration (the data's vocabulary).
    notes: tuple[str, ...] = ()
    # Dotted key -> where its value came from, when not from the configuration (show --sources).
    derived: tuple[tuple[str, str], ...] = ()


# Recipe name -> its node in Hydra's ConfigStore, read once a process.
_RECIPE_NODES: dict[str, Any] = {}


def _register(recipe: str) -> None:
    """Put the schema and this one recipe into Hydra's ConfigStore (loading every recipe costs
    0.1 s). Only this one: Hydra deep-copies the store's repository on every composition
    (``CachingConfigRepository.__init__``), so each recipe a process kept there from earlier
    compositions slowed every later one (0.13 -> 0.19 CPU s a composition with the 22 built-in
    recipes registered, more with every recipe file a long process read)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    node = _RECIPE_NODES.get(recipe)
    if node is None:
        store.store(name="base", node=LLMTrainConfig)
        store.store(group="recipe", name=recipe, node=_recipe_node(recipe), package="_global_")
        node = _RECIPE_NODES[recipe] = store.repo["recipe"][f"{recipe}.yaml"]
    store.repo["recipe"] = {f"{recipe}.yaml": node}


def _recipe_node(recipe: str) -> Any:
    """The recipe's file, read and checked, as an OmegaConf node."""
    import yaml
    from omegaconf import OmegaConf

    path = resources.recipes_dir() / f"{recipe}.yaml"
    if recipe in config_file.FILE_RECIPES:  # recipe=PATH, read and checked already
        path, text = config_file.FILE_RECIPES[recipe]
        node = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    else:
        with open(path, encoding="utf-8") as f:
            node = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    if not isinstance(node, dict):
        raise ConfigError(
            [
                f"recipe={recipe}: {path} must hold keys and values (key: value), not a "
                f"{type(node).__name__}"
            ]
        )
    shape = _shape_problems(node, "", str(path))
    if shape:  # OmegaConf would only say "Cannot merge DictConfig with ListConfig"
        raise ConfigError(shape)
    return OmegaConf.create(node)


def _shape_problems(node: dict[str, Any], prefix: str, where: str) -> list[str]:
    """Values of a recipe whose shape (mapping, list, scalar) is not the schema's: a mapping for a
    list or a scalar, a list for a mapping or a scalar, a scalar for a section. Unknown keys are
    left to unknown_key_problems (after composition)."""
    problems = []
    for key, value in node.items():
        if not prefix and key == "defaults":
            continue
        dotted = f"{prefix}{key}"
        tp = field_type(dotted)
        if tp is None:
            continue
        section = dataclass_of(tp)
        origin = typing.get_origin(tp)
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        kinds = {typing.get_origin(a) or a for a in args} | ({origin} if origin else {tp})
        if section is not None:
            if isinstance(value, dict):
                problems += _shape_problems(value, f"{dotted}.", where)
            elif value is not None:
                problems.append(f"{dotted}: a section of keys, not {value!r} (in {where})")
            continue
        if isinstance(value, dict) and dict not in kinds:
            problems.append(
                f"{dotted}: expected {expected_type(dotted)}, got a mapping (in {where})"
            )
        elif isinstance(value, list) and list not in kinds:
            problems.append(f"{dotted}: expected {expected_type(dotted)}, got a list (in {where})")
        elif (
            value is not None
            and not isinstance(value, (dict, list))
            and (list in kinds or dict in kinds)
        ):
            problems.append(
                f"{dotted}: expected {expected_type(dotted)}, got {value!r} (in {where})"
            )
    return problems


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> Composed:
    """Compose, check and type the configuration for these overrides. Raises ConfigError."""
    overrides = tuple(overrides)
    try:
        # recipe=PATH -> recipe=<stem>-<content hash> (launcher.config.composition.config_file)
        overrides = config_file.rewrite_recipe_paths(overrides)
        # model.from_hf=PATH -> the model.* keys of PATH's config.json
        # (launcher.config.composition.hf_model)
        overrides, notes = hf_model.expand_with_notes(overrides)
        composed = _compose(overrides)
        composed = dataclasses.replace(composed, notes=notes) if notes else composed
        return _vocab_from_data(composed, overrides)
    except ConfigError as exc:  # an error message quotes overrides: never a secret's value
        problems = config_file.annotate(exc.problems, overrides)
        masked = [mask_secret_overrides(p, overrides) for p in problems]
        raise ConfigError(
            [mask_environment_values(p, overrides, os.environ) for p in masked], exc.unparsed
        ) from None


def _compose(overrides: tuple[str, ...]) -> Composed:
    cached = compose_cache.load(overrides)
    if cached is not None:
        values, choices = cached
        spread = spread_problems(values, os.environ)  # the environment may hold a new value
        if spread:
            raise ConfigError(spread)
        try:
            config = typing.cast(LLMTrainConfig, _build(LLMTrainConfig, values))
        except (KeyError, TypeError):  # an entry of another schema: composed again below
            config = None
        if config is not None:
            return Composed(config=config, values=values, choices=choices, overrides=overrides)
    import yaml
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    parsed = _parse(overrides)
    problems = _check_group_options(parsed) + _check_override_keys(parsed)
    if problems:
        raise ConfigError(problems)
    recipes = [ov.value for ov in parsed if ov.key == "recipe" and ov.value and not ov.is_delete]
    # Bad config files and interpolations fail in here too: YAML syntax (yaml.YAMLError), a
    # defaults list that is not a list (ValueError), `${...}` that cannot resolve (to_container).
    try:
        _register(recipes[-1] if recipes else DEFAULT_RECIPE)
        cfg = hydra_tree.compose_tree(overrides, [ov.parsed for ov in parsed])
        choices = {
            k: str(v) for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")
        }
        _command_line_groups_win(cfg, parsed)
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
        values = typing.cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_problem(exc)]) from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError([explain(exc)]) from None
    except OSError as exc:  # OmegaConf.load of a file holding a scalar, or an unreadable file
        raise ConfigError(not_mapping_files() or [str(exc)]) from None
    values["recipe"] = choices.get("recipe", "none")
    _command_line_budget_wins(parsed, values)
    _in_backward_sets(parsed, values)
    problems = unknown_key_problems(values) + choice_problems(values) + element_problems(values)
    # A secret's value copied into another key (`${oc.env:NAME}`): refused before it is cached,
    # written, shown or put in a job name.
    problems += spread_problems(values, os.environ)
    if problems:
        raise ConfigError(problems)
    config = typing.cast(LLMTrainConfig, _build(LLMTrainConfig, values))
    compose_cache.store(overrides, values, choices)  # never stores a secret's value
    return Composed(config=config, values=redact(values), choices=choices, overrides=overrides)


def _prepared_vocab(spec: str) -> tuple[int, str] | None:
    """(vocabulary, tokenizer) of a prepared dataset's index.json, or None (not one, unreadable)."""
    import json
    from pathlib import Path

    index = Path(spec).expanduser() / "index.json"
    try:
        if not index.is_file() or index.stat().st_size > config_file.MAX_BYTES:
            return None
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    vocab = data.get("vocab_size") if isinstance(data, dict) else None
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        return None
    tokenizer = data.get("tokenizer")
    return vocab, tokenizer if isinstance(tokenizer, str) else "its"


def _vocab_from_data(composed: Composed, overrides: tuple[str, ...]) -> Composed:
    """model.vocab_size from the tokenizer prepared data was made with (index.json of data.path,
    or the largest of data.blend's prepared datasets), when model.vocab_size is not given
    (command line, --config, model.from_hf): the model then embeds every id the data holds.
    Read after the compose cache, so a re-prepared dataset is seen; paths that are not prepared
    datasets are left to the data checks of validate/run."""
    given = {override_key(text) for text in overrides}
    if "model.vocab_size" in given:
        return composed
    data = composed.config.data
    specs = [("data.path", data.path)] if data.path else []
    specs += [
        (f"data.blend[{i}]", item)
        for i, item in enumerate(data.blend or [])
        if isinstance(item, str) and not _is_number(item)
    ]
    found = [(key, spec, _prepared_vocab(spec)) for key, spec in specs]
    known = [(key, spec, v) for key, spec, v in found if v is not None]
    if not known:
        return composed
    key, spec, (vocab, tokenizer) = max(known, key=lambda item: item[2][0])
    if vocab == composed.config.model.vocab_size:
        return composed
    source = f"{key}={spec} ({tokenizer} tokenizer, vocabulary {vocab})"
    values = {**composed.values, "model": {**composed.values["model"], "vocab_size": vocab}}
    config = dataclasses.replace(
        composed.config, model=dataclasses.replace(composed.config.model, vocab_size=vocab)
    )
    note = (
        f"model.vocab_size={vocab} from {source}, not {composed.config.model.vocab_size}; "
        "set model.vocab_size to choose another"
    )
    return dataclasses.replace(
        composed,
        config=config,
        values=values,
        notes=(*composed.notes, note),
        derived=(*composed.derived, ("model.vocab_size", source)),
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# Keys a group option does not take back from the recipe: a cluster option names a node type (GPU,
# GPUs per node, links, price); how many nodes the run spans stays the recipe's
# (`plan recipe=llama3-70b cluster=h100-80gb` plans the recipe's 256 nodes, not the file's 1).
RECIPE_SCALE_KEYS = frozenset({"cluster.num_nodes"})


def _command_line_groups_win(cfg: Any, parsed: list[ParsedOverride]) -> None:
    """A group option chosen on the command line (`zero=stage3-offload`) wins over the recipe's
    own keys in that group (Hydra applies the recipe's body after the group files, so
    `zero: {stage: 2}` in recipes/llama3-70b.yaml would otherwise undo `zero=stage3-offload`).
    The group file's keys are merged again over the composed group; a key given on the command
    line (`zero.stage=2`) still wins over both, so it is left out of that merge."""
    from omegaconf import DictConfig, OmegaConf

    explicit = {ov.key.lstrip("+") for ov in parsed if not ov.is_group} | RECIPE_SCALE_KEYS
    for ov in parsed:
        if not ov.is_group or ov.is_delete or ov.value is None or ov.key == "recipe":
            continue
        path = resources.conf_dir() / ov.key / f"{ov.value}.yaml"
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig):
            continue
        # A `# @package _global_` file (conf/finetune/) writes keys from the root, not under
        # its group's name.
        prefix = "" if _global_package(path) else f"{ov.key}."
        OmegaConf.set_struct(node, False)
        node.pop("defaults", None)
        plain = OmegaConf.to_container(node, resolve=False)
        for dotted in _leaf_keys(plain, ""):
            full = f"{prefix}{dotted}"
            # null in a group file is "the default" (backend.moe_dispatcher: null), no choice
            # to win with: a recipe's mixtral `moe_dispatcher: alltoall` stays.
            if (
                full in explicit
                or any(full.startswith(f"{k}.") for k in explicit)
                or _leaf(plain, dotted) is None
            ):
                _drop(node, dotted)
        if prefix:
            cfg[ov.key] = OmegaConf.merge(cfg[ov.key], node)
        else:
            for key in list(node.keys()):
                cfg[key] = OmegaConf.merge(cfg[key], node[key])


def _global_package(path: Path) -> bool:
    """Whether a group file's header declares Hydra's `# @package _global_`."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                return False
            if line.replace(" ", "").startswith("#@package_global_"):
                return True
    return False


def _leaf(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _leaf_keys(node: Any, prefix: str) -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, value in node.items() for k in _leaf_keys(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if prefix else []


def _drop(node: Any, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    del node[last]


def _command_line_budget_wins(parsed: list[ParsedOverride], values: dict[str, Any]) -> None:
    given = {ov.key for ov in parsed if not ov.is_delete and ov.value is not None}
    train = values.get("train")
    if not isinstance(train, dict):
        return
    for key, other in BUDGET_PARTNER.items():
        if key in given and other not in given:
            train[other.split(".")[1]] = None
    # train.epochs (schema docstring): wins over the file's train.steps / train.tokens, which
    # stay as the price of an unknown data size; either given alone on the command line means
    # that length, so it replaces a file's epochs; both given there contradict each other.
    length = sorted(k for k in BUDGET_PARTNER if k in given)
    if "train.epochs" in given and length:
        raise ConfigError(
            [
                f"train.epochs and {' and '.join(length)} are all given on the command line: "
                f"the run's length is one of them; keep one, e.g. drop {length[0]} and keep "
                f"train.epochs={train.get('epochs')}"
            ]
        )
    if length:
        train["epochs"] = None


def _in_backward_sets(parsed: list[ParsedOverride], values: dict[str, Any]) -> None:
    """optim.in_backward=true given by the user sets the keys it needs (keys.IN_BACKWARD_SETS)
    that the user did not give: a recipe's clipping and global batch are not a choice the
    in-backward step can keep. One given alongside it stays, and validate says why it cannot."""
    given = {ov.key.lstrip("+") for ov in parsed if not ov.is_delete and ov.value is not None}
    optim = values.get("optim")
    if "optim.in_backward" not in given or not isinstance(optim, dict):
        return
    if optim.get("in_backward") is not True:
        return
    batch = {"train.global_batch_size", "train.grad_accum"}
    for key, value in IN_BACKWARD_SETS.items():
        if key in given or (key in batch and batch & given):
            continue
        group, leaf = key.split(".")
        if isinstance(values.get(group), dict):
            values[group][leaf] = value


def config_from_values(values: dict[str, Any]) -> LLMTrainConfig:
    """The typed config for values that were composed and checked before (a run's config.yaml)."""
    return typing.cast(LLMTrainConfig, _build(LLMTrainConfig, values))


def _build(cls: type, values: dict[str, Any]) -> Any:
    """The dataclass instance for already type-checked values (Hydra merged them into the schema).

    Faster than OmegaConf.to_object on the composed tree, which matters for `show` start-up time.
    """
    kwargs = {}
    for name, tp in schema_fields(cls).items():
        sub = dataclass_of(tp)
        value = values[name]
        kwargs[name] = _build(sub, value) if sub is not None and value is not None else value
    return cls(**kwargs)


@dataclass(frozen=True)
class ParsedOverride:
    text: str
    key: str
    value: str | None
    is_group: bool
    is_delete: bool
    # Hydra's own parse of `text` (an Override), handed on to hydra_tree.compose_tree.
    parsed: Any = dataclasses.field(default=None, compare=False, repr=False)


def _bare_word_hint(text: str) -> str:
    """For a bare word that names a recipe or a group's option (`llmtrain run gpt-7b`): the
    override it most likely meant."""
    if "=" in text or not text.strip():
        return ""
    meant = [f"{g}={text}" for g in groups() if g != "recipe" and text in group_options(g)]
    if text in group_options("recipe"):
        meant.insert(0, f"recipe={text}")
    return f" Did you mean {' or '.join(meant)}?" if meant else ""


def _parse(overrides: tuple[str, ...]) -> list[ParsedOverride]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out = []
    problems = []
    unparsed = []
    known_groups = set(groups())
    for text in overrides:
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException as exc:
            msg = str(exc).splitlines()[0]
            problems.append(
                f"override {text!r} is not valid: {msg}. Overrides look like key=value, "
                "+key=value (add), ~key (delete) or group=option." + _bare_word_hint(text)
            )
            unparsed.append(text)
            continue
        key = ov.key_or_group
        if not key:
            problems.append(
                f"override {text!r} is not valid: it names no key. Overrides look like key=value, "
                "+key=value (add), ~key (delete) or group=option."
            )
            unparsed.append(text)
            continue
        value = None if ov.value() is None else str(ov.value())
        out.append(
            ParsedOverride(
                text=text,
                key=key,
                value=value,
                is_group=key in known_groups and "." not in key,
                is_delete=ov.is_delete(),
                parsed=ov,
            )
        )
    if problems:
        raise ConfigError(problems, unparsed)
    return out


def _check_group_options(parsed: list[ParsedOverride]) -> list[str]:
    problems = []
    for ov in parsed:
        if not ov.is_group or ov.is_delete or ov.value is None:
            continue
        options = group_options(ov.key)
        if ov.value not in options:
            problems.append(
                f"{ov.key}={ov.value}: no such {ov.key}{did_you_mean(ov.value, options)}; "
                f"available: {', '.join(options)}"
            )
    return problems


def _check_override_keys(parsed: list[ParsedOverride]) -> list[str]:
    """Unknown keys typed on the command line, all of them, before Hydra stops at the first."""
    known = set(all_schema_keys())
    nodes = {k.rsplit(".", 1)[0] for k in known if "." in k}
    problems: list[str] = []
    for ov in parsed:
        key = INDEX.sub("", ov.key)
        if ov.is_group or key in known or key in nodes or key.split(".")[0] == "hydra":
            continue
        if any(key.startswith(f"{k}.") for k in known if is_mapping_field(k)):
            continue
        problems += unknown_key_problems(nest(key)) or _below_a_value(key)
    return problems


def _below_a_value(key: str) -> list[str]:
    """`model.num_layers.x`: a key below a schema value (a list takes an index: optim.betas.0)."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if prefix not in all_schema_keys():
            continue
        tp = field_type(prefix)
        is_list = any(typing.get_origin(t) is list for t in (tp, *typing.get_args(tp)))
        if is_list and len(parts) == i + 1 and parts[i].isdigit():
            return []
        return [
            f"{key}: unknown key; {prefix} is a value ({expected_type(prefix)}), "
            "not a node with keys"
        ]
    return []


def choice_problems(values: dict[str, Any]) -> list[str]:
    problems = []
    for key, allowed in key_info.choices().items():
        node: Any = values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and str(node) not in allowed:
            problems.append(
                f"{key}={node}: must be one of {', '.join(allowed)}"
                f"{did_you_mean(str(node), allowed)}"
            )
    return problems


def element_problems(values: dict[str, Any]) -> list[str]:
    """Lists and mappings of the schema hold plain values (OmegaConf lets [[1]] in a list[str])."""
    problems = []
    for key in all_schema_keys():
        node: Any = values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
        bad = [item for item in items if isinstance(item, (list, dict))]
        if bad:  # the value is not printed: cluster.env may hold a secret
            problems.append(
                f"{key}: expected {expected_type(key)}, but an element is a {type(bad[0]).__name__}"
            )
    return problems


# Older names, kept for the callers that imported them from here.
__all__ = ["BUDGET_PARTNER", "Composed", "all_schema_keys", "compose_config", "groups"]
__all__ += ["group_options", "unknown_key_problems"]
