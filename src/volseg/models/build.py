"""``build_model(cfg)``: the LightningModule of a composed ``train`` config, built in one place.

``train.py`` trains what this returns and the memory estimator estimates what this returns: the
network, the loss, the memory levers (validated and applied at build by
:class:`volseg.models.levers.MemoryLevers`) and the optimizer and scheduler factories that the
module's ``configure_optimizers`` calls. Anything that changes the module before a trainer sees
it belongs here, so that the estimate cannot drift from the run.
"""

from __future__ import annotations

from lightning.pytorch import LightningModule
from omegaconf import DictConfig

from volseg.utils.instantiate import build


def build_model(cfg: DictConfig) -> LightningModule:
    """The ``model`` node of ``cfg`` (a composed ``train`` config) as a LightningModule; a bad
    value raises one :class:`~volseg.utils.errors.UserInputError` naming its ``model.*`` key."""
    return build(cfg.model, "model")
