"""Validation's memory on the CPU: real ``python train.py`` runs against the estimate.

For each case, the embedded dataset is generated at that volume shape into a temporary folder (or,
for ``mni152``, ``data=mni152`` builds its brain MRI cases there: the volume is the largest
validation case's, read from its header after the run) and
``python train.py`` trains 2 steps and validates once in a fresh process with
``MALLOC_MMAP_THRESHOLD_=65536`` (freed tensors leave the resident set at once, as in
``benchmarks/estimator_accuracy.py``). The memory monitor logs the validation's peak resident
memory (``mem/val_peak_allocated_mib``) and what was resident when it began
(``mem/val_start_allocated_mib``); the measured figure is their difference, the estimate's is
``estimate_validation(cfg, shape).peak_growth`` (the peak above the resident training state).
Both are on this CPU, in the precision the run plans for it (``auto``: bf16-mixed where the CPU
has native bf16), or float32 where the case says ``trainer.precision=32``.

    python -m benchmarks validation_memory                 # every case, writes the JSON
    python -m benchmarks validation_memory --case embedded
    python -m benchmarks validation_memory --table FILE    # the docs' table from a results file
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
from pathlib import Path

import torch

from benchmarks import harness, results_io
from benchmarks.results_io import cpu_description
from volseg.utils.cpu import cpu_flags, cpu_model
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

RESULTS = REPO / "benchmarks" / "results" / "cpu"

#: a small U-Net on windows of 32x64x64, one window's batch at a time in training: its float32
#: validation was estimated 17-19% short at 4-8 windows at once until a float32 convolution's
#: blocked input and output were counted together (docs/memory.md)
SMALL_NET = ["data.batch_size=1", "data.patch_size=[32,64,64]", "model.net.widths=[8,16,32]"]
FLOAT32 = ["trainer.precision=32"]

#: name -> (volume shape [D, H, W] (None: data=mni152's own), volumes (the last one validates),
#: extra overrides)
CASES: dict[str, tuple[list[int] | None, int, list[str]]] = {
    "embedded": ([32, 96, 96], 4, []),
    "ct-sized": ([96, 256, 256], 2, []),
    "embedded-fp32": ([32, 96, 96], 4, FLOAT32),
    "small-net-fp32-sw8": (
        [32, 128, 128], 3, [*SMALL_NET, "model.inferer.sw_batch_size=8", *FLOAT32]
    ),
    "small-net-fp32-sw4": (
        [32, 128, 128], 3, [*SMALL_NET, "model.inferer.sw_batch_size=4", *FLOAT32]
    ),
    "ct-sized-fp32": ([96, 256, 256], 2, FLOAT32),
    "mni152-fp32": (None, 0, ["data=mni152", *FLOAT32]),
}  # fmt: skip


def overrides(data: Path) -> list[str]:
    return [
        f"data.root={data}",
        "data.num_workers=0",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.check_val_every_n_epoch=1",
        "trainer.num_sanity_val_steps=0",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "callbacks.validation_overlays=null",
        "memory.plan_step=false",
    ]


def measure(name: str, work: Path) -> dict:
    from volseg.data.synthetic import generate_synthetic_dataset
    from volseg.memory.estimate.engine import estimate_validation
    from volseg.memory.estimate.inference import validation_shape
    from volseg.plan import planned_config
    from volseg.utils.config import compose_run_config

    shape, volumes, extra = CASES[name]
    if shape is None:  # data=mni152: built by the run, into the work folder
        data = work / name / "data"
        extra = [*extra, f"data.mni152.root={data}"]
    else:
        data = generate_synthetic_dataset(work / name / "data", volumes, 1, shape)
    run_dir = work / name / "run"
    args = [*overrides(data), *extra]
    env = harness.child_env({"MALLOC_MMAP_THRESHOLD_": "65536"})
    run = harness.train(args, run_dir, env=env)
    seconds = run.seconds
    row = harness.last_with(run.rows, "mem/val_peak_allocated_mib")
    peak = row["mem/val_peak_allocated_mib"] * MIB
    start = row["mem/val_start_allocated_mib"] * MIB
    composed = compose_run_config(REPO / "configs", "train", args, work / name / "est")
    cfg = planned_config(composed)
    if shape is None:
        shape, _ = validation_shape(cfg)
    est = estimate_validation(cfg, shape)
    return {
        "case": name,
        "volume_shape": shape,
        "overrides": args,
        "precision": est.precision,
        "windows": est.windows,
        "run_seconds": round(seconds, 1),
        "measured_val_peak_rss": int(peak),
        "measured_val_start_rss": int(start),
        "measured_growth": int(peak - start),
        "estimated_growth": est.peak_growth,
        "estimated_peak_allocated": est.peak_allocated,
        "estimated_resident": est.resident,
        "estimated_stitching": est.stitching,
        "estimated_window_batch": est.window_batch,
        "estimate_seconds": round(est.seconds, 1),
        "error": round(est.peak_growth / (peak - start) - 1, 4),
    }


def table(path: Path) -> str:
    """The markdown table of a results file."""
    saved = json.loads(path.read_text())
    lines = [
        f"{saved['cpu']} ({', '.join(f for f, on in saved['cpu_flags'].items() if on)}), "
        f"torch {saved['torch']}, {saved['date']}: `{saved['command']}`",
        "",
        "| case | volume | precision | windows | measured rise MiB | estimated MiB | error |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in saved["rows"]:
        lines.append(
            f"| {r['case']} | {'×'.join(map(str, r['volume_shape']))} | {r['precision']} | "
            f"{r['windows']} | {r['measured_growth'] / MIB:,.1f} | "
            f"{r['estimated_growth'] / MIB:,.1f} | {100 * r['error']:+.1f}% |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--table", type=Path, help="print the table of a results file")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.case or list(CASES):
            rows.append(measure(name, Path(work)))
            print(json.dumps(rows[-1]), flush=True)
    today = datetime.date.today().isoformat()
    result = {
        "benchmark": "validation_memory",
        "date": today,
        "command": results_io.command(__file__, argv),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_description": cpu_description(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "rows": rows,
    }
    out = args.out or RESULTS / f"{today}_validation_memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"Wrote {out}")
    print(table(out))


if __name__ == "__main__":
    main()
