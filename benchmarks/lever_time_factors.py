"""Every lever's predicted step-time factor against the measured one, on this CPU.

For unet_small and MONAI's BasicUNet (a network of another project), each lever of
``estimate_memory.py``'s table that changes the step's ops (each activation checkpointing
setting the network's adapter offers, micro-batches) is timed here: the module ``train.py``
builds (:func:`volseg.models.build.build_model`) runs forward, loss, backward and the optimizer
step in float32, one warm-up step, then ``--steps`` steps and at least 3 s of them, and the
lever's fastest step time over the configured step's is its measured factor. The predicted factor
is the table's (:func:`volseg.memory.fit.lever_prices.lever_prices`: the traced step's ops priced on
this machine, :mod:`volseg.speed.step_time`), its FLOPs factor beside it. Levers whose price is
not the step's ops (offload, the two-device split) or not modelled (half precision's kernels)
are left out.

    python -m benchmarks lever_time_factors   # results/cpu/<date>_lever_time_factors.json
    python -m benchmarks lever_time_factors --device cuda   # the same rows on a GPU
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import grid, results_io

#: network -> overrides of its configured step (float32, a small patch: minutes on 2 cores)
NETWORKS: dict[str, list[str]] = {
    "unet_small": ["model=unet_small", "data.patch_size=[16,32,32]", "data.batch_size=2"],
    "monai BasicUNet": [
        "model/net=basic_unet",
        "data.patch_size=[16,32,32]",
        "data.batch_size=2",
    ],
}
COMMON = ["trainer.precision=32"]
#: the table's levers whose price is the step's FLOPs
TIMED = ("as configured", "activation checkpointing", "micro-batches")


def _overrides(setting: str) -> list[str]:
    return [part for part in setting.split(" ") if part]


def step_seconds(cfg: Any, steps: int, device: str = "cpu", seconds: float = 3.0) -> float:
    """The fastest timing of one optimizer step of the planned ``cfg`` (its micro-batches
    included) on ``device``: forward, loss, backward, optimizer step; one warm-up step, then at
    least ``steps`` steps and ``seconds`` of them (a fast network's steps are many). The
    fastest, not the mean: a step another process slowed down says nothing of the lever."""
    from volseg.models.build import build_model

    module = build_model(cfg).to(device)
    module.train()
    optimizer = module.optimizer_factory(params=module.parameters())
    batch = int(cfg.data.batch_size)
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    shape = (batch, int(cfg.in_channels), *[int(p) for p in cfg.data.patch_size])
    image = torch.randn(shape, device=device)
    label = torch.randint(0, int(cfg.num_classes), (batch, 1, *shape[2:]), device=device)
    times: list[float] = []
    step = 0
    while step <= steps or sum(times) < seconds:
        start = time.perf_counter()
        for _ in range(accumulate):
            loss = module.compute_loss(module(image), label) / accumulate
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - start)
        step += 1
    return min(times)


def network_rows(
    name: str, base: list[str], work_dir: Path, steps: int, device: str = "cpu"
) -> list[dict]:
    """One network's rows: the table's predicted factor and the measured one for each lever
    whose price is FLOPs, on ``device``."""
    from volseg.memory import lever_prices
    from volseg.plan import RunPlan, planned_config

    common = [*COMMON, f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}"]
    data = grid.prepare_data([*base, *common], work_dir)
    cfg = planned_config(grid.compose([*base, *common], device, data))
    rows = []
    baseline = None
    for price in lever_prices(RunPlan(cfg, {})):
        if price.lever not in TIMED:
            continue
        overrides = [*base, *common, *_overrides(price.setting)]
        planned = planned_config(grid.compose(overrides, device, data))
        seconds = step_seconds(planned, steps, device)
        baseline = baseline or seconds
        row = {
            "network": name,
            "lever": price.lever,
            "setting": price.setting,
            "predicted_factor": price.time_factor,
            "flops_factor": price.flops_factor,
            "seconds_per_step": seconds,
            "measured_factor": seconds / baseline,
        }
        row["error"] = row["predicted_factor"] / row["measured_factor"] - 1
        rows.append(row)
        print(
            f"{name:<16} {price.lever:<25} {price.setting:<55} predicted "
            f"{row['predicted_factor']:.2f}x measured {row['measured_factor']:.2f}x "
            f"({seconds:.2f} s/step)",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks lever_time_factors")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per lever")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    known, _ = parser.parse_known_args(argv)
    results_io.add_json_out(parser, "lever_time_factors", known.device)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, base in NETWORKS.items():
            rows += network_rows(name, base, Path(tmp), args.steps, args.device)
    doc = results_io.result(
        "lever_time_factors",
        rows,
        script=__file__,
        argv=argv,
        device=args.device,
        steps=args.steps,
        threads=torch.get_num_threads(),
    )
    results_io.write(doc, args.json_out, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
