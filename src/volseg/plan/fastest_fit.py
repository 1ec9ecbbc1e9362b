"""The fastest run that fits ``memory.budget``: ``data.batch_size=auto`` and
``model.activation_checkpointing=auto`` resolved together, with no trial run.

Each candidate is a batch (``auto``: from 1 up to the largest that fits; a configured batch: the
micro-batches that keep it) at each checkpointing setting the network's adapter offers
(``auto``; a configured setting stays). Each is estimated once (one trace on fake tensors); the
ones that fit get their optimizer step's time predicted from the traced ops: replayed on this
machine's device (:mod:`volseg.speed.step_time`), or, for a GPU this machine lacks, by the
stated model of ``memory.gpu`` (:mod:`volseg.speed.gpu_model`). The fastest is the one with the
fewest predicted seconds per sample (a step's time over the samples it trains: batch x
micro-batches); a faster step of fewer samples does not win. docs/plan.md, "The fastest fit".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from volseg.memory import Candidate, RunEstimate, estimate_run, planned_total
from volseg.models.networks import adapter_for
from volseg.speed.gpu_model import gpu_model, modelled_seconds
from volseg.speed.step_time import StepWork, measure_speed
from volseg.utils.config import plain
from volseg.utils.cpu import cpu_model
from volseg.utils.units import MIB

AUTO = "auto"
#: batches always ranked where they fit (a CPU's batch of one runs other kernels than two)
FIRST_BATCHES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Ranked:
    """One candidate: its ``batch_size`` (a micro-batch's samples), ``accumulate_grad_batches``
    and ``activation_checkpointing``; ``peak`` (bytes, as the planner counts a budget: the margin
    included; ``None``: not estimated, ``why`` says); whether it ``fits``;
    ``seconds_per_step`` (an optimizer step, its micro-batches included) and
    ``seconds_per_sample`` (predicted; ``None`` where it does not fit)."""

    batch_size: int
    accumulate_grad_batches: int
    activation_checkpointing: Any
    peak: int | None
    fits: bool
    seconds_per_step: float | None = None
    why: str = ""

    @property
    def samples(self) -> int:
        """Samples an optimizer step trains (on each device)."""
        return self.batch_size * self.accumulate_grad_batches

    @property
    def seconds_per_sample(self) -> float | None:
        return None if self.seconds_per_step is None else self.seconds_per_step / self.samples

    @property
    def candidate(self) -> Candidate:
        return Candidate(
            batch_size=self.batch_size,
            accumulate_grad_batches=self.accumulate_grad_batches,
            activation_checkpointing=self.activation_checkpointing,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds_per_sample": self.seconds_per_sample}


@dataclass
class FastestFit:
    """The answer: every candidate estimated (``rows``), the fastest that fits (``pick``;
    ``None``: none fits), the ``budget`` (bytes) and how time was predicted (``time_model``)."""

    budget: int
    time_model: str
    rows: list[Ranked]
    modelled: bool = False
    pick: Ranked | None = field(init=False)

    def __post_init__(self) -> None:
        ranked = self.ranked()
        self.pick = ranked[0] if ranked else None

    def ranked(self) -> list[Ranked]:
        """The candidates that fit, fastest per sample first (ties: the larger batch)."""
        fitting = [r for r in self.rows if r.fits and r.seconds_per_sample is not None]
        return sorted(fitting, key=lambda r: (r.seconds_per_sample, -r.samples))

    def to_dict(self) -> dict[str, Any]:
        """What ``plan.yaml`` keeps: the pick, every row, the budget and the time model."""
        return {
            "budget": self.budget,
            "time_model": self.time_model,
            "modelled": self.modelled,
            "pick": None if self.pick is None else self.pick.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
        }


def step_timer(cfg: DictConfig, device: str) -> tuple[Callable[[StepWork], float], str, bool]:
    """How a candidate's step time is predicted on ``device``: its function of the traced work
    (seconds), what it is, and whether it is modelled (a GPU this machine lacks) or replayed."""
    if device == "cuda" and not torch.cuda.is_available():
        gpu, why = gpu_model(plain(cfg.memory.gpu))
        text = f"modelled for the {gpu.name} ({why}): not replayed, no GPU here"
        return (lambda work: modelled_seconds(work, gpu)), text, True
    speed = measure_speed(device)
    where = cpu_model() if device == "cpu" else torch.cuda.get_device_name()
    return (lambda work: work.seconds(speed)), f"ops replayed on this {device} ({where})", False


def checkpointing_settings(cfg: DictConfig) -> list[Any]:
    """``model.activation_checkpointing``: as configured, or for ``auto`` every setting the
    network's adapter offers, least recomputation first."""
    configured = plain(cfg.model.activation_checkpointing)
    if configured != AUTO:
        return [configured]
    return list(adapter_for(str(cfg.model.net._target_)).checkpointing_choices)


class _Search:
    """The estimates of one plan's candidates against ``budget`` bytes, each made once."""

    def __init__(self, plan: Any, budget: int, most: int) -> None:
        self.plan, self.budget, self.most = plan, budget, most
        self.runs: dict[Candidate, RunEstimate | str] = {}

    def run(self, batch: int, accumulate: int, checkpointing: Any) -> RunEstimate | str:
        """The candidate's estimate, or why the network cannot take it (one line)."""
        key = Candidate(
            batch_size=batch,
            accumulate_grad_batches=accumulate,
            activation_checkpointing=checkpointing,
        )
        if key not in self.runs:
            try:
                self.runs[key] = estimate_run(self.plan, key)
            except Exception as err:  # a setting this network refuses: its row says why
                self.runs[key] = f"not estimated: {type(err).__name__}: {err}".splitlines()[0]
        return self.runs[key]

    def fits(self, batch: int, accumulate: int, checkpointing: Any) -> bool:
        run = self.run(batch, accumulate, checkpointing)
        return not isinstance(run, str) and run.step.fits(self.budget)

    def largest(self, checkpointing: Any, accumulate: int) -> int:
        """The largest batch (up to ``most``) that fits at ``checkpointing`` (0: none): bytes
        grow about linearly with the batch from 2 on, so the line through batches 1 and 2 guesses
        it, and a bisection settles it. A CPU's batch of one can need more than two (its native
        convolution's column buffer), so 1 not fitting does not rule out 2."""

        def fits(n: int) -> bool:
            return self.fits(n, accumulate, checkpointing)

        lo = 1 if fits(1) else 2 if self.most >= 2 and fits(2) else 0
        if lo == 0 or self.most == lo:
            return lo
        one, two = (self.run(n, accumulate, checkpointing) for n in (1, 2))
        if isinstance(one, str) or isinstance(two, str):
            return lo
        slope = max(planned_total(two.step) - planned_total(one.step), 1)
        guess = min(max(2, 2 + (self.budget - planned_total(two.step)) // slope), self.most)
        hi = None  # the least batch known not to fit
        if fits(guess):
            lo, step = guess, 1
            while hi is None and lo < self.most:
                n = min(lo + step, self.most)
                lo, hi = (n, None) if fits(n) else (lo, n)
                step *= 2
        else:
            hi = guess
        while hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo


def _ranked_batches(largest: int) -> list[int]:
    """The batches ranked at one setting whose largest fitting batch is ``largest``: the first
    few, each power of two and the largest (per-sample time flattens as a batch grows)."""
    powers = (2**k for k in range(2, max(largest, 1).bit_length()))
    return sorted({*(b for b in FIRST_BATCHES if b <= largest), *powers, largest} - {0})


def _micro_batches(batch: int) -> list[int]:
    """The micro-batches that keep a configured ``batch``: its divisors, largest first."""
    return [d for d in range(batch, 0, -1) if batch % d == 0]


def fastest_fit(plan: Any, budget: int) -> FastestFit:
    """The candidates of ``plan``'s run (a :class:`volseg.plan.RunPlan` whose config may say
    ``auto`` for the batch and checkpointing) against ``budget`` bytes, ranked
    (:class:`FastestFit`). A configured batch keeps its samples a step: micro-batches of it."""
    cfg = plan.config
    device = str(cfg.memory.plan_device)
    timer, time_model, modelled = step_timer(cfg, device)
    accumulate = int(cfg.trainer.accumulate_grad_batches)
    search = _Search(plan, budget, int(cfg.memory.max_batch_size))
    batch_auto = str(cfg.data.batch_size) == AUTO
    rows: list[Ranked] = []
    for setting in checkpointing_settings(cfg):
        if batch_auto:
            largest = search.largest(setting, accumulate)
            shapes = [(b, accumulate) for b in _ranked_batches(largest)]
            shapes.append((largest + 1, accumulate))  # the first over the budget, by how much
        else:
            batch = int(cfg.data.batch_size)
            shapes = []
            for micro in _micro_batches(batch):
                shapes.append((micro, accumulate * batch // micro))
                if search.fits(*shapes[-1], setting):
                    break  # smaller micro-batches fit too, and run slower per sample
        rows += [_row(search, timer, b, k, setting) for b, k in shapes if b <= search.most]
    return FastestFit(budget, time_model, rows, modelled)


def _row(
    search: _Search, timer: Callable[[StepWork], float], batch: int, accumulate: int, setting: Any
) -> Ranked:
    run = search.run(batch, accumulate, setting)
    if isinstance(run, str):
        return Ranked(batch, accumulate, setting, None, False, why=run)
    fits = run.step.fits(search.budget)
    peak = run.step.total_within(search.budget) if fits else planned_total(run.step)
    seconds = timer(run.work) if fits else None
    return Ranked(batch, accumulate, setting, peak, fits, seconds)


def written_levers(row: Ranked | dict[str, Any]) -> str:
    """A row's levers as a user writes them: ``checkpointing selective, 2 micro-batches``."""
    get = row.get if isinstance(row, dict) else lambda key: getattr(row, key)
    checkpointing = plain(get("activation_checkpointing"))
    text = "no checkpointing" if checkpointing == "none" else f"checkpointing {checkpointing}"
    accumulate = int(get("accumulate_grad_batches"))
    return text + (f", {accumulate} micro-batches" if accumulate > 1 else "")


def pick_reason(fit: FastestFit) -> str:
    """Why the pick: its predicted time per sample, and the runner-up's."""
    pick = fit.pick
    if pick is None:
        return ""
    ranked = fit.ranked()
    text = (
        f"the fastest that fits memory.budget ({fit.budget / MIB:,.0f} MiB): "
        f"{pick.seconds_per_sample * 1e3:,.1f} ms a sample predicted, {pick.peak / MIB:,.0f} MiB "
        f"with the margin"
    )
    if len(ranked) > 1:
        second = ranked[1]
        ratio = second.seconds_per_sample / pick.seconds_per_sample
        text += (
            f"; next: batch {second.batch_size}, {written_levers(second)} "
            f"({ratio:.2f}x the time a sample)"
        )
    return text + f" of {len(ranked)} that fit, {len(fit.rows) - len(ranked)} that do not"


def seconds_text(seconds: float | None) -> str:
    """``0.84 s``, ``12 ms``: a predicted time as the table prints it."""
    if seconds is None or math.isnan(seconds):
        return "—"
    return f"{seconds:,.2f} s" if seconds >= 1 else f"{seconds * 1e3:,.0f} ms"
