"""A many-class config (``num_classes=60``): what the patch sampler and the loss receive."""

from __future__ import annotations

import hydra
import numpy as np
import pytest
import torch

from tests.conftest import compose_config
from volseg.data.transforms import LOCATIONS_KEY, class_balanced_crop, class_locations

K = 60


def test_sixty_classes_are_centred_equally_often(tmp_path):
    """Every class, background included, centres 1/60 of the patches (equal ratios, the
    default)."""
    cfg = compose_config("train", tmp_path, [f"num_classes={K}"])
    assert cfg.data.num_classes == K and cfg.model.net.num_classes == K
    assert cfg.data.class_ratios is None
    # class c fills c + 1 slabs of 4x4: large and small classes, as in an atlas
    label = np.concatenate([np.full((c + 1, 4, 4), c) for c in range(K)])[None].astype(np.int64)
    item = {"image": torch.zeros(label.shape), "label": torch.from_numpy(label)}
    item = class_locations(K, cfg.data.max_locations_per_class)(item)
    crop = class_balanced_crop(["image", "label"], [1, 1, 1], K, cfg.data.class_ratios)
    crop.set_random_state(0)
    draws = 6000
    crop.cropper.num_samples = draws  # the crop's own draw of centres, 6000 at once
    crop.cropper.randomize(item["label"], item[LOCATIONS_KEY])
    counts = np.bincount([label[0][c] for c in crop.cropper.centers], minlength=K)
    # 100 expected per class (sd 9.9 for a binomial); by size, class 59 would get 60x class 0's
    assert counts.min() > 55 and counts.max() < 145, counts


def test_the_dice_term_averages_over_the_59_foreground_classes(tmp_path):
    """Perfect logits but one voxel of class 7 called class 8: Dice 0 for class 7, 2/3 for
    class 8 (1 true positive, 1 false positive), 1 for the other 57; averaged over 59."""
    cfg = compose_config("train", tmp_path, [f"num_classes={K}"])
    loss = hydra.utils.instantiate(cfg.model.loss)
    label = (torch.arange(64) % K).reshape(1, 1, 4, 4, 4)
    predicted = label.clone()
    predicted[label == 7] = 8
    logits = 100.0 * torch.nn.functional.one_hot(predicted[:, 0], K).permute(0, 4, 1, 2, 3)
    expected = (1.0 + 1.0 / 3.0) / (K - 1)
    assert loss.dice(logits.float(), label).item() == pytest.approx(expected, rel=1e-4)


def test_sixty_classes_train_at_the_many_class_rate_with_the_light_cross_entropy(tmp_path):
    """``model.optimizer.lr=auto`` plans the many-class rate for 59 foreground classes (the
    embedded data's 4 keep the few-class one), and the built module's optimizer and loss get
    what the plan says: AdamW at 0.02, cross-entropy weighted 0.25 beside Dice."""
    from volseg.models.build import build_model
    from volseg.plan import make_plan

    many = make_plan(compose_config("train", tmp_path / "many", [f"num_classes={K}"]), False)
    few = make_plan(compose_config("train", tmp_path / "few", []), False)
    assert many.decisions["model.optimizer.lr"].value == 0.02
    assert many.decisions["model.optimizer.lr"].source == "planned"
    assert few.decisions["model.optimizer.lr"].value == 0.003
    module = build_model(many.run_config())
    optimizer = module.optimizer_factory(module.parameters())
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["lr"] == 0.02
    assert module.loss.lambda_ce == 0.25 and module.loss.lambda_dice == 1.0
