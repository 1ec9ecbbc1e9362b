"""Run dirs: two runs started in the same second get two folders."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import setup_globals
from omegaconf import OmegaConf

from tests.conftest import CONFIGS
from volseg.utils.resolvers import register_resolvers as register_run_dir_resolver

STOPPED_CLOCK = {"%Y-%m-%d": "2026-01-31", "%H-%M-%S": "12-00-00"}  # ${now:...} patterns


def _dirs_of_a_run(log_dir: Path, config_name: str = "train") -> tuple[str, str]:
    """The run and sweep dirs Hydra would create for ``python <config_name>.py``, with the clock
    stopped at one second."""
    GlobalHydra.instance().clear()
    register_run_dir_resolver()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
        OmegaConf.register_new_resolver("now", STOPPED_CLOCK.__getitem__, replace=True)
        try:
            cfg = compose(config_name, [f"paths.log_dir={log_dir}"], return_hydra_config=True)
            OmegaConf.resolve(cfg.hydra)
        finally:
            setup_globals()  # Hydra's own ${now:...} again
    # a second resolution in the same run gives the same folder (Hydra reads it several times)
    assert cfg.hydra.run.dir == cfg.hydra.run.dir
    return cfg.hydra.run.dir, cfg.hydra.sweep.dir


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    first = _dirs_of_a_run(tmp_path)
    second = _dirs_of_a_run(tmp_path)
    third = _dirs_of_a_run(tmp_path)
    runs = tmp_path / "train" / "runs"
    assert [first[0], second[0], third[0]] == [
        str(runs / "2026-01-31_12-00-00"),
        str(runs / "2026-01-31_12-00-00_1"),
        str(runs / "2026-01-31_12-00-00_2"),
    ]
    assert all(Path(d).is_dir() for d in (first[0], second[0], third[0]))
    assert Path(second[1]).name == "2026-01-31_12-00-00_1"  # sweeps too
    # another entry point in the same second: its own task folder, no suffix
    assert Path(_dirs_of_a_run(tmp_path, "eval")[0]).name == "2026-01-31_12-00-00"
