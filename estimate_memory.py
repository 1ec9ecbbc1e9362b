"""The memory report of the run plan.py plans: ``python estimate_memory.py [overrides]``."""

import hydra
from omegaconf import DictConfig

from volseg.utils.entry import run_main, run_task, set_project_root

set_project_root(__file__)


@hydra.main(version_base="1.3", config_path="configs", config_name="estimate_memory.yaml")
def main(cfg: DictConfig) -> None:
    from volseg.tasks.estimate_memory import run_estimate

    run_task(run_estimate, cfg)


if __name__ == "__main__":
    run_main(main)
