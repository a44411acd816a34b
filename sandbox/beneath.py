"""File operations the host does on folders that untrusted code wrote, never following a link.

A sandbox's workspace and a task folder someone else wrote can hold symbolic links to anywhere on
the host. The host (often root) must never write, read, delete or chown through them. So every
path here is walked from a directory held open, one component at a time, each opened with
``O_NOFOLLOW`` (and files with ``O_NONBLOCK``, so a FIFO cannot hang the host): a link anywhere on
the way is :class:`Refused`, never followed. What the host creates is created fresh (``O_EXCL``,
an existing entry unlinked first: never written through), and owned by ``uid`` through its own
file descriptor (``fchown``). Links inside a copied tree are copied as links, as Docker's ``COPY``
does; sockets and devices are left out. Deleting uses :func:`shutil.rmtree`'s fd-based walk,
which follows no link on Linux (``shutil.rmtree.avoids_symlink_attacks``).

    read(ws_logs, "verifier/reward.txt", limit=1 << 20)     # bytes, None if absent, else Refused
    copy(task / "environment", "files", ws_app, "data", uid=uid)
"""

from __future__ import annotations

import errno
import fnmatch
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20


class Refused(OSError):
    """A path the host will not follow: a symbolic link on the way (or at the end, where a file
    was expected), or something that is not a regular file. ``rel`` is the path (relative to the
    folder walked from) and ``why`` what is wrong with it: ``str()`` is both."""

    def __init__(self, code: int, rel: str, why: str) -> None:
        super().__init__(code, f"{rel} {why}")
        self.rel, self.why = rel, why

    def __str__(self) -> str:
        return self.strerror or ""  # set by __init__


def parts(rel: str) -> list[str]:
    """The components of a relative path (``.`` and empty ones dropped); ``..`` is refused."""
    out = [p for p in str(rel).split("/") if p not in ("", ".")]
    if ".." in out:
        raise Refused(errno.EPERM, str(rel), "climbs out with '..'")
    return out


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_dir_at(parent: int, name: str, where: str, *, create: bool, uid: int | None) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(parent, name):
            raise Refused(errno.ELOOP, where, "is a symbolic link") from None
        raise
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    fd = _open_dir_at(parent, name, where, create=False, uid=None)
    if uid is not None:
        os.fchown(fd, uid, uid)
    return fd


def open_dir(root: str | Path, rel: str = "", *, create: bool = False, uid: int | None = None) -> int:
    """A file descriptor of ``root/rel`` (the caller closes it), walked without following links;
    with ``create``, missing folders are made (0755, owned by ``uid``)."""
    fd = os.open(root, _DIR)
    done = ""
    try:
        for name in parts(rel):
            done = posixpath.join(done, name)
            nxt = _open_dir_at(fd, name, done, create=create, uid=uid)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def opened(root: str | Path, rel: str = "", *, create: bool = False, uid: int | None = None) -> Iterator[int]:
    fd = open_dir(root, rel, create=create, uid=uid)
    try:
        yield fd
    finally:
        os.close(fd)


def _split(rel: str) -> tuple[str, str]:
    p = parts(rel)
    return "/".join(p[:-1]), (p[-1] if p else "")


def kind(root: str | Path, rel: str) -> str | None:
    """``"file"``, ``"dir"``, ``"link"``, ``"other"`` or None (absent) for ``root/rel``; a link
    on the way there is :class:`Refused`."""
    head, name = _split(rel)
    if not name:
        return "dir"
    try:
        with opened(root, head) as fd:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "other"


