"""The estimator on a module that is not volseg's (its own loss, batches and loop order), and the
nnU-Net side-by-side benchmark's reading of a committed nnU-Net plan (no nnunetv2 needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from volseg.memory.estimate.training_step import LoopSettings, estimate_step, module_training_step


class TwoHeads(nn.Module):
    """A conv with a full- and a half-resolution output, as a deep-supervised network returns;
    records whether the gradients are held when each forward starts."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(1, 4, 3, padding=1)  # 4 * 27 + 4 = 112 parameters
        self.grads_held: list[bool] = []

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        self.grads_held.append(self.conv.weight.grad is not None)
        y = self.conv(x)
        return [y, nn.functional.avg_pool3d(y, 2)]


@pytest.mark.parametrize("before_forward", [True, False])
def test_a_foreign_step_runs_with_its_own_loss_batches_and_zero_grad(before_forward):
    calls = {"loss": 0, "batch": []}

    def loss(outputs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor:
        calls["loss"] += 1
        return sum((o - t.float()).square().mean() for o, t in zip(outputs, targets, strict=True))

    def batch(image_shape, label_shape, dtype):
        calls["batch"].append(tuple(image_shape))
        b, _, d, h, w = image_shape
        targets = [torch.empty(b, 4, d, h, w), torch.empty(b, 4, d // 2, h // 2, w // 2)]
        return torch.empty(image_shape), [t.to(torch.int16) for t in targets]

    module, mode = TwoHeads(), FakeTensorMode()
    step = module_training_step(
        module,
        lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.99, nesterov=True),
        (2, 1, 8, 8, 8),
        "32",
        "cpu",
        LoopSettings(
            gradient_clip_val=12.0, zero_grad="before_forward" if before_forward else "closure"
        ),
        mode,
        loss=loss,
        make_batch=batch,
    )
    est = estimate_step(step, mode, "cpu", "32")
    assert calls["loss"] == 2 and calls["batch"] == [(2, 1, 8, 8, 8)] * 2  # two steps
    assert est.num_parameters == 112 and est.params == 112 * 4
    assert est.batch_size == 2 and est.patch_size == [8, 8, 8]
    # the second step's forward: gradients already dropped (nnU-Net's loop) or still held
    assert module.grads_held == [False, not before_forward]


class MaskedConv(nn.Module):
    """A conv plus a mask it makes without a dtype (as SwinUNETR makes its attention mask);
    records the default dtype each forward sees."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(1, 2, 3, padding=1)
        self.default_dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.default_dtypes.append(torch.get_default_dtype())
        y = self.conv(x)
        return y + torch.zeros(y.shape)


class _Lit(__import__("lightning").LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        return self.net(batch).float().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_bf16_true_step_creates_tensors_in_bf16_as_lightnings_forward_does(tmp_path):
    """Lightning's bf16-true runs the training step with bf16 as the default dtype, so a tensor
    made without a dtype is bf16 (a float32 one would promote the conv's output to float32 and
    double it). The estimator's step sees the same dtype, and restores the default after."""
    import lightning as L

    net = MaskedConv()
    trainer = L.Trainer(
        accelerator="cpu",
        precision="bf16-true",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Lit(net), torch.utils.data.DataLoader(torch.randn(2, 1, 8, 8, 8), batch_size=2))
    assert net.default_dtypes == [torch.bfloat16]

    module, mode = MaskedConv(), FakeTensorMode()
    step = module_training_step(
        module, lambda m: torch.optim.SGD(m.parameters(), lr=0.01), (2, 1, 8, 8, 8),
        "bf16-true", "cpu", None, mode, loss=lambda logits, label: logits.float().mean(),
    )  # fmt: skip
    estimate_step(step, mode, "cpu", "bf16-true")
    assert module.default_dtypes == [torch.bfloat16, torch.bfloat16]  # two steps
    assert torch.get_default_dtype() == torch.float32  # restored
