"""A content-addressed artifact store: files named by their sha256, written atomically.

Large parts of a system (model weights, LoRA adapters, tool code, memory snapshots) live
here and are referenced from the system's JSON by :class:`~evolve.types.ArtifactRef`.
Writing the same content twice stores it once; nothing is ever overwritten or deleted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from evolve.errors import ArchiveError
from evolve.types import ArtifactRef

_CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class ArtifactStore:
    """``root/ab/abcdef…`` files; ``path(ref)`` gives one back."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _dest(self, sha: str) -> Path:
        return self.root / sha[:2] / sha

    def has(self, sha: str) -> bool:
        return self._dest(sha).exists()

    def path(self, ref: ArtifactRef | str) -> Path:
        sha = ref if isinstance(ref, str) else ref.sha256
        dest = self._dest(sha)
        if not dest.exists():
            raise ArchiveError(f"artifact {sha[:12]} is not in {self.root}; the run directory is incomplete")
        return dest

    def put_file(self, path: str | Path, kind: str) -> ArtifactRef:
        """Copy a file in (atomically; the source is left as it is)."""
        sha = file_sha256(path)
        dest = self._dest(sha)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
            os.close(fd)
            try:
                shutil.copyfile(path, tmp)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return ArtifactRef(sha256=sha, kind=kind, size=dest.stat().st_size)

    def put_bytes(self, data: bytes, kind: str) -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        dest = self._dest(sha)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return ArtifactRef(sha256=sha, kind=kind, size=len(data))

    def copy_to(self, ref: ArtifactRef, other: ArtifactStore) -> None:
        if not other.has(ref.sha256):
            other.put_file(self.path(ref), ref.kind)


def cache_dir(name: str) -> Path:
    """``$EVOLVE_CACHE_DIR/NAME`` when set, else ``~/.cache/evolvekit/NAME``: what evolvekit caches
    across runs (generated worlds, checked tasks, converted weights)."""
    base = os.environ.get("EVOLVE_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "evolvekit") / name