def _open_file(root: str | Path, rel: str) -> int:
    """A blocking read fd of the regular file ``root/rel`` (see :func:`read`)."""
    head, name = _split(rel)
    with opened(root, head) as d:
        try:
            fd = os.open(name, _FILE, dir_fd=d)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Refused(errno.ELOOP, rel, "is a symbolic link") from None
            raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(errno.EINVAL, rel, "is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read(root: str | Path, rel: str, *, limit: int) -> bytes | None:
    """The bytes of the regular file ``root/rel``, None when it does not exist; a link (on the
    way or the file itself), a file that is not regular, or one over ``limit`` bytes is
    :class:`Refused`."""
    try:
        fd = _open_file(root, rel)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, min(_CHUNK, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise Refused(errno.EFBIG, rel, f"is over {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _remove_at(parent: int, name: str) -> None:
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)


def remove(root: str | Path, rel: str) -> None:
    """Delete ``root/rel`` (a file, a link itself, or a folder and all in it); nothing when
    absent. ``rel`` empty: everything inside ``root``, ``root`` itself kept."""
    head, name = _split(rel)
    try:
        with opened(root, head) as fd:
            for n in [name] if name else os.listdir(fd):
                try:
                    _remove_at(fd, n)
                except FileNotFoundError:
                    pass
    except (FileNotFoundError, NotADirectoryError):
        return


def makedirs(root: str | Path, rel: str, *, uid: int | None = None) -> None:
    """Make ``root/rel`` and its missing parents (owned by ``uid``); a link on the way is
    :class:`Refused`."""
    os.close(open_dir(root, rel, create=True, uid=uid))


def _own(parent: int, name: str, uid: int | None) -> None:
    if uid is not None:
        os.chown(name, uid, uid, dir_fd=parent, follow_symlinks=False)


def _make_room(parent: int, name: str) -> None:
    """Unlink whatever is at ``name`` so that it can be created afresh (never written through)."""
    try:
        _remove_at(parent, name)
    except FileNotFoundError:
        pass


def _copy_file(src: int, dparent: int, name: str, st: os.stat_result, uid: int | None) -> None:
    _make_room(dparent, name)
    mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
    dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dparent)
    try:
        os.set_blocking(src, True)
        while chunk := os.read(src, _CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view) :]
        if uid is not None:
            os.fchown(dst, uid, uid)
        os.fchmod(dst, mode)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(dst)


