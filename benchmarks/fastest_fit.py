"""The fastest run that fits (``data.batch_size=auto model.activation_checkpointing=auto
memory.budget=...``) against every candidate trained, on this CPU.

For unet_small, MONAI's BasicUNet and nnU-Net's PlainConvUNet (float32, 16x32x32 patches, the
embedded dataset, ``memory.max_batch_size=4``), every candidate of the grid is trained once as
``python train.py`` for ``--steps`` optimizer steps: batch 1-4 at each checkpointing setting the
network's adapter offers, and micro-batches without checkpointing (1x2, 1x4, 2x2: effective
batch 2 and 4). Read from each run as ``estimator_accuracy`` and ``selective_checkpointing``
read theirs: the step time (the fastest ``time/step_s`` of steps 2.., the median beside it; per
sample: over batch x micro-batches) and the peak, counted as the planner counts a CPU budget:
what the step holds at its start (the estimate of the candidate: parameters, gradients,
optimizer state) plus the steady step's measured rise of resident memory (the memory monitor,
``MALLOC_MMAP_THRESHOLD_=65536``). A candidate fits a budget where its measured peak is at most
the budget; the best is the fitting candidate with the fewest measured seconds per sample.

Two budgets per network, from the estimates (``planned_total``: the margin included), each in
whole MiB; the grid serves both (the budget only decides what fits and what each planner picks):

- tight: halfway between the least planned total at batch >= 2 with checkpointing and that of
  batch 2 without (batch 2 without checkpointing does not fit; batch 2 with some does);
- loose: 5% above batch 4 without checkpointing (it fits).

Per case (network x budget): the planner's pick (``volseg.plan.fastest_fit.fastest_fit`` of the
planned config with both levers ``auto``), its measured seconds per sample over the best's, its
measured peak against the budget, the Spearman correlation of predicted and measured step time
over the fitting candidates, and the same for two baselines: ``largest_batch`` (what
``data.batch_size=auto`` did before: the largest batch at checkpointing ``none``) and
``fixed_order`` (``fit_step`` for a configured batch 2 at ``none``, as ``plan.py`` applies it:
as configured where it fits, else its micro-batches, else its batch and checkpointing). The
planner's seconds: one ``fastest_fit`` call, every estimate and kernel timing of the process
forgotten first (imports and the device's probe warmed before). The picks and the best
candidates are trained a second time: the run-to-run spread (the largest relative change in
seconds per sample) says which ratios are noise.

    python -m benchmarks fastest_fit                 # results/cpu/<date>_fastest_fit.json
    python -m benchmarks fastest_fit --networks unet_small --steps 4 --json-out /tmp/ff.json
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import grid, harness, results_io
from volseg.utils.units import MIB

#: network -> its overrides; every run adds :data:`COMMON`
NETWORKS: dict[str, list[str]] = {
    "unet_small": ["model=unet_small"],
    "monai BasicUNet": ["model/net=basic_unet"],
    "nnU-Net PlainConvUNet": ["model/net=plain_conv_unet"],
}
COMMON = [
    "data.patch_size=[16,32,32]",
    "trainer.precision=32",
    "memory.max_batch_size=4",
    "data.batch_size=2",
    "model.activation_checkpointing=none",
]
BATCHES = (1, 2, 3, 4)
#: (batch, micro-batches) without checkpointing: effective batch 2 and 4
MICRO = ((1, 2), (1, 4), (2, 2))
#: the planners compared: the fastest fit, then the two baselines
PLANNERS = ("fastest_fit", "largest_batch", "fixed_order")
STEP_TIMER = "+callbacks.step_timer._target_=volseg.callbacks.step_timer.StepTimer"
#: loose budget: this much above batch 4 without checkpointing
LOOSE = 1.05

#: a candidate: (batch, micro-batches, checkpointing)
Shape = tuple[int, int, str]


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties: their mean rank); ``None`` for fewer than two pairs or
    a constant side."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for m in range(i, j + 1):
                out[order[m]] = (i + j) / 2 + 1
            i = j + 1
        return out

    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else None


def budgets(planned: dict[Shape, int]) -> dict[str, int | None]:
    """The tight and loose budgets (bytes, whole MiB) from the planned totals of the grid
    (``None``: the rule has none, checkpointing lowering no batch >= 2 below batch 2 without)."""
    without = planned[(2, 1, "none")]
    least = min(
        (p for (b, k, c), p in planned.items() if b >= 2 and k == 1 and c != "none"), default=None
    )
    tight = None if least is None or least >= without else (least + without) // 2 // MIB * MIB
    return {"tight": tight, "loose": math.ceil(LOOSE * planned[(4, 1, "none")] / MIB) * MIB}


def fitting(rows: dict[Shape, dict], budget: int) -> dict[Shape, dict]:
    """The measured rows whose measured peak is at most ``budget``."""
    return {s: r for s, r in rows.items() if r["measured_peak"] <= budget}


def versus(shape: Shape | None, rows: dict[Shape, dict], budget: int, best: dict | None) -> dict:
    """A planner's answer as measured: seconds per sample, over the best's, over budget."""
    if shape is None:  # nothing fits, or a lever off the grid (fit_step's smaller patch)
        return {"shape": None}
    row = rows[shape]
    ratio = best and row["seconds_per_sample"] / best["seconds_per_sample"]
    return {
        "shape": list(shape),
        "seconds_per_sample": row["seconds_per_sample"],
        "measured_peak": row["measured_peak"],
        "over_budget": row["measured_peak"] > budget,
        "vs_best": ratio,
    }


def case(
    network: str, name: str, budget: int, rows: dict[Shape, dict], answers: dict[str, Any]
) -> dict:
    """One network x budget: the best fitting candidate, each planner's answer against it, the
    rank correlation of predicted and measured step time (and per sample) over the fitting ones,
    and the candidates whose planned total and measured peak disagree on fitting."""
    fit = fitting(rows, budget)
    best_shape = min(fit, key=lambda s: fit[s]["seconds_per_sample"], default=None)
    best = fit.get(best_shape)
    timed = [(s, r) for s, r in fit.items() if r.get("predicted_seconds") is not None]
    predicted = [r["predicted_seconds"] for _, r in timed]
    out = {
        "network": network,
        "budget": name,
        "budget_bytes": budget,
        "fitting": len(fit),
        "best": list(best_shape) if best_shape else None,
        "best_seconds_per_sample": best and best["seconds_per_sample"],
        "spearman": spearman(predicted, [r["seconds"] for _, r in timed]),
        "spearman_per_sample": spearman(
            [p / (s[0] * s[1]) for p, (s, _) in zip(predicted, timed, strict=True)],
            [r["seconds_per_sample"] for _, r in timed],
        ),
        "spearman_n": len(timed),
        "planned_fits_measured_over": [
            list(s) for s, r in rows.items() if r["planned_total"] <= budget < r["measured_peak"]
        ],
        "measured_fits_planned_over": [
            list(s) for s, r in rows.items() if r["measured_peak"] <= budget < r["planned_total"]
        ],
        **{k: answers.get(k) for k in ("planner_seconds", "time_model", "fastest_fit_rows")},
    }
    for planner in PLANNERS:
        out[planner] = versus(answers[planner], rows, budget, best)
    pick, fixed = out["fastest_fit"], out["fixed_order"]
    out["pick_vs_fixed_order"] = (
        pick["seconds_per_sample"] / fixed["seconds_per_sample"]
        if pick.get("seconds_per_sample") and fixed.get("seconds_per_sample")
        else None
    )
    return out


def summary(cases: list[dict], spread: float | None) -> dict:
    """Per planner over the cases: median and worst seconds per sample over the best's, how
    many it answered and how many went over budget; the worst Spearman; the pick over the
    fixed-order baseline's answer, and those beyond the run-to-run ``spread``."""
    out: dict[str, Any] = {"cases": len(cases), "spread": spread}
    for planner in PLANNERS:
        ratios = [c[planner]["vs_best"] for c in cases if c[planner].get("vs_best")]
        out[planner] = {
            "median_vs_best": statistics.median(ratios) if ratios else None,
            "worst_vs_best": max(ratios, default=None),
            "answered": sum(bool(c[planner].get("shape")) for c in cases),
            "over_budget": sum(bool(c[planner].get("over_budget")) for c in cases),
        }
    out["worst_spearman"] = min((c["spearman"] for c in cases if c["spearman"] is not None),
                                default=None)  # fmt: skip
    fixed = [c["pick_vs_fixed_order"] for c in cases if c["pick_vs_fixed_order"]]
    out["pick_vs_fixed_order"] = fixed
    out["pick_vs_fixed_order_beyond_spread"] = [
        r for r in fixed if spread is not None and abs(r - 1) > spread
    ]
    return out


