"""Read an offline W&B run's ``run-<id>.wandb`` file back (the history, config and run records).

wandb >= 0.18 writes this file from its Go core and ships no Python reader, so this follows the
format the old ``wandb.sdk.internal.datastore`` read: a 7-byte header (``:W&B``, magic, version),
then LevelDB-log records in 32 KiB blocks, each a protobuf ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
RECORD_HEADER = struct.Struct("<IHB")  # crc32c, data length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path, timeout_s: float = 60.0) -> list[wandb_internal_pb2.Record]:
    """All records of a finished run. ``wandb.finish()`` can return before W&B's core process has
    written the last records (seen on a loaded machine), so wait for the ``exit`` record."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _parse(Path(path).read_bytes(), path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record after {timeout_s} s")
        time.sleep(0.2)


def _parse(data: bytes, path: Path) -> list[wandb_internal_pb2.Record]:
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    records, pending, pos = [], b"", 7
    while pos + RECORD_HEADER.size <= len(data):
        if BLOCK - pos % BLOCK < RECORD_HEADER.size:  # block trailer: zero padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = RECORD_HEADER.unpack_from(data, pos)
        pos += RECORD_HEADER.size
        if pos + length > len(data):  # still being written
            break
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 0 and length == 0:  # zero padding at the end
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def history_keys(records: list[wandb_internal_pb2.Record]) -> set[str]:
    """Every key logged with ``run.log`` (nested keys joined with ``/``)."""
    return {
        item.key or "/".join(item.nested_key)
        for r in records
        if r.WhichOneof("record_type") == "history"
        for item in r.history.item
    }


def run_record(records: list[wandb_internal_pb2.Record]) -> wandb_internal_pb2.RunRecord:
    return next(r.run for r in records if r.WhichOneof("record_type") == "run")


def config_keys(records: list[wandb_internal_pb2.Record]) -> set[str]:
    return {
        item.key or "/".join(item.nested_key)
        for r in records
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
