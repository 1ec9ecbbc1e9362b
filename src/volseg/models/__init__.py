"""The 3D U-Net and the LightningModule that trains it."""

from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D

__all__ = ["SegmentationModule", "UNet3D"]
