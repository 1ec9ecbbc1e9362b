"""Loading a trained run back for ``eval.py`` and ``predict.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from omegaconf import DictConfig, OmegaConf

from volseg.utils.errors import UserInputError
from volseg.utils.instantiate import build

# mismatches listed in the error message (the rest are counted)
MAX_LISTED = 6


def load_run_config(ckpt_path: str | Path) -> tuple[dict[str, Any], DictConfig]:
    """The checkpoint (``weights_only=True``) and the train config saved in it."""
    path = Path(ckpt_path)
    if path.is_dir():
        raise UserInputError(
            f"ckpt_path={path}: is a folder; give a checkpoint file, e.g. a run's "
            "checkpoints/last.ckpt"
        )
    if not path.is_file():
        raise UserInputError(f"ckpt_path={path}: file not found")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserInputError(f"ckpt_path={path}: not a loadable checkpoint ({err})") from None
    saved = checkpoint.get("volseg", {}).get("config") if isinstance(checkpoint, dict) else None
    if not saved:
        raise UserInputError(f"ckpt_path={path}: no volseg config in it (not written by train.py)")
    return checkpoint, OmegaConf.create(saved)


def weight_mismatches(
    network: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]
) -> list[str]:
    """One line per tensor that differs between a network's and a checkpoint's state dicts."""
    shapes = [
        f"{k}: shape {list(v.shape)} in the checkpoint, {list(network[k].shape)} in the network"
        for k, v in saved.items()
        if k in network and v.shape != network[k].shape
    ]
    missing = [f"{k}: in the network, not in the checkpoint" for k in network if k not in saved]
    extra = [f"{k}: in the checkpoint, not in the network" for k in saved if k not in network]
    return shapes + missing + extra


def load_model(
    checkpoint: dict[str, Any], model_cfg: DictConfig, ckpt_path: str | Path
) -> LightningModule:
    """``model_cfg`` built, the checkpoint's weights loaded into it (:func:`check_weights_fit`)."""
    model: LightningModule = build(model_cfg, "model")
    check_weights_fit(model, checkpoint, model_cfg, ckpt_path)
    model.load_state_dict(checkpoint.get("state_dict", {}))
    return model


#: network arguments that do not shape its weights (left out when two networks are compared)
NOT_WEIGHTS = ("patch_size", "pooling", "depth", "dropout")


def _net_dict(net: Any) -> dict[str, Any]:
    """A network's config as plain values (interpolations resolved where they can be)."""
    if not isinstance(net, DictConfig):
        return dict(net or {})
    try:
        return dict(OmegaConf.to_container(net, resolve=True))
    except Exception:  # an interpolation outside this node: its own value is not needed here
        return dict(OmegaConf.to_container(net, resolve=False))


def _yaml_net(folder: Path, name: str) -> dict[str, Any]:
    """``folder/<name>.yaml`` with the files of its ``defaults`` list merged under it."""
    own = OmegaConf.load(folder / f"{name}.yaml")
    merged = OmegaConf.create()
    for entry in own.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_" and (folder / f"{entry}.yaml").is_file():
            merged = OmegaConf.merge(merged, _yaml_net(folder, entry))
    own.pop("defaults", None)
    return dict(OmegaConf.to_container(OmegaConf.merge(merged, own), resolve=False))


def _literal_match(config_net: dict[str, Any], saved_net: dict[str, Any]) -> bool:
    """Whether a network config file builds the saved network (literal arguments)."""
    if config_net.get("_target_") != saved_net.get("_target_"):
        return False
    return all(
        saved_net.get(key) == value
        for key, value in config_net.items()
        if key not in NOT_WEIGHTS and not (isinstance(value, str) and "${" in value)
    )


def config_choice_of(saved_net: dict[str, Any]) -> str | None:
    """The choice of the entry points' ``configs/`` that builds ``saved_net`` (``model=NAME``,
    ``model/net=NAME``), or ``None``."""
    models = Path(os.environ.get("PROJECT_ROOT", ".")) / "configs" / "model"
    for group in sorted(models.glob("*.yaml")):
        defaults = OmegaConf.load(group).get("defaults", [])
        nets = [d["net"] for d in defaults if isinstance(d, DictConfig) and "net" in d]
        if nets and _literal_match(_yaml_net(models / "net", nets[0]), saved_net):
            return f"model={group.stem}"
    for net in sorted((models / "net").glob("*.yaml")):
        if _literal_match(_yaml_net(models / "net", net.stem), saved_net):
            return f"model/net={net.stem}"
    return None


def check_weights_fit(
    model: LightningModule, checkpoint: dict[str, Any], model_cfg: DictConfig, ckpt_path: str | Path
) -> None:
    """:class:`UserInputError` when ``model`` is another network than the checkpoint's: its network,
    the arguments that differ, the choice that builds it, the mismatched tensors."""
    problems = weight_mismatches(model.state_dict(), checkpoint.get("state_dict", {}))
    if not problems:
        return
    shown = problems[:MAX_LISTED]
    if len(problems) > MAX_LISTED:
        shown.append(f"... and {len(problems) - MAX_LISTED} more")
    net = _net_dict(model_cfg.get("net", {}))
    saved_model = (checkpoint.get("volseg", {}).get("config") or {}).get("model") or {}
    saved = dict(saved_model.get("net") or {})
    trained = f"{saved.get('_target_')}"
    # ``key=checkpoint's (config's)`` for each argument that shapes the weights and differs
    differences = [
        f"{key}={saved.get(key)} (the config: {net.get(key)})"
        for key in dict.fromkeys([*saved, *net])
        if key not in NOT_WEIGHTS and saved.get(key) != net.get(key)
    ]
    if saved and differences:
        trained += f" with {', '.join(differences)}"
    choice = config_choice_of(saved) if saved else None
    fix = "compose the network it was trained with (its model config is saved in the checkpoint)"
    if choice:
        fix = f"pass {choice} (the network it was trained with)"
    raise UserInputError(
        f"ckpt_path={ckpt_path}: its weights do not fit the network of the model config "
        f"({net.get('_target_')}): they are of {trained}; {fix}, without model.* overrides that "
        "change it",
        shown,
    )


def check_work_left(checkpoint: dict[str, Any], trainer_cfg: DictConfig, ckpt_path: str) -> None:
    """:class:`UserInputError` when the checkpoint's run reached its epoch or step limit."""
    # whole epochs trained: Lightning's fit-loop count
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {})
    epochs = int(progress.get("current", {}).get("processed", checkpoint.get("epoch", 0)))
    steps = int(checkpoint.get("global_step", 0))
    done = f"ckpt_path={ckpt_path}: its run has trained {epochs} epoch(s), {steps} step(s)"
    # (key, trained, the least value that limits, the value suggested)
    for key, trained, least, more in (
        ("max_steps", steps, 1, steps * 2),
        ("max_epochs", epochs, 0, max(epochs * 2, 1)),
    ):
        limit = trainer_cfg.get(key)
        if limit is not None and int(limit) >= least and trained >= int(limit):
            raise UserInputError(
                f"{done}, trainer.{key}={limit}: nothing left to train; raise it to train on "
                f"(e.g. trainer.{key}={more})"
            )
