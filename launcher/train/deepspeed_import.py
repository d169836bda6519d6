"""Importing DeepSpeed without what it imports for nothing.

``deepspeed/autotuning/autotuner.py`` (v0.19.8) imports mlflow whenever it is installed (the
`mlflow` extra, and the dev extra, install it), for its autotuning runs only, which llmtrain never
starts; `import deepspeed` imports that module on the way to ``deepspeed.runtime.config``. mlflow
took 1.9 of DeepSpeed's 3.9 CPU seconds of import here (python -X importtime), paid by every rank
and every `export` of a DeepSpeed checkpoint. Hidden while DeepSpeed imports, it is imported by
the one user that needs it, ``logging.mlflow`` (``launcher.train.reporting``), as before.

DeepSpeed's Muon optimizer module (``deepspeed/runtime/zero/muon/``, v0.19.8) is imported by every
ZeRO 1-2 engine (``stage_1_and_2.average_tensor``) and by ``deepspeed.initialize``'s optimizer
check (``zero.utils.is_zero_supported_optimizer``); its three update kernels are decorated with
``torch.compile`` when the module is imported, which imports torch's inductor: 0.9 CPU s a rank
(measured on a ZeRO-1 rank of the 2-core box, 1.26 -> 0.35 s from the launch to the end of 4 tiny
steps), for an optimizer llmtrain never builds (``optim.name`` offers none of DeepSpeed's). So
that module is imported once here with ``torch.compile`` standing in as the identity, then
restored: its kernels are plain eager functions, never called by llmtrain's optimizers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


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
    import_muon_uncompiled()
    module: ModuleType = deepspeed
    return module


def _identity_compile(model: Any = None, **_: Any) -> Any:
    """``torch.compile``'s two forms, compiling nothing: ``compile(fn)``, ``compile(**kw)(fn)``."""
    if model is not None:
        return model
    return lambda fn: fn


def import_muon_uncompiled() -> None:
    """DeepSpeed's Muon module, imported with ``torch.compile`` as the identity (module docstring);
    nothing where it is imported already or this DeepSpeed has none."""
    if MUON_MODULE in sys.modules:
        return
    import torch

    compile_: Callable[..., Any] = torch.compile
    torch.compile = _identity_compile
    try:
        importlib.import_module(MUON_MODULE)
    except ImportError:
        pass
    finally:
        torch.compile = compile_
