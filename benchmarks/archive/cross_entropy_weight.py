"""What unet_tiny's cross-entropy weight (0.25, chosen on the many-class task) costs few-class
tasks: ``model.loss.lambda_ce=0.25`` (the default) against ``1.0`` at equal wall-clock.

    python -m benchmarks cross_entropy_weight                      # mni152 and hemispheres
    python -m benchmarks cross_entropy_weight --data mni152 --seeds 1 2 --budget 300

For each dataset and seed, the two weights train at the same time (``python train.py data=<data>
trainer.max_time=<budget> seed=<seed> model.loss.lambda_ce=<w>``, one CPU thread each, so both
see the same load), in one precision (``--precision``, default ``auto``: what volseg picks on
this CPU). Prints the best and final validation Dice (mean over foreground classes) of each run
and the mean over seeds, and writes the rows with the machine and the command to
``benchmarks/results/cpu/<date>_cross_entropy_weight.json`` (``--json-out``).
"""

from __future__ import annotations

import argparse

from benchmarks import results_io, tables
from benchmarks.archive import mni152_runs

WEIGHTS = ("0.25", "1.0")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        nargs="+",
        default=["mni152", "mni152_hemispheres"],
        choices=mni152_runs.DATA_CHOICES,
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--budget", type=int, default=300, help="training seconds per run")
    parser.add_argument("--precision", choices=mni152_runs.PRECISIONS, default="auto")
    results_io.add_json_out(parser, "cross_entropy_weight")
    args = parser.parse_args(argv)

    precision = mni152_runs.resolved_precision(args.precision)
    rows = []
    for data in args.data:
        mni152_runs.dataset_root(data)
        for seed in args.seeds:
            started = [
                mni152_runs.start_volseg(
                    data,
                    args.budget,
                    [f"seed={seed}", f"model.loss.lambda_ce={w}"],
                    f"ce{w}_seed{seed}",
                    threads=1,
                    precision=precision,
                )
                for w in WEIGHTS
            ]
            for w, run in zip(WEIGHTS, started, strict=True):
                row = mni152_runs.finish_volseg(*run)
                rows.append({**row, "data": data, "seed": seed, "lambda_ce": float(w)})
                print(f"{data} seed {seed} lambda_ce {w}: best {row['dice_mean']:.3f}", flush=True)
    cpu = mni152_runs.cpu_line()
    print(f"\n{args.budget} s each, two weights at a time (1 thread each), {precision}; {cpu}\n")
    print(tables.cross_entropy_rows(rows))
    settings = {"budget_s": args.budget, "precision": precision, "mode": "pairs at the same time"}
    doc = results_io.result(
        "cross_entropy_weight", rows, script=__file__, argv=argv, settings=settings
    )
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
