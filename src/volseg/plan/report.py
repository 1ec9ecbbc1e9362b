"""Every memory and plan report as the commands print it (MiB), and the one line that stops a
run over ``memory.budget``; the figures are :mod:`volseg.memory.estimate`'s and
:mod:`volseg.memory.fit`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from volseg.data.host_memory import HostEstimate
from volseg.memory import (
    ROI,
    STITCH_DEVICE,
    SW_BATCH,
    InferenceEstimate,
    MemoryEstimate,
    margin_note,
    planned_total,
)
from volseg.plan.fastest_fit import seconds_text, written_levers
from volseg.utils.config import plain
from volseg.utils.errors import BudgetExceeded
from volseg.utils.units import MIB, Budget

log = logging.getLogger(__name__)

#: what the step's planning decides, said in the plan whether planned or configured
STEP_KEYS = ("data.batch_size", "model.activation_checkpointing", "trainer.accumulate_grad_batches")
#: what the plan fits to memory.budget: the step's keys and what else its planner moves (a smaller
#: patch, the network sized for it, loss checkpointing), then validation's
PLANNED_FOR_BUDGET = (*STEP_KEYS, "data.patch_size", "model.net.img_size", "model.checkpoint_loss")
PLANNED_FOR_BUDGET += (SW_BATCH, STITCH_DEVICE, ROI)


def _estimated(what: str, est: Mapping[str, Any], tail: str) -> str:
    return (
        f"  estimated {what}: peak allocated {est['peak_allocated'] / MIB:,.1f} MiB, process "
        f"total {est['process_total'] / MIB:,.1f} MiB, {tail}"
    )


def margin_figures(fixed_mib: float, share: float) -> str:
    """``+2.6 MiB + 0.0%``: both parts of a margin, to the steps they are fitted in (0.1 MiB,
    0.1%), so a fixed part of 2.6 MiB is not printed as 3 and a zero share is said as zero."""
    return f"+{fixed_mib:,.1f} MiB + {share:.1%}"


def _figures_of(est: Any) -> str:
    """:func:`margin_figures` of an estimate, its ``to_dict()`` or a plan's ``estimate``."""
    get = est.get if isinstance(est, Mapping) else lambda key: getattr(est, key, None)
    return margin_figures(get("margin_fixed_mib") or 0.0, get("margin") or 0.0)


def margin_line(est: Any) -> str:
    """The margin a step's estimate (its ``to_dict()``, a plan's ``estimate``) is planned with,
    said whatever its size: the figures, what they are added to, and where they come from (its
    ``margin_source``: the runs it was fitted on, or why a kind with none gets what it gets)."""
    get = est.get if isinstance(est, Mapping) else lambda key: getattr(est, key, None)
    on = (
        "the step's growth, the CPU margin of its kind"
        if get("device") == "cpu"
        else "the reserved peak, the margin of its kind of step"
    )
    return f"margin: {_figures_of(est)} of {on}: {get('margin_source')}"


def format_run_plan(run_plan: Any) -> str:
    """A :class:`volseg.plan.RunPlan`, one line per decision, for the log and ``plan.py``."""
    lines = ["Run plan:"]
    for key, d in run_plan.decisions.items():
        why = f" ({d.why})" if d.why else ""
        lines.append(f"  {key} = {plain(d.value)}  [{d.source}]{why}")
    est = dict(run_plan.estimate)
    if "peak_allocated" in est:
        flops = f"{est['flops_per_step'] / 1e9:,.2f} GFLOP per optimizer step"
        lines.append(_estimated(f"step on {est['device']}", est, flops))
        if "margin_source" in est:
            lines.append(f"  {margin_line(est)}")
    elif est:
        lines.append(f"  estimate: not made ({est.get('not_estimated')})")
    if "fastest_fit" in est:
        lines += fastest_fit_table(est["fastest_fit"])
    val = dict(run_plan.validation)
    if "peak_allocated" in val:
        shape = "x".join(map(str, val["volume_shape"]))
        what = f"validation of a {shape} volume ({val['shape_from']})"
        lines.append(_estimated(what, val, f"stitched on the {val['stitch']}"))
    lines += [f"  note: {note}" for note in run_plan.notes]
    return "\n".join(lines)


#: fitting candidates the table shows (plan.yaml keeps every one)
SHOWN = 8


