"""Imported by the fork server of tests/elastic.py (PRELOAD): DeepSpeed, imported once there, so
that each rank forked from it starts without importing it again (~1.7 CPU s a rank on the 2-core
box). The ranks of those launches run on the CPU (they set DS_ACCELERATOR=cpu themselves): the
same accelerator is named here before DeepSpeed looks for one."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

try:
    from launcher.train.deepspeed_import import import_deepspeed

    import_deepspeed()
except ImportError:  # the train extra without DeepSpeed: nothing to preload
    pass
