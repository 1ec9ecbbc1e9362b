"""``memory.allocator``: PyTorch's CUDA caching-allocator settings as config values, written into
``PYTORCH_CUDA_ALLOC_CONF`` before anything can start CUDA (torch reads it once). Keys and checks
are torch 2.13's (``c10/cuda/CUDAAllocatorConfig.cpp``); ``backend`` is refused (torch reads it at
import). Any key set replaces the environment's value; none set keeps it."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from volseg.utils.config import plain
from volseg.utils.errors import UserInputError

log = logging.getLogger(__name__)

#: the variables torch reads (>= 2.9 reads both, in either order): both are written
ENV = "PYTORCH_CUDA_ALLOC_CONF"
ENV_GENERIC = "PYTORCH_ALLOC_CONF"
NODE = "memory.allocator"
MIB_MIN_SPLIT = 20  # kLargeBuffer in MiB: the least max_split_size_mb / max_non_split_rounding_mb


def _flag(value: Any) -> str:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return str(value)  # torch takes True/False only


def _whole(minimum: int, power_of_2: bool = False, maximum: int | None = None) -> Callable:
    def check(value: Any) -> str:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        ok = ok and (maximum is None or value <= maximum)
        ok = ok and (not power_of_2 or value & (value - 1) == 0)
        if not ok:
            kind = "a power of 2" if power_of_2 else "a whole number"
            upto = f" and <= {maximum}" if maximum is not None else ""
            raise ValueError(f"expected {kind} >= {minimum}{upto}")
        return str(value)

    return check


def _fraction(include_one: bool) -> Callable:
    def check(value: Any) -> str:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and value > 0 and (value <= 1 if include_one else value < 1)):
            raise ValueError(f"expected a number in (0, 1{']' if include_one else ')'}")
        return str(float(value))

    return check


def _divisions(value: Any) -> str:
    """A power of 2, or ``{MiB: divisions, '>': divisions}`` (torch's ``[256:1,512:2,>:4]``)."""
    if isinstance(value, Mapping):
        parts = []
        for size, divisions in value.items():
            if str(size) != ">":
                _whole(1, power_of_2=True)(int(size) if str(size).isdigit() else size)
            if divisions != 0:
                _whole(1, power_of_2=True)(divisions)
            parts.append(f"{size}:{divisions}")
        if not parts:
            raise ValueError("expected at least one interval")
        return f"[{','.join(parts)}]"
    return _whole(1, power_of_2=True)(value)


#: each option torch knows and how its value is checked and written
OPTIONS: dict[str, Callable[[Any], str]] = {
    "expandable_segments": _flag,
    "max_split_size_mb": _whole(MIB_MIN_SPLIT),
    "max_non_split_rounding_mb": _whole(MIB_MIN_SPLIT),
    "garbage_collection_threshold": _fraction(include_one=False),
    "roundup_power2_divisions": _divisions,
    "release_lock_on_cudamalloc": _flag,
    "pinned_use_cuda_host_register": _flag,
    "pinned_num_register_threads": _whole(1, power_of_2=True, maximum=128),
    "pinned_use_background_threads": _flag,
    "pinned_reserve_segment_size_mb": _whole(1),
    "graph_capture_record_stream_reuse": _flag,
    "per_process_memory_fraction": _fraction(include_one=True),
    "throw_on_cudamalloc_oom": _flag,
}


def alloc_conf(node: Any) -> str | None:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` value of a node; ``None`` when it sets none."""
    if node is None:
        return None
    node = plain(node)
    if not isinstance(node, Mapping):
        raise UserInputError(
            f"{NODE}={node}: expected allocator options as keys, e.g. "
            f"{NODE}.expandable_segments=true"
        )
    parts = []
    for key, value in node.items():
        if value is None:
            continue
        if key == "backend":
            raise UserInputError(
                f"{NODE}.backend: torch reads the allocator backend when it is imported, before "
                f"any config; set {ENV}=backend:{value} in the environment instead (the "
                "estimator models the native allocator only)"
            )
        if key not in OPTIONS:
            raise UserInputError(
                f"{NODE}.{key}: not an allocator option torch knows ({', '.join(OPTIONS)})"
            )
        try:
            parts.append(f"{key}:{OPTIONS[key](value)}")
        except (ValueError, TypeError) as err:
            raise UserInputError(f"{NODE}.{key}={value}: {err}") from None
    return ",".join(parts) or None


@dataclass(frozen=True)
class AllocatorChoice:
    """The allocator settings a run uses (``None``: torch's defaults), their source and why."""

    value: str | None
    source: str
    why: str


def resolve_allocator(node: Any, environ: Mapping[str, str] | None = None) -> AllocatorChoice:
    """The config's settings where it sets a key, else the environment's (torch 2.13 reads either
    variable), else torch's defaults."""
    environ = os.environ if environ is None else environ
    configured = alloc_conf(node)
    present = environ.get(ENV) or environ.get(ENV_GENERIC) or None
    if configured is not None:
        why = f"{ENV}, set before CUDA starts"
        if present is not None and present != configured:
            why += f"; replaces {present!r} of the environment"
        return AllocatorChoice(configured, "configured", why)
    if present is not None:
        return AllocatorChoice(present, "the environment", f"{ENV}; {NODE} sets no key")
    return AllocatorChoice(None, "default", "torch's defaults")


def apply_allocator(node: Any, environ: MutableMapping[str, str] | None = None) -> AllocatorChoice:
    """Write the config's settings into the environment; call it before CUDA starts."""
    environ = os.environ if environ is None else environ
    choice = resolve_allocator(node, environ)
    if choice.source != "configured":
        return choice
    if "replaces" in choice.why:  # the user's own setting of the environment is lost: say so
        log.warning("%s=%r: %s", NODE, choice.value, choice.why)
    environ[ENV] = environ[ENV_GENERIC] = choice.value
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        # a later job of a multirun in one process: the allocator has read its settings
        log.warning(
            "%s: CUDA started in this process before %s=%r was set; it applies to the processes "
            "this one starts",
            NODE,
            ENV,
            choice.value,
        )
    return choice


def run_allocator_node(cfg: DictConfig) -> Any:
    """The run's ``memory.allocator``: with ``plan=PATH`` the file's, this command's on top."""
    node = OmegaConf.select(cfg, NODE)
    if not cfg.get("plan"):
        return node
    try:
        planned = OmegaConf.load(str(cfg.plan)).config.memory.allocator
    except Exception:  # not a plan file, or one without the key
        return node
    command = plain(node) if isinstance(node, DictConfig) else {}
    return {**plain(planned or {}), **{k: v for k, v in command.items() if v is not None}}
