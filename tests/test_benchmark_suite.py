"""benchmarks/ as a suite: one runner by name, one harness for train.py, no script importing
another, and the commands the docs give name benchmarks that exist."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from benchmarks import harness, results_io
from benchmarks.runner import BENCHMARKS, RETIRED
from tests.conftest import REPO, TINY
from volseg.utils.units import MIB

BENCHMARKS_DIR = REPO / "benchmarks"

# the benchmarks' tiny config as a whole train.py run of 3 steps: it takes seconds
TINY_RUN = [
    "trainer=cpu",
    *TINY,
    "trainer.max_steps=3",
    "trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "memory.every_n_steps=1",
    "logger=csv",
    "extras.print_config=false",
]


def _benchmarks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], cwd=REPO, capture_output=True, text=True
    )


def test_list_names_every_benchmark_once_by_kind():
    out = _benchmarks("--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for name, entry in BENCHMARKS.items():
        (line,) = [line for line in lines if line.split()[:1] == [name]]
        assert entry.measures in line
    for name, old in RETIRED.items():  # a retired study: what it measured, where it is
        (line,) = [line for line in lines if line.split()[:1] == [name]]
        assert line.endswith(f"{old.measured} ({old.commit[:12]}:{old.path})")
    # the kinds apart, in order: maintained, then the tools, then the retired studies
    headings = [i for i, line in enumerate(lines) if line.endswith(":")]
    assert len(headings) == 3
    kinds = list(zip(headings, ("maintained", "tool", "retired"), strict=True))
    kind_at = {
        i: max((h, k) for h, k in kinds if h < i)[1]
        for i, line in enumerate(lines)
        if line.startswith("  ")
    }
    for i, kind in kind_at.items():
        name = lines[i].split()[0]
        assert (BENCHMARKS[name].kind if name in BENCHMARKS else "retired") == kind


def test_each_name_is_a_module_with_main_in_benchmarks():
    for name, entry in BENCHMARKS.items():
        path = BENCHMARKS_DIR / f"{name}.py"
        assert entry.module == ".".join(path.relative_to(REPO).with_suffix("").parts), name
        tree = ast.parse(path.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), name


def test_an_unknown_name_is_one_line_naming_it_and_the_known_ones_exit_2():
    out = _benchmarks("no_such_benchmark", "--x")
    assert out.returncode == 2
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert "'no_such_benchmark'" in line
    assert all(name in line for name in BENCHMARKS)


def test_a_retired_name_is_one_line_saying_where_its_script_is_exit_2():
    out = _benchmarks("real_data", "--help")
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    old = RETIRED["real_data"]
    assert f"git show {old.commit}:{old.path}" in line


def _imports(path) -> list[str]:
    """Every module a file imports (``from benchmarks import x``: ``benchmarks.x``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else "benchmarks." + node.module
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def _sources():
    return sorted(BENCHMARKS_DIR.rglob("*.py"))


def test_no_module_of_benchmarks_edits_sys_path():
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path":
                assert not (isinstance(node.value, ast.Name) and node.value.id == "sys"), path


def test_no_benchmark_imports_another():
    """A benchmark or study imports shared modules (harness, grid, results_io, ...), never
    another benchmark or study: what two of them share lives in a shared module."""
    modules = {entry.module: name for name, entry in BENCHMARKS.items() if entry.kind != "tool"}
    for name, entry in BENCHMARKS.items():
        if entry.kind == "tool":
            continue
        path = REPO.joinpath(*entry.module.split(".")).with_suffix(".py")
        found = {modules[m] for m in _imports(path) if m in modules} - {name}
        assert not found, f"{name} imports {found}"


def test_byte_units_come_from_volseg():
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                assert not names & {"KIB", "MIB", "GIB"}, path


def test_what_the_gpu_machine_runs_imports_without_hydra_monai_or_nibabel():
    """The GPU machine has torch, not hydra-core, omegaconf, monai, nibabel or wandb (until
    gpu_checks.sh installs the wheels): the runner and gpu_train_speed import without them."""
    hide = "hydra", "omegaconf", "monai", "nibabel", "wandb"
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({hide!r})); "
        "import benchmarks.runner, benchmarks.gpu_train_speed; "
        "sys.exit(benchmarks.runner.main(['--list']))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    script = (BENCHMARKS_DIR / "gpu_checks.sh").read_text()
    named = re.findall(r"python3? -m benchmarks (\w+)", script)
    assert {"cuda_results", "gpu_train_speed", "cpu_bf16_conv"} <= set(named)
    assert "benchmarks/" not in " ".join(re.findall(r"python3? \S+\.py", script))


