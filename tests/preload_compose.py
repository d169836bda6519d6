"""Imported by the fork server of tests/elastic.py (PRELOAD): Hydra composes the default
configuration there, so a rank forked from it that composes its own configuration (a miss of the
on-disk compose cache: every new override list, and all of them in a fresh CI home) finds Hydra's
config repository and structured schemas built, and the default recipe's composed tree kept
(launcher/config/composition/hydra_tree.py: the second composition keeps it). Measured with an
empty cache, tests/integration/test_torch_engine.py::test_layout_trains (10 launches, 34 forked
ranks): 52.3 -> 38.2 CPU s in the ranks from the first composition alone; a cold Hydra
composition costs ~0.9 CPU s, a warm one ~0.12 s, one from the kept tree ~0.02 s."""

from __future__ import annotations

import os

from launcher.config.composition.compose import compose_config

_before = os.environ.get("LLMTRAIN_NO_CACHE")
os.environ["LLMTRAIN_NO_CACHE"] = "1"  # through Hydra itself, not the on-disk cache
try:
    compose_config([])
    compose_config(["train.steps=1"])  # the same group choices again: the tree is kept
finally:
    if _before is None:
        del os.environ["LLMTRAIN_NO_CACHE"]
    else:
        os.environ["LLMTRAIN_NO_CACHE"] = _before
