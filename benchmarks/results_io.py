"""A benchmark's raw output as data: one JSON file per run, under ``benchmarks/results/<device>/``.

Every file has the same head, so that a table in docs can be regenerated from it
(``python -m benchmarks tables``) and figures computed from it (the planner's CUDA margins,
``benchmarks/cuda_estimate_errors.py``):

    {"benchmark": "data_throughput", "date": "2026-12-02",
     "command": "python -m benchmarks data_throughput --compare",
     "cpu": "AMD EPYC ...", "cpu_flags": {"avx2": true, ...}, "cpu_description": "...",
     "cpu_capability": "AVX512", "cores": 2, "torch": "2.13.0+cpu",
     "gpu": null,                       # or {"name": ..., "cuda": ..., "memory_mib": ...}
     "code": {"commit": "6acb177...", "dirty": false,
              "sources": {"src/volseg/memory": "sha256:..."}},   # the code that made it
     "rows": [...],                     # the benchmark's own records, one per table row
     ...}                               # anything else the benchmark keeps (its settings)

``validation_memory`` (a retired study) wrote the first such file; a script adopts this module
with

    results_io.add_json_out(parser, "<name>")            # --json-out PATH | none
    ...
    results_io.write(results_io.result("<name>", rows, script=__file__, argv=argv), args.json_out)

``--json-out`` defaults to ``benchmarks/results/<device>/<date>_<name>.json`` (``none``: write
nothing); a second run on the same day gets ``<date>_<name>-2.json`` and so on, so that no
default write replaces a measurement. Byte figures are kept in bytes, times in seconds, as
measured (no rounding).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
DEFAULT = "default"  # --json-out's default: the dated file under RESULTS/<device>/
HEAD = ("benchmark", "date", "command", "cpu", "cpu_flags", "torch", "rows")

MEMORY, MODELS, SPEED = "src/volseg/memory", "src/volseg/models", "src/volseg/speed"
#: the one place each benchmark declares the sources that decide its figures: a cited file whose
#: recorded hash of any of them is not today's was made by other code, and is stale
#: (``python -m benchmarks restamp --check``) until it is made again
SOURCES: dict[str, tuple[str, ...]] = {
    "estimator_accuracy": (MEMORY,),
    "cuda_estimate_errors": (MEMORY,),
    "levers_estimated": (MEMORY,),
    "rule_effects": (MEMORY,),
    "lever_time_factors": (MEMORY, MODELS, SPEED),
    "selective_checkpointing": (MODELS, MEMORY),
    "fastest_fit": (MEMORY, MODELS, SPEED, "src/volseg/plan"),
}
#: benchmarks whose figures are dated measurements of the code and machine their file names
#: (trainings, throughputs, kernels): cited with their date and command, never re-made in place
DATED = frozenset(
    {"cpu_bf16_conv", "cpu_precision", "cross_entropy_weight", "data_throughput", "default_run",
     "levers", "loader_compare", "memory_monitor_overhead", "network_levers", "real_data",
     "train_throughput", "training_overheads", "validation_memory", "step_profile",
     "cuda_results", "gpu_train_speed", "nnunet_side_by_side"}
)  # fmt: skip
#: the benchmark of a file from before results files named it
UNNAMED = {
    "estimator_networks.json": "estimator_accuracy",
    "2026-11-30_nvidia-h200.json": "cuda_results",
    "side_by_side.json": "nnunet_side_by_side",
}
#: CPU kinds no CPU here reproduces, with why: their estimates stay as measured, said so
NOT_REPRODUCIBLE = {
    "AMX": "no AMX CPU here: AMX's bf16 kernels cannot be held to on another CPU",
}
#: the keys a restamp adds to a results file (each a stamp, never a figure)
STAMPS = "restamps"
PACKAGE = ("src/volseg",)


def source_hash(path: str, repo: Path = REPO) -> str:
    """``sha256:<hex>`` of every ``*.py`` file under ``repo/path`` (or of that one file): each
    file's path relative to ``repo`` and its bytes, in path order. Equal hashes: the same code."""
    root = repo / path
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    digest = hashlib.sha256()
    for file in files:
        if "__pycache__" in file.parts:
            continue
        digest.update(file.relative_to(repo).as_posix().encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def _git(*args: str, repo: Path = REPO) -> str | None:
    """``git <args>``'s output in ``repo`` (None: no git, or not a repository)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


#: the code this process started with (:func:`hold_code`), by repository
_STARTED: dict[Path, dict[str, Any]] = {}


def hold_code(repo: Path = REPO) -> None:
    """Take the code now, before a run: its files are stamped with it, not with what the tree
    holds when they are written (an edit during a long run would otherwise stamp them)."""
    sources = {s for declared in SOURCES.values() for s in declared} | set(PACKAGE)
    _STARTED[repo] = _code(sorted(sources), repo)


def _code(sources: Sequence[str], repo: Path) -> dict[str, Any]:
    status = _git("status", "--porcelain", "--untracked-files=no", repo=repo)
    return {
        "commit": _git("rev-parse", "HEAD", repo=repo),
        "dirty": None if status is None else bool(status),
        "sources": {path: source_hash(path, repo) for path in sources},
    }


def code(benchmark: str, repo: Path = REPO) -> dict[str, Any]:
    """The code a run of ``benchmark`` ran (as :func:`hold_code` took it, else as it is now): the
    commit, whether the work tree differed from it (``dirty``: then the commit alone does not
    name the code), and :func:`source_hash` of each source that decides its figures
    (:data:`SOURCES`)."""
    sources = SOURCES.get(benchmark, PACKAGE)
    held = _STARTED.get(repo)
    if held is None:
        return _code(sources, repo)
    return {**held, "sources": {path: held["sources"][path] for path in sources}}


def benchmark_of(path: Path, doc: dict[str, Any]) -> str | None:
    """The benchmark that wrote a results file (its ``benchmark``, else :data:`UNNAMED`)."""
    return doc.get("benchmark") or UNNAMED.get(path.name)


def stamp(doc: dict[str, Any], source: str) -> str | None:
    """The hash of ``source`` that made a file's figures: its newest restamp (the same bytes made
    again), else its ``estimates`` record (a re-estimate), else its own ``code`` (the run), else
    None (a file from before any of them)."""
    records = [*reversed(doc.get(STAMPS) or []), doc.get("estimates") or {}, doc]
    for record in records:
        found = ((record.get("code") or {}).get("sources") or {}).get(source)
        if found:
            return found
    return None


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    """A results file without its stamps: what no later commit may change."""
    return {key: value for key, value in doc.items() if key != STAMPS}


#: the commit from which results files are append-only: a file committed before it is held to
#: its figures at this commit (some were rewritten in place before), a later one to its first
APPEND_ONLY_FROM = "14582077dd43342bcdc491d30ef6fb5024c3f43c"


def rewritten(repo: Path = REPO, since: str = APPEND_ONLY_FROM) -> list[str]:
    """Each committed results file under ``benchmarks/results`` whose figures (:func:`figures`)
    differ on disk from the version it is held to, or whose earlier stamps changed."""
    added: dict[str, str] = {}
    log = _git("log", "--diff-filter=A", "--format=@%H", "--name-only", "--", "benchmarks/results",
               repo=repo)  # fmt: skip
    commit = ""
    for line in (log or "").splitlines():
        if line.startswith("@"):
            commit = line[1:]
        elif line:
            added[line] = commit  # newest first: the last is the first add
    before = {c for c in set(added.values()) if _git("merge-base", "--is-ancestor", c, since,
                                                      repo=repo) is not None}  # fmt: skip
    found = []
    for path, commit in sorted(added.items()):
        if not path.endswith(".json") or path.endswith("samples.json"):
            continue
        if not (repo / path).exists():
            continue
        held = _git("show", f"{since if commit in before else commit}:{path}", repo=repo)
        if held is None:
            continue
        old, new = json.loads(held), json.loads((repo / path).read_text())
        stamped = json.loads(_git("show", f"HEAD:{path}", repo=repo) or "{}").get(STAMPS) or []
        if figures(old) != figures(new) or (new.get(STAMPS) or [])[: len(stamped)] != stamped:
            found.append(path)
    return found


def kind_order(kind: str) -> tuple[int, str]:
    """CPU kinds from the fewest bf16 and vector instructions to the most (a sort key)."""
    from volseg.utils.cpu import CPU_KINDS

    names = ["AVX2", *reversed([name for _, name in CPU_KINDS])]
    base = kind.split(",")[0]
    return (names.index(base) if base in names else len(names), kind)


def default_path(benchmark: str, device: str = "cpu", date: str | None = None) -> Path:
    """``benchmarks/results/<device>/<date>_<benchmark>.json`` (date: today)."""
    return RESULTS / device / f"{date or datetime.date.today().isoformat()}_{benchmark}.json"


def add_json_out(parser: argparse.ArgumentParser, benchmark: str, device: str = "cpu") -> None:
    """``--json-out PATH``: where the raw results go (default: :func:`default_path`;
    ``none``: nowhere)."""
    parser.add_argument(
        "--json-out",
        default=DEFAULT,
        metavar="PATH",
        help=f"raw results as JSON (default: {default_path(benchmark, device, 'DATE')}; "
        "'none': write nothing)",
    )


def output_path(json_out: str | Path | None, benchmark: str, device: str = "cpu") -> Path | None:
    """The file ``--json-out`` names: the default path, ``None`` for ``none``, or the path."""
    if json_out is None or str(json_out).lower() == "none":
        return None
    if str(json_out) == DEFAULT:
        return default_path(benchmark, device)
    return Path(json_out)


def command(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """The command line that reproduces the run: ``python -m benchmarks <name> <args>``, the
    name being the script's (``__file__``'s) stem."""
    args = list(sys.argv[1:] if argv is None else argv)
    return f"python -m benchmarks {Path(script).stem} {shlex.join(args)}".rstrip()


def cpu_description() -> str:
    """One line for logs and benchmark tables: model, cores, ISA flags, bf16 native or not."""
    from volseg.utils.cpu import cpu_bf16_native, cpu_flags, cpu_model

    flags = " ".join(f"{k}={'yes' if v else 'no'}" for k, v in cpu_flags().items())
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    cap = f", oneDNN capped at {capped}" if capped else ""
    native = "native" if cpu_bf16_native() else "emulated"
    return f"{cpu_model()} ({os.cpu_count()} cores; {flags}; bf16 {native}{cap})"


def machine(device: str = "cpu") -> dict[str, Any]:
    """The CPU (model, ISA flags, what torch dispatches to), torch, the GPU on ``cuda``."""
    import torch

    from volseg.utils.cpu import cpu_flags, cpu_model

    gpu = None
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "name": props.name,
            "cuda": torch.version.cuda,
            "memory_mib": props.total_memory // 2**20,
        }
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_description": cpu_description(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        # the ISA a run was held to (None: what the CPU has)
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
        "torch": torch.__version__,
        "gpu": gpu,
    }


def cpu_kind(doc: dict[str, Any]) -> str:
    """The kind of CPU a results file ran on (:func:`volseg.utils.cpu.kind_of`: ``AMX``,
    ``AVX512_BF16``, ``AVX-512``, ``AVX2``, and the ISA its kernels were held to). A file from
    before ``cpu_flags`` were recorded has them in its CPU's description (``avx2=yes ...``)."""
    from volseg.utils.cpu import ISA_FLAGS, kind_of

    flags = doc.get("cpu_flags")
    if not flags:
        text = f"{doc.get('cpu_description') or ''} {doc.get('cpu') or ''}"
        flags = {flag: f"{flag}=yes" in text for flag in ISA_FLAGS}
    return kind_of(flags, doc.get("onednn_max_cpu_isa"), doc.get("aten_cpu_capability"))