COMMAND = re.compile(r"python3? -m benchmarks (?!--)([\w.]+)|python3? benchmarks/([\w/]+)\.py")


def test_every_benchmark_command_in_the_docs_names_one_that_exists():
    """``python -m benchmarks <name>`` (and an older ``python benchmarks/<name>.py``) in
    README.md and docs/*.md: each names a benchmark of the runner or a retired one (which the
    runner says where to find). A results file records the command that wrote it; a docs table
    quoting one is regenerated from the file."""
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for match in COMMAND.finditer(doc.read_text()):
            name = match.group(1) or match.group(2)
            if name not in BENCHMARKS and name not in RETIRED:
                missing.append(f"{doc.name}: {match.group(0)}")
    assert not missing, sorted(set(missing))


def _writer(path, doc) -> str | None:
    """The benchmark whose command wrote a results file (``python -m benchmarks <name>`` or an
    older ``python benchmarks/<name>.py``), else the one it names."""
    found = COMMAND.search(doc.get("command") or "")
    return (found.group(1) or found.group(2)) if found else results_io.benchmark_of(path, doc)


def test_every_results_file_names_a_benchmark_that_runs_or_says_where_it_is():
    """No benchmark of a results file is lost: it runs by name, or it is retired and
    :data:`RETIRED` gives the commit and path ``git show`` brings its script back from."""
    for path in sorted(results_io.RESULTS.rglob("*.json")):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or not ("command" in doc or path.name in results_io.UNNAMED):
            continue  # nnU-Net's own plans, the sample index
        writer, named = _writer(path, doc), results_io.benchmark_of(path, doc)
        for name in {writer, named} - {"cuda_grid_estimates"}:  # cuda_results --estimate's
            assert name in BENCHMARKS or name in RETIRED, f"{path.name}: {name}"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


def test_each_retired_script_is_at_its_commit_and_path():
    """``git show COMMIT:PATH`` brings each retired script back (not from a shallow clone)."""
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("no full git history here")
    for name, old in RETIRED.items():
        assert not (REPO / old.path).exists(), name  # retired: not in the tree
        assert _git("cat-file", "-e", f"{old.commit}:{old.path}").returncode == 0, name


