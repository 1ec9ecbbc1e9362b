"""The 3D U-Net, the LightningModule that trains it, and the memory levers it applies.

- ``unet``: ``UNet3D`` and its blocks; ``checkpointing``, ``offload``: the mechanisms of the
  activation levers; ``levers``: ``MemoryLevers``, every lever validated and applied in one place.
- ``segmentation_module``: loss, metrics, sliding-window validation; ``schedules``: LR schedules.
- ``learning_rate``: ``model.optimizer.lr=auto`` from the number of foreground classes.
- ``build``: ``build_model(cfg)``, the one place a config becomes the module (train.py, estimator).
"""

from volseg.models.levers import MemoryLevers
from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D

__all__ = ["MemoryLevers", "SegmentationModule", "UNet3D"]
