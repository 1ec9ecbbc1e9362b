"""The memory levers on the reference config, estimated for a GPU beside what a GPU measured.

unet_large (40.2M parameters, NCDHW), batch 2 of 1x26x150x320, 5 classes, AdamW, float16
autocast as the baseline; each lever and combination is estimated by ``volseg.memory.estimate``
for CUDA (CUDA's autocast rules, cuDNN's workspaces, caching-allocator model).

    python -m benchmarks levers_estimated [--json-out PATH|none]

The estimates (bytes) go to ``benchmarks/results/cpu/<date>_levers_estimated.json``; ``python -m
benchmarks tables`` puts each beside the measured run of the same overrides in
``benchmarks/results/cuda/*.json`` (docs/benchmarks.md's levers table: the cut of the measured
peak allocated, step time against the measured baseline's, or "not yet measured").
"""

from __future__ import annotations

import argparse
import os

from hydra import compose, initialize_config_dir

from benchmarks import results_io
from volseg.memory import estimate_run
from volseg.plan import RunPlan, planned_config
from volseg.utils.units import MIB

REPO = results_io.REPO
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
    print("| lever | estimated peak allocated / reserved (MiB) |\n| --- | ---: |")
    for name in LEVERS:
        run_overrides = lever_overrides(name)
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
            cfg = compose("train", overrides=[*run_overrides, "memory.plan_device=cuda"])
        est = estimate_run(RunPlan(planned_config(cfg), {})).step  # the estimator takes a plan
        rows.append(
            {
                "lever": name,
                "overrides": run_overrides,
                "estimated_peak_allocated": est.peak_allocated,
                "estimated_peak_reserved": est.peak_reserved,
            }
        )
        allocated, reserved = est.peak_allocated / MIB, est.peak_reserved / MIB
        print(f"| {name} | {allocated:,.0f} / {reserved:,.0f} |", flush=True)
    doc = results_io.result(
        "levers_estimated", rows, script=__file__, argv=argv, estimated_for="cuda"
    )
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
