import subprocess
import sys

import pytest
import torch
from monai.inferers import SlidingWindowInferer
from monai.losses import DiceCELoss

from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D


class _Oracle(torch.nn.Module):
    """Returns the logits of a fixed label volume: a perfect or a deliberately wrong predictor."""

    def __init__(self, label: torch.Tensor, num_classes: int) -> None:
        super().__init__()
        self.logits = torch.nn.functional.one_hot(label.long(), num_classes).movedim(-1, 1) * 10.0

    def forward(self, x):
        return self.logits.to(x.dtype)


def _module(net, num_classes=3):
    return SegmentationModule(
        net=net,
        loss=DiceCELoss(to_onehot_y=True, softmax=True),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        num_classes=num_classes,
        class_names=["bg", "a", "b"],
        inferer=SlidingWindowInferer(roi_size=(8, 8, 8)),
        nonfinite_check_every_n_steps=1,
    )


def _label():
    label = torch.zeros(1, 8, 8, 8, dtype=torch.long)
    label[:, 2:5, 2:5, 2:5] = 1
    label[:, 5:7, 5:7, 5:7] = 2
    return label


def _validate(module, label):
    module.validation_step({"image": torch.zeros(1, 1, 8, 8, 8), "label": label[:, None]}, 0)
    return module.reduced_validation()[0]


def test_dice_is_one_for_a_perfect_prediction_and_low_for_a_wrong_one():
    label = _label()
    module = _module(_Oracle(label, 3))
    module.log = lambda *a, **k: None
    assert torch.allclose(_validate(module, label), torch.ones(3))
    wrong = label.clone()
    wrong[label == 1] = 2  # class a predicted as b
    module = _module(_Oracle(wrong, 3))
    module.log = lambda *a, **k: None
    dice = _validate(module, label)
    assert dice[1] == 0 and dice[2] < 0.5


def test_a_padding_batch_is_neither_scored_nor_returned_and_absent_classes_are_left_out():
    label = _label()
    no_b = label.clone()
    no_b[no_b == 2] = 0  # class b absent from this case: it must not pull b's mean to 0
    module = _module(_Oracle(label, 3))
    image = torch.zeros(1, 1, 8, 8, 8)
    module.validation_step({"image": image, "label": label[:, None], "counted": [True]}, 0)
    wrong = {"image": image, "label": no_b[:, None], "counted": torch.tensor([False])}
    assert module.validation_step(wrong, 1) == {}  # a padding batch: nothing to write
    module.net = _Oracle(no_b, 3)
    module.validation_step({"image": image, "label": no_b[:, None]}, 2)
    dice, loss, cases = module.reduced_validation()
    assert cases == 2
    assert torch.allclose(dice, torch.ones(3))  # b: 1 from the first case, absent in the second
    losses = [module.loss(_Oracle(y, 3)(image), y[:, None]).item() for y in (label, no_b)]
    assert abs(loss - sum(losses) / 2) < 1e-6  # the padding batch's loss was not counted


def test_loss_is_smaller_for_the_right_answer():
    label = _label()[:, None]
    loss = DiceCELoss(to_onehot_y=True, softmax=True)
    right = _Oracle(label[:, 0], 3)(torch.zeros(1))
    wrong = _Oracle(torch.zeros_like(label[:, 0]), 3)(torch.zeros(1))
    assert loss(right, label) < 0.1 < loss(wrong, label)


