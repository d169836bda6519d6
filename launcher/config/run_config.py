"""A run directory's config.yaml read back by this llmtrain, which may be newer than the one that
wrote it (a run resumed, requeued or exported after an upgrade). No torch import.

The rule, the same for every reader:
- a key this llmtrain has and the file lacks (added since the run started) takes the schema
  default: a key is only ever added with a default that keeps the old behaviour;
- a key the file has and this llmtrain does not (removed or renamed since) is dropped only when
  it is listed in HARMLESS_REMOVED (with why it never changed training); any other such key makes
  resuming refuse with one message naming every key (`refusal`): training without it could
  differ from the run so far. Export, which reads the model alone, tolerates them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher import fsio, runfiles
from launcher.config.composition.compose import config_from_values
from launcher.config.composition.config_file import render_value
from launcher.config.composition.overrides import override_key
from launcher.config.schema import LLMTrainConfig
from launcher.config.schema.keys import dataclass_of, schema_fields
from launcher.errors import UserError
from launcher.rundir import RunDir

# Keys that older llmtrain versions wrote and this one no longer has, which never changed how the
# ranks train: dropped silently when a run is resumed. Key -> why it is harmless.
HARMLESS_REMOVED: dict[str, str] = {
    "model.dropout": (
        "read by the planner only (dropout masks); the trainer used model.attention_dropout and "
        "model.hidden_dropout, which replaced it"
    ),
}


@dataclass(frozen=True)
class StoredConfig:
    """config.yaml as this llmtrain reads it."""

    path: Path
    # This llmtrain's keys: the file's values, the schema default for keys the file lacks.
    values: dict[str, Any]
    missing: tuple[str, ...]  # dotted keys that took the default
    unknown: dict[str, Any]  # dotted key -> value: keys this llmtrain does not have
    harmless: tuple[str, ...]  # dotted keys dropped as HARMLESS_REMOVED

    @property
    def config(self) -> LLMTrainConfig:
        return config_from_values(self.values)

    def refusal(self) -> str | None:
        """Why this run cannot be resumed by this llmtrain (None: it can)."""
        if not self.unknown:
            return None
        keys = ", ".join(f"{key}={_short(value)}" for key, value in self.unknown.items())
        return (
            f"{self.path}: this run was started by an llmtrain whose configuration had "
            f"key(s) this llmtrain does not know: {keys}; resuming without them could change the "
            "training. Start a new run (the same command with --fresh), or, if "
            f"the key does not matter to this run, delete it from {self.path} and run again"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _default(cls: type, name: str) -> Any:
    """The schema default of field `name` of dataclass `cls`, as config.yaml would hold it."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                value: Any = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                raise AssertionError(f"schema field {cls.__name__}.{name} has no default")
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                return dataclasses.asdict(value)
            return value
    raise AssertionError(f"no field {name} in {cls.__name__}")


def read_values(values: dict[str, Any], path: Path) -> StoredConfig:
    """Fill defaults into / sort out unknown keys of config.yaml's `values`."""
    missing: list[str] = []
    unknown: dict[str, Any] = {}
    harmless: list[str] = []

    def walk(node: dict[str, Any], cls: type, prefix: str) -> dict[str, Any]:
        fields = schema_fields(cls)
        out: dict[str, Any] = {}
        for name, tp in fields.items():
            sub = dataclass_of(tp)
            if name not in node:
                missing.append(prefix + name)
                out[name] = _default(cls, name)
            elif sub is not None and isinstance(node[name], dict):
                out[name] = walk(node[name], sub, f"{prefix}{name}.")
            else:
                out[name] = node[name]
        for name, value in node.items():
            if name not in fields:
                key = prefix + str(name)
                if key in HARMLESS_REMOVED:
                    harmless.append(key)
                else:
                    unknown[key] = value
        return out

    filled = walk(values, LLMTrainConfig, "")
    return StoredConfig(path, filled, tuple(missing), unknown, tuple(harmless))


# A run's config.yaml is a few KB; anything this large was not written by llmtrain.
MAX_BYTES = 4 << 20


def read_run_config(path: Path) -> StoredConfig:
    """A run's config.yaml (UserError when it is not one this llmtrain can read)."""
    try:
        data = fsio.read_bytes(path)
        if len(data) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        values = yaml.safe_load(data.decode("utf-8"))
        if not isinstance(values, dict):
            raise ValueError("not a mapping")
        return read_values(values, path)
    except RecursionError:  # PyYAML composes nested collections recursively
        raise UserError(
            f"{path}: not a config.yaml this llmtrain reads (nested too deeply)"
        ) from None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: not a config.yaml this llmtrain reads ({exc})") from None


def resumable_config(path: Path) -> StoredConfig:
    """config.yaml of a run this llmtrain is to continue: UserError (exit 2) naming every key it
    does not know unless harmless (see the module docstring)."""
    stored = read_run_config(path)
    problem = stored.refusal()
    if problem is not None:
        raise UserError(problem)
    return stored


