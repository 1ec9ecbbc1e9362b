"""The network contract: what the plan, the planner and the memory levers need from a network.

:class:`NetworkAdapter` serves any ``nn.Module`` mapping ``(B, C_in, D, H, W)`` to logits
``(B, K, D, H, W)``; a family with more to say (divisibility, a topology to plan, its own
checkpointing, deep supervision) subclasses it. Nothing outside the adapters reads a network's own
config keys. Errors are ``ValueError`` naming the lever's key below ``model.``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

# torch's private names models/ uses, imported here only: torch 2.13 has no public path to them
# (no torch.utils.pytree; the checkpoint wrapper is in torch.distributed.algorithms._checkpoint
# alone). tests/models/test_torch_private.py says what breaks where torch moves one
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.utils._pytree import tree_leaves, tree_map, tree_map_only

from volseg.models.checkpointing import (
    CONVOLUTIONS,
    CheckpointSpec,
    check_modes,
    checkpoint_segment,
    selective_chain,
)
from volseg.utils.config import plain


@dataclass(frozen=True)
class Planned:
    """One value the adapter decided or checked for the plan: ``key`` (a config key, e.g.
    ``model.net.depth``), its ``value``, ``source`` (``configured`` or ``planned``), ``why``."""

    key: str
    value: Any
    source: str
    why: str = ""


def child_blocks(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """The network's blocks, by qualified name: its children that hold parameters (a
    ``ModuleList``/``ModuleDict``'s entries in its place), but for one that holds another block
    (DynUNet's ``skip_layers``): checkpointing it would make most of the network one segment."""
    found: list[tuple[str, nn.Module]] = []
    for name, child in net.named_children():
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            found += [(f"{name}.{n}", c) for n, c in child.named_children()]
        else:
            found.append((name, child))
    found = [(n, m) for n, m in found if any(True for _ in m.parameters())]
    ids = {id(m) for _, m in found}
    return [(n, m) for n, m in found if not any(id(s) in ids for s in list(m.modules())[1:])]


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor ``value`` holds, in torch's pytree order (a list's first, a dict's first
    value, nested): deep supervision's full-resolution output, a dict's logits."""
    return next((leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)), None)


def _recompute(module: nn.Module, *args: Any, selective: bool, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` as :func:`checkpoint_segment`. Arguments may be containers of
    tensors: the forward runs on the caller's own (what it does to them, a decoder popping its
    skips, the caller sees), the recomputation on a copy of them as they were passed."""
    if not any(isinstance(v, list | tuple | dict) for v in (*args, *kwargs.values())):
        return checkpoint_segment(partial(module, **kwargs), [module], *args, selective=selective)
    as_passed = tree_map(lambda leaf: leaf, (args, kwargs))  # containers rebuilt, leaves shared
    forward = iter([(args, kwargs)])  # the first call, the forward, gets the caller's own

    def run() -> Any:
        call_args, call_kwargs = next(forward, None) or tree_map(lambda leaf: leaf, as_passed)
        return module(*call_args, **call_kwargs)

    return checkpoint_segment(run, [module], selective=selective)


def _recompute_chain_selectively(
    layers: Sequence[nn.Module], module: nn.Module, *args: Any, **kwargs: Any
) -> Any:
    """A block whose forward is the chain ``layers``: called on one tensor, a
    :func:`~volseg.models.checkpointing.selective_chain`; otherwise one selective segment."""
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
        return _recompute(module, *args, selective=True, **kwargs)
    return selective_chain(layers, args[0])


def sequential_inside(module: nn.Module) -> nn.Sequential | None:
    """``module`` itself where it is an ``nn.Sequential`` whose forward is Sequential's (each
    child on the previous one's output); ``None`` otherwise."""
    return module if type(module).forward is nn.Sequential.forward else None


