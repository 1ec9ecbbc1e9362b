"""Whether this CPU's bf16 3D convolutions get their gradients right: PyTorch's ``nn.Conv3d``
and volseg's :class:`volseg.models.conv.Conv3d` against float32, per input depth.

For each depth (and a transposed convolution), one forward and backward under CPU bf16
autocast and the same in float32, from the same inputs; the table gives the largest relative
error (max |bf16 - fp32| / max |fp32|) of the output, the input's gradient and the weight's
gradient over ``--trials`` random draws. bf16 rounding alone gives about 0.004; a row far above
that is a wrong kernel.

    python -m benchmarks cpu_bf16_conv [--channels 32] [--trials 3] [--depths 1,2,3,4] [--size 8]

The rows go to ``benchmarks/results/cpu/<date>_cpu_bf16_conv.json`` (``--json-out``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
from torch import nn

from benchmarks import results_io
from benchmarks.results_io import cpu_description
from volseg.models.conv import Conv3d

#: relative error above which a row is marked wrong (bf16 rounding gives ~0.004)
WRONG_ABOVE = 0.05


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


def errors(layer: nn.Module, shape: tuple[int, ...], generator: torch.Generator) -> list[float]:
    """Relative errors (output, input gradient, weight gradient) of one bf16 call of ``layer``
    on an input of ``shape`` against float32."""
    x = (3 * torch.randn(shape, generator=generator)).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = layer(x)
    grad = torch.randn(y16.shape, generator=generator)
    y16.backward(grad.to(y16.dtype))
    x16, w16 = x.grad.clone(), layer.weight.grad.clone()
    x.grad = None
    layer.weight.grad = None
    y32 = layer(x)
    y32.backward(grad)
    return [
        relative_error(y16, y32),
        relative_error(x16, x.grad),
        relative_error(w16, layer.weight.grad),
    ]


def worst(
    make: Callable[[], nn.Module], shape: tuple[int, ...], trials: int, seed: int
) -> list[float]:
    """The largest of each relative error over ``trials`` fresh layers and draws."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    rows = [errors(make(), shape, generator) for _ in range(trials)]
    # NaN counts as the worst: max() would keep whichever value came first
    return [
        max((r[i] for r in rows), key=lambda e: math.inf if math.isnan(e) else e) for i in range(3)
    ]


def print_row(name: str, shape: tuple[int, ...], errors: list[float]) -> dict:
    """Print one table row; the row as data."""
    # not "e > WRONG_ABOVE": a NaN error compares false with everything, and is wrong too
    cells = [f"{e:.3g}{'' if e <= WRONG_ABOVE else ' (wrong)'}" for e in errors]
    print(f"| {name} | {'×'.join(map(str, shape))} | " + " | ".join(cells) + " |", flush=True)
    keys = ("output", "input_gradient", "weight_gradient")
    return {
        "layer": name,
        "input_shape": list(shape),
        **dict(zip(keys, errors, strict=True)),
        "wrong": [not e <= WRONG_ABOVE for e in errors],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--depths", default="1,2,3,4")
    parser.add_argument("--size", type=int, default=8, help="height and width of the input")
    results_io.add_json_out(parser, "cpu_bf16_conv")
    args = parser.parse_args(argv)
    c, hw = args.channels, args.size
    print(f"CPU: {cpu_description()}\ntorch {torch.__version__}\n")
    print("| layer | input | output | input gradient | weight gradient |")
    print("| --- | --- | ---: | ---: | ---: |")
    layers = {
        "torch.nn.Conv3d k=3": lambda: nn.Conv3d(c, c, 3, padding=1),
        "volseg Conv3d k=3": lambda: Conv3d(c, c, 3, padding=1),
    }
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        shape = (2, c, depth, hw, hw)
        for name, make in layers.items():
            rows.append(print_row(name, shape, worst(make, shape, args.trials, seed=depth)))
    shape = (2, c, 2, hw, hw)
    transposed = worst(lambda: nn.ConvTranspose3d(c, c, 2, stride=2), shape, args.trials, 0)
    rows.append(print_row("torch.nn.ConvTranspose3d k=2 s=2", shape, transposed))
    settings = {"channels": c, "trials": args.trials, "size": hw, "wrong_above": WRONG_ABOVE}
    doc = results_io.result("cpu_bf16_conv", rows, script=__file__, argv=argv, settings=settings)
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
