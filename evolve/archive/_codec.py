"""How values are stored: JSON blobs (raw or zlib), numeric columns kept finite, keys
queried in chunks."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence

from evolve.errors import ArchiveError

# With Archive(compress=N > 0), JSON blobs at least this long are zlib-compressed at level N
# (1 is the sensible choice: ~2.7x smaller; slower levels gain a few percent more). Off by
# default: on a small 2-core machine it doubles the cost of add_trajectories.
_COMPRESS_MIN = 256
_ENC_RAW, _ENC_ZLIB = 0, 1
_CHUNK = 500  # keys per "IN (...)" query


def pack(text: str, level: int = 0) -> tuple[int, bytes]:
    """Encode a JSON text for storage: zlib when it is long enough and it helps, else raw.

    The window and memory level are sized to the input (any zlib reader inflates them):
    a full 32 KiB window costs a fixed ~50 us per call in allocation alone, more than
    compressing a typical 3 KB trajectory, and gains nothing on inputs that are shorter.
    """
    raw = text.encode("utf-8")
    if level and len(raw) >= _COMPRESS_MIN:
        wbits = min(15, max(9, (len(raw) - 1).bit_length()))
        c = zlib.compressobj(level, zlib.DEFLATED, wbits, max(1, min(8, wbits - 7)))
        z = c.compress(raw) + c.flush()
        if len(z) < len(raw):
            return _ENC_ZLIB, z
    return _ENC_RAW, raw


def unpack(enc: int, data: bytes) -> str:
    if enc == _ENC_ZLIB:
        data = zlib.decompress(data)
    elif enc != _ENC_RAW:
        raise ArchiveError(f"unknown blob encoding {enc} in the archive (written by a newer evolvekit?)")
    return bytes(data).decode("utf-8")


def finite(x: float) -> float:
    # SQLite stores NaN as NULL; keep the columns numeric (the full JSON keeps the truth).
    return 0.0 if x is None or math.isnan(x) else float(x)


def chunks(seq: Sequence[str], n: int = _CHUNK) -> Iterator[Sequence[str]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]
