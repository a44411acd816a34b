"""A run's trackers while it runs (:class:`Tracking`), as the engine drives them.

* Built and opened when the engine is built, before the run directory is written: an unknown
  tracker, a bad param or a missing package was already refused when the task file was validated;
  a destination that does not answer now is a :class:`~evolve.trackers.base.TrackerError` (exit 2).
* Each tracker sends from a thread of its own, after every generation and once more at the end, so
  a slow or dead destination never slows the run nor changes what it computes.
* A failed send is a warning (``observer.message``) and nothing else: the tracker reads what it
  sends from the archive, so the next send catches up, and ``evolve track RUN_DIR --to NAME`` sends
  whatever is still missing after the run.
* At the end the run waits for the last send at most :data:`WAIT` seconds in all (5 after Ctrl-C).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from evolve.trackers.base import TrackedRun, Tracker

_UNSET = object()
WAIT = 120.0  # seconds a run waits at its end for its trackers' last sends (5 after Ctrl-C)


class _Sender(threading.Thread):
    """One tracker's thread: a sync each time it is woken, then ``close`` when told to stop."""

    def __init__(self, tracker: Tracker, run: TrackedRun, say: Callable[[str], None], named: str) -> None:
        super().__init__(name=f"evolve-track-{tracker.name}", daemon=True)
        self.tracker, self.run_view, self.say, self.named = tracker, run, say, named
        self.wake = threading.Event()
        self.status: Any = _UNSET
        self.failing: str | None = None  # the last failure, until a sync succeeds

    def hint(self) -> str:
        return f"evolve track {self.run_view.run_dir} --to {self.named}"

    def run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            stopping = self.status is not _UNSET
            self._sync()
            if stopping:
                try:
                    self.tracker.close(self.status)
                except Exception as e:  # noqa: BLE001 - the destination's failure is reported, never raised
                    self.say(
                        f"tracker {self.tracker.name} ({self.tracker.address}): could not end its run "
                        f"({type(e).__name__}: {_short(e)})"
                    )
                return

    def _sync(self) -> None:
        try:
            self.tracker.sync(self.run_view)
        except Exception as e:  # noqa: BLE001 - see the module docstring
            first = self.failing is None
            self.failing = f"{type(e).__name__}: {_short(e)}"
            if first:
                self.say(
                    f"tracker {self.tracker.name} ({self.tracker.address}) failed to send ({self.failing}); "
                    "the run goes on, the next generation catches up"
                )
            return
        if self.failing is not None:
            self.say(f"tracker {self.tracker.name}: caught up")
        self.failing = None


def _short(e: BaseException, n: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= n else text[: n - 1] + "…"


class Tracking:
    """The trackers of ``configs`` (the task's ``track`` section), opened now (see the module
    docstring); :meth:`attach` starts sending, :meth:`sync` asks for a send, :meth:`close` ends."""

    def __init__(self, configs: Sequence[Any], observer: Any = None, *, wait: float | None = None) -> None:
        from evolve.trackers import build

        # the console's observer when there is one; else (the Python API) a logged warning: a tracker
        # that cannot send is never silent
        self.say: Callable[[str], None] = getattr(observer, "message", None) or logging.getLogger(__name__).warning
        self.wait = WAIT if wait is None else wait
        self.names = [c.name for c in configs]  # as the task file names them (a plugin's import path)
        self.trackers: list[Tracker] = [build(c.name, dict(c.params), path=f"track.{i}") for i, c in enumerate(configs)]
        for t in self.trackers:
            t.open()
        self._senders: list[_Sender] = []

    def attach(self, run: TrackedRun) -> None:
        """Start sending ``run`` (a first send at once: a resumed run catches up what it missed)."""
        for t, named in zip(self.trackers, self.names):
            sender = _Sender(t, run, self.say, named)
            self._senders.append(sender)
            sender.start()
            sender.wake.set()

    def sync(self) -> None:
        """Ask every tracker to send what is new (returns at once)."""
        for s in self._senders:
            s.wake.set()

    def close(self, status: str | None) -> None:
        """A last send, then end each tracker's run as ``status``; waits at most ``wait`` seconds
        in all (5 when ``status`` is ``killed``) and says what is left to send."""
        if not self._senders:  # never attached (the run did not start): nothing was sent
            for t in self.trackers:
                try:
                    t.close(None)
                except Exception:  # noqa: BLE001 - nothing to end
                    pass
            return
        for s in self._senders:
            s.status = status
            s.wake.set()
        deadline = time.monotonic() + (5.0 if status == "killed" else self.wait)
        for s in self._senders:
            s.join(max(0.0, deadline - time.monotonic()))
            if s.is_alive():
                self.say(
                    f"tracker {s.tracker.name} ({s.tracker.address}) is still sending; the run ends without it. "
                    f"Send the rest with: {s.hint()}"
                )
            elif s.failing is not None:
                self.say(
                    f"tracker {s.tracker.name} ({s.tracker.address}) could not send everything ({s.failing}). "
                    f"Send the rest with: {s.hint()}"
                )
        self._senders = []


__all__ = ["Tracking"]
