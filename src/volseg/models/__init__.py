"""The 3D U-Net, the LightningModule that trains it, and the memory levers it applies."""
