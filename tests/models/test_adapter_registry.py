"""A network adapter registered by another package, without editing volseg: an installed
distribution's ``volseg.network_adapters`` entry point names the network class and its adapter."""

from __future__ import annotations

import sys
import textwrap

from volseg.models import networks
from volseg.models.networks import ENTRY_POINTS, GENERIC, adapter_for

PLUGIN = """
from torch import nn

from volseg.models.networks import NetworkAdapter


class TinyNet(nn.Module):
    pass


class TinyNetAdapter(NetworkAdapter):
    pass
"""


def test_an_installed_package_registers_its_adapter_by_entry_point(tmp_path, monkeypatch):
    (tmp_path / "tinynet_plugin.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "tinynet_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tinynet-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINTS}]\ntinynet_plugin.TinyNet = tinynet_plugin:TinyNetAdapter\n"
    )
    networks.registered.cache_clear()
    assert adapter_for("torch.nn.Identity") is GENERIC  # nothing registered for it
    monkeypatch.syspath_prepend(str(tmp_path))
    networks.registered.cache_clear()  # the registry is read once per process: read it again
    try:
        found = adapter_for("tinynet_plugin.TinyNet")
        assert type(found).__name__ == "TinyNetAdapter"
        assert type(found).__module__ == "tinynet_plugin"
        # a subclass of the registered network gets its adapter too
        subclass = type("Wider", (sys.modules["tinynet_plugin"].TinyNet,), {})
        assert adapter_for(subclass) is found
    finally:
        networks.registered.cache_clear()
    assert adapter_for("volseg.models.unet.UNet3D") is not GENERIC  # volseg's own still there
