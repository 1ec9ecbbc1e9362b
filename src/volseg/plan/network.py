"""The network planned for the training patch through its adapter: channel names, the family's
settings, ``model.divisible_by``, the deep-supervision loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from volseg.models.networks import NetworkAdapter, adapter_for
from volseg.models.networks.outputs import describe_output, select_output
from volseg.models.networks.probe import (
    channel_names,
    describe,
    network_divisibility,
    shape_taker,
    training_output,
)
from volseg.plan.run_plan import Decision, applied
from volseg.utils.config import is_voxels, plain
from volseg.utils.errors import UserInputError, at_config_key
from volseg.utils.extras import import_failure
from volseg.utils.instantiate import config_error

#: MONAI's loss for networks with one output per decoder level
DEEP_SUPERVISION_LOSS = "monai.losses.DeepSupervisionLoss"


def network_class(net: DictConfig) -> type:
    """The class ``model.net._target_`` names; one error where it does not import."""
    try:
        target = net._target_
    except MissingMandatoryValue:
        raise UserInputError(
            "model.net._target_ is missing: name your network's class, e.g. "
            "model/net=custom model.net._target_=my_module.MyNet"
        ) from None
    try:
        return get_class(str(target))
    except Exception as err:
        raise import_failure(err, f"model.net._target_={target}") from None


def _renamed_channels(
    cfg: DictConfig, cls: type, decisions: dict[str, Decision]
) -> tuple[dict[str, Any], list[str]]:
    """``model.net.in_channels``/``num_classes`` under the names ``cls`` takes them by: the keys
    set and the keys removed."""
    names = channel_names(cls)
    net = cfg.model.net
    renamed = {
        key: names[key]
        for key in ("in_channels", "num_classes")
        if key in net and names.get(key) not in (None, key)
    }
    for key, name in renamed.items():
        decisions[f"model.net.{name}"] = Decision(
            net[key], "planned", f"{key}, by the name {cls.__name__} takes it"
        )
    settings = {f"model.net.{name}": net[key] for key, name in renamed.items()}
    return settings, [f"model.net.{key}" for key in renamed]


def divisible_by(cfg: DictConfig, patch: Sequence[int] | None) -> Decision:
    """``model.divisible_by`` ([D, H, W]): configured, the adapter's, or probed (``patch``: ``None``
    before one is planned)."""
    configured = plain(cfg.model.get("divisible_by"))
    if configured not in (None, "auto"):
        value = [configured] * 3 if isinstance(configured, int) else configured
        if not is_voxels(value):
            raise UserInputError(
                f"model.divisible_by={configured}: expected auto, an int > 0 or [D, H, W] > 0"
            )
        return Decision(value, "configured")
    try:
        found, why = network_divisibility(cfg.model.net, patch, int(cfg.in_channels))
    except ValueError as err:
        raise at_config_key(str(err), "model") from None
    except Exception as err:  # building it to probe: its constructor refused an argument
        translated = config_error(err, "model.net", cfg.model.net)
        if translated is None:
            raise
        raise translated from None
    return Decision(found, "planned", why)


def _deep_supervision_loss(
    cfg: DictConfig, adapter: NetworkAdapter
) -> tuple[Decision | None, dict[str, Any]]:
    """The loss inside MONAI's ``DeepSupervisionLoss`` where needed: its decision, and the
    ``model.loss`` node where it is planned."""
    if not adapter.deep_supervision(cfg.model.net) or "loss" not in cfg.model:
        return None, {}
    loss = cfg.model.loss
    if str(loss.get("_target_")) == DEEP_SUPERVISION_LOSS:
        return Decision(DEEP_SUPERVISION_LOSS, "configured"), {}
    inner = OmegaConf.to_container(loss, resolve=True)
    why = (
        f"{adapter.family} returns one output per decoder level in training: "
        f"{inner.get('_target_')} on each, weighed 1, 1/2, 1/4, ... (weight_mode exp)"
    )
    wrapped = {"_target_": DEEP_SUPERVISION_LOSS, "weight_mode": "exp", "weights": None}
    return Decision(DEEP_SUPERVISION_LOSS, "planned", why), {**wrapped, "loss": inner}


def nearest_patches(patch: Sequence[int], multiple: Sequence[int]) -> list[list[int]]:
    """The patches nearest ``patch`` whose sides divide by ``multiple``: rounded down and up."""
    down = [max(m, p // m * m) for p, m in zip(patch, multiple, strict=True)]
    up = [-(-p // m) * m for p, m in zip(patch, multiple, strict=True)]
    return [down] if down == up else [down, up]


def check_patch_taken(
    cfg: DictConfig, cls: type, patch: Sequence[int], multiple: Sequence[int]
) -> None:
    """One :class:`UserInputError` when a side of ``patch`` is no multiple of ``multiple`` and the
    network ``cls`` (on meta tensors) does not keep its shape; names the nearest patches that
    work."""
    if all(int(p) % int(m) == 0 for p, m in zip(patch, multiple, strict=True)):
        return
    try:
        taken = shape_taker(cfg.model.net, int(cfg.in_channels))(patch)
    except Exception:  # a network the probe cannot build: the divisibility alone decides
        taken = False
    if taken:
        return
    listed = " or ".join(f"[{','.join(map(str, p))}]" for p in nearest_patches(patch, multiple))
    raise UserInputError(
        f"data.patch_size={list(patch)}: {cls.__name__} needs each "
        f"side [D, H, W] to divide by {describe(list(multiple))} (model.divisible_by); the "
        f"nearest patches that work: data.patch_size={listed}"
    )


def check_output(cfg: DictConfig, cls: type, adapter: NetworkAdapter, patch: Sequence[int]) -> None:
    """One :class:`UserInputError` when what the network ``cls`` that no adapter knows returns in
    training cannot reach the loss (names ``model.net_output`` or the loss)."""
    if type(adapter) is not NetworkAdapter:
        return
    out = training_output(cfg.model.net, int(cfg.in_channels), patch)
    if out is None:
        return
    name = cls.__name__
    key = cfg.model.get("net_output")  # a key or an index
    returns = f"{name} returns {describe_output(out)} in training"
    if key is not None:
        try:
            out = select_output(out, key)
        except (KeyError, IndexError, TypeError):
            raise UserInputError(
                f"model.net_output={key}: {returns}; name the logits by "
                f"{'its key' if isinstance(out, dict) else 'their index'}"
            ) from None
        returns = f"{name}'s output {key!r} is {describe_output(out)}"
    if isinstance(out, dict):
        raise UserInputError(
            f"model.net_output: {returns}; name the logits with model.net_output=KEY"
        )
    deep_supervision = str(cfg.model.get("loss", {}).get("_target_")) == DEEP_SUPERVISION_LOSS
    if not isinstance(out, list | tuple) or deep_supervision:
        return
    if isinstance(out, tuple):
        raise UserInputError(
            f"model.net_output: {returns}; name the logits' index with model.net_output=0 (one "
            "output per decoder level, full resolution first: model/loss=deep_supervision)"
        )
    raise UserInputError(
        f"model.loss: {returns}; one output per decoder level (full resolution first) takes "
        "model/loss=deep_supervision, or name the logits' index with model.net_output=0"
    )


def plan_network(cfg: DictConfig, patch: Sequence[int]) -> tuple[dict[str, Decision], DictConfig]:
    """The network planned for ``patch`` ([D, H, W] voxels): its decisions, and ``cfg`` with
    them applied."""
    cls = network_class(cfg.model.net)
    adapter = adapter_for(cls)
    decisions: dict[str, Decision] = {}
    cfg = applied(cfg, *_renamed_channels(cfg, cls, decisions))
    for planned in adapter.plan(cfg.model.net, patch):
        decisions[planned.key] = Decision(planned.value, planned.source, planned.why)
    cfg = applied(cfg, {k: d.value for k, d in decisions.items()})
    multiple = divisible_by(cfg, patch)
    check_patch_taken(cfg, cls, patch, multiple.value)
    check_output(cfg, cls, adapter, patch)
    decisions["model.divisible_by"] = multiple
    settings = {"model.divisible_by": multiple.value}
    loss, node = _deep_supervision_loss(cfg, adapter)
    if loss is not None:
        decisions["model.loss._target_"] = loss
        settings |= {"model.loss": node} if node else {}
    return decisions, applied(cfg, settings)
