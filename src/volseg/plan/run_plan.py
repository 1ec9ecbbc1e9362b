"""``RunPlan``: the planned config (every ``auto`` replaced) and one :class:`Decision` per derived
key, with its source and why. ``plan.yaml`` is this object; ``train.py plan=PATH`` trains it."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from volseg.memory import Candidate
from volseg.utils.config import plain, set_key

PLAN_FILE = "plan.yaml"
SCHEMA_VERSION = 1
#: config nodes that belong to the run, not to the plan (a plan trained later gets its own)
RUN_NODES = ("hydra", "paths", "plan", "task_name")


def applied(
    config: DictConfig, settings: Mapping[str, Any], removed: Sequence[str] = ()
) -> DictConfig:
    """A copy of ``config`` with each dotted key of ``settings`` set to its value (replaced, added
    where missing) and each of ``removed`` taken out. The one place a config is edited: planning
    decides values, this writes them."""
    config = copy.deepcopy(config)
    for key in removed:
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(config, parent) if parent else config
        with open_dict(node):
            node.pop(name, None)
    for key, value in settings.items():
        set_key(config, key, value)
    return config


@dataclass(frozen=True)
class Decision:
    """One planned key: its value (plain data, as ``plan.yaml`` writes it), ``source`` and
    ``why``."""

    value: Any
    source: str
    why: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", plain(self.value))


@dataclass(frozen=True)
class RunPlan:
    """The plan of one run: ``config`` (a copy for each reader), ``decisions`` by key, the step's
    ``estimate``, ``validation``, the run's ``duration``, the dataset's ``fingerprint``."""

    config: DictConfig
    decisions: Mapping[str, Decision]
    estimate: Mapping[str, Any] = field(default_factory=dict)
    #: the planned run's validation of its largest volume, or why not
    validation: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()
    #: trainer.precision: what was asked, what runs, on which device, why
    precision: Mapping[str, str] = field(default_factory=dict)
    #: the run's predicted wall time and its inputs (:mod:`volseg.plan.duration`), or why not
    duration: Mapping[str, Any] = field(default_factory=dict)
    #: the datamodule the plan read the data with, where built from the final ``data``
    datamodule: Any = field(default=None, compare=False, repr=False)

    def run_config(self, candidate: Candidate | None = None) -> DictConfig:
        """The planned config as the builders read it, with ``candidate``'s settings applied (a
        copy: it cannot change the plan)."""
        return applied(self.config, candidate.settings() if candidate is not None else {})

    def value(self, key: str) -> Any:
        return self.decisions[key].value

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data: what ``plan.yaml`` holds."""
        config = OmegaConf.to_container(self.config, resolve=False)
        for node in RUN_NODES:
            config.pop(node, None)
        return {
            "schema_version": SCHEMA_VERSION,
            "decisions": {k: plain(asdict(d)) for k, d in self.decisions.items()},
            "estimate": plain(dict(self.estimate)),
            "validation": plain(dict(self.validation)),
            "duration": plain(dict(self.duration)),
            "fingerprint": plain(dict(self.fingerprint)) if self.fingerprint else None,
            "notes": list(self.notes),
            "config": config,
        }

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
