"""The searches both planners share: the largest setting that fits (a batch, a patch step, a
patch, a window count, a volume stitched on the device), by one bisection, and the patches, or
windows, below a configured one, largest first."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

#: what a search's ``fits`` returns for a setting that fits (an estimate)
Found = TypeVar("Found")


def bisect(ok: Callable[[int], bool], good: int, bad: int) -> int:
    """The largest ``n`` below ``bad`` for which ``ok(n)`` holds, given that it holds at
    ``good`` and not at ``bad`` (``ok`` monotone between them): ``log2(bad - good)`` calls."""
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return good


def _remembered(
    fits: Callable[[int], Found | None],
) -> tuple[Callable[[int], bool], dict[int, Found | None]]:
    """``ok(n)``: whether ``fits(n)`` gives an estimate, each kept in the dict returned with it."""
    found: dict[int, Found | None] = {}

    def ok(n: int) -> bool:
        found[n] = fits(n)
        return found[n] is not None

    return ok, found


def largest_fitting(
    fits: Callable[[int], Found | None], lo: int, hi: int, guess: int
) -> tuple[int, Found | None]:
    """Largest ``n`` in ``[lo, hi]`` for which the monotone ``fits(n)`` gives an estimate
    (``(lo - 1, None)`` when ``lo`` does not): doubling steps from ``guess``, then bisection."""
    ok, found = _remembered(fits)
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
    good = bisect(ok, good, bad)
    return good, found.get(good)


def windows_at_once(start: int) -> list[int]:
    """The window counts tried from ``start`` down until one fits: halving, to 2 before 1 (a
    window batch of one is not always the least: on a CPU, a float32 batch of one runs torch's
    own 3D convolution, whose column buffer is 27 times its input's)."""
    order, n = [], start
    while n > 2:
        order.append(n)
        n = max(2, n // 2)
    return order + [n for n in (2, 1) if n <= start]


def most_windows(
    fits: Callable[[int], Found | None], start: int, above: int, bisected: bool = True
) -> tuple[int, Found | None]:
    """The largest window count below ``above`` that ``fits``: :func:`windows_at_once` from
    ``start`` to the first that fits, then (``bisected``) bisecting up to the last that did
    not; ``(0, None)`` when none fits."""
    ok, found = _remembered(fits)
    bad = above
    for n in windows_at_once(start):
        if ok(n):
            good = bisect(ok, n, bad) if bisected else n
            return good, found[good]
        bad = n
    return 0, None


def shrunk_patches(
    base: Sequence[int],
    divisor: Sequence[int],
    takes: Callable[[Sequence[int]], bool] = lambda patch: True,
    tied: Sequence[Sequence[int]] = (),
) -> list[list[int]]:
    """The patches below ``base`` ``[D, H, W]``, largest first, each one multiple of its divisor
    off the side largest relative to ``base`` (nnU-Net's planner's rule), no side below twice its
    divisor (an instance norm cannot normalise one voxel) or where the network no longer
    ``takes`` it. ``tied``: groups of axes that stay equal (a 90° turn's plane, ``[[1, 2]]``)."""
    patch, out = [int(p) for p in base], []
    units = [tuple(sorted({int(a) for a in group})) for group in tied if len(set(group)) > 1]
    units += [(a,) for a in range(3) if not any(a in unit for unit in units)]
    stopped: set[tuple[int, ...]] = set()

    def step(unit: tuple[int, ...]) -> int | None:
        """The unit's next side: one multiple of its divisors below its present side."""
        multiple = math.lcm(*(int(divisor[a]) for a in unit))
        side = ((min(patch[a] for a in unit) - 1) // multiple) * multiple
        return side if all(side >= 2 * divisor[a] for a in unit) else None

    while True:
        open_units = [u for u in units if u not in stopped and step(u) is not None]
        if not open_units:
            return out
        unit = max(open_units, key=lambda u: max((patch[a] / base[a], patch[a]) for a in u))
        side = step(unit)
        candidate = [side if a in unit else patch[a] for a in range(3)]
        if takes(candidate):
            patch = candidate
            out.append(patch)
        else:
            stopped.add(unit)


def least(candidates: Sequence[tuple[str, int]]) -> str:
    """``the least: TEXT`` of the candidate that needs the fewest bytes, as a refusal names it:
    ``candidates`` are ``(text, bytes)`` pairs, each what a setting needs and how it is said."""
    if not candidates:
        return "nothing estimated"
    return "the least: " + min(candidates, key=lambda c: c[1])[0]
