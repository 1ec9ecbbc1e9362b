"""Should this CPU train in bf16? float32 vs bf16 autocast, one convolution and one training step.

``trainer.precision=auto`` picks bf16 autocast on a CPU only where oneDNN reports bf16 kernels
for it (``volseg.utils.cpu.cpu_bf16_native``). This script checks that answer by measurement:

- one Conv3d 32->32 (k3, p1) on 1x32x16x32x32, forward + backward;
- the default model's training step (``python train.py``'s network, DiceCE, AdamW) on one batch
  of 2x1x32x64x64, plain PyTorch loop (``--model`` picks another preset).

Each row is the best of ``--repeats`` timings after one warm-up. Run it as is, and with
``ONEDNN_MAX_CPU_ISA=AVX2`` to see what a CPU without AVX-512 gets (oneDNN then uses only its
AVX2 kernels, and its bf16 answer becomes "emulated"):

    python -m benchmarks cpu_precision
    ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks cpu_precision

The rows go to ``benchmarks/results/cpu/<date>_cpu_precision.json`` (``--json-out``) with the
machine and the command (the head records ``ONEDNN_MAX_CPU_ISA`` and ``ATEN_CPU_CAPABILITY``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import hydra
import torch
from hydra import compose, initialize_config_dir

from benchmarks import results_io
from benchmarks.results_io import cpu_description
from volseg.plan import planned_config

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))


def best_seconds(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up: oneDNN builds its kernels on first use
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def conv_step(bf16: bool) -> Callable[[], None]:
    conv = torch.nn.Conv3d(32, 32, 3, padding=1)
    x = torch.randn(1, 32, 16, 32, 32, requires_grad=True)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()

    def run() -> None:
        with context:
            y = conv(x)
        y.float().sum().backward()

    return run


def training_step(bf16: bool, model: str | None = None) -> Callable[[], None]:
    overrides = ["model.scheduler=null"] + ([f"model={model}"] if model else [])
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        cfg = compose("train", overrides=overrides)
    module = hydra.utils.instantiate(planned_config(cfg).model)  # pooling=auto planned
    net, loss_fn = module.net.train(), module.loss
    optimizer = module.optimizer_factory(params=net.parameters())
    generator = torch.Generator().manual_seed(0)
    image = torch.randn(2, 1, 32, 64, 64, generator=generator)
    label = torch.randint(0, int(cfg.num_classes), (2, 1, 32, 64, 64), generator=generator)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()

    def run() -> None:
        with context:
            logits = net(image)
        loss = loss_fn(logits.float(), label)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="a model preset (default: the default)")
    results_io.add_json_out(parser, "cpu_precision")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"CPU: {cpu_description()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeats}\n")
    print("| work | float32 (s) | bf16 autocast (s) | bf16 / float32 |")
    print("| --- | ---: | ---: | ---: |")
    model = args.model or "default model"
    steps = (
        ("Conv3d 32->32, fwd+bwd", conv_step),
        (f"training step ({model})", partial(training_step, model=args.model)),
    )
    rows = []
    for name, make in steps:
        fp32 = best_seconds(make(False), args.repeats)
        bf16 = best_seconds(make(True), args.repeats)
        print(f"| {name} | {fp32:.3f} | {bf16:.3f} | {bf16 / fp32:.2f} |", flush=True)
        rows.append({"work": name, "float32_s": fp32, "bf16_s": bf16, "ratio": bf16 / fp32})
    settings = {
        "repeats": args.repeats,
        "model": model,
        "threads": torch.get_num_threads(),
    }
    doc = results_io.result("cpu_precision", rows, script=__file__, argv=argv, settings=settings)
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
