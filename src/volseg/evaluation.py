"""``evaluate(cfg)``: what ``python eval.py ckpt_path=PATH`` runs."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from volseg.callbacks.prediction_writer import ValidationPredictionWriter
from volseg.utils.errors import UserInputError
from volseg.utils.instantiate import instantiate_loggers

log = logging.getLogger(__name__)


def load_run_config(ckpt_path: str | Path) -> tuple[dict[str, Any], DictConfig]:
    """The checkpoint (loaded with ``weights_only=True``) and the train config saved in it."""
    path = Path(ckpt_path)
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


def _data_overrides() -> DictConfig:
    """The ``data.*`` overrides the user gave on this command line."""
    if not HydraConfig.initialized():
        return OmegaConf.create()
    dotlist = [o for o in HydraConfig.get().overrides.task if o.startswith("data.")]
    return OmegaConf.from_dotlist(dotlist).get("data", OmegaConf.create())


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Validate a checkpoint on the validation split and write its predicted label volumes.

    Model and data come from the config saved in the checkpoint; ``data.*`` overrides on the
    command line replace the saved data values. Writes ``predictions/`` and ``eval_summary.json``
    into the run dir and returns the validation metrics.
    """
    checkpoint, run_cfg = load_run_config(cfg.ckpt_path)
    data_cfg = OmegaConf.merge(run_cfg.data, _data_overrides())
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)

    datamodule: L.LightningDataModule = hydra.utils.instantiate(data_cfg)
    datamodule.prepare_data()
    datamodule.check()
    model: L.LightningModule = hydra.utils.instantiate(run_cfg.model)
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as err:
        raise UserInputError(
            f"ckpt_path={cfg.ckpt_path}: weights do not fit the network in its saved config ({err})"
        ) from None

    writer = ValidationPredictionWriter(cfg.predictions_dir)
    trainer: L.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=[writer], logger=instantiate_loggers(cfg.get("logger"))
    )
    results = trainer.validate(model=model, datamodule=datamodule)
    metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    summary = {
        "ckpt_path": str(cfg.ckpt_path),
        "data_root": str(data_cfg.root),
        "metrics": metrics,
        "predictions": [str(p) for p in writer.written],
    }
    out = Path(cfg.paths.output_dir) / "eval_summary.json"
    out.write_text(json.dumps(summary, indent=2))
    log.info("Wrote %d predictions to %s", len(writer.written), cfg.predictions_dir)
    return metrics
