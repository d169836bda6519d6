"""Weights & Biases and MLflow, fed by rank 0 with the rows it writes to metrics.jsonl.

Both are optional extras, off by default (``logging.wandb`` / ``logging.mlflow``); a missing
package is refused before launching (``problems``, naming the pip extra). A run is identified by
``run_id``, a stable hash of the run directory's absolute path, so a requeued or resumed job (same
run directory) continues the same tracker run:

- W&B: ``wandb.init(id=run_id, resume="allow")``, files under RUN_DIR/wandb; the config logged is
  config.yaml's (secrets already redacted there). Offline mode (``logging.wandb_mode=offline`` or
  WANDB_MODE=offline) writes a local run that ``wandb sync`` uploads later.
- MLflow: the run tagged ``llmtrain.run_id=<run_id>`` in the experiment is looked up and
  continued, else created (named after the run directory); metrics go in with their step.

Credentials come from the environment only (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...), never from
the config; a tracking URI is logged without its user:password part.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from launcher.config.schema import LLMTrainConfig

RUN_TAG = "llmtrain.run_id"
EXTRAS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}  # key: (module, extra)


def run_id(run_root: Path) -> str:
    """16 hex digits, the same for every job that writes into this run directory."""
    return hashlib.sha256(str(Path(run_root).resolve()).encode()).hexdigest()[:16]


def problems(cfg: LLMTrainConfig, find_spec: Callable[[str], Any] | None = None) -> list[str]:
    """A tracker that is switched on but whose package is not installed."""
    find = find_spec or importlib.util.find_spec
    out = []
    for key, (module, extra) in EXTRAS.items():
        if getattr(cfg.logging, key) and find(module) is None:
            out.append(
                f"logging.{key}=true needs the {module} package: pip install 'llmtrain[{extra}]' "
                f"(or set logging.{key}=false)"
            )
    return out


def without_credentials(uri: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", uri)


def numeric(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row (None and strings left out), step and time excluded."""
    return {
        k: float(v)
        for k, v in record.items()
        if k not in ("step", "time")
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


class Tracker(Protocol):
    def log(self, record: Mapping[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


class WandbTracker:
    def __init__(self, cfg: LLMTrainConfig, root: Path, values: Mapping[str, Any]):
        import wandb

        lg = cfg.logging
        self.id = run_id(root)
        self.run = wandb.init(
            project=lg.wandb_project,
            entity=lg.wandb_entity,
            id=self.id,
            resume="allow",
            name=root.name,
            dir=str(root),
            mode=lg.wandb_mode,  # type: ignore[arg-type]
            config=dict(values),
        )

    def describe(self) -> str:
        return f"wandb run {self.id} (project {self.run.project}, {self.run.settings.mode})"

    def log(self, record: Mapping[str, Any], step: int) -> None:
        self.run.log(numeric(record), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, cfg: LLMTrainConfig, root: Path, values: Mapping[str, Any]):
        from mlflow.tracking import MlflowClient, get_tracking_uri

        lg = cfg.logging
        self.client = MlflowClient(tracking_uri=lg.mlflow_tracking_uri)
        self.uri = without_credentials(lg.mlflow_tracking_uri or str(get_tracking_uri()))
        self.id = run_id(root)
        experiment = self.client.get_experiment_by_name(lg.mlflow_experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(lg.mlflow_experiment)
        )
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{self.id}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            self.resumed = True
        else:
            run = self.client.create_run(
                experiment_id,
                run_name=root.name,
                tags={RUN_TAG: self.id, "llmtrain.run_dir": str(root)},
            )
            self.run_id = run.info.run_id
            self.resumed = False
            self._log_params(values)

    def _log_params(self, values: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        def flat(node: Any, prefix: str = "") -> dict[str, str]:
            if isinstance(node, Mapping):
                out: dict[str, str] = {}
                for k, v in node.items():
                    out.update(flat(v, f"{prefix}{k}."))
                return out
            return {prefix.rstrip("."): str(node)[:500]}

        params = [Param(k, v) for k, v in sorted(flat(values).items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def describe(self) -> str:
        how = "continued" if self.resumed else "created"
        return f"mlflow run {self.run_id} ({how}, tag {RUN_TAG}={self.id}, {self.uri})"

    def log(self, record: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in numeric(record).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


class Trackers:
    """The trackers switched on (possibly none); rank 0 holds one."""

    def __init__(
        self,
        cfg: LLMTrainConfig,
        root: Path,
        values: Mapping[str, Any],
        log: Callable[[str], None],
    ):
        self.active: list[Any] = []
        if cfg.logging.wandb:
            self.active.append(WandbTracker(cfg, root, values))
        if cfg.logging.mlflow:
            self.active.append(MlflowTracker(cfg, root, values))
        for tracker in self.active:
            log(f"logging to {tracker.describe()}")

    def log(self, record: Mapping[str, Any]) -> None:
        for tracker in self.active:
            tracker.log(record, int(record["step"]))

    def close(self) -> None:
        for tracker in self.active:
            tracker.close()
        self.active = []
