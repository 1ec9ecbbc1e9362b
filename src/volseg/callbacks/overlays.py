"""Validation overlays (image, ground truth, prediction) as pictures in the run dir, W&B and
TensorBoard."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lightning.pytorch import Callback, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402


@dataclass
class VolumeSlices:
    """A few z-slices of one validation volume: ``image`` ``(S, H, W)`` in [0, 1],
    ``label`` and ``pred`` ``(S, H, W)`` class indices, ``z`` the slice indices."""

    name: str
    z: list[int]
    image: np.ndarray
    label: np.ndarray
    pred: np.ndarray


def informative_slices(label: np.ndarray, num_slices: int) -> list[int]:
    """``num_slices`` z-indices of a ``(D, H, W)`` label volume, spread over the depth: the
    depth is cut into equal chunks and each chunk gives its slice with the most foreground."""
    depth = label.shape[0]
    foreground = (label > 0).reshape(depth, -1).sum(axis=1)
    chunks = np.array_split(np.arange(depth), min(num_slices, depth))
    return [int(chunk[np.argmax(foreground[chunk])]) for chunk in chunks]


def normalize(image: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] between the 1st and 99th percentile (robust to a few bright voxels)."""
    low, high = np.percentile(image, [1, 99])
    return np.clip((image - low) / max(high - low, 1e-8), 0.0, 1.0).astype(np.float32)


def class_colours(num_classes: int) -> np.ndarray:
    """RGB colours ``(num_classes, 3)`` in [0, 1]; class 0 (background) is never drawn."""
    cmap = plt.get_cmap("tab10" if num_classes <= 11 else "tab20")
    return np.array([(0.0, 0.0, 0.0), *(cmap(k % cmap.N)[:3] for k in range(num_classes - 1))])


def render_overlay(
    volume: VolumeSlices, class_names: list[str], title: str = "", alpha: float = 0.5
) -> np.ndarray:
    """One picture per volume: a row per slice with image | ground truth | prediction, and a
    legend of the class colours. Returns an RGB array ``(H, W, 3)`` uint8."""
    colours = class_colours(len(class_names))
    rows, (height, width), panel = len(volume.z), volume.image.shape[1:], 2.4  # inches
    size = (3 * panel, rows * panel * height / width + 0.9)
    fig, axes = plt.subplots(rows, 3, figsize=size, squeeze=False, layout="constrained")
    for row, z in enumerate(volume.z):
        grey = np.repeat(volume.image[row][..., None], 3, axis=-1)
        for col, (heading, mask) in enumerate(
            [("image", None), ("ground truth", volume.label[row]), ("prediction", volume.pred[row])]
        ):
            picture = grey
            if mask is not None:
                tinted = (1 - alpha) * grey + alpha * colours[mask]
                picture = np.where((mask > 0)[..., None], tinted, grey)
            ax = axes[row, col]
            ax.imshow(picture, interpolation="nearest")
            ax.set(xticks=[], yticks=[])
            if row == 0:
                ax.set_title(heading, fontsize=9)
            if col == 0:
                ax.set_ylabel(f"z={z}", fontsize=8)
    handles = [Patch(color=colours[k], label=n) for k, n in enumerate(class_names) if k > 0]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=8)
    fig.suptitle(title or volume.name, fontsize=9)
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return rgb


class ValidationOverlays(Callback):
    """Every ``every_n_epochs`` epochs (``None``: every validation), ``num_slices`` z-slices of
    the first ``max_volumes`` validation volumes (the step's ``{"pred": (B, D, H, W)}``, the
    batch's ``image`` ``(B, C, D, H, W)``, channel 0 drawn, and ``label`` ``(B, 1, D, H, W)``) as
    ``output_dir/epoch_<E>_<case>.png``, W&B ``val/overlays`` (with masks) and TensorBoard
    ``val/overlays/<case>``. Only global rank 0 writes.
    """

    def __init__(
        self,
        output_dir: str | Path,
        every_n_epochs: int | None = None,
        num_slices: int = 3,
        max_volumes: int = 2,
    ) -> None:
        if (every_n_epochs is not None and every_n_epochs < 1) or num_slices < 1 or max_volumes < 1:
            raise ValueError(
                "callbacks.validation_overlays: every_n_epochs, num_slices and max_volumes must "
                f"be >= 1; got {every_n_epochs}, {num_slices}, {max_volumes}"
            )
        self.output_dir = Path(output_dir)
        # None: every validation that runs (validation_budget moves the validation epochs)
        self.every_n_epochs = None if every_n_epochs is None else int(every_n_epochs)
        self.num_slices = int(num_slices)
        self.max_volumes = int(max_volumes)
        self.volumes: list[VolumeSlices] = []
        self._logged_epoch: int | None = None

    def _due(self, trainer: Trainer) -> bool:
        epoch = trainer.current_epoch
        return (
            trainer.is_global_zero
            and not trainer.sanity_checking
            and (self.every_n_epochs is None or (epoch + 1) % self.every_n_epochs == 0)
            and epoch != self._logged_epoch
        )

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.volumes = []

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: dict[str, Any],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not outputs or len(self.volumes) >= self.max_volumes or not self._due(trainer):
            return
        # float() first: numpy has no bfloat16 (batches are cast under bf16-true precision)
        preds = outputs["pred"].detach().cpu().numpy()
        images = batch["image"][:, 0].detach().float().cpu().numpy()
        labels = batch["label"][:, 0].detach().float().cpu().numpy().round()
        paths = batch.get("image_path") or [f"val_{batch_idx}_{k}" for k in range(len(preds))]
        for image, label, pred, path in zip(images, labels, preds, paths, strict=True):
            if len(self.volumes) >= self.max_volumes:
                break
            z = informative_slices(label, self.num_slices)
            name = Path(str(path)).name.split(".")[0]
            masks = label[z].astype(np.int64), pred[z].astype(np.int64)
            self.volumes.append(VolumeSlices(name, z, normalize(image[z]), *masks))

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.volumes or not self._due(trainer):
            return
        self._logged_epoch = trainer.current_epoch
        class_names = list(pl_module.class_names)
        step, epoch = trainer.global_step, trainer.current_epoch
        self.output_dir.mkdir(parents=True, exist_ok=True)
        tensorboards = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        for volume in self.volumes:
            rgb = render_overlay(volume, class_names, f"{volume.name}, epoch {epoch}")
            plt.imsave(self.output_dir / f"epoch_{epoch:03d}_{volume.name}.png", rgb)
            for logger in tensorboards:
                logger.experiment.add_image(
                    f"val/overlays/{volume.name}", rgb, step, dataformats="HWC"
                )
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_metrics({"val/overlays": self._wandb_images(class_names)}, step=step)
        self.volumes = []

    def _wandb_images(self, class_names: list[str]) -> list[Any]:
        import wandb

        labels = dict(enumerate(class_names))
        images = []
        for volume in self.volumes:
            for k, z in enumerate(volume.z):
                masks = {
                    "ground_truth": {"mask_data": volume.label[k], "class_labels": labels},
                    "prediction": {"mask_data": volume.pred[k], "class_labels": labels},
                }
                pixels = (volume.image[k] * 255).round().astype(np.uint8)
                images.append(wandb.Image(pixels, masks=masks, caption=f"{volume.name} z={z}"))
        return images
