"""Train a 3D U-Net: ``python train.py [overrides]`` (see configs/train.yaml)."""

import hydra
from omegaconf import DictConfig

from volseg.utils.entry import run_main, run_task, set_project_root

set_project_root(__file__)


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | None:
    from volseg.tasks.train import train

    metrics = run_task(train, cfg)  # None for a failed job of a multirun
    return (metrics or {}).get(cfg.get("optimized_metric"))


if __name__ == "__main__":
    run_main(main)
