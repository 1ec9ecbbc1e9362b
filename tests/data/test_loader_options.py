"""data.num_workers=auto under launchers (SLURM, torchrun, Lightning's own), and how workers
start when CUDA was initialised before the data were built."""

from __future__ import annotations

import hydra
import pytest
import torch

from volseg.data import loader_options
from volseg.data.loader_options import resolve_loader_options

LAUNCHER_VARIABLES = (
    "SLURM_CPUS_PER_TASK",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "LOCAL_WORLD_SIZE",
)


@pytest.fixture
def launcher(monkeypatch):
    """Sets the affinity mask's size and the launcher's variables (the others removed)."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_up(mask: int, **variables: str) -> None:
        monkeypatch.setattr(loader_options, "available_cores", lambda: mask)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_up


def _workers(devices_per_node: int) -> int:
    return resolve_loader_options("auto", "auto", "auto", "cuda", devices_per_node).num_workers


def test_slurm_task_per_gpu_keeps_its_whole_share(launcher):
    """The shipped slurm launcher config: 8 CPUs per task, one task per GPU, 4 GPUs. The
    task's affinity mask is its own 8 cores: 7 workers, not 8 // 4 - 1 = 1."""
    launcher(8, SLURM_CPUS_PER_TASK="8", SLURM_NTASKS_PER_NODE="4", SLURM_TASKS_PER_NODE="4")
    assert _workers(4) == 7
    launcher(64)  # no affinity plugin: the mask is the node's, the task's share still 8
    assert _workers(4) == 7


def test_slurm_task_holding_several_processes_shares_its_cores(launcher):
    """One task of 32 CPUs (an interactive allocation) in which Lightning starts 4 processes."""
    launcher(32, SLURM_CPUS_PER_TASK="32", SLURM_TASKS_PER_NODE="1(x2)")
    assert _workers(4) == 7


def test_torchrun_shares_the_mask_among_its_local_processes(launcher):
    launcher(16, LOCAL_WORLD_SIZE="4")
    assert _workers(1) == 3  # 4 processes on this node, whatever the trainer's device count


def test_without_a_launcher_lightnings_processes_share_the_mask(launcher):
    launcher(16)
    assert _workers(4) == 3
    assert _workers(1) == 8  # at most MAX_AUTO_WORKERS


@pytest.mark.slow
def test_workers_start_by_forkserver_when_cuda_was_initialised_before_the_data(
    train_cfg, monkeypatch
):
    """An earlier run in this process (multirun, notebook) initialised CUDA: forked workers
    would inherit its state. Faked here; the loader is real and yields a batch."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    datamodule = hydra.utils.instantiate(train_cfg.data, num_workers=1, persistent_workers=False)
    monkeypatch.undo()  # what the data were built under is what counts
    datamodule.prepare_data()
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    batch = next(iter(loader))  # the dataset and its cache pickle into a fresh process
    assert batch["image"].shape[0] == datamodule.batch_size
    cold = resolve_loader_options(1, "auto", "auto", "cuda", cuda_initialized=False)
    assert cold.multiprocessing_context is None  # fork: the cache shared, not pickled
