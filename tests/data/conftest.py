"""The data tests' datamodules, composed from the real configs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import pytest

from tests.conftest import compose_config


@pytest.fixture
def data_module(tmp_path: Path) -> Callable[..., Any]:
    """``build(data, root, *overrides)``: the datamodule of ``data=<data>`` reading ``root``, as
    ``train.py`` composes it, with ``data.<key>=<value>`` overrides (``patch_size=[8,16,16]``)."""

    def build(data: str, root: Path, *overrides: str) -> Any:
        given = [f"data.{o}" for o in overrides]
        cfg = compose_config(
            "train", tmp_path / "run", [f"data={data}", f"data.root={root}", *given]
        )
        # built from a partial: a UserInputError reaches the test, not Hydra's wrapper of it
        return hydra.utils.instantiate(cfg.data, _partial_=True)()

    return build
