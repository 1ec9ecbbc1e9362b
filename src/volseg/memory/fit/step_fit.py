"""The training step that fits a memory budget (:func:`fit_step`), and ``data.batch_size=auto``'s
largest batch (:func:`largest_batch`); the levers' order and why: docs/memory.md, "The training
step's levers". Every :class:`Candidate` is one estimate, made once; time is FLOPs per sample
against the configured step's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from volseg.memory.estimate.candidate import Candidate
from volseg.memory.estimate.engine import PlannedRun, estimate_run
from volseg.memory.estimate.margins import planned_total
from volseg.memory.estimate.training_step import LoopSettings, MemoryEstimate
from volseg.memory.fit.search import largest_fitting, least, shrunk_patches
from volseg.models.networks import adapter_for
from volseg.models.networks.probe import network_divisibility, shape_taker
from volseg.utils.config import plain
from volseg.utils.errors import at_config_key
from volseg.utils.units import MIB

log = logging.getLogger(__name__)


@dataclass
class StepFit:
    """The planner's answer: what to set (``candidate``, the keys that change), and the estimates
    it rests on (bytes); ``flops_per_sample``: the answer's over the configured step's."""

    budget: int
    fits_as_configured: bool
    batch_size: int | None = None
    patch_size: list[int] | None = None
    activation_checkpointing: Any = None
    candidate: Candidate | None = None
    estimate: dict[str, Any] | None = None
    total_within_budget: int | None = None
    next_step_estimate: dict[str, Any] | None = None
    largest_batch_by_checkpointing: dict[str, int] = field(default_factory=dict)
    flops_per_sample: float | None = None
    micro_batching: dict[str, Any] | None = None
    #: the levers searched, in order, each with the least its candidates needed
    tried: list[str] = field(default_factory=list)
    #: parameters, gradients and optimizer state (bytes), which no lever lowers
    resident: int | None = None
    #: the lever past batch and checkpointing that found the answer, if one did
    fallback: str | None = None

    def refusal(self, budget_value: Any) -> str:
        """Why nothing fits ``memory.budget=budget_value``, in one line: the resident state
        alone, or each lever tried with the least it needed."""
        budget = f"{self.budget / MIB:,.0f} MiB"
        if self.resident is not None and self.resident > self.budget:
            return (
                f"memory.budget={budget_value}: the resident training state alone needs "
                f"{self.resident / MIB:,.1f} MiB ({'; '.join(self.tried)}), over {budget}; "
                "no batch, patch or checkpointing lowers it: a smaller network, an optimizer "
                "with less state, or a larger budget"
            )
        return (
            f"memory.budget={budget_value}: nothing fits {budget}; tried "
            f"{'; '.join(self.tried)}. A larger budget or a smaller network"
        )


def written(value: Any) -> str:
    """``value`` as a command-line override writes it: ``all``, ``[16,48,48]``."""
    value = plain(value)
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def scaled_patch(base: Sequence[int], k: int, divisor: Sequence[int]) -> list[int]:
    """``base`` ``[D, H, W]`` scaled so that the axis with the fewest multiples of its divisor
    gets ``k`` of them, every side rounded to a multiple of its ``divisor`` (per axis)."""
    ref = min(range(3), key=lambda a: base[a] / divisor[a])
    scale = k * divisor[ref] / base[ref]
    return [max(d, round(scale * p / d) * d) for p, d in zip(base, divisor, strict=True)]


def patch_divisor(cfg: DictConfig) -> list[int]:
    """Per-axis ``[D, H, W]`` divisors of a patch: ``model.divisible_by``, else the network's."""
    planned = plain(cfg.model.get("divisible_by"))
    if isinstance(planned, list):
        return [int(d) for d in planned]
    if isinstance(planned, int) and not isinstance(planned, bool):
        return [planned] * 3
    try:
        found, _ = network_divisibility(
            cfg.model.net, plain(cfg.data.patch_size), int(cfg.get("in_channels", 1))
        )
    except ValueError as err:
        raise at_config_key(str(err), "model") from None
    return found


def checkpointing_choices(cfg: DictConfig, configured: Any) -> list[Any]:
    """The checkpointing settings a budget search tries, least recomputation first: ``configured``
    (``memory.checkpointing_options``), or for ``auto``/``None`` the network adapter's."""
    configured = plain(configured)
    if configured is None or configured == "auto":
        return list(adapter_for(str(cfg.model.net._target_)).checkpointing_choices)
    return list(configured)


