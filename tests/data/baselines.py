"""Reference classifiers that show how hard a dataset is (the synthetic dataset's tests)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _dice_from_confusion(counts: np.ndarray, assign: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-class Dice of the per-bin assignment ``assign`` given ``counts[bin, class]``."""
    dice = np.zeros(num_classes)
    truth = counts.sum(axis=0)
    for k in range(num_classes):
        chosen = assign == k
        tp = counts[chosen, k].sum()
        predicted = counts[chosen].sum()
        dice[k] = 2 * tp / (predicted + truth[k]) if predicted + truth[k] else 1.0
    return dice


def best_intensity_classifier_dice(
    images: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    num_classes: int,
    bins: int = 128,
    sweeps: int = 4,
) -> np.ndarray:
    """Per-class Dice of the best per-voxel intensity classifier on these volumes.

    The classifier maps each of ``bins`` intensity bins to one class — any set of thresholds is
    such a map, and so is any non-contiguous one. Starting from the majority class of every bin,
    coordinate ascent re-assigns one bin at a time whenever that raises the mean foreground Dice,
    until a full sweep changes nothing. Fit and scored on the same volumes (an upper bound).
    Returns Dice per class, shape ``(num_classes,)``.
    """
    values = np.concatenate([np.ravel(i) for i in images])
    truth = np.concatenate([np.ravel(lab) for lab in labels]).astype(np.int64)
    edges = np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1])
    which = np.searchsorted(edges, values)
    counts = np.zeros((bins, num_classes))
    np.add.at(counts, (which, truth), 1)

    assign = counts.argmax(axis=1)
    best = _dice_from_confusion(counts, assign, num_classes)[1:].mean()
    for _ in range(sweeps):
        changed = False
        for b in range(bins):
            for k in range(num_classes):
                if k == assign[b]:
                    continue
                old = assign[b]
                assign[b] = k
                score = _dice_from_confusion(counts, assign, num_classes)[1:].mean()
                if score > best + 1e-12:
                    best, changed = score, True
                else:
                    assign[b] = old
        if not changed:
            break
    return _dice_from_confusion(counts, assign, num_classes)
