"""One verdict for `validate`, `run --dry-run` and `submit --dry-run`.

``assess(overrides)`` collects every problem in one pass, in one list: configuration errors
(unknown keys, types, choices: each bad override is set aside and the rest composed again, so one
mistake does not hide the next), the validation rules' arithmetic and the configured backend's
refusals (launcher/backends/). When that list has no error it plans the configuration and
records, for `run` (this machine) and `submit` (a SLURM cluster), why the command would still
refuse it (``launch.preflight.launch_problems``): a plan/render-only backend (a planning preset),
this machine's hardware, missing data, a predicted memory overflow.

The three commands print this same verdict. ``exit_code(command)``: 2 when the list has an error
(all three), or when that command would refuse (validate names each such refusal as a note);
0 otherwise. No process is started and nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.backends import all_backends, launch_refusal, planning_preset_needs, runnable_by
from launcher.config.composition.compose import Composed, compose_config
from launcher.config.composition.overrides import override_key
from launcher.config.schema import LLMTrainConfig
from launcher.errors import ConfigError, UserError
from launcher.plan.planner import Plan, make_plan
from launcher.validate.rules import ERROR, Violation, check, passes, value_range_problems

COMMANDS = ("run", "submit")


@dataclass(frozen=True)
class Verdict:
    overrides: tuple[str, ...]
    composed: Composed | None  # None when no configuration could be composed at all
    violations: tuple[Violation, ...]  # errors first
    notes: tuple[str, ...] = ()
    # command -> why it would refuse a valid configuration (empty when invalid: errors come first)
    refusals: dict[str, tuple[str, ...]] = field(default_factory=dict)
    plan: Plan | None = None

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.is_error]

    @property
    def valid(self) -> bool:
        return not self.errors

    def exit_code(self, command: str = "validate") -> int:
        if not self.valid or self.refusals.get(command):
            return 2
        return 0


def _problem_key(problem: str) -> str:
    """The key a composition problem names first ('parallel.tp=abc: expected ...')."""
    return problem.split(":", 1)[0].split("=", 1)[0].split(" ", 1)[0].strip()


def compose_collecting(overrides: Sequence[str]) -> tuple[Composed | None, list[Violation]]:
    """Compose, setting aside each override a problem names and composing the rest again, so that
    every bad override is reported. A bad group or recipe choice (no '.' in its key) leaves no
    configuration to check the rules on: None is returned with the problems."""
    remaining = list(overrides)
    found: list[Violation] = []
    complete = True
    for _ in range(len(remaining) + 1):
        try:
            composed = compose_config(remaining)
        except ConfigError as exc:
            unparsed = set(exc.unparsed)
            keys = {_problem_key(p) for p in exc.problems}
            seen = {v.message for v in found}
            found += [
                Violation("config", ERROR, () if unparsed else (_problem_key(p),), p)
                for p in dict.fromkeys(exc.problems)
                if p not in seen
            ]
            # A problem names a key or one of its parents (`paralel: unknown key` for
            # `paralel.tp=2`): every override under it is set aside; an override that is no
            # key=value at all (a bare word) is named by the error itself.
            culprits = [
                o
                for o in remaining
                if o in unparsed
                or any(override_key(o) == k or override_key(o).startswith(f"{k}.") for k in keys)
            ]
            if not culprits:
                return None, found
            # A bare word may have meant a group choice or a recipe (`gpt-7b`): what composes
            # without it is not known to be what was asked for, as after a bad choice.
            complete = complete and all(
                "." in override_key(o) and o not in unparsed for o in culprits
            )
            remaining = [o for o in remaining if o not in culprits]
            continue
        if not complete:
            # A bad group or recipe choice: the configuration composed without it is not the one
            # the user asked for. The value ranges of the keys given still stand, and so do the
            # layout rules' errors on keys given whose keys the bad choice does not set (cp=3 is
            # reported beside cluster=h100, not once that is fixed).
            given = {override_key(o) for o in remaining}
            failed = {override_key(o) for o in overrides if o not in remaining}
            bad_groups = {k for k in failed if "." not in k}
            if any(_names_a_recipe(o) for o in overrides if o not in remaining):
                bad_groups.add("recipe")  # `gpt-7b` for recipe=gpt-7b
            if "recipe" in bad_groups:  # any key may come from the recipe: ranges only
                judged = value_range_problems(composed.config)
                found += [v for v in judged if v.is_error and set(v.keys) <= given]
            else:
                seen = {v.message for v in found}
                found += [
                    v
                    for v in check(composed.config)
                    if v.is_error
                    and set(v.keys) & given
                    and not any(k.split(".")[0] in bad_groups for k in v.keys)
                    and v.message not in seen
                ]
        return (composed if complete else None), found
    return None, found


def _names_a_recipe(override: str) -> bool:
    """A bare word that is a recipe's name (`llmtrain validate gpt-7b`)."""
    from launcher.config.composition.compose import group_options

    return "=" not in override and override.lstrip("+~") in group_options("recipe")


