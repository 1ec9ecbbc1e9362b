"""The estimator against real CPU steps, the seed-style comparison, the CUDA-specific parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import compose_config
from tests.memory.real_step import real_step_peak
from volseg.memory.estimator import estimate

SMALL = ["model.net.widths=[8,16,32]", "data.batch_size=2", "data.patch_size=[16,32,32]"]
SEED = ["data.batch_size=2", "data.patch_size=[26,150,320]", "trainer.precision=16-true"]


def _cfg(tmp_path: Path, overrides: list[str]):
    return compose_config("train", tmp_path, overrides)


@pytest.mark.parametrize(
    "levers",
    [
        ["trainer.precision=32"],
        ["trainer.precision=bf16-mixed"],
        ["trainer.precision=16-true", "model.net.norm=instance"],
        [
            "trainer.precision=32",
            "model.activation_checkpointing=all",
            "model.checkpoint_loss=true",
        ],
    ],
    ids=["fp32", "bf16-mixed", "16-true-instance", "checkpointing"],
)
def test_categories_match_a_real_cpu_step(tmp_path, levers):
    cfg = _cfg(tmp_path, [*SMALL, "estimate.device=cpu", *levers])
    est = estimate(cfg)
    real = real_step_peak(cfg)
    for category in ("params", "grads", "optimizer_state", "activations", "temporaries"):
        predicted = getattr(est, category)
        assert predicted == pytest.approx(real[category], rel=0.05, abs=4096), category
    assert real["activations"] > 5 * real["params"]  # the comparison is about activations
    tensors = est.peak_allocated - est.kernel_workspace
    assert tensors == pytest.approx(sum(real.values()), rel=0.05)
    assert est.kernel_workspace > 0  # oneDNN's reorders, modelled on the CPU


def test_halving_parameters_barely_moves_the_peak(tmp_path):
    """The seed case: unet_small has 0.36x unet_large's parameters, not 0.36x its memory."""
    large = estimate(_cfg(tmp_path, ["model=unet_large", *SEED]))
    small = estimate(_cfg(tmp_path, ["model=unet_small", *SEED]))
    assert small.params / large.params == pytest.approx(14_496_517 / 40_158_853, rel=0.01)
    assert small.peak_allocated >= 0.8 * large.peak_allocated
    assert large.activations > 10 * large.params
    # the full-resolution levels hold most of the activations
    top_two = sorted(large.modules.values(), reverse=True)[:2]
    assert sum(top_two) > 0.5 * sum(large.modules.values())
    assert {"net.ups.0", "net.inc"} <= set(list(large.modules)[:3])


def test_cuda_estimate_rounds_and_caches(tmp_path):
    cfg = _cfg(tmp_path, [*SMALL, "trainer.precision=16-mixed", "estimate.cuda_context_mib=300"])
    est = estimate(cfg)
    assert est.device == "cuda"  # trainer.accelerator=auto counts as a GPU
    assert est.peak_reserved >= est.peak_allocated > 0
    assert est.peak_reserved % (2 * 2**20) == 0  # whole segments
    assert est.process_total == est.peak_reserved + 300 * 2**20
    assert est.fits(est.process_total) and not est.fits(est.process_total // 4)


def test_offload_moves_saved_activations_off_the_gpu(tmp_path):
    base = [*SMALL, "trainer.precision=16-mixed"]
    kept = estimate(_cfg(tmp_path, base))
    offloaded = estimate(_cfg(tmp_path, [*base, "model.offload_activations=true"]))
    assert offloaded.activations < 0.5 * kept.activations
    assert offloaded.peak_allocated < kept.peak_allocated


def test_checkpointing_cuts_the_estimate(tmp_path):
    base = ["model=unet_large", *SEED, "trainer.precision=16-mixed"]
    none = estimate(_cfg(tmp_path, base))
    every = estimate(
        _cfg(tmp_path, [*base, "model.checkpoint_loss=true"]), activation_checkpointing="all"
    )
    assert every.activation_checkpointing == "all"
    assert every.activations < 0.5 * none.activations


def test_bad_device_and_precision_name_the_key(tmp_path):
    from volseg.utils.errors import UserInputError

    with pytest.raises(UserInputError, match="estimate.device=tpu"):
        estimate(_cfg(tmp_path, [*SMALL, "estimate.device=tpu"]))
    with pytest.raises(UserInputError, match="trainer.precision=8-mixed"):
        estimate(_cfg(tmp_path, [*SMALL, "trainer.precision=8-mixed"]))


def test_checkpointed_loss_keeps_no_float32_logits(tmp_path):
    """With many classes the loss is large: recomputing it must not cost more than keeping it."""
    base = ["model.net.widths=[8,16,32]", "num_classes=32", *SEED[:2], "trainer.precision=16-mixed"]
    kept = estimate(_cfg(tmp_path, base))
    recomputed = estimate(_cfg(tmp_path, [*base, "model.checkpoint_loss=true"]))
    assert recomputed.peak_allocated <= kept.peak_allocated
