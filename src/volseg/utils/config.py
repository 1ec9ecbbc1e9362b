"""Config values as plain Python."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict


def plain(value: Any) -> Any:
    """``value`` with every config node or sequence made a plain list or dict."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [plain(v) for v in value]
    return value


def is_voxels(value: Any) -> bool:
    """Whether ``value`` is ``[D, H, W]``: three whole numbers > 0."""
    return (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )


def set_key(cfg: DictConfig, key: str, value: Any) -> None:
    """Set the dotted ``key`` of ``cfg`` to ``value``, replacing it, added where missing."""
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def compose_run_config(
    config_dir: Path | str, config_name: str, overrides: Sequence[str], run_dir: Path | str
) -> DictConfig:
    """``config_name`` composed as its entry point does, writing into ``run_dir``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(Path(config_dir).resolve())):
        cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)
        cfg.hydra.runtime.output_dir = str(run_dir)
        cfg.hydra.run.dir = str(run_dir)
        cfg.hydra.job.num = 0
        cfg.hydra.job.id = 0
    HydraConfig().set_config(cfg)
    return cfg


#: keys that are gone, and what replaces each (one line, exit 2, before anything is composed)
RENAMED_KEYS = {
    "estimate.budget": "memory.budget (the one budget: plan.py and estimate_memory.py plan a "
    "step over it, train.py stops before a run over it)",
    "estimate.device": "memory.plan_device (cuda plans for a GPU this machine lacks)",
    "estimate.search": "memory.budget: plan.py and estimate_memory.py plan the batch, then "
    "checkpointing, micro-batches, loss checkpointing and a smaller patch",
    "estimate.zero_grad": "nothing: only the benchmarks' hand-written loops need it, and they "
    "set it themselves (+estimate.zero_grad=...)",
    # the estimate group joined memory: each key kept its name
    **{
        f"estimate.{key}": f"memory.{key}"
        for key in (
            "cuda_context_mib",
            "gpu",
            "max_batch_size",
            "checkpointing_options",
            "val_shape",
            "plan_step",
            "json_out",
            "overwrite",
            "top",
        )
    },
}


def renamed_key(overrides: Sequence[str]) -> str | None:
    """The first override of a key in :data:`RENAMED_KEYS`, as one line, or ``None``."""
    for override in overrides:
        if override.startswith("+"):
            continue
        key = override.lstrip("~").split("=", 1)[0].strip()
        if key in RENAMED_KEYS:
            return f"{override}: {key} is gone; use {RENAMED_KEYS[key]}"
    return None