def _copy_entry(sparent: int, sname: str, dparent: int, dname: str, uid: int | None, where: str) -> None:
    """Copy the entry ``sname`` to ``dname``; ``where`` is the destination's path, for messages.
    An existing link at the destination is replaced only by a link: Docker would follow it."""
    st = os.stat(sname, dir_fd=sparent, follow_symlinks=False)
    mode = _lstat_mode(dparent, dname)
    if stat.S_ISLNK(mode) and not stat.S_ISLNK(st.st_mode):
        raise Refused(errno.ELOOP, where, "is a symbolic link")
    if stat.S_ISDIR(st.st_mode):
        s = os.open(sname, _DIR, dir_fd=sparent)
        try:
            if mode and not stat.S_ISDIR(mode):
                _make_room(dparent, dname)
            d = _open_dir_at(dparent, dname, where, create=True, uid=uid)
            try:
                _copy_children(s, d, uid, where)
                os.fchmod(d, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
                os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(d)
        finally:
            os.close(s)
    elif stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(mode):
            raise Refused(errno.EISDIR, where, "is a folder; a file cannot replace it")
        src = os.open(sname, _FILE, dir_fd=sparent)
        try:
            if not stat.S_ISREG(os.fstat(src).st_mode):
                raise Refused(errno.EINVAL, sname, "changed while it was copied")
            _copy_file(src, dparent, dname, st, uid)
        finally:
            os.close(src)
    elif stat.S_ISLNK(st.st_mode):
        target = os.readlink(sname, dir_fd=sparent)
        _make_room(dparent, dname)
        os.symlink(target, dname, dir_fd=dparent)
        _own(dparent, dname, uid)
    elif stat.S_ISFIFO(st.st_mode):
        _make_room(dparent, dname)
        os.mkfifo(dname, stat.S_IMODE(st.st_mode), dir_fd=dparent)
        _own(dparent, dname, uid)
    # sockets and devices are not copied


def _lstat_mode(parent: int, name: str) -> int:
    """The mode of ``name`` itself, 0 when absent."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return 0


def _copy_children(s: int, d: int, uid: int | None, where: str) -> None:
    for name in sorted(os.listdir(s)):
        _copy_entry(s, name, d, name, uid, posixpath.join(where, name))


def copy(src_root: str | Path, src_rel: str, dst_root: str | Path, dst_rel: str, *, uid: int | None = None) -> None:
    """Copy ``src_root/src_rel`` to ``dst_root/dst_rel`` as Docker's ``COPY`` does: a folder's
    contents merge into the destination folder; a file (or link, copied as the link) replaces the
    destination, or goes into it when it is a folder. Missing parents are made. Nothing on either
    side is followed through a link, and a link at the destination is not replaced by a file or a
    folder (Docker would follow it): :class:`Refused`. What is made is owned by ``uid``."""
    shead, sname = _split(src_rel)
    dst_rel = "/".join(parts(dst_rel))
    with opened(src_root, shead) as sp:
        smode = os.stat(sname, dir_fd=sp, follow_symlinks=False).st_mode if sname else stat.S_IFDIR
        if stat.S_ISDIR(smode):
            with opened(dst_root, dst_rel, create=True, uid=uid) as d, opened(src_root, src_rel) as s:
                _copy_children(s, d, uid, dst_rel)
            return
        dhead, dname = _split(dst_rel)
        with opened(dst_root, dhead, create=True, uid=uid) as dp:
            if not dname:
                _copy_entry(sp, sname, dp, sname, uid, sname)
            elif stat.S_ISDIR(_lstat_mode(dp, dname)):
                with opened(dst_root, dst_rel) as d:
                    _copy_entry(sp, sname, d, sname, uid, posixpath.join(dst_rel, sname))
            else:
                _copy_entry(sp, sname, dp, dname, uid, dst_rel)


def glob(root: str | Path, pattern: str) -> list[str]:
    """The relative paths under ``root`` that ``pattern`` matches (``*``, ``?``, ``[...]`` per
    component, dotfiles included, as Docker matches), listed without following links; a literal
    path is returned as it is, whether or not it exists."""
    found = [""]
    for part in parts(pattern):
        nxt = []
        for rel in found:
            if not any(c in part for c in "*?["):
                nxt.append(posixpath.join(rel, part))
                continue
            try:
                with opened(root, rel) as fd:
                    names = os.listdir(fd)
            except (FileNotFoundError, NotADirectoryError, Refused):
                continue
            nxt += [posixpath.join(rel, n) for n in sorted(fnmatch.filter(names, part))]
        found = nxt
    return found


def files(root: str | Path, *, skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Every ``(relative path, kind)`` under ``root`` except folders (``"file"``, ``"link"`` or
    ``"other"``), walked without following links, in the order of their path components;
    folders named in ``skip`` are not entered."""
    out: list[tuple[tuple[str, ...], str]] = []

    def walk(fd: int, prefix: tuple[str, ...]) -> None:
        for name in os.listdir(fd):
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                if name in skip:
                    continue
                sub = os.open(name, _DIR, dir_fd=fd)
                try:
                    walk(sub, (*prefix, name))
                finally:
                    os.close(sub)
            else:
                out.append(
                    ((*prefix, name), "file" if stat.S_ISREG(mode) else "link" if stat.S_ISLNK(mode) else "other")
                )

    with opened(root) as fd:
        walk(fd, ())
    return [("/".join(p), k) for p, k in sorted(out)]


def readlink(root: str | Path, rel: str) -> str:
    head, name = _split(rel)
    with opened(root, head) as fd:
        return os.readlink(name, dir_fd=fd)


def stream(root: str | Path, rel: str) -> Iterator[bytes]:
    """The bytes of the regular file ``root/rel`` in chunks (a link or a non-regular file is
    :class:`Refused`)."""
    fd = _open_file(root, rel)
    try:
        while chunk := os.read(fd, _CHUNK):
            yield chunk
    finally:
        os.close(fd)


__all__ = [
    "Refused",
    "copy",
    "files",
    "glob",
    "kind",
    "makedirs",
    "open_dir",
    "opened",
    "parts",
    "read",
    "readlink",
    "remove",
    "stream",
]
