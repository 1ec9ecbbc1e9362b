"""``build_model(cfg)``: the LightningModule ``train.py`` trains and the memory estimator estimates,
built in one place so that the two cannot drift."""

from __future__ import annotations

from lightning.pytorch import LightningModule
from omegaconf import DictConfig

from volseg.utils.instantiate import build


def build_model(cfg: DictConfig) -> LightningModule:
    """The ``model`` node of ``cfg`` as a LightningModule; a bad value: one ``UserInputError``."""
    return build(cfg.model, "model")
