"""The calls ``evolve serve`` records (it keeps no trace store): each appended as one JSON line
``{"session", "system_id", "time", "call": <LLMCall>}`` to a file (``RUN_DIR/serve/calls.jsonl``),
and the last ``keep`` of each session kept in memory for a reader in the same process."""

from __future__ import annotations

import collections
import json
import threading
import time
from pathlib import Path
from typing import Any

from evolve.types import LLMCall


class CallLog:
    """Calls appended to ``path`` (created, with its folder, on the first call); closed by :meth:`close`."""

    def __init__(self, path: Path, keep: int = 10_000) -> None:
        self.path = path
        self._keep = max(1, int(keep))
        self._calls: dict[str, collections.deque[LLMCall]] = {}
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()
        self._file: Any = None

    def record(self, session: str, system_id: str, call: LLMCall) -> None:
        """Keep ``call`` (answered by ``system_id`` in ``session``) and append it to the file."""
        line = json.dumps(
            {"session": session, "system_id": system_id, "time": time.time(), "call": call.model_dump(mode="json")},
            ensure_ascii=False,
        )
        with self._lock:
            calls = self._calls.get(session)
            if calls is None:
                calls = self._calls[session] = collections.deque(maxlen=self._keep)
            calls.append(call)
        with self._file_lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._file.write(line + "\n")
            self._file.flush()

    def calls(self, session: str = "default") -> list[LLMCall]:
        """The calls recorded in this process for ``session`` (the last ``keep``), oldest first."""
        with self._lock:
            return list(self._calls.get(session, ()))

    def sessions(self) -> list[str]:
        with self._lock:
            return sorted(self._calls)

    def close(self) -> None:
        with self._file_lock:
            if self._file is not None:
                self._file.close()
                self._file = None


__all__ = ["CallLog"]
