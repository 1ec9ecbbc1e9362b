"""Memory sizes as a user writes them."""

from __future__ import annotations

import pytest

from volseg.utils.errors import UserInputError
from volseg.utils.units import MIB, parse_bytes


def test_parse_bytes():
    assert parse_bytes("16GiB", "k") == 16 * 2**30
    assert parse_bytes("24 GB", "k") == 24 * 10**9
    assert parse_bytes("1.5MiB", "k") == int(1.5 * MIB)
    assert parse_bytes(1024, "k") == 1024
    with pytest.raises(UserInputError, match="memory.budget=16 parsecs"):
        parse_bytes("16 parsecs", "memory.budget")
