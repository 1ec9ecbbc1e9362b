"""``predict(cfg)``: what ``python predict.py`` runs. Every check runs before the first volume; then
Lightning's predict loop runs :class:`VolumePredictor` and :class:`VolumeWriter` writes each volume
as it is done."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from monai.data import Dataset
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from volseg.data.cases import Case
from volseg.data.host_memory import volume_bytes
from volseg.data.io import (
    HDF5_PREDICTION_KEY,
    HDF5_PROBABILITIES_KEY,
    label_dtype,
    read_geometry,
    split_suffix,
    volume_format,
    write_volume,
)
from volseg.data.loader_options import LoaderOptions, worker_context
from volseg.data.orientation import oriented_geometry, to_input_orientation
from volseg.data.sampling import eval_loader
from volseg.data.transforms import to_shape
from volseg.memory import StitchPlan, plan_stitching
from volseg.models.volume_predictor import VolumePredictor
from volseg.plan import applied
from volseg.plan.files import plan_from_run
from volseg.plan.make import device_budget
from volseg.utils.checkpoint import load_model, load_run_config
from volseg.utils.config import plain
from volseg.utils.entry import file_log
from volseg.utils.errors import BudgetExceeded, UserInputError
from volseg.utils.instantiate import build, build_trainer, instantiate_group
from volseg.utils.units import MIB, Budget

log = logging.getLogger(__name__)

# an output volume: a file, and the dataset inside it for HDF5
Target = tuple[Path, str | None]


def output_targets(name: str, output_dir: Path, probabilities: bool) -> list[Target]:
    """Where input ``name``'s labels, then probabilities, go: NIfTI/TIFF ``<name>`` and
    ``<stem>_probabilities<suffix>``; HDF5 two datasets of ``<name>``."""
    if volume_format(name) == "hdf5":
        keys = [HDF5_PREDICTION_KEY, HDF5_PROBABILITIES_KEY][: 1 + probabilities]
        return [(output_dir / name, key) for key in keys]
    targets: list[Target] = [(output_dir / name, None)]
    if probabilities:
        stem, suffix = split_suffix(name)
        targets.append((output_dir / f"{stem}_probabilities{suffix}", None))
    return targets


def check_outputs(
    cases: Sequence[Case], targets: dict[str, list[Target]], output_dir: Path, overwrite: bool
) -> None:
    """One error listing every output two inputs would share, that would hit an input, or that
    exists (unless ``overwrite``)."""
    inputs = {Path(p).resolve() for c in cases for p in c.image_files}
    planned = list(dict.fromkeys(path for files in targets.values() for path, _ in files))
    owners: dict[Path, list[str]] = {}
    for name, files in targets.items():
        for path in dict.fromkeys(path for path, _ in files):
            owners.setdefault(path.resolve(), []).append(name)
    collisions = [
        f"{path}: the output of {' and of '.join(names)}"
        for path, names in owners.items()
        if len(names) > 1
    ]
    if collisions:
        raise UserInputError(
            f"output={output_dir}: two inputs would write the same file (one result would "
            "replace the other); nothing was written. Rename or move one of each pair",
            collisions,
        )
    hits_input = [f"{p}: is an input file" for p in planned if p.resolve() in inputs]
    if hits_input:
        raise UserInputError(
            f"output={output_dir}: predictions would overwrite their inputs", hits_input
        )
    existing = [f"{p}: exists" for p in planned if p.exists()]
    if existing and not overwrite:
        raise UserInputError(
            f"output={output_dir}: {len(existing)} output file(s) exist; nothing was written. "
            "Pass overwrite=true to replace them, or choose another output folder",
            existing,
        )


class VolumeWriter(BasePredictionWriter):
    """Writes each volume in its input's format, orientation and geometry."""

    def __init__(
        self,
        cases: Sequence[Case],
        targets: dict[str, list[Target]],
        orientation: str | None = None,
    ) -> None:
        super().__init__(write_interval="batch")
        self.cases = {c.name: c for c in cases}
        self.targets = targets
        self.orientation = orientation

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: torch.Tensor,
        batch_indices: Sequence[int] | None,
        batch: dict[str, Any],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if prediction is None:
            return  # a padding batch: its volume is another rank's
        for probs, name in zip(prediction, batch["name"], strict=True):
            case = self.cases[name]
            geometry = read_geometry(case.image_files[0], case.image_key)
            affine = geometry["affine"]
            shape = list(oriented_geometry(geometry, self.orientation)["shape_zyx"])
            if list(probs.shape[1:]) != shape:  # data.spacing resampled it: back to the input's
                probs = to_shape(probs, shape)
            probs = to_input_orientation(probs, affine, self.orientation, geometry["format"])
            dtype = label_dtype(probs.shape[0])
            arrays = [probs.argmax(dim=0).numpy().astype(dtype), probs.numpy()]
            targets = self.targets[name]
            for path in dict.fromkeys(path for path, _ in targets):
                path.unlink(missing_ok=True)  # overwrite=true: start from an empty file
            for (path, key), array in zip(targets, arrays, strict=False):
                write_volume(path, array, affine=affine, key=key)
            log.info("Rank %d wrote %s", trainer.global_rank, name)


class VolumeData(L.LightningDataModule):
    """The volumes to predict, batch 1, each on one rank (:class:`ShardedEvalSampler`)."""

    def __init__(self, items: list[dict[str, Any]], transform: Any, options: LoaderOptions) -> None:
        super().__init__()
        self.items, self.transform, self.options = items, transform, options

    def predict_dataloader(self) -> DataLoader:
        trainer, dataset = self.trainer, Dataset(self.items, self.transform)
        return eval_loader(dataset, self.options, trainer.global_rank, trainer.world_size)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int):
        # on the host until VolumePredictor.predict_step knows where it is stitched
        return batch


