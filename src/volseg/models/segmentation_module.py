"""LightningModule: segmentation network, Dice+CE loss, Dice metrics, sliding-window validation."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule
from monai.inferers import Inferer, SlidingWindowInferer
from torch import nn

from volseg.models.dice import case_dice, class_means
from volseg.models.levers import MemoryLevers
from volseg.models.networks.outputs import select_output
from volseg.models.schedules import RunBudget
from volseg.utils.errors import TrainingDiverged

log = logging.getLogger(__name__)

#: Lightning's warnings that do not apply here, each with why
QUIET_WARNINGS = (
    # the validation values are reduced across ranks before they are logged: no sync needed
    (r"It is recommended to use `self.log\('val/", UserWarning),
    # Lightning's loop uses torch's LeafSpec, deprecated after Lightning's release: harmless
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # the summary counts 32 bits a parameter: right, under autocast the parameters stay float32
    (r"Precision (bf16|16)-mixed is not supported by the model summary", UserWarning),
)
for message, category in QUIET_WARNINGS:
    warnings.filterwarnings("ignore", message=message, category=category)

FP16_MIN_EPS = 1e-4  # Adam's default eps (1e-8) is 0 in float16: updates divide by zero


def guard_fp16_eps(optimizer: torch.optim.Optimizer) -> None:
    """Raise ``eps`` of param groups holding float16 weights (``16-true``) to ``FP16_MIN_EPS``."""
    for group in optimizer.param_groups:
        is_fp16 = any(p.dtype == torch.float16 for p in group["params"])
        if is_fp16 and "eps" in group and group["eps"] < FP16_MIN_EPS:
            log.info(
                "float16 weights: optimizer eps %.0e underflows to 0 in float16, using %.0e",
                group["eps"],
                FP16_MIN_EPS,
            )
            group["eps"] = FP16_MIN_EPS


class SegmentationModule(LightningModule):
    """Trains ``net`` (``(B, C_in, D, H, W)`` -> logits ``(B, num_classes, D, H, W)``) on patches;
    validates on whole volumes. ``loss(logits, labels)`` takes labels ``(B, 1, D, H, W)`` of class
    indices; ``compile`` ... ``cudnn_workspace_mib`` are the :class:`MemoryLevers`; every argument
    as ``configs/model/base.yaml`` describes it."""

    def __init__(
        self,
        net: nn.Module,
        loss: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        scheduler_interval: str = "step",
        num_classes: int = 5,
        include_background: bool = False,
        class_names: Sequence[str] | None = None,
        inferer: Inferer | None = None,
        divisible_by: Sequence[int] | str | None = None,
        compile: bool = False,
        channels_last: bool = False,
        activation_checkpointing: str | Sequence[int] | None = None,
        offload_activations: bool | str = False,
        checkpoint_loss: bool = False,
        placement: dict[str, str] | None = None,
        cudnn_workspace_mib: float | None = None,
        net_output: str | int | None = None,
        stop_on_nonfinite_loss: bool = True,
        *,
        nonfinite_check_every_n_steps: int,
    ) -> None:
        super().__init__()
        self.loss = loss
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.num_classes = num_classes
        self.include_background = include_background
        self._class_names = list(class_names) if class_names is not None else None
        self.inferer = inferer or SlidingWindowInferer(roi_size=(32, 64, 64), overlap=0.25)
        self.divisible_by = divisible_by
        self.net_output = net_output
        self.levers = MemoryLevers(
            activation_checkpointing=activation_checkpointing,
            offload_activations=offload_activations,
            checkpoint_loss=checkpoint_loss,
            channels_last=channels_last,
            placement=placement,
            compile=compile,
            cudnn_workspace_mib=cudnn_workspace_mib,
        )
        self.net = self.levers.apply(net, "build")
        self.stop_on_nonfinite_loss = stop_on_nonfinite_loss
        self.nonfinite_check_every_n_steps = max(1, int(nonfinite_check_every_n_steps))
        self._finite: torch.Tensor | None = None  # all losses finite since step _finite_since
        self._finite_since = 0
        # this rank's validation sums, reduced across ranks at the epoch's end:
        # [Dice sum per class (K), cases with the class (K), loss sum, cases] (float64)
        self._val_sums: torch.Tensor | None = None
        self.best_dice = float("-inf")
        self.best_dice_per_class: dict[str, float] = {}
        self.run_config: dict[str, Any] | None = None  # the resolved train config, for eval.py
        self.run_plan: dict[str, Any] | None = None  # its plan (volseg.plan), for eval/predict

    @property
    def class_names(self) -> list[str]:
        if self._class_names is None:
            datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
            names = getattr(datamodule, "class_names", None)
            self._class_names = list(names or (f"class_{k}" for k in range(self.num_classes)))
        return self._class_names

    def setup(self, stage: str) -> None:
        self.net = self.levers.apply(self.net, "setup", stage)

    def on_fit_start(self) -> None:
        self.net = self.levers.apply(self.net, "start")

    on_validation_start = on_predict_start = on_fit_start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, D, H, W)`` -> logits ``(B, num_classes, D, H, W)`` (in training, deep
        supervision's outputs; out of it, the full-resolution one)."""
        out = select_output(self.levers.forward(self.net, x, self.training), self.net_output)
        if not self.training and isinstance(out, list | tuple):
            return out[0]
        return out

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self(batch["image"])
        loss = self.compute_loss(logits, batch["label"])
        if self.stop_on_nonfinite_loss:
            self._check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["image"].shape[0])
        return loss

    def _check_finite(self, loss: torch.Tensor) -> None:
        """Raise once a NaN/Inf loss has been seen; read on the host every N steps only."""
        finite = torch.isfinite(loss.detach())
        if self._finite is None:
            self._finite, self._finite_since = finite, self.global_step
        else:
            self._finite = self._finite & finite
        step = self.global_step
        if (step + 1) % self.nonfinite_check_every_n_steps:
            return
        all_finite, since = bool(self._finite), self._finite_since
        self._finite = None
        if not all_finite:
            # stop: the optimizer steps on a NaN/Inf loss poison every weight
            when = f"at step {step}" if since == step else f"at a step in [{since}, {step}]"
            raise TrainingDiverged(
                f"train/loss is NaN or Inf {when}; try a lower model.optimizer.lr, "
                "trainer.precision=32 or trainer.gradient_clip_val=1.0"
            )

    def compute_loss(self, logits: Any, label: torch.Tensor) -> torch.Tensor:
        """Training loss (float32) of logits ``(B, K, D, H, W)``, labels ``(B, 1, D, H, W)``."""
        device = (logits[0] if isinstance(logits, list | tuple) else logits).device
        return self.levers.loss(self._float_loss, logits, label.to(device))

    def _float_loss(self, logits: Any, label: torch.Tensor) -> torch.Tensor:
        # cast inside the checkpoint: the float32 copy of the logits is then not kept either
        if isinstance(logits, torch.Tensor) and logits.dim() == label.dim() + 1:
            logits = logits.unbind(dim=1)  # deep supervision stacked as (B, S, K, D, H, W)
        if isinstance(logits, list | tuple):
            return self.loss([head.float() for head in logits], label)
        return self.loss(logits.float(), label)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        """Whole-volume inference of the counted cases: ``{"pred": (B, D, H, W) class indices}``,
        ``{}`` for a padding batch; loss and Dice summed per rank."""
        keep = torch.as_tensor(batch.get("counted", True), dtype=torch.bool).reshape(-1).cpu()
        if not keep.any():
            return {}
        if not keep.all():
            batch = {key: batch[key][keep] for key in ("image", "label")}
        return {"pred": self.validate_cases(batch["image"], batch["label"])[:, 0]}

    def validate_cases(self, image: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Predicted classes ``(B, 1, D, H, W)`` of whole volumes ``(B, C, D, H, W)``, their loss
        and Dice added to this rank's sums (what the estimator traces)."""
        with torch.no_grad():  # sliding-window logits (B, num_classes, D, H, W)
            logits = self.inferer(image, self).float()
        # with model.inferer.device=cpu the logits are stitched on the host, the label is not
        label = label.to(logits.device)
        pred = logits.argmax(dim=1, keepdim=True)
        self.accumulate_validation(pred, label, self.loss(logits, label))
        return pred

    def accumulate_validation(
        self, pred: torch.Tensor, label: torch.Tensor, loss: torch.Tensor
    ) -> None:
        """Add the cases of ``pred``/``label`` (``(B, 1, D, H, W)`` class indices) and their mean
        ``loss`` to this rank's sums."""
        per_case = case_dice(pred, label, self.num_classes)  # (B, K), NaN: class absent
        cases = per_case.shape[0]
        sums = torch.cat(
            [
                per_case.nan_to_num(0.0).sum(dim=0),
                (~per_case.isnan()).sum(dim=0).double(),
                loss.detach().double().reshape(1) * cases,
                torch.tensor([float(cases)], dtype=torch.float64, device=per_case.device),
            ]
        ).cpu()
        self._val_sums = sums if self._val_sums is None else self._val_sums + sums

    def reduced_validation(self) -> tuple[torch.Tensor, float, int]:
        """Per-class Dice ``(K,)``, mean loss and case count over all ranks (a collective: sums
        reduced, not means, which would round uneven counts); then starts over."""
        k = self.num_classes
        local = self._val_sums if self._val_sums is not None else torch.zeros(2 * k + 2)
        self._val_sums = None
        total = local.double().to(self.device)
        if self._trainer is not None and self.trainer.world_size > 1:
            total = self.trainer.strategy.reduce(total, reduce_op="sum")
        total = total.cpu()
        sums, counts, loss, cases = total[:k], total[k : 2 * k], total[-2], total[-1]
        per_class = class_means(sums, counts)
        mean_loss = (loss / cases).item() if cases > 0 else float("nan")
        return per_class.float(), mean_loss, int(cases.item())

    def on_validation_epoch_end(self) -> None:
        per_class, loss, cases = self.reduced_validation()
        log.debug("Validation Dice over %d case(s), gathered from all ranks", cases)
        self.log("val/loss", loss)
        first = 0 if self.include_background else 1
        mean = per_class[first:].mean()
        scores = {f"val/dice_{n}": d for n, d in zip(self.class_names, per_class, strict=True)}
        # the same values on every rank already (reduced above): no sync_dist
        self.log_dict(scores)
        self.log("val/dice_mean", mean, prog_bar=True)
        if not self.trainer.sanity_checking:
            if mean.item() > self.best_dice:
                self.best_dice = mean.item()
                self.best_dice_per_class = {
                    k.removeprefix("val/dice_"): v.item() for k, v in scores.items()
                }
            self.log("val/dice_mean_best", max(self.best_dice, mean.item()))
            self.warn_zero_dice(per_class)

    def warn_zero_dice(self, per_class: torch.Tensor) -> list[str]:
        """Warn about the classes at Dice 0; returns their names."""
        first = 0 if self.include_background else 1
        scores = zip(self.class_names[first:], per_class[first:].tolist(), strict=True)
        zero = [name for name, dice in scores if dice == 0.0]
        if zero:
            log.warning(
                "Validation at epoch %d, step %d: Dice 0 for class(es) %s",
                self.current_epoch,
                self.global_step,
                ", ".join(zero),
            )
        return zero

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(params=self.parameters())
        guard_fp16_eps(optimizer)
        if self.scheduler_factory is None:
            return optimizer
        kwargs = {}
        target = getattr(self.scheduler_factory, "func", self.scheduler_factory)
        if getattr(target, "follows_budget", False) and self._trainer is not None:
            # the run's horizon is the trainer's (without one the LR stays constant)
            kwargs["budget"] = RunBudget.from_trainer(self.trainer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": self.scheduler_factory(optimizer=optimizer, **kwargs),
                "interval": self.scheduler_interval,
            },
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["volseg"] = {
            "best_dice": self.best_dice,
            "best_dice_per_class": self.best_dice_per_class,
            "config": self.run_config,
            "plan": self.run_plan,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("volseg", {})
        self.best_dice = state.get("best_dice", self.best_dice)
        self.best_dice_per_class = state.get("best_dice_per_class", self.best_dice_per_class)
