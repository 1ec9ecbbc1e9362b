"""Registers :class:`ResumableOptunaSweeper` with Hydra where the ``sweeps`` extra is installed.

Hydra imports every module of ``hydra_plugins`` at start-up and warns about one that fails to
import; without Optuna this module registers nothing, and ``hparams_search=optuna`` names the
extra (:func:`volseg.utils.extras.check_plugin_choices`). The sweeper itself lives in
``_resumable_optuna`` (a leading underscore: Hydra's scanner skips it).
"""

from volseg.utils.extras import is_installed

if is_installed("optuna") and is_installed("hydra_plugins.hydra_optuna_sweeper"):
    from hydra_plugins.volseg_sweepers._resumable_optuna import ResumableOptunaSweeper

    __all__ = ["ResumableOptunaSweeper"]