def plan_volumes(
    cfg: DictConfig,
    device: str,
    datamodule: Any,
    cases: Sequence[Case],
    roi_size: Sequence[int],
    budget: Any,
) -> StitchPlan | None:
    """Each volume's prediction estimated from its header before the first runs, and logged; with
    ``stitch=auto`` on a GPU, where each is stitched for ``memory.budget`` (else the GPU's
    memory). ``None`` where no estimate could be made; a volume that fits the budget neither way
    stops here."""
    limit, source = device_budget(Budget.of(budget), device)
    inferer = {**plain(cfg.inferer), "roi_size": list(roi_size)}
    estimated = {"model.inferer": inferer, "memory.cuda_context_mib": "auto", "memory.gpu": None}
    estimate_cfg = applied(cfg, estimated)
    try:
        spacing, orientation = datamodule.spacing, datamodule.orientation
        shapes = [volume_bytes(c, spacing, orientation=orientation).shape_zyx for c in cases]
        precision = str(cfg.trainer.precision)
        plan = plan_stitching(
            estimate_cfg, shapes, device, limit, source, cfg.flip_axes, precision, cfg.stitch
        )
    except UserInputError:
        raise
    except Exception as err:  # a setting the estimate does not model: decided at run time
        log.warning(
            "No estimate of the volumes' prediction (%s): stitch=%s decides at run time",
            f"{type(err).__name__}: {err}".splitlines()[0],
            cfg.stitch,
        )
        return None
    if plan.stitch:
        log.info("Planned prediction per volume shape:\n%s", "\n".join(plan.lines()))
    elif cfg.stitch == "auto":
        log.info("stitch=auto: no memory limit known; decided per volume from free memory")
    if budget is not None and plan.stitch:
        largest = max(plan.stitch, key=math.prod)
        est = plan.estimates[largest]
        if not est.fits(limit):
            raise BudgetExceeded(
                f"memory.budget={budget}: predicting one {'x'.join(map(str, largest))} volume "
                f"needs {est.process_total / MIB:,.0f} MiB on {est.device} (stitched on the "
                f"{plan.stitch[largest]}), over {limit / MIB:,.0f} MiB; a smaller "
                "inferer.sw_batch_size or inferer.roi_size needs less"
            )
    return plan


def predict(cfg: DictConfig) -> dict[str, Any]:
    """Predict every volume of ``cfg.input`` with ``cfg.ckpt_path`` into ``cfg.output`` (labels in
    the input's format and geometry; ``write_probabilities``: the softmax too). Returns
    ``{"written": [paths]}``."""
    checkpoint, run_cfg = load_run_config(cfg.ckpt_path)
    # predict.py's memory.budget is the prediction's (each volume, below), not a training step's
    budget = cfg.memory.budget
    cfg = applied(cfg, {"memory.budget": None})
    # the training run's plan, this command's overrides applied as train.py applies them
    run_plan = plan_from_run(cfg, run_cfg, checkpoint["volseg"].get("plan"), "predict.py")
    file_log.info("%s", run_plan.format())  # every decision and why: predict.log, plan.yaml
    log.info("Wrote %s (the run plan)", run_plan.write(cfg.paths.output_dir))
    cfg = run_plan.run_config()
    model = load_model(checkpoint, cfg.model, cfg.ckpt_path)

    datamodule = build(cfg.data, "data")
    cases = datamodule.predict_cases(cfg.input, int(cfg.in_channels))
    output_dir = Path(cfg.output)
    targets = {c.name: output_targets(c.name, output_dir, cfg.write_probabilities) for c in cases}
    check_outputs(cases, targets, output_dir, cfg.overwrite)

    roi_size = cfg.inferer.roi_size or list(cfg.data.patch_size)
    inferer = build(cfg.inferer, "inferer", roi_size=roi_size)
    stitching = plan_volumes(cfg, run_plan.value("device"), datamodule, cases, roi_size, budget)
    planned = stitching.stitch if stitching is not None and cfg.stitch == "auto" else None
    predictor = VolumePredictor(
        model, inferer, int(model.num_classes), cfg.flip_axes, cfg.stitch, planned
    )
    writer = VolumeWriter(cases, targets, datamodule.orientation)
    context = worker_context(datamodule.cuda_before) if cfg.num_workers > 0 else None
    options = LoaderOptions(cfg.num_workers, False, False, context)  # not pinned, not persistent
    data = VolumeData([c.as_dict() for c in cases], datamodule.predict_transforms(), options)
    callbacks = [writer, *instantiate_group(cfg.get("callbacks"), "callbacks")]
    trainer: L.Trainer = build_trainer(cfg.trainer, callbacks=callbacks, logger=False)
    log.info(
        "Predicting %d volume(s) from %s: window %s, overlap %s, %d flip(s), stitching %s",
        len(cases),
        cfg.input,
        list(roi_size),
        cfg.inferer.overlap,
        len(predictor.flips),
        cfg.stitch,
    )
    trainer.predict(predictor, datamodule=data, return_predictions=False)
    # counted on disk: under a forking strategy the writers ran in the worker processes
    planned = [path for c in cases for path in dict.fromkeys(p for p, _ in targets[c.name])]
    written = [path for path in planned if path.exists()]
    log.info("Wrote %d file(s) to %s", len(written), output_dir)
    return {"written": [str(p) for p in written]}
