"""A dataset folder's own defaults: ``<root>/dataset_defaults.json``, written with the dataset.

Mirroring and 90° turns are valid views of the embedded dataset's objects but destroy anatomy's
position cues: the choice belongs to the data, so the generator writes it into the folder (a
copy keeps it). An ``augment`` key left ``null`` in the config takes the folder's value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from volseg.data.transforms import AUGMENT_KEYS
from volseg.utils.errors import UserInputError

DEFAULTS_FILE = "dataset_defaults.json"

#: what the embedded (synthetic) dataset is generated with
EMBEDDED_DEFAULTS: dict[str, Any] = {
    "augment": {"flip_axes": [0, 1, 2], "rotate90_planes": [[1, 2]]}
}


def read_dataset_defaults(root: str | Path) -> dict[str, Any]:
    """The folder's own defaults (``{}`` when it has none); a broken file is one error."""
    path = Path(root) / DEFAULTS_FILE
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: not readable as JSON ({err})") from None
    if not isinstance(found, dict) or not isinstance(found.get("augment", {}), dict):
        raise UserInputError(f'{path}: expected {{"augment": {{...}}}}')
    return found


def resolve_augment(
    augment: Mapping[str, Any] | None, root: str | Path
) -> tuple[dict[str, Any], dict[str, str]]:
    """``data.augment`` with every ``null`` (or missing) key taken from the folder's own
    defaults, else none (``[]`` of mirrorings and turns); returns the values and, per key, where
    each came from (``configured``, the defaults file, or ``data=folder's default``)."""
    own = read_dataset_defaults(root).get("augment", {})
    given = dict(augment or {})
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    folder = f"the dataset's own ({Path(root) / DEFAULTS_FILE})"
    for key in dict.fromkeys([*AUGMENT_KEYS, *given]):
        if given.get(key) is not None:
            values[key], sources[key] = given[key], "configured"
        elif key in own:
            values[key], sources[key] = own[key], folder
        else:
            none = [] if key in AUGMENT_KEYS[:2] else given.get(key)  # no mirroring, no turns
            values[key], sources[key] = none, "data=folder's default"
    return values, sources
