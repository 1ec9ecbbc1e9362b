"""``train(cfg)``: what ``python train.py`` runs."""

from __future__ import annotations

import gc
import logging
import math

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from volseg.data.host_memory import local_processes
from volseg.data.sampling import check_resume_world, saved_loader_states
from volseg.models.build import build_model
from volseg.plan import plan_run
from volseg.plan.duration import duration_line
from volseg.plan.report import margin_line
from volseg.utils.checkpoint import check_weights_fit, check_work_left, load_run_config
from volseg.utils.entry import file_log, print_config, seed_everything
from volseg.utils.errors import UserInputError
from volseg.utils.extras import require_all
from volseg.utils.instantiate import build, build_trainer, instantiate_group
from volseg.utils.sweep import is_global_zero
from volseg.utils.units import MIB

log = logging.getLogger(__name__)


#: strategies that shard the model across CUDA GPUs: Lightning runs them on CUDA only
CUDA_ONLY_STRATEGIES = ("fsdp", "deepspeed")


def check_strategy(trainer_cfg: DictConfig) -> None:
    """One clear error for a ``trainer.strategy`` whose package is missing (DeepSpeed: torch and
    Lightning do not bring it), or that needs CUDA where the run has no CUDA GPU."""
    strategy = trainer_cfg.get("strategy")
    name = str(strategy.get("_target_", "") if isinstance(strategy, DictConfig) else strategy)
    if "deepspeed" in name.lower():
        require_all(["deepspeed"], f"trainer.strategy={name}")
    if not any(key in name.lower() for key in CUDA_ONLY_STRATEGIES):
        return
    accelerator = str(trainer_cfg.accelerator)
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        return
    why = "" if accelerator == "cpu" else ", and this machine has no CUDA GPU"
    raise UserInputError(
        f"trainer.strategy={name}: shards the model across CUDA GPUs (Lightning runs it on CUDA "
        f"only); this run has trainer.accelerator={accelerator}{why}. On CPU processes use "
        "trainer.accelerator=cpu trainer.devices=N trainer.strategy=ddp_fork"
    )


def train(cfg: DictConfig) -> dict[str, float]:
    """Train a model from the composed config; returns the final ``callback_metrics`` as floats."""
    print_config(cfg)
    # an earlier run in this process may have left cycles holding its model and optimizer
    gc.collect()
    seed_everything(cfg)
    # a resumed run's checkpoint is read first: not a file, not a checkpoint -> one error, no work
    checkpoint = load_run_config(cfg.ckpt_path)[0] if cfg.get("ckpt_path") else None
    loader_states = saved_loader_states(checkpoint) if checkpoint is not None else []
    if checkpoint is not None:  # a finished run: one line naming the limit to raise, no work
        check_work_left(checkpoint, cfg.trainer, cfg.ckpt_path)
    check_strategy(cfg.trainer)

    # every auto decided once; everything is built from the plan's config, which nothing edits
    run_plan = plan_run(cfg, estimate_step=bool(cfg.memory.plan_step))
    file_log.info("%s", run_plan.format())  # every decision and why: train.log, plan.yaml
    # the one plan line the console gets too: the margin the step is planned with, if estimated
    if "margin_source" in run_plan.estimate:
        log.info("%s", margin_line(run_plan.estimate))
    # the run's predicted wall time (plan.yaml's duration), or why it is not predicted
    log.info("%s", duration_line(run_plan.duration))
    if is_global_zero():
        log.info("Wrote %s (the run plan)", run_plan.write(cfg.paths.output_dir))
    cfg = run_plan.run_config()

    # the plan's, where it built one from this data config to read the data
    datamodule: L.LightningDataModule | None = run_plan.datamodule
    if datamodule is None:
        log.info("Instantiating datamodule <%s>", cfg.data._target_)
        datamodule = build(cfg.data, "data")
    datamodule.prepare_data()
    check_only = datamodule.check_only
    host = None
    if not check_only:
        # from the headers: a cache too big for the RAM stops the run before any voxel is read
        device = run_plan.value("device")
        host = datamodule.check_host_memory(device, local_processes(cfg.trainer, device))
    datamodule.check()
    if check_only:
        log.info("data.check_only=true: every case of %s passed the checks", cfg.data.root)
        return {}
    if host is not None and cfg.get("memory", {}).get("budget"):
        # the budget is the step's (checked by the plan); the data side's is said here
        log.info(
            "host: the data side needs ~%s MiB (data.cache=%s: caches %s MiB, loaders %s MiB); "
            "this process holds %s MiB now",
            f"{host.data_total / MIB:,.0f}",
            host.cache,
            f"{host.cache_bytes / MIB:,.0f}",
            f"{(host.data_total - host.cache_bytes) / MIB:,.0f}",
            f"{host.process_rss / MIB:,.0f}",
        )

    log.info("Instantiating model <%s>", cfg.model._target_)
    model: L.LightningModule = build_model(cfg)
    model.run_config = OmegaConf.to_container(cfg, resolve=True)
    model.run_plan = run_plan.to_dict()
    model.precision_choice = dict(run_plan.precision)
    if checkpoint is not None:
        check_weights_fit(model, checkpoint, cfg.model, cfg.ckpt_path)
        del checkpoint  # Lightning loads it again to restore the whole training state

    trainer: L.Trainer = build_trainer(
        cfg.trainer,
        async_checkpoint=cfg.get("async_checkpoint") is True,
        callbacks=instantiate_group(cfg.get("callbacks"), "callbacks"),
        logger=instantiate_group(cfg.get("logger"), "logger"),
    )
    for state in loader_states:  # the world size is exact once the trainer is built
        check_resume_world(state, trainer.world_size, f"ckpt_path={cfg.ckpt_path}")
    for logger in trainer.loggers:
        logger.log_hyperparams(model.run_config)

    log.info("Parameters: %s", f"{sum(p.numel() for p in model.parameters()):,}")
    trainer.fit(
        model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True
    )
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best = float(getattr(model, "best_dice", float("nan")))
    if math.isfinite(best):
        log.info("Best val/dice_mean: %.4f", best)
    else:
        # e.g. trainer.max_steps ended the run inside its first validation interval
        log.info(
            "Best val/dice_mean: none, no validation ran (stopped at step %d, epoch %d; "
            "trainer.check_val_every_n_epoch=%s)",
            trainer.global_step,
            trainer.current_epoch,
            trainer.check_val_every_n_epoch,
        )
    if cfg.get("test"):
        metrics.update(evaluate_best(trainer, model, datamodule))
    return metrics


def evaluate_best(
    trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule
) -> dict[str, float]:
    """``test=true``: the best checkpoint (else the final weights) validated after fit, on the
    validation split (the layouts have none for test); ``test/<name>`` metrics."""
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None
    log.info(
        "test=true: evaluating %s on the validation split (the data have no test split)",
        best or "the final weights (no best checkpoint)",
    )
    results = trainer.validate(
        model=model, datamodule=datamodule, ckpt_path=best, weights_only=True
    )
    found = results[0] if results else {}
    return {f"test/{k.split('/', 1)[-1]}": float(v) for k, v in found.items()}