def assess(overrides: Sequence[str], *, force: bool = False) -> Verdict:
    """The verdict on these overrides (see the module docstring). `force`: a predicted memory
    overflow does not make run/submit refuse (their --force)."""
    from launcher.launch.preflight import launch_problems

    overrides = tuple(overrides)
    composed, found = compose_collecting(overrides)
    if composed is None:
        return Verdict(overrides, None, tuple(found))
    violations = found + check(composed.config)
    violations.sort(key=lambda v: v.severity != ERROR)
    cfg = composed.config
    notes: list[str] = list(composed.notes)  # what model.from_hf did not carry over
    if any(v.is_error for v in violations):
        return Verdict(
            overrides,
            composed,
            tuple(violations),
            (*composed.notes, *agreed_values(cfg, violations)),
        )
    preset = launch_refusal(cfg)
    if preset:
        notes.append(f"planning preset: run/submit need {planning_preset_needs(cfg)} ({preset})")
    plan = make_plan(cfg, accept=passes)
    refusals = {
        command: tuple(launch_problems(cfg, plan, local=command == "run", force=force))
        for command in COMMANDS
    }
    for command, problems in refusals.items():
        notes += [f"`llmtrain {command}` would refuse: {p}" for p in problems if p != preset]
    return Verdict(overrides, composed, tuple(violations), tuple(notes), refusals, plan)


def with_resume(
    found: Verdict, command: str, *, fresh: bool = False, allow_config_change: bool = False
) -> Verdict:
    """`found` (valid) with what `command` (run | submit) decides on the run directory its
    configuration names, as `run` decides it (launch.resume_refusal.resume_of): a refused resume
    is one more refusal, worded as `run` words it (the changes, the command that resumes the run
    as it was, --allow-config-change, --fresh); a resume, or a new folder for `fresh`, a note."""
    from launcher.launch.local import fresh_dir, run_dir_for
    from launcher.launch.resume_decision import refusal_before_resume
    from launcher.launch.resume_refusal import Resume, resume_of
    from launcher.render.run_files import LOCAL, SLURM
    from launcher.rundir import RunDir

    composed = found.composed
    if composed is None or not found.valid:
        return found
    try:
        run_dir = run_dir_for(composed).resolve()
    except (UserError, OSError):  # a run.name the verdict refuses already
        return found
    word = f"`llmtrain {command}`"
    if fresh and run_dir.exists():
        note = f"{word} would start a new run in a new folder, {fresh_dir(run_dir)} (--fresh)"
        return replace(found, notes=(*found.notes, note))
    mode = LOCAL if command == "run" else SLURM
    refused = refusal_before_resume(RunDir(run_dir), composed, mode)
    try:
        resume = resume_of(RunDir(run_dir), composed, mode, allow_config_change=allow_config_change)
    except UserError as exc:  # a config.yaml this llmtrain cannot resume from
        resume = Resume([], str(exc))
    if refused is not None:  # an unreadable run file, checkpoint.resume=false over a run
        resume = Resume([], str(refused))
    if resume is None:
        return found
    if resume.refusal is not None:
        refusals = {**found.refusals, command: (*found.refusals.get(command, ()), resume.refusal)}
        note = f"{word} would refuse: {resume.refusal}"
        return replace(found, notes=(*found.notes, note), refusals=refusals)
    changed = "; ".join(c.line() for c in resume.changes)
    note = f"{word} would resume {run_dir.name} from its last checkpoint" + (
        f", recording these changes in its config_history.jsonl: {changed}" if changed else ""
    )
    return replace(found, notes=(*found.notes, note))


# Degrees several rules judge at once; each rule names the values it accepts, and the verdict adds
# the values every rule accepts (parallel.tp=6 on llama3-8b: world size, heads, kv heads and the
# MLP width each gave a list of their own).
CONSOLIDATED = ("parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep", "parallel.vpp")
_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)


