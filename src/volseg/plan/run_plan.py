"""``RunPlan``: every value a run derives, decided once, with where each came from.

A plan holds the planned config (the composed config with every ``auto`` replaced by its value,
``num_classes``/``in_channels`` from the data, the loader and precision settings for the device)
and one :class:`Decision` per derived key, with its source (``configured``, ``planned``, ``the
data``, or a plan file) and why. ``plan.yaml`` in the run folder is this object; ``python
train.py plan=PATH`` trains from it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from volseg.utils.config import plain

PLAN_FILE = "plan.yaml"
SCHEMA_VERSION = 1
#: config nodes that belong to the run, not to the plan (a plan trained later gets its own)
RUN_NODES = ("hydra", "paths", "plan", "task_name")


@dataclass(frozen=True)
class Decision:
    """One planned key: its value, ``source`` (``configured``, ``planned``, ``the data``, ...)
    and ``why`` (for a planned value, from what)."""

    value: Any
    source: str
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"value": plain(self.value), "source": self.source, "why": self.why}


@dataclass(frozen=True)
class RunPlan:
    """The plan of one run. ``config`` is a copy for each reader (:meth:`run_config`), so that no
    builder can change what the plan says; ``decisions`` maps config keys (``data.patch_size``)
    and a few run facts (``device``) to :class:`Decision`; ``estimate`` is the estimator's
    training step (``peak_allocated``/``process_total`` bytes, ``flops_per_step``) or why not;
    ``fingerprint`` the dataset's (case count, median shape) where the plan read the data."""

    config: DictConfig
    decisions: Mapping[str, Decision]
    estimate: Mapping[str, Any] = field(default_factory=dict)
    #: the planned run's validation of its largest volume (volseg.memory.estimate.inference), or
    # why not
    validation: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()
    #: trainer.precision: what was asked, what runs, on which device, why
    precision: Mapping[str, str] = field(default_factory=dict)
    #: the datamodule the plan built from its final ``data`` config to read the data (``None``
    #: where it built none, or the planner changed a key of it since): the run's, not rebuilt
    datamodule: Any = field(default=None, compare=False, repr=False)

    def run_config(self) -> DictConfig:
        """The planned config, as the builders read it (a copy: it cannot change the plan)."""
        return copy.deepcopy(self.config)

    def value(self, key: str) -> Any:
        return self.decisions[key].value

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data: what ``plan.yaml`` holds."""
        config = OmegaConf.to_container(self.config, resolve=False)
        for node in RUN_NODES:
            config.pop(node, None)
        return {
            "schema_version": SCHEMA_VERSION,
            "decisions": {k: d.as_dict() for k, d in self.decisions.items()},
            "estimate": plain(dict(self.estimate)),
            "validation": plain(dict(self.validation)),
            "fingerprint": plain(dict(self.fingerprint)) if self.fingerprint else None,
            "notes": list(self.notes),
            "config": config,
        }

    def comparable(self) -> dict[str, Any]:
        """The decisions only (value and source): what two entry points must agree on."""
        return {k: (plain(d.value), d.source) for k, d in self.decisions.items()}

    def write(self, folder: str | Path) -> Path:
        """Write ``<folder>/plan.yaml``; returns the file."""
        path = Path(folder) / PLAN_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False, width=100))
        return path

    def format(self) -> str:
        """One line per decision, for the log and ``plan.py`` (:mod:`volseg.plan.report`)."""
        from volseg.plan.report import format_run_plan

        return format_run_plan(self)
