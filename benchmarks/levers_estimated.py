"""The memory levers on the seed config, estimated for a GPU (no GPU needed).

unet_large (40.2M parameters), batch 2 of 1x26x150x320, 5 classes, AdamW, float16 autocast as the
baseline; each lever and combination is estimated by ``volseg.memory.estimator`` for CUDA (CUDA's
autocast rules, caching-allocator model). Prints a Markdown table: peak allocated and reserved,
and the baseline's peak divided by the lever's.

    python benchmarks/levers_estimated.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("PROJECT_ROOT", str(REPO))

from hydra import compose, initialize_config_dir  # noqa: E402

from volseg.memory.estimator import estimate  # noqa: E402
from volseg.utils.units import MIB  # noqa: E402

SEED = [
    "model=unet_large",
    "data.batch_size=2",
    "data.patch_size=[26,150,320]",
    "trainer.precision=16-mixed",
    "estimate.device=cuda",
]
CKPT = ["model.activation_checkpointing=all", "model.checkpoint_loss=true"]
# two micro-batches of 1 make the same effective batch: the second runs with the first's gradients
MICRO = ["data.batch_size=1", "trainer.accumulate_grad_batches=2"]
LEVERS: dict[str, list[str]] = {
    "none (16-mixed)": [],
    "checkpointing: decoder": ["model.activation_checkpointing=decoder"],
    "checkpointing: all + loss": CKPT,
    "activation offload": ["model.offload_activations=true"],
    "micro-batch 1 (x2 accumulation)": MICRO,
    "16-true (float16 weights)": ["trainer.precision=16-true"],
    "micro-batch 1 + checkpointing: all + loss": [*MICRO, *CKPT],
    "micro-batch 1 + offload": [*MICRO, "model.offload_activations=true"],
    "16-true + micro-batch 1 + offload": [
        "trainer.precision=16-true",
        *MICRO,
        "model.offload_activations=true",
    ],
    "16-true + micro-batch 1 + offload + checkpointing: all + loss": [
        "trainer.precision=16-true",
        *MICRO,
        "model.offload_activations=true",
        *CKPT,
    ],
}


def main() -> None:
    print("| lever | peak allocated (MiB) | peak reserved (MiB) | cut (baseline / lever) |")
    print("| --- | ---: | ---: | ---: |")
    base = None
    for name, overrides in LEVERS.items():
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
            est = estimate(compose("train", overrides=[*SEED, *overrides]))
        base = base or est.peak_allocated
        print(
            f"| {name} | {est.peak_allocated / MIB:,.0f} | {est.peak_reserved / MIB:,.0f} "
            f"| {base / est.peak_allocated:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
