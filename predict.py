"""Predict new volumes: ``python predict.py ckpt_path=PATH input=DIR_OR_FILE output=DIR``."""

import hydra
from omegaconf import DictConfig

from volseg.utils.entry import run_main, run_task, set_project_root

set_project_root(__file__)


@hydra.main(version_base="1.3", config_path="configs", config_name="predict.yaml")
def main(cfg: DictConfig) -> None:
    from volseg.tasks.predict import predict

    run_task(predict, cfg)


if __name__ == "__main__":
    run_main(main)