# -- measuring ---------------------------------------------------------------------------------


def overrides(base: list[str], shape: Shape) -> list[str]:
    batch, micro, checkpointing = shape
    return grid.merge(
        [*base, *COMMON],
        [
            f"data.batch_size={batch}",
            f"trainer.accumulate_grad_batches={micro}",
            f"model.activation_checkpointing={checkpointing}",
        ],
    )


def train(base: list[str], shape: Shape, work_dir: Path, steps: int, name: str) -> dict:
    """One ``train.py`` run of a candidate: its steady step's rise (bytes), its fastest and
    median step time of steps 2.. (seconds), the whole run's wall seconds (0: a finished run of
    the same name kept in ``--work-dir``, from a benchmark cut short and started again)."""
    config = overrides(base, shape)
    arguments = grid.merge(
        grid.run_overrides(config, "cpu", grid.prepare_data(config, work_dir)),
        [f"trainer.max_steps={steps}", STEP_TIMER, "trainer.log_every_n_steps=1"],
    )
    run_dir = work_dir / "runs" / name
    try:
        done = harness.read(run_dir, 0.0)
        steady = harness.steady_step(done, shape[1], steps)
    except (harness.RunFailed, ValueError):  # none, or cut short: trained (again)
        shutil.rmtree(run_dir, ignore_errors=True)
        env = grid.child_env("cpu", work_dir)
        done = harness.train(arguments, run_dir, work_dir, env, grid.RUN_TIMEOUT_S)
        steady = harness.steady_step(done, shape[1], steps)
    times = harness.column(done.rows, "time/step_s")[1:]
    return {
        "growth": steady["growth"],
        "seconds": min(times),
        "median_seconds": statistics.median(times),
        "run_seconds": done.seconds,
    }


