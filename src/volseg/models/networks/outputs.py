"""Which of what a network returns is the logits (``model.net_output``: a dict's key, a tuple's
index); a list or tuple without one is deep supervision."""

from __future__ import annotations

from typing import Any

import torch

#: a network output's key (a dict's) or index (a list's or tuple's); None: the output as it is
OutputKey = str | int | None


def select_output(out: Any, key: OutputKey) -> Any:
    """``out[key]``; ``out`` itself for ``None``."""
    if key is None:
        return out
    if isinstance(out, dict):
        return out[key]
    if isinstance(out, list | tuple):
        if not isinstance(key, int) or isinstance(key, bool):
            raise TypeError(f"an index (0 .. {len(out) - 1}) for a {type(out).__name__}")
        return out[key]
    raise TypeError(f"{type(out).__name__} has no entries")


def describe_output(out: Any) -> str:
    """``out``'s structure in words (``a tensor``, ``a dict (keys logits, aux)``, ...)."""
    if isinstance(out, torch.Tensor):
        return "a tensor"
    if isinstance(out, dict):
        return f"a dict (keys {', '.join(map(str, out))})"
    if isinstance(out, list | tuple):
        kinds = ", ".join(type(v).__name__.lower() for v in out)
        return f"a {type(out).__name__} of {len(out)} ({kinds})"
    return f"a {type(out).__name__}"
