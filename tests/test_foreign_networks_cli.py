"""docs/networks.md's ``model/net=custom`` overrides for other projects' U-Nets, as a user types
them: a real ``python train.py`` of one optimizer step each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import PLAIN_CONV_UNET_CUSTOM, REPO

#: the overrides docs/networks.md gives (at smaller widths)
CUSTOM = {
    "PlainConvUNet": [*PLAIN_CONV_UNET_CUSTOM, "model/loss=deep_supervision"],
    "ResidualUNet3D": [
        "model/net=custom",
        "model.net._target_=pytorch3dunet.unet3d.model.ResidualUNet3D",
        "+model.net.f_maps=4",
        "+model.net.num_levels=3",
    ],
}
PACKAGE = {"PlainConvUNet": "dynamic_network_architectures", "ResidualUNet3D": "pytorch3dunet"}


@pytest.mark.slow
@pytest.mark.parametrize("name", CUSTOM)
def test_the_documented_custom_override_trains_with_python_train_py(small_dataset, tmp_path, name):
    pytest.importorskip(PACKAGE[name])
    run = tmp_path / "run"
    args = [
        *CUSTOM[name],
        f"data.root={small_dataset}",
        "data.patch_size=[16,32,32]",
        "data.batch_size=1",
        "data.samples_per_volume=1",
        "trainer.max_steps=1",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "trainer.accelerator=cpu",
        "trainer.precision=32",
        "callbacks.rich_progress_bar=null",
        "extras.print_config=false",
        "memory.plan_step=false",
        f"hydra.run.dir={run}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    saved = yaml.safe_load((Path(run) / "plan.yaml").read_text())
    assert saved["config"]["model"]["net"]["_target_"].endswith(name)
    summary = json.loads((Path(run) / "summary.json").read_text())
    assert summary["global_step"] == 1 and summary["parameters"] > 0
