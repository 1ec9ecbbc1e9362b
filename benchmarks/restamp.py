"""Estimates that cannot go stale: every estimator results file that docs or the margins cite,
estimated again by today's ``src/volseg/memory`` (in place, its measured bytes kept).

A results file of ``estimator_accuracy`` holds measured bytes (a real ``python train.py``, hours)
beside estimates (``estimate(cfg)``, seconds). When the estimator changes, its estimates go
stale; this tool makes them again, on a CPU that reproduces the file's kind
(:func:`reproducing_env`), and records under the file's ``estimates`` key the code that made
them (:func:`benchmarks.results_io.code`), the date, the kind that made them and the rows whose
bytes changed. A kind this CPU cannot reproduce (:data:`NOT_REPRODUCIBLE`) is left as it was
and said so beside its margin. ``tests/test_benchmark_suite.py`` fails while a cited file's
estimates come from other code than today's.

    python -m benchmarks restamp           # every stale cited file; then the margins, tables
    python -m benchmarks restamp --check   # list the stale files, change nothing (exit 1: some)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import results_io

MEMORY = "src/volseg/memory"
#: where a file is cited: a figure it backs is published there
CITING = ("README.md", "docs/*.md", "src/volseg/**/*margins*.json")
#: the held ISA that stands in for an AVX2 CPU on this one: with oneDNN held to AVX2 and ATen's
#: kernels to avx2, this AVX-512 EPYC estimates the AVX2 EPYC's configs byte for byte (its tuned
#: grid of 2026-12-04, benchmarks/results/cpu/2026-12-04_estimator_accuracy-5.json: the 4
#: measured rows no estimator change touched since, the same bytes)
HELD_TO_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
#: kinds no CPU here reproduces, with why: their estimates stay as measured, said so
NOT_REPRODUCIBLE = {
    "AMX": "no AMX CPU here: AMX's bf16 kernels cannot be held to on another CPU",
}


#: the results files made by an estimate: the CPU estimator's grids, the CUDA estimates of the
#: recorded GPU runs (made on any CPU: the CUDA estimate runs no CPU kernel)
ESTIMATES = r"results/cpu/([\w.-]*(?:estimator|cuda_estimate_errors)[\w.-]*\.json)"
CUDA_ESTIMATES = "cuda_estimate_errors"


def cited(repo: Path = results_io.REPO) -> list[Path]:
    """Every results file of :data:`ESTIMATES` named in :data:`CITING`, by name."""
    text = "\n".join(p.read_text() for pattern in CITING for p in sorted(repo.glob(pattern)))
    names = sorted(set(re.findall(ESTIMATES, text)))
    return [repo / "benchmarks" / "results" / "cpu" / n for n in names]


def stamp(doc: dict[str, Any]) -> str | None:
    """The hash of ``src/volseg/memory`` that made a file's estimates: its ``estimates`` record
    (a re-estimate), else its own ``code`` (a run), else None (a file from before either)."""
    code = (doc.get("estimates") or {}).get("code") or doc.get("code") or {}
    return (code.get("sources") or {}).get(MEMORY)


def reproducing_env(kind: str) -> dict[str, str] | None:
    """The environment under which this CPU makes the estimates a CPU of ``kind`` makes (None:
    it cannot)."""
    from volseg.utils.cpu import cpu_flags, kind_of

    here = kind_of(cpu_flags())
    held = kind_of(
        cpu_flags(), HELD_TO_AVX2["ONEDNN_MAX_CPU_ISA"], HELD_TO_AVX2["ATEN_CPU_CAPABILITY"]
    )
    if kind == here:
        return {}
    if kind == held or (kind == "AVX2" and cpu_flags().get("avx2")):
        return dict(HELD_TO_AVX2)
    return None


def stale(repo: Path = results_io.REPO) -> list[tuple[Path, str, str]]:
    """Each cited file whose estimates another ``src/volseg/memory`` made, its CPU kind and
    why; a kind of :data:`NOT_REPRODUCIBLE` is not stale (its margin says so)."""
    today = results_io.source_hash(MEMORY, repo)
    found = []
    for path in cited(repo):
        doc = json.loads(path.read_text())
        kind = "CUDA" if CUDA_ESTIMATES in path.name else results_io.cpu_kind(doc)
        if kind in NOT_REPRODUCIBLE:
            continue
        made = stamp(doc)
        if made != today:
            why = "no record of the code" if made is None else f"estimated by {made[:19]}"
            found.append((path, kind, f"{why}, today's {MEMORY} is {today[:19]}"))
    return found


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A file's rows: ``rows``, and the records kept by grid under ``grids`` (a re-estimated
    file has both, a file of 2026-12-02 only ``grids``), each to be re-estimated."""
    return list(doc.get("rows") or []) + [r for g in (doc.get("grids") or {}).values() for r in g]