def agreed_values(cfg: LLMTrainConfig, violations: Sequence[Violation]) -> list[str]:
    """One note per degree that two or more errors name: the values of it (others unchanged)
    with which no rule reports an error naming it."""
    notes = []
    for key in CONSOLIDATED:
        naming = [v for v in violations if v.is_error and key in v.keys]
        if len(naming) < 2:
            continue
        name = key.split(".")[1]
        current = getattr(cfg.parallel, name)
        good = []
        for value in _CANDIDATES:
            if value == current:
                continue
            changes: dict[str, Any] = {name: value}
            trial = replace(cfg, parallel=replace(cfg.parallel, **changes))
            if not any(v.is_error and key in v.keys for v in check(trial)):
                good.append(str(value))
        rules = ", ".join(dict.fromkeys(v.rule for v in naming))
        if good:
            answer = f"valid {name} with every rule: {', '.join(good)}"
        else:
            answer = (
                f"no value of {name} from {_CANDIDATES[0]} to {_CANDIDATES[-1]} passes every "
                "rule with the other keys as they are: change one of the keys the errors name"
            )
        notes.append(f"{key}={current}: {len(naming)} errors above ({rules}); {answer}")
    return notes


BACKEND_RULE = "backend-capabilities"


@dataclass(frozen=True)
class Substitute:
    """`plan` on a layout the configured backend does not run, predicted with one that does."""

    requested: str
    planned: str
    reasons: tuple[str, ...]  # the configured backend's refusals, as validate prints them
    config: LLMTrainConfig  # the configuration with backend.name = planned


def substitute_backend(
    cfg: LLMTrainConfig, violations: Sequence[Violation], headroom: float = 0.10
) -> tuple[Substitute, Plan] | None:
    """When the only errors are the configured backend's refusals and other backends run the
    configuration as it is, the fastest of them (by the planner) with its plan; else None.
    `plan` answers "how would this layout run"; validate/run/submit still refuse it as
    configured (the substitute is named in `plan`'s output, never silently used)."""
    errors = [v for v in violations if v.is_error]
    if not errors or any(v.rule != BACKEND_RULE for v in errors):
        return None
    best: tuple[Substitute, Plan] | None = None
    for name in runnable_by(cfg, exclude=cfg.backend.name):
        other = replace(cfg, backend=replace(cfg.backend, name=name))
        if any(v.is_error for v in check(other)):
            continue
        plan = make_plan(other, headroom=headroom, accept=passes)
        if best is None or plan.time.step_s < best[1].time.step_s:
            reasons = tuple(v.message for v in errors)
            best = (Substitute(cfg.backend.name, name, reasons, other), plan)
    return best


@dataclass(frozen=True)
class PlanVerdict:
    """What `plan` predicts for a configuration: its plan, or None when an error stands (the
    configured backend's refusals alone do not: another backend that runs the layout as it is is
    planned instead, and named as the substitute)."""

    composed: Composed
    violations: tuple[Violation, ...]  # every problem without a plan; the warnings with one
    plan: Plan | None
    substitute: Substitute | None = None


def plan_verdict(composed: Composed, *, headroom: float = 0.10) -> PlanVerdict:
    """`plan`'s decision: the rules' verdict, the backend substitute when only the backend
    refuses (``substitute_backend``), and the plan."""
    violations = check(composed.config)
    if not any(v.is_error for v in violations):
        plan = make_plan(composed.config, headroom=headroom, accept=passes)
        return PlanVerdict(composed, tuple(violations), plan)
    found = substitute_backend(composed.config, violations, headroom=headroom)
    if found is None:
        return PlanVerdict(composed, tuple(violations), None)
    substitute, plan = found
    warnings = tuple(v for v in violations if not v.is_error)
    return PlanVerdict(composed, warnings, plan, substitute)


def search_configs(
    composed: Composed, overrides: Sequence[str], *, any_backend: bool
) -> dict[str, LLMTrainConfig]:
    """The configurations `plan --search` ranks, by backend: the one given first, then (with
    `any_backend`) the same overrides under each other backend."""
    configs = {composed.config.backend.name: composed.config}  # as given first
    if any_backend:
        for name in all_backends():
            if name not in configs:
                configs[name] = compose_config([*overrides, f"backend={name}"]).config
    return configs