def result(
    benchmark: str,
    rows: list[dict[str, Any]],
    *,
    script: str | Path | None = None,
    argv: Sequence[str] | None = None,
    device: str = "cpu",
    **extra: Any,
) -> dict[str, Any]:
    """A results document: the head (:data:`HEAD`, the machine, the :func:`code`) then
    ``extra``."""
    return {
        "benchmark": benchmark,
        "date": datetime.date.today().isoformat(),
        "command": command(script or f"{benchmark}.py", argv),
        **machine(device),
        "code": code(benchmark),
        **extra,
        "rows": rows,
    }


def unused(path: Path) -> Path:
    """``path``, or the first of ``<stem>-2``, ``<stem>-3``, ... beside it that does not exist."""
    found, count = path, 1
    while found.exists():
        count += 1
        found = path.with_stem(f"{path.stem}-{count}")
    return found


def write(
    doc: dict[str, Any], json_out: str | Path | None, device: str = "cpu", name: str | None = None
) -> Path | None:
    """Write ``doc`` where ``--json-out`` says (:func:`output_path`; ``name``: the default
    file's name where it is not the benchmark's); the path, or ``None``."""
    name = name or doc["benchmark"]
    path = output_path(json_out, name, device)
    if path is None:
        return None
    if str(json_out) == DEFAULT:
        path = unused(path)  # a default write never replaces an earlier run's file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"Wrote {path}", flush=True)
    return path


