"""Where a training step's time goes on this CPU, by operator: volseg's networks beside MONAI's
BasicUNet on one batch.

For each network (``--nets``: config overrides for ``train.py``'s model, named) one plain
float32 training step (forward, DiceCE, backward, AdamW) on the fixed batch of
``train_throughput.py`` (2x1x32x64x64) runs under ``torch.profiler`` after warm-up steps. Each
operator's self CPU time (what it spends outside the operators it calls) is summed over the
profiled steps, and the table keeps the largest, each as a share of the step. Beside it: the
step's seconds, its FLOPs (``torch.utils.flop_counter``: convolutions and matmuls) and the
share of the best float32 GEMM rate it reaches, measured in the same run
(``train_matmul_flops_per_s``).

    python -m benchmarks step_profile [--steps 3] [--top 12]
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m benchmarks step_profile

The rows go to ``benchmarks/results/cpu/<date>_step_profile.json`` with the CPU's model and
ISA flags (and the ISA it was held to).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import results_io
from benchmarks.archive.steps import (
    BATCH_SHAPE,
    build_module,
    flops_per_step,
    make_batch,
    matmul_flops_per_s,
)
from benchmarks.results_io import cpu_description

#: name -> train.py overrides of the model (every other setting as train_throughput.py's)
NETS = {
    "unet_tiny (default)": ["model=unet_tiny"],
    "BasicUNet (MONAI)": ["model=unet_tiny", "model/net=basic_unet"],
    "unet_small": ["model=unet_small"],
}


def plain_step(module, batch: dict, optimizer) -> None:
    """One float32 training step as ``train_throughput.plain_seconds_per_step`` times it."""
    loss = module.loss(module.net(batch["image"]).float(), batch["label"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def profile_step(overrides: list[str], steps: int, warmup: int, top: int) -> dict:
    """The step of the network ``overrides`` build: seconds, FLOPs and the ``top`` operators by
    self CPU time (seconds per step)."""
    base = build_module(overrides[0].split("=", 1)[1], False, overrides[1:])
    batch = make_batch(False)
    flops = flops_per_step(base, batch)
    module = copy.deepcopy(base)
    module.net.train()
    optimizer = module.optimizer_factory(params=module.net.parameters())
    for _ in range(warmup):
        plain_step(module, batch, optimizer)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            plain_step(module, batch, optimizer)
    seconds = (time.perf_counter() - start) / steps
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total_self = sum(e.self_cpu_time_total for e in events) / 1e6 / steps
    ops = [
        {
            "op": e.key,
            "self_s_per_step": e.self_cpu_time_total / 1e6 / steps,
            "calls_per_step": e.count / steps,
        }
        for e in events[:top]
    ]
    parameters = sum(p.numel() for p in module.net.parameters())
    return {
        "seconds_per_step": seconds,
        "profiled_self_s_per_step": total_self,
        "flops_per_step": flops,
        "parameters": parameters,
        "ops": ops,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per network")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="operators kept per network")
    parser.add_argument("--nets", default=",".join(NETS), help="comma-separated names of NETS")
    results_io.add_json_out(parser, "step_profile")
    args = parser.parse_args(argv)
    unknown = [name for name in args.nets.split(",") if name not in NETS]
    if unknown:
        parser.error(f"--nets: no network {', '.join(unknown)}; known: {', '.join(NETS)}")

    torch.manual_seed(0)
    print(f"CPU: {cpu_description()}")
    peak = max(matmul_flops_per_s(torch.float32).values())
    print(f"fp32 matmul peak: {peak / 1e9:.0f} GFLOP/s")
    rows = []
    for name in args.nets.split(","):
        row = {"network": name, "overrides": NETS[name]}
        row |= profile_step(NETS[name], args.steps, args.warmup, args.top)
        row["of_fp32_peak"] = row["flops_per_step"] / row["seconds_per_step"] / peak
        rows.append(row)
        print(
            f"\n{name}: {row['seconds_per_step']:.3f} s/step, "
            f"{row['flops_per_step'] / 1e9:.1f} GFLOP, {row['of_fp32_peak']:.2f} of fp32 peak"
        )
        for op in row["ops"]:
            share = op["self_s_per_step"] / row["profiled_self_s_per_step"]
            print(f"  {share:6.1%}  {op['self_s_per_step']:.4f} s  {op['op']}")
    settings = {
        "batch": list(BATCH_SHAPE),
        "steps": args.steps,
        "warmup": args.warmup,
        "matmul_peak_flops_per_s": {"fp32": peak},
    }
    doc = results_io.result("step_profile", rows, script=__file__, argv=argv, settings=settings)
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
