"""The folders the MCP server may touch (``evolve mcp --root DIR``), and the one way a path from
a client becomes a path on disk: :meth:`Roots.resolve`.

A path is refused when it is empty, too long, holds a NUL or a newline, climbs with ``..`` (but a
task file's own paths, resolved from its folder, may as long as they end in a root), or lands
outside every root once symlinks are followed (a link inside a root that points out of it
is outside). A relative path is looked up in each root in order; a new file goes to the first
root that holds its folder, else the first root.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Literal

from evolve.errors import UserError

MAX_PATH = 1024

Want = Literal["file", "dir", "new", "any"]


class PathRefused(UserError):
    """A path a client gave that the server will not touch."""


class Roots:
    """The server's folders, resolved once at start."""

    def __init__(self, folders: Iterable[str | Path]) -> None:
        self.folders: list[Path] = []
        for f in folders:
            p = Path(f).expanduser()
            if not p.is_dir():
                raise UserError(f"--root {f}: not a folder; give a folder that exists")
            r = p.resolve()
            if r not in self.folders:
                self.folders.append(r)
        if not self.folders:
            raise UserError("give at least one --root folder")

    @property
    def first(self) -> Path:
        return self.folders[0]

    def holds(self, path: Path) -> bool:
        """Whether ``path`` (resolved) lies in a root."""
        return any(path == r or path.is_relative_to(r) for r in self.folders)

    def resolve(self, value: object, *, want: Want = "any", what: str = "path", base: Path | None = None) -> Path:
        """The resolved path ``value`` names, inside a root, or :class:`PathRefused` saying why.
        ``want``: ``file`` / ``dir`` must exist as that, ``new`` may not exist yet (its folder
        need not either), ``any`` must exist. ``base``: the folder a relative path starts at (a
        task file's, whose paths may climb with ``..`` as long as they end in a root), instead of
        each root."""
        text = _checked_text(value, what, climb=base is not None)
        given = Path(text)
        if given.is_absolute():
            candidates = [given]
        elif base is not None:
            candidates = [Path(base) / given]
        else:
            candidates = [r / given for r in self.folders]
        found: list[Path] = []
        for c in candidates:
            r = c.resolve()
            if not self.holds(r):  # absolute elsewhere, or a symlink on the way that leads out
                raise PathRefused(
                    f"{what} {text!r} is outside the server's folders ({self.describe()}); "
                    "give a path inside one of them"
                )
            found.append(r)
        existing = [p for p in found if p.exists()]
        if want == "new":
            if existing:
                return existing[0]
            return next((p for p in found if p.parent.is_dir()), found[0])
        elif existing:
            p = existing[0]
            if want == "file" and not p.is_file():
                raise PathRefused(f"{what} {text!r} is a folder, not a file")
            if want == "dir" and not p.is_dir():
                raise PathRefused(f"{what} {text!r} is a file, not a folder")
            return p
        raise PathRefused(f"{what} {text!r} does not exist in the server's folders ({self.describe()})")

    def name(self, path: Path) -> str:
        """How a client names ``path``: relative to the root holding it (the first, when nested)."""
        for r in self.folders:
            if path == r or path.is_relative_to(r):
                rel = path.relative_to(r).as_posix()
                return rel if rel != "." else "."
        return str(path)

    def describe(self) -> str:
        return ", ".join(str(r) for r in self.folders)


def _checked_text(value: object, what: str, climb: bool = False) -> str:
    if not isinstance(value, str):
        raise PathRefused(f"{what} must be a string path, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise PathRefused(f"{what} is empty; give a path inside the server's folders")
    if len(text) > MAX_PATH:
        raise PathRefused(f"{what} is {len(text)} characters long; the most is {MAX_PATH}")
    if any(ch in text for ch in "\x00\n\r"):
        raise PathRefused(f"{what} holds a NUL or a line break; give a plain path")
    if not climb and (".." in PurePosixPath(text).parts or ".." in PureWindowsPath(text).parts):
        raise PathRefused(f"{what} {text!r} climbs with '..'; give a path inside the server's folders")
    if text.startswith("~"):
        raise PathRefused(f"{what} {text!r} starts with '~'; give a path relative to a root, or an absolute one")
    return text


__all__ = ["PathRefused", "Roots"]
