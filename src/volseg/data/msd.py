"""The Medical Segmentation Decathlon / nnU-Net layout.

```
ROOT/dataset.json       {"channel_names": {"0": "T2", "1": "ADC"},     (or "modality")
                         "labels": {"background": 0, "zone": 1},       (or {"0": "background"})
                         "numTraining": 32, "file_ending": ".nii.gz"}  (optional, checked)
ROOT/imagesTr/<id>_0000<ending>, <id>_0001<ending>, ...   one file per channel
ROOT/labelsTr/<id><ending>
ROOT/imagesTs/<id>_0000<ending>, ...                       optional, for predict.py
```

Class names and channel names come from ``dataset.json``, and so do ``num_classes`` and
``in_channels`` (``train.py`` builds the network with them). A ``training`` list in
``dataset.json`` (nnU-Net v1 / MSD) is checked against the files.
"""

from __future__ import annotations

import glob
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from volseg.data.cases import Case, find_inputs, input_problems
from volseg.data.datamodule import VolumeDataModule
from volseg.data.io import VOLUME_SUFFIXES, match_suffix
from volseg.utils.errors import UserInputError, raise_problems

log = logging.getLogger(__name__)

CHANNEL_FILE = re.compile(r"^(?P<id>.+)_(?P<channel>\d{4})$")


def _indexed_names(mapping: Any, what: str, source: Path) -> list[str]:
    """Names by index from ``{"0": name}`` or ``{name: 0}``; indices must be ``0..n-1``."""
    if not isinstance(mapping, dict) or not mapping:
        raise UserInputError(f"{source}: '{what}' must be a non-empty mapping")
    first_key = next(iter(mapping))
    try:
        if str(first_key).isdigit():
            by_index = {int(k): str(v) for k, v in mapping.items()}
        else:
            by_index = {int(v): str(k) for k, v in mapping.items()}
    except (TypeError, ValueError):
        raise UserInputError(
            f"{source}: '{what}' must map indices to names (or names to integer indices; "
            f"region-based labels are not supported), got {mapping}"
        ) from None
    if sorted(by_index) != list(range(len(by_index))):
        raise UserInputError(
            f"{source}: '{what}' indices must be 0..{len(by_index) - 1}, got {sorted(by_index)}"
        )
    return [by_index[i] for i in range(len(by_index))]


def read_dataset_json(root: Path) -> dict[str, Any]:
    """``{"class_names", "channel_names", "file_ending", "num_training", "training"}``."""
    source = root / "dataset.json"
    if not source.is_file():
        raise UserInputError(
            f"data.root={root}: no dataset.json (the msd layout needs dataset.json, imagesTr/ "
            "and labelsTr/; data=folder reads images/ + labels/)"
        )
    try:
        raw = json.loads(source.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"{source}: not valid JSON ({err})") from None
    if "labels" not in raw:
        raise UserInputError(f"{source}: no 'labels' (class names by index)")
    channels = raw.get("channel_names", raw.get("modality"))
    if channels is None:
        raise UserInputError(f"{source}: no 'channel_names' (or 'modality')")
    ending = raw.get("file_ending")
    if ending is not None and ending not in VOLUME_SUFFIXES:
        raise UserInputError(
            f"{source}: file_ending {ending!r} is not supported ({', '.join(VOLUME_SUFFIXES)})"
        )
    return {
        "class_names": _indexed_names(raw["labels"], "labels", source),
        "channel_names": _indexed_names(channels, "channel_names", source),
        "file_ending": ending,
        "num_training": raw.get("numTraining"),
        "training": raw.get("training"),
    }


def group_channel_files(
    files: Sequence[Path], endings: Sequence[str]
) -> tuple[dict[str, dict[int, Path]], list[Path]]:
    """``{"<id><ending>": {channel: file}}`` from ``<id>_NNNN<ending>`` files, and the files
    without a channel suffix."""
    groups: dict[str, dict[int, Path]] = {}
    plain = []
    for path in files:
        split = match_suffix(path.name, endings)
        if split is None:
            continue
        match = CHANNEL_FILE.match(split[0])
        if match is None:
            plain.append(path)
            continue
        groups.setdefault(match["id"] + split[1], {})[int(match["channel"])] = path
    return dict(sorted(groups.items())), plain


def _training_list_problems(
    root: Path, dataset: dict[str, Any], endings: Sequence[str], images: dict[str, Any]
) -> list[str]:
    """Files of a ``training`` list (MSD, nnU-Net v1) that do not exist."""
    problems = []
    for entry in dataset["training"] or []:
        for key in ("image", "label"):
            listed = entry.get(key) if isinstance(entry, dict) else None
            if listed is None:
                continue
            path = root / listed
            split = match_suffix(path.name, endings)
            # nnU-Net v1 lists images without their channel suffix
            exists = path.is_file() or (key == "image" and split and "".join(split) in images)
            if not exists:
                problems.append(
                    f"{root / 'dataset.json'}: lists {listed} ('training' {key}), file not found"
                )
    return problems


