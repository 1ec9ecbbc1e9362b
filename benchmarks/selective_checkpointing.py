"""Selective activation checkpointing beside none and all: step growth and step time on the CPU.

For unet_small and unet_large (each at a CPU-sized patch) and nnU-Net's PlainConvUNet, each
``model.activation_checkpointing`` setting of :data:`SETTINGS` runs as ``python train.py`` for
3 optimizer steps in a fresh process, back to back, float32. Read from each run: its steady
step's growth (the memory monitor's CSV, resident memory with ``MALLOC_MMAP_THRESHOLD_=65536``,
read as ``estimator_accuracy`` reads it) and its step time (the median of ``time/step_s`` of
steps 2.., from :class:`volseg.callbacks.step_timer.StepTimer`). Beside them, the estimator's
growth for the same config, and each setting's best step time in one process where the
settings take turns (:func:`alternating_seconds`: a shared machine's busy stretches fall on
every setting alike), each also as a ratio to ``none``.

    python -m benchmarks selective_checkpointing   # results/cpu/<date>_selective_checkpointing.json
    python -m benchmarks selective_checkpointing --networks unet_small --settings none,selective

On a GPU (``benchmarks/gpu_checks.sh``) the same rows run at unet_large's reference input with
``--device cuda``: peak allocated instead of resident memory, 16-mixed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import grid, harness, results_io

#: rounds of the in-process timing in which the settings take turns (after a warm-up round)
ROUNDS = 2
#: the settings compared, least recomputation first
SETTINGS = ("none", "selective", "all")
#: network name -> overrides, float32 on the CPU; patches within the embedded dataset's volumes
NETWORKS: dict[str, list[str]] = {
    "unet_small b2 16x48x48": [
        "model=unet_small",
        "data.batch_size=2",
        "data.patch_size=[16,48,48]",
        "trainer.precision=32",
    ],
    "unet_large b1 16x48x48": [
        "model=unet_large",
        "data.batch_size=1",
        "data.patch_size=[16,48,48]",
        "trainer.precision=32",
    ],
    "nnU-Net PlainConvUNet b2 32x64x64": [
        "model/net=plain_conv_unet",
        "data.batch_size=2",
        "data.patch_size=[32,64,64]",
        "trainer.precision=32",
    ],
}
#: on a GPU: unet_large at the reference input (batch 2 of 1x26x150x320), 16-mixed
NETWORKS_CUDA: dict[str, list[str]] = {
    "unet_large b2 26x150x320 16-mixed": [
        "model=unet_large",
        "data.batch_size=2",
        "data.patch_size=[26,150,320]",
        "trainer.precision=16-mixed",
    ],
}
#: the step timer's callback, as a user adds it
STEP_TIMER = "+callbacks.step_timer._target_=volseg.callbacks.step_timer.StepTimer"


def run(overrides: list[str], device: str, work_dir: Path, name: str) -> dict[str, float]:
    """One ``train.py`` run of ``overrides``: its steady step's growth (bytes) and its median
    step time (seconds, steps 2..)."""
    run_dir = work_dir / "runs" / name
    arguments = grid.run_overrides(overrides, device, grid.prepare_data(overrides, work_dir))
    env = grid.child_env(device, work_dir)
    arguments += [STEP_TIMER, "trainer.log_every_n_steps=1"]
    done = harness.train(arguments, run_dir, work_dir, env, grid.RUN_TIMEOUT_S)
    steady = harness.steady_step(done, 1, grid.STEPS)
    seconds = harness.column(done.rows, "time/step_s")[1:]
    return {
        "growth": steady["growth"],
        "peak_allocated": steady["peak_allocated"],
        "step_seconds": statistics.median(seconds),
    }


def alternating_seconds(
    base: list[str], settings: list[str], device: str, work_dir: Path, rounds: int
) -> dict[str, float]:
    """Each setting's best training step (seconds: forward, loss, backward, update) in this
    process, the settings taking turns for ``rounds`` rounds after one warm-up step each, so
    that a slower or busier stretch of the machine falls on every setting alike."""
    import torch

    from volseg.memory import Candidate
    from volseg.memory.estimate.training_step import build_training_step
    from volseg.plan import RunPlan, planned_config

    plan = RunPlan(planned_config(grid.compose(base, device, grid.data_dir(base, work_dir))), {})
    cfg = plan.config
    steps = {
        s: build_training_step(plan.run_config(Candidate(activation_checkpointing=s)), device)
        for s in settings
    }
    for step in steps.values():
        step.module.to(device)
    classes = int(cfg.num_classes)

    def new_batch(image_shape, label_shape, dtype):  # noqa: ANN001, ANN202
        label = torch.randint(0, classes, label_shape, device=device).to(dtype)
        return torch.randn(image_shape, dtype=dtype, device=device), label

    best = dict.fromkeys(settings, float("inf"))
    for n in range(rounds + 1):
        for setting, step in steps.items():
            began = time.perf_counter()
            step.run(1, new_batch)
            if device == "cuda":
                torch.cuda.synchronize()
            if n:  # the first round warms up (oneDNN's primitives, the optimizer state)
                best[setting] = min(best[setting], time.perf_counter() - began)
    return best


def network_rows(
    name: str, base: list[str], settings: list[str], device: str, work_dir: Path
) -> list[dict]:
    """One network's rows, one per setting, each with its ratios to the first setting's."""
    rows = []
    best = alternating_seconds(base, settings, device, work_dir, ROUNDS)
    for setting in settings:
        overrides = [*base, f"model.activation_checkpointing={setting}"]
        predicted = grid.predict(overrides, device, work_dir)
        measured = run(overrides, device, work_dir, f"{name.split()[0]}_{setting}")
        row = {
            "network": name,
            "setting": setting,
            "overrides": overrides,
            "estimated_growth": int(predicted["growth"]),
            "measured_growth": int(measured["growth"]),
            "measured_peak_allocated": int(measured["peak_allocated"]),
            "step_seconds": measured["step_seconds"],
            "alternating_step_seconds": best[setting],
        }
        row["estimate_error"] = row["estimated_growth"] / row["measured_growth"] - 1
        first = rows[0] if rows else row
        row["growth_ratio"] = row["measured_growth"] / first["measured_growth"]
        row["time_ratio"] = row["step_seconds"] / first["step_seconds"]
        row["alternating_time_ratio"] = best[setting] / best[settings[0]]
        rows.append(row)
        print(
            f"| {name} | {setting} | {row['measured_growth'] / 2**20:,.1f} "
            f"| {row['estimated_growth'] / 2**20:,.1f} ({row['estimate_error']:+.1%}) "
            f"| {row['growth_ratio']:.2f}x | {row['step_seconds']:.2f} "
            f"| {row['time_ratio']:.2f}x | {best[setting]:.2f} "
            f"| {row['alternating_time_ratio']:.2f}x |",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--networks", default=None, help="comma-separated name prefixes")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--work-dir", type=Path, default=None)
    args, _ = parser.parse_known_args(argv)
    results_io.add_json_out(parser, "selective_checkpointing", args.device)
    args = parser.parse_args(argv)
    networks = NETWORKS_CUDA if args.device == "cuda" else NETWORKS
    if args.networks:
        wanted = args.networks.split(",")
        networks = {n: o for n, o in networks.items() if any(n.startswith(w) for w in wanted)}
    settings = args.settings.split(",")
    print(
        "| network | setting | growth measured (MiB) | estimated | vs first "
        "| s/step | vs first | best s/step, taking turns | vs first |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    with tempfile.TemporaryDirectory(prefix="volseg-selective-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        rows = [
            row
            for name, base in networks.items()
            for row in network_rows(name, base, settings, args.device, work_dir)
        ]
    doc = results_io.result(
        "selective_checkpointing",
        rows,
        script=__file__,
        argv=argv,
        device=args.device,
        steps=grid.STEPS,
        malloc="MALLOC_MMAP_THRESHOLD_=65536" if args.device == "cpu" else None,
    )
    print(f"Wrote {results_io.write(doc, args.json_out, args.device)}")


if __name__ == "__main__":
    main()
