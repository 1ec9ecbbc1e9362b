"""Figures that cannot go stale: every results file README, docs or the margins cite, checked
against today's code by the sources its benchmark declares (``results_io.SOURCES``), and the
estimates among them made again by today's ``src/volseg/memory``.

A results file of ``estimator_accuracy`` holds measured bytes (a real ``python train.py``, hours)
beside estimates (``estimate_run(plan)``, seconds). When the estimator changes, its estimates go
stale; this tool makes them again, on a CPU that reproduces the file's kind
(:func:`reproducing_env`). Results files are append-only: where every estimate comes out the
same bytes, the file gets a stamp (``restamps``: the date, the kind and the code,
:func:`benchmarks.results_io.code`) and nothing else; where one changes, the estimates go into a
new file beside it (``re_estimate_of`` names the old one), which the tables and the margins then
read as the newest of its grid. A kind this CPU cannot reproduce (:data:`NOT_REPRODUCIBLE`) is
left as it was and said so beside its margin. Any other stale file (rule effects, time factors)
is made again by rerunning the command it records, into a new file; the margins by their
writers. ``tests/test_benchmark_suite.py`` fails while a cited figure is stale.

    python -m benchmarks restamp           # every stale cited estimate; then the margins, tables
    python -m benchmarks restamp --check   # list every stale cited figure, change nothing (exit 1)
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
NOT_REPRODUCIBLE = results_io.NOT_REPRODUCIBLE


#: where a benchmark's figures are re-made by this tool: estimates (any other: its own command)
ESTIMATES = ("estimator_accuracy", "cuda_estimate_errors")
CUDA_ESTIMATES = "cuda_estimate_errors"
RESULTS_LINK = r"(?:benchmarks/)?results/((?:cpu|cuda|nnunet)/[\w.-]+\.json)"


def cited(repo: Path = results_io.REPO) -> list[Path]:
    """Every results file named in :data:`CITING`."""
    text = "\n".join(p.read_text() for pattern in CITING for p in sorted(repo.glob(pattern)))
    names = sorted(set(re.findall(RESULTS_LINK, text)))
    return [repo / "benchmarks" / "results" / n for n in names]


def stamp(doc: dict[str, Any]) -> str | None:
    """The hash of ``src/volseg/memory`` that made a file's estimates (``results_io.stamp``)."""
    return results_io.stamp(doc, MEMORY)


def reproducing_env(kind: str) -> dict[str, str] | None:
    """The environment under which this CPU makes the estimates a CPU of ``kind`` makes (None:
    it cannot): a kind held to an ISA (``AVX512_BF16, held to AVX512_CORE_VNNI``) is this CPU's
    own kind under the same hold; an AVX2 CPU is this one held to AVX2."""
    from volseg.utils.cpu import cpu_flags, kind_of

    base, *holds = kind.split(", ")
    env = {}
    for hold in holds:
        name = "ATEN_CPU_CAPABILITY" if hold.startswith("ATen") else "ONEDNN_MAX_CPU_ISA"
        env[name] = hold.rsplit(" ", 1)[-1]
    if base == kind_of(cpu_flags()):
        return env
    if kind == "AVX2" and cpu_flags().get("avx2"):
        return dict(HELD_TO_AVX2)
    return None


def stale(repo: Path = results_io.REPO) -> list[tuple[Path, str, str]]:
    """Each cited file made by other code than today's, by the sources its benchmark declares
    (``results_io.SOURCES``), with its kind (a CPU kind or ``CUDA`` for estimates, else the
    benchmark) and why; then each margins file that its inputs no longer give
    (:func:`stale_margins`). A benchmark that declares no sources must be ``results_io.DATED``;
    an estimate of a kind of :data:`NOT_REPRODUCIBLE` is not stale (its margin says so)."""
    found = []
    for path in cited(repo):
        doc = json.loads(path.read_text())
        benchmark = results_io.benchmark_of(path, doc)
        if benchmark in results_io.DATED:
            continue
        if benchmark not in results_io.SOURCES:
            found.append((path, str(benchmark), "declares no sources in results_io.SOURCES"))
            continue
        kind = str(benchmark)
        if benchmark in ESTIMATES:
            kind = "CUDA" if benchmark == CUDA_ESTIMATES else results_io.cpu_kind(doc)
            if kind in NOT_REPRODUCIBLE:
                continue
        for source in results_io.SOURCES[benchmark]:
            made, today = results_io.stamp(doc, source), results_io.source_hash(source, repo)
            if made != today:
                why = "no record of the code" if made is None else f"made by {made[:19]}"
                remedy = "" if benchmark in ESTIMATES else f"; rerun `{doc.get('command')}`"
                found.append((path, kind, f"{why}, today's {source} is {today[:19]}{remedy}"))
                break
    return found + stale_margins(repo)


