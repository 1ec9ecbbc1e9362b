"""Activation checkpointing for the U-Net: which blocks, and how a segment is recomputed.

A checkpointed segment keeps only its inputs during forward and recomputes the rest in backward
(non-reentrant ``torch.utils.checkpoint``). Blocks are checkpointed per conv unit
(conv -> norm -> ReLU), not whole: a whole full-resolution block would still rebuild its complete
working set (upsample, pad, concat, two convs) at once in backward. In a decoder level the
upsample + pad + concat run inside the first unit's segment, so the concatenated tensor (the
largest of the level) is never kept.

BatchNorm in training mode updates its running statistics on every forward; a recomputation is a
second forward of the same batch. :func:`checkpoint_segment` restores the statistics after the
recomputation, so they equal those of a run without checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

CheckpointSpec = str | Sequence[int] | None
#: the named settings of :func:`checkpoint_levels`, cheapest (least recomputation) first
CHECKPOINTING_CHOICES = ("none", "decoder", "encoder", "all")


@contextmanager
def frozen_norm_statistics(modules: Iterable[nn.Module]):
    """Restore BatchNorm running statistics (and batch counters) on exit."""
    saved = [
        (m, m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
        for m in modules
        if isinstance(m, _BatchNorm) and m.training and m.track_running_stats
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, mean, var, count in saved:
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(count)


def checkpoint_segment(
    fn: Callable[..., torch.Tensor], modules: Sequence[nn.Module], *args: Any
) -> torch.Tensor:
    """``fn(*args)`` as a non-reentrant checkpoint whose recomputation leaves ``modules``'
    BatchNorm statistics untouched (torch's ``context_fn``: the forward runs as it is, the
    recomputation inside :func:`frozen_norm_statistics`)."""

    def contexts() -> tuple[Any, Any]:
        return nullcontext(), frozen_norm_statistics(m for mod in modules for m in mod.modules())

    return checkpoint(fn, *args, use_reentrant=False, context_fn=contexts)


def checkpoint_levels(spec: CheckpointSpec, depth: int) -> tuple[set[int], set[int]]:
    """``(encoder levels, decoder levels)`` to checkpoint for the setting ``spec``.

    ``none``/``null``: nothing; ``encoder``: every encoder level; ``decoder``: every decoder level
    (levels ``0 .. depth - 2``); ``all``: both; a list of level indices (0 = full resolution):
    encoder and decoder blocks at those levels.
    """
    encoder, decoder = set(range(depth)), set(range(depth - 1))
    if spec is None or spec == "none":
        return set(), set()
    if isinstance(spec, str):
        choices = {
            "encoder": (encoder, set()),
            "decoder": (set(), decoder),
            "all": (encoder, decoder),
        }
        if spec not in choices:
            raise ValueError(
                f"activation_checkpointing must be {', '.join(CHECKPOINTING_CHOICES)} or a list "
                f"of level indices; got {spec!r}"
            )
        return choices[spec]
    levels = {int(i) for i in spec}
    if not levels <= encoder:
        raise ValueError(
            f"activation_checkpointing={list(spec)}: levels must lie in 0..{depth - 1}"
        )
    return levels, levels & decoder
