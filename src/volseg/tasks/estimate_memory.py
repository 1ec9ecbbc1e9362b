"""``run_estimate(cfg)``: the memory report ``python estimate_memory.py`` prints."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from volseg.data.host_memory import HostEstimate, local_processes
from volseg.memory import (
    MemoryEstimate,
    estimate_prediction,
    estimate_run,
    lever_prices,
    planned_device,
    resolve_cuda_context,
    validation_shape,
)
from volseg.plan import RunPlan, plan_run
from volseg.plan.report import (
    format_estimate,
    format_host,
    format_inference,
    format_lever_prices,
    format_planned,
    format_run_peak,
    unmodelled_levers,
)
from volseg.utils.errors import UserInputError
from volseg.utils.instantiate import build

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


def host_estimate(cfg: DictConfig) -> tuple[HostEstimate | None, str]:
    """The data side's host memory (from the headers), or ``None`` and why not."""
    try:
        datamodule = build(cfg.data, "data")
        if not Path(datamodule.root).exists():
            return None, f"data.root={datamodule.root} does not exist yet"
        device = planned_device(cfg)
        return datamodule.host_estimate(device, local_processes(cfg.trainer, device)), ""
    except UserInputError as err:  # train.py reports it; the step estimate stands without it
        return None, str(err).splitlines()[0]


def check_json_out(path: Path, overwrite: bool) -> None:
    """One error, before any work, for a ``memory.json_out`` that cannot be written."""
    if path.is_dir():
        raise UserInputError(
            f"memory.json_out={path}: is a folder; give a file, e.g. {path / 'estimate.json'}"
        )
    if not path.parent.is_dir():
        raise UserInputError(f"memory.json_out={path}: folder {path.parent} not found")
    if path.exists() and not overwrite:
        raise UserInputError(
            f"memory.json_out={path}: exists; nothing was written. Pass "
            "memory.overwrite=true to replace it, or choose another file"
        )


def inference_estimates(
    plan: RunPlan, step: MemoryEstimate, shape: list[int] | None, source: str
) -> dict[str, Any]:
    """Validation's and prediction's peaks (prediction as ``predict.py`` runs by default, stitched
    on the device and on the host) for ``shape`` (from ``source``), printed; their JSON entries."""
    if shape is None:
        print(f"Validation and prediction: not estimated ({source})")
        return {"validation": {"not_estimated": source}, "prediction": {"not_estimated": source}}
    validation = estimate_run(plan, None, shape).validation
    cfg = plan.run_config()
    prediction = estimate_prediction(cfg, shape, stitch="device")
    host = estimate_prediction(cfg, shape, stitch="host") if prediction.device == "cuda" else None
    print(format_inference(validation, source))
    print(format_inference(prediction, source))
    print(format_run_peak(step, validation))
    predicted = prediction.to_dict()
    if host is not None:
        predicted["host_stitching"] = host.to_dict()
    return {"validation": validation.to_dict(), "prediction": predicted}


def _context_label(source: str) -> str:
    """Where the CUDA context's figure comes from, as measured or assumed."""
    if source.startswith("measured"):
        return source
    if source == "memory.cuda_context_mib":
        return "as set: memory.cuda_context_mib"
    return "assumed: typical, not measured for this GPU"


def run_estimate(cfg: DictConfig) -> dict[str, Any]:
    """The memory report of the run ``plan.py`` plans with the same overrides; JSON out."""
    options = cfg.memory
    json_out = Path(options.json_out) if options.json_out else None
    if json_out is not None:
        check_json_out(json_out, bool(options.overwrite))
    run_plan = plan_run(cfg, estimate_step=False, fit_budget=True)
    log.info("%s", run_plan.format())
    cfg = run_plan.run_config()

    shape, source = validation_shape(cfg)
    est = estimate_run(run_plan, None, shape).step  # validation's in the same trace
    context = _context_label(resolve_cuda_context(options.cuda_context_mib, options.gpu).source)
    print(format_estimate(est, int(options.top), context, unmodelled_levers(cfg)))
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "estimate": est.to_dict()}
    if options.levers and "fastest_fit" not in run_plan.estimate:  # its table is the plan's
        prices = lever_prices(run_plan)
        print(format_lever_prices(prices))
        result["levers"] = [price.to_dict() for price in prices]
    result.update(inference_estimates(run_plan, est, shape, source))
    host, why_not = host_estimate(cfg)
    print(format_host(host) if host is not None else f"Host memory: not estimated ({why_not})")
    result["host"] = host.to_dict() if host is not None else None
    print(format_planned(run_plan))
    result["run_plan"] = run_plan.to_dict()["decisions"]
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2))
        log.info("Wrote %s", json_out)
    return result