def planned(base: list[str], work_dir: Path) -> Any:
    """The planned config of a network with both levers ``auto``, as a ``RunPlan``."""
    from volseg.plan import RunPlan, applied, planned_config

    config = [*base, *COMMON]
    cfg = planned_config(grid.compose(config, "cpu", grid.prepare_data(config, work_dir)))
    auto = {"data.batch_size": "auto", "model.activation_checkpointing": "auto"}
    return RunPlan(applied(cfg, auto), {}), RunPlan(cfg, {})


def estimate(plan: Any, shape: Shape) -> Any:
    """The ``RunEstimate`` of one candidate of ``plan``."""
    from volseg.memory import Candidate, estimate_run

    b, k, c = shape
    return estimate_run(
        plan, Candidate(batch_size=b, accumulate_grad_batches=k, activation_checkpointing=c)
    )


def answers(auto_plan: Any, fixed_plan: Any, budget: int) -> dict[str, Any]:
    """Each planner's candidate for ``budget`` (None: nothing fits, or a lever off the grid),
    the seconds ``fastest_fit`` took with no estimate or kernel timing remembered, its rows."""
    from volseg.memory import estimate_run, fit_step, largest_batch
    from volseg.memory.estimate import engine
    from volseg.plan.fastest_fit import fastest_fit
    from volseg.speed.step_time import replay_seconds

    engine._runs.clear()
    replay_seconds.cache_clear()
    began = time.perf_counter()
    fit = fastest_fit(auto_plan, budget)
    took = time.perf_counter() - began
    pick = fit.pick
    largest = largest_batch(fixed_plan, budget).batch_size
    configured = estimate_run(fixed_plan).step
    fixed = (2, 1, "none") if configured.fits(budget) else None
    if fixed is None:  # as plan.py applies fit_step: micro-batches first, else its candidate
        step = fit_step(fixed_plan, budget, as_configured=configured)
        found = step.micro_batching["candidate"] if step.micro_batching else step.candidate
        if found is not None and found.patch_size is None and not found.checkpoint_loss:
            fixed = (found.batch_size or 2, found.accumulate_grad_batches or 1,
                     str(found.activation_checkpointing or "none"))  # fmt: skip
    return {
        "fastest_fit": pick
        and (
            pick.batch_size,
            pick.accumulate_grad_batches,
            str(pick.activation_checkpointing),
        ),  # fmt: skip
        "largest_batch": (largest, 1, "none") if largest else None,
        "fixed_order": fixed,
        "planner_seconds": took,
        "time_model": fit.time_model,
        "fastest_fit_rows": [r.to_dict() for r in fit.rows],
    }


