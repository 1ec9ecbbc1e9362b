"""Pictures of memory: the per-step timeline and the per-module activation bars, as PNGs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_timeline(history: list[dict[str, float]], path: Path, device_kind: str) -> Path:
    """Allocated, reserved and per-step peak allocated (MiB) against the training step."""
    steps = [r["step"] for r in history]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    ax.plot(steps, [r["mem/peak_allocated_mib"] for r in history], label="peak allocated (step)")
    ax.plot(steps, [r["mem/reserved_mib"] for r in history], label="reserved", linestyle="--")
    ax.plot(steps, [r["mem/allocated_mib"] for r in history], label="allocated (step end)")
    where = "GPU (CUDA caching allocator)" if device_kind == "cuda" else "host (process RSS)"
    ax.set(xlabel="training step", ylabel="MiB", title=f"Memory per training step: {where}")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_layer_bars(activations_mib: dict[str, float], path: Path) -> Path:
    """Horizontal bars: activation MiB each block's forward left alive, largest on top."""
    names = list(activations_mib)[::-1]
    values = [activations_mib[n] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5), dpi=100)
    ax.barh(names, values, color="tab:orange")
    ax.set(xlabel="activations kept for backward (MiB)", title="Activation memory by module")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def png_as_rgb(path: Path) -> np.ndarray:
    """A PNG file as an RGB array ``(H, W, 3)`` uint8 (for TensorBoard)."""
    # matplotlib reads a PNG as floats in [0, 1]
    return (plt.imread(path)[..., :3] * 255).round().astype(np.uint8)
