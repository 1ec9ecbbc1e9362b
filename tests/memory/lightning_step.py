"""Two real optimizer steps of ``trainer.fit`` on the CPU, measured in a fresh process: what the
estimator's Lightning loop (accumulation, clipping) is checked against.

``python -m tests.memory.lightning_step OVERRIDE...`` composes the ``train`` config with the
overrides, builds the module as ``train.py`` does, fits two optimizer steps on random batches
with the config's trainer settings and prints, as JSON, how far the process's resident memory
(VmHWM, reset through /proc/self/clear_refs) rose during the second step above what it held at
its start. Run it with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors leave the resident
set at once (:func:`measure_fit` does).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def measure_fit(overrides: list[str]) -> dict[str, int]:
    """The second optimizer step's peak rise (bytes) of a real ``trainer.fit`` of the config."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, "-m", "tests.memory.lightning_step", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(overrides: list[str]) -> None:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from tests.conftest import planned_config
    from volseg.memory.monitor.readers import HostMemoryReader
    from volseg.models.build import build_model
    from volseg.utils.instantiate import build

    cfg = planned_config("train", Path(tempfile.mkdtemp()), overrides)  # as train.py plans it
    k = int(cfg.trainer.accumulate_grad_batches)
    batch, channels = int(cfg.data.batch_size), int(cfg.in_channels)
    patch = [int(p) for p in cfg.data.patch_size]
    torch.manual_seed(0)
    samples = [
        {
            "image": torch.randn(channels, *patch),
            "label": torch.randint(0, int(cfg.num_classes), (1, *patch)).float(),
        }
        for _ in range(2 * k * batch)
    ]
    reader = HostMemoryReader()
    readings: dict[str, int] = {}

    class SecondStep(L.Callback):
        """Resets the peak where the second optimizer step's first micro-batch starts, reads it
        where its last micro-batch ends."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
            if batch_idx == k:
                gc.collect()
                readings["start"] = reader.read().allocated
                reader.reset_peak()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            if batch_idx == 2 * k - 1:
                readings["peak"] = reader.read().peak_allocated

    model = build_model(cfg)
    trainer = build(
        cfg.trainer,
        "trainer",
        callbacks=[SecondStep()],
        logger=False,
        accelerator="cpu",
        max_steps=2,
        max_epochs=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=DataLoader(samples, batch_size=batch))
    assert trainer.global_step == 2
    print(json.dumps({"growth": readings["peak"] - readings["start"]}))


if __name__ == "__main__":
    main(sys.argv[1:])
