"""``evaluate(cfg)``: what ``python eval.py ckpt_path=PATH`` runs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
from omegaconf import DictConfig

from volseg.callbacks.prediction_writer import ValidationPredictionWriter
from volseg.plan.files import plan_from_run
from volseg.utils.checkpoint import load_model, load_run_config
from volseg.utils.entry import file_log, seed_everything
from volseg.utils.errors import UserInputError
from volseg.utils.instantiate import build, build_trainer, instantiate_group

log = logging.getLogger(__name__)


def check_predictions_dir(
    predictions_dir: Path, datamodule: L.LightningDataModule, overwrite: bool
) -> None:
    """One error, before any prediction, when ``predictions_dir`` lies inside the dataset or holds
    predictions of these cases (unless ``overwrite``)."""
    root = Path(datamodule.root).resolve()
    target = predictions_dir.resolve()
    if target == root or root in target.parents:
        raise UserInputError(
            f"predictions_dir={predictions_dir}: inside data.root={datamodule.root}; predictions "
            "written there would change the dataset. Choose a folder outside it"
        )
    existing = [
        f"{predictions_dir / c.name}: exists"
        for c in datamodule.val_cases
        if (predictions_dir / c.name).exists()
    ]
    if existing and not overwrite:
        raise UserInputError(
            f"predictions_dir={predictions_dir}: {len(existing)} prediction file(s) exist; nothing "
            "was written. Pass overwrite=true to replace them, or choose another folder",
            existing,
        )


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Validate a checkpoint with the run's plan and this command's overrides; writes predictions,
    ``plan.yaml`` and ``eval_summary.json``; returns the metrics."""
    checkpoint, run_cfg = load_run_config(cfg.ckpt_path)
    run_plan = plan_from_run(cfg, run_cfg, checkpoint["volseg"].get("plan"), "eval.py")
    file_log.info("%s", run_plan.format())  # every decision and why: eval.log, plan.yaml
    log.info("Wrote %s (the run plan)", run_plan.write(cfg.paths.output_dir))
    cfg = run_plan.run_config()
    seed_everything(cfg)

    datamodule: L.LightningDataModule = build(cfg.data, "data")
    datamodule.prepare_data()
    datamodule.check()
    check_predictions_dir(Path(cfg.predictions_dir), datamodule, cfg.overwrite)
    model = load_model(checkpoint, cfg.model, cfg.ckpt_path)

    writer = ValidationPredictionWriter(cfg.predictions_dir, datamodule.orientation)
    trainer: L.Trainer = build_trainer(
        cfg.trainer, callbacks=[writer], logger=instantiate_group(cfg.get("logger"), "logger")
    )
    results = trainer.validate(model=model, datamodule=datamodule)
    metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    # counted on disk: under a forking strategy the writers ran in the ranks' processes
    predictions = [Path(cfg.predictions_dir) / c.name for c in datamodule.val_cases]
    written = [p for p in predictions if p.exists()]
    summary = {
        "ckpt_path": str(cfg.ckpt_path),
        "data_root": str(cfg.data.root),
        "metrics": metrics,
        "predictions": [str(p) for p in written],
    }
    (Path(cfg.paths.output_dir) / "eval_summary.json").write_text(json.dumps(summary, indent=2))
    log.info("Wrote %d predictions to %s", len(written), cfg.predictions_dir)
    return metrics
