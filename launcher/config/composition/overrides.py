"""What a command-line override names: the one reading of ``key=value`` that the provenance,
``--config`` files, the verdict and the search share.

Hydra's override grammar (hydra.cc, "Override grammar"): ``key=value`` sets a value or chooses a
group's option, ``+key=value`` adds, ``++key=value`` adds or overrides, ``~key`` (or ``~key=value``)
deletes; ``group@package=option`` places a group's option at another package.
"""

from __future__ import annotations


def override_key(text: str) -> str:
    """The key an override names, without its ``+``/``++``/``~`` prefix or its value:
    'parallel.tp' for '++parallel.tp=8', 'model' for 'model=llama3-8b', 'model@x' for
    'model@x=gpt2'."""
    return text.split("=", 1)[0].lstrip("+~").strip()


def is_group_choice(text: str) -> bool:
    """Whether the override chooses an option (``model=llama3-8b``) rather than setting a dotted
    key (``parallel.tp=8``) or deleting one (``~model``)."""
    return "." not in override_key(text) and "=" in text
