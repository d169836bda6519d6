"""Property-based fuzzing of overrides and config files: bad input gives exit 2 naming the key.

Every generated input is bad *by construction*: an unknown key (random, a typo of a real key, a key
under the wrong node, one added with `+`), a wrong type for a typed key, an out-of-range value, a
bad choice, a bad group option or recipe name, malformed override syntax, several of these at once,
or a bad YAML group file / recipe in a temporary copy of conf/ and recipes/. For each, `validate`,
`plan`, `show` and `run` must exit with code 2, print a message naming the offending key (or the
group option, the file, or saying that the override is not valid), never a traceback, and write
nothing: the commands run in an empty working directory that must stay empty (no `runs/`).

`run` with a valid configuration would train, so every `run` case carries `RUN_GUARD` first (a
data path that does not exist: the last check of preflight, after everything the case can break)
and, in process, `prepare_run_dir` and `launch` are replaced by functions that fail the case.

The strategies are shared with `bench/fuzz_cli.py`, which runs thousands of cases.
"""

from __future__ import annotations

import dataclasses
import shutil
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher import resources
from launcher.config.composition import compose
from launcher.config.schema import key_info
from launcher.config.schema.allowed import Allowed
from launcher.config.schema.keys import field_type
from launcher.errors import UserError
from launcher.validate import rules
from tests.cli import invoke, llmtrain, said

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

COMMANDS = ("validate", "plan", "show", "run")
# Out-of-range values compose fine: only the commands that validate reject them.
VALIDATING = ("validate", "plan", "run")
RUN_GUARD = "data.path=/nonexistent/llmtrain-fuzz-guard"

# --- the schema, as the strategies see it ---

KEYS: tuple[str, ...] = compose.all_schema_keys()
NODES: tuple[str, ...] = tuple(sorted({k.rsplit(".", 1)[0] for k in KEYS if "." in k}))
TOP_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(k.split(".")[0] for k in KEYS))
GROUPS: tuple[str, ...] = tuple(compose.groups())
# Group files hold the keys of the node of the same name (conf/model/*.yaml -> model.*).
FILE_GROUPS: tuple[str, ...] = tuple(g for g in GROUPS if g in NODES)
# Keys that are both a group and a top-level value, or mappings that take any key below them.
NOT_DELETABLE_BY_SCHEMA = {"recipe"}
# The fixed-choice keys and the bounds declared on the schema's fields.
CHOICES: dict[str, tuple[str, ...]] = key_info.choices()
RANGES: dict[str, Allowed] = key_info.ranges()
TYPO_LIMITS = {k: s.typo_above for k, s in RANGES.items() if s.typo_above is not None}


def _bounded(*, integer: bool, ge: int | None = None, gt: int | None = None) -> tuple[str, ...]:
    """The keys of one kind whose only bound is this lower one."""
    return tuple(
        k
        for k, s in RANGES.items()
        if (s.ge, s.gt, s.le, s.lt, s.le_key, s.length, s.example)
        == (ge, gt, None, None, None, None, None)
        and (int in (field_type(k), *typing.get_args(field_type(k)))) == integer
    )


POSITIVE_INTS = _bounded(integer=True, ge=1)
COUNTS = _bounded(integer=True, ge=0)
POSITIVE_NUMBERS = _bounded(integer=False, gt=0)
NON_NEGATIVE_NUMBERS = _bounded(integer=False, ge=0)
MAPPING_KEYS = {k for k in KEYS if typing.get_origin(field_type(k)) is dict}
# OmegaConf reads these as booleans (and any integer), so they are not junk for a bool key.
BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "none", "inf", "nan"}


def fields_of(node: str) -> set[str]:
    """Names directly under a node ("" is the top level)."""
    if not node:
        return set(TOP_FIELDS)
    depth = node.count(".") + 1
    return {k.split(".")[depth] for k in KEYS if k.startswith(f"{node}.")}


def kind_of(key: str) -> tuple[str, bool]:
    """("int" | "float" | "bool" | "str" | "list[int]" | ... | "dict", optional)."""
    tp = field_type(key)
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else tp
    origin = typing.get_origin(base)
    if origin is list:
        return f"list[{typing.get_args(base)[0].__name__}]", optional
    if origin is dict:
        return "dict", optional
    return typing.cast(type, base).__name__, optional


