"""Volumes in, patches out: the DataModule, dataset layouts and readers, checks, transforms.

- ``datamodule``: ``VolumeDataModule`` (``data=folder``); ``msd``, ``hdf5``: the other layouts;
  ``synthetic``, ``mni152``: the embedded datasets.
- ``cases``: finding and checking cases; ``io``: reading and writing volumes; ``fingerprint``:
  ``data.patch_size=auto``; ``host_memory``: the data side's RAM.
- ``transforms``, ``sampling``, ``loader_options``: augmentation, patch sampling, loaders and
  their workers.
"""
