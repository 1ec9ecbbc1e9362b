"""Whole-volume inference's memory, asked of a planned config: validation inside ``train.py``
(the engine's answer, :func:`volseg.memory.engine.estimate_run`: after the run's training steps,
in the same trace) and ``predict.py`` (its own trace), with the names their readers use
(:mod:`volseg.memory.inference_trace`: how inference is traced and read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from volseg.memory.engine import Variant, estimate_config
from volseg.memory.inference_trace import (
    InferenceEstimate,
    estimate_prediction,
    format_inference,
    format_run_peak,
    stitching_bytes,
    validation_shape,
    whole_volume,
    window_count,
)

__all__ = [
    "InferenceEstimate",
    "estimate_prediction",
    "estimate_validation",
    "format_inference",
    "format_run_peak",
    "stitching_bytes",
    "validation_shape",
    "whole_volume",
    "window_count",
]


def estimate_validation(
    cfg: DictConfig, volume_shape: Sequence[int], settings: Any = None
) -> InferenceEstimate:
    """Predicted memory of validating one volume of ``volume_shape`` ``[D, H, W]`` in a
    ``train.py`` run of ``cfg`` (planned), after two training steps; ``settings``: the
    ``estimate`` config (``cuda_context_mib``, ``gpu``; default ``cfg.estimate``). The engine's
    (:func:`volseg.memory.engine.estimate_config`): the step's estimate is in the same trace."""
    validation = estimate_config(cfg, Variant(), whole_volume(volume_shape), settings).validation
    assert validation is not None  # a shape was given
    return validation
