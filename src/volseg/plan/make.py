"""``make_plan(cfg)``: the composed config in, one :class:`RunPlan` out, every ``auto`` resolved
once, in the order :func:`make_plan` reads (each step takes the values decided before it: the
patch, then the network for it, the batch, the step and validation fitted to ``memory.budget``).
Building happens after this, from :meth:`RunPlan.run_config`; nothing edits the config after it."""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from volseg.data.cases import image_geometry
from volseg.data.dataset_defaults import EMBEDDED_DEFAULTS, resolve_augment
from volseg.data.fingerprint import MIN_SIDE, dataset_fingerprint, plan_auto_patch
from volseg.data.host_memory import local_processes
from volseg.data.loader_options import resolve_loader_options
from volseg.data.mni152 import check_build_installed
from volseg.memory import (
    ROI,
    STITCH_DEVICE,
    SW_BATCH,
    Candidate,
    estimate_run,
    fit_step,
    fit_validation,
    validation_shape,
)
from volseg.models.learning_rate import resolve_learning_rate
from volseg.models.networks.probe import has_batch_norm
from volseg.plan.fastest_fit import AUTO, fastest_fit, pick_reason, written_levers
from volseg.plan.network import divisible_by, plan_network
from volseg.plan.reconcile import plan_async_checkpoint, reconcile_callbacks
from volseg.plan.run_plan import Decision, RunPlan, applied
from volseg.utils.alloc_conf import resolve_allocator
from volseg.utils.config import is_voxels, plain
from volseg.utils.errors import BudgetExceeded, UserInputError
from volseg.utils.instantiate import build
from volseg.utils.precision import cuda_bf16_supported, log_choice, resolve_precision
from volseg.utils.units import MIB, Budget

log = logging.getLogger(__name__)


def plan_device(cfg: DictConfig) -> Decision:
    """Where the run trains: ``memory.plan_device`` when set, else ``trainer.accelerator`` here."""
    wanted = OmegaConf.select(cfg, "memory.plan_device")
    if wanted is not None:
        if wanted not in ("cuda", "cpu"):
            raise UserInputError(f"memory.plan_device={wanted}: must be one of cuda, cpu")
        return Decision(str(wanted), "configured", f"memory.plan_device={wanted}")
    accelerator = str(cfg.trainer.accelerator).lower()
    if accelerator != "auto":
        device = "cuda" if accelerator in ("gpu", "cuda") else "cpu"
        return Decision(device, "configured", f"trainer.accelerator={accelerator}")
    here = torch.cuda.is_available()
    why = "trainer.accelerator=auto, " + ("a GPU here" if here else "no GPU here")
    return Decision("cuda" if here else "cpu", "planned", why)


