"""Every value the run's scripts cannot hold is a validation error reported with all the others
(the `script-values` rule), not a refusal `render`/`submit` raise one at a time; the renderer
refuses the same values, with the same words, as an invariant."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.render.sbatch import RenderError, render_launch_sh, render_sbatch
from launcher.verdict import assess

pytestmark = pytest.mark.unit

BAD = {
    "slurm.partition": "slurm.partition='gpu\tq'",
    "cluster.env": "+cluster.env.BAD-NAME=1",
    "slurm.extra_sbatch_args": "slurm.extra_sbatch_args=[exclusive]",
    "data.path": "data.path='/data/a,b/web_text_document'",
}
IMAGE = ["slurm.container_image=img", "launcher=slurm"]


def test_validate_reports_every_unwritable_value_at_once() -> None:
    verdict = assess([*BAD.values(), *IMAGE])
    found = [v for v in verdict.errors if v.rule == "script-values"]
    assert sorted(v.keys[0] for v in found) == sorted(BAD)
    assert verdict.exit_code("validate") == 2


def test_secrets_kept_from_the_job_are_a_validation_error() -> None:
    overrides = ["run.secret_env=[HF_TOKEN]", "slurm.extra_sbatch_args=['--export=NONE']"]
    (found,) = [v for v in assess(overrides).errors if v.rule == "script-values"]
    assert "--export=NONE" in found.message and "HF_TOKEN" in found.message


@pytest.mark.parametrize("key", sorted(BAD))
def test_the_renderer_refuses_the_same_value_with_the_same_words(key: str) -> None:
    overrides = [BAD[key], *IMAGE]
    (reported,) = [v for v in assess(overrides).errors if v.rule == "script-values"]
    cfg = compose_config(overrides).config
    where = {"python": "python", "run_dir": "/runs/r", "workdir": "/home/u"}
    with pytest.raises(RenderError) as raised:
        render_sbatch(cfg, **where)
        render_launch_sh(cfg, **where)
    assert str(raised.value) == reported.message


def test_a_valid_config_has_no_script_problem() -> None:
    assert not [v for v in assess(IMAGE).violations if v.rule == "script-values"]
