"""The archive: every system, its lineage, every trajectory and score of a run, in one place.

A run directory holds ``archive.sqlite`` (an embedded SQLite database in WAL mode) and
``artifacts/`` (an :class:`~evolve.artifacts.ArtifactStore` for weights, adapters, tool code,
memory snapshots). The history is append-only: systems, lineage edges, trajectories, pointer
moves and events are only ever inserted (triggers refuse UPDATE and DELETE on them), so a
rollback is one more pointer row and nothing is lost. Only the run-state key-value table
(the engine's resume journal) is overwritten in place.

Every write is one SQLite transaction, so a process killed at any moment (SIGKILL included)
leaves whole transactions only; trajectories are keyed, and re-adding a key is a no-op, so
an engine that resumes after a crash can replay its last batch safely.

One :class:`Archive` holds one connection guarded by a lock and can be shared by threads.
Do not use an Archive across ``fork()``: open a new one in the child.

``import evolve.archive`` is light: sqlite3, json, zlib and the pydantic data model only.
"""

from __future__ import annotations

from evolve.archive._schema import SCHEMA_VERSION
from evolve.archive.diff import diff
from evolve.archive.export import find_artifact_refs, load_export
from evolve.archive.records import SystemRecord, TrajectoryRow
from evolve.archive.store import Archive

# WAL checkpoints (copying the log back into the database file, with an fsync) run on a
# background thread with its own connection once the log passes _CKPT_BYTES, so writers do
# not pay for them; the writer's own auto-checkpoint stays on as a backstop at BACKSTOP_PAGES
# (evolve.archive._checkpoint). The threshold lives here, on the package, so that it can be
# tuned as ``evolve.archive._CKPT_BYTES``; the checkpointer reads it from here on every check.
_CKPT_BYTES = 4 << 20

__all__ = [
    "Archive",
    "SystemRecord",
    "TrajectoryRow",
    "diff",
    "find_artifact_refs",
    "load_export",
    "SCHEMA_VERSION",
]
