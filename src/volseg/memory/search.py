"""The searches both planners share: the largest setting that fits (a batch, a patch step, a
window size) and the patches, or windows, below a configured one, largest first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

#: what a search's ``fits`` returns for a setting that fits (an estimate)
Found = TypeVar("Found")


def largest_fitting(
    fits: Callable[[int], Found | None], lo: int, hi: int, guess: int
) -> tuple[int, Found | None]:
    """Largest ``n`` in ``[lo, hi]`` for which ``fits(n)`` gives an estimate (``fits`` must be
    monotone: whatever fits, everything smaller fits); ``(lo - 1, None)`` when ``lo`` does not.

    Starts at ``guess`` and walks away from it in doubling steps, then bisects: a good guess
    costs two estimates.
    """
    found: dict[int, Found] = {}

    def ok(n: int) -> bool:
        est = fits(n)
        if est is not None:
            found[n] = est
        return est is not None

    n = min(max(guess, lo), hi)
    step = 1
    if ok(n):
        good, bad = n, hi + 1
        while good < hi:
            n = min(good + step, hi)
            if not ok(n):
                bad = n
                break
            good, step = n, step * 2
    else:
        good, bad = lo - 1, n
        while bad > lo:
            n = max(bad - step, lo)
            if ok(n):
                good = n
                break
            bad, step = n, step * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return good, found.get(good)


def shrunk_patches(
    base: Sequence[int],
    divisor: Sequence[int],
    takes: Callable[[Sequence[int]], bool] = lambda patch: True,
) -> list[list[int]]:
    """The patches below ``base`` ``[D, H, W]``, largest first, one step apart: each takes one
    multiple of its divisor off the side that is largest relative to ``base`` (the larger side
    on a tie), as nnU-Net's experiment planner takes it off the side largest relative to the
    median shape. No side goes below twice its divisor (the deepest level keeps two voxels a
    side: an instance norm cannot normalise one), and a side stops where the network no longer
    ``takes`` the patch (a probed divisor says which sides a network keeps, not the least)."""
    patch, out = [int(p) for p in base], []
    stopped: set[int] = set()
    while True:
        smaller = [((p - 1) // d) * d for p, d in zip(patch, divisor, strict=True)]
        axes = [a for a in range(3) if smaller[a] >= 2 * divisor[a] and a not in stopped]
        if not axes:
            return out
        axis = max(axes, key=lambda a: (patch[a] / base[a], patch[a]))
        candidate = [smaller[a] if a == axis else patch[a] for a in range(3)]
        if takes(candidate):
            patch = candidate
            out.append(patch)
        else:
            stopped.add(axis)
