"""``${if_embedded:ROOT,EMBEDDED_ROOT,THEN,ELSE}``: the embedded dataset's own choices stay its own.

``configs/data/synthetic.yaml`` is the default data config, and users point it at their own
data with ``python train.py data.root=DIR``. Its augmentations (every flip, 90° turns) suit
the embedded rotation-free objects only; on a brain they destroy the position cues the
classes depend on. So each such value reads ``THEN`` while ``data.root`` is the embedded folder
and ``ELSE`` (``data=folder``'s default) for any other root.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import OmegaConf

RESOLVER = "if_embedded"


def if_embedded(root: Any, embedded_root: Any, then: Any, otherwise: Any) -> Any:
    """``then`` when ``root`` and ``embedded_root`` name the same folder, else ``otherwise``."""
    same = os.path.normpath(os.path.abspath(str(root))) == os.path.normpath(
        os.path.abspath(str(embedded_root))
    )
    chosen = then if same else otherwise
    # a container, not a plain list: OmegaConf.resolve (``--cfg job --resolve``) can hold it
    return OmegaConf.create(chosen) if isinstance(chosen, list | dict) else chosen


def register_embedded_defaults_resolver() -> None:
    """Make ``${if_embedded:...}`` known to OmegaConf."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, if_embedded)
