"""Evaluate a checkpoint: ``python eval.py ckpt_path=PATH [data.root=DIR]``."""

import hydra
from omegaconf import DictConfig

from volseg.utils.entry import run_main, run_task, set_project_root

set_project_root(__file__)


@hydra.main(version_base="1.3", config_path="configs", config_name="eval.yaml")
def main(cfg: DictConfig) -> None:
    from volseg.tasks.evaluate import evaluate

    run_task(evaluate, cfg)


if __name__ == "__main__":
    run_main(main)
