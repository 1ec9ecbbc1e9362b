"""Train a 3D U-Net: ``python train.py [overrides]`` (see configs/train.yaml)."""

import hydra
from omegaconf import DictConfig

from volseg.utils.entry import run_main, run_task, set_project_root

set_project_root(__file__)


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | None:
    from volseg.data.fingerprint import resolve_auto_patch
    from volseg.tasks.train import train

    def plan_and_train(cfg: DictConfig) -> dict[str, float]:
        # data.patch_size=auto from the data, before anything interpolates ${data.patch_size}
        resolve_auto_patch(cfg)
        return train(cfg)

    metrics = run_task(plan_and_train, cfg)  # None for a failed job of a multirun
    return (metrics or {}).get(cfg.get("optimized_metric"))


if __name__ == "__main__":
    run_main(main)