def test_a_name_runs_its_main_with_the_arguments_after_it():
    out = _benchmarks("draw_grid", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m benchmarks draw_grid")
    out = _benchmarks("tables", "--check")  # the committed docs tables are their files'
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_the_harness_reads_a_real_train_py_run(tmp_path):
    overrides = [*TINY_RUN, f"paths.data_dir={tmp_path / 'data'}"]
    run = harness.train(overrides, tmp_path / "run", tmp_path)
    assert run.run_dir == tmp_path / "run" and run.pid > 0
    assert run.seconds > 0
    assert run.summary is not None and run.summary["global_step"] == 3
    steps = harness.step_rises(harness.monitor_rows(run.rows), 1)
    # the first step allocates its activations; a later one may reuse freed heap memory (glibc,
    # no MALLOC_MMAP_THRESHOLD_ here), and pages the allocator hands back to the system between
    # the step's first sample and its peak can make its resident rise a little below 0
    assert len(steps) == 3 and steps[0]["growth"] > MIB
    assert all(s["growth"] > -MIB for s in steps[1:])
    steady = harness.steady_step(run, 1, 3)
    assert steady["rises"] == [s["growth"] for s in steps]
    assert steady["growth"] == max(s["growth"] for s in steps[1:])


def test_a_failed_or_overlong_run_raises_with_its_stderr(tmp_path):
    with pytest.raises(harness.RunFailed, match="no_such_key"):
        harness.train(["no_such_key=1"], tmp_path / "run", tmp_path)
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(30)\n")
    with pytest.raises(harness.TimedOut) as stopped:
        harness.run(str(script), [], tmp_path, timeout=0.5)
    assert stopped.value.timeout == 0.5 and not harness._CHILDREN


def _measured_record():
    from benchmarks import grid
    from volseg.utils.units import MIB

    predicted = {
        "network": "volseg.models.unet.UNet3D",
        "batch_size": 2,
        "patch_size": [16, 32, 32],
        "precision": "32",
        "num_parameters": 1000,
        "growth": 150 * MIB,
        "process_total": 400 * MIB,
    }
    measured = {"growth": 100 * MIB, "rises": [120 * MIB, 100 * MIB, 90 * MIB], "seconds": 3.14}
    return grid.record("a", "held out", ["data.batch_size=2"], predicted, measured)


def test_a_grid_record_has_the_shape_of_the_committed_results():
    """estimator_accuracy and network_levers write :func:`grid.record`; tables.py reads the
    committed files: a record keeps their keys (``grid`` is added per file)."""
    from volseg.utils.units import MIB

    record = _measured_record()
    assert record["error"] == pytest.approx(0.5)  # 150 estimated against 100 measured
    assert record["estimated_bytes"] == 150 * MIB and record["measured_bytes"] == 100 * MIB
    assert record["measured_rises_bytes"] == [120 * MIB, 100 * MIB, 90 * MIB]
    assert record["run_seconds"] == 3.1 and record["sample"] == "held out"
    committed = sorted((BENCHMARKS_DIR / "results" / "cpu").glob("*_estimator_accuracy*.json"))
    rows = [r for r in json.loads(committed[-1].read_text())["rows"] if "error" in r]
    assert {*record, "grid"} == set(rows[0])


def test_a_resumed_grid_keeps_its_measured_configs_without_running_them(tmp_path, capsys):
    from benchmarks import grid

    kept = _measured_record()
    rows = grid.run_grid(
        [("a", ["data.batch_size=2"])], "g", "cpu", tmp_path, "held out", done={"a": kept}
    )
    assert rows == [kept]
    assert "(kept from the resumed file)" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_the_planner_checks_budget_is_a_share_of_the_total_or_of_the_growth():
    from benchmarks import grid

    configured = {"process_total": 200 * MIB, "held_at_start": 50 * MIB, "growth": 150 * MIB}
    assert grid.check_budget(configured, 0.85) == 170 * MIB
    assert grid.check_budget(configured, 0.85, growth_fraction=0.6) == 140 * MIB  # 50 + 90
    configured["growth"] = 151 * MIB  # 50 + 90.6: whole MiB, rounded down
    assert grid.check_budget(configured, 0.85, growth_fraction=0.6) == 140 * MIB


def test_only_naming_no_config_is_one_line_and_exit_2_before_any_run(capsys):
    from benchmarks import estimator_accuracy

    with pytest.raises(SystemExit) as stopped:
        estimator_accuracy.main(["--grid", "monai-unets", "--only", "no such config"])
    assert stopped.value.code == 2
    out = capsys.readouterr()
    assert "--only no such config: no config of --grid monai-unets" in out.err
    assert "estimator accuracy" not in out.out  # nothing started


def test_a_plan_train_py_refuses_is_recorded_and_the_grid_goes_on(tmp_path, monkeypatch, capsys):
    """The planner check trains the plan it got; where train.py refuses that plan, the row
    records the refusal (a finding about the planner) and the next config still runs."""
    from benchmarks import grid, harness

    predicted = {
        "network": "n",
        "batch_size": 2,
        "patch_size": [16, 32, 32],
        "precision": "32",
        "num_parameters": 1,
        "growth": 10 * MIB,
        "process_total": 20 * MIB,
        "accumulate_grad_batches": 1,
    }
    measured = {"growth": 10 * MIB, "rises": [10 * MIB], "seconds": 1.0}
    monkeypatch.setattr(grid, "predict", lambda *args, **kwargs: predicted)
    monkeypatch.setattr(grid, "measure", lambda *args, **kwargs: measured)
    checked = []

    def refused(overrides, *args, **kwargs):
        checked.append(overrides)
        raise harness.RunFailed("train.py failed (2):\nerror: data.augment.rotate90_planes: ...")

    monkeypatch.setattr(grid, "plan_under_budget", refused)
    configs = [("a", ["data.batch_size=2"]), ("b", ["data.batch_size=1"])]
    rows = grid.run_grid(configs, "g", "cpu", tmp_path, "in sample", planner=True)
    assert [r["name"] for r in rows] == ["a", "b"] and len(checked) == 2
    assert rows[0]["planner"] == {"failed": "error: data.augment.rotate90_planes: ..."}
    assert rows[0]["error"] == 0.0  # the estimate's own row is kept
    assert "planner check failed: error: data.augment" in capsys.readouterr().out


# -- every results file tied to its code; no cited estimate made by other code ------------------


def _tree(root, files: dict[str, str]):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_results_file_carries_its_commit_dirty_flag_and_source_hash():
    """The head names the code: the commit checked out, whether the tree differed from it, and
    a hash of the source that decides the figure (the estimator's: src/volseg/memory)."""
    from benchmarks import results_io

    doc = results_io.result("estimator_accuracy", [], argv=[])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert doc["code"]["commit"] == head.stdout.strip()
    assert isinstance(doc["code"]["dirty"], bool)
    assert list(doc["code"]["sources"]) == ["src/volseg/memory"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", doc["code"]["sources"]["src/volseg/memory"])
    # any other benchmark: the whole package decides its figures
    assert list(results_io.result("data_throughput", [], argv=[])["code"]["sources"]) == [
        "src/volseg"
    ]


def test_the_source_hash_changes_with_a_byte_of_the_code_and_only_with_it(tmp_path):
    from benchmarks import results_io

    a = _tree(tmp_path / "a", {"src/m/x.py": "x = 1\n", "src/m/sub/y.py": "y = 2\n"})
    b = _tree(tmp_path / "b", {"src/m/x.py": "x = 1\n", "src/m/sub/y.py": "y = 2\n"})
    assert results_io.source_hash("src/m", a) == results_io.source_hash("src/m", b)
    (b / "src/m/sub/y.py").write_text("y = 3\n")
    assert results_io.source_hash("src/m", a) != results_io.source_hash("src/m", b)
    (b / "src/m/sub/y.py").write_text("y = 2\n")
    (b / "src/m/sub/y.py").rename(b / "src/m/z.py")  # same bytes, another file: other code
    assert results_io.source_hash("src/m", a) != results_io.source_hash("src/m", b)


def test_a_cpu_held_to_avx2_stands_in_for_an_avx2_cpu_and_amx_for_none():
    from benchmarks import restamp
    from volseg.utils.cpu import cpu_flags, kind_of

    if not cpu_flags().get("avx2"):
        pytest.skip("this CPU has no AVX2")
    assert restamp.reproducing_env("AVX2") == restamp.HELD_TO_AVX2
    assert restamp.reproducing_env(kind_of(cpu_flags())) == {}
    held = kind_of(cpu_flags(), "AVX512_CORE_VNNI")  # this CPU held: reproduced by the same hold
    assert restamp.reproducing_env(held) == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}
    both = kind_of(cpu_flags(), "AVX2", "avx2")
    assert restamp.reproducing_env(both) == restamp.HELD_TO_AVX2
    if not cpu_flags().get("amx_bf16"):
        assert restamp.reproducing_env("AMX") is None


def test_a_two_part_margin_by_hand():
    """100 MiB estimated / 110 measured and 1,000 / 1,020: one share would be 10% (100 MiB
    withheld at 1,000); the two parts through both runs, share (20 - 10) / 900 = 1.11%, fixed
    10 - 1.11 = 8.89 MiB, rounded up: 8.9 MiB + 1.2%, 21 MiB withheld at 1,000."""
    from benchmarks import two_part

    runs = [(100 * MIB, 110 * MIB), (1000 * MIB, 1020 * MIB)]
    assert two_part.fit(runs) == (8.9, 0.012)
    assert all(two_part.covered(8.9, 0.012, e, m) for e, m in runs)
    assert not two_part.covered(8.8, 0.011, 100 * MIB, 110 * MIB)
    assert two_part.fit([(100 * MIB, 90 * MIB)]) == (0.0, 0.0)  # estimate above: none
    assert two_part.fit([(100 * MIB, 150 * MIB)]) == (0.0, 0.5)  # one run: as a share
    assert two_part.margin_bytes(1.0, 0.5, 10) == MIB + 5


def test_the_cpu_margins_leave_one_out_says_whether_each_kinds_worst_run_is_covered():
    """AVX2's runs, 100/110 (worst), 1000/1020 and 500/505: without the worst, the fit on the
    other two: 20 / 1000 = 2% covers both (fixed 0), where the two parts through them would
    need a fixed part below 0: 100 x 1.02 = 102 < 110, not covered."""
    from benchmarks import cpu_margins

    def step(config, e, m):
        return {"file": "f", "grid": "tuned", "config": config, "kind": "AVX2",
                "estimated": e * MIB, "measured": m * MIB}  # fmt: skip

    steps = [step("small", 100, 110), step("large", 1000, 1020), step("mid", 500, 505)]
    loo = cpu_margins.leave_one_out(steps)
    assert loo["two_part_by_kind"]["AVX2"]["worst"] == "small"
    assert loo["two_part_by_kind"]["AVX2"]["worst_covered"] is False
    small = next(r for r in loo["runs"] if r["config"] == "small")
    assert (small["fixed_mib_without_it"], small["share_without_it"]) == (0.0, 0.02)
    fitted = cpu_margins.fit(steps)["AVX2"]
    assert all(
        s["estimated"] + fitted["fixed_mib"] * MIB + fitted["share"] * s["estimated"]
        >= s["measured"]
        for s in steps
    )


def test_the_maintained_suite_is_at_most_6850_lines():
    """benchmarks/ outside its results: the code a reader maintains (5,000 until every cited
    figure was checked against its sources, results files held append-only and each CPU kind's
    margin text said what it applies: 5,226; 6,369 since the studies that are run again when
    code changes came in from the archive, lever_time_factors, levers_estimated,
    selective_checkpointing and cpu_bf16_conv, with the readers of the retired studies' results
    files into tables.py, and the archive left the tree; 6,832 with fastest_fit, the fastest
    fit's pick against every candidate trained)."""
    files = [
        p
        for p in BENCHMARKS_DIR.rglob("*.py")
        if not {"results", "__pycache__"} & set(p.relative_to(BENCHMARKS_DIR).parts)
    ]
    lines = sum(len(p.read_text().splitlines()) for p in files)
    assert lines <= 6850, f"benchmarks/: {lines} maintained lines, at most 6850"


def test_restamp_stamps_a_file_whose_bytes_stay_and_writes_a_new_one_where_they_change(
    tmp_path, monkeypatch
):
    """Append-only: the same bytes again add a stamp to the file and change nothing else; a
    measured row's new estimate (150 MiB against 100 measured: +50%), in ``rows`` and in
    ``grids`` alike, goes into a new file that names the old one, which stays as it was; a row
    whose estimate stays is not listed as changed; a failed row stays as it was."""
    from benchmarks import grid, restamp, results_io

    predicted = {("x=1",): 60 * MIB, ("x=2",): 80 * MIB}
    monkeypatch.setattr(
        grid,
        "predict",
        lambda overrides, device, work: {
            "growth": predicted[tuple(overrides)],
            "process_total": 200 * MIB,
        },
    )
    rows = [
        {"grid": "tuned", "name": "a", "overrides": ["x=1"], "estimated_bytes": 60 * MIB,
         "measured_bytes": 100 * MIB, "error": -0.4},
        {"grid": "tuned", "name": "b", "overrides": ["x=2"], "estimated_bytes": 80 * MIB,
         "measured_bytes": 80 * MIB, "error": 0.0},
        {"grid": "tuned", "name": "c", "overrides": ["x=3"], "failed": "ran past"},
    ]  # fmt: skip
    doc = results_io.result("estimator_accuracy", rows, argv=[])
    doc["grids"], doc["date"] = {"tuned": [dict(r) for r in rows]}, "2026-01-01"
    path = tmp_path / "cpu" / "2026-01-01_estimator_accuracy.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    assert restamp.re_estimate(path, {}) == ([], path)
    stamped = json.loads(path.read_text())
    assert results_io.figures(stamped) == doc
    assert restamp.stamp(stamped) == results_io.source_hash("src/volseg/memory")

    predicted[("x=1",)] = 150 * MIB
    changed, new = restamp.re_estimate(path, {})
    assert changed == ["a"] and new != path and new.parent == path.parent
    assert json.loads(path.read_text()) == stamped  # the old file as it was
    again = json.loads(new.read_text())
    for kept in (again["rows"], again["grids"]["tuned"]):
        a, b, c = kept
        assert (a["measured_bytes"], a["estimated_bytes"]) == (100 * MIB, 150 * MIB)
        assert a["error"] == pytest.approx(0.5) and b["estimated_bytes"] == 80 * MIB
        assert c == rows[2]
    assert again["estimates"]["changed"] == ["a"]
    assert again["re_estimate_of"].endswith(path.name)
    assert again["date"] == again["estimates"]["date"] > doc["date"] == "2026-01-01"
    assert restamp.stamp(again) == results_io.source_hash("src/volseg/memory")


def test_rules_off_turns_the_named_rules_off_and_restores_every_rule_after_an_error():
    from benchmarks import rule_effects
    from volseg.memory.estimate.workspace import RULES

    with pytest.raises(RuntimeError), rule_effects.rules_off("softmax_copy", "max_pool_layout"):
        off = [rule for rule, on in RULES.items() if not on]
        raise RuntimeError
    assert off == ["softmax_copy", "max_pool_layout"]
    assert all(RULES.values())
    with pytest.raises(KeyError, match="softmax_cpy"):
        rule_effects.rules_off("softmax_cpy")


def test_every_rule_names_the_commit_that_added_it():
    """A rule added to the estimator without its commit in ADDED could never be listed as added
    since a grid; each commit is in this checkout's history."""
    from benchmarks import rule_effects
    from volseg.memory.estimate.workspace import RULES

    assert list(rule_effects.ADDED) == list(RULES)
    assert rule_effects.added_between(None, None) == list(RULES)
    # the softmax and pooling rules came after held-out-2026-12-06 was frozen (51ec6cf) and
    # before held-out-2026-12-07 (7d23eb9); the bf16 weight gradient's after held-out-2026-12-08
    # was frozen (a07cf7d), which tests it
    assert rule_effects.added_between("51ec6cf", "7d23eb9") == ["softmax_copy", "max_pool_layout"]
    assert rule_effects.added_between("7d23eb9", None) == ["bf16_weight_gradient"]
    assert not rule_effects.added_between("7d23eb9", "a07cf7d")
    # a grid tests the rules in the code that first measured it: held-out-2026-12-08 the bf16
    # rule, landed between its freezing and its run; one measured before runs recorded their
    # code (held-out-2026-12-06) is judged by its freezing
    measured = rule_effects.first_measured("held-out-2026-12-08")
    assert rule_effects.added_between("7d23eb9", measured) == ["bf16_weight_gradient"]
    assert rule_effects.first_measured("held-out-2026-12-06") is None


# unet_tiny in float32, a batch of two of 16x32x32, 32 classes: the step peaks in the loss,
# whose log-softmax takes the logits, on every CPU kind (at batch 1 or in half precision an AVX2
# CPU's convolutions run on native kernels whose buffers are the peak); an estimate takes seconds
SMALL_STEP = [
    "data.batch_size=2",
    "data.patch_size=[16,32,32]",
    "trainer.precision=32",
    "num_classes=32",
]


def test_the_report_finds_the_softmax_rule_where_the_logits_are_channels_last(tmp_path):
    """The loss's softmax copies channels-last logits only: the estimate without the rule is
    lower for model.channels_last=true, and the same for the NCDHW network."""
    from benchmarks import rule_effects

    last = rule_effects.row_effects(
        [*SMALL_STEP, "model.channels_last=true"], tmp_path, ["softmax_copy"]
    )
    assert list(last["without"]) == ["softmax_copy"]
    assert last["without"]["softmax_copy"] < last["estimated_bytes"]
    plain = rule_effects.row_effects(SMALL_STEP, tmp_path, ["softmax_copy"])
    assert plain["without"] == {}


def test_the_report_of_an_unknown_grid_is_one_line_and_exit_2(capsys):
    from benchmarks import rule_effects

    with pytest.raises(SystemExit) as exited:
        rule_effects.main(["--grid", "held-out-1999-01-01", "--json-out", "none"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "rule_effects: no held-out grid held-out-1999-01-01 in benchmarks/grids"
    ]