def fastest_fit_table(fit: Mapping[str, Any]) -> list[str]:
    """The fastest fit's table: the fitting candidates, fastest per sample first, the pick marked
    ``>``; then each setting's first candidate over the budget, by how much; then any the network
    refused, with why."""
    rows = [dict(r) for r in fit["rows"]]
    budget = fit["budget"]
    fitting = sorted(
        (r for r in rows if r["fits"] and r["seconds_per_sample"] is not None),
        key=lambda r: (r["seconds_per_sample"], -r["batch_size"] * r["accumulate_grad_batches"]),
    )
    lines = [
        f"  fastest fit against {fit['budget_of']} ({budget / MIB:,.0f} MiB); step time "
        f"{fit['time_model']}:",
        f"    {'batch':>7}  {'levers':<40} {'peak+margin':>11}  {'step':>8}  {'a sample':>8}",
    ]
    best = fitting[0]["seconds_per_sample"] if fitting else None
    for i, row in enumerate(fitting[:SHOWN]):
        mark = ">" if i == 0 else " "
        lines.append(
            f"  {mark} {row['batch_size']:>7}  {written_levers(row):<40} "
            f"{row['peak'] / MIB:>7,.0f} MiB  {seconds_text(row['seconds_per_step']):>8}  "
            f"{seconds_text(row['seconds_per_sample']):>8}"
            + (f"  {row['seconds_per_sample'] / best:.2f}x" if i else "  the pick")
        )
    if len(fitting) > SHOWN:
        more = len(fitting) - SHOWN
        lines.append(f"    ... {more} more that fit (plan.yaml: estimate.fastest_fit)")
    over = [r for r in rows if not r["fits"] and r["peak"] is not None]
    if over:
        said = (
            f"batch {r['batch_size']} {written_levers(r)} +{(r['peak'] - budget) / MIB:,.0f} MiB"
            for r in over
        )
        lines.append("    over the budget: " + "; ".join(said))
    lines += [
        f"    batch {r['batch_size']} {written_levers(r)}: {r['why']}"
        for r in rows
        if r["peak"] is None
    ]
    return lines


def format_fingerprint(fingerprint: dict[str, Any] | None) -> str:
    """The dataset's fingerprint as the lines ``plan.py`` prints."""
    if not fingerprint:
        return "Dataset fingerprint: none (no data read)"
    resampled = fingerprint.get("shapes_resampled_to")
    grid = f" on the data.spacing={resampled} grid" if resampled else ""
    return (
        f"Dataset fingerprint: {fingerprint['cases']} cases\n  median shape [D, H, W] "
        f"{fingerprint['median_shape']}{grid} (smallest {fingerprint['min_shape']}, largest "
        f"{fingerprint['max_shape']})\n  median spacing [z, y, x] {fingerprint['median_spacing']}"
    )


def unmodelled_levers(cfg: Any) -> list[str]:
    """The settings of ``cfg`` (a planned ``train`` config) the step's estimate does not model,
    each with what the estimate assumes instead (:mod:`volseg.memory.estimate.training_step`)."""
    found = []
    placement = OmegaConf.select(cfg, "model.placement")
    if placement:
        found.append(
            f"model.placement={plain(placement)}: the estimate is for one device holding "
            "everything; each device holds its part of it"
        )
    if OmegaConf.select(cfg, "model.compile"):
        found.append("model.compile=true: the eager step is estimated, not compiled kernels")
    strategy = str(OmegaConf.select(cfg, "trainer.strategy") or "auto")
    if strategy not in ("auto", "single_device"):
        found.append(
            f"trainer.strategy={strategy}: one process's step, without communication buckets "
            "or sharding"
        )
    return found


def format_estimate(
    est: MemoryEstimate, top: int, context_source: str = "", unmodelled: Any = ()
) -> str:
    """The estimate as the text table ``estimate_memory.py`` prints (MiB): every byte of the
    process total on a line (the categories at the step's peak, the kernels' workspace, the
    allocator's cache, the CUDA context, ``context_source`` saying where its figure comes
    from), the activations by module as shares of the activations line, and the settings the
    estimate does not model (``unmodelled``: :func:`unmodelled_levers`)."""
    shape = "×".join(str(p) for p in est.patch_size)
    k = est.accumulate_grad_batches
    batch = f"{k} micro-batches of {est.batch_size}" if k > 1 else f"batch {est.batch_size}"
    cuda = est.device == "cuda"
    lines = [
        f"Estimated training step on {est.device}: {batch} of {shape} voxels, "
        f"precision {est.precision}, activation_checkpointing={est.activation_checkpointing} "
        f"({est.seconds:.1f} s)",
        f"  at the step's peak (% of the {'process total' if cuda else 'peak allocated'}):",
    ]
    workspace = "cuDNN's, as modelled" if cuda else "oneDNN's and torch's, as modelled"
    categories = ("params", "buffers", "grads", "optimizer_state", "activations", "temporaries")
    rows = [(name.replace("_", " "), getattr(est, name)) for name in categories]
    rows.append((f"kernel workspace ({workspace})", est.kernel_workspace))
    # what no category holds at the peak: the batch, allocator rounding between the replays
    rest = est.peak_allocated - sum(n for _, n in rows)
    if rest:
        rows.append(("the batch and rounding", rest))
    total = est.process_total if cuda else est.peak_allocated

    def line(name: str, nbytes: int, of: int = total) -> str:
        return f"    {name:<52}{nbytes / MIB:>12,.1f} MiB {100 * nbytes / max(of, 1):6.1f}%"

    lines += [line(n, b) for n, b in rows] + [line("= peak allocated", est.peak_allocated)]
    if cuda:
        lines += [
            line("allocator cache (reserved − allocated)", est.peak_reserved - est.peak_allocated),
            line(f"CUDA context ({context_source or 'memory.cuda_context_mib'})", est.cuda_context),
            line("= process total (nvidia-smi)", est.process_total),
        ]
    if est.device == "cpu":  # what a budget is checked against on this CPU, even a 0.1 MiB margin
        lines.append(f"    {'step growth':<52}{est.step_peak_growth / MIB:>12,.1f} MiB")
        lines.append(
            f"    {f'planned ({_figures_of(est)} of growth)':<52}"
            f"{planned_total(est) / MIB:>12,.1f} MiB"
        )
    lines.append(f"  {margin_line(est)}")
    activations = max(est.activations, sum(est.modules.values()), 1)
    lines.append(
        f"  activations by module (what its forward keeps for backward; % of the "
        f"{activations / MIB:,.1f} MiB of activations):"
    )
    lines += [line(n, b, activations) for n, b in list(est.modules.items())[:top]]
    more = list(est.modules.values())[top:]
    if more:
        lines.append(line(f"({len(more)} more modules)", sum(more), activations))
    outside = activations - sum(est.modules.values())
    if outside > 0:
        lines.append(line("(outside any module: the batch, autograd)", outside, activations))
    lines += [f"  not modelled: {text}" for text in unmodelled]
    return "\n".join(lines)


def format_lever_prices(rows: Any) -> str:
    """Every lever with its price (:func:`volseg.memory.lever_prices`): the predicted
    peak (the margin included), step time and FLOPs of each as factors, one line each."""
    lines = [
        "Every lever for this step (predicted peak with the margin; step time and FLOPs as "
        "factors of the configured step's, the time from its ops timed on this machine):",
        f"  {'lever':<25}{'peak':>14}   time  FLOPs  setting",
    ]
    for r in rows:
        factors = " ".join(
            "    ?" if v is None else f"{v:5.2f}x" for v in (r.time_factor, r.flops_factor)
        )
        moved = f", {r.moved / MIB:,.0f} MiB moved a step" if r.moved else ""
        why = f"  ({r.why}{moved})" if r.why or moved else ""
        peak = "         —    " if r.peak is None else f"{r.peak / MIB:>10,.0f} MiB"
        lines.append(f"  {r.lever:<25}{peak}  {factors}  {r.setting}{why}")
    return "\n".join(lines)


def format_planned(run_plan: Any) -> str:
    """What the plan fitted to ``memory.budget`` (its planned step keys), one line each."""
    budget = OmegaConf.select(run_plan.config, "memory.budget")
    if not budget:
        return "memory.budget: not set (nothing planned to fit)"
    lines = [f"Planned for memory.budget={budget}:"]
    for key, decision in run_plan.decisions.items():
        if decision.source == "planned" and key in PLANNED_FOR_BUDGET:
            lines.append(f"  {key}={plain(decision.value)} ({decision.why})")
    if len(lines) == 1:
        lines.append("  the configured run fits as it is")
    return "\n".join(lines)


def format_inference(est: InferenceEstimate, source: str = "") -> str:
    """One estimate as ``estimate_memory.py`` prints it (MiB)."""
    shape = "×".join(str(v) for v in est.volume_shape)
    where = "host" if est.stitch == "host" else est.device
    lines = [
        f"Estimated {est.phase} on {est.device}: one {shape} volume"
        + (f" ({source})" if source else "")
        + f", {est.windows} windows of {'×'.join(map(str, est.roi_size))} in batches of "
        f"{est.sw_batch_size}, stitched on the {where}"
        + (f", {est.flips} flips" if est.flips > 1 else "")
        + f", precision {est.precision} ({est.seconds:.1f} s)",
    ]
    rows = [
        ("resident (training state)" if est.phase == "validation" else "resident (parameters)",
         est.resident),
        ("volume (input, label)" if est.phase == "validation" else "volume (input)", est.volume),
        ("stitching buffers", est.stitching),
        ("one window batch's forward", est.window_batch),
        ("peak allocated", est.peak_allocated),
    ]  # fmt: skip
    if est.host_stitching:
        rows.insert(3, ("stitching buffers (host)", est.host_stitching))
    if est.device == "cuda":
        rows += [
            ("peak reserved", est.peak_reserved),
            ("process total (nvidia-smi)", est.process_total),
        ]
    lines += [f"    {name:<28}{nbytes / MIB:>12,.1f} MiB" for name, nbytes in rows]
    return "\n".join(lines)


