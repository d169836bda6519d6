"""Importing DeepSpeed without what it imports for nothing.

``deepspeed/autotuning/autotuner.py`` (v0.19.8) imports mlflow whenever it is installed (the
`mlflow` extra, and the dev extra, install it), for its autotuning runs only, which llmtrain never
starts; `import deepspeed` imports that module on the way to ``deepspeed.runtime.config``. mlflow
took 1.9 of DeepSpeed's 3.9 CPU seconds of import here (python -X importtime), paid by every rank
and every `export` of a DeepSpeed checkpoint. Hidden while DeepSpeed imports, it is imported by
the one user that needs it, ``logging.mlflow`` (``launcher.train.reporting``), as before.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_deepspeed() -> ModuleType:
    """``deepspeed``, imported (once) with mlflow out of sight of its autotuner."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hidden = "mlflow" not in sys.modules
    if hidden:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` -> ImportError
    try:
        import deepspeed
    finally:
        if hidden:
            del sys.modules["mlflow"]
    module: ModuleType = deepspeed
    return module