def first_unknown_prefix(key: str) -> str | None:
    """The shortest dotted prefix of `key` the schema does not have (what the error names)."""
    parts = key.split(".")
    known = set(KEYS) | set(NODES)
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix not in known:
            return prefix
        if prefix in MAPPING_KEYS or (prefix in KEYS and i < len(parts)):
            return None  # under a mapping (any key) or a leaf: not an unknown-key case
    return None


# --- cases ---


@dataclasses.dataclass(frozen=True)
class Case:
    """Bad overrides; the output must contain at least one of `names`."""

    category: str
    overrides: tuple[str, ...]
    names: tuple[str, ...]
    commands: tuple[str, ...] = COMMANDS
    # Random text: exit 0 is accepted when the overrides turn out to compose a valid config.
    may_be_valid: bool = False
    # Config-file cases: files to write (relative to the data root) before running.
    files: tuple[tuple[str, str], ...] = ()


IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
JUNK_WORD = st.from_regex(r"[a-z][a-z_]{1,10}", fullmatch=True).filter(
    lambda w: w not in BOOL_WORDS
)
QUOTED = st.builds(lambda a, b: f"'{a} {b}'", JUNK_WORD, JUNK_WORD)
FRACTION = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).filter(
    lambda f: not f.is_integer()
)
INTEGRAL_FLOAT = st.integers(-1000, 1000).map(lambda i: f"{i}.0")
SCALAR_INT = st.integers(-(10**6), 10**6).map(str)
LIST = st.lists(st.integers(0, 9), max_size=3).map(lambda xs: f"[{','.join(map(str, xs))}]")
DICT = st.builds(lambda k, v: f"{{{k}:{v}}}", IDENT, st.integers(0, 9))
JUNK_LIST = st.lists(JUNK_WORD, min_size=1, max_size=3).map(lambda xs: f"[{','.join(xs)}]")
FRACTION_LIST = st.lists(FRACTION, min_size=1, max_size=3).map(
    lambda xs: f"[{','.join(map(repr, xs))}]"
)
NESTED_LIST = st.sampled_from(["[[1]]", "[{a:1}]", "[[a,b]]", "[{x:y}]"])
BOOL_LITERAL = st.sampled_from(["true", "false"])

WRONG_VALUES: dict[str, st.SearchStrategy[str]] = {
    "int": st.one_of(
        JUNK_WORD, QUOTED, FRACTION.map(repr), INTEGRAL_FLOAT, BOOL_LITERAL, LIST, DICT
    ),
    "float": st.one_of(JUNK_WORD, QUOTED, BOOL_LITERAL, LIST, DICT),
    "bool": st.one_of(JUNK_WORD, QUOTED, FRACTION.map(repr), LIST, DICT),
    "str": st.one_of(LIST, DICT),
    "list[float]": st.one_of(JUNK_WORD, SCALAR_INT, DICT, JUNK_LIST, NESTED_LIST),
    "list[int]": st.one_of(JUNK_WORD, SCALAR_INT, DICT, JUNK_LIST, FRACTION_LIST, NESTED_LIST),
    "list[str]": st.one_of(JUNK_WORD, SCALAR_INT, DICT, NESTED_LIST),
    "dict": st.one_of(JUNK_WORD, SCALAR_INT, LIST, st.sampled_from(["{A:[1]}", "{A:{b:1}}"])),
}
TYPED_KEYS = tuple(k for k in KEYS if kind_of(k)[0] in WRONG_VALUES)

EDIT_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"


@st.composite
def typo(draw: st.DrawFn, word: str) -> str:
    """One to two character edits (insert, delete, substitute, swap) of `word`, never equal."""
    out = word
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["insert", "delete", "substitute", "swap"]))
        i = draw(st.integers(0, max(0, len(out) - 1)))
        c = draw(st.sampled_from(EDIT_CHARS))
        if op == "insert":
            out = out[:i] + c + out[i:]
        elif op == "delete" and len(out) > 1:
            out = out[:i] + out[i + 1 :]
        elif op == "swap" and i + 1 < len(out):
            out = out[:i] + out[i + 1] + out[i] + out[i + 2 :]
        else:
            out = out[:i] + c + out[i + 1 :]
    return out if out != word else out + draw(st.sampled_from(EDIT_CHARS))


ADD = st.sampled_from(["", "+", "++"])


