"""Fit whole-volume inference to a memory budget: validation inside a planned run, and where
``predict.py`` stitches each volume.

Validation's levers, cheapest in time first (each answer is checked by an estimate of
:mod:`volseg.memory.inference`, after the planned run's training steps):

1. fewer windows at once (``model.inferer.sw_batch_size``): the same windows and the same
   result, only less parallel work per forward; the largest that fits;
2. host stitching (``model.inferer.device=cpu``, CUDA only): the whole-volume buffers (stitched
   logits, count map) and what follows them (the float32 logits, argmax, loss and Dice) in host
   memory; the windows still run on the GPU, each window batch's output is copied to the host;
   again with the largest ``sw_batch_size`` that fits. On a CPU the host is the device: it
   would save nothing and is not tried;
3. smaller windows (``model.inferer.roi_size``): more windows, more overlap, less context per
   window (the Dice a run selects its checkpoint by may change): the largest window of the
   training patch's aspect, every side a multiple of ``model.divisible_by``, one window at a
   time (on CUDA stitched on the host).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from volseg.memory.inference import InferenceEstimate, estimate_prediction, estimate_validation
from volseg.memory.planner import _largest, patch_divisor, scaled_patch
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
    return f" (planned with +{est.margin:.0%} on its reserved peak)" if est.margin else ""


@dataclass
class InferenceFit:
    """The answer for one budget: ``overrides`` (config key -> value), ``reasons`` (config key
    -> why), ``estimate`` (the planned validation's; ``None``: nothing tried fits), ``tried``
    (each setting estimated, with its process total, in order)."""

    estimate: InferenceEstimate | None
    overrides: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)


def _with(cfg: DictConfig, settings: dict[str, Any]) -> DictConfig:
    out = copy.deepcopy(cfg)
    with open_dict(out):
        for key, value in settings.items():
            OmegaConf.update(out, key, value, merge=False, force_add=True)
    return out


def _most_windows(
    fits: Callable[[int], InferenceEstimate | None], start: int, above: int
) -> tuple[int, InferenceEstimate | None]:
    """The largest ``sw_batch_size`` below ``above`` that ``fits``: ``start``, then halving it
    to the first that fits, then bisecting up to the last that did not. Halving first: a
    window batch of one is not always the least (on a CPU, a float32 batch of one runs torch's
    own 3D convolution, whose column buffer is 27 times its input's)."""
    bad, n = above, start
    while n >= 1:
        est = fits(n)
        if est is not None:
            break
        bad, n = n, n // 2
    else:
        return 0, None
    good = n
    while bad - good > 1:
        mid = (good + bad) // 2
        found = fits(mid)
        if found is not None:
            good, est = mid, found
        else:
            bad = mid
    return good, est


def fit_validation(
    cfg: DictConfig,
    budget: int,
    volume_shape: Sequence[int],
    configured: InferenceEstimate,
    smaller_windows: bool = True,
    estimator: Callable[[DictConfig, Sequence[int]], InferenceEstimate] = estimate_validation,
) -> InferenceFit:
    """The cheapest validation settings of the planned run ``cfg`` that fit ``budget`` bytes
    for a volume of ``volume_shape``, whose ``configured`` estimate does not fit (see the module
    docstring for the order); ``smaller_windows=False`` stops before trying smaller windows
    (``train.py``: it changes nothing that changes what it computes)."""
    device = configured.device
    sw0 = configured.sw_batch_size
    roi0 = list(configured.roi_size)
    host_possible = device == "cuda" and configured.stitch == "device"
    fit = InferenceFit(estimate=None)
    cache: dict[tuple, InferenceEstimate] = {}
    over = (
        f"validation of one {'x'.join(map(str, volume_shape))} volume with {SW_BATCH}={sw0}"
        f"{', stitched on the host' if configured.stitch == 'host' else ''} needs "
        f"{_mib(configured.process_total)} on {device}{margin_note(configured)}, over "
        f"{_mib(budget)}"
    )

    def settings(sw: int, host: bool, roi: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if sw != sw0:
            out[SW_BATCH] = sw
        if host and host_possible:
            out[STITCH_DEVICE] = "cpu"
        if roi != roi0:
            out[ROI] = roi
        return out

    def estimate(sw: int, host: bool, roi: list[int]) -> InferenceEstimate | None:
        key = (sw, host, tuple(roi))
        if key not in cache:
            cache[key] = estimator(_with(cfg, settings(sw, host, roi)), volume_shape)
            total = cache[key].total_within(budget)
            text = " ".join(f"{k}={v}" for k, v in settings(sw, host, roi).items())
            fits = " (fits)" if total is not None else ""
            fit.tried.append(f"{text} {_mib(cache[key].process_total)}{fits}")
        est = cache[key]
        return est if est.fits(budget) else None

    def found(
        est: InferenceEstimate, sw: int, host: bool, roi: list[int], why: str
    ) -> InferenceFit:
        fit.estimate = est
        fit.overrides = settings(sw, host, roi)
        figures = f"{_mib(est.total_within(budget))} within the budget"
        if SW_BATCH in fit.overrides:
            same_memory = (
                f" (on {device} host and device are the same memory: host stitching would save "
                "nothing)"
                if device != "cuda"
                else ""
            )
            fit.reasons[SW_BATCH] = (
                f"{over}; {sw} window(s) at a time fit ({figures}): the same windows, fewer at "
                f"once{same_memory}"
                if ROI not in fit.overrides
                else f"{over}; one window at a time with the smaller window{same_memory}"
            )
        if STITCH_DEVICE in fit.overrides:
            fit.reasons[STITCH_DEVICE] = (
                f"{over}; {why}: the stitched logits and count map "
                f"({_mib(est.host_stitching)}) and the whole-volume steps after them in host "
                f"memory, the windows on the GPU ({figures})"
            )
        if ROI in fit.overrides:
            fit.reasons[ROI] = (
                f"{over}; {why}: the largest window of the training patch's aspect that fits, "
                f"each side a multiple of model.divisible_by ({figures})"
            )
        log.info(
            "validation: planned %s (%s)",
            " ".join(f"{k}={v}" for k, v in fit.overrides.items()),
            figures,
        )
        return fit

    # 1. fewer windows at once: the window batch's forward shrinks with it
    if sw0 > 1:
        sw, est = _most_windows(lambda n: estimate(n, False, roi0), sw0 // 2, sw0)
        if est is not None:
            return found(est, sw, False, roi0, "")
    # 2. host stitching (a GPU run only), with the most windows at once that fit
    if host_possible:
        sw, est = _most_windows(lambda n: estimate(n, True, roi0), sw0, sw0 + 1)
        if est is not None:
            why = (
                "no number of windows at once fits with the whole volume stitched on the GPU"
                if sw0 > 1
                else "the whole volume's buffers do not fit on the GPU"
            )
            return found(est, sw, True, roi0, why)
    if not smaller_windows:
        return fit
    # 3. smaller windows, one at a time (stitched on the host on a GPU); not for a network
    # built for one input size (UNETR's img_size): its windows are its training patch
    net = cfg.model.net
    if adapter_for(str(net._target_)).sized_for(net, roi0):
        return fit
    divisor = patch_divisor(cfg)
    k_now = min(r // d for r, d in zip(roi0, divisor, strict=True))
    if k_now <= 1:
        return fit

    def window(k: int) -> list[int]:
        scaled = scaled_patch(roi0, k, divisor)
        # never above the configured window (a side not a multiple of its divisor rounds up)
        return [min(s, max(d, r // d * d)) for s, r, d in zip(scaled, roi0, divisor, strict=True)]

    # the smallest window the network takes (a probed divisor says which sides it keeps, not
    # the least), checked on meta tensors
    takes = shape_taker(net, int(cfg.get("in_channels", 1)))
    k_min = next((k for k in range(1, k_now) if takes(window(k))), k_now)
    if k_min >= k_now:
        return fit
    # the smallest window first: where the whole-volume steps alone are over the budget, no
    # window fits, and this one estimate says so (the search would try each size)
    if estimate(1, True, window(k_min)) is None:
        return fit
    ratio = budget / max(configured.process_total, 1)
    guess = max(k_min, min(k_now - 1, int(k_now * ratio ** (1 / 3))))
    k, est = _largest(lambda n: estimate(1, True, window(n)), k_min, k_now - 1, guess)
    if est is not None:
        why = (
            "neither fewer windows at once nor host stitching fits"
            if host_possible
            else f"fewer windows at once does not fit (on {device} host and device are the same "
            "memory: host stitching would save nothing)"
        )
        return found(est, 1, True, window(k), why)
    return fit


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
            out.append(
                f"  {'x'.join(map(str, shape))}: stitched on the {where} ({figures}; {within})"
            )
        return out


def plan_stitching(
    cfg: DictConfig,
    shapes: Sequence[Sequence[int]],
    device: str,
    limit: int | None,
    source: str,
    flip_axes: Sequence[int] = (),
    precision: str = "32-true",
    stitch: str = "auto",
    estimator: Callable[..., InferenceEstimate] | None = None,
) -> StitchPlan:
    """``predict.py``'s stitching per volume shape, before the first volume: on the device
    where the estimate fits ``limit`` bytes there, else on the host; ``cfg``: the planned
    config with the prediction's inferer as ``model.inferer``. A volume stitched on the device
    needs no more than a larger one (fewer voxels, no more windows), so the shapes are bisected
    by voxels: a few estimates for any number of volumes. On a CPU (host and device are one
    memory) the largest is estimated, for the log and ``limit``. Without a limit (a GPU run
    with neither ``memory.budget`` nor a known device total) nothing is planned: ``stitch=auto``
    decides per volume at run time. ``stitch=device`` or ``host`` (predict.py's own choice): the
    largest is estimated with it, nothing is chosen."""
    estimator = estimator or estimate_prediction
    plan = StitchPlan(device, limit, source)
    ordered = sorted({tuple(int(v) for v in s) for s in shapes}, key=math.prod)
    if not ordered or (device == "cuda" and limit is None):
        return plan

    def estimate(shape: tuple[int, ...], stitch: str) -> InferenceEstimate:
        return estimator(cfg, list(shape), stitch=stitch, flip_axes=flip_axes, precision=precision)

    def fits(est: InferenceEstimate) -> bool:
        return limit is None or est.fits(limit)

    if device != "cuda" or stitch != "auto":
        where = "device" if device != "cuda" else stitch
        plan.estimates[ordered[-1]] = estimate(ordered[-1], where)
        plan.stitch = dict.fromkeys(ordered, where)
        return plan
    # the largest shape stitched on the device that fits (bisection over the sorted shapes)
    good, bad = -1, len(ordered)
    while bad - good > 1:
        mid = (good + bad) // 2
        est = estimate(ordered[mid], "device")
        if fits(est):
            good = mid
            plan.estimates[ordered[mid]] = est
        else:
            bad = mid
    for i, shape in enumerate(ordered):
        plan.stitch[shape] = "device" if i <= good else "host"
    if good < len(ordered) - 1:
        plan.estimates[ordered[-1]] = estimate(ordered[-1], "host")
    return plan
