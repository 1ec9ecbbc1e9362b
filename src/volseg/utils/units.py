"""Memory units: MiB for logs and tables, bytes in JSON, and sizes a user writes (``16GiB``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from volseg.utils.errors import UserInputError

MIB = 2**20
GIB = 2**30

#: the units :func:`parse_bytes` reads, lower case: decimal (kB, MB, ...) and binary (KiB, ...)
UNITS = {
    "": 1,
    "b": 1,
    **{f"{p}b": 10 ** (3 * n) for n, p in enumerate("kmgt", start=1)},
    **{f"{p}ib": 2 ** (10 * n) for n, p in enumerate("kmgt", start=1)},
}


def parse_bytes(value: Any, key: str) -> int:
    """``16GiB``, ``24 GB``, ``12000MiB`` or bytes -> bytes; ``key`` named in errors."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if match is None or match.group(2).lower() not in UNITS:
        raise UserInputError(
            f"{key}={value}: not a memory size; write e.g. 16GiB, 24GB, 12000MiB or bytes"
        )
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


@dataclass(frozen=True)
class Budget:
    """``memory.budget``: as it was written (``asked``, what messages name it by) and in bytes."""

    asked: Any
    nbytes: int

    @classmethod
    def of(cls, value: Any) -> Budget | None:
        """``memory.budget=value`` parsed once; ``None`` where it sets none."""
        return cls(value, parse_bytes(value, "memory.budget")) if value else None

    def __str__(self) -> str:
        return str(self.asked)