def re_estimate_in_place(path: Path, made: dict[tuple[str, ...], dict[str, int]]) -> list[str]:
    """Estimate every measured row of ``path`` again here (this process's ISA; ``made``: the
    estimates so far, by overrides), write the file back with its ``estimates`` record; the
    names of the rows whose bytes changed."""
    from benchmarks import grid

    doc = json.loads(path.read_text())
    changed = []
    with tempfile.TemporaryDirectory(prefix="volseg-restamp-") as tmp:
        for row in _rows(doc):
            if "measured_bytes" not in row or "estimated_bytes" not in row:
                continue
            key = tuple(row["overrides"])
            if key not in made:
                predicted = grid.predict(row["overrides"], "cpu", Path(tmp))
                made[key] = {
                    "estimated_bytes": int(predicted["growth"]),
                    "estimated_process_total_bytes": int(predicted["process_total"]),
                }
            new = made[key]
            if new["estimated_bytes"] != row["estimated_bytes"] and row["name"] not in changed:
                changed.append(row["name"])
            row["estimated_bytes"] = new["estimated_bytes"]
            if "estimated_process_total_bytes" in row:
                row["estimated_process_total_bytes"] = new["estimated_process_total_bytes"]
            row["error"] = new["estimated_bytes"] / row["measured_bytes"] - 1
    doc["estimates"] = {
        "date": datetime.date.today().isoformat(),
        "command": "python -m benchmarks restamp",
        "kind": __import__("volseg.utils.cpu", fromlist=["cpu_kind"]).cpu_kind(),
        "code": results_io.code("estimator_accuracy"),
        "changed": changed,
    }
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return changed


def _child(paths: Sequence[Path]) -> int:
    """Re-estimate ``paths`` in this process (its ISA as the parent set it); 1 if any failed."""
    made: dict[tuple[str, ...], dict[str, int]] = {}
    failed = 0
    for path in paths:
        try:
            changed = re_estimate_in_place(path, made)
        except Exception as error:  # one file's missing extra must not stop the others
            print(f"{path.relative_to(results_io.REPO)}: not re-estimated ({error!r})", flush=True)
            failed = 1
            continue
        what = f"{len(changed)} rows changed: {'; '.join(changed)}" if changed else "same bytes"
        print(f"{path.relative_to(results_io.REPO)}: {what}", flush=True)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list stale files, change nothing")
    parser.add_argument("--here", nargs="+", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-tables", action="store_true", help="do not rewrite docs' tables and the margins"
    )
    args = parser.parse_args(argv)
    if args.here:
        return _child(args.here)
    found = stale()
    for path, kind, why in found:
        print(f"stale: {path.relative_to(results_io.REPO)} ({kind}: {why})")
    if args.check:
        return 1 if found else 0
    groups: dict[tuple[tuple[str, str], ...], list[Path]] = {}
    for path, kind, _ in found:
        if kind == "CUDA":  # estimated again by its own benchmark, into the same file
            command = [
                "cuda_estimate_errors",
                "--json-out",
                path.relative_to(results_io.REPO).as_posix(),
            ]
            subprocess.run([sys.executable, "-m", "benchmarks", *command], cwd=results_io.REPO)
            continue
        env = reproducing_env(kind)
        if env is None:
            print(f"cannot re-estimate {path.name}: no way to reproduce {kind} here")
            continue
        groups.setdefault(tuple(sorted(env.items())), []).append(path)
    children = []
    for env, paths in groups.items():  # one process per ISA, side by side (one core each)
        child = {k: v for k, v in os.environ.items() if k not in HELD_TO_AVX2}
        child.update(env)
        command = [sys.executable, "-m", "benchmarks", "restamp", "--here", *map(str, paths)]
        children.append(subprocess.Popen(command, env=child, cwd=results_io.REPO))
    for child in children:
        child.wait()
    if not args.no_tables:
        margins = (["cpu_margins"], ["cuda_estimate_errors", "--margins-only"])
        for tool in (*margins, ["tables"]):
            subprocess.run(
                [sys.executable, "-m", "benchmarks", *tool], cwd=results_io.REPO, check=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
