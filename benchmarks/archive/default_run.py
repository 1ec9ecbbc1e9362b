"""The default run as a user starts it: ``python train.py`` on the embedded dataset, timed whole.

    python -m benchmarks default_run                       # python train.py
    python -m benchmarks default_run -- trainer.precision=32

Runs ``python train.py`` (+ overrides after ``--``) in a fresh process, times the whole command
(start-up, dataset generation on first use, training, validations, checkpoints), and reads the
run dir's ``summary.json`` and ``csv/metrics.csv``: the precision ``auto`` chose, steps, best and
final ``val/dice_mean``, and the first epoch whose validation reached ``--reach`` (0.80). Writes
the row with the machine and the command to ``benchmarks/results/cpu/<date>_default_run.json``
(``--json-out``); its head records ``ONEDNN_MAX_CPU_ISA`` and ``ATEN_CPU_CAPABILITY``
(``ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks default_run`` is what an AVX2-only CPU runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from benchmarks import harness, results_io

REPO = Path(__file__).resolve().parents[2]


def validations(rows: list[dict[str, str]]) -> list[tuple[int, float]]:
    """(epoch, ``val/dice_mean``) of every validation in a run's metrics rows."""
    return [(int(float(r["epoch"])), float(r["val/dice_mean"])) for r in rows if r["val/dice_mean"]]


def first_reaching(history: list[tuple[int, float]], level: float) -> int | None:
    """The first epoch whose validation Dice is at least ``level`` (None: none)."""
    return next((epoch for epoch, dice in history if dice >= level), None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reach", type=float, default=0.80, help="Dice level to time")
    results_io.add_json_out(parser, "default_run")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --)")
    args = parser.parse_args(argv)

    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    run_dir = REPO / "logs" / "benchmarks" / "default_run" / stamp
    try:
        run = harness.train(args.overrides, run_dir)
    except harness.RunFailed as err:
        sys.exit(f"python train.py {' '.join(args.overrides)}: {err}")
    wall, summary = run.seconds, run.summary
    history = validations(run.rows)
    row = {
        "command": " ".join(["python", "train.py", *args.overrides]),
        "precision": summary["precision"],
        "precision_reason": summary.get("precision_choice", {}).get("reason"),
        "steps": summary["global_step"],
        "epochs": summary["epochs"],
        "best_val_dice_mean": summary["best_val_dice_mean"],
        "final_val_dice_mean": history[-1][1],
        "reach": args.reach,
        "first_epoch_reaching": first_reaching(history, args.reach),
        "whole_command_s": wall,
        "run_dir": str(run_dir),
    }
    print(json.dumps(row, indent=2))
    doc = results_io.result("default_run", [row], script=__file__, argv=argv)
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