@st.composite
def unknown_key(draw: st.DrawFn) -> Case:
    """A random identifier at the top level or under a node, set, added or force-added."""
    node = draw(st.sampled_from(("", *NODES)))
    name = draw(IDENT.filter(lambda n: n not in fields_of(node) and n != "hydra"))
    key = f"{node}.{name}" if node else name
    value = draw(st.one_of(SCALAR_INT, JUNK_WORD))
    return Case("unknown-key", (f"{draw(ADD)}{key}={value}",), (key,))


@st.composite
def typo_key(draw: st.DrawFn) -> Case:
    """A real key or node with one or two character edits in one of its parts."""
    real = draw(st.sampled_from(KEYS + NODES))
    parts = real.split(".")
    i = draw(st.integers(0, len(parts) - 1))
    parts[i] = draw(typo(parts[i]))
    key = ".".join(parts)
    prefix = first_unknown_prefix(key)
    if prefix is None or parts[0] == "hydra":
        from hypothesis import reject

        reject()
    value = draw(st.one_of(SCALAR_INT, JUNK_WORD))
    return Case("typo-key", (f"{draw(ADD)}{key}={value}",), (str(prefix),))


@st.composite
def wrong_node(draw: st.DrawFn) -> Case:
    """A real leaf name under a node that lacks it (train.tp), or a key below a value."""
    leaf_key = draw(st.sampled_from(KEYS))
    if draw(st.booleans()) and leaf_key not in MAPPING_KEYS:
        key = f"{leaf_key}.{draw(IDENT)}"  # model.num_layers.x: a value has no keys
        return Case("wrong-node", (f"{draw(ADD)}{key}=1",), (key,))
    leaf = leaf_key.rsplit(".", 1)[-1]
    node = draw(st.sampled_from(NODES).filter(lambda n: leaf not in fields_of(n)))
    key = f"{node}.{leaf}"
    return Case("wrong-node", (f"{draw(ADD)}{key}=1",), (key,))


@st.composite
def wrong_type(draw: st.DrawFn) -> Case:
    key = draw(st.sampled_from(TYPED_KEYS))
    value = draw(WRONG_VALUES[kind_of(key)[0]])
    return Case("wrong-type", (f"{key}={value}",), (key,))


@st.composite
def out_of_range(draw: st.DrawFn) -> Case:
    """0, negatives and past-the-limit values; also zero.stage and the optimizer's numbers."""
    pick = draw(st.integers(0, 11))
    value: object
    if pick == 0:
        key, value = "zero.stage", draw(st.one_of(st.integers(max_value=-1), st.integers(4)))
    elif pick == 1:
        key, value = "optim.lr", draw(st.one_of(st.integers(max_value=0), st.just("-1.5e-3")))
    elif pick == 2:
        key = draw(
            st.sampled_from(
                ["optim.weight_decay", "optim.warmup_steps", "optim.grad_clip", "optim.eps"]
            )
        )
        value = draw(st.one_of(st.integers(max_value=-1), st.just("nan")))
    elif pick == 3:
        key = "optim.betas"
        betas = draw(st.sampled_from([(0.9, 1.0), (-0.1, 0.9), (1.5, 0.5), (0.9, 0.95, 0.99)]))
        value = str(list(betas))
    elif pick == 4:
        key = draw(st.sampled_from(sorted(TYPO_LIMITS)))
        value = draw(st.integers(TYPO_LIMITS[key] + 1, 10**30))
    elif pick == 5:
        key = draw(st.sampled_from(COUNTS))
        value = draw(st.integers(-(10**12), -1))
    elif pick == 6:
        key = draw(st.sampled_from(POSITIVE_NUMBERS + NON_NEGATIVE_NUMBERS))
        value = draw(st.one_of(st.just("nan"), st.just("inf"), FRACTION.map(lambda f: -abs(f))))
        if key in POSITIVE_NUMBERS and draw(st.booleans()):
            value = draw(st.sampled_from(["0", "0.0", "-1"]))
    else:
        key = draw(st.sampled_from(POSITIVE_INTS))
        value = draw(st.one_of(st.just(0), st.integers(-(10**12), -1)))
    return Case("out-of-range", (f"{key}={value}",), (key,), commands=VALIDATING)


