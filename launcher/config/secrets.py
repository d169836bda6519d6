"""Secret environment variables: given to the ranks, never written down.

A secret is an environment variable the training processes need (a tracking service's API key, a
hub token) whose value must not appear in anything llmtrain prints or writes. It is marked by
NAME, never by value:

- ``run.secret_env: [WANDB_API_KEY, ...]``: the value is taken from the environment of the process
  that runs ``llmtrain run`` / ``llmtrain submit`` (a missing one is an error, exit 2, before
  anything is written); a ``cluster.env`` entry of the same name supplies the value instead;
- every ``cluster.env`` key whose name contains one of ``SECRET_WORDS`` (case-insensitive:
  KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL) is a secret too;
- by default, every variable of llmtrain's own environment whose name says it is one (a word of
  the name, split at ``_``, ends in one of ``SECRET_WORDS``: HF_TOKEN, WANDB_API_KEY, SECRET,
  AWS_SECRET_ACCESS_KEY, DB_PASSWORD; not TOKENIZERS_PARALLELISM) is a declared secret for the
  spread check below, when its value has at least ``MIN_CONTAINED`` characters: a config value
  holding it (``run.name=${oc.env:SECRET}``) is refused like one of run.secret_env.

Secret values reach the ranks through the process environment only: the environment of the torchrun
subprocess or the one rank (local runs) or the environment of the ``sbatch`` call, which the job
inherits (``--export=ALL``). In config.yaml, `show` and every other printed or written copy of the
config their value is ``REDACTED``; scripts (launch.sh, job.sbatch) name them and check they are
set, but never export a value. The ranks, which re-read config.yaml, take them from their
environment.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError

# A cluster.env key whose upper-cased name contains one of these is a secret.
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
REDACTED = "***"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_secret_name(name: str) -> bool:
    """Whether a cluster.env key looks secret by its name alone."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def is_secret_env_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret: one of its words (split at
    anything but letters and digits) ends in a SECRET_WORDS word, or its plural (HF_TOKEN,
    WANDB_API_KEY, APIKEY, DB_PASSWORD, GOOGLE_CREDENTIALS; not TOKENIZERS_PARALLELISM)."""
    words = re.split(r"[^A-Z0-9]+", name.upper())
    return any(w.endswith((word, word + "S")) for w in words for word in SECRET_WORDS)


def _names(declared: Iterable[str], env_keys: Iterable[str]) -> list[str]:
    names = [str(n) for n in declared]
    names += sorted(k for k in env_keys if is_secret_name(k))
    return list(dict.fromkeys(names))


def secret_names(cfg: LLMTrainConfig) -> list[str]:
    """Names of the secret variables: run.secret_env in order, then secret-looking cluster.env
    keys (sorted). Raises UserError for a name that is not an environment variable name."""
    names = _names(cfg.run.secret_env, cfg.cluster.env)
    bad = [n for n in names if not _ENV_NAME.fullmatch(n)]
    if bad:
        raise UserError(
            f"run.secret_env: {', '.join(repr(n) for n in bad)} is not an environment variable "
            "name (letters, digits and _, not starting with a digit), e.g. [WANDB_API_KEY]"
        )
    return names


def public_env(cfg: LLMTrainConfig) -> dict[str, str]:
    """cluster.env without its secrets: what scripts may export with their values."""
    hidden = set(secret_names(cfg))
    return {k: v for k, v in cfg.cluster.env.items() if k not in hidden}


def secret_env(cfg: LLMTrainConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The secret values to hand the ranks (through their environment only): cluster.env's value
    for a name it sets, else `environ`'s. Raises UserError naming every missing variable."""
    values, missing = {}, []
    for name in secret_names(cfg):
        value = cfg.cluster.env.get(name, environ.get(name))
        if value is None:
            missing.append(name)
        else:
            values[name] = value
    if missing:
        names = ", ".join(missing)
        raise UserError(
            f"run.secret_env: {names} not set in this environment; secrets are read from the "
            f"environment of `llmtrain` itself and never written down: export {missing[0]}=... "
            "first (or drop it from run.secret_env)"
        )
    return values


