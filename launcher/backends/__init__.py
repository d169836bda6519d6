"""What each training backend runs: one declarative table per engine (see ``common``)."""

from launcher.backends.common import (
    Backend,
    Refusal,
    all_backends,
    expert_span,
    expert_span_names,
    get_backend,
    launch_refusal,
    planning_preset_needs,
    raw_refusals,
    refusals,
    refuses,
    runnable_by,
)

__all__ = [
    "Backend",
    "Refusal",
    "all_backends",
    "expert_span",
    "expert_span_names",
    "get_backend",
    "launch_refusal",
    "planning_preset_needs",
    "raw_refusals",
    "refusals",
    "refuses",
    "runnable_by",
]
