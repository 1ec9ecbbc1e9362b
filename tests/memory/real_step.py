"""A real training step on the CPU, measured by torch's MemTracker: what estimates are checked
against."""

from __future__ import annotations

import torch

from volseg.memory import Candidate
from volseg.memory.estimate.training_step import build_training_step
from volseg.memory.monitor.layers import LayerTrace
from volseg.plan import RunPlan


def real_step_peak(cfg, batch_size: int | None = None) -> dict[str, int]:
    """Peak bytes per category of two real training steps of the planned ``cfg`` (random data),
    at ``batch_size`` where given."""
    torch.manual_seed(0)
    run_cfg = RunPlan(cfg, {}).run_config(Candidate(batch_size=batch_size))
    step = build_training_step(run_cfg, "cpu")
    num_classes = int(cfg.num_classes)

    def new_batch(image_shape, label_shape, dtype):
        label = torch.randint(0, num_classes, label_shape).to(dtype)
        return torch.randn(image_shape, dtype=dtype), label

    trace = LayerTrace(step.module, [step.optimizer], [])
    trace.start()
    try:
        step.run(
            2,
            new_batch,
            before_update=trace.optimizer_update_begins,
            on_micro_batch_start=trace.tracker.reset_mod_stats,
        )
    finally:
        trace.stop()
    return trace.peak()
