"""One persistent shell per episode in a container: a long-lived ``bash`` started by ``docker exec``
with its stdin attached, fed the agent's commands through the exec's socket. A ``cd``, an exported
variable, a file in /tmp and a background service started by one command are there for the next
(and the file and the service for the tests, which run afterwards in the same container).

Each command is sent as a quoted string and run by ``eval`` with its stdin from /dev/null (a
command never reads the next one), followed by a line that prints a per-episode sentinel with the
exit code on stdout and another on stderr; its output is what came on each stream before them. At
its timeout the command's processes (every process whose environment holds the command's
``EVOLVEKIT_COMMAND`` mark, which ``eval`` passes to what it starts) are killed by a separate
``docker exec`` as root, and the shell carries on; when the shell itself does not
come back (a loop in the shell, ``exit``, a closed stdin), a new one is started in the working
directory and the result says so: the earlier ``cd`` and variables are gone, files and services
started in the background stay.
"""

from __future__ import annotations

import secrets
import shlex
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from evolve.sandbox.shell import ShellResult

GRACE_S = 3.0  # after the kill, how long the shell has to print its sentinel
RESTARTED = (
    "the shell did not come back after the command was killed, so a new shell was started in {wd}: "
    "earlier cd and exported variables are gone (files and background processes stay)"
)
EXITED = (
    "the shell exited (exit, exec or a closed stdin), so a new shell was started in {wd}: earlier cd and "
    "exported variables are gone (files and background processes stay)"
)

# Kills every process whose environment holds EVOLVEKIT_COMMAND=$1 (what the command started, even
# a child that left the shell's tree); bash only, no other tool of the image needed.
_KILLER = r"""
want="EVOLVEKIT_COMMAND=$1"
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  [ "$pid" = "$$" ] && continue
  while IFS= read -r -d '' kv; do
    if [ "$kv" = "$want" ]; then kill -KILL "$pid" 2>/dev/null; break; fi
  done 2>/dev/null < "$d/environ"
done
exit 0
"""


@dataclass(frozen=True)
class ShellOutcome(ShellResult):
    """One command in the shell: the sandbox's command result (``exit_code`` None when killed at
    its timeout, the tails of its output), and ``note`` when the shell had to be started again."""

    note: str = ""


