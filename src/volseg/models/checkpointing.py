"""Activation checkpointing: which U-Net blocks, and how a segment is recomputed.

A segment keeps only its inputs and recomputes the rest in backward (non-reentrant
``torch.utils.checkpoint``). UNet3D checkpoints per conv unit, not per block: backward then never
rebuilds a whole level's working set at once, and a decoder level's upsample + pad + concat run in
its first unit's segment, so the concatenated map (the level's largest) is never kept. A
*selective* segment (torch's ``create_selective_checkpoint_contexts``) also keeps the outputs of
:data:`SAVED_OPS`, so no convolution runs twice but a :data:`CHEAP_CONVOLUTION`. A recomputation is
a second forward of the batch: :func:`checkpoint_segment` restores BatchNorm's running statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

#: a checkpointing setting: a named choice, UNet3D's level indices, submodule names, or a mapping
#: of parts (UNet3D: encoder/decoder; any network: submodule names) to ``full`` or ``selective``
CheckpointSpec = str | Sequence[int] | Sequence[str] | Mapping[str, str] | None
#: the named settings of :func:`checkpoint_levels`, cheapest (least recomputation) first:
#: ``selective`` recomputes no convolution, the others recompute those of their blocks
CHECKPOINTING_CHOICES = ("none", "selective", "decoder", "encoder", "all")
#: how a checkpointed block is recomputed: all but its inputs, or all but those and SAVED_OPS
MODES = ("full", "selective")
#: the parts a mapping setting (``{encoder: selective, decoder: full}``) names, for UNet3D
PARTS = ("encoder", "decoder")
#: torch's BatchNorm layers, by their public classes (the lazy ones subclass none of the others)
BATCH_NORMS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
)
#: torch's convolutions, transposed ones too, by their public classes (the lazy ones subclass them)
CONVOLUTIONS = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)

aten = torch.ops.aten
#: the ops whose outputs a selective segment keeps (the expensive ones: recomputing them is what
#: makes full checkpointing slow); every other op of the segment is recomputed in backward
SAVED_OPS = frozenset(
    {
        aten.convolution.default,
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
)


#: a convolution summing fewer products than this into each output value is recomputed, not kept,
#: by a selective segment: an input convolution of one or two channels (27 or 54 products at 3^3)
#: or a transposed one of few channels costs about what a norm does, at full resolution
CHEAP_CONVOLUTION = 64


def cheap_convolution(
    weight: torch.Tensor, transposed: bool = False, stride: Sequence[int] = (), groups: int = 1
) -> bool:
    """Whether a convolution with ``weight`` (``(C_out, C_in / groups, *kernel)``; transposed:
    ``(C_in, C_out / groups, *kernel)``) sums fewer than :data:`CHEAP_CONVOLUTION` products into
    each output value (transposed: a stride's volume fewer of the kernel's taps)."""
    if transposed:
        products = weight.shape[0] // groups * math.prod(weight.shape[2:]) / math.prod(stride)
    else:
        products = math.prod(weight.shape[1:])
    return products < CHEAP_CONVOLUTION


def _keep_expensive(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The selective policy: keep the outputs of :data:`SAVED_OPS` but cheap convolutions."""
    if op is aten.convolution.default and cheap_convolution(
        args[1], bool(args[6]), args[3], args[8]
    ):
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


