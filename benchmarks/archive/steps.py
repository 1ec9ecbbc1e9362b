"""One training step in memory, shared by the step benchmarks (``train_throughput``,
``memory_monitor_overhead``, ``step_profile``): the composed model, a fixed batch of
:data:`BATCH_SHAPE` (B, C, D, H, W), a step timer, the step's FLOPs and the CPU's matmul rate.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import hydra
import lightning as L
import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import IterableDataset
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.results_io import REPO
from volseg.plan import planned_config

#: the fixed batch (B, C, D, H, W): the numbers measure the step, not data loading
BATCH_SHAPE = (2, 1, 32, 64, 64)


def _best_rate(fn, flops: float, repeats: int = 10) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return flops / best


def matmul_flops_per_s(dtype: torch.dtype, n: int = 2048) -> dict[str, float]:
    """Matmul FLOP/s of this machine in ``dtype`` (2 n^3 FLOPs per n x n product), per library.

    torch.mm calls MKL's sgemm for float32 (on AMD CPUs it does not reach the chip's peak) and
    oneDNN for bfloat16; oneDNN is also the library behind PyTorch's CPU convolutions. The peak
    of a dtype is the fastest of them.
    """
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    rates = {"torch.mm": _best_rate(lambda: a @ b, 2 * n**3)}
    if torch.backends.mkldnn.is_available():
        am, bm = a.to_mkldnn(), b.t().contiguous().to_mkldnn()
        rates["onednn"] = _best_rate(lambda: torch._C._nn.mkldnn_linear(am, bm, None), 2 * n**3)
    return rates


def build_module(
    model: str, channels_last: bool, extra: list[str] | None = None
) -> L.LightningModule:
    overrides = [
        f"model={model}",
        "model.scheduler=null",
        f"model.channels_last={channels_last}",
        *(extra or []),
    ]
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        cfg = compose("train", overrides=overrides)
    return hydra.utils.instantiate(planned_config(cfg).model)  # pooling=auto planned


class RepeatBatch(IterableDataset):
    """The same in-memory batch, ``steps`` times."""

    def __init__(self, batch: dict[str, torch.Tensor], steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for _ in range(self.steps):
            yield self.batch


class StepTimer(L.Callback):
    """Wall time from the start of step ``warmup`` to the end of the last step."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end = warmup, 0.0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.end = time.perf_counter()


def make_batch(channels_last: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    image = torch.randn(BATCH_SHAPE, generator=generator)
    label = torch.randint(0, 5, (BATCH_SHAPE[0], 1, *BATCH_SHAPE[2:]), generator=generator)
    if channels_last:
        image = image.contiguous(memory_format=torch.channels_last_3d)
    return {"image": image, "label": label.float()}


def flops_per_step(module: L.LightningModule, batch: dict) -> int:
    """Forward + backward FLOPs of one training step (convolutions and matmuls)."""
    net = copy.deepcopy(module.net)
    with FlopCounterMode(display=False) as counter:
        module.loss(net(batch["image"]).float(), batch["label"]).backward()
    return counter.get_total_flops()