class _Session:
    """One ``bash`` exec: its socket and what came back on each stream (read by its own thread)."""

    def __init__(self, sock: Any, cap: int) -> None:
        self.sock, self.cap = sock, cap
        self.bufs = {1: bytearray(), 2: bytearray()}
        self.cut = self.closed = False
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True, name="harbor-shell").start()

    def _recv(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _read(self) -> None:
        try:
            while True:
                head = self._recv(8)
                if head is None:
                    break
                stream, size = head[0], struct.unpack(">I", head[4:])[0]
                data = self._recv(size)
                if data is None:
                    break
                with self.cond:
                    buf = self.bufs.get(stream, self.bufs[2])
                    buf += data
                    if len(buf) > 4 * self.cap:  # keep the tail (and room for the sentinel)
                        del buf[: len(buf) - 2 * self.cap]
                        self.cut = True
                    self.cond.notify_all()
        except OSError:
            pass
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class DockerShell:
    """The episode's shell in ``container`` (see the module docstring)."""

    def __init__(
        self, client: Any, container: Any, *, user: str | None, workdir: str, env: dict[str, str], cap: int
    ) -> None:
        self.client, self.container, self.user, self.workdir, self.env, self.cap = (
            client,
            container,
            user,
            workdir,
            dict(env),
            cap,
        )
        self.nonce = secrets.token_hex(8)
        self.n = 0
        self.restarts = 0
        self.s: _Session | None = None
        self._start()

    def _start(self) -> None:
        api = self.client.api
        exec_id = api.exec_create(
            self.container.id,
            ["bash", "--noprofile", "--norc"],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            user=self.user or "",
            workdir=self.workdir,
            environment=self.env,
        )["Id"]
        sock = api.exec_start(exec_id, socket=True, tty=False)
        sock = getattr(sock, "_sock", sock)
        sock.settimeout(None)
        self.s = _Session(sock, self.cap)
        r = self._roundtrip("echo $$", 30.0)
        if r.exit_code != 0 or not r.stdout.strip().isdigit():
            raise RuntimeError(f"the shell did not start (exit {r.exit_code}): {(r.stderr or r.stdout)[-300:]}")
        self.pid = int(r.stdout.strip())

    # -- commands -----------------------------------------------------------------------------------

    @property
    def _live(self) -> _Session:
        assert self.s is not None, "the shell is started in __init__"
        return self.s

    def _marks(self) -> tuple[bytes, bytes]:
        return f"\n__EVK_{self.nonce}_{self.n}_".encode(), f"\n__EVK_{self.nonce}_{self.n}__\n".encode()

    def _send(self, command: str) -> None:
        self.n += 1
        script = (
            f'__evk_c={shlex.quote(command)}\nEVOLVEKIT_COMMAND={self.nonce}_{self.n} eval "$__evk_c" '
            "</dev/null\n"
            f"__evk_rc=$?; printf '\\n__EVK_%s_%d_%d__\\n' {self.nonce} {self.n} $__evk_rc; "
            f"printf '\\n__EVK_%s_%d__\\n' {self.nonce} {self.n} >&2\n"
        )
        self._live.sock.sendall(script.encode())

    def _done(self) -> tuple[int, int, int, int] | None:
        """(exit code, end of the output on stdout, on stderr, end of the stdout sentinel) once both
        sentinels came, else None."""
        out_mark, err_mark = self._marks()
        bufs = self._live.bufs
        i = bufs[1].find(out_mark)
        if i < 0:
            return None
        j = bufs[1].find(b"__\n", i + len(out_mark))
        k = bufs[2].find(err_mark)
        if j < 0 or k < 0:
            return None
        return int(bufs[1][i + len(out_mark) : j]), i, k, j + 3

    def _wait(self, deadline: float) -> tuple[int, int, int, int] | None:
        s = self._live
        with s.cond:
            while True:
                got = self._done()
                if got is not None or s.closed:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                s.cond.wait(min(left, 1.0))

    def _take(self, got: tuple[int, int, int, int] | None) -> tuple[str, str, bool]:
        s = self._live
        with s.cond:
            if got is None:
                out, err = bytes(s.bufs[1]), bytes(s.bufs[2])
                s.bufs[1].clear()
                s.bufs[2].clear()
            else:
                _, i, k, end = got
                out, err = bytes(s.bufs[1][:i]), bytes(s.bufs[2][:k])
                del s.bufs[1][:end]
                del s.bufs[2][: k + len(self._marks()[1])]
            cut, s.cut = s.cut or len(out) > self.cap or len(err) > self.cap, False
        dec = lambda b: b[-self.cap :].decode("utf-8", "replace")  # noqa: E731
        return dec(out), dec(err), cut

    def _roundtrip(self, command: str, timeout: float) -> ShellOutcome:
        t0 = time.monotonic()
        self._send(command)
        got = self._wait(t0 + timeout)
        out, err, cut = self._take(got)
        return ShellOutcome(None if got is None else got[0], out, err, got is None, time.monotonic() - t0, cut)

    def run(self, command: str, timeout: float | None) -> ShellOutcome:
        """``command`` in the shell; at ``timeout`` seconds (None: no limit) it is killed."""
        note = ""
        if self._live.closed:
            self._restart()
            note = EXITED.format(wd=self.workdir)
        t0 = time.monotonic()
        try:
            self._send(command)
        except OSError:
            self._restart()
            t0, note = time.monotonic(), EXITED.format(wd=self.workdir)
            self._send(command)
        got = self._wait(t0 + (timeout if timeout is not None else 10**9))
        if got is None and not self._live.closed:  # its time is up: kill what it started, keep the shell
            until = time.monotonic() + GRACE_S
            while got is None and not self._live.closed and time.monotonic() < until:
                self._kill()  # again and again: the rest of the command may start more
                got = self._wait(min(until, time.monotonic() + 0.5))
            out, err, cut = self._take(got)
            if got is None:
                self._kill_shell()
                self._restart()
                note = RESTARTED.format(wd=self.workdir)
            return ShellOutcome(None, out, err, True, time.monotonic() - t0, cut, note=note)
        out, err, cut = self._take(got)
        if got is None:  # the shell went away under the command
            self._restart()
            return ShellOutcome(None, out, err, False, time.monotonic() - t0, cut, note=EXITED.format(wd=self.workdir))
        return ShellOutcome(got[0], out, err, False, time.monotonic() - t0, cut, note=note)

    def _kill(self) -> None:
        try:
            self.container.exec_run(["bash", "-c", _KILLER, "killer", f"{self.nonce}_{self.n}"], user="0")
        except Exception:  # noqa: BLE001 - the container is gone: the caller finds the shell closed
            pass

    def _kill_shell(self) -> None:
        try:
            self.container.exec_run(["kill", "-KILL", str(self.pid)], user="0")
        except Exception:  # noqa: BLE001
            pass

    def _restart(self) -> None:
        self.close()
        self.restarts += 1
        self._start()

    def close(self) -> None:
        if self.s is not None:
            self.s.close()


__all__ = ["DockerShell", "ShellOutcome"]
