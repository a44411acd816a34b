"""The background WAL checkpointer of an open archive."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

# The checkpointer runs once the log passes evolve.archive._CKPT_BYTES (see there); the
# writer's own auto-checkpoint stays on as a backstop at BACKSTOP_PAGES.
BACKSTOP_PAGES = 16384


def _ckpt_bytes() -> int:
    """``evolve.archive._CKPT_BYTES``, read from the package at every check (it is tuned there)."""
    import evolve.archive

    return evolve.archive._CKPT_BYTES


class Checkpointer:
    """A daemon thread that runs passive WAL checkpoints on its own connection when the
    log grows past ``_CKPT_BYTES``. Holds no reference to the Archive."""

    def __init__(self, path: Path) -> None:
        self._wal = Path(str(path) + "-wal")
        self._path = path
        self._event = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name=f"evolve-archive-checkpoint:{path.parent.name}", daemon=True
        )
        self._thread.start()

    def kick(self) -> None:
        self._event.set()

    def stop(self, wait: bool = False) -> None:
        self._stopped = True
        self._event.set()
        if wait and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None, timeout=30.0)
        except sqlite3.Error:  # pragma: no cover - the writer's backstop takes over
            return
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            while not self._stopped:
                self._event.wait(1.0)
                self._event.clear()
                if self._stopped:
                    break
                try:
                    if self._wal.stat().st_size >= _ckpt_bytes():
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except (OSError, sqlite3.Error):
                    pass
        finally:
            conn.close()
