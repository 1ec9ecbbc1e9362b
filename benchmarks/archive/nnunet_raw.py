"""nnU-Net v2's side of the nnU-Net studies (``nnunet_side_by_side``, ``nnunet_recipe``): a
volseg folder dataset in nnU-Net's raw layout, and nnU-Net's own plan of it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_raw_from_folder(folder: Path, raw: Path, class_names: Sequence[str]) -> Path:
    """A volseg folder dataset (``images/``, ``labels/``) in nnU-Net's raw layout (links)."""
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "imagesTr").mkdir(exist_ok=True)
    (raw / "labelsTr").mkdir(exist_ok=True)
    names = sorted(p.name for p in (folder / "images").glob("*.nii.gz"))
    for name in names:
        case = name.removesuffix(".nii.gz")
        for source, target in (
            (folder / "images" / name, raw / "imagesTr" / f"{case}_0000.nii.gz"),
            (folder / "labels" / name, raw / "labelsTr" / name),
        ):
            if not target.exists():
                target.symlink_to(source.resolve())
    dataset = {
        "channel_names": {"0": "image"},
        "labels": {name: i for i, name in enumerate(class_names)},
        "numTraining": len(names),
        "file_ending": ".nii.gz",
    }
    (raw / "dataset.json").write_text(json.dumps(dataset, indent=2))
    return raw


def nnunet_plan(dataset_id: int) -> tuple[dict[str, Any], float]:
    """nnU-Net's fingerprint and default ExperimentPlanner on the raw dataset ``dataset_id``;
    returns the plans and the planner's GPU memory target (GB)."""
    from nnunetv2.experiment_planning.dataset_fingerprint.fingerprint_extractor import (
        DatasetFingerprintExtractor,
    )
    from nnunetv2.experiment_planning.experiment_planners.default_experiment_planner import (
        ExperimentPlanner,
    )

    DatasetFingerprintExtractor(dataset_id, num_processes=2).run(overwrite_existing=True)
    planner = ExperimentPlanner(dataset_id)
    plans = planner.plan_experiment()
    reference = {
        "target_gb": float(planner.UNet_vram_target_GB),
        "reference_value_3d": planner.UNet_reference_val_3d,
        "reference_batch_3d": planner.UNet_reference_val_corresp_bs_3d,
        "reference_gb": planner.UNet_reference_val_corresp_GB,
    }
    return json.loads(json.dumps(plans)), reference