@st.composite
def bad_choice(draw: st.DrawFn) -> Case:
    key = draw(st.sampled_from(sorted(CHOICES)))
    allowed = CHOICES[key]
    value = draw(
        st.one_of(
            JUNK_WORD,
            st.sampled_from(allowed).flatmap(typo),
            st.integers(0, 99).map(str),
            st.sampled_from(allowed).map(str.upper),
        ).filter(lambda v: v not in allowed and v.lower() not in BOOL_WORDS)
    )
    return Case("bad-choice", (f"{key}={value}",), (key,))


@st.composite
def bad_group_option(draw: st.DrawFn) -> Case:
    group = draw(st.sampled_from(GROUPS))
    options = compose.group_options(group)
    option = draw(
        st.one_of(st.sampled_from(options).flatmap(typo), IDENT).filter(
            lambda o: o not in options and o.lower() not in BOOL_WORDS
        )
    )
    return Case("bad-group-option", (f"{draw(ADD)}{group}={option}",), (f"no such {group}",))


DELETABLE = tuple(k for k in KEYS if k not in NOT_DELETABLE_BY_SCHEMA)
WEIRD = "=[]{}()'\"$~+@:,.\\ \t\né€☃💥"
TEXT_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")


@st.composite
def malformed(draw: st.DrawFn) -> Case:
    """Broken override syntax, deletes of schema keys, bad interpolations, random text."""
    pick = draw(st.integers(0, 6))
    key = draw(st.sampled_from(TYPED_KEYS))
    if pick == 0:  # ~key deletes a schema key
        text = f"~{draw(st.sampled_from(DELETABLE))}"
        return Case("malformed", (text,), (text[1:],))
    if pick == 1:  # unbalanced brackets and quotes, stray '='
        junk = draw(
            st.sampled_from(["[1,2", "{a:1", "'abc", '"abc', "a=b", "]", "}", "[{]", "'a'b'"])
        )
        return Case("malformed", (f"{key}={junk}",), (key,))
    if pick == 2:  # interpolations that cannot resolve
        ident = draw(IDENT)
        interp = draw(
            st.sampled_from(
                [
                    f"${{zz_{ident}}}",
                    f"${{oc.env:LLMTRAIN_FUZZ_UNSET_{ident.upper()}}}",
                    f"${{{key}}}",
                    f"${{nores_{ident}:x}}",
                    "${oc.decode:'[1'}",
                    f"${{{key.split('.')[0]}}}" if "." in key else f"${{zz_{ident}}}",
                    "${",
                    f"${{{ident}",
                ]
            )
        )
        return Case("malformed", (f"{key}={interp}",), (key,))
    if pick == 3:  # empty keys
        text = draw(st.sampled_from(["=1", "+=1", "++=1", "~=", "~", "=", "+", "~=1", ".=1"]))
        return Case("malformed", (text,), ("is not valid",))
    if pick == 4:  # a non-ASCII or odd character inside a real key
        parts = key.split(".")
        i = draw(st.integers(0, len(parts) - 1))
        j = draw(st.integers(0, len(parts[i])))
        c = draw(st.sampled_from("éß€☃💥 '\"$@:,()[]{}\\"))
        parts[i] = parts[i][:j] + c + parts[i][j:]
        text = ".".join(parts) + "=1"
        bad = first_unknown_prefix(".".join(parts))
        return Case("malformed", (text,), ("is not valid", *((bad,) if bad else ())))
    if pick == 5:  # what click sees as options
        text = f"-{draw(st.sampled_from(['-', '']))}{draw(IDENT)}=1"
        return Case("malformed", (text,), ("No such option",))
    # random text with an '=' somewhere, mixed with brackets, quotes, unicode
    left = draw(st.text(st.one_of(TEXT_CHARS, st.sampled_from(WEIRD)), max_size=12))
    right = draw(st.text(st.one_of(TEXT_CHARS, st.sampled_from(WEIRD)), max_size=12))
    text = f"{left}={right}"
    if text.startswith("-"):
        text = "x" + text
    head = left.lstrip("+~").split(".")[0].split("=")[0]
    names = ("is not valid", *((head,) if head.strip() else ()))
    return Case("malformed", (text,), names, may_be_valid=True)


FAST = st.one_of(unknown_key(), typo_key(), wrong_node(), bad_group_option())
SINGLE = st.one_of(
    unknown_key(),
    typo_key(),
    wrong_node(),
    wrong_type(),
    bad_choice(),
    bad_group_option(),
    malformed(),
    out_of_range(),
)