def load(path: str | Path) -> dict[str, Any]:
    """A results file, checked for the head every file has."""
    doc = json.loads(Path(path).read_text())
    missing = [key for key in HEAD if key not in doc]
    if missing:
        raise ValueError(f"{path}: not a results file (no {', '.join(missing)})")
    return doc


def runs(benchmark: str, device: str = "cpu", root: Path = RESULTS) -> list[Path]:
    """Every ``<date>_<benchmark>[-N].json`` under ``root/<device>/``, oldest first."""
    pattern = re.compile(rf"(\d{{4}}-\d{{2}}-\d{{2}})_{re.escape(benchmark)}(?:-(\d+))?\.json")
    found = []
    for path in (root / device).glob("*.json"):
        match = pattern.fullmatch(path.name)
        if match:
            found.append((match[1], int(match[2] or 1), path))
    return [path for *_, path in sorted(found)]


def latest(benchmark: str, device: str = "cpu", root: Path = RESULTS) -> Path | None:
    """The newest of :func:`runs` (None: none yet)."""
    files = runs(benchmark, device, root)
    return files[-1] if files else None


#: the most characters of a command a table's caption quotes
COMMAND_WIDTH = 80


def machine_line(doc: dict[str, Any]) -> str:
    """One line naming the machine, torch, date and command of a results file, for a table's
    caption."""
    present = cpu_kind(doc)
    gpu = doc.get("gpu")
    where = f"{gpu['name']} (CUDA {gpu['cuda']}), host " if gpu else ""
    cores = f", {doc['cores']} cores" if doc.get("cores") else ""
    command = doc["command"]
    if len(command) > COMMAND_WIDTH:  # in full in the file; a caption stays one short line
        command = command[: COMMAND_WIDTH - 1].rstrip() + "…"
    return (
        f"{where}{doc['cpu']}{cores} ({present}), torch {doc['torch']}, {doc['date']}: `{command}`"
    )


