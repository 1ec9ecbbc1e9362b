"""Plan a run without training: ``python plan.py data.root=DIR [memory.budget=16GiB]
[memory.plan_device=cuda]`` prints the dataset's fingerprint and the plan, and writes plan.yaml
(train it with ``python train.py plan=PATH``)."""

import hydra
from omegaconf import DictConfig

from volseg.utils.entry import run_main, run_task, set_project_root

set_project_root(__file__)


@hydra.main(version_base="1.3", config_path="configs", config_name="plan.yaml")
def main(cfg: DictConfig) -> None:
    from volseg.tasks.plan import plan_command

    run_task(plan_command, cfg)


if __name__ == "__main__":
    run_main(main)
