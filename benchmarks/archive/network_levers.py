"""What each memory lever cuts on each network volseg did not write: measured on the CPU, and
estimated for a GPU.

For every network of ``estimator_grid.py``'s ``networks`` grid (MONAI's DynUNet, SegResNet,
SwinUNETR, BasicUNet and a user's ``my_unet.UNet`` from a file), each lever its adapter offers
and that acts on a CPU (activation checkpointing ``all``, that plus loss checkpointing, and
micro-batches for a batch of 2) runs as ``python train.py`` for 3 optimizer steps in a fresh
process, and its steady step's peak rise is read from the memory monitor's CSV exactly as
``estimator_grid.py`` reads it (resident memory, ``MALLOC_MMAP_THRESHOLD_=65536``); the cut
is the baseline's rise over the lever's. Beside it, the estimator's figure for the same config
on the CPU, and the estimated cut of the step's peak allocated for a GPU in bf16-mixed (fake
tensors: no GPU needed), where activation offload (a GPU lever) is estimated too.

    python -m benchmarks network_levers   # benchmarks/results/cpu/<date>_network_levers.json
    python -m benchmarks tables           # docs/networks.md's table from it
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks import grid, results_io

#: lever name -> overrides, applied on top of a network's grid config
CPU_LEVERS: dict[str, list[str]] = {
    "checkpointing all": ["model.activation_checkpointing=all"],
    "checkpointing all + loss": [
        "model.activation_checkpointing=all",
        "model.checkpoint_loss=true",
    ],
    "micro-batch 1 (x2 accumulation)": ["data.batch_size=1", "trainer.accumulate_grad_batches=2"],
}
#: estimated for a GPU only: it keeps saved tensors in host memory, which on a CPU is the same
GPU_LEVERS: dict[str, list[str]] = {
    **CPU_LEVERS,
    "activation offload": ["model.offload_activations=true"],
}
GPU = ["memory.plan_device=cuda", "trainer.precision=bf16-mixed"]


def _applies(base: list[str], lever: list[str]) -> bool:
    """Micro-batches of 1 only where the grid config's batch is 2."""
    return "data.batch_size=1" not in lever or "data.batch_size=2" in base


def _gpu_estimate(overrides: list[str], work_dir: Path) -> int:
    """The step's estimated peak allocated on a GPU (bytes), bf16-mixed."""
    from volseg.memory.estimate.engine import estimate
    from volseg.plan import planned_config

    grid.user_network(work_dir)
    data = grid.data_dir(overrides, work_dir)
    return int(
        estimate(planned_config(grid.compose([*overrides, *GPU], "cuda", data))).peak_allocated
    )


def network_rows(name: str, base: list[str], work_dir: Path) -> list[dict]:
    """One network's rows: the baseline, then each lever that applies (bytes and cuts)."""
    rows = []
    for lever, extra in [("none", []), *GPU_LEVERS.items()]:
        if not _applies(base, extra):
            continue
        overrides = grid.merge(base, extra)
        row = {"network": name, "lever": lever, "overrides": overrides}
        row["gpu_estimated_peak"] = _gpu_estimate(overrides, work_dir)
        if lever == "none" or lever in CPU_LEVERS:  # offload keeps host memory: not on a CPU
            predicted = grid.predict(overrides, "cpu", work_dir)
            run_name = f"{name.split()[0]}_{len(rows)}"
            accumulate = int(predicted["accumulate_grad_batches"])
            measured = grid.measure(overrides, "cpu", work_dir, run_name, accumulate)
            row["cpu_estimated_growth"] = int(predicted["growth"])
            row["cpu_measured_growth"] = int(measured["growth"])
        rows.append(row)
        print(row, flush=True)
    first = rows[0]
    for row in rows:
        row["gpu_estimated_cut"] = first["gpu_estimated_peak"] / row["gpu_estimated_peak"]
        if "cpu_measured_growth" in row:
            row["cpu_measured_cut"] = first["cpu_measured_growth"] / row["cpu_measured_growth"]
            row["cpu_estimated_cut"] = first["cpu_estimated_growth"] / row["cpu_estimated_growth"]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument(
        "--networks", default=None, help="comma-separated prefixes of the grid's names to run"
    )
    results_io.add_json_out(parser, "network_levers")
    args = parser.parse_args(argv)
    configs = grid.NETWORKS
    if args.networks:
        wanted = args.networks.split(",")
        configs = [(n, o) for n, o in configs if any(n.startswith(w) for w in wanted)]
    with tempfile.TemporaryDirectory(prefix="volseg-levers-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        rows = [row for name, base in configs for row in network_rows(name, base, work_dir)]
    doc = results_io.result(
        "network_levers",
        rows,
        script=__file__,
        argv=argv,
        steps=grid.STEPS,
        malloc="MALLOC_MMAP_THRESHOLD_=65536",
        gpu_estimate=" ".join(GPU),
    )
    print(f"Wrote {results_io.write(doc, args.json_out)}")


if __name__ == "__main__":
    main()
