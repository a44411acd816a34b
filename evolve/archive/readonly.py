"""How a read-only :class:`~evolve.archive.Archive` reads a run without creating a file beside it.

SQLite gives every reader of a WAL database its ``-wal`` and ``-shm`` files, creating them when
they are missing, and a read-only connection can never remove them again: opened with ``mode=ro``
on a finished run, a reader leaves both in the run folder for good. So:

* with no ``-wal`` beside the file, no writer has it open and the file holds every row: it is
  opened ``immutable`` (nothing created, nothing locked), and opened again as soon as a ``-wal``
  appears or the file changes (a resumed run, ``evolve promote``);
* with a ``-wal`` (a writer at work, or one that was killed), ``mode=ro`` reads through the
  writer's files, and the connection is closed after each read, so that a writer that ends while
  nobody is reading is the last connection and removes its files, as it does alone.

The dashboard reads a gateway's trace store and a run's memory store the same way
(:func:`connect_read_only`).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any


def files_of(path: Path) -> tuple[Any, ...]:
    """What says whether ``path`` changed: whether a ``-wal`` is beside it, and its inode, size and mtime."""
    wal = os.path.exists(f"{path}-wal")
    try:
        st = path.stat()
    except OSError:  # moved or removed: opening again says so
        return (wal,)
    return wal, st.st_ino, st.st_size, st.st_mtime_ns


def connect_read_only(path: Path, *, timeout: float = 30.0) -> tuple[sqlite3.Connection, tuple[Any, ...] | None]:
    """A read-only connection to the SQLite file ``path`` that creates no file beside it, and the
    files it was opened on when it is ``immutable`` (None: it reads through a writer's ``-wal``;
    let it go after each read)."""
    files = files_of(path)
    how = "mode=ro" if files[0] else "mode=ro&immutable=1"
    conn = sqlite3.connect(
        f"{path.resolve().as_uri()}?{how}", uri=True, check_same_thread=False, isolation_level=None, timeout=timeout
    )
    conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    return conn, (None if files[0] else files)


class ReadOnly:
    """The read-only connection of one archive file, (re)opened as the files beside it say."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None
        self.depth = 0  # reads under way (the archive's lock is re-entrant)
        self._frozen: tuple[Any, ...] | None = None  # immutable: the files as they were when opened

    def connection(self) -> sqlite3.Connection:
        """The connection to read with now (a new one when the files changed or the last was let go)."""
        if self.conn is not None and (self.depth or self._frozen is None or self._frozen == files_of(self.path)):
            return self.conn  # (never changed under a read that is using it)
        self.close()
        self.conn, self._frozen = connect_read_only(self.path)
        return self.conn

    def done(self) -> None:
        """A read ended: let go of a connection through a writer's files (see the module docstring)."""
        if self.depth == 0 and self._frozen is None:
            self.close()

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()
