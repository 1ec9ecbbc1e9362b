"""The text a user sees when a training step runs out of GPU memory."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from lightning.pytorch import LightningModule

from volseg.memory.monitor.readers import CudaMemoryReader, HostMemoryReader, MemoryReading
from volseg.models.levers import lever_lines
from volseg.utils.units import MIB

LEVERS = (
    "Levers to try, roughly in this order:",
    *lever_lines("train"),
    "  Parameters and optimizer state of a 3D U-Net are small next to its activations: a smaller "
    "network (fewer parameters) barely moves the peak.",
)
#: what to try when whole-volume inference (validation, prediction) runs out of memory
INFERENCE_LEVERS = ("Levers to try for whole-volume inference:", *lever_lines("inference"))


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def oom_report(
    reader: CudaMemoryReader | HostMemoryReader | None,
    start: MemoryReading | None,
    phase_peaks: dict[str, MemoryReading],
    history: list[dict[str, float]],
    module: LightningModule,
    stage: str,
) -> str:
    """Memory of the failing step (what is known of it), by category, and the levers;
    ``stage``: Lightning's running stage (outside training the phases are not the failure's)."""
    names = {"sanity_check": "the sanity-check validation", "validate": "validation"}
    inference = f"{names.get(stage, stage)} (sliding-window inference)"
    lines = [f"CUDA out of memory in {'a training step' if stage == 'train' else inference}."]
    now = reader.read() if reader is not None else None
    if now is not None:
        lines.append(
            f"  now: allocated {now.allocated / MIB:.0f} MiB, reserved {now.reserved / MIB:.0f} "
            f"MiB, peak allocated {now.peak_allocated / MIB:.0f} MiB"
        )
    if stage != "train":
        return "\n".join([*lines, *INFERENCE_LEVERS])
    if start is not None:
        lines.append(f"  at step start: allocated {start.allocated / MIB:.0f} MiB")
    done = ", ".join(f"{p} peak {r.peak_allocated / MIB:.0f} MiB" for p, r in phase_peaks.items())
    running = next((p for p in ("fwd", "bwd", "opt") if p not in phase_peaks), "opt")
    lines.append(f"  failed during: {running}" + (f" (finished: {done})" if done else ""))
    if history:
        last = history[-1]
        lines.append(
            f"  last logged step {int(last['step'])}: peak allocated "
            f"{last['mem/peak_allocated_mib']:.0f} MiB (fwd {last.get('mem/peak_fwd_mib', 0):.0f}, "
            f"bwd {last.get('mem/peak_bwd_mib', 0):.0f}, opt {last.get('mem/peak_opt_mib', 0):.0f})"
        )
    params = list(module.parameters())
    state = (t for opt in module.trainer.optimizers for s in opt.state.values() for t in s.values())
    categories = {  # bytes held now
        "params": _nbytes(params),
        "grads": _nbytes(p.grad for p in params if p.grad is not None),
        "optimizer_state": _nbytes(t for t in state if isinstance(t, torch.Tensor)),
    }
    parts = ", ".join(f"{k} {v / MIB:.0f} MiB" for k, v in categories.items())
    lines.append(f"  by category: {parts}")
    if now is not None:
        rest = max(now.peak_allocated - sum(categories.values()), 0)
        lines.append(f"  activations + temporaries (the rest of the peak): {rest / MIB:.0f} MiB")
    lines.extend(LEVERS)
    return "\n".join(lines)
