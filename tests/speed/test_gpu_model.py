"""The stated GPU model: a step's seconds on a named GPU from its traced ops and the table's
datasheet figures. Each expected time is worked by hand from the table's figures (H100 SXM:
fp32 67 TFLOPS, tf32 495, bf16 989, 3.35 TB/s) and the model's stated efficiencies (compute
0.5, bandwidth 0.8, launch 10 µs, segment 50 µs, hook 3 µs), written as literals."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.conftest import TINY, compose_config
from tests.estimates import run_of
from volseg.memory import Candidate
from volseg.plan import planned_config
from volseg.speed.gpu_model import GPUS, gpu_model, modelled_seconds
from volseg.speed.step_time import StepWork, spec_of
from volseg.utils.errors import UserInputError

aten = torch.ops.aten
H100 = gpu_model("H100 SXM")[0]


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _conv(batch: int, cin: int, cout: int, side: tuple[int, int, int], dtype=torch.float32):
    """A replayed 3x3x3 convolution, padding 1 (output voxels = input's), no bias."""
    x, w = _meta(batch, cin, *side, dtype=dtype), _meta(cout, cin, 3, 3, 3, dtype=dtype)
    args = (x, w, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    return (aten.convolution.default, spec_of(args), ())


def _work(*ops, **counts) -> StepWork:
    """A step of ``ops`` each run once (each a dispatched call), with ``counts`` set."""
    return StepWork("cuda", replayed=Counter(ops), **{"calls": len(ops), **counts})


def test_a_float32_convolution_is_priced_at_the_tf32_peak():
    # N=2, Cin=32, Cout=64, k=3, 32x64x64 output: 2 x 2 x 64 x 32 x 27 x 131072 FLOPs
    flops = 28_991_029_248
    # 117 µs of compute beats its 100,884,480 bytes' 37.6 µs and the launch (which its one
    # call is: not counted again)
    assert modelled_seconds(_work(_conv(2, 32, 64, (32, 64, 64))), H100) == pytest.approx(
        flops / (495e12 * 0.5)
    )


def test_a_bfloat16_convolution_is_priced_at_the_tensor_peak():
    float32 = modelled_seconds(_work(_conv(2, 32, 64, (32, 64, 64))), H100)
    bf16 = modelled_seconds(_work(_conv(2, 32, 64, (32, 64, 64), torch.bfloat16)), H100)
    assert bf16 == pytest.approx(28_991_029_248 / (989e12 * 0.5))
    assert float32 / bf16 == pytest.approx(989 / 495)
    # a V100 has no bfloat16 units: its float32 peak, 15.7 TFLOPS
    v100 = gpu_model("V100")[0]
    bf16_v100 = modelled_seconds(_work(_conv(2, 32, 64, (32, 64, 64), torch.bfloat16)), v100)
    assert bf16_v100 == pytest.approx(28_991_029_248 / (15.7e12 * 0.5))


def test_a_float32_matrix_product_is_priced_at_the_fp32_peak():
    # torch keeps float32 matmuls off TF32 by default: 2 x 4096^3 FLOPs at 67 TFLOPS
    mm = (aten.mm.default, spec_of((_meta(4096, 4096), _meta(4096, 4096))), ())
    assert modelled_seconds(_work(mm), H100) == pytest.approx(137_438_953_472 / (67e12 * 0.5))


def test_a_norm_is_priced_at_its_bytes():
    # no FLOP formula: input and output 33,554,432 bytes each, weight, bias, saved mean and
    # inverse std 128 each
    x = _meta(2, 32, 32, 64, 64)
    args = (x, _meta(32), _meta(32), None, None, True, 0.1, 1e-5)
    norm = (aten.native_batch_norm.default, spec_of(args), ())
    assert modelled_seconds(_work(norm), H100) == pytest.approx(67_109_376 / (3.35e12 * 0.8))


def test_elementwise_work_is_bandwidth_bound():
    work = StepWork("cuda", calls=10, bytes=8_000_000_000)
    seconds = modelled_seconds(work, H100)
    assert seconds == pytest.approx(10 * 10e-6 + 8e9 / (3.35e12 * 0.8))
    assert seconds > 20 * 10 * 10e-6  # the bytes, not the launches


def test_many_tiny_ops_are_launch_bound():
    tiny = _conv(1, 1, 4, (4, 4, 4))
    work = _work(tiny, calls=1000, bytes=4000)
    assert modelled_seconds(work, H100) == pytest.approx(1000 * 10e-6, rel=1e-6)


def test_checkpointed_segments_add_their_host_cost():
    work = StepWork("cuda", segments=2, segment_calls=10, selective_calls=5)
    assert modelled_seconds(work, H100) == pytest.approx(2 * 50e-6 + 15 * 3e-6)


def test_a_bigger_batch_costs_less_per_sample_only_where_launches_bound_it():
    def per_sample(batch: int, cin: int, side: tuple[int, int, int]) -> float:
        return modelled_seconds(_work(_conv(batch, cin, 64, side)), H100) / batch

    # a tiny convolution costs its launch at either batch
    assert per_sample(1, 1, (4, 8, 8)) == pytest.approx(10e-6)
    assert per_sample(4, 1, (4, 8, 8)) == pytest.approx(10e-6 / 4)
    # a large one costs its FLOPs: the same per sample
    assert per_sample(8, 32, (32, 64, 64)) == pytest.approx(per_sample(2, 32, (32, 64, 64)))


@pytest.mark.parametrize(
    "name, row",
    [
        ("H200", "H200"),
        ("h100", "H100 SXM"),  # a part several rows hold: the first row
        ("a100", "A100 80GB SXM"),
        ("4090", "RTX 4090"),
        ("h100-pcie", "H100 PCIe"),  # dashes ignored
        ("l4", "L4"),  # the exact name before L40S, which holds it
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),  # an alias
        ("Tesla T4", "T4"),  # a device name that holds the row's name
    ],
)
def test_a_gpu_is_found_by_its_name_or_a_part(name, row):
    gpu, reason = gpu_model(name)
    assert gpu.name == row
    assert reason == f"memory.gpu={name}: the {row} model"


def test_no_gpu_assumes_the_h100_and_says_so():
    gpu, reason = gpu_model(None)
    assert gpu.name == "H100 SXM" and gpu.bandwidth == 3.35e12 and gpu.bf16 == 989e12
    assert reason == "no memory.gpu: the H100 SXM model assumed; memory.gpu names another"


def test_an_unknown_gpu_stops_with_one_line_naming_memory_gpu():
    with pytest.raises(UserInputError) as raised:
        gpu_model("MI300X")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("memory.gpu=MI300X")
    assert all(gpu.name in message for gpu in GPUS)


def test_a_traced_cuda_step_costs_less_per_sample_at_a_larger_batch(tmp_path):
    overrides = [*TINY, "model=unet_tiny", "memory.plan_device=cuda"]
    cfg = planned_config(compose_config("train", tmp_path, overrides))
    one, four = (run_of(cfg, Candidate(batch_size=b)).work for b in (1, 4))
    assert one.device == "cuda" and one.replayed
    seconds = modelled_seconds(one, H100)
    # the step is launch-bound: each of its calls costs at least a launch
    assert seconds >= one.calls * 10e-6
    assert modelled_seconds(four, H100) / 4 < seconds