def _check_placement_devices(placement: Any) -> None:
    """One error naming ``model.placement`` for a device this machine does not have."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = ["cpu", *(f"cuda:{i}" for i in range(count))]
    for name, device in (placement or {}).items():
        try:
            parsed = torch.device(device)
        except (RuntimeError, TypeError):
            raise UserInputError(
                f"model.placement: {name}: {device!r} is no device; this machine has "
                f"{', '.join(here)}"
            ) from None
        wanted = f"{parsed.type}:{parsed.index or 0}" if parsed.type == "cuda" else parsed.type
        if wanted not in here:
            raise UserInputError(
                f"model.placement: {name}: {device} is not a device of this machine (it has "
                f"{', '.join(here)}); name those, or model.placement=null"
            )


class _Data:
    """The datamodule the plan reads the data through (headers, never voxels): built once, from
    the ``data`` of the config it is first asked with; the run gets it where the final ``data``
    is what it was built from."""

    def __init__(self) -> None:
        self._built_from: Any = None
        self._module: Any = None
        self._prepared = False

    def module(self, cfg: DictConfig) -> Any:
        if self._module is None:
            options = OmegaConf.to_container(cfg.data, resolve=True)
            self._built_from = copy.deepcopy(options)
            if str(options.get("patch_size")) == "auto":
                options["patch_size"] = [MIN_SIDE] * 3  # finding cases does not use it
            if str(options.get("batch_size")) == "auto":
                options["batch_size"] = 1  # planned after the network (_plan_levers)
            self._module = build(OmegaConf.create(options), "data")
        return self._module

    def prepared(self, cfg: DictConfig) -> Any:
        """The datamodule, its data prepared (an embedded dataset is generated first)."""
        if not self._prepared:
            self.module(cfg).prepare_data()
            self._prepared = True
        return self._module

    def for_run(self, cfg: DictConfig) -> Any:
        """The datamodule where the final ``data`` of ``cfg`` is what it was built from."""
        final = OmegaConf.to_container(cfg.data, resolve=True)
        # _built_from is None until the module is built: no module is built here
        return self._module if final == self._built_from else None


def _augment(data: DictConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """``data.augment`` with null keys from the folder's own defaults. An embedded dataset not
    generated yet gets those it will be generated with (nothing is generated for it)."""
    root = Path(str(data.root))
    values, sources = resolve_augment(plain(data.augment), root)
    pending = data.get("synthetic") and not root.exists()
    if pending and Path(str(data.synthetic.root)).resolve() == root.resolve():
        for key, value in EMBEDDED_DEFAULTS["augment"].items():
            if sources.get(key) != "configured":
                values[key] = value
                sources[key] = "the embedded dataset's own (written when it is generated)"
    return values, sources


def _check_channels(cfg: DictConfig, opened: _Data) -> None:
    """One :class:`UserInputError` (the dataset check's line) when the first case's image holds
    another number of channels than ``in_channels``; a dataset not there yet is the run's."""
    if not Path(str(cfg.data.root)).is_dir():
        return
    module = opened.prepared(cfg)
    cases, problems = module.find()
    if problems or not cases:
        return  # the layout's problems are the dataset check's
    _, found = image_geometry(
        cases[0], int(cfg.in_channels), module.channels_fix, module.orientation
    )
    if found:
        raise UserInputError(found[0])


def _plan_data(
    cfg: DictConfig, decisions: dict[str, Decision], want_fingerprint: bool, opened: _Data
) -> tuple[Any, DictConfig]:
    """The data's decisions, the fingerprint where read, and ``cfg`` with them applied but the
    patch (``decisions["data.patch_size"]``)."""
    data = cfg.data
    check_build_installed(str(data.root), data.get("mni152"))
    settings: dict[str, Any] = {}
    # classes and channels: the data's where the data config leaves them null (data=msd)
    for key in ("num_classes", "in_channels"):
        if data.get(key) is None and key in data:
            module = opened.prepared(cfg)
            module.find()  # dataset.json: sets them, or one error naming the file
            found = int(getattr(module, key))
            source = "classes_from" if key == "num_classes" else "channels_from"
            decisions[key] = Decision(found, "the data", getattr(module, source))
            settings |= {key: found, f"data.{key}": found}
        else:
            decisions[key] = Decision(int(cfg[key]), "configured")
    # augmentations the config leaves null: the dataset folder's own defaults
    augment, sources = _augment(data)
    for key in ("flip_axes", "rotate90_planes"):
        decisions[f"data.augment.{key}"] = Decision(augment[key], *_source(sources[key]))
    cfg = applied(cfg, {**settings, "data.augment": augment})
    data = cfg.data
    decisions["data.spacing"] = Decision(
        data.spacing, "configured", "" if data.spacing is not None else "the files'"
    )
    decisions["data.orientation"] = Decision(data.orientation, "configured")
    auto_patch = str(data.get("patch_size")) == "auto"
    fingerprint = dataset_fingerprint(data) if auto_patch or want_fingerprint else None
    if auto_patch:
        # what the network needs on the axis that needs most
        has_net = OmegaConf.select(cfg, "model.net") is not None
        multiple = max(divisible_by(cfg, None).value) if has_net else 8
        patch, why = plan_auto_patch(data, multiple, fingerprint["median_shape"])
        why += f" ({fingerprint['cases']} cases)"
        decisions["data.patch_size"] = Decision(patch, "planned", why)
    else:
        patch = plain(data.patch_size)
        if not is_voxels(patch):
            raise UserInputError(f"data.patch_size={patch}: expected [D, H, W] > 0 or auto")
        decisions["data.patch_size"] = Decision(patch, "configured")
    return fingerprint, cfg


def _source(text: str) -> tuple[str, str]:
    """``resolve_augment``'s source as (source, why)."""
    if text == "configured":
        return "configured", ""
    if text.startswith("the dataset's own"):
        return "the data", text.removeprefix("the dataset's own (").removesuffix(")")
    if text.startswith("the embedded dataset's own"):
        return "the data", text
    return "default", text


def _plan_loader(cfg: DictConfig, device: str, decisions: dict[str, Decision]) -> dict[str, Any]:
    """The data loader's decisions; returns their settings."""
    data = cfg.data
    asked = {k: data.get(k) for k in ("num_workers", "pin_memory", "persistent_workers")}
    devices = local_processes(cfg.trainer, device)
    options = resolve_loader_options(*asked.values(), device, devices)
    why = f"for {device} with {devices} process(es) on this machine"
    for key in asked:
        source, reason = ("planned", why) if asked[key] == "auto" else ("configured", "")
        decisions[f"data.{key}"] = Decision(getattr(options, key), source, reason)
    for key in ("cache", "cache_rate"):
        decisions[f"data.{key}"] = Decision(data.get(key), "configured")
    return {f"data.{key}": decisions[f"data.{key}"].value for key in asked}


def device_budget(budget: Budget | None, device: str) -> tuple[int | None, str]:
    """The bytes a run fills and what they are: ``budget``, else the memory of this machine's GPU
    where ``device`` is cuda; ``(None, "")`` where neither is known."""
    if budget is not None:
        return budget.nbytes, f"memory.budget={budget}"
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(props.total_memory), f"the memory of this {props.name}"
    return None, ""


#: the keys the fastest fit plans where they say ``auto`` (plan/fastest_fit.py)
LEVER_KEYS = ("data.batch_size", "model.activation_checkpointing")


def _plan_levers(
    cfg: DictConfig, device: str, decisions: dict[str, Decision], asked: Budget | None
) -> dict | None:
    """``data.batch_size=auto`` and ``model.activation_checkpointing=auto``: the candidate that
    fits the budget and trains fastest per sample, from estimates and predicted step times
    (:func:`fastest_fit`; ``decisions``); returns the table that decided it (``None``: neither is
    ``auto``, or checkpointing alone with no budget to fit: none)."""
    auto = [key for key in LEVER_KEYS if str(OmegaConf.select(cfg, key)) == AUTO]
    if not auto:
        return None
    budget, what = device_budget(asked, device)
    if budget is None:
        if "data.batch_size" in auto:
            raise UserInputError(
                "data.batch_size=auto fills a memory budget: set memory.budget (e.g. memory."
                "budget=16GiB); only a run on this machine's GPU has one of its own"
            )
        why = "no memory.budget to fit: no recomputation"
        decisions["model.activation_checkpointing"] = Decision("none", "planned", why)
        return None
    fit = fastest_fit(RunPlan(cfg, decisions), budget)
    if fit.pick is None:
        least = min((r for r in fit.rows if r.peak is not None), key=lambda r: r.peak, default=None)
        if least is not None:
            needs = (
                f"; the least, batch {least.batch_size} with {written_levers(least)}, needs "
                f"{least.peak / MIB:,.0f} MiB with the margin"
            )
        else:  # every candidate refused: the network's reason, not the budget
            raise BudgetExceeded(
                f"{'=auto, '.join(auto)}=auto: no candidate could be estimated for {what}: "
                f"{fit.rows[0].why if fit.rows else 'none built'}"
            )
        raise BudgetExceeded(
            f"{'=auto, '.join(auto)}=auto: nothing fits {what} ({budget / MIB:,.0f} MiB{needs}); "
            "python plan.py with memory.budget lists the levers that do"
        )
    why = pick_reason(fit)
    planned = {
        "data.batch_size": fit.pick.batch_size,
        "model.activation_checkpointing": fit.pick.activation_checkpointing,
    }
    for key in auto:  # the reason once, on the first key planned
        decisions[key] = Decision(planned[key], "planned", why)
        why = f"planned with {auto[0]}: the fastest fit"
    if fit.pick.accumulate_grad_batches != int(cfg.trainer.accumulate_grad_batches):
        decisions["trainer.accumulate_grad_batches"] = Decision(
            fit.pick.accumulate_grad_batches,
            "planned",
            f"micro-batches that keep data.batch_size={cfg.data.batch_size}: the fastest fit",
        )
    return {"budget_of": what, **fit.to_dict()}


def _batch_notes(cfg: DictConfig, configured: tuple[Any, Any], decisions: dict) -> list[str]:
    """A line where the planned effective batch differs from the configured one (or the batch was
    ``auto``), and a warning where a planned batch under 2 meets BatchNorm."""
    notes = []
    if not str(cfg.data.batch_size).isdigit():
        return notes  # not a batch: the datamodule's check says so in one line
    batch = int(cfg.data.batch_size)
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    devices = local_processes(cfg.trainer, str(cfg.memory.plan_device))
    devices *= int(cfg.trainer.num_nodes)
    # what a planned batch does to training: its effective batch; the learning rate and an
    # epoch's samples stay as configured
    same = (
        f"the learning rate stays model.optimizer.lr={OmegaConf.select(cfg, 'model.optimizer.lr')}"
        " (not scaled with the batch) and an epoch its samples (fewer steps of a larger batch)"
    )
    effective = (
        f"effective batch {batch * accumulate * devices} (data.batch_size={batch} x "
        f"trainer.accumulate_grad_batches={accumulate} x {devices} device(s))"
    )
    chosen = decisions["data.batch_size"].source == "planned"
    if str(configured[0]) != "auto":
        before = int(configured[0]) * int(configured[1] or 1) * devices
        if batch * accumulate * devices != before:
            notes.append(
                f"{effective}, not the configured {before}: the configured one does not fit "
                f"memory.budget; {same}"
            )
    elif chosen:
        notes.append(f"{effective}, planned; {same}")
    if batch < 2 and chosen and has_batch_norm(cfg.model.net):
        notes.append(
            f"data.batch_size={batch} with BatchNorm: each step normalizes with one "
            "sample's statistics, which trains poorly; a network with GroupNorm or "
            "InstanceNorm (model=unet_small_gn, model.net.norm=instance) does not depend "
            "on the batch"
        )
    return notes


def _plan_step(
    cfg: DictConfig,
    decisions: dict[str, Decision],
    budget: Budget | None,
    estimate_step: bool,
    fit_budget: bool,
    validation_shape: list[int] | None,
) -> tuple[dict, Any, DictConfig]:
    """The step checked against ``memory.budget`` and the engine's answer for the planned run (step,
    FLOPs, validation in one trace): ``(summary, RunEstimate or None, cfg as fitted)``."""
    from volseg.plan.report import STEP_KEYS, check_estimate_fits, margin_figures

    why = ""
    result: dict[str, Any] = {}
    run = None
    # a validation the trace does not model: the step alone (validation says why)
    shapes = (validation_shape, None) if validation_shape is not None else (None,)
    for shape in shapes if budget or estimate_step else ():
        try:
            run = estimate_run(RunPlan(cfg, decisions), None, shape)
            break
        except UserInputError:
            raise
        except Exception as err:  # a setting the estimator does not model: the run goes on
            if budget and shape is None:
                raise
            result = {"not_estimated": f"{type(err).__name__}: {err}".splitlines()[0]}
    planned: dict[str, str] = {}
    if budget:
        est = run.step
        if fit_budget and est.total_within(budget.nbytes) is None:
            planned, cfg = _fit_budget(RunPlan(cfg, decisions), budget, est)
            # the planner's answer, validation in the same trace
            run = estimate_run(RunPlan(cfg, decisions), None, validation_shape)
            est = run.step
        total = check_estimate_fits(est, budget)  # BudgetExceeded: the run stops here
        why = f"fits memory.budget={budget}: {total / MIB:,.0f} MiB estimated on {est.device}"
        # its figures, however small; where it comes from is said once: estimate.margin_source
        margin = margin_figures(est.margin_fixed_mib, est.margin)
        why += f" with a margin of {margin} (estimate.margin_source)"
    if run is not None:
        names = ("device", "precision", "peak_allocated", "process_total", "step_peak_growth")
        result = {name: getattr(run.step, name) for name in names}
        # the margin: what the planner adds when it checks a budget, and where it comes from
        result |= {"flops_per_step": run.flops_per_step, "margin": run.step.margin}
        result["margin_fixed_mib"] = run.step.margin_fixed_mib
        result["margin_source"] = run.step.margin_source
    for key in (*STEP_KEYS, *sorted(set(planned) - set(STEP_KEYS))):
        value = OmegaConf.select(cfg, key)
        if key in planned:
            decisions[key] = Decision(value, "planned", f"{planned[key]}; {why}")
        elif key in decisions and decisions[key].source == "planned":  # data.batch_size=auto
            continue
        elif value is not None:
            decisions[key] = Decision(value, "configured", why)
    return result, run, cfg


def _fit_budget(
    plan: RunPlan, budget: Budget, configured: Any
) -> tuple[dict[str, str], DictConfig]:
    """The planner's answer for a step over ``memory.budget`` (micro-batches, else batch and
    checkpointing): ``({key: why}, the config with it)``."""
    answer = fit_step(plan, budget.nbytes, as_configured=configured)
    batch, candidate = plan.config.data.batch_size, answer.candidate
    if answer.micro_batching is not None:
        candidate = answer.micro_batching["candidate"]
        why = f"the configured data.batch_size={batch} does not fit: micro-batches"
    elif candidate is None:
        raise BudgetExceeded(answer.refusal(budget))
    elif answer.fallback is not None:
        why = f"no batch or checkpointing fits: {answer.fallback}"
    else:
        why = "the configured step does not fit: the largest batch that does"
    settings = candidate.settings()
    log.info(
        "memory.budget=%s: planned %s", budget, " ".join(f"{k}={v}" for k, v in settings.items())
    )
    return dict.fromkeys(settings, why), plan.run_config(candidate)


def _validation_volume(
    cfg: DictConfig, checked: bool, opened: _Data
) -> tuple[list[int] | None, str]:
    """The validation volume the plan estimates (``checked``: one is) and where it comes from."""
    if not checked:
        return None, ""
    if OmegaConf.select(cfg, "memory.val_shape") is not None:
        return validation_shape(cfg)
    try:
        datamodule = opened.module(cfg)
    except UserInputError as err:
        return None, str(err).splitlines()[0]
    return validation_shape(cfg, datamodule)


def _plan_validation(
    cfg: DictConfig,
    decisions: dict[str, Decision],
    notes: list[str],
    budget: Budget | None,
    estimate_step: bool,
    fit_budget: bool,
    volume: tuple[list[int] | None, str],
    run: Any,
) -> tuple[dict, DictConfig]:
    """Validation of the largest volume fitted to ``memory.budget`` (fewer windows at once, host
    stitching; smaller windows with ``fit_budget``), else the run stops; its summary, and ``cfg``
    as fitted."""
    from volseg.plan.report import check_validation_fits

    if not (budget or estimate_step):
        return {}, cfg
    shape, source = volume

    def validation(candidate: Candidate | None = None) -> Any:
        """The planned run's validation of ``shape`` as ``candidate`` changes it."""
        return estimate_run(RunPlan(cfg, decisions), candidate, shape).validation

    est, why = None, source  # why not estimated: no shape, or a setting the trace does not model
    try:
        est = None if shape is None else getattr(run, "validation", None) or validation()
    except UserInputError:
        raise
    except Exception as err:  # the run goes on
        why = f"{type(err).__name__}: {err}".splitlines()[0]
    if est is None:
        if budget:
            notes.append(f"memory.budget={budget}: validation not checked ({why})")
        return {"not_estimated": why}, cfg
    if not budget:
        return {**est.summary(), "shape_from": source}, cfg
    planned: dict[str, str] = {}
    after = ""  # what was tried, where nothing fits
    if not est.fits(budget.nbytes):
        fit = fit_validation(cfg, budget.nbytes, shape, est, validation, fit_budget)
        if fit.estimate is None:
            hint = (
                f"`python plan.py <the same overrides>` also tries smaller windows ({ROI})"
                if not fit_budget
                else "a smaller validation volume (data.spacing) or a larger budget"
            )
            tried = f"; tried {'; '.join(fit.tried)}" if fit.tried else ""
            after = f"{tried}. {hint}"
        else:
            cfg = RunPlan(cfg, decisions).run_config(fit.candidate)
            planned, est = fit.reasons, fit.estimate
    total = check_validation_fits(est, budget, source, after)
    why = (
        f"validation fits memory.budget={budget}: {total / MIB:,.0f} MiB estimated on {est.device}"
    )
    for key in (SW_BATCH, STITCH_DEVICE, ROI):
        value = OmegaConf.select(cfg, key)
        if key in planned:
            decisions[key] = Decision(value, "planned", planned[key])
        elif value is not None:
            decisions[key] = Decision(value, "configured", why)
    return {**est.summary(), "shape_from": source, "within_budget": total}, cfg


def make_plan(
    cfg: DictConfig, estimate_step: bool = True, fingerprint: bool = False, fit_budget: bool = False
) -> RunPlan:
    """The plan of the run ``cfg`` describes (``cfg`` itself is not changed).

    ``estimate_step``: also estimate the planned training step; ``fingerprint``: read the dataset's
    fingerprint even when no ``auto`` needs it; ``fit_budget``: a step over ``memory.budget`` gets
    the planner's answer (plan.py) instead of stopping the run (train.py). Bad values raise one
    :class:`UserInputError` naming the key."""
    decisions: dict[str, Decision] = {}
    notes: list[str] = []
    configured_batch = (cfg.data.batch_size, cfg.trainer.accumulate_grad_batches)

    device = plan_device(cfg)
    decisions["device"] = device
    if OmegaConf.select(cfg, "memory.plan_device") is None:  # a plan for this machine
        _check_placement_devices(OmegaConf.select(cfg, "model.placement"))
    settings: dict[str, Any] = {}
    if "callbacks" in cfg:  # eval.py has none
        dropped, said = reconcile_callbacks(cfg.get("callbacks"), cfg.trainer, cfg.get("memory"))
        settings = {f"callbacks.{name}": None for name in dropped}
        if dropped:
            decisions["callbacks"] = Decision(
                sorted(k for k, v in cfg.callbacks.items() if v is not None and k not in dropped),
                "planned",
                f"left out {', '.join(dropped)}: trainer.enable_progress_bar=false",
            )
        notes += said

    # PYTORCH_CUDA_ALLOC_CONF, written by the entry point (utils.alloc_conf)
    allocator = resolve_allocator(OmegaConf.select(cfg, "memory.allocator"))
    decisions["memory.allocator"] = Decision(allocator.value, allocator.source, allocator.why)
    requested = cfg.trainer.precision
    cuda_bf16 = cuda_bf16_supported() if torch.cuda.is_available() else True
    choice = resolve_precision(requested, device.value, cuda_bf16=cuda_bf16)
    log_choice(choice)
    source = "configured" if choice.precision == str(requested) else "planned"
    decisions["trainer.precision"] = Decision(choice.precision, source, choice.reason)
    # the estimator plans for the same device
    settings |= {"memory.plan_device": device.value, "trainer.precision": choice.precision}
    if "async_checkpoint" in cfg:  # train.py's
        writes = plan_async_checkpoint(cfg.async_checkpoint, cfg.trainer.get("strategy"))
        decisions["async_checkpoint"] = writes
        settings["async_checkpoint"] = writes.value
    cfg = applied(cfg, settings)

    opened = _Data()
    found, cfg = _plan_data(cfg, decisions, fingerprint, opened)

    settings = {"data.patch_size": decisions["data.patch_size"].value}
    lr = resolve_learning_rate(cfg)
    if lr is not None:
        source = "planned" if lr.why else "configured"
        decisions["model.optimizer.lr"] = Decision(lr.value, source, lr.why)
        settings["model.optimizer.lr"] = lr.value
    # the rule is the plan's, not the optimizer's argument
    cfg = applied(cfg, settings, ["model.optimizer.lr_by_classes"] if lr else [])

    if isinstance(OmegaConf.select(cfg, "model.net"), DictConfig):
        network, cfg = plan_network(cfg, decisions["data.patch_size"].value)
        decisions.update(network)
    budget = Budget.of(OmegaConf.select(cfg, "memory.budget"))
    levers = _plan_levers(cfg, device.value, decisions, budget)
    settings = _plan_loader(cfg, device.value, decisions)
    for key in (*LEVER_KEYS, "trainer.accumulate_grad_batches"):
        if key in decisions and decisions[key].source == "planned":
            settings[key] = decisions[key].value
    cfg = applied(cfg, settings)
    _check_channels(cfg, opened)  # with the data config final: the run's datamodule
    volume = _validation_volume(cfg, bool(budget or estimate_step), opened)
    estimate, run, cfg = _plan_step(cfg, decisions, budget, estimate_step, fit_budget, volume[0])
    if levers is not None:
        estimate = {**estimate, "fastest_fit": levers}
    notes += _batch_notes(cfg, configured_batch, decisions)
    validation, cfg = _plan_validation(
        cfg, decisions, notes, budget, estimate_step, fit_budget, volume, run
    )
    from volseg.plan.duration import predict_duration

    return RunPlan(
        config=cfg,
        decisions=decisions,
        estimate=estimate,
        validation=validation,
        fingerprint=found,
        notes=tuple(notes),
        precision=dataclasses.asdict(choice),
        duration=predict_duration(cfg, run, opened.module, estimate),
        datamodule=opened.for_run(cfg),
    )
