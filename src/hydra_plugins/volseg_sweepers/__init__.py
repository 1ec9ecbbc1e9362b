"""Hydra plugins of volseg (Hydra loads plugins only from the ``hydra_plugins`` package)."""
