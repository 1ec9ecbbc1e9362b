"""The memory levers on the reference config, estimated for a GPU beside what a GPU measured.

unet_large (40.2M parameters, NCDHW as ``benchmarks/levers.py --device cuda`` builds it), batch 2
of 1x26x150x320, 5 classes, AdamW, float16 autocast as the baseline; each lever and combination
is estimated by ``volseg.memory.estimate`` for CUDA (CUDA's autocast rules, cuDNN's workspaces,
caching-allocator model). Beside each estimate: the measured run with the same overrides in
``benchmarks/results/cuda/*.json`` (peak allocated and reserved, the cut of the measured peak
allocated, step time against the measured baseline's), or "not yet measured". No cut is given
for a row without a measurement.

    python -m benchmarks levers_estimated [--json-out PATH|none]

The estimates (bytes) go to ``benchmarks/results/cpu/<date>_levers_estimated.json``; ``python
benchmarks/tables.py`` builds docs/benchmarks.md's table from it and the recorded GPU runs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from hydra import compose, initialize_config_dir

from benchmarks import results_io
from volseg.memory.estimate.engine import estimate
from volseg.plan import planned_config
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

SEED = [
    "model=unet_large",
    "data.batch_size=2",
    "data.patch_size=[26,150,320]",
    "model.channels_last=false",
    "trainer.precision=16-mixed",
]
CKPT = ["model.activation_checkpointing=all", "model.checkpoint_loss=true"]
# two micro-batches of 1 make the same effective batch: the second runs with the first's gradients
MICRO = ["data.batch_size=1", "trainer.accumulate_grad_batches=2"]
LEVERS: dict[str, list[str]] = {
    "none (16-mixed)": [],
    "checkpointing: decoder": ["model.activation_checkpointing=decoder"],
    "checkpointing: all + loss": CKPT,
    "activation offload": ["model.offload_activations=true"],
    "micro-batch 1 (x2 accumulation)": MICRO,
    "16-true (float16 weights)": ["trainer.precision=16-true"],
    "micro-batch 1 + checkpointing: all + loss": [*MICRO, *CKPT],
    "micro-batch 1 + offload": [*MICRO, "model.offload_activations=true"],
    "activation offload: full resolution only": ["model.offload_activations=full_resolution"],
    "cuDNN workspace capped at 0 MiB": ["model.cudnn_workspace_mib=0"],
    "16-true + micro-batch 1 + offload": [
        "trainer.precision=16-true",
        *MICRO,
        "model.offload_activations=true",
    ],
    "16-true + micro-batch 1 + offload + checkpointing: all + loss": [
        "trainer.precision=16-true",
        *MICRO,
        "model.offload_activations=true",
        *CKPT,
    ],
}


def recorded() -> dict[frozenset[str], dict]:
    """Measured runs of ``benchmarks/results/cuda/*.json`` by their set of overrides."""
    runs = {}
    for path in sorted((REPO / "benchmarks" / "results" / "cuda").glob("*.json")):
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            runs.setdefault(frozenset(run["overrides"]), {**run, "gpu": doc["gpu"]})
    return runs


def _mib(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def lever_overrides(name: str) -> list[str]:
    """A lever's ``train.py`` overrides on top of :data:`SEED` (a lever's key replaces the
    seed's)."""
    keys = {o.split("=")[0]: o for o in [*SEED, *LEVERS[name]]}
    return list(keys.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    results_io.add_json_out(parser, "levers_estimated")
    args = parser.parse_args(argv)
    rows = []
    measured = recorded()
    print(
        "| lever | estimated peak allocated / reserved (MiB) | measured peak allocated / "
        "reserved (MiB) | measured cut | measured time ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    base = None
    for name in LEVERS:
        run_overrides = lever_overrides(name)
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
            cfg = compose("train", overrides=[*run_overrides, "memory.plan_device=cuda"])
        est = estimate(planned_config(cfg))  # the estimator takes a plan
        rows.append(
            {
                "lever": name,
                "overrides": run_overrides,
                "estimated_peak_allocated": est.peak_allocated,
                "estimated_peak_reserved": est.peak_reserved,
            }
        )
        run = measured.get(frozenset(run_overrides))
        estimated = f"{est.peak_allocated / MIB:,.0f} / {est.peak_reserved / MIB:,.0f}"
        if run is None:
            print(f"| {name} | {estimated} | not yet measured | | |", flush=True)
            continue
        m = run["measured"]
        base = base or m
        cut = base["peak_allocated_mib"] / m["peak_allocated_mib"]
        ratio = f"{m['step_s'] / base['step_s']:.2f}" if m["step_s"] and base["step_s"] else ""
        print(
            f"| {name} | {estimated} | {_mib(m['peak_allocated_mib'])} / "
            f"{_mib(m['peak_reserved_mib'])} | {cut:.2f}x | {ratio} |",
            flush=True,
        )
    doc = results_io.result(
        "levers_estimated", rows, script=__file__, argv=argv, estimated_for="cuda"
    )
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
