"""A margin in two parts, a fixed amount plus a share of the step, fitted on recorded runs.

One share of the step for every size is set by the run where the estimate falls shortest
relative to its size, usually a small one, where a fixed cost (the allocator's granularity, a
library's workspace) dominates; applied to a large step it withholds far more than any large run
needed. A margin ``fixed + share x estimate`` covers the small runs with the fixed part and the
large ones with the share.

The fit: the ``fixed`` (bytes) and ``share`` at or above 0 that cover every run
(``estimate + fixed + share x estimate >= measured``) and withhold the least on average as a
share of each run's estimate (``mean(fixed / estimate) + share``), a linear programme in two
unknowns whose optimum lies on a vertex of the covered region; ``fixed`` is rounded up to
0.1 MiB and ``share`` to 0.1 %, so that the rounded margin still covers every run.

The planner (``volseg.memory``) adds ``ceil(fixed_mib x 2**20 + share x quantity)`` bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from volseg.utils.units import MIB

FIXED_STEP_MIB = 0.1
SHARE_STEP = 0.001


def _covers(fixed: float, share: float, runs: Sequence[tuple[float, float]]) -> bool:
    return all(e + fixed + share * e >= m - 1e-6 for e, m in runs)


def fit(runs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(fixed_mib, share)`` for ``runs`` of ``(estimated, measured)`` bytes (see the module);
    ``(0, 0)`` where every estimate is at or above its measurement or there is no run."""
    runs = [(float(e), float(m)) for e, m in runs if e > 0]
    short = [(e, m - e) for e, m in runs]
    if not runs or all(d <= 0 for _, d in short):
        return 0.0, 0.0
    # a tie goes to the first: the share alone (it scales) before the fixed part alone
    candidates = [(0.0, max(d / e for e, d in short)), (max(d for _, d in short), 0.0)]
    for i, (ei, di) in enumerate(short):
        for ej, dj in short[i + 1 :]:
            if ei != ej:
                share = (di - dj) / (ei - ej)
                candidates.append((di - share * ei, share))
    weight = sum(1 / e for e, _ in runs) / len(runs)
    feasible = [
        (fixed, share)
        for fixed, share in candidates
        if fixed >= 0 and share >= 0 and _covers(fixed, share, runs)
    ]
    fixed, share = min(feasible, key=lambda c: c[0] * weight + c[1])
    fixed_mib = math.ceil(round(fixed / MIB / FIXED_STEP_MIB, 6)) * FIXED_STEP_MIB
    share = math.ceil(round(share / SHARE_STEP, 6)) * SHARE_STEP
    return round(fixed_mib, 1), round(share, 3)


def margin_bytes(fixed_mib: float, share: float, quantity: float) -> int:
    """What the margin adds to an estimate of ``quantity`` bytes."""
    return math.ceil(fixed_mib * MIB + share * quantity)


def covered(fixed_mib: float, share: float, estimated: float, measured: float) -> bool:
    """Whether ``estimated`` plus the margin is at or above ``measured``."""
    return estimated + margin_bytes(fixed_mib, share, estimated) >= measured
