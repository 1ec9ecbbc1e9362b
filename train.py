"""Train a 3D U-Net: ``python train.py [overrides]`` (see configs/train.yaml)."""

import hydra
from omegaconf import DictConfig

from volseg.utils.entry import run_main, run_task, set_project_root
from volseg.utils.sweep import JobStopped, objective

set_project_root(__file__)


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | list[float | None] | JobStopped | None:
    from volseg.tasks.train import train

    # the value(s) of optimized_metric for the Optuna sweeper; a JobStopped for a job of a
    # multirun that failed or was pruned
    return objective(run_task(train, cfg), cfg.get("optimized_metric"))


if __name__ == "__main__":
    run_main(main)
