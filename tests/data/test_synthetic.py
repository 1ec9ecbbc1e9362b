import json

import numpy as np

from tests.conftest import SMALL_SHAPE
from tests.data.baselines import best_intensity_classifier_dice
from volseg.data.io import read_array
from volseg.data.synthetic import CLASS_NAMES, generate_synthetic_dataset, make_volume


def test_generator_is_deterministic_and_writes_the_layout(small_dataset, tmp_path):
    splits = json.loads((small_dataset / "splits.json").read_text())
    assert len(splits["train"]) == 4 and len(splits["val"]) == 2
    assert json.loads((small_dataset / "classes.json").read_text()) == list(CLASS_NAMES)
    again = generate_synthetic_dataset(
        tmp_path / "again", num_volumes=6, num_val=2, shape=SMALL_SHAPE, seed=1
    )
    for name in splits["train"][:2]:
        for sub in ("images", "labels"):
            assert np.array_equal(
                read_array(small_dataset / sub / name), read_array(again / sub / name)
            )
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # no partial folder left


def test_two_jobs_generating_one_dataset_at_once_leave_one_whole_copy(tmp_path):
    """The first use of the embedded dataset by two jobs at once (a sweep): each writes its own
    partial copy, one is renamed into place, the other is discarded without an error."""
    import threading

    root = tmp_path / "shared"
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def generate() -> None:
        start.wait(timeout=60)
        try:
            generate_synthetic_dataset(root, num_volumes=4, num_val=1, shape=[8, 16, 16], seed=1)
        except BaseException as err:
            errors.append(err)

    jobs = [threading.Thread(target=generate) for _ in range(2)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(timeout=120)
    assert not errors, errors
    assert [p.name for p in tmp_path.iterdir()] == ["shared"]
    splits = json.loads((root / "splits.json").read_text())
    assert sorted(p.name for p in (root / "images").iterdir()) == sorted(
        splits["train"] + splits["val"]
    )


def test_every_class_present_and_anisotropic():
    image, label = make_volume((32, 96, 96), seed=3)
    assert set(np.unique(label)) == set(range(len(CLASS_NAMES)))
    assert image.dtype == np.float32 and label.dtype == np.uint8
    # objects are flatter in z (2x spacing): a blob spans fewer slices than rows
    z, y, _ = np.nonzero(label == 1)
    assert np.ptp(z) < np.ptp(y)


def test_intensity_alone_cannot_separate_the_classes():
    """The best per-voxel intensity classifier scores mean foreground Dice < 0.6."""
    volumes = [make_volume((32, 96, 96), seed=s) for s in range(6)]
    dice = best_intensity_classifier_dice([v[0] for v in volumes], [v[1] for v in volumes], 5)
    assert dice[1:].mean() < 0.6
    # ...although it does find the objects: its background Dice is high
    assert dice[0] > 0.95


def test_baseline_search_beats_majority_vote():
    """The coordinate ascent is a real search: on easy data it reaches a high Dice."""
    rng = np.random.default_rng(0)
    label = rng.integers(0, 3, size=(8, 16, 16))
    image = label + rng.normal(0, 0.05, size=label.shape)  # classes separable by intensity
    dice = best_intensity_classifier_dice([image], [label], 3)
    assert dice[1:].mean() > 0.99
