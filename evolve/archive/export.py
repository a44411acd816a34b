"""Exporting one system as a self-contained folder, and loading such a folder back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evolve.archive._schema import ARTIFACTS_DIR
from evolve.artifacts import ArtifactStore
from evolve.errors import ArchiveError, RunDirError
from evolve.types import ArtifactRef, System

EXPORT_FORMAT = "evolvekit-system/1"


def find_artifact_refs(value: Any) -> list[ArtifactRef]:
    """Every artifact a JSON value references: dicts with ``sha256`` and ``kind`` keys,
    found at any depth, deduplicated by sha256, in the order first met."""
    found: dict[str, ArtifactRef] = {}

    def walk(v: Any) -> None:
        if isinstance(v, BaseModel):
            v = v.model_dump(mode="json")
        if isinstance(v, dict):
            sha, kind = v.get("sha256"), v.get("kind")
            if isinstance(sha, str) and isinstance(kind, str) and sha not in found:
                size = v.get("size", 0)
                found[sha] = ArtifactRef(sha256=sha, kind=kind, size=size if isinstance(size, int) else 0)
            for item in v.values():
                walk(item)
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)

    walk(value)
    return list(found.values())


def load_export(path: str | Path) -> tuple[System, ArtifactStore]:
    """Load a folder written by :meth:`Archive.export`: the system and its artifact store.

    Checks the system's id against the file and that every referenced artifact is there.
    """
    path = Path(path)
    f = path / "system.json"
    if not f.is_file():
        raise RunDirError(f"not an exported evolvekit system: {path} (no system.json)")
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
        system = System.model_validate(doc["system"])
    except (ValueError, KeyError, TypeError) as e:
        raise ArchiveError(f"{f} is damaged: {e}") from e
    if doc.get("id") not in (None, system.id):
        raise ArchiveError(f"{f} is damaged: its id {doc.get('id')} does not match its content ({system.id})")
    store = ArtifactStore(path / ARTIFACTS_DIR)
    for ref in find_artifact_refs(doc["system"]):
        store.path(ref)  # raises ArchiveError when missing
    return system, store


class ExportMixin:
    """:meth:`export`, mixed into :class:`~evolve.archive.Archive` (which provides the rest)."""

    run_dir: Path
    artifacts: ArtifactStore
    resolve: Callable[[str], str]
    get_system: Callable[[str], System]
    record: Callable[[str], Any]
    lineage: Callable[[str], list[str]]
    score_summary: Callable[[str], list[tuple[str, str, float, int]]]
    current: Callable[[], str | None]

    def export(self, system_id: str, dest: str | Path) -> Path:
        """Write a self-contained folder for one system: ``dest/system.json`` (the System,
        its record, lineage and scores) and ``dest/artifacts/`` with every artifact it
        references. Refuses a ``dest`` that exists and is not an empty folder. Atomic: the
        folder appears complete or not at all. Load it back with :func:`load_export`."""
        sid = self.resolve(system_id)
        system = self.get_system(sid)
        dest = Path(dest)
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise RunDirError(f"refusing to overwrite {dest}: it exists and is not an empty folder")
        data = system.model_dump(mode="json")
        refs = find_artifact_refs(data)
        doc = {
            "format": EXPORT_FORMAT,
            "id": sid,
            "system": data,
            "record": self.record(sid).to_json(),
            "lineage": self.lineage(sid),
            "scores": {
                f"{split}/{phase}": {"split": split, "phase": phase, "score": s, "n": n}
                for split, phase, s, n in self.score_summary(sid)
            },
            "current": self.current() == sid,
            "artifacts": [r.model_dump(mode="json") for r in refs],
            "exported_from": str(self.run_dir.resolve()),
            "exported_at": time.time(),
        }
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
        try:
            store = ArtifactStore(tmp / ARTIFACTS_DIR)
            (tmp / ARTIFACTS_DIR).mkdir()
            for ref in refs:
                self.artifacts.copy_to(ref, store)
                if not store.has(ref.sha256):
                    raise ArchiveError(
                        f"artifact {ref.sha256[:12]} in {self.artifacts.root} is damaged (hash mismatch)"
                    )
            (tmp / "system.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            if dest.exists():
                dest.rmdir()
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest
