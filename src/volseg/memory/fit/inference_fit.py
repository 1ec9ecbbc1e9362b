"""Fit whole-volume inference to a memory budget: validation inside a planned run
(:func:`fit_validation`; its levers: docs/memory.md, "Validation's levers") and where
``predict.py`` stitches each volume (:func:`plan_stitching`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from omegaconf import DictConfig

from volseg.memory.estimate.candidate import Candidate
from volseg.memory.estimate.inference_pass import InferenceEstimate, estimate_prediction
from volseg.memory.estimate.margins import margin_text
from volseg.memory.fit.search import bisect, least, most_windows, shrunk_patches
from volseg.memory.fit.step_fit import patch_divisor
from volseg.models.networks import adapter_for
from volseg.models.networks.probe import shape_taker
from volseg.utils.units import MIB

log = logging.getLogger(__name__)

SW_BATCH = "model.inferer.sw_batch_size"
STITCH_DEVICE = "model.inferer.device"
ROI = "model.inferer.roi_size"


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:,.0f} MiB"


def margin_note(est: InferenceEstimate) -> str:
    """How the budget is counted on CUDA: the planner's margin on the reserved peak."""
    if not (est.margin or est.margin_fixed_mib):
        return ""
    return f" (planned with {margin_text(est)} on its reserved peak)"


@dataclass
class InferenceFit:
    """The answer for one budget: ``candidate`` (what changes), ``reasons`` by config key,
    ``estimate`` (``None``: nothing tried fits) and ``tried`` (each lever, with the least it
    needed)."""

    estimate: InferenceEstimate | None
    candidate: Candidate = field(default_factory=Candidate)
    reasons: dict[str, str] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)


def _shape(values: Sequence[int]) -> str:
    return "x".join(map(str, values))


def _written(candidate: Candidate) -> str:
    """``candidate``'s settings as the log writes them: ``key=value`` each."""
    return " ".join(f"{k}={v}" for k, v in candidate.settings().items())


def fit_validation(
    cfg: DictConfig,
    budget: int,
    volume_shape: Sequence[int],
    configured: InferenceEstimate,
    estimator: Callable[[Candidate], InferenceEstimate],
    smaller_windows: bool = True,
) -> InferenceFit:
    """The cheapest validation settings of ``cfg`` that fit ``budget`` bytes for a volume whose
    ``configured`` estimate does not; ``estimator``: the engine's, for a :class:`Candidate`.
    ``smaller_windows=False`` (``train.py``) tries only what changes nothing computed."""
    device, sw0 = configured.device, configured.sw_batch_size
    roi0 = [int(r) for r in configured.roi_size]
    host_possible = device == "cuda" and configured.stitch == "device"
    fit = InferenceFit(estimate=None)
    cache: dict[tuple, InferenceEstimate] = {}
    lever: list[tuple[str, InferenceEstimate]] = []  # the current lever's estimates
    over = (
        f"validation of one {_shape(volume_shape)} volume with {SW_BATCH}={sw0}"
        f"{', stitched on the host' if configured.stitch == 'host' else ''} needs "
        f"{_mib(configured.process_total)} on {device}{margin_note(configured)}, over "
        f"{_mib(budget)}"
    )
    same_memory = (
        f" (on {device} host and device are the same memory: host stitching would save nothing)"
        if device != "cuda"
        else ""
    )

    def settings(sw: int, host: bool, roi: list[int]) -> Candidate:
        """The candidate with ``sw`` windows at once, host stitching and ``roi``, each where it
        changes the configured validation."""
        return Candidate(
            sw_batch_size=sw if sw != sw0 else None,
            roi_size=roi if roi != roi0 else None,
            stitch_device="cpu" if host and host_possible else None,
        )

    def estimate(sw: int, host: bool, roi: list[int]) -> InferenceEstimate | None:
        key = (sw, host, tuple(roi))
        text = _written(settings(sw, host, roi))
        if key not in cache:
            stitch = "cpu" if host and host_possible else None
            cache[key] = estimator(Candidate(sw_batch_size=sw, roi_size=roi, stitch_device=stitch))
            fits = " (fits)" if cache[key].fits(budget) else ""
            log.info("validation: %s %s%s", text, _mib(cache[key].process_total), fits)
        lever.append((text, cache[key]))
        return cache[key] if cache[key].fits(budget) else None

    def tried(name: str) -> None:
        candidates = [
            (f"{_mib(e.process_total)} at {text or 'the configured settings'}", e.process_total)
            for text, e in lever
        ]
        fit.tried.append(f"{name} ({least(candidates)})")
        lever.clear()

    def found(
        est: InferenceEstimate, sw: int, host: bool, roi: list[int], why: str
    ) -> InferenceFit:
        fit.estimate, fit.candidate = est, settings(sw, host, roi)
        figures = f"{_mib(est.total_within(budget))} within the budget"
        reasons = {
            SW_BATCH: f"{sw} window(s) at a time fit ({figures}): the same windows, fewer at once"
            if fit.candidate.roi_size is None
            else f"{sw} of the smaller windows at a time: the most that fit, up to the "
            "configured window batch's voxels",
            STITCH_DEVICE: f"{why}: the stitched logits and count map ({_mib(est.host_stitching)})"
            " and the whole-volume steps after them in host memory, the windows on the GPU "
            f"({figures})",
            ROI: f"{why}: the largest window below {_shape(roi0)} that fits, one multiple of "
            f"model.divisible_by off one side at a time ({figures})",
        }
        reasons[SW_BATCH] += same_memory
        fit.reasons = {key: f"{over}; {reasons[key]}" for key in fit.candidate.settings()}
        log.info("validation: planned %s (%s)", _written(fit.candidate), figures)
        return fit

    # 1. fewer windows at once: the window batch's forward shrinks with it
    if sw0 > 1:
        sw, est = most_windows(lambda n: estimate(n, False, roi0), sw0 // 2, sw0)
        if est is not None:
            return found(est, sw, False, roi0, "")
        tried(f"fewer windows at once: {SW_BATCH} 1 to {sw0 - 1} at {_shape(roi0)}")
    # 2. host stitching (a GPU run only), with the most windows at once that fit
    if host_possible:
        sw, est = most_windows(lambda n: estimate(n, True, roi0), sw0, sw0 + 1)
        if est is not None:
            why = (
                "no number of windows at once fits with the whole volume stitched on the GPU"
                if sw0 > 1
                else "the whole volume's buffers do not fit on the GPU"
            )
            return found(est, sw, True, roi0, why)
        tried(f"host stitching: {STITCH_DEVICE}=cpu with {SW_BATCH} 1 to {sw0}")
    if not smaller_windows:
        return fit
    # 3. smaller windows; not for a network built for one input size (UNETR's img_size): its
    # windows are its training patch
    net = cfg.model.net
    if adapter_for(str(net._target_)).sized_for(net, roi0):
        fit.tried.append(f"smaller windows: not for {net._target_}, built for one input size")
        return fit
    divisor = patch_divisor(cfg)
    windows = shrunk_patches(roi0, divisor, shape_taker(net, int(cfg.in_channels)))
    if not windows:
        fit.tried.append(f"smaller windows: none below {_shape(roi0)} that the network takes")
        return fit
    voxels0 = sw0 * math.prod(roi0)

    def most_of(roi: list[int], bisected: bool = True) -> tuple[int, InferenceEstimate | None]:
        """The most windows of ``roi`` at once that fit, up to the configured window batch's
        voxels (``bisected=False``: the first of :func:`windows_at_once` that fits)."""
        cap = max(1, voxels0 // math.prod(roi))
        return most_windows(lambda k: estimate(k, True, roi), cap, cap + 1, bisected)

    name = (
        f"smaller windows: {ROI} {_shape(windows[0])} down to {_shape(windows[-1])}, each with "
        f"up to {voxels0:,} voxels at once{', stitched on the host' if host_possible else ''}"
    )
    # the smallest window first: where the whole-volume steps alone are over the budget, no
    # window fits, and this one search says so
    if most_of(windows[-1], bisected=False)[1] is None:
        tried(name)
        return fit
    # then from the largest down, as nnU-Net shrinks its patch: what a window needs does not
    # fall steadily with its size and count on every device (on a CPU the convolution's
    # algorithm changes with both), so no window is skipped by bisection
    for roi in windows:
        k, est = most_of(roi)
        if est is not None:
            break
    why = (
        "neither fewer windows at once nor host stitching fits"
        if host_possible
        else f"fewer windows at once does not fit{same_memory}"
    )
    return found(est, k, True, roi, why)


@dataclass
class StitchPlan:
    """Where ``predict.py`` stitches each volume shape (``(D, H, W)`` -> ``device``/``host``),
    planned for ``limit`` bytes of ``device`` memory (``source``: where the limit comes from),
    and the estimates it rests on (shape -> the chosen stitching's)."""

    device: str
    limit: int | None
    source: str
    stitch: dict[tuple[int, ...], str] = field(default_factory=dict)
    estimates: dict[tuple[int, ...], InferenceEstimate] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One log line per volume shape."""
        within = f"{_mib(self.limit)} ({self.source})" if self.limit else "no limit known"
        out = []
        for shape, where in self.stitch.items():
            est = self.estimates.get(shape)
            figures = (
                f"peak allocated {_mib(est.peak_allocated)}, process total "
                f"{_mib(est.process_total)} on {est.device}"
                if est is not None
                else "not estimated (smaller than one that fits)"
            )
            out.append(f"  {_shape(shape)}: stitched on the {where} ({figures}; {within})")
        return out


def plan_stitching(
    cfg: DictConfig,
    shapes: Sequence[Sequence[int]],
    device: str,
    limit: int | None,
    source: str,
    flip_axes: Sequence[int],
    precision: str,
    stitch: str,
    estimator: Callable[..., InferenceEstimate] = estimate_prediction,
) -> StitchPlan:
    """``predict.py``'s stitching per volume shape, before the first volume: on the device
    where the estimate fits ``limit`` bytes there, else on the host, the shapes bisected by
    voxels. On a CPU, or with ``stitch=device``/``host``, only the largest is estimated."""
    plan = StitchPlan(device, limit, source)
    ordered = sorted({tuple(int(v) for v in s) for s in shapes}, key=math.prod)
    if not ordered or (device == "cuda" and limit is None):
        return plan

    def estimate(shape: tuple[int, ...], stitch: str) -> InferenceEstimate:
        return estimator(cfg, list(shape), stitch=stitch, flip_axes=flip_axes, precision=precision)

    if device != "cuda" or stitch != "auto":
        where = "device" if device != "cuda" else stitch
        plan.estimates[ordered[-1]] = estimate(ordered[-1], where)
        plan.stitch = dict.fromkeys(ordered, where)
        return plan

    def on_device(i: int) -> bool:
        est = estimate(ordered[i], "device")
        if est.fits(limit):
            plan.estimates[ordered[i]] = est
        return est.fits(limit)

    good = bisect(on_device, -1, len(ordered))  # the largest shape that fits stitched there
    for i, shape in enumerate(ordered):
        plan.stitch[shape] = "device" if i <= good else "host"
    if good < len(ordered) - 1:
        plan.estimates[ordered[-1]] = estimate(ordered[-1], "host")
    return plan