# --- a resume with another configuration ----------------------------------------------------
#
# Resuming continues the run's trajectory (its weights, optimizer state, data order and schedule),
# so the configuration that matters is the one the run recorded (config.yaml). The command that
# resumes it composes its configuration anew; a key it does not set takes the recipe's value,
# which may not be the one the run was started with (`train.steps=300` on the first command,
# nothing on the second: the recipe's 200). A difference in a key listed here never changes what
# is computed and is accepted (and recorded in the run's config_history.jsonl); any other key
# (model, data, batch, optimizer, schedule, steps, seed, precision, layout, backend, and a key
# this list does not know yet) is refused unless the user accepts it (`--allow-config-change`).
RESUME_FREE: tuple[str, ...] = (
    "run",  # the run's name and root (the folder found), secret variable names
    "checkpoint",  # cadence, retention, resume itself
    "launcher",
    "slurm",  # scheduling: partition, time, requeue, containers
    "logging",  # trackers
    "train.log_every",
    "train.eval_every",  # evaluation draws no RNG and no gradients (launcher.train.evaluation)
    "train.eval_steps",
    "train.hang_timeout_s",
    "train.init_from",  # read only when a run has no checkpoint: a resume ignores it
    "train.max_nonfinite_skips",  # health policy: what happens to a non-finite step
    "train.loss_spike_window",
    "train.loss_spike_zscore",
    "backend.megatron_path",
    "cluster.name",
    "cluster.env",
    "cluster.profile",  # planner inputs: prices, bandwidths, power cap, SLURM's GPU request
    "cluster.intra_node_bandwidth_gbps",
    "cluster.inter_node_bandwidth_gbps",
    "cluster.price_per_gpu_hour",
    "cluster.storage_write_gbps",
    "cluster.power_limit_w",
    "cluster.gpu_request",
)
ALLOW_CHANGE_FLAG = "--allow-config-change"


def changes_trajectory(key: str) -> bool:
    """Whether a different value of dotted `key` makes a resumed run compute something else."""
    return not any(key == free or key.startswith(free + ".") for free in RESUME_FREE)


@dataclass(frozen=True)
class Change:
    key: str
    old: Any  # as the run recorded it (config.yaml); None where the key was absent
    new: Any
    trajectory: bool

    def line(self) -> str:
        return f"{self.key}: {_short(self.old)} -> {_short(self.new)}"


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + str(key)] = value
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Every dotted key whose value differs between the run's recorded configuration `old` and
    `new` (both as config.yaml holds them), trajectory changes first, then by key."""
    a, b = _flat(_plain(old)), _flat(_plain(new))
    found = [
        Change(key, a.get(key), b.get(key), changes_trajectory(key))
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]
    return sorted(found, key=lambda c: (not c.trajectory, c.key))


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """The value as YAML would give it back (tuples as lists)."""
    out = yaml.safe_load(yaml.safe_dump(values))
    return out if isinstance(out, dict) else {}


def override_value(value: Any) -> str:
    """`value` written as a Hydra command-line override value (key=VALUE): a plain word as it is,
    anything else as ``config_file.render_value`` writes it (the one place for Hydra's quoting)."""
    plain = isinstance(value, str) and value != "" and value[0] not in "-+"
    if plain and all(c.isalnum() or c in "_-./:+@" for c in value):
        return str(value)
    return render_value(value)


def restoring_overrides(overrides: tuple[str, ...], changes: list[Change]) -> list[str]:
    """`overrides` with each trajectory change set back to the run's value (replacing the key's
    own override, if any; train.steps/train.tokens given as the one the run had)."""
    from launcher.config.schema.keys import BUDGET_PARTNER

    back = {c.key: c.old for c in changes if c.trajectory}
    kept = [o for o in overrides if override_key(o) not in back]
    for key, partner in BUDGET_PARTNER.items():  # one of the two is set: name that one alone
        if back.get(key, 0) is None and back.get(partner) is not None:
            del back[key]
    return kept + [f"{key}={override_value(value)}" for key, value in back.items()]


# --- a resume's staged files (launcher.rundir names them) -------------------------------------
def accept_resume(run: RunDir) -> None:
    """Rank 0, once every rank loaded the checkpoint with config.next.yaml: the resume's line
    (config_history.next.jsonl, written by the launcher) is appended to config_history.jsonl,
    then config.next.yaml becomes config.yaml, atomically (a rename within the run directory).
    Appending goes first: a crash between the two records a change that the next resume makes
    again, never a change left unrecorded. A history that is not a regular file is an OSError
    (or a ValueError for the staged line): the resume stops, config.yaml as it was."""
    if os.path.lexists(run.pending_history):
        line = runfiles.read_bytes(run.pending_history)
        with fsio.open_append(run.config_history, root=run.root, binary=True) as f:
            f.write(line if line.endswith(b"\n") else line + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.unlink(run.pending_history)
    fsio.check_inside(run.config, run.root)
    os.replace(run.pending_config, run.config)
    fsio.fsync_dir(run.root)


def drop_pending(run: RunDir) -> None:
    """Remove a resume's staged files (config.next.yaml, config_history.next.jsonl): the resume
    was refused, failed, or is not one."""
    for path in (run.pending_config, run.pending_history):
        if os.path.lexists(path):
            os.unlink(path)


__all__ = [
    "ALLOW_CHANGE_FLAG",
    "HARMLESS_REMOVED",
    "RESUME_FREE",
    "Change",
    "StoredConfig",
    "accept_resume",
    "changes_trajectory",
    "config_changes",
    "drop_pending",
    "override_value",
    "read_run_config",
    "read_values",
    "restoring_overrides",
    "resumable_config",
]