def flatten_chain(
    module: nn.Module, inside: Callable[[nn.Module], nn.Sequential | None] = sequential_inside
) -> list[nn.Module]:
    """The layers ``module`` runs one after the other, each on the previous one's output: the
    leaves of the nested chains ``inside`` finds (``[module]`` where it finds none)."""
    chain = inside(module)
    if chain is None:
        return [module]
    return [leaf for child in chain for leaf in flatten_chain(child, inside)]


def stride_product(strides: Any, stages: int = 1) -> list[int]:
    """Per axis, the product of ``strides``: an int for every axis of ``stages`` stages, or one
    int or ``[z, y, x]`` per stage (DynUNet's and nnU-Net's ``strides``)."""
    value = plain(strides)
    entries = value if isinstance(value, list | tuple) else [value] * stages
    per_axis = [
        [int(v) for v in e] if isinstance(e, list | tuple) else [int(e)] * 3 for e in entries
    ]
    return [math.prod(s[axis] for s in per_axis) for axis in range(3)]


class NetworkAdapter:
    """The generic adapter: any ``nn.Module``. Divisibility: probed on meta tensors
    (:mod:`volseg.models.networks.probe`). Checkpointing: torch's
    ``apply_activation_checkpointing`` on the blocks of :meth:`blocks`, ``full`` or ``selective``.
    Placement: ``{submodule name: device}``, a submodule's inputs moved to its device by a
    forward pre-hook (``Tensor.to``: backward flows through every device)."""

    #: what the adapter is for, in docs and errors
    family = "any nn.Module"
    #: the named checkpointing settings, least recomputation first (the planner tries them so)
    checkpointing_choices: tuple[str, ...] = ("none", "selective", "all")
    #: what a list in ``model.activation_checkpointing`` names
    checkpointing_list = "submodule names"
    #: what the keys of a mapping ``{part: full|selective}`` name
    checkpointing_mapping = "submodule names"

    # ---- config side -------------------------------------------------------------------
    def plan(self, net_cfg: Any, patch: Sequence[int]) -> list[Planned]:
        """The network's own settings planned for the training patch ``patch`` ([D, H, W]
        voxels); a bad one: ``ValueError`` naming the key below ``model.net``."""
        return []

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int] | None:
        """What each patch side ``[D, H, W]`` must divide by, from the network's settings (after
        :meth:`plan`; ``patch`` ``None``: before the patch is planned from the data); ``None``: not
        known from the settings (the plan probes the network)."""
        return None

    def deep_supervision(self, net_cfg: Any) -> bool:
        """Whether the network returns one output per decoder level in training."""
        return False

    def sized_for(self, net_cfg: Any, patch: Sequence[int]) -> dict[str, Any]:
        """The constructor's arguments that must follow the training patch ``patch`` ([D, H, W]
        voxels), by name (the planner moves them with the patch); none for any input size."""
        return {}

    # ---- module side -------------------------------------------------------------------
    def blocks(self, net: nn.Module) -> list[tuple[str, nn.Module]]:
        """The blocks ``all`` checkpoints, by qualified name: :func:`child_blocks`."""
        return child_blocks(net)

    def chain(self, block: nn.Module) -> list[nn.Module]:
        """The layers ``block`` runs one after the other (``selective`` cuts the chain after each
        kept convolution); ``[block]`` where its forward is not known to be a chain."""
        return flatten_chain(block)

    def check_checkpointing(self, net: nn.Module, spec: CheckpointSpec) -> None:
        """Raise ``ValueError`` when ``spec`` is not a setting this network takes."""
        if spec is None or spec in self.checkpointing_choices:
            return
        if isinstance(spec, Mapping):
            check_modes(spec)
        listed = isinstance(spec, Mapping | Sequence) and not isinstance(spec, str) and spec
        if not listed or not all(isinstance(name, str) for name in spec):
            raise self._bad_checkpointing(net, spec)
        self._check_submodules(net, spec, "activation_checkpointing")

    def _check_submodules(self, net: nn.Module, names: Any, key: str) -> None:
        """``ValueError`` naming ``key`` for the first of ``names`` not in ``net``."""
        for name in names:
            try:
                net.get_submodule(name)
            except AttributeError:
                raise ValueError(
                    f"{key}: {type(net).__name__} has no submodule {name!r}; "
                    f"its blocks: {', '.join(n for n, _ in self.blocks(net))}"
                ) from None

    def _bad_checkpointing(self, net: nn.Module, spec: Any) -> ValueError:
        return ValueError(
            f"activation_checkpointing: {type(net).__name__} ({self.family}) takes "
            f"{', '.join(self.checkpointing_choices)}, a list of {self.checkpointing_list} or a "
            f"mapping of {self.checkpointing_mapping} to full/selective; got {spec!r}"
        )

    def checkpointed_modes(
        self, net: nn.Module, spec: CheckpointSpec
    ) -> list[tuple[nn.Module, str]]:
        """The modules ``spec`` checkpoints, each with its mode (``full`` or ``selective``)."""
        if spec is None or spec == "none":
            return []
        if spec == "all":
            return [(m, "full") for _, m in self.blocks(net)]
        if spec == "selective":
            # a lone convolution or linear layer is left alone: a segment would keep its output
            # (SAVED_OPS) where without one it may be freed as soon as it is used (nnU-Net's
            # transposed convolutions, consumed by a concatenation; its deep supervision heads)
            single = (*CONVOLUTIONS, nn.Linear)
            return [(m, "selective") for _, m in self.blocks(net) if not isinstance(m, single)]
        if isinstance(spec, Mapping):
            return [(net.get_submodule(name), mode) for name, mode in spec.items()]
        return [(net.get_submodule(name), "full") for name in spec]

    def apply_checkpointing(self, net: nn.Module, spec: CheckpointSpec) -> None:
        """Checkpoint what ``spec`` chooses, in place (state_dict keys unchanged: torch's
        checkpoint wrapper strips its prefix)."""
        modes = {id(m): mode for m, mode in self.checkpointed_modes(net, spec)}
        wrapped: set[int] = set()

        def once(module: nn.Module) -> bool:
            # a module reached a second time (nnU-Net's decoder holds the encoder) is wrapped
            # already: wrapping it again would recompute it twice in backward
            if id(module) not in modes or id(module) in wrapped:
                return False
            wrapped.add(id(module))
            return True

        def wrap(module: nn.Module) -> nn.Module:
            layers, selective = self.chain(module), modes[id(module)] == "selective"
            if selective and len(layers) > 1:
                recompute = partial(_recompute_chain_selectively, layers)
            else:
                recompute = partial(_recompute, selective=selective)
            return checkpoint_wrapper(module, checkpoint_fn=recompute)

        if modes:
            apply_activation_checkpointing(net, checkpoint_wrapper_fn=wrap, check_fn=once)

    def check_placement(self, net: nn.Module, placement: Mapping[str, str]) -> None:
        """Raise ``ValueError`` when ``placement`` names no submodule of ``net``."""
        self._check_submodules(net, placement, "placement")

    def place(self, net: nn.Module, placement: Mapping[str, str]) -> None:
        """Move each named submodule to its device; its tensor inputs follow it there."""
        # placed again at every stage's start: one hook per submodule
        for handle in getattr(net, "_volseg_placement_hooks", []):
            handle.remove()
        hooks = []
        for name, device in placement.items():
            module = net.get_submodule(name).to(device)
            move = partial(_inputs_to, torch.device(device))
            hooks.append(module.register_forward_pre_hook(move, with_kwargs=True))
        net._volseg_placement_hooks = hooks


def _inputs_to(device: torch.device, module: nn.Module, args: tuple, kwargs: dict) -> tuple:
    return tree_map_only(torch.Tensor, lambda t: t.to(device), (args, kwargs))