@st.composite
def combination(draw: st.DrawFn) -> Case:
    """Two to four bad overrides at once: at least one of them must be named."""
    parts = draw(st.lists(SINGLE, min_size=2, max_size=4))
    commands = tuple(c for c in COMMANDS if all(c in p.commands for p in parts))
    if not commands:
        from hypothesis import reject

        reject()
    return Case(
        "combination",
        tuple(o for p in parts for o in p.overrides),
        tuple(n for p in parts for n in p.names),
        commands=commands,
        may_be_valid=all(p.may_be_valid for p in parts),
    )


# --- config files: bad YAML group files and recipes ---

_file_counter = iter(range(10**9))


def _yaml_value(kind: str) -> st.SearchStrategy[Any]:
    junk = JUNK_WORD
    return {
        "int": st.one_of(
            junk, FRACTION, st.lists(st.integers(0, 9), min_size=1), st.just({"a": 1})
        ),
        "float": st.one_of(junk, st.just([1.0]), st.just({"a": 1})),
        "bool": st.one_of(junk, FRACTION, st.just([True])),
        "str": st.one_of(st.just([1, 2]), st.just({"a": "b"})),
        "list[float]": st.one_of(junk, st.just({"a": 1}), st.just(["x", "y"])),
        "list[int]": st.one_of(junk, st.just({"a": 1}), st.just(["x"]), st.just([1.5])),
        "list[str]": st.one_of(junk, st.just({"a": 1}), st.just([[1]])),
        "dict": st.one_of(junk, st.just([1]), st.just({"A": [1]})),
    }[kind]


BROKEN_YAML = st.sampled_from(
    [
        "num: [1, 2\n",
        "\tnum: 1\n",
        "num: 'unclosed\n",
        "a: b: c\n",
        "- 1\nx: 2\n",
        "x: {a: 1\n",
        "x:\n  - 1\n y: 2\n",
        "@x: 1\n",
        "x: *nope\n",
    ]
)


@st.composite
def config_file(draw: st.DrawFn) -> Case:
    """A bad conf/<group>/fuzz_N.yaml or recipes/fuzz_N.yaml, selected on the command line."""
    name = f"fuzz_{next(_file_counter)}"
    is_recipe = draw(st.integers(0, 3)) == 0
    group = "recipe" if is_recipe else draw(st.sampled_from(FILE_GROUPS))
    select = (f"recipe={name}",) if is_recipe else (f"{group}={name}", "~recipe")
    path = f"recipes/{name}.yaml" if is_recipe else f"conf/{group}/{name}.yaml"
    has_name = not is_recipe and "name" in fields_of(group)
    body: dict[str, Any] = {"name": name} if has_name else {}
    pick = draw(st.integers(0, 5))
    text: str
    if pick == 0:  # unknown key (top level of the file; for a recipe also inside a node)
        node = draw(st.sampled_from(NODES)) if is_recipe and draw(st.booleans()) else ""
        where = node if is_recipe else group
        unknown = draw(IDENT.filter(lambda n: n not in fields_of(where) and n != "defaults"))
        if node:
            body[node] = {unknown: 1}
        else:
            body[unknown] = 1
        names: tuple[str, ...] = (f"{where}.{unknown}" if where else unknown,)
        text = _dump(body)
    elif pick == 1:  # wrong type for a typed key
        key = draw(
            st.sampled_from(TYPED_KEYS).filter(lambda k: is_recipe or k.startswith(f"{group}."))
        )
        leaf = key if is_recipe else key.split(".", 1)[1]
        node_body = body
        *parents, last = leaf.split(".")
        for p in parents:
            node_body = node_body.setdefault(p, {})
        node_body[last] = draw(_yaml_value(kind_of(key)[0]))
        names = (key,)
        text = _dump(body)
    elif pick == 2:  # a value that cannot be resolved
        key = draw(
            st.sampled_from(TYPED_KEYS).filter(lambda k: is_recipe or k.startswith(f"{group}."))
        )
        leaf = key if is_recipe else key.split(".", 1)[1]
        body.pop(leaf.split(".")[0], None)  # no duplicate key
        text = _dump(body) + _nested_yaml(leaf, "${zz_nokey}")
        names = (key,)
    elif pick == 3:  # invalid YAML
        text = _dump(body) + draw(BROKEN_YAML)
        names = (name,)
    elif pick == 4:  # not a mapping
        text = draw(st.sampled_from(["- 1\n- 2\n", "42\n", "just text\n", "[a, b]\n"]))
        names = (name,)
    else:  # a defaults list naming what does not exist, or not a list
        if draw(st.booleans()):
            target = draw(st.sampled_from(FILE_GROUPS))
            missing = f"nope_{draw(IDENT)}"
            override = "override " if is_recipe else ""
            text = f"defaults:\n  - {override}/{target}: {missing}\n"
            names = (missing,)
        else:
            text = f"defaults: {draw(st.sampled_from(['3', 'abc', '{a: 1}']))}\n"
            names = (name,)
    return Case("config-file", select, names, files=((path, text),))