def rel(path: Path) -> str:
    """``path`` relative to the repository, where it is inside it."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def pct(value: float) -> str:
    """``value`` as a signed percentage, its minus typographic (``+1.5%``, ``−2.0%``)."""
    return f"{value:+.1%}".replace("-", "−")


def held_isa(doc: dict) -> str:
    """The ISA a results file's run was held to (``ONEDNN_MAX_CPU_ISA=...``), or 'native'."""
    names = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")  # kept as their lower-case keys
    held = [f"`{name}={doc[name.lower()]}`" for name in names if doc.get(name.lower())]
    return " ".join(held) or "native"


def newest(benchmark: str, device: str = "cpu") -> Callable:
    """Make ``build(path, doc) -> str`` a table builder of ``results``: it builds from the newest
    results file of ``benchmark`` (None, the marker left as it is, while there is none)."""

    def wrap(build: Callable[[Path, dict], str]) -> Callable[[Path], str | None]:
        @functools.wraps(build)
        def table(results: Path) -> str | None:
            path = latest(benchmark, device, results)
            return None if path is None else build(path, load(path))

        return table

    return wrap


def every_file(benchmark: str, *header: str) -> Callable:
    """Make ``rows(path, doc) -> list[str]`` a table builder of ``results``: the ``header``
    lines, then the rows of every results file of ``benchmark``, oldest first (None while there
    is none)."""

    def wrap(rows: Callable[[Path, dict], list[str]]) -> Callable[[Path], str | None]:
        @functools.wraps(rows)
        def table(results: Path) -> str | None:
            paths = runs(benchmark, "cpu", results)
            if not paths:
                return None
            lines = list(header)
            for path in paths:
                lines += rows(path, load(path))
            return "\n".join(lines)

        return table

    return wrap