def test_training_step_reduces_loss_on_one_batch():
    torch.manual_seed(0)
    module = _module(UNet3D(1, 3, widths=[4, 8]))
    module.log = lambda *a, **k: None
    label = _label()[:, None]
    batch = {"image": label.float() + 0.1 * torch.randn(1, 1, 8, 8, 8), "label": label}
    opt = module.configure_optimizers()
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = module.training_step(batch, 0)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_channels_last_gives_the_same_logits_and_gradients():
    torch.manual_seed(0)
    reference = _module(UNet3D(1, 3, widths=[4, 8]))
    torch.manual_seed(0)
    fast = SegmentationModule(
        net=UNet3D(1, 3, widths=[4, 8]),
        loss=reference.loss,
        optimizer=reference.optimizer_factory,
        num_classes=3,
        channels_last=True,
        nonfinite_check_every_n_steps=1,
    )
    assert fast.net.inc[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    x = torch.randn(2, 1, 8, 12, 10)
    out_ref, out_fast = reference(x), fast(x)
    assert torch.allclose(out_ref, out_fast, atol=1e-5)
    out_ref.square().sum().backward()
    out_fast.square().sum().backward()
    grad_ref, grad_fast = reference.net.inc[0].weight.grad, fast.net.inc[0].weight.grad
    # same math, other summation order: equal to float32 rounding
    assert torch.allclose(grad_ref, grad_fast, rtol=1e-3, atol=1e-3)


def test_validation_inferer_options_come_from_the_config(tmp_path):
    import hydra

    from tests.conftest import planned_config

    cfg = planned_config(
        "train", tmp_path, ["model.inferer.device=cpu", "model.inferer.sw_batch_size=4"]
    )
    module = hydra.utils.instantiate(cfg.model)
    assert module.inferer.sw_batch_size == 4 and str(module.inferer.device) == "cpu"
    assert list(module.inferer.roi_size) == list(cfg.data.patch_size)


def test_nonfinite_loss_stops_training_with_a_clear_error():
    module = _module(UNet3D(1, 3, widths=[4, 8]))
    module.log = lambda *a, **k: None
    label = _label()[:, None]
    batch = {"image": torch.full((1, 1, 8, 8, 8), float("nan")), "label": label}
    with pytest.raises(FloatingPointError, match=r"train/loss is NaN or Inf at step 0"):
        module.training_step(batch, 0)
    module.stop_on_nonfinite_loss = False
    assert torch.isnan(module.training_step(batch, 0))


def test_nonfinite_check_reads_the_device_flag_every_n_steps_only(monkeypatch):
    """No host read (a CUDA sync) per step: a NaN at step 1 is reported at step 4 (every 5)."""
    module = _module(UNet3D(1, 3, widths=[4, 8]))
    module.log = lambda *a, **k: None
    module.nonfinite_check_every_n_steps = 5
    step = {"now": 0}
    monkeypatch.setattr(type(module), "global_step", property(lambda self: step["now"]))
    label = _label()[:, None]
    good = {"image": torch.zeros((1, 1, 8, 8, 8)), "label": label}
    bad = {"image": torch.full((1, 1, 8, 8, 8), float("nan")), "label": label}
    for step["now"], batch in enumerate([good, bad, good, good]):
        module.training_step(batch, step["now"])  # steps 0-3: nothing read, nothing raised
    step["now"] = 4
    with pytest.raises(FloatingPointError, match=r"NaN or Inf at a step in \[0, 4\]"):
        module.training_step(good, 4)


def test_a_class_at_zero_dice_is_named_in_a_warning(caplog):
    """After a validation, every foreground class at Dice 0 is named in one warning."""
    label = _label()
    wrong = label.clone()
    wrong[label == 2] = 0  # class "b" is never predicted
    module = _module(_Oracle(wrong, 3))
    module.log = lambda *a, **k: None
    per_class = _validate(module, label).nan_to_num(0.0)
    with caplog.at_level("WARNING"):
        assert module.warn_zero_dice(per_class) == ["b"]
    assert "Dice 0 for class(es) b" in caplog.text
    caplog.clear()
    assert _module(_Oracle(label, 3)).warn_zero_dice(torch.tensor([1.0, 1.0, 1.0])) == []
    assert "Dice 0" not in caplog.text


def test_the_model_summary_of_a_bf16_mixed_run_warns_nothing():
    """A run whose ``auto`` precision is bf16-mixed (a CPU with native bf16) prints Lightning's
    model summary without its warning: its 32 bits a parameter are right under autocast. In a
    fresh process: pytest resets the warning filters a module sets at import."""
    code = """
import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.model_summary import ModelSummary

import volseg.models.segmentation_module

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(1, 2, 3)

net = Net()
net.trainer = pl.Trainer(
    accelerator="cpu", precision="bf16-mixed", logger=False, enable_checkpointing=False
)
print(ModelSummary(net).total_parameters)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["56"]  # 2 x 1 x 3 x 3 x 3 weights and 2 biases
    assert "not supported by the model summary" not in done.stderr
