"""The 3D U-Net, the LightningModule that trains it, and the memory levers it applies."""

from volseg.models.levers import MemoryLevers
from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D

__all__ = ["MemoryLevers", "SegmentationModule", "UNet3D"]
