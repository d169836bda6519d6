"""Where llmtrain keeps what it can make again: one root folder, one precedence.

The root is ``$LLMTRAIN_CACHE`` when set, else ``$XDG_CACHE_HOME/llmtrain`` (the XDG Base
Directory Specification's user cache folder), else ``~/.cache/llmtrain`` (that specification's
default for an unset XDG_CACHE_HOME). Under it:

    compose/            composed configurations (launcher.config.composition.compose_cache)
    profiles/           measured GPU profiles (launcher.plan.hardware.profile; $LLMTRAIN_PROFILE_DIR
    moves
                        only this folder)
    corpus-stdlib-v1/   the built-in datasets, prepared on first use (launcher.data.builtin_corpus,
    chat-tiny-v1/       launcher.data.chat.builtin_chat)
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$LLMTRAIN_CACHE, else $XDG_CACHE_HOME/llmtrain, else ~/.cache/llmtrain (an empty variable
    counts as unset, as the XDG specification says of XDG_CACHE_HOME)."""
    explicit = os.environ.get("LLMTRAIN_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "llmtrain"
