"""The Medical Segmentation Decathlon's layout, as its archives ship it, and nnU-Net's
(``docs/data.md``): ``dataset.json`` (``labels``, ``modality`` or ``channel_names``, optional
``training``/``test`` lists, ``numTraining``, ``file_ending``), ``imagesTr/``, ``labelsTr/``,
``imagesTs/``. Images are one file per case in the ``decathlon`` layout (3-D, or 4-D with the
modalities last), one ``<id>_NNNN`` file per channel in ``nnunet``'s (:func:`detect_layout`);
``num_classes`` and ``in_channels`` come from ``dataset.json``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monai.data import load_decathlon_datalist

from volseg.data.cases import Case, find_inputs, input_problems, pairing_problems, volume_files
from volseg.data.datamodule import VolumeDataModule
from volseg.data.io import VOLUME_SUFFIXES, match_suffix
from volseg.utils.errors import UserInputError, raise_problems

CHANNEL_FILE = re.compile(r"^(?P<id>.+)_(?P<channel>\d{4})$")


def _indexed_names(mapping: Any, what: str, source: Path) -> list[str]:
    """Names by index from ``{"0": name}`` or ``{name: 0}``; indices must be ``0..n-1``."""
    if not isinstance(mapping, dict) or not mapping:
        raise UserInputError(f"{source}: '{what}' must be a non-empty mapping")
    by_name = not str(next(iter(mapping))).isdigit()  # {name: 0}, as nnU-Net v2 writes them
    pairs = ((v, k) for k, v in mapping.items()) if by_name else mapping.items()
    try:
        by_index = {int(index): str(name) for index, name in pairs}
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


def _no_dataset_json(root: Path) -> str:
    """Why ``root`` holds no ``dataset.json``, and where to point ``data.root`` instead."""
    if root.is_file() and root.name.endswith((".tar", ".tar.gz", ".tgz", ".zip")):
        return f"an archive; extract it first (e.g. tar -xf {root}) and point data.root at the task"
    if not root.is_dir():
        return "no such folder"
    inside = sorted(p.parent for p in root.glob("*/dataset.json"))
    if inside:
        where = ", ".join(str(p) for p in inside[:3]) + (" ..." if len(inside) > 3 else "")
        return f"no dataset.json here, but in {where}: point data.root at the task folder"
    return (
        "no dataset.json (the msd layout needs dataset.json, imagesTr/ and labelsTr/; "
        "data=folder reads images/ + labels/)"
    )


def read_dataset_json(root: Path) -> dict[str, Any]:
    """``{"class_names", "channel_names", "channels_key", "file_ending", "num_training",
    "training", "test"}`` of ``root/dataset.json``."""
    source = root / "dataset.json"
    if not source.is_file():
        raise UserInputError(f"data.root={root}: {_no_dataset_json(root)}")
    try:
        raw = json.loads(source.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"{source}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise UserInputError(f"{source}: expected a JSON object with 'labels' and 'modality'")
    if "labels" not in raw:
        raise UserInputError(f"{source}: no 'labels' (class names by index)")
    channels_key = "channel_names" if "channel_names" in raw else "modality"
    if channels_key not in raw:
        raise UserInputError(f"{source}: no 'modality' (or 'channel_names'): the image channels")
    ending = raw.get("file_ending")
    if ending is not None and ending not in VOLUME_SUFFIXES:
        raise UserInputError(
            f"{source}: file_ending {ending!r} is not supported ({', '.join(VOLUME_SUFFIXES)})"
        )
    for key in ("training", "test"):
        if key in raw and not isinstance(raw[key], list):
            raise UserInputError(f"{source}: '{key}' must be a list")
    return {
        "class_names": _indexed_names(raw["labels"], "labels", source),
        "channel_names": _indexed_names(raw[channels_key], channels_key, source),
        "channels_key": channels_key,
        "file_ending": ending,
        "num_training": raw.get("numTraining"),
        "training": raw.get("training"),
        "test": raw.get("test"),
    }


def channel_files(path: Path) -> list[Path]:
    """The channel files ``<id>_NNNN<ending>`` of ``<id><ending>`` (nnU-Net's), sorted."""
    split = match_suffix(path.name, VOLUME_SUFFIXES)
    if split is None:
        return []
    return sorted(path.parent.glob(f"{glob.escape(split[0])}_[0-9][0-9][0-9][0-9]{split[1]}"))


def listed_files(root: Path, key: str, layout: str | None) -> tuple[list[Path], list[str]]:
    """The files the ``key`` list of ``root/dataset.json`` names (``training``: images and
    labels, ``test``: images; paths from MONAI's ``load_decathlon_datalist``), and one problem
    per file not found. Outside the ``decathlon`` layout an image listed without its ``_0000``
    suffix (nnU-Net v1) stands for its channel files."""
    source = root / "dataset.json"
    wanted = ("image", "label") if key == "training" else ("image",)
    expected = '{"image": "./imagesTr/<file>", "label": "./labelsTr/<file>"}'
    expected = '"./imagesTs/<file>"' if key == "test" else expected
    raw = json.loads(source.read_text())[key]
    written = [entry if isinstance(entry, dict) else {"image": entry} for entry in raw]
    bad = [e for e in written if not all(isinstance(e.get(k), str) for k in wanted)]
    if bad:
        raise UserInputError(f"{source}: each '{key}' entry must be {expected}, got {bad[0]}")
    items = load_decathlon_datalist(source, key == "training", key, root)
    files, problems = [], []
    for entry, item in zip(written, items, strict=True):
        for k in wanted:
            path = Path(item[k])
            channels = k == "image" and layout != "decathlon" and not path.is_file()
            found = channel_files(path) if channels else [path] if path.is_file() else []
            files += found
            if not found:
                what = f"'{key}' {k}" if key == "training" else f"'{key}'"
                problems.append(f"{source}: lists {entry[k]} ({what}), file not found")
    return files, problems


def group_channel_files(
    files: Sequence[Path], endings: Sequence[str]
) -> tuple[dict[str, dict[int, Path]], list[Path]]:
    """``{"<id><ending>": {channel: file}}`` of ``<id>_NNNN<ending>`` files, and the others."""
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


def detect_layout(
    root: Path, dataset: dict[str, Any], images: dict[str, Path], labels: dict[str, Path]
) -> str:
    """``decathlon`` (one file per case, named as its label) or ``nnunet`` (``_NNNN`` channel
    files), from the first that tells: the ``training`` list's images exist as files or not;
    an image named as a label; channel files; ``dataset.json``'s ``modality`` (the
    Decathlon's) against ``channel_names`` (nnU-Net v2's)."""
    training = dataset["training"] or []
    listed = [
        e["image"] for e in training if isinstance(e, dict) and isinstance(e.get("image"), str)
    ]
    if listed:
        return "decathlon" if any((root / p).is_file() for p in listed) else "nnunet"
    if any(name in images for name in labels):
        return "decathlon"
    if group_channel_files(list(images.values()), VOLUME_SUFFIXES)[0]:  # channel files
        return "nnunet"
    return "decathlon" if dataset["channels_key"] == "modality" else "nnunet"


def find_msd_cases(root: Path, dataset: dict[str, Any]) -> tuple[list[Case], list[str], str]:
    """Complete cases of ``imagesTr/`` + ``labelsTr/``, every disagreement with
    ``dataset.json`` (unpaired files, missing or extra channel files, listed files missing,
    ``numTraining``), and the layout (:func:`detect_layout`)."""
    images_dir, labels_dir = root / "imagesTr", root / "labelsTr"
    missing = [f"{d}: folder is missing" for d in (images_dir, labels_dir) if not d.is_dir()]
    if missing:
        raise UserInputError(f"data.root={root}: not an msd dataset folder", missing)
    endings = [dataset["file_ending"]] if dataset["file_ending"] else list(VOLUME_SUFFIXES)
    labels, images = volume_files(labels_dir, endings), volume_files(images_dir, endings)
    layout = detect_layout(root, dataset, images, labels)
    groups, plain = group_channel_files(list(images.values()), endings)
    if layout == "decathlon":  # one image file per label, of the same name
        problems = pairing_problems(images, labels, labels_dir, images_dir, ", one file per case")
        cases = [Case(name, images[name], path) for name, path in labels.items() if name in images]
    else:
        cases, problems = _nnunet_cases(dataset, root, groups, plain, labels, labels_dir)
    if dataset["training"]:
        problems += listed_files(root, "training", layout)[1]
    num_training = dataset["num_training"]
    if num_training is not None and num_training != len(labels):
        problems.append(
            f"{root / 'dataset.json'}: numTraining={num_training}, but {labels_dir} holds "
            f"{len(labels)} labels"
        )
    if not labels and not problems:
        raise UserInputError(f"data.root={root}: no labels found in {labels_dir}")
    return cases, problems, layout


def _nnunet_cases(
    dataset: dict[str, Any],
    root: Path,
    groups: dict[str, dict[int, Path]],
    plain: list[Path],
    labels: dict[str, Path],
    labels_dir: Path,
) -> tuple[list[Case], list[str]]:
    """One ``<id>_NNNN`` file per channel for each label ``<id>``."""
    images_dir = root / "imagesTr"
    channels = dataset["channel_names"]
    listed = f"{root / 'dataset.json'} lists {len(channels)} channel(s) ({', '.join(channels)})"
    problems = [f"{p}: no channel suffix (expected <id>_0000, one file per channel)" for p in plain]
    cases = []
    for name, label in labels.items():
        stem, ending = match_suffix(name, VOLUME_SUFFIXES) or (name, "")
        found = groups.get(name, {})
        if not found:
            expected = images_dir / f"{stem}_0000{ending}"
            problems.append(f"{label}: label has no image (expected {expected})")
            continue
        absent = [
            images_dir / f"{stem}_{c:04d}{ending}" for c in range(len(channels)) if c not in found
        ]
        extra = [found[c] for c in sorted(found) if c >= len(channels)]
        problems += [f"{p}: missing; {listed}" for p in absent]
        problems += [f"{p}: an extra channel; {listed}" for p in extra]
        if not absent and not extra:
            cases.append(Case(name, tuple(found[c] for c in range(len(channels))), label))
    problems += [
        f"{found[min(found)]}: image has no label (expected {labels_dir / name})"
        for name, found in groups.items()
        if name not in labels
    ]
    return cases, problems


class MSDDataModule(VolumeDataModule):
    """:class:`VolumeDataModule` for the Decathlon / nnU-Net layout: ``num_classes`` and
    ``in_channels`` ``None`` (``data=msd``'s) are read from ``dataset.json``; given, they must
    agree with it."""

    #: from ``dataset.json`` once read (:meth:`find`)
    channel_names: list[str] | None = None
    channels_key = "modality"
    layout: str | None = None

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
        self.channels_key = dataset["channels_key"]
        if self._class_names is None:
            self._class_names = dataset["class_names"]
        cases, problems, self.layout = find_msd_cases(self.root, dataset)
        return cases, problems

    @property
    def classes_from(self) -> str:
        return f"{self.num_classes} classes listed in {self.root / 'dataset.json'}"

    @property
    def channels_from(self) -> str:
        names = ", ".join(self.channel_names or [])
        return f"{self.in_channels} channel(s) ({names}) listed in {self.root / 'dataset.json'}"

    def describe_channels(self) -> str:
        return f"{self.layout} layout, classes {self.class_names}, channels {self.channel_names}"

    def channels_fix(self, in_channels: int, channels: int) -> str:
        names = ", ".join(self.channel_names or [])
        return (
            f"{self.root / 'dataset.json'} lists {in_channels} channel(s) ({names}) in "
            f"'{self.channels_key}' (a 4-D NIfTI image holds its channels on its last axis)"
        )

    def predict_cases(self, path: str | Path, in_channels: int) -> list[Case]:
        """Cases of ``path``: a dataset folder (its ``dataset.json``'s ``test`` list, else
        ``imagesTs/``), a folder of images, or one image file. In the ``decathlon`` layout each
        file is a case; in ``nnunet``'s, channel files ``<id>_NNNN`` are grouped into one case
        named ``<id><ending>`` (a single ``<id>_0000`` file brings its sibling channels)."""
        path = Path(path)
        problems: list[str] = []
        task = path.is_dir() and (path / "dataset.json").is_file()
        if task and read_dataset_json(path)["test"]:
            files, problems = listed_files(path, "test", None)
        else:
            files = [c.image_files[0] for c in find_inputs(path / "imagesTs" if task else path)]
        if self.layout is None:  # the training data's layout, where data.root can be read
            with contextlib.suppress(UserInputError, OSError):
                self.find()
        if self.layout == "decathlon":
            files, groups = list(files), {}
        else:
            split = match_suffix(path.name, VOLUME_SUFFIXES) if path.is_file() else None
            match = CHANNEL_FILE.match(split[0]) if split else None
            if match is not None:  # one channel file brings its siblings
                files = channel_files(path.parent / (match["id"] + split[1]))
            groups, files = group_channel_files(sorted(set(files)), VOLUME_SUFFIXES)
        cases = [Case(p.name, p, None) for p in files]  # one file per case
        for name, channels in groups.items():
            if sorted(channels) != list(range(len(channels))):
                problems.append(
                    f"{channels[min(channels)]}: channel files {sorted(channels)} of {name} are "
                    "not 0..n-1 (one <id>_NNNN file per channel, numbered from 0000)"
                )
                continue
            cases.append(Case(name, tuple(channels[c] for c in sorted(channels)), None))
        raise_problems(problems + input_problems(cases, in_channels, self.orientation), "the input")
        return cases