def _dump(body: dict[str, Any]) -> str:
    return yaml.safe_dump(body) if body else ""


def _nested_yaml(dotted: str, value: str) -> str:
    lines = []
    for depth, part in enumerate(dotted.split(".")):
        lines.append("  " * depth + f"{part}:")
    lines[-1] += f" '{value}'"
    return "\n".join(lines) + "\n"


CATEGORIES: dict[str, st.SearchStrategy[Case]] = {
    "unknown-key": unknown_key(),
    "typo-key": typo_key(),
    "wrong-node": wrong_node(),
    "wrong-type": wrong_type(),
    "out-of-range": out_of_range(),
    "bad-choice": bad_choice(),
    "bad-group-option": bad_group_option(),
    "malformed": malformed(),
    "combination": combination(),
    "config-file": config_file(),
}


# --- running a case ---


class WouldLaunch(AssertionError):
    """`run` got past preflight: a fuzz case must never get this far."""


def _refuse(*args: object, **kwargs: object) -> typing.NoReturn:
    raise WouldLaunch("run got past preflight (prepare_run_dir/launch was called)")


@dataclasses.dataclass(frozen=True)
class Outcome:
    code: int | None
    output: str


def invoke_in_process(args: list[str]) -> Outcome:
    """The console entry point in this process (tests/cli.py): an exception that escapes it is
    printed with its traceback (exit 1), which `judge` reports."""
    return Outcome(*said(invoke(*args)))


def invoke_subprocess(args: list[str], cwd: Path) -> Outcome:
    """`python -m launcher ARGS` in a child process, as a user runs it."""
    return Outcome(*said(llmtrain(*args, cwd=cwd, env={"COLUMNS": "200"}, timeout=120)))


def command_args(case: Case, command: str) -> list[str]:
    guard = [RUN_GUARD] if command == "run" else []
    return [command, *guard, *case.overrides]


def _is_valid(case: Case, command: str) -> bool:
    """Whether random-text overrides happen to compose (and validate, where the command does)."""
    try:
        composed = compose.compose_config(list(case.overrides))
    except UserError:
        return False
    if command == "show":
        return True
    return not any(v.is_error for v in rules.check(composed.config))


@dataclasses.dataclass(frozen=True)
class Verdict:
    # What is wrong with how the CLI answered ([] when it answered well).
    problems: list[str]
    # Random text that turned out to be a valid configuration (exit 0 accepted).
    valid_input: bool = False


def judge(case: Case, command: str, outcome: Outcome, cwd: Path) -> Verdict:
    """How the CLI answered a bad case."""
    out = []
    if "Traceback" in outcome.output:
        out.append("a traceback was printed")
    leftovers = sorted(p.name for p in cwd.iterdir())
    if leftovers:
        out.append(f"files were written in the working directory: {leftovers}")
        for p in cwd.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    if outcome.code == 0 and case.may_be_valid and command != "run" and _is_valid(case, command):
        return Verdict(out, valid_input=True)
    if outcome.code != 2:
        out.append(f"exit code {outcome.code}, expected 2")
    if not any(name in outcome.output for name in case.names):
        out.append(f"the output names none of {list(case.names)}: {outcome.output[-600:]!r}")
    return Verdict(out)


