"""Which estimator rule changes which row of each held-out grid.

A grid tests a rule of the estimator (``volseg.memory.estimate.workspace.RULES``) only where
one of its rows is estimated differently without it. Every row is estimated on fake tensors
(``grid.predict``: seconds, nothing run) with every rule on, then without each rule in turn.
:data:`ADDED` names the commit that brought each rule, so each grid lists the rules added since
the grid before it was frozen: the next grid is drawn so that each of those changes a row.

    python -m benchmarks rule_effects                                  # every held-out grid
    python -m benchmarks rule_effects --grid held-out-2026-12-07 --json-out none
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m benchmarks rule_effects  # as AVX2
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks import grid, results_io
from volseg.utils.units import MIB

#: the commit that added each rule (``git log -S``; a later commit may have refined it)
ADDED = {
    "native_conv_columns": "ef8145e",
    "onednn_blocked": "f8cf2c7",
    "trilinear_backward_copy": "f8cf2c7",
    "cudnn_workspace": "d756dca",
    "gemm_float32_buffer": "2157f27",
    "true_default_dtype": "d9e3f74",
    "channels_last_conv": "541968e",
    "avx2_gemm_scratchpad": "541968e",
    "softmax_copy": "153d740",
    "max_pool_layout": "153d740",
    "bf16_weight_gradient": "f503bb8",
}


def rules_off(*names: str) -> Any:
    """A context in which the named rules count nothing, each restored after it."""
    from volseg.memory.estimate.workspace import RULES

    unknown = sorted(set(names) - RULES.keys())
    if unknown:
        raise KeyError(f"no estimator rule {', '.join(unknown)}; known: {', '.join(RULES)}")
    return mock.patch.dict(RULES, dict.fromkeys(names, False))


def row_effects(
    overrides: list[str], work: Path, rules: Sequence[str] | None = None
) -> dict[str, Any]:
    """A config's estimated step growth (bytes) with every rule on, and without each of
    ``rules`` (default: all) that changes it (``{rule: bytes}``)."""
    from volseg.memory.estimate.workspace import RULES

    def growth(*off: str) -> int:
        with rules_off(*off):
            return int(grid.predict(overrides, "cpu", work)["growth"])

    with_all = growth()
    without = {rule: growth(rule) for rule in (RULES if rules is None else rules)}
    return {
        "estimated_bytes": with_all,
        "without": {rule: nbytes for rule, nbytes in without.items() if nbytes != with_all},
    }


def _in_history(commit: str, of: str | None) -> bool:
    """Whether ``commit`` is ``of`` or before it (``of`` None: the checkout's HEAD)."""
    ancestor = ["git", "merge-base", "--is-ancestor", commit, of or "HEAD"]
    return subprocess.run(ancestor, cwd=results_io.REPO, capture_output=True).returncode == 0


def added_between(before: str | None, frozen: str | None) -> list[str]:
    """The rules added after commit ``before`` (None: any) and by ``frozen`` (None: HEAD)."""
    return [
        rule
        for rule, commit in ADDED.items()
        if _in_history(commit, frozen) and not (before and _in_history(commit, before))
    ]


def first_measured(name: str) -> str | None:
    """The commit whose code first measured grid ``name``: the oldest estimator results file
    with its rows, where that file records its code (None: not measured, or measured before
    files recorded it). The rules a grid tests are those added by then, a grid being frozen
    before the rules it tests land."""
    for path in results_io.runs("estimator_accuracy", "cpu"):  # oldest first
        doc = results_io.load(path)
        if any(row.get("grid") == name for row in doc["rows"]):
            return (doc.get("code") or {}).get("commit")
    return None


def held_out_grids() -> list[str]:
    """The frozen held-out grids, oldest first (their names carry their date)."""
    return sorted(name for name in grid.frozen_grids() if name.startswith("held-out-"))


def report(names: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every row of the named grids with its rules' effects, and per grid its freezing commit,
    the rules it tests (added after the grid before it was frozen and by the code that first
    measured it, else by its freezing) and the rules that change none of its rows."""
    from volseg.memory.estimate.workspace import RULES

    order = held_out_grids()
    frozen = grid.frozen_grids()
    rows: list[dict[str, Any]] = []
    grids = {}
    with tempfile.TemporaryDirectory(prefix="volseg-rules-") as tmp:
        for name in names:
            commit = grid.frozen_in(name)
            index = order.index(name)
            before = grid.frozen_in(order[index - 1]) if index > 0 else None
            # a grid is frozen before the rules it tests land, and measured after them
            after = first_measured(name) or commit
            for config in frozen[name]["configs"]:
                row = {"grid": name, "name": config["name"], "overrides": config["overrides"]}
                try:
                    row.update(row_effects(config["overrides"], Path(tmp)))
                except Exception as error:  # a config the estimate refuses is a row too
                    row["failed"] = grid.failure(error)
                print(f"{name}: {row['name']}: {_effects(row)}", flush=True)
                rows.append(row)
            changing = {rule for r in rows if r["grid"] == name for rule in r.get("without", {})}
            grids[name] = {
                "frozen_in": commit,
                "previous": order[index - 1] if index > 0 else None,
                "added_since_previous": added_between(before, after),
                "unchanged_by": [rule for rule in RULES if rule not in changing],
            }
    return rows, grids


def _effects(row: dict[str, Any]) -> str:
    """``softmax_copy 83.1 -> 79.9 MiB; ...``, ``no rule``, or the failure."""
    if "failed" in row:
        return f"not estimated ({row['failed']})"
    with_all = row["estimated_bytes"] / MIB
    changes = [
        f"{rule} {with_all:,.1f} -> {b / MIB:,.1f} MiB" for rule, b in row["without"].items()
    ]
    return "; ".join(changes) or "no rule"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", nargs="+", help="held-out grids (default: every one)")
    results_io.add_json_out(parser, "rule_effects")
    args = parser.parse_args(argv)
    names = args.grid or held_out_grids()
    unknown = sorted(set(names) - set(held_out_grids()))
    if unknown:
        parser.exit(2, f"rule_effects: no held-out grid {', '.join(unknown)} in benchmarks/grids\n")
    rows, grids = report(names)
    for name, found in grids.items():
        untested = [r for r in found["added_since_previous"] if r in found["unchanged_by"]]
        print(f"{name}: added since the grid before it and changing none of its rows: {untested}")
    doc = results_io.result("rule_effects", rows, script=__file__, argv=argv, grids=grids)
    results_io.write(doc, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