def redact(values: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of composed config values with every secret's cluster.env value replaced by
    REDACTED: what config.yaml, `show` and the rest write and print."""
    out = copy.deepcopy(values)
    cluster, run = out.get("cluster"), out.get("run")
    env = cluster.get("env") if isinstance(cluster, dict) else None
    if not isinstance(env, dict) or not env:
        return out
    declared = run.get("secret_env") if isinstance(run, dict) else None
    for name in _names(declared or [], env):
        if name in env:
            env[name] = REDACTED
    return out


# Shorter values are not compared (a 3-character "secret" would match ordinary values by chance);
# values at least this long are also found inside a longer string (`run-${oc.env:KEY}`).
MIN_COMPARED = 4
MIN_CONTAINED = 8


def declared_values(values: dict[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """name -> value of every secret of composed `values` that has a value now: its cluster.env
    entry, else the environment's (run.secret_env names)."""
    cluster, run = values.get("cluster"), values.get("run")
    env = cluster.get("env") if isinstance(cluster, dict) else None
    env = env if isinstance(env, dict) else {}
    declared = run.get("secret_env") if isinstance(run, dict) else None
    found = {}
    for name in _names(declared if isinstance(declared, list) else [], env):
        value = env.get(name, environ.get(name))
        if isinstance(value, str) and len(value) >= MIN_COMPARED and value != REDACTED:
            found[name] = value
    # Secret by name alone (see the module docstring); long values only, so that a short word
    # in a variable named like a secret never matches an ordinary config value by chance.
    for name, value in environ.items():
        if name not in found and len(value) >= MIN_CONTAINED and is_secret_env_name(name):
            found[name] = value
    return found


def spread_problems(values: dict[str, Any], environ: Mapping[str, str]) -> list[str]:
    """Keys of composed `values` that hold a declared secret's value anywhere but its own
    cluster.env entry: pulled in with ``${oc.env:NAME}`` (or typed again) into run.name,
    slurm.job_name, another cluster.env entry... Such a value would reach config.yaml, `show`, a
    job name every user of the cluster can read, and the compose cache. Messages name the key and
    the secret, never the value."""
    secrets = declared_values(values, environ)
    if not secrets:
        return []
    env = (
        values.get("cluster", {}).get("env", {}) if isinstance(values.get("cluster"), dict) else {}
    )
    own = {f"cluster.env.{name}" for name in secrets if isinstance(env, dict) and name in env}
    problems = []

    def holds(text: str, secret: str) -> bool:
        return text == secret or (len(secret) >= MIN_CONTAINED and secret in text)

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")
        elif isinstance(node, str | int | float) and not isinstance(node, bool) and key not in own:
            text = str(node)
            for name, secret in secrets.items():
                if holds(text, secret):
                    problems.append(
                        f"{key}: holds the value of the secret {name} (run.secret_env or a "
                        f"secret-looking cluster.env name), which would be written to config.yaml, "
                        "shown, and put in job names and scripts; secrets reach the ranks only "
                        f"through their environment: drop it from {key}"
                        + (
                            f", or add {key.split('.')[-1]} to run.secret_env"
                            if key.startswith("cluster.env.")
                            else " (the ranks read $" + name + " themselves)"
                        )
                    )

    walk(values, "")
    return problems


def has_secret_values(values: dict[str, Any]) -> bool:
    """Whether composed values hold a secret's value (so they must not be stored anywhere)."""
    return redact(values) != values


def mask_secret_overrides(message: str, overrides: Iterable[str]) -> str:
    """`message` (an error about the overrides) with the value of every secret-looking
    ``cluster.env.NAME=VALUE`` override replaced by REDACTED."""
    typed = re.match(r"cluster\.env\.(\w+): Cannot convert '(\w+)'", message)
    if typed and is_secret_name(typed[1]):  # OmegaConf quotes the parsed value: leave it out
        return f"cluster.env.{typed[1]}: expected a string, got a {typed[2]} ({REDACTED})"
    for text in overrides:
        key, sep, value = text.partition("=")
        parts = key.lstrip("+~").split(".")
        if not sep or len(parts) != 3 or parts[:2] != ["cluster", "env"]:
            continue
        if is_secret_name(parts[2]) and ".".join(parts) in message:
            message = _mask_value(message, value)
    return message


_ENV_REFERENCE = re.compile(r"oc\.env\s*:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")


def mask_environment_values(
    message: str, overrides: Iterable[str], environ: Mapping[str, str]
) -> str:
    """`message` with the value of every environment variable that the overrides read with
    ``${oc.env:NAME}`` or declare in run.secret_env replaced by REDACTED: an error about a value
    pulled from the environment (a secret put into train.steps) quotes it."""
    names: set[str] = set()
    for text in overrides:
        names.update(_ENV_REFERENCE.findall(text))
        key, sep, value = text.partition("=")
        if sep and key.lstrip("+~") == "run.secret_env":
            names.update(_ENV_NAME.findall(value))
    for name in sorted(names):
        found = environ.get(name)
        if found is not None and len(found) >= MIN_COMPARED:
            message = _mask_value(message, found)
    return message


def _shown_forms(value: str) -> set[str]:
    """Every way an error message may quote `value`: as is, unquoted, repr'd, escaped
    (a newline as \\n), and each of its lines alone (parsers stop at a newline)."""
    forms: set[str] = set()
    for text in (value, value.strip("'\"")):
        escaped = text.encode("unicode_escape").decode("ascii")
        forms |= {text, repr(text), repr(text)[1:-1], escaped}
        forms |= {line.strip() for line in text.splitlines()}
    return {f for f in forms if f}


def _mask_value(message: str, value: str) -> str:
    for shown in sorted(_shown_forms(value), key=len, reverse=True):
        message = message.replace(shown, REDACTED)
    return message


def secret_status(names: Iterable[str], environ: Mapping[str, str]) -> str:
    """One log line saying which secrets a process received: names only."""
    names = list(names)
    have = [n for n in names if n in environ]
    lacking = [n for n in names if n not in environ]
    line = f"secret env: {', '.join(have) or 'none'} set"
    return line + (f"; MISSING: {', '.join(lacking)}" if lacking else "")


def check_lines(names: Iterable[str], where: str) -> list[str]:
    """Bash lines that stop a script when a secret is not in its environment (names only; they
    are checked environment variable names, safe unquoted)."""
    names = list(names)
    if not names:
        return []
    return [
        f"# Secrets (run.secret_env, secret-looking cluster.env names), not written here: {where}.",
        f"for name in {' '.join(names)}; do",
        '  if [ -z "${!name+x}" ]; then',
        f'    echo "llmtrain: secret $name is not set ({where})" >&2',
        "    exit 2",
        "  fi",
        "done",
    ]