def check_case(case: Case, command: str, via: str, env: FuzzEnv) -> Verdict:
    """Run one case with one command and judge the answer (removes the files it wrote)."""
    if command not in case.commands:
        command = case.commands[0]
    args = command_args(case, command)
    written = []
    for rel, text in case.files:
        path = env.data_root / rel
        path.write_text(text, encoding="utf-8")
        written.append(path)
    try:
        if via == "subprocess":
            outcome = invoke_subprocess(args, env.cwd)
        else:
            outcome = invoke_in_process(args)
        return judge(case, command, outcome, env.cwd)
    finally:
        for path in written:
            path.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class FuzzEnv:
    cwd: Path
    data_root: Path


@contextmanager
def fuzz_environment(tmp: Path, data_copy: bool) -> Iterator[FuzzEnv]:
    """An empty working directory, a private compose cache, `run` unable to launch, and (with
    data_copy) conf/ and recipes/ copied to a folder the cases may write bad files into."""
    cwd = tmp / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    root = resources.data_root()
    with pytest.MonkeyPatch.context() as mp:
        if data_copy:
            root = tmp / "data"
            if not root.exists():
                shutil.copytree(resources.conf_dir(), root / "conf")
                shutil.copytree(resources.recipes_dir(), root / "recipes")
            copied = root
            mp.setattr(resources, "data_root", lambda: copied)
        mp.setenv("XDG_CACHE_HOME", str(tmp / "cache"))
        mp.delenv("LLMTRAIN_CACHE", raising=False)  # it would win
        mp.delenv("LLMTRAIN_NO_CACHE", raising=False)
        # launch/slurm.py binds prepare_run_dir when first imported: imported here first, it keeps
        # the real one for the tests that run `submit` in this process after these.
        import launcher.launch.slurm  # noqa: F401

        mp.setattr("launcher.launch.local.prepare_run_dir", _refuse)
        mp.setattr("launcher.launch.local.launch", _refuse)
        mp.chdir(cwd)
        yield FuzzEnv(cwd=cwd, data_root=root)


# --- the tests (about 450 cases; the bench runs thousands) ---

VIA = st.just("in-process")
COMMAND = st.sampled_from(COMMANDS)
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzEnv]:
    with fuzz_environment(tmp_path_factory.mktemp("fuzz"), data_copy=False) as e:
        yield e


@pytest.fixture(scope="module")
def file_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzEnv]:
    with fuzz_environment(tmp_path_factory.mktemp("fuzz-files"), data_copy=True) as e:
        yield e


def _property(env: FuzzEnv) -> Callable[[Case, str, str], None]:
    def run(case: Case, command: str, via: str) -> None:
        problems = check_case(case, command, via, env).problems
        assert not problems, f"{case} {command} ({via}): {problems}"

    return run


@pytest.mark.parametrize(
    ("category", "examples"),
    [
        ("unknown-key", 60),
        ("typo-key", 60),
        ("wrong-node", 40),
        ("bad-group-option", 40),
        ("combination", 40),
    ],
)
def test_fast_categories(env: FuzzEnv, category: str, examples: int) -> None:
    """Problems caught before Hydra composes: milliseconds each."""
    check = _property(env)

    @settings(FUZZ, max_examples=examples)
    @given(case=CATEGORIES[category], command=COMMAND, via=VIA)
    def prop(case: Case, command: str, via: str) -> None:
        check(case, command, via)

    prop()


@pytest.mark.parametrize(
    ("category", "examples"),
    [("wrong-type", 25), ("out-of-range", 20), ("bad-choice", 20), ("malformed", 30)],
)
def test_composed_categories(env: FuzzEnv, category: str, examples: int) -> None:
    """Problems found while or after Hydra composes (about 0.15 s each; the suite runs a fixed
    sample of each category, bench/fuzz_cli.py thousands)."""
    check = _property(env)

    @settings(FUZZ, max_examples=examples)
    @given(case=CATEGORIES[category], command=COMMAND, via=VIA)
    def prop(case: Case, command: str, via: str) -> None:
        check(case, command, via)

    prop()


@settings(FUZZ, max_examples=40)
@given(case=config_file(), command=COMMAND, via=VIA)
def test_bad_config_files(file_env: FuzzEnv, case: Case, command: str, via: str) -> None:
    _property(file_env)(case, command, via)


@pytest.mark.integration
@settings(FUZZ, max_examples=6)
@given(case=st.one_of(FAST, wrong_type(), malformed()), command=COMMAND)
def test_real_entry_point_in_a_child_process(env: FuzzEnv, case: Case, command: str) -> None:
    _property(env)(case, command, "subprocess")


