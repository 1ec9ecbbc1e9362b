"""Activation offload: tensors saved for backward wait in host memory during forward."""

from __future__ import annotations

import torch


def host_copy(tensor: torch.Tensor, pin_memory: bool = False) -> torch.Tensor:
    """A host copy of ``tensor`` with the same strides (``torch.preserve_format``)."""
    host = torch.empty_like(tensor, device="cpu", pin_memory=pin_memory)
    host.copy_(tensor)  # blocking: the device tensor may be freed right after
    return host


def worth_offloading(tensor: torch.Tensor, min_voxels: int) -> bool:
    """Whether a saved ``(B, C, D, H, W)`` tensor has at least ``min_voxels`` voxels per channel."""
    return min_voxels <= 0 or (tensor.dim() >= 3 and tensor.shape[2:].numel() >= min_voxels)


class OffloadToHost(torch.autograd.graph.saved_tensors_hooks):
    """Keep every tensor saved for backward in (pinned) host memory until its backward op.

    Unlike ``torch.autograd.graph.save_on_cpu``, whose buffers are contiguous, the host copy keeps
    the tensor's strides: ``channels_last_3d`` activations come back channels-last, so backward
    converts none. ``min_voxels``: offload only tensors of at least that many voxels per channel (0:
    all; the full-resolution maps hold most of a U-Net's activations)."""

    def __init__(self, pin_memory: bool = False, min_voxels: int = 0) -> None:
        def pack(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
            if tensor.device.type == "cpu" or not worth_offloading(tensor, min_voxels):
                return torch.device("cpu"), tensor  # kept where it is: returned as it is
            return tensor.device, host_copy(tensor, pin_memory)

        def unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
            device, host = packed
            return host.to(device, non_blocking=pin_memory)  # a tensor kept in place: itself

        super().__init__(pack, unpack)