@contextmanager
def frozen_norm_statistics(modules: Iterable[nn.Module]):
    """Restore BatchNorm running statistics (and batch counters) on exit."""
    saved = [
        (m, m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
        for m in modules
        if isinstance(m, BATCH_NORMS) and m.training and m.track_running_stats
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, mean, var, count in saved:
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(count)


@contextmanager
def _frozen_around(inner: Any, modules: Sequence[nn.Module]):
    """``inner`` inside :func:`frozen_norm_statistics` of ``modules``: the statistics are copied
    outside the selective policy's dispatch mode, whose cache would refuse the copies (ops the
    forward did not run)."""
    with frozen_norm_statistics(m for mod in modules for m in mod.modules()), inner:
        yield


def checkpoint_segment(
    fn: Callable[..., torch.Tensor],
    modules: Sequence[nn.Module],
    *args: Any,
    selective: bool = False,
) -> torch.Tensor:
    """``fn(*args)`` as a non-reentrant checkpoint whose recomputation leaves ``modules``'
    BatchNorm statistics untouched (torch's ``context_fn``: the forward runs as it is, the
    recomputation inside :func:`frozen_norm_statistics`); ``selective``: the outputs of
    :data:`SAVED_OPS` are kept, not recomputed."""

    def contexts() -> tuple[Any, Any]:
        forward, recompute = nullcontext(), nullcontext()
        if selective:
            forward, recompute = create_selective_checkpoint_contexts(_keep_expensive)
        return forward, _frozen_around(recompute, modules)

    return checkpoint(fn, *args, use_reentrant=False, context_fn=contexts)


def checkpoint_levels(spec: CheckpointSpec, depth: int) -> tuple[dict[int, str], dict[int, str]]:
    """``(encoder levels, decoder levels)`` to checkpoint for ``spec``, each ``{level: mode}``:
    ``encoder``, ``decoder`` (levels ``0 .. depth - 2``), ``all``: those parts; ``selective``: both,
    selectively; level indices (0 = full resolution): both parts at those levels; a mapping of
    :data:`PARTS` to :data:`MODES`: each part so."""
    encoder, decoder = set(range(depth)), set(range(depth - 1))
    if spec is None or spec == "none":
        return {}, {}
    if isinstance(spec, str):  # a named choice is a mapping of the parts it names
        if spec not in CHECKPOINTING_CHOICES:
            raise ValueError(
                f"activation_checkpointing must be {', '.join(CHECKPOINTING_CHOICES)}, a list "
                f"of level indices or a mapping of {'/'.join(PARTS)} to {'/'.join(MODES)}; "
                f"got {spec!r}"
            )
        mode = "selective" if spec == "selective" else "full"
        spec = {part: mode for part in PARTS if spec in (part, "all", "selective")}
    if isinstance(spec, Mapping):
        check_modes(spec, PARTS)
        return (
            dict.fromkeys(encoder, spec["encoder"]) if "encoder" in spec else {},
            dict.fromkeys(decoder, spec["decoder"]) if "decoder" in spec else {},
        )
    levels = {int(i) for i in spec}
    if not levels <= encoder:
        raise ValueError(
            f"activation_checkpointing={list(spec)}: levels must lie in 0..{depth - 1}"
        )
    return dict.fromkeys(levels, "full"), dict.fromkeys(levels & decoder, "full")


def chain_pieces(layers: Sequence[nn.Module]) -> list[list[nn.Module]]:
    """``layers`` (a chain: each takes the previous one's output) cut after each convolution a
    selective segment keeps (any but a :func:`cheap_convolution`); the last piece (possibly
    empty) follows the last of them."""
    pieces: list[list[nn.Module]] = [[]]
    for layer in layers:
        pieces[-1].append(layer)
        if isinstance(layer, CONVOLUTIONS) and not cheap_convolution(
            layer.weight, layer.transposed, layer.stride, layer.groups
        ):
            pieces.append([])
    return pieces


def selective_chain(
    layers: Sequence[nn.Module],
    *args: Any,
    before: Callable[..., torch.Tensor] | None = None,
    before_modules: Sequence[nn.Module] = (),
) -> torch.Tensor:
    """``layers(before(*args))`` as selective segments, one per piece of :func:`chain_pieces`.

    Each segment recomputes only its own norm and activation in backward, one map at a time
    (one segment over the chain would rebuild them all at once, bringing the peak back). A first
    piece of one convolution and a last piece of norm + in-place activation run unsegmented: a
    segment would keep the same tensors and recompute for nothing. ``before`` (a decoder's
    upsample + concat, a max pooling; its modules ``before_modules``) joins the first segment,
    so its outputs are recomputed, not kept."""
    pieces = chain_pieces(layers)
    last: list[nn.Module] = []
    if (
        len(pieces) > 1
        and any(getattr(layer, "inplace", False) for layer in pieces[-1])
        and not any(isinstance(layer, CONVOLUTIONS) for layer in pieces[-1])
    ):
        last = pieces.pop()
    first, *rest = [piece for piece in pieces if piece]
    run = nn.Sequential(*first)
    if before is not None:
        x = checkpoint_segment(
            lambda *a: run(before(*a)), [*before_modules, *first], *args, selective=True
        )
    elif len(first) == 1:
        x = run(*args)
    else:
        x = checkpoint_segment(run, first, *args, selective=True)
    for piece in rest:
        x = checkpoint_segment(nn.Sequential(*piece), piece, x, selective=True)
    return nn.Sequential(*last)(x)


def check_modes(spec: Mapping[Any, Any], parts: Sequence[str] | None = None) -> None:
    """Raise ``ValueError`` unless every value of the mapping ``spec`` is one of :data:`MODES`
    and (``parts`` given) every key one of ``parts``."""
    if not spec:
        raise ValueError("activation_checkpointing: an empty mapping checkpoints nothing")
    for part, mode in spec.items():
        if parts is not None and part not in parts:
            raise ValueError(
                f"activation_checkpointing: {part!r} is not a part; a mapping names "
                f"{', '.join(parts)}"
            )
        if mode not in MODES:
            raise ValueError(
                f"activation_checkpointing: {part}={mode!r}; each part is checkpointed "
                f"{' or '.join(MODES)}"
            )