# --- regressions: inputs the fuzzer found ---


@pytest.mark.parametrize(
    ("overrides", "named", "commands"),
    [
        # unresolvable interpolations escaped as OmegaConf tracebacks
        (["model.num_layers=${zz_nokey}"], "model.num_layers", COMMANDS),
        (["run.name=${oc.env:LLMTRAIN_FUZZ_UNSET}"], "run.name", COMMANDS),
        (["model.name=${model.name}"], "model.name", COMMANDS),
        (["data.path=${hydra:runtime.cwd}"], "data.path", COMMANDS),
        (["zero.stage=${nores:x}"], "zero.stage", COMMANDS),
        # a key below a list: ValueError traceback from OmegaConf.update
        (["run.secret_env.w=1"], "run.secret_env.w", COMMANDS),
        # an empty key was reported as ": unknown key"
        (["=1"], "is not valid", COMMANDS),
        (["~"], "is not valid", COMMANDS),
        # a key below a value was reported as "model.num_layers={}: ... got dict"
        (["model.num_layers.x=1"], "model.num_layers.x", COMMANDS),
        # deleting a key whose value is null: "Could not delete ... does not exist"
        (["~model.num_kv_heads"], "~model.num_kv_heads: a schema key cannot be deleted", COMMANDS),
        # lists of lists/mappings were accepted for list[str]
        (["run.secret_env=[{a:1}]"], "run.secret_env", COMMANDS),
        (["slurm.extra_sbatch_args=[[a,b]]"], "slurm.extra_sbatch_args", COMMANDS),
        # NaN passed the >= 0 checks; storage bandwidth 0 was a ZeroDivisionError in `plan`
        (["optim.weight_decay=nan"], "optim.weight_decay", VALIDATING),
        (["cluster.storage_write_gbps=0"], "cluster.storage_write_gbps", VALIDATING),
        (["train.log_every=0"], "train.log_every", VALIDATING),
        (["slurm.chain=-1"], "slurm.chain", VALIDATING),
    ],
)
def test_regressions(
    env: FuzzEnv, overrides: list[str], named: str, commands: tuple[str, ...]
) -> None:
    for command in (
        "show" if "show" in commands else "validate",
        "run",
    ):  # in-process, then guarded
        case = Case("regression", tuple(overrides), (named,), commands=commands)
        assert not check_case(case, command, "in-process", env).problems, (overrides, command)


@pytest.mark.parametrize(
    ("path", "text", "named"),
    [
        ("conf/model/fuzz_yaml.yaml", "name: x\nnum_layers: [1\n", "fuzz_yaml.yaml"),
        ("conf/model/fuzz_tab.yaml", "name: x\n\tnum_layers: 3\n", "fuzz_tab.yaml"),
        ("conf/model/fuzz_key.yaml", "name: x\nnum_layerz: 3\n", "model.num_layerz"),
        ("conf/model/fuzz_type.yaml", "name: x\nnum_layers: abc\n", "model.num_layers"),
        ("conf/model/fuzz_interp.yaml", "name: x\nnum_layers: ${nope}\n", "model.num_layers"),
        ("recipes/fuzz_yaml.yaml", "train:\n  steps: [1\n", "fuzz_yaml.yaml"),
        ("recipes/fuzz_scalar.yaml", "42\n", "fuzz_scalar"),
        ("recipes/fuzz_list.yaml", "- 1\n", "fuzz_list"),
        ("recipes/fuzz_defaults.yaml", "defaults: 3\n", "fuzz_defaults"),
        ("recipes/fuzz_nested.yaml", "trian:\n  steps: 1\n", "trian: unknown key"),
        ("conf/model/fuzz_int.yaml", "42\n", "model=fuzz_int"),
        ("conf/model/fuzz_seq.yaml", "- 1\n", "fuzz_seq"),
    ],
)
def test_config_file_regressions(file_env: FuzzEnv, path: str, text: str, named: str) -> None:
    name = Path(path).stem
    select = (f"recipe={name}",) if path.startswith("recipes/") else ("model=" + name, "~recipe")
    case = Case("regression", select, (named,), files=((path, text),))
    for command in ("show", "run"):
        assert not check_case(case, command, "in-process", file_env).problems, (path, command)