def resident_bytes(est: MemoryEstimate) -> tuple[int, str]:
    """What a training step holds whatever its batch, patch or checkpointing (bytes), and its
    parts as text."""
    parts = (
        ("parameters", est.params + est.buffers),
        ("gradients", max(est.grads, est.params)),  # every parameter's, held at the update
        ("optimizer state", est.optimizer_state),
    )
    text = ", ".join(f"{name} {nbytes / MIB:,.1f} MiB" for name, nbytes in parts)
    return sum(n for _, n in parts), text


class Planner:
    """The estimates of one planned run's step against ``budget`` bytes, each made once, and what
    every search starts from: the largest batch, the smaller patches the network takes.
    ``checkpoint_loss``: every candidate with the loss checkpointed too."""

    #: how many times a batch guess that does not fit is moved before the search walks from it
    GUESS_REFINEMENTS = 2

    def __init__(self, plan: PlannedRun, budget: int, checkpoint_loss: bool = False) -> None:
        self.plan = plan
        self.cfg = plan.run_config()
        self.loss = Candidate(checkpoint_loss=True) if checkpoint_loss else Candidate()
        self.checkpoint_loss = checkpoint_loss or bool(self.cfg.model.get("checkpoint_loss"))
        self.budget = budget
        self.max_batch_size = int(self.cfg.memory.max_batch_size)
        self.base_patch = [int(p) for p in self.cfg.data.patch_size]
        self.accumulate = LoopSettings.from_config(self.cfg.trainer).accumulate_grad_batches
        self._cache: dict[Candidate, MemoryEstimate] = {}
        self._smaller: list[list[int]] | None = None

    # -- estimates ------------------------------------------------------------------------
    def candidate(
        self,
        batch_size: int,
        patch_size: Sequence[int],
        checkpointing: Any,
        accumulate: int | None = None,
    ) -> Candidate:
        """``accumulate`` (default: as configured) micro-batches of ``batch_size`` a step."""
        return self.at(patch_size).changed(
            batch_size=batch_size,
            activation_checkpointing=checkpointing,
            accumulate_grad_batches=self.accumulate if accumulate is None else accumulate,
        )

    def estimate(
        self,
        batch_size: int,
        patch_size: Sequence[int],
        checkpointing: Any,
        accumulate: int | None = None,
    ) -> MemoryEstimate:
        """The estimate of :meth:`candidate`."""
        candidate = self.candidate(batch_size, patch_size, checkpointing, accumulate)
        if candidate not in self._cache:
            self._cache[candidate] = estimate_run(self.plan, candidate).step
        return self._cache[candidate]

    def flops_per_sample(self, batch_size: int, checkpointing: Any, accumulate: int) -> float:
        """FLOPs of one optimizer step at the configured patch, per sample of the step."""
        candidate = self.candidate(batch_size, self.base_patch, checkpointing, accumulate)
        return estimate_run(self.plan, candidate).flops_per_step / (batch_size * accumulate)

    def fitting(
        self,
        batch_size: int,
        patch: Sequence[int],
        checkpointing: Any,
        accumulate: int | None = None,
    ) -> MemoryEstimate | None:
        """:meth:`estimate` where it fits the budget, else ``None`` (what a search asks)."""
        est = self.estimate(batch_size, patch, checkpointing, accumulate)
        return est if est.fits(self.budget) else None

    def remember(self, est: MemoryEstimate) -> None:
        """Keep an estimate made elsewhere, so that it is not made again."""
        candidate = self.candidate(
            est.batch_size,
            est.patch_size,
            est.activation_checkpointing,
            est.accumulate_grad_batches,
        )
        self._cache[candidate] = est

    def estimates_made(self, base_patch: bool) -> list[MemoryEstimate]:
        """The estimates made so far at the configured patch (``base_patch``) or at others."""
        return [
            e for e in self._cache.values() if (list(e.patch_size) == self.base_patch) == base_patch
        ]

    # -- patches --------------------------------------------------------------------------
    def at(self, patch: Sequence[int]) -> Candidate:
        """The candidate at ``patch``, with the network's settings that follow it (its adapter's
        ``sized_for``, e.g. UNETR's ``img_size``)."""
        patch = [int(p) for p in patch]
        net = self.cfg.model.net
        sized = (
            adapter_for(str(net._target_)).sized_for(net, patch) if patch != self.base_patch else {}
        )
        return self.loss.changed(patch_size=patch, net_sizes=sized)

    def smaller_patches(self, divisor: Sequence[int]) -> list[list[int]]:
        """:func:`shrunk_patches` of the configured patch that the network takes (probed on
        meta tensors), each plane of its 90° turns (``data.augment.rotate90_planes``) square."""
        if self._smaller is None:
            net = self.cfg.model.net
            channels = int(self.cfg.get("in_channels", 1))
            if adapter_for(str(net._target_)).sized_for(net, self.base_patch):

                def takes(patch: Sequence[int]) -> bool:
                    sized = self.plan.run_config(self.at(patch)).model.net
                    return shape_taker(sized, channels)(patch)
            else:
                takes = shape_taker(net, channels)
            augment = self.cfg.data.get("augment") or {}
            turned = [[int(a) for a in plane] for plane in (augment.get("rotate90_planes") or [])]
            self._smaller = shrunk_patches(self.base_patch, divisor, takes, turned)
        return self._smaller

    # -- the batch search -----------------------------------------------------------------
    def largest_batch(self, checkpointing: Any) -> tuple[int, MemoryEstimate | None]:
        """Largest batch size at the configured patch (0 when none fits), its estimate."""

        def fits(n: int) -> MemoryEstimate | None:
            return self.fitting(n, self.base_patch, checkpointing)

        # memory grows with the batch from batch 2 on: on a CPU a float32 batch of one can take
        # more than two (torch's native convolution, a column buffer 27x its input: see
        # volseg.memory.estimate.workspace), so batch 1 not fitting does not rule out batch 2
        lo = 1
        if fits(1) is None:
            if self.max_batch_size < 2 or fits(2) is None:
                return 0, None
            lo = 2
        one = self.estimate(1, self.base_patch, checkpointing).process_total
        two = self.estimate(2, self.base_patch, checkpointing).process_total
        # memory grows about linearly with the batch: start where the line meets the budget. At
        # batches 1 and 2 the peak can be the optimizer's update, which does not grow with it, so
        # a guess that does not fit moves to where the line through batch 2 and it meets the budget
        guess = 1 + (self.budget - one) // max(two - one, 1)
        for _ in range(self.GUESS_REFINEMENTS):
            n = min(guess, self.max_batch_size)
            if n <= 2 or fits(n) is not None:
                break
            slope = (self.estimate(n, self.base_patch, checkpointing).process_total - two) / (n - 2)
            guess = min(n - 1, 2 + int((self.budget - two) // max(slope, 1.0)))
        return largest_fitting(fits, lo, self.max_batch_size, guess)


@dataclass
class _Choice:
    """What a search settled on: the checkpointing, batch and patch, and the estimates."""

    checkpointing: Any = None
    batch_size: int | None = None
    patch: list[int] | None = None
    estimate: MemoryEstimate | None = None
    next_estimate: MemoryEstimate | None = None
    largest: dict[str, int] = field(default_factory=dict)


def _search_batch(planner: Planner, options: Sequence[Any], batch: int) -> _Choice:
    """The first option whose largest batch reaches ``batch``, else the one with the largest."""
    found: dict[str, tuple[Any, int, MemoryEstimate | None]] = {}
    for option in options:
        found[written(option)] = (option, *planner.largest_batch(option))
        if found[written(option)][1] >= batch:
            break
    option, n, est = max(found.values(), key=lambda f: f[1])  # the first of the largest
    choice = _Choice(patch=planner.base_patch, largest={k: f[1] for k, f in found.items()})
    if n >= 1:
        choice.checkpointing, choice.batch_size, choice.estimate = option, n, est
        choice.next_estimate = planner.estimate(n + 1, choice.patch, option)
    return choice


def _search_smaller_patch(
    planner: Planner, options: Sequence[Any], batch: int, divisor: Sequence[int]
) -> _Choice:
    """The largest of :func:`shrunk_patches` that fits at ``batch`` with the most
    recomputation (the last option), then the least recomputation that fits at it."""
    candidates = planner.smaller_patches(divisor)
    if not candidates:
        return _Choice(patch=planner.base_patch)
    heaviest = options[-1]

    def at(n: int) -> list[int]:  # n = 1: the smallest candidate, len(candidates): the largest
        return candidates[len(candidates) - n]

    # activations grow with the voxels: start at the largest patch the line through the
    # configured patch's estimate says fits
    now = planner.estimate(batch, planner.base_patch, heaviest)
    fixed = now.params + now.grads + now.optimizer_state + now.cuda_context
    ratio = max(planner.budget - fixed, 0) / max(now.process_total - fixed, 1)
    voxels = math.prod(planner.base_patch) * ratio
    guess = sum(1 for c in candidates if math.prod(c) <= voxels)
    n, found = largest_fitting(
        lambda n: planner.fitting(batch, at(n), heaviest), 1, len(candidates), max(guess, 1)
    )
    if found is None:
        return _Choice(patch=planner.base_patch)
    choice = _Choice(heaviest, batch, at(n), found)
    for option in options[:-1]:  # less recomputation where it fits too
        est = planner.fitting(batch, choice.patch, option)
        if est is not None:
            choice.checkpointing, choice.estimate = option, est
            break
    larger = at(n + 1) if n < len(candidates) else planner.base_patch
    choice.next_estimate = planner.estimate(batch, larger, choice.checkpointing)
    return choice


def _micro_batching(
    planner: Planner, choice: _Choice, batch: int, configured: Any
) -> tuple[dict[str, Any] | None, float | None]:
    """For a configured ``batch`` that does not fit: the largest micro-batch that divides it and
    fits (``None``: not even 1), and ``choice``'s FLOPs per sample over the configured step's."""

    per_sample = planner.flops_per_sample
    reference = per_sample(batch, configured, planner.accumulate)
    flops = None
    if choice.estimate is not None:
        flops = per_sample(choice.batch_size, choice.checkpointing, planner.accumulate) / reference
    for b in sorted((d for d in range(1, batch) if batch % d == 0), reverse=True):
        accumulate = planner.accumulate * batch // b
        est = planner.fitting(b, planner.base_patch, configured, accumulate)
        if est is not None:
            micro = {
                "batch_size": b,
                "accumulate_grad_batches": accumulate,
                "candidate": Candidate(batch_size=b, accumulate_grad_batches=accumulate),
                "estimate": est.to_dict(),
                "total_within_budget": est.total_within(planner.budget),
                "flops_per_sample": per_sample(b, configured, accumulate) / reference,
            }
            return micro, flops
    return None, flops


def _least(estimates: Sequence[MemoryEstimate]) -> str:
    """The estimate that needs the fewest bytes, with its setting, as the refusal names it."""
    named = []
    for e in estimates:
        k = e.accumulate_grad_batches
        batch = f"{k} micro-batches of {e.batch_size}" if k > 1 else f"batch {e.batch_size}"
        shape = "x".join(map(str, e.patch_size))
        checkpointing = written(e.activation_checkpointing)
        text = f"at {batch} of {shape}, activation_checkpointing={checkpointing}"
        named.append((f"{e.process_total / MIB:,.1f} MiB {text}", e.process_total))
    return least(named)


def _fallback(
    planner: Planner, options: Sequence[Any], batch: int, steps: list[str]
) -> tuple[_Choice, str | None, bool]:
    """Loss checkpointing, then a smaller patch, each tried appended to ``steps``; the choice, the
    lever that found it and whether it checkpoints the loss."""
    settings = ", ".join(written(o) for o in options)
    steps.append(
        f"batch 1 to {planner.max_batch_size} and micro-batches with activation_checkpointing "
        f"{settings} ({_least(planner.estimates_made(base_patch=True))})"
    )
    patch_planner, extra = planner, False
    if not planner.checkpoint_loss:
        loss = Planner(planner.plan, planner.budget, checkpoint_loss=True)
        # searched only where one estimate shows it lowering the step (docs/memory.md)
        heaviest = options[-1]
        with_loss = loss.estimate(batch, loss.base_patch, heaviest)
        without = planner.estimate(batch, planner.base_patch, heaviest)
        if with_loss.process_total < without.process_total:
            choice = _search_batch(loss, options, batch)
            steps.append(
                "model.checkpoint_loss=true with the same "
                f"({_least(loss.estimates_made(base_patch=True))})"
            )
            if choice.estimate is not None:
                return choice, "loss checkpointing", True
            # shrink the patch with the loss checkpointed, where that lowered the step
            patch_planner, extra = loss, True
        else:
            steps.append(
                "model.checkpoint_loss=true, not searched: it does not lower the step "
                f"({_least([with_loss])}; {without.process_total / MIB:,.1f} MiB without it)"
            )
    divisor = patch_divisor(planner.cfg)
    choice = _search_smaller_patch(patch_planner, options, batch, divisor)
    smallest = planner.smaller_patches(divisor)
    lowest = "x".join(map(str, smallest[-1])) if smallest else "none smaller"
    steps.append(
        f"smaller patches at batch {batch} (one side a multiple of {list(divisor)} smaller at a "
        f"time, down to {lowest}) with activation_checkpointing={written(options[-1])}"
        f"{' and model.checkpoint_loss=true' if extra else ''} "
        f"({_least(patch_planner.estimates_made(base_patch=False))})"
    )
    if choice.estimate is not None:
        return choice, "a smaller patch", extra
    return choice, None, False


def fit_step(plan: PlannedRun, budget: int, as_configured: MemoryEstimate | None = None) -> StepFit:
    """What fits ``budget`` bytes of ``plan``'s run (``as_configured``: its own estimate, if
    made), by the training step's levers of docs/memory.md, with ``memory.checkpointing_options``
    (least recomputation first) and batches up to ``memory.max_batch_size``."""
    planner = Planner(plan, budget)
    cfg = planner.cfg
    if as_configured is not None:
        planner.remember(as_configured)
    configured = plain(cfg.model.activation_checkpointing)
    tried = checkpointing_choices(cfg, cfg.memory.checkpointing_options)
    options = [configured] + [o for o in tried if written(o) != written(configured)]
    batch = int(cfg.data.batch_size)
    now = planner.estimate(batch, planner.base_patch, configured)
    resident, parts = resident_bytes(now)
    if resident > budget:
        return StepFit(budget, False, tried=[parts], resident=resident)
    fit = StepFit(budget, now.fits(budget), resident=resident)
    loss = False
    choice = _search_batch(planner, options, batch)
    if not fit.fits_as_configured:
        fit.micro_batching, fit.flops_per_sample = _micro_batching(
            planner, choice, batch, configured
        )
    if choice.estimate is None and fit.micro_batching is None:
        choice, fit.fallback, loss = _fallback(planner, options, batch, fit.tried)
    log.info("Planner: %d estimates", len(planner._cache))
    fit.largest_batch_by_checkpointing = choice.largest
    est = choice.estimate
    if est is None:
        return fit
    fit.batch_size, fit.patch_size = choice.batch_size, choice.patch
    fit.activation_checkpointing = choice.checkpointing
    fit.estimate, fit.total_within_budget = est.to_dict(), est.total_within(budget)
    fit.next_step_estimate = choice.next_estimate.to_dict() if choice.next_estimate else None
    # what changes: the batch; the patch, with what the network's constructor takes of it
    # (UNETR's img_size), where a smaller one was the lever; checkpointing where it moved
    moved = written(choice.checkpointing) != written(configured)
    smaller = fit.fallback == "a smaller patch"
    fit.candidate = (planner.at(choice.patch) if smaller else Candidate()).changed(
        batch_size=choice.batch_size,
        activation_checkpointing=choice.checkpointing if moved else None,
        checkpoint_loss=True if loss else None,
    )
    return fit


@dataclass
class BatchSearch:
    """``data.batch_size=auto``'s answer: the largest batch that fits ``budget`` bytes (0: none),
    and a row (bytes) per batch the search estimated, ascending."""

    budget: int
    batch_size: int
    rows: list[dict[str, Any]]

    def row(self, batch: int) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["batch_size"] == batch), None)


def largest_batch(plan: PlannedRun, budget: int) -> BatchSearch:
    """The largest batch (``1 .. memory.max_batch_size``) of ``plan``'s training step whose
    estimate fits ``budget`` bytes; the batch after it is estimated too, to show where it stops
    fitting."""
    planner = Planner(plan, budget)
    checkpointing = plain(planner.cfg.model.activation_checkpointing)
    found, _ = planner.largest_batch(checkpointing)
    if found < planner.max_batch_size:
        planner.estimate(found + 1, planner.base_patch, checkpointing)
    rows = [
        {
            "batch_size": e.batch_size,
            "peak_allocated": e.peak_allocated,
            "process_total": e.process_total,
            # what the planner counts (CUDA within a budget: the allocator's replay decides)
            "with_margin": e.total_within(budget) or planned_total(e),
            "fits": e.fits(budget),
        }
        for e in sorted(planner.estimates_made(base_patch=True), key=lambda e: e.batch_size)
    ]
    return BatchSearch(budget=budget, batch_size=found, rows=rows)
