"""Activation offload: tensors saved for backward wait in host memory during forward."""

from __future__ import annotations

import torch


def host_copy(tensor: torch.Tensor, pin_memory: bool = False) -> torch.Tensor:
    """A host copy of ``tensor`` with the same strides (``torch.preserve_format``)."""
    host = torch.empty_like(tensor, device="cpu", pin_memory=pin_memory)
    host.copy_(tensor)  # blocking: the device tensor may be freed right after
    return host


class OffloadToHost(torch.autograd.graph.saved_tensors_hooks):
    """Keep every tensor saved for backward in (pinned) host memory; each returns to its device
    for its own backward op.

    Unlike ``torch.autograd.graph.save_on_cpu(pin_memory=True)``, whose pinned buffers are
    contiguous (NCDHW), the host copy keeps the saved tensor's strides: ``channels_last_3d``
    activations come back channels-last, so backward does not convert each one (a copy of the
    tensor's size and the time it takes) to match its channels-last gradients. Tensors already
    on the host are kept as they are.

    Args:
        pin_memory: page-locked host buffers (CUDA: faster copies back in backward).
    """

    def __init__(self, pin_memory: bool = False) -> None:
        def pack(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
            if tensor.device.type == "cpu":
                return tensor.device, tensor
            return tensor.device, host_copy(tensor, pin_memory)

        def unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
            device, host = packed
            return host.to(device, non_blocking=pin_memory)

        super().__init__(pack, unpack)
