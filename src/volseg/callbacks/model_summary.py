"""Lightning's rich model summary without its FLOPs column: Lightning counts FLOPs only for a
model with an ``example_input_array`` and prints ``0`` for every module otherwise; the planned
step's FLOPs are in ``plan.yaml`` (``estimate.flops_per_step``) and the training speed's log."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import (
    get_formatted_model_size,
    get_human_readable_count,
)


class ModelSummary(RichModelSummary):
    """:class:`RichModelSummary` with no FLOPs column and no ``Total FLOPs`` line."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            right = name in ("Params", "Params per Device", "In sizes", "Out sizes")
            table.add_column(name, justify="right" if right else "left")
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        frozen = total_parameters - trainable_parameters
        grid = Table.grid(expand=True)
        grid.add_column()
        grid.add_row(
            f"[bold]Parameters[/]: {get_human_readable_count(int(trainable_parameters)).strip()} "
            f"trainable, {get_human_readable_count(int(frozen)).strip()} frozen, "
            f"{get_formatted_model_size(model_size)} MB; modules "
            f"{total_training_modes['train']} in train mode, {total_training_modes['eval']} in "
            "eval mode"
        )
        console.print(grid)
