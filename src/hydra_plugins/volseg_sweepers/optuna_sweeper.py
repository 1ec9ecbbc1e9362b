"""Registers volseg's :class:`OptunaSweeper` with Hydra where Optuna is installed.

Hydra imports every module of ``hydra_plugins`` at start-up and warns about one that fails to
import; without Optuna this module registers nothing, and ``hparams_search=optuna`` names the
``sweeps`` extra (:func:`volseg.utils.extras.check_plugin_choices`). The sweeper itself lives in
``_optuna_sweeper`` (a leading underscore: Hydra's scanner skips it).
"""

from volseg.utils.extras import is_installed

if is_installed("optuna"):
    from hydra_plugins.volseg_sweepers._optuna_sweeper import OptunaSweeper

    __all__ = ["OptunaSweeper"]
