"""How sbatch reads a batch script's ``#SBATCH`` lines and expands an ``--output`` pattern, modelled
for tests from SLURM's own sources (read at tags slurm-22-05-8-1 and master, 2026-11; same rules):

- src/sbatch/opt.c ``_opt_batch_script`` and ``get_argument``: directives are read from the top of
  the script until the first line that is neither blank nor a comment. Each ``#SBATCH`` line is
  split into words at unquoted whitespace; single and double quotes group characters (the quote
  characters are dropped); a backslash takes the next character literally, inside quotes too
  (unlike a shell: ``'a\\b'`` reads as ``ab``); an unquoted ``#`` ends the line; an unmatched quote
  is a fatal error. No variable, command or glob expansion: sbatch is not a shell.
- src/slurmd/common/fname.c ``fname_create`` / ``remove_path_slashes`` (the ``filename pattern``
  section of sbatch(1)): ``%%`` is one ``%``, ``%j`` the job id; a pattern holding any backslash
  is taken literally, backslashes removed, nothing expanded.

Checked against the real sbatch of the test cluster (slurm-wlm 22.05.8): job names with spaces,
single and double quotes, ``#`` and backslashes came back as this model predicts.
"""

from __future__ import annotations

import re


class Unreadable(ValueError):
    """sbatch would stop with a fatal error on this line."""


def _word(text: str, start: int) -> tuple[str | None, int]:
    """The next word of an ``#SBATCH`` line from `start`: (word, where reading stopped); None when
    the line has no more words (its end, or a comment)."""
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    chars: list[str] = []
    quote = ""
    escaped = False
    while i < len(text) and (quote or not text[i].isspace()):
        ch = text[i]
        i += 1
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
            continue
        elif quote:
            if ch == quote:
                quote = ""
                continue
        elif ch in "'\"":
            quote = ch
            continue
        elif ch == "#":
            i -= 1
            break
        chars.append(ch)
    if quote:
        raise Unreadable(f"unmatched {quote} in {text!r}")
    return ("".join(chars) if chars else None), i


def sbatch_options(script: str) -> list[str]:
    """The command-line words sbatch takes from `script`'s ``#SBATCH`` lines, in order."""
    words: list[str] = []
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            rest, at = line[len("#SBATCH") :], 0
            while True:
                word, at = _word(rest, at)
                if word is None:
                    break
                words.append(word)
        elif line.strip() and not line.lstrip().startswith("#"):
            break  # the first command: sbatch reads no further
    return words


def sbatch_option(script: str, name: str) -> str:
    """The value of ``--NAME=VALUE`` as sbatch reads it from `script` (the last one given)."""
    values = [w.split("=", 1)[1] for w in sbatch_options(script) if w.startswith(f"--{name}=")]
    assert values, f"no --{name}= among {sbatch_options(script)}"
    return values[-1]


def output_path(pattern: str, job_id: str) -> str:
    """The file a ``--output``/``--error`` pattern names for job `job_id`: ``%j`` is the job id,
    ``%%`` one ``%``, the other replacement symbols (``%x`` the job name, ``%N`` the node, ...,
    with an optional zero-padding width) stand for values this model writes as ``<x>``, ``<N>``."""
    if "\\" in pattern:  # taken literally: two backslashes are one, a lone one is dropped
        return re.sub(r"\\(\\?)", r"\1", pattern)

    def symbol(found: re.Match[str]) -> str:
        width, letter = found.groups()
        if letter == "%":
            return "%"
        return job_id.zfill(int(width or 0)) if letter == "j" else f"<{letter}>"

    return re.sub(r"%(\d*)([%aAjJnNstux])", symbol, pattern)