def format_run_peak(step: MemoryEstimate, validation: InferenceEstimate) -> str:
    """The run's peak: the larger of the training step's and validation's, by phase."""
    phases = {"training step": step, "validation": validation}
    peak = max(phases, key=lambda n: (phases[n].process_total, phases[n].peak_allocated))
    lines = [f"Run peak: {peak}"]
    for phase, est in phases.items():
        a, r, t = est.peak_allocated, est.peak_reserved, est.process_total
        extra = f", reserved {r / MIB:,.1f}, process total {t / MIB:,.1f}" if r != a else ""
        lines.append(f"    {phase:<16} peak allocated {a / MIB:>10,.1f} MiB{extra}")
    return "\n".join(lines)


def format_host(est: HostEstimate) -> str:
    """The host section of ``estimate_memory.py``'s output (MiB)."""
    ranks = f" x {est.ranks} processes" if est.ranks > 1 else ""
    workers = f"{est.num_workers} loader worker(s)" if est.num_workers else "loading in-process"
    cached = (
        f"data.cache=memory, cache_rate {est.cache_rate:g}"
        if est.cache == "memory"
        else f"data.cache={est.cache}: nothing cached in RAM"
    )
    lines = [
        f"Host memory of the data side ({cached}; {workers}, pin_memory={est.pin_memory}, "
        f"start method {est.start_method}){ranks}:",
    ]
    rows = [
        (f"training cache ({est.train_cached}/{est.train_volumes} vol.)", est.train_cache),
        (f"validation cache ({est.val_cached}/{est.val_volumes} vol.)", est.val_cache),
        ("training loader copies+batches", est.train_loading),
        ("validation loader copies+batches", est.val_loading),
    ]
    if est.spawned_copies:
        rows.append((f"cache copies ({est.start_method} workers)", est.spawned_copies))
    rows += [
        ("data side total", est.data_total),
        ("this process now (VmRSS)", est.process_rss),
        ("host total", est.total),
    ]
    lines += [f"    {name:<36}{nbytes / MIB:>12,.1f} MiB" for name, nbytes in rows]
    if est.rejected:
        lines.append(f"  cases the checks will reject: {', '.join(est.rejected)}")
    return "\n".join(lines)


# -- memory.budget: a run whose estimated step or validation does not fit stops before any work
def _within_budget(est: Any, budget: Budget, what: str, note: str, after: str = "") -> int:
    """The predicted process total of ``est`` (the ``what`` of the message) within ``budget``;
    raises :class:`BudgetExceeded` in one line when it does not fit (a sweep records the job as
    pruned): ``note`` after its peak, ``after`` at the end."""
    total = est.total_within(budget.nbytes)
    if total is None:
        raise BudgetExceeded(
            f"memory.budget={budget}: the estimated {what} needs "
            f"{est.process_total / MIB:,.0f} MiB on {est.device} (peak allocated "
            f"{est.peak_allocated / MIB:,.0f} MiB){note}, over "
            f"{budget.nbytes / MIB:,.0f} MiB{after}"
        )
    log.info(
        "memory.budget=%s: the estimated %s needs %s MiB on %s, it fits",
        budget,
        what,
        f"{total / MIB:,.0f}",
        est.device,
    )
    return total


def check_estimate_fits(est: MemoryEstimate, budget: Budget) -> int:
    """:func:`_within_budget` of the training step ``est``, its margin said: on CUDA's reserved
    peak, or on a CPU step's growth, and where it comes from."""
    # the margin is said even where it is small: a refusal names every byte it counts
    note = (
        f" plus a margin of {_figures_of(est)} of its growth "
        f"({est.step_peak_growth / MIB:,.1f} MiB), the CPU margin of its kind: "
        f"{est.margin_source}"
        if est.device == "cpu"
        else f" with a margin of {_figures_of(est)} on the reserved peak: the estimate's "
        f"largest shortfall on a recorded GPU run, {est.margin_source}"
    )
    hint = (
        ". `python plan.py <the same overrides>` searches a batch, activation and loss "
        "checkpointing, micro-batches and a smaller patch that fit"
    )
    return _within_budget(est, budget, "training step", note, hint)


def check_validation_fits(
    est: InferenceEstimate, budget: Budget, shape_from: str, after: str = ""
) -> int:
    """:func:`_within_budget` of the run's validation ``est`` (of its largest volume, from
    ``shape_from``; ``after``: what else was tried and may help)."""
    what = f"validation of one {'x'.join(map(str, est.volume_shape))} volume ({shape_from})"
    return _within_budget(est, budget, what, margin_note(est), after)
