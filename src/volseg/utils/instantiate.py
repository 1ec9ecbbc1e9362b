"""Building callbacks and loggers from their config groups."""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from volseg.utils.checkpoint_io import BackgroundCheckpointIO
from volseg.utils.entry import file_log
from volseg.utils.errors import UserInputError, at_config_key, causes
from volseg.utils.extras import import_failure, missing
from volseg.utils.sweep import in_multirun

# what a constructor raises about a value it was given: at the config boundary, the user's mistake
CONFIG_VALUE_ERRORS = (
    ValueError,
    TypeError,
    MisconfigurationException,
    InstantiationException,
    OmegaConfBaseException,
)


def build(cfg: DictConfig, key: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(cfg, **kwargs)`` for the node at ``key`` (e.g. ``model``); a
    constructor's complaint about a value becomes one :class:`UserInputError` naming the key."""
    try:
        return hydra.utils.instantiate(cfg, **kwargs)
    except Exception as err:
        translated = config_error(err, key, cfg)
        if translated is None:
            raise
        raise translated from err


def build_trainer(cfg: DictConfig, async_checkpoint: bool = False, **kwargs: Any) -> Any:
    """The ``lightning.Trainer`` of the ``trainer`` node; ``async_checkpoint``: checkpoints
    written in the background (:class:`BackgroundCheckpointIO`). Always
    ``use_distributed_sampler=False``: volseg's samplers shard every loader by rank themselves,
    and Lightning's would shard them twice."""
    if cfg.get("use_distributed_sampler"):
        raise UserInputError(
            f"trainer.use_distributed_sampler={cfg.use_distributed_sampler}: volseg's samplers "
            "shard the data by rank themselves; Lightning's would shard it twice. Remove the key"
        )
    if async_checkpoint:
        kwargs["plugins"] = [*kwargs.get("plugins", []), BackgroundCheckpointIO()]
    return build(cfg, "trainer", use_distributed_sampler=False, **kwargs)


def config_error(err: BaseException, key: str, cfg: DictConfig) -> UserInputError | None:
    """The :class:`UserInputError` for ``err``; ``None`` when not about a config value."""
    chain = causes(err)
    ours = next((e for e in chain if isinstance(e, UserInputError)), None)
    if ours is not None or any(isinstance(e, MissingMandatoryValue) for e in chain):
        return ours  # None for a ??? value: the entry point names it and shows the command
    # Hydra's wrapper names the node that failed ("full_key: model.net")
    where = next((m.group(1) for e in chain if (m := re.search(r"full_key: (\S+)", str(e)))), key)
    node = OmegaConf.select(cfg, where.removeprefix(f"{key}."))
    not_found = [e for e in chain if str(e).startswith("Error locating target")]
    loading = [e for e in chain if str(e).startswith("Error loading '")]
    if loading and not not_found:  # a class named inside the node (get_class's path) is missing
        if not isinstance(chain[-1], ImportError | AttributeError | ValueError):
            return None  # its module raised while importing: a bug, with its traceback
        path = re.match(r"Error loading '([^']*)'", str(loading[0])).group(1)
        if isinstance(node, DictConfig) and node.get("path") == path:
            where = f"{where}.path"
        return import_failure(loading[0], f"{where}={path}")
    if not_found:
        target = re.search(r"Error locating target '([^']*)'", str(not_found[0]))
        target = target.group(1) if target else ""
        root = chain[-1]
        if isinstance(root, ModuleNotFoundError) and not (
            root.name and (target == root.name or target.startswith(f"{root.name}."))
        ):
            # the target's module exists, but a package it imports is missing (volseg's: a bug)
            if not root.name or root.name.split(".")[0] == "volseg":
                return None
            return missing(root.name, f"{key} ({target})")
        if not isinstance(root, ModuleNotFoundError | AttributeError):
            return None  # the target's module raised while importing: a bug, with its traceback
        cause = not_found[0]  # a _target_ that names nothing
    elif isinstance(chain[-1], CONFIG_VALUE_ERRORS) or _argument_assertion(chain[-1]):
        cause = chain[-1]
    else:
        return None
    message = str(cause).split("\nfull_key:")[0].split(", set env var HYDRA_FULL_ERROR")[0]
    message = message.replace("\n", " ").strip() or type(cause).__name__
    if re.match(rf"{re.escape(key)}[.=: ]", message):
        return UserInputError(message)  # the constructor named the key itself
    if where != key:
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", message)
        if unexpected and isinstance(node, DictConfig) and unexpected.group(1) in node:
            return UserInputError(f"{where}.{unexpected.group(1)}: {message}")  # a misspelt one
        if isinstance(cause, AssertionError) and isinstance(node, DictConfig):
            # an assertion names the argument it checks ("... divisible by num_groups")
            named = [k for k in node if re.search(rf"\b{re.escape(str(k))}\b", message)]
            if named:
                return UserInputError(f"{where}.{named[0]}={node[named[0]]}: {message}")
        first = re.match(r"\w+", message)
        if isinstance(node, DictConfig) and first and first.group(0) in node:
            return at_config_key(message, where)  # the component named its own parameter
    else:  # a key of the node that the message mentions (Lightning: "Precision '17' is invalid")
        named = [
            k
            for k, v in cfg.items()
            if v is not None and re.search(rf"\b{re.escape(str(k))}\b", message, re.IGNORECASE)
        ]
        # a key written as an argument ("devices=0") before one merely mentioned ("accelerator")
        named.sort(key=lambda k: re.search(rf"\b{re.escape(str(k))}\s*=", message) is None)
        if named:
            where = f"{key}.{named[0]}={cfg[named[0]]}"
    return UserInputError(f"{where}: {message}")


def _argument_assertion(err: BaseException) -> bool:
    """An ``AssertionError`` raised outside volseg (another project's constructor checking its
    arguments); one of volseg's own is a bug and keeps its traceback."""
    if not isinstance(err, AssertionError) or err.__traceback__ is None:
        return False
    raised_in = traceback.extract_tb(err.__traceback__)[-1].filename
    return "/volseg/" not in raised_in.replace("\\", "/")


def instantiate_group(cfg: DictConfig | None, group: str) -> list:
    """One object per entry of the ``group`` node (``callbacks``, ``logger``) with a
    ``_target_``; a W&B logger in a multirun is grouped by the sweep."""
    objects = []
    for name, entry in (cfg or {}).items():
        if not (isinstance(entry, DictConfig) and "_target_" in entry):
            continue
        file_log.info("Instantiating %s.%s <%s>", group, name, entry._target_)
        kwargs = {}
        # every job of a multirun is its own W&B run; grouped by the sweep's folder name
        if str(entry._target_).endswith("WandbLogger") and not entry.get("group") and in_multirun():
            kwargs["group"] = Path(HydraConfig.get().sweep.dir).name
        objects.append(build(entry, f"{group}.{name}", **kwargs))
    return objects
