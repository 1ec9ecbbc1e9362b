"""The HDF5 layout (as in pytorch-3dunet, ``docs/data.md``): one file per volume holding datasets
``data.raw_key`` ``(Z, Y, X)`` or ``(C, Z, Y, X)`` and ``data.label_key``; only those are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from volseg.data.cases import Case, find_inputs, input_problems, volume_files
from volseg.data.datamodule import VolumeDataModule
from volseg.data.io import HDF5_SUFFIXES, require_h5py
from volseg.utils.errors import UserInputError, raise_problems


class HDF5DataModule(VolumeDataModule):
    """:class:`VolumeDataModule` for HDF5 files holding datasets ``raw_key`` and ``label_key``."""

    def __init__(self, root: str, raw_key: str, label_key: str, **kw: Any) -> None:
        super().__init__(root, **kw)
        self.raw_key = raw_key
        self.label_key = label_key

    def find(self) -> tuple[list[Case], list[str]]:
        """One case per HDF5 file in ``root``; files that lack a dataset are problems."""
        if not self.root.is_dir():
            raise UserInputError(f"data.root={self.root}: folder does not exist")
        files = list(volume_files(self.root, HDF5_SUFFIXES).values())
        if not files:
            raise UserInputError(
                f"data.root={self.root}: no HDF5 files (supported: {', '.join(HDF5_SUFFIXES)})"
            )
        h5py = require_h5py()
        cases, problems = [], []
        for path in files:
            try:
                with h5py.File(path, "r") as f:
                    names = list(f.keys())
            except Exception as err:  # any reader failure is a bad file, reported with its name
                problems.append(f"{path}: cannot read ({type(err).__name__}: {err})")
                continue
            has = ", ".join(names) or "none"
            absent = [
                f"{path}: no dataset '{key}' (data.{what}; the file has: {has})"
                for key, what in ((self.raw_key, "raw_key"), (self.label_key, "label_key"))
                if key not in names
            ]
            problems += absent
            if not absent:
                cases.append(Case(path.name, path, path, self.raw_key, self.label_key))
        return cases, problems

    @property
    def load_options(self) -> dict[str, Any]:
        return {
            **super().load_options,
            "hdf5_keys": {"image": self.raw_key, "label": self.label_key},
        }

    def predict_cases(self, path: str | Path, in_channels: int) -> list[Case]:
        """The HDF5 file ``path`` or those in the folder ``path``, dataset ``raw_key``."""
        cases = find_inputs(path, HDF5_SUFFIXES, self.raw_key)
        raise_problems(input_problems(cases, in_channels, self.orientation), "the input")
        return cases