def network(name: str, base: list[str], work_dir: Path, steps: int) -> tuple[list, list, list]:
    """One network: its measured grid (rows), its cases, its repeated runs."""
    from volseg.memory import planned_total
    from volseg.memory.estimate.events import held_at_last_mark
    from volseg.models.networks import adapter_for
    from volseg.plan.fastest_fit import step_timer

    auto_plan, fixed_plan = planned(base, work_dir)
    choices = adapter_for(str(auto_plan.config.model.net._target_)).checkpointing_choices
    shapes = [(b, 1, str(c)) for c in choices for b in BATCHES] + [(*m, "none") for m in MICRO]
    made = {shape: estimate(auto_plan, shape) for shape in shapes}
    limits = budgets({s: planned_total(made[s].step) for s in shapes})
    timer = step_timer(auto_plan.config, "cpu")[0]  # the device's probe, once a process
    found = {n: answers(auto_plan, fixed_plan, b) for n, b in limits.items() if b is not None}
    for n, answer in found.items():  # a planner's answer off the grid is trained too
        shapes += [answer[p] for p in PLANNERS if answer[p] and answer[p] not in shapes]
        picks = ", ".join(f"{p} {answer[p]}" for p in PLANNERS)
        print(f"{name} {n} {limits[n] / MIB:,.0f} MiB: {picks} "
              f"(fastest_fit: {answer['planner_seconds']:.1f} s)", flush=True)  # fmt: skip
    rows: dict[Shape, dict] = {}
    for shape in shapes:
        b, k, c = shape
        run = made.get(shape) or estimate(auto_plan, shape)
        measured = train(base, shape, work_dir, steps, f"{name.split()[-1]}_b{b}_k{k}_{c}")
        rows[shape] = row = {
            "network": name,
            "batch_size": b,
            "accumulate_grad_batches": k,
            "activation_checkpointing": c,
            "planned_total": planned_total(run.step),
            "held_at_start": held_at_last_mark(run.step.events),
            "estimated_growth": run.step.step_peak_growth,
            "predicted_seconds": timer(run.work),
            **measured,
            "seconds_per_sample": measured["seconds"] / (b * k),
        }
        row["measured_peak"] = row["held_at_start"] + row["growth"]
        print(
            f"{name:<22} b{b}x{k} {c:<10} {row['seconds']:7.3f} s/step (predicted "
            f"{row['predicted_seconds']:.3f}), peak {row['measured_peak'] / MIB:7,.1f} MiB "
            f"(planned {row['planned_total'] / MIB:,.1f})",
            flush=True,
        )
    cases = [case(name, n, limits[n], rows, a) for n, a in found.items()]
    again = {tuple(c["fastest_fit"]["shape"]) for c in cases if c["fastest_fit"].get("shape")}
    again |= {tuple(c["best"]) for c in cases if c["best"]}
    repeats = []
    for shape in sorted(again):
        label = f"{name.split()[-1]}_again_b{shape[0]}_k{shape[1]}_{shape[2]}"
        second, first = (
            train(base, shape, work_dir, steps, label)["seconds"],
            rows[shape]["seconds"],
        )
        repeats.append({"network": name, "shape": list(shape), "first": first, "second": second,
                        "change": second / first - 1})  # fmt: skip
    return list(rows.values()), cases, repeats


