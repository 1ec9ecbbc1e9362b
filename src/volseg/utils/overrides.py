"""An override Hydra cannot apply, as one line naming the closest valid keys or options."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError


def _closest(name: str, choices: list[str]) -> list[str]:
    return difflib.get_close_matches(name, choices, n=3, cutoff=0.5)


def group_options(config_dir: Path, group: str) -> list[str]:
    """A group's options a user picks, without those only others build on (``model/base``)."""
    folder = config_dir / group
    options = sorted(p.stem for p in folder.glob("*.yaml"))
    bases: set[str] = set()
    for name in options:
        try:
            loaded = yaml.safe_load((folder / f"{name}.yaml").read_text()) or {}
        except yaml.YAMLError:
            continue
        defaults = loaded.get("defaults", []) if isinstance(loaded, dict) else []
        bases |= {d for d in defaults if isinstance(d, str) and d in options and d != name}
    return [o for o in options if o not in bases]


def explain(config_dir: Path, config_name: str, overrides: list[str]) -> str | None:
    """The line naming the unknown key or group option among ``overrides`` and the closest valid
    ones; ``None`` for any other failure (Hydra's message stands)."""
    kept = [o for o in overrides if not o.startswith("-")]
    GlobalHydra.instance().clear()  # Hydra's run may have left it set; the block restores this
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir)):
        try:
            compose(config_name, overrides=kept)
        except MissingConfigException as err:
            return _missing_option(config_dir, err, kept)
        except ConfigCompositionException as err:
            cause = err.__cause__
            if not isinstance(cause, ConfigKeyError | ConfigAttributeError) or not getattr(
                cause, "full_key", None
            ):
                return None
            key = str(cause.full_key)
            bad = next((o for o in kept if o.split("=", 1)[0].lstrip("~") == key), None)
            if bad is None:
                return None
            parent, _, leaf = key.rpartition(".")
            cfg = compose(config_name, overrides=[o for o in kept if o != bad])
            node = OmegaConf.select(cfg, parent) if parent else cfg
            keys = [str(k) for k in node] if isinstance(node, DictConfig) else []
            near = [f"{parent}.{k}" if parent else k for k in _closest(leaf, keys)]
            hint = f"did you mean {' or '.join(near)}?" if near else ""
            if not near and keys:
                hint = f"keys of {parent or 'the config'}: {', '.join(keys)}"
            return f"{bad}: {key} is not a config key; {hint}".rstrip("; ")
        except Exception:
            return None
    return None


def _missing_option(config_dir: Path, err: Exception, overrides: list[str]) -> str | None:
    """``model=unet_huge``: the group's options, the closest first."""
    missing = getattr(err, "missing_cfg_file", None) or ""
    group, _, option = str(missing).rpartition("/")
    if not group or not (config_dir / group).is_dir():
        return None
    options = group_options(config_dir, group)
    dotted = group.replace("/", ".")
    bad = next(
        (o for o in overrides if o.lstrip("+~").split("=", 1)[0] in (group, dotted)),
        f"{group}={option}",
    )
    near = _closest(option, options)
    listed = ", ".join(dict.fromkeys([*near, *options]))  # the closest first
    lead = f"did you mean {' or '.join(near)}? " if near else ""
    return f"{bad}: no {group} named {option!r} in configs/{group}/; {lead}options: {listed}"


def why_composing_failed(args: list[str]) -> str | None:
    """The line naming the first of ``args`` that does not parse, else the unknown key or group
    option among them (:func:`explain`, against the entry point's ``configs/<script>.yaml``);
    ``None``: Hydra's own message stands."""
    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-"):
            continue  # Hydra's own flags (--multirun, --cfg job)
        try:
            parser.parse_override(arg)
        except Exception:
            return (
                f"{arg}: not a valid override (key=value; quote values with brackets, "
                "commas or spaces, e.g. 'data.patch_size=[32,64,64]')"
            )
    config_dir = Path(os.environ.get("PROJECT_ROOT", ".")) / "configs"
    name = Path(sys.argv[0]).stem
    return explain(config_dir, name, args) if (config_dir / f"{name}.yaml").is_file() else None
