"""The memory monitor's charts (timeline, per-layer bars) pushed to TensorBoard and W&B.

The monitor writes them as PNGs into its ``output_dir``; :func:`log_memory_charts` sends the ones
that exist to whichever of those loggers are on, once, at fit end.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger  # noqa: E402

from volseg.memory.monitor.callback import MemoryMonitor  # noqa: E402
from volseg.utils.loggers import loggers_of  # noqa: E402

# the files MemoryMonitor writes into its output_dir (timeline at fit end, layers at trace_step)
MEMORY_CHARTS = {"mem/timeline": "memory_timeline.png", "mem/layers": "memory_layers.png"}


def png_as_rgb(path: Path) -> np.ndarray:
    """A PNG file as an RGB array ``(H, W, 3)`` uint8 (for TensorBoard)."""
    picture = plt.imread(path)
    if picture.dtype != np.uint8:
        picture = (picture * 255).round().astype(np.uint8)
    return picture[..., :3]


def log_memory_charts(trainer: Trainer) -> dict[str, Path]:
    """Log the memory monitor's charts that exist to TensorBoard (images) and W&B; returns them
    by key (empty without a :class:`MemoryMonitor` among the callbacks)."""
    monitor = next((c for c in trainer.callbacks if isinstance(c, MemoryMonitor)), None)
    if monitor is None:
        return {}
    charts = {
        key: monitor.output_dir / name
        for key, name in MEMORY_CHARTS.items()
        if (monitor.output_dir / name).is_file()
    }
    if not charts:
        return charts
    step = trainer.global_step
    for logger in loggers_of(trainer, TensorBoardLogger):
        for key, path in charts.items():
            logger.experiment.add_image(key, png_as_rgb(path), step, dataformats="HWC")
    for logger in loggers_of(trainer, WandbLogger):
        import wandb

        logger.log_metrics({k: wandb.Image(str(p)) for k, p in charts.items()}, step=step)
    return charts