def table(cases: list[dict], total: dict) -> str:
    """The cases as a compact table (each answer's seconds per sample over the best's; OVER:
    its measured peak over the budget), the summary under it."""

    def answer(found: dict) -> str:
        if not found.get("shape"):
            return "- | -"
        b, k, c = found["shape"]
        over = " OVER" if found["over_budget"] else ""
        return f"b{b}x{k} {c} | {found['vs_best']:.2f}{over}"

    lines = [
        "| case | budget MiB | best | fastest_fit | /best | largest_batch | /best "
        "| fixed_order | /best | Spearman | planner s |",
        "|---|---:|---|---|---:|---|---:|---|---:|---:|---:|",
    ]
    for c in cases:
        rho = "-" if c["spearman"] is None else f"{c['spearman']:.2f}"
        best = "-" if not c["best"] else "b{}x{} {}".format(*c["best"])
        lines.append(
            f"| {c['network']} {c['budget']} | {c['budget_bytes'] / MIB:,.0f} | {best} | "
            + " | ".join(answer(c[p]) for p in PLANNERS)
            + f" | {rho} | {c['planner_seconds']:.1f} |"
        )

    def figure(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines.append("")
    for planner in PLANNERS:
        t = total[planner]
        lines.append(
            f"{planner}: median {figure(t['median_vs_best'])}x the best, worst "
            f"{figure(t['worst_vs_best'])}x; answered {t['answered']} of {total['cases']}, "
            f"{t['over_budget']} over budget"
        )
    fixed = ", ".join(f"{r:.2f}" for r in total["pick_vs_fixed_order"])
    lines.append(
        f"worst Spearman {figure(total['worst_spearman'])}; pick / fixed_order: {fixed} "
        f"(run-to-run spread {figure(total['spread'])})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks fastest_fit")
    parser.add_argument("--networks", default=None, help="comma-separated name prefixes")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps a run (2.. timed)")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="runs kept here (a finished run is reused)"
    )
    results_io.add_json_out(parser, "fastest_fit")
    args = parser.parse_args(argv)
    wanted = args.networks.split(",") if args.networks else list(NETWORKS)
    networks = {n: o for n, o in NETWORKS.items() if any(n.startswith(w) for w in wanted)}
    began = time.perf_counter()
    candidates, cases, repeats = [], [], []
    with tempfile.TemporaryDirectory(prefix="volseg-fastest-fit-") as tmp:
        for name, base in networks.items():
            rows, found, again = network(name, base, args.work_dir or Path(tmp), args.steps)
            candidates += rows
            cases += found
            repeats += again
    spread = max((abs(r["change"]) for r in repeats), default=None)
    total = summary(cases, spread)
    print(table(cases, total))
    doc = results_io.result(
        "fastest_fit",
        cases,
        script=__file__,
        argv=argv,
        steps=args.steps,
        common=COMMON,
        summary=total,
        candidates=candidates,
        repeats=repeats,
        wall_seconds=time.perf_counter() - began,
        malloc="MALLOC_MMAP_THRESHOLD_=65536",
    )
    results_io.write(doc, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