def find_msd_cases(root: Path, dataset: dict[str, Any]) -> tuple[list[Case], list[str]]:
    """Complete cases of ``imagesTr/`` + ``labelsTr/``, and every disagreement with
    ``dataset.json`` (missing or extra channel files, unpaired files, listed files missing,
    ``numTraining``)."""
    images_dir, labels_dir = root / "imagesTr", root / "labelsTr"
    missing = [f"{d}: folder is missing" for d in (images_dir, labels_dir) if not d.is_dir()]
    if missing:
        raise UserInputError(f"data.root={root}: not an msd dataset folder", missing)
    endings = [dataset["file_ending"]] if dataset["file_ending"] else list(VOLUME_SUFFIXES)
    channels = dataset["channel_names"]
    listed = f"{root / 'dataset.json'} lists {len(channels)} channel(s) ({', '.join(channels)})"
    labels = {p.name: p for p in sorted(labels_dir.iterdir()) if match_suffix(p.name, endings)}
    images, plain = group_channel_files(sorted(images_dir.iterdir()), endings)
    problems = [f"{p}: no channel suffix (expected <id>_0000, one file per channel)" for p in plain]
    cases = []
    for name, label in labels.items():
        stem, ending = match_suffix(name, endings)
        found = images.get(name, {})
        if not found:
            expected = images_dir / f"{stem}_0000{ending}"
            problems.append(f"{label}: label has no image (expected {expected})")
            continue
        absent = [images_dir / f"{stem}_{c:04d}{ending}" for c in range(len(channels))]
        absent = [p for c, p in enumerate(absent) if c not in found]
        extra = [found[c] for c in sorted(found) if c >= len(channels)]
        problems += [f"{p}: missing; {listed}" for p in absent]
        problems += [f"{p}: an extra channel; {listed}" for p in extra]
        if not absent and not extra:
            cases.append(Case(name, tuple(found[c] for c in range(len(channels))), label))
    problems += [
        f"{found[min(found)]}: image has no label (expected {labels_dir / name})"
        for name, found in images.items()
        if name not in labels
    ]
    problems += _training_list_problems(root, dataset, endings, images)
    num_training = dataset["num_training"]
    if num_training is not None and num_training != len(labels):
        problems.append(
            f"{root / 'dataset.json'}: numTraining={num_training}, but {labels_dir} holds "
            f"{len(labels)} labels"
        )
    if not labels and not problems:
        raise UserInputError(f"data.root={root}: no labels found in {labels_dir}")
    return cases, problems


class MSDDataModule(VolumeDataModule):
    """:class:`VolumeDataModule` for the MSD / nnU-Net layout (see the module docstring).

    ``num_classes`` and ``in_channels`` may be ``None`` (the default in ``data=msd``): they are
    read from ``dataset.json`` in :meth:`check`. Given explicitly, they must agree with it.
    """

    multichannel = True

    def __init__(
        self, root: str, num_classes: int | None = None, in_channels: int | None = None, **kw: Any
    ) -> None:
        super().__init__(root, num_classes=num_classes, in_channels=in_channels, **kw)
        self.channel_names: list[str] | None = None

    def find(self) -> tuple[list[Case], list[str]]:
        dataset = read_dataset_json(self.root)
        for key, found in (
            ("num_classes", len(dataset["class_names"])),
            ("in_channels", len(dataset["channel_names"])),
        ):
            given = getattr(self, key)
            if given is not None and given != found:
                raise UserInputError(
                    f"data.{key}={given}: {self.root / 'dataset.json'} says {found} "
                    f"(leave data.{key}=null to take it from there)"
                )
            setattr(self, key, found)
        self.channel_names = dataset["channel_names"]
        if self._class_names is None:
            self._class_names = dataset["class_names"]
        log.info("dataset.json: classes %s, channels %s", self._class_names, self.channel_names)
        return find_msd_cases(self.root, dataset)

    @property
    def classes_from(self) -> str:
        return f"{self.num_classes} classes listed in {self.root / 'dataset.json'}"

    def predict_cases(self, path: str | Path, in_channels: int) -> list[Case]:
        """Cases of ``path`` (e.g. ``imagesTs/``): channel files ``<id>_NNNN`` grouped into one
        case named ``<id><ending>``; a single ``<id>_0000`` file brings its sibling channels."""
        path = Path(path)
        files = [c.image_files[0] for c in find_inputs(path)]
        if path.is_file():
            split = match_suffix(path.name, VOLUME_SUFFIXES)
            match = CHANNEL_FILE.match(split[0]) if split else None
            if match is not None:
                siblings = path.parent.glob(f"{glob.escape(match['id'])}_[0-9][0-9][0-9][0-9]*")
                files = [p for p in siblings if p.name.endswith(split[1])]
        groups, plain = group_channel_files(sorted(files), VOLUME_SUFFIXES)
        cases = [Case(p.name, p, None) for p in plain]  # single-channel files without a suffix
        problems = []
        for name, channels in groups.items():
            if sorted(channels) != list(range(len(channels))):
                problems.append(
                    f"{channels[min(channels)]}: channel files {sorted(channels)} of {name} are "
                    "not 0..n-1 (one <id>_NNNN file per channel, numbered from 0000)"
                )
                continue
            cases.append(Case(name, tuple(channels[c] for c in sorted(channels)), None))
        problems += input_problems(cases, in_channels, self.orientation)
        raise_problems(problems, "the input")
        return cases
