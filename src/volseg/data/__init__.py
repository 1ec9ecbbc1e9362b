"""Volumes in, patches out: the DataModule, dataset layouts and readers, checks, transforms.

- ``datamodule``: ``VolumeDataModule`` (``data=folder``); ``msd``, ``hdf5``: the other layouts;
  ``synthetic``, ``mni152``: the embedded datasets.
- ``cases``: finding and checking cases; ``io``: reading and writing volumes; ``fingerprint``:
  spacing and intensity statistics; ``baselines``: reference scores.
- ``transforms``, ``sampling``, ``loader_options``: augmentation, patch sampling, loaders.
"""

__all__ = [
    "baselines",
    "cases",
    "datamodule",
    "fingerprint",
    "hdf5",
    "io",
    "loader_options",
    "mni152",
    "msd",
    "sampling",
    "synthetic",
    "transforms",
]