def stale_margins(repo: Path = results_io.REPO) -> list[tuple[Path, str, str]]:
    """Each packaged margins file that its writer, fed today's results files, would change."""
    from benchmarks import cpu_margins, cuda_estimate_errors

    found = []
    results = repo / "benchmarks" / "results"
    for writer in (cpu_margins, cuda_estimate_errors):
        packaged = repo / writer.MARGINS.relative_to(results_io.REPO)
        if not packaged.exists():
            continue
        made = writer.margins(results)
        if json.loads(packaged.read_text()) != made:
            why = f"its inputs give other margins; rerun `{made['command']}`"
            found.append((packaged, "margins", why))
    return found


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A file's rows: ``rows``, and the records kept by grid under ``grids`` (a re-estimated
    file has both, a file of 2026-12-02 only ``grids``), each to be re-estimated."""
    return list(doc.get("rows") or []) + [r for g in (doc.get("grids") or {}).values() for r in g]


def _stamp_record(changed: list[str]) -> dict[str, Any]:
    """What a restamp records: when, by what command, on which kind, by which code."""
    return {
        "date": datetime.date.today().isoformat(),
        "command": "python -m benchmarks restamp",
        "kind": __import__("volseg.utils.cpu", fromlist=["cpu_kind"]).cpu_kind(),
        "code": results_io.code("estimator_accuracy"),
        "changed": changed,
    }


def keep(path: Path, doc: dict[str, Any], changed: list[str]) -> Path:
    """Keep a file's estimates made again (``doc``, the file's rows re-estimated), append-only:
    no row changed, a stamp appended to the file as it is; else ``doc`` as a new file beside it
    (``re_estimate_of``: the file it re-estimates). The file written."""
    record = _stamp_record(changed)
    if not changed:
        kept = json.loads(path.read_text())
        kept[results_io.STAMPS] = [*(kept.get(results_io.STAMPS) or []), record]
        path.write_text(json.dumps(kept, indent=2, default=str) + "\n")
        return path
    doc.pop(results_io.STAMPS, None)
    doc["estimates"], doc["re_estimate_of"] = record, results_io.rel(path)
    doc["date"] = record["date"]  # the file's, as its name: newer than the file it re-estimates
    name = re.sub(r"^[\d-]{10}_|-\d+$", "", path.stem)  # the benchmark's, undated
    new = results_io.unused(path.with_name(f"{datetime.date.today().isoformat()}_{name}.json"))
    new.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return new


def re_estimate(path: Path, made: dict[tuple[str, ...], dict[str, int]]) -> tuple[list[str], Path]:
    """Estimate every measured row of ``path`` again here (this process's ISA; ``made``: the
    estimates so far, by overrides) and :func:`keep` them; the names of the rows whose bytes
    changed, and the file written."""
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
    return changed, keep(path, doc, changed)


def re_estimate_cuda(path: Path) -> tuple[list[str], Path]:
    """The CUDA estimates of the recorded GPU runs made again by their own benchmark (into a
    temporary file) and :func:`keep` them: the rows whose figures changed, the file written."""
    with tempfile.TemporaryDirectory(prefix="volseg-restamp-") as tmp:
        out = Path(tmp) / path.name
        command = [sys.executable, "-m", "benchmarks", CUDA_ESTIMATES, "--json-out", str(out)]
        subprocess.run(command, cwd=results_io.REPO, check=True)
        doc = json.loads(out.read_text())
    old = json.loads(path.read_text())["rows"]
    changed = [str(r.get("name", i)) for i, r in enumerate(doc["rows"]) if r not in old]
    return changed, keep(path, doc, changed)


def _said(path: Path, changed: list[str], written: Path) -> str:
    if not changed:
        return f"{results_io.rel(path)}: same bytes, stamped"
    rows = f"{len(changed)} rows changed ({'; '.join(changed)})"
    return f"{results_io.rel(path)}: {rows} -> {results_io.rel(written)}"


def _child(paths: Sequence[Path]) -> int:
    """Re-estimate ``paths`` in this process (its ISA as the parent set it); 1 if any failed."""
    made: dict[tuple[str, ...], dict[str, int]] = {}
    failed = 0
    for path in paths:
        try:
            changed, written = re_estimate(path, made)
        except Exception as error:  # one file's missing extra must not stop the others
            print(f"{path.relative_to(results_io.REPO)}: not re-estimated ({error!r})", flush=True)
            failed = 1
            continue
        print(_said(path, changed, written), flush=True)
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
    for path, kind, why in found:
        if kind == "CUDA":
            print(_said(path, *re_estimate_cuda(path)), flush=True)
            continue
        if kind == "margins" or "rerun `" in why:  # remade by the tools below, or by hand
            continue
        env = reproducing_env(kind)
        if env is None:
            print(f"cannot re-estimate {path.name}: no way to reproduce {kind} here")
            continue
        groups.setdefault(tuple(sorted(env.items())), []).append(path)
    children = []
    for env, paths in groups.items():  # one process per ISA, side by side (one core each)
        child = {k: v for k, v in os.environ.items() if k not in HELD_TO_AVX2}  # held anew
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
