"""Lightning callbacks that are not about memory (the memory monitor is in ``volseg.memory``)."""

__all__ = [
    "last_checkpoint",
    "overlays",
    "prediction_writer",
    "run_summary",
    "validation_budget",
]
