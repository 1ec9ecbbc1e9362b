"""Plans that come from a plan file (``train.py plan=PATH``) or a checkpoint's run (``eval.py``,
``predict.py``), laid over this command's config and planned again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from volseg.plan.run_plan import RUN_NODES, SCHEMA_VERSION, Decision, RunPlan, applied
from volseg.utils.config import plain
from volseg.utils.errors import UserInputError


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """``plan.yaml`` as :meth:`RunPlan.write` writes it; anything else: one error."""
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"plan={path}: file not found (plan.py writes one: plan.yaml)")
    try:
        saved = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise UserInputError(f"plan={path}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(saved, dict) or "config" not in saved or "decisions" not in saved:
        raise UserInputError(f"plan={path}: not a volseg plan (no config and decisions in it)")
    if saved.get("schema_version") != SCHEMA_VERSION:
        raise UserInputError(
            f"plan={path}: schema_version {saved.get('schema_version')}, expected {SCHEMA_VERSION}"
        )
    return saved


def command_line(prefixes: tuple[str, ...] = ()) -> list[str]:
    """This command's overrides (``key=value`` as typed), but those starting with ``prefixes``."""
    if not HydraConfig.initialized():
        return []
    return [o for o in HydraConfig.get().overrides.task if not o.startswith(prefixes)]


def apply_dotted(cfg: DictConfig, overrides: list[str], what: str) -> DictConfig:
    """``key=value`` overrides applied as Hydra applies them; a group choice or an added or deleted
    key stops with one line naming it and ``what``."""
    parser = OverridesParser.create()
    settings = {}
    for text in overrides:
        override = parser.parse_override(text)
        key = override.key_or_group
        group_choice = "." not in key and (key not in cfg or isinstance(cfg[key], DictConfig))
        if override.is_add() or override.is_delete() or group_choice:
            raise UserInputError(f"{text}: {what}")
        settings[key] = override.value()
    return applied(cfg, settings)


def inherit_sources(plan: RunPlan, saved: Mapping[str, Any], where: str) -> RunPlan:
    """``plan`` with each decision that equals the ``saved`` plan's, and was not configured there,
    named after it (source ``where``)."""
    earlier = saved.get("decisions") or {}
    decisions: dict[str, Decision] = {}
    for key, decision in plan.decisions.items():
        before = earlier.get(key)
        same = before is not None and plain(before.get("value")) == plain(decision.value)
        if same and before.get("source") != "configured" and decision.source == "configured":
            why = f"{before.get('source')}: {before.get('why')}".rstrip(": ")
            decision = Decision(decision.value, where, why)
        decisions[key] = decision
    # everything else, the validation estimate included, is the new plan's own
    return replace(
        plan, decisions=decisions, fingerprint=plan.fingerprint or saved.get("fingerprint")
    )


def plan_from_file(cfg: DictConfig) -> tuple[DictConfig, dict[str, Any]]:
    """``train.py plan=PATH``: this command's config with the file's laid over it and this command's
    dotted overrides on top, and the saved plan."""
    path = str(cfg.plan)
    saved = read_plan_file(path)
    # each top-level node of the file's replaces this command's
    laid = applied(cfg, {k: v for k, v in saved["config"].items() if k not in RUN_NODES})
    overrides = command_line(("plan=", "hydra.", "paths.", "task_name="))
    what = (
        f"with plan={path} the groups are the plan's; choose a group in the plan.py command "
        "that writes the plan"
    )
    return apply_dotted(laid, overrides, what), saved


#: the nodes a trained run fixes; eval.py and predict.py take them from its checkpoint
RUN_OWN = ("data", "model", "num_classes", "in_channels")


def config_from_run(cfg: DictConfig, run_cfg: DictConfig, task: str) -> DictConfig:
    """``cfg`` with the run's ``data``, ``model``, ``num_classes``, ``in_channels`` and this
    command's overrides of them applied as train.py applies them."""
    parser = OverridesParser.create()
    parsed = [(text, parser.parse_override(text)) for text in command_line()]
    chosen = {o.key_or_group for _, o in parsed if o.key_or_group in RUN_OWN[:2]}
    for text, o in parsed:
        if o.key_or_group in ("num_classes", "in_channels"):
            raise UserInputError(
                f"{text}: {task} takes {o.key_or_group} from the checkpoint's run "
                f"({run_cfg.get(o.key_or_group)}); its network was trained for it"
            )
    # the run's nodes as they were written (their interpolations unresolved)
    settings = {
        key: OmegaConf.to_container(node) if isinstance(node, DictConfig) else node
        for key, node in run_cfg.items()
        if key in RUN_OWN and key not in chosen
    }
    for text, o in parsed:
        node, dot, _ = o.key_or_group.partition(".")
        if not dot or node not in RUN_OWN[:2] or node in chosen:
            continue  # a group choice, or a node the command chose anew
        if o.is_delete():
            raise UserInputError(f"{text}: {task} cannot delete a key of the trained run")
        settings[o.key_or_group] = o.value()
    return applied(cfg, settings)


def plan_from_run(
    cfg: DictConfig, run_cfg: DictConfig, saved_plan: Mapping[str, Any] | None, task: str
) -> RunPlan:
    """eval.py's/predict.py's plan: the run's with this command's overrides."""
    from volseg.plan.make import make_plan

    planned = make_plan(config_from_run(cfg, run_cfg, task), estimate_step=False)
    for key in ("num_classes", "in_channels"):
        trained, found = run_cfg.get(key), planned.decisions.get(key)
        if trained is not None and found is not None and found.value != trained:
            # another dataset (data=msd, data.root=...) with other classes or channels
            raise UserInputError(
                f"{key}={found.value} from the data ({found.why or found.source}), but the "
                f"checkpoint's network was trained for {key}={trained}"
            )
    return inherit_sources(planned, saved_plan or {}, "the training run's plan")
