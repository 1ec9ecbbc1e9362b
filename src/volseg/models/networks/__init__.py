"""Networks: :func:`adapter_for` gives a network class's :class:`NetworkAdapter` (its family's, else
the generic one, right for any ``nn.Module``). Another package registers its own (which wins) under
the entry-point group :data:`ENTRY_POINTS`::

    [project.entry-points."volseg.network_adapters"]
    "mypkg.nets.MyUNet" = "mypkg.adapters:MyUNetAdapter"
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Any

from hydra.utils import get_class
from torch import nn

from volseg.models.networks.contract import NetworkAdapter
from volseg.models.networks.foreign import DynamicUNetAdapter, Pytorch3DUNetAdapter
from volseg.models.networks.monai_nets import (
    BasicUNetAdapter,
    DynUNetAdapter,
    SegResNetAdapter,
    SwinUNETRAdapter,
    UNETRAdapter,
)
from volseg.models.networks.unet3d import UNet3DAdapter

__all__ = ["ADAPTERS", "ENTRY_POINTS", "NetworkAdapter", "adapter_for"]

#: (class path, adapter): a network class that is (a subclass of) one of these gets its adapter
ADAPTERS: tuple[tuple[str, NetworkAdapter], ...] = (
    ("volseg.models.unet.UNet3D", UNet3DAdapter()),
    ("monai.networks.nets.DynUNet", DynUNetAdapter()),
    ("monai.networks.nets.SegResNet", SegResNetAdapter()),
    ("monai.networks.nets.SwinUNETR", SwinUNETRAdapter()),
    ("monai.networks.nets.BasicUNet", BasicUNetAdapter()),
    ("monai.networks.nets.UNETR", UNETRAdapter()),
    # optional packages (the networks extra): an adapter whose class does not import is skipped
    ("dynamic_network_architectures.architectures.unet.PlainConvUNet", DynamicUNetAdapter()),
    ("dynamic_network_architectures.architectures.unet.ResidualEncoderUNet", DynamicUNetAdapter()),
    ("pytorch3dunet.unet3d.model.AbstractUNet", Pytorch3DUNetAdapter()),
)
GENERIC = NetworkAdapter()
#: the entry-point group other packages register their network adapters under
ENTRY_POINTS = "volseg.network_adapters"


@cache
def registered() -> tuple[tuple[str, NetworkAdapter], ...]:
    """``(class path, adapter)`` of every adapter, the registered ones first."""
    plugins = tuple((ep.name, ep.load()()) for ep in entry_points(group=ENTRY_POINTS))
    return (*plugins, *ADAPTERS)


def adapter_for(network: str | type | nn.Module) -> NetworkAdapter:
    """The adapter of ``network``: a class path, a class or a module."""
    if isinstance(network, nn.Module):
        cls: Any = type(network)
    elif isinstance(network, str):
        cls = get_class(network)
    else:
        cls = network
    if not isinstance(cls, type):
        return GENERIC
    tops = {klass.__module__.split(".")[0] for klass in cls.__mro__}
    for path, adapter in registered():
        if path.split(".")[0] not in tops:  # no class of that package: not imported to check
            continue
        try:
            family = get_class(path)
        except ImportError:  # an optional package (the networks extra) not installed
            continue
        if issubclass(cls, family):
            return adapter
    return GENERIC
