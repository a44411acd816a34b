"""Reading back what W&B wrote offline: the records of a ``run-ID.wandb`` file (W&B's transaction
log: a LevelDB-style log of protobuf ``Record`` messages, the format ``wandb sync`` uploads)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7  # crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of a .wandb file, in order (the checksums are checked)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pos, pending = [], 7, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block too small for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, f"bad checksum at {pos} in {path}"
        pos += HEADER + length
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        else:
            pending += chunk
        rec = pb.Record()
        rec.ParseFromString(pending)
        out.append(rec)
        pending = b""
    return out


def history(recs: list[Any]) -> dict[int, dict[str, Any]]:
    """``step -> {key: value}`` of the history records."""
    out: dict[int, dict[str, Any]] = {}
    for r in recs:
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            out.setdefault(int(row.pop("_step", r.history.step.num)), {}).update(
                {k: v for k, v in row.items() if not k.startswith("_")}
            )
    return out


def of_type(recs: list[Any], kind: str) -> list[Any]:
    return [getattr(r, kind) for r in recs if r.WhichOneof("record_type") == kind]
