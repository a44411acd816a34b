"""A run's current system as a gateway route: :class:`ServeApp` builds the model of one role of
the system the archive names current (its base and LoRA adapter), follows the archive as the
engine promotes or ``evolve archive rollback`` moves the pointer (no restart: requests already
running finish on the old model, which is closed after the last of them), and records each call;
:class:`LocalUpstream` is the route over it (``evolve gateway --local``, ``evolve serve``).

``evolve serve RUN_DIR`` is the gateway with one such route on the run (:meth:`ServeApp.start`):
no trace store, every call recorded as an :class:`~evolve.types.LLMCall` in
``RUN_DIR/serve/calls.jsonl``, in its session (``/s/<session>/v1``, else ``default``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from evolve.errors import UserError
from evolve.gateway.asgi import check_bind, is_loopback, need_http
from evolve.gateway.call_log import CallLog
from evolve.gateway.local import ModelUpstream, tokenizer_of, top_logprobs_kw, top_logprobs_of
from evolve.gateway.upstream import Result, Route, Upstream
from evolve.gateway.wire import GatewayError, Request
from evolve.types import LLMCall

if TYPE_CHECKING:  # pragma: no cover
    from typing import Self

    from evolve.gateway.app import HTTPGateway

CALLS_FILE = Path("serve") / "calls.jsonl"


@dataclass
class LocalUpstream(ModelUpstream):
    """``role`` of a run's current system (or of ``system``, pinned), served by a :class:`ServeApp`
    (which builds its model and follows the archive). ``record``: each call also in
    ``RUN_DIR/serve/calls.jsonl`` (``evolve serve``; the gateway records in its trace store)."""

    run: Path
    role: str = "policy"
    system: str | None = None
    follow: bool = True
    poll: float = 1.0
    record: bool = False
    _app: Any = field(default=None, init=False, repr=False)
    _owned: bool = field(default=True, init=False, repr=False)  # closed with the route (not when given one)
    _cap: Any = field(default=None, init=False, repr=False)
    serves_systems: ClassVar[bool] = True  # a session's own system, while the app keeps its model

    @classmethod
    def of(cls, app: ServeApp, *, record: bool = True) -> LocalUpstream:
        """A route over an open :class:`ServeApp` (which its owner closes)."""
        up = cls(app.run_dir, app.role, follow=False, poll=app.poll, record=record)
        up._app, up._owned = app, False
        return up

    @property
    def records(self) -> bool:  # type: ignore[override]
        return self.record

    def open(self) -> LocalUpstream:
        if self._app is None:
            self._app = ServeApp(
                self.run, role=self.role, system=self.system, follow=self.follow, poll=self.poll, keep_earlier=2
            )
        return self

    def close(self) -> None:
        if self._app is not None and self._owned:
            self._app.close()
            self._app = None

    def describe(self) -> str:
        return f"the local model of {self.run} ({self.role})"

    def model_names(self) -> list[str]:
        return self.open()._app.model_names()

    @property
    def system_id(self) -> str | None:
        return None if self._app is None else self._app.system_id

    def generate(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float | None,
        max_tokens: int | None,
        stop: list[str] | None,
        seed: int | None,
        req: Request,
    ) -> tuple[Any, str | None, Any]:
        from evolve.errors import LLMError

        self.open()
        kw = dict(
            temperature=temperature, max_tokens=max_tokens, stop=stop, seed=seed, top_logprobs=top_logprobs_of(req)
        )
        try:
            out, sid = self._app.complete(messages, system_id=req.system, **kw)
        except (LLMError, GatewayError, TypeError, ValueError):
            raise
        except Exception as e:  # noqa: BLE001 - the session's own system cannot be served: the current one
            if req.system is None:
                raise
            self._app.log(
                f"cannot serve system {req.system[:12]} to its session ({type(e).__name__}: {e}); "
                "serving the current system"
            )
            out, sid = self._app.complete(messages, **kw)
        return out, sid, self._app.tokenizer(sid)

    def recorded(self, req: Request, call: LLMCall, system_id: str | None) -> None:
        self._app.record(req.session or "default", system_id or "", call)

    def served(self, system_id: str | None) -> dict[str, Any] | None:
        return None if system_id is None else self._app.spec_of(system_id)


class RolesUpstream(Upstream):
    """Several roles of a run's current system (a team: one adapter per role on one base), each
    under its own model name: ``roles`` is ``{model name: role}``, a list of roles or ``"all"`` (the
    current system's roles), a role then answering to its own name. A call is answered by its name's
    role (a :class:`LocalUpstream` each, following the archive; their models share one base in
    memory, :func:`evolve.policy.local.build`) and recorded under that role (``served_by.role``)."""

    serves_systems: ClassVar[bool] = True

    def __init__(
        self,
        run: Path,
        roles: dict[str, str] | list[str] | str,
        system: str | None = None,
        *,
        follow: bool = True,
        poll: float = 1.0,
    ) -> None:
        self.run, self.asked, self.system, self.follow, self.poll = Path(run), roles, system, follow, poll
        self.by_name: dict[str, str] = {}
        self.ups: dict[str, LocalUpstream] = {}

    def open(self) -> RolesUpstream:
        if self.ups:
            return self
        if isinstance(self.asked, dict):
            self.by_name = dict(self.asked)
        elif self.asked == "all":
            from evolve.archive import Archive

            with Archive(self.run, create=False) as archive:
                have = list(archive.get_system(archive.resolve(self.system or "current")).models)
            self.by_name = {r: r for r in have}
        else:
            self.by_name = {r: r for r in (self.asked if isinstance(self.asked, list) else [self.asked])}
        try:
            for role in dict.fromkeys(self.by_name.values()):
                self.ups[role] = LocalUpstream(self.run, role, self.system, follow=self.follow, poll=self.poll).open()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for up in self.ups.values():
            up.close()
        self.ups = {}

    def role_of(self, model: str) -> LocalUpstream:
        """The upstream of the role that answers the model name ``model`` (a 404 naming the served names)."""
        self.open()
        role = self.by_name.get(model)
        if role is None:
            raise GatewayError(
                404,
                f"the model {model!r} is no role of this team; it serves "
                f"{', '.join(f'{n} ({r})' for n, r in self.by_name.items())}",
                param="model",
                code="model_not_found",
            )
        return self.ups[role]

    @property
    def system_id(self) -> str | None:
        return next((up.system_id for up in self.ups.values()), None)

    def model_names(self) -> list[str]:
        self.open()
        return list(self.by_name)

    def target(self, asked: str) -> str:
        return f"local:{self.by_name.get(asked, asked)}"

    def describe(self) -> str:
        return (
            f"the local models of {self.run} ("
            + ", ".join(f"{n} -> {r}" if n != r else r for n, r in self.by_name.items())
            + ")"
        )

    async def complete(self, req: Request) -> Result:
        return await self.role_of(req.model).complete(req)

    async def stream(self, req: Request) -> AsyncIterator[Any]:
        async for chunk in self.role_of(req.model).stream(req):
            yield chunk


@dataclass(eq=False)
class _Handle:
    """One built LLM of one system; closed when retired and no request holds it."""

    system_id: str
    llm: Any
    names: list[str]
    temperature: float | None
    tokenizer: Any = None
    refs: int = 0
    retired: bool = False
    closed: bool = field(default=False, repr=False)


class ServeApp:
    """Serve ``role`` of a run's current system (or of ``system``, a unique id prefix or
    ``best``/``baseline``; a pinned system is never swapped). Use as a context manager, or
    call :meth:`close`. :meth:`start` begins answering HTTP (the gateway, on a daemon thread).

    The LLM is built through :data:`evolve.registry.llm_backends` with the run's artifact store.
    With ``follow=True`` (and no pinned system) a daemon thread polls the archive's current pointer
    every ``poll`` seconds; when the engine promotes another system (or ``evolve archive rollback``
    moves the pointer) it builds that system's LLM and swaps it in: requests already running finish
    on the old handle, which is closed after the last of them. Calls recorded (:meth:`record`) are
    appended as one JSON line ``{"session", "system_id", "time", "call": <LLMCall>}`` to
    ``<run_dir>/serve/calls.jsonl`` and kept in memory (the last ``keep`` per session) for :meth:`calls`."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        role: str = "policy",
        system: str | None = None,
        follow: bool = True,
        poll: float = 1.0,
        keep: int = 10_000,
        log: Callable[[str], None] | None = None,
        keep_earlier: int = 0,
    ) -> None:
        from evolve.archive import Archive

        self.run_dir = Path(run_dir)
        self.role = role
        self.poll = max(0.01, float(poll))
        self.pinned = system not in (None, "current")
        self.log = log or (lambda msg: print(f"evolve serve: {msg}", file=sys.stderr, flush=True))
        self.server: HTTPGateway | None = None
        self._log = CallLog(self.run_dir / CALLS_FILE, keep)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.keep_earlier = max(0, int(keep_earlier))  # earlier systems' models kept for sessions that began on them
        self._others: collections.OrderedDict[str, _Handle] = collections.OrderedDict()
        self._build_lock = threading.Lock()
        self._failed: str | None = None  # a system whose LLM could not be built (not retried until it changes)
        self.archive = Archive(self.run_dir, create=False)
        try:
            self._handle = self._build(self.archive.resolve(system or "current"))
        except BaseException:
            self.archive.close()
            raise
        self._follower: threading.Thread | None = None
        if follow and not self.pinned:
            self._follower = threading.Thread(target=self._follow, name="evolve-serve-follow", daemon=True)
            self._follower.start()

    # ------------------------------------------------------------------ the served LLM

    @property
    def system_id(self) -> str:
        """The id of the system being served now."""
        return self._handle.system_id

    def _build(self, system_id: str) -> _Handle:
        from evolve.llm.cache import build_llm

        system = self.archive.get_system(system_id)
        spec = system.models.get(self.role)
        if spec is None:
            raise UserError(
                f"system {system_id[:12]} has no model role {self.role!r}; it has {sorted(system.models)}: pass --role"
            )
        llm = build_llm(spec, self.archive.artifacts)  # a new one: the old handle closes after its requests
        names = list(dict.fromkeys([self.role, spec.name, system_id]))
        temp = spec.params.get("temperature")
        return _Handle(system_id, llm, names, None if temp is None else float(temp), tokenizer_of(llm))

    def swap_to(self, system_id: str) -> None:
        """Build the LLM of another system (an id prefix or a word) and serve it from now on (an
        earlier system's model still kept is taken back, not built again)."""
        sid = self.archive.resolve(system_id)
        with self._lock:
            kept = self._others.pop(sid, None)
        new = kept if kept is not None and not kept.closed else self._build(sid)
        new.retired = False
        to_close = []
        with self._lock:
            old, self._handle = self._handle, new
            if self.keep_earlier:
                self._others[old.system_id] = old
                to_close = self._evict()
            else:
                old.retired = True
                if old.refs == 0:
                    to_close = [old]
        for h in to_close:
            self._close_handle(h)
        self.log(f"now serving system {new.system_id[:12]} (was {old.system_id[:12]})")

    def _follow(self) -> None:
        while not self._stop.wait(self.poll):
            cur = None
            try:
                cur = self.archive.current()
                if cur is None or cur == self._handle.system_id or cur == self._failed:
                    continue
                self.swap_to(cur)
                self._failed = None
            except Exception as e:  # noqa: BLE001 - keep serving the old system
                if self._stop.is_set():
                    return
                self._failed = cur
                self.log(
                    f"cannot serve the new current system {str(cur)[:12]}: {type(e).__name__}: {e}; "
                    f"still serving {self._handle.system_id[:12]}"
                )

    def _acquire(self) -> _Handle:
        with self._lock:
            h = self._handle
            h.refs += 1
            return h

    def _evict(self) -> list[_Handle]:
        """Under the lock: retire the least recent kept models past ``keep_earlier``; those no request
        holds are returned to be closed (the others close on their last release)."""
        out = []
        while len(self._others) > self.keep_earlier:
            _, old = self._others.popitem(last=False)
            old.retired = True
            if old.refs == 0:
                out.append(old)
        return out

    def _acquire_other(self, system_id: str) -> _Handle:
        """A handle on an earlier system, kept (at most ``keep_earlier``) while sessions that began on
        it go on; one build at a time, so concurrent requests for it wait for one model."""
        with self._lock:
            h = self._others.get(system_id)
            if h is not None and not h.closed:
                self._others.move_to_end(system_id)
                h.refs += 1
                return h
        with self._build_lock:
            with self._lock:  # built by another request while this one waited
                h = self._others.get(system_id)
                if h is not None and not h.closed:
                    h.refs += 1
                    return h
            new = self._build(system_id)
            with self._lock:
                self._others[system_id] = new
                new.refs += 1
                evicted = self._evict() if self.keep_earlier else []
                if not self.keep_earlier:  # nothing is kept: this one closes after its request
                    self._others.pop(system_id, None)
                    new.retired = True
        for old in evicted:
            self._close_handle(old)
        return new

    def _release(self, h: _Handle) -> None:
        with self._lock:
            h.refs -= 1
            close_now = h.retired and h.refs == 0
        if close_now:
            self._close_handle(h)

    def _close_handle(self, h: _Handle) -> None:
        with self._lock:
            if h.closed:
                return
            h.closed = True
        try:
            h.llm.close()
        except Exception as e:  # noqa: BLE001
            self.log(f"closing the model of {h.system_id[:12]} failed: {type(e).__name__}: {e}")

    def complete(
        self,
        messages: Any,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Any = None,
        seed: int | None = None,
        system_id: str | None = None,
        top_logprobs: int = 0,
    ) -> tuple[Any, str]:
        """One completion by the system served now (or by ``system_id``: a session that began on an
        earlier system stays on it), unrecorded (its route records it: :meth:`record`, or the trace store): (the
        :class:`~evolve.llm.base.Completion`, the id of the system that answered). ``top_logprobs``
        > 0: a 400 where that system's model does not take it."""
        h = (
            self._acquire()
            if system_id is None or system_id == self._handle.system_id
            else self._acquire_other(system_id)
        )
        try:
            out = h.llm.complete(
                messages,
                temperature=h.temperature if temperature is None else temperature,
                max_tokens=max_tokens,
                stop=stop,
                seed=seed,
                **top_logprobs_kw(top_logprobs, h.llm, f"the model of system {h.system_id[:12]}"),
            )
        finally:
            self._release(h)
        return out, h.system_id

    def spec_of(self, system_id: str) -> dict[str, Any]:
        """What a recorded call needs to say about the model that answered: its base and adapter
        (artifact refs), so token ids are only ever trained on with the tokenizer they came from."""
        spec = self.archive.get_system(system_id).models.get(self.role)

        def sha(ref: Any) -> str | None:
            return None if ref is None else ref.sha256

        return {
            "role": self.role,
            "base": sha(getattr(spec, "base", None)),
            "adapter": sha(getattr(spec, "adapter", None)),
        }

    # ------------------------------------------------------------------ recording

    def record(self, session: str, system_id: str, call: LLMCall) -> None:
        """Keep ``call`` (answered by ``system_id`` in ``session``) and append it to ``serve/calls.jsonl``."""
        self._log.record(session, system_id, call)

    def calls(self, session: str = "default") -> list[LLMCall]:
        """The calls recorded in this process for ``session`` (the last ``keep``), oldest first."""
        return self._log.calls(session)

    def sessions(self) -> list[str]:
        return self._log.sessions()

    def model_names(self) -> list[str]:
        """The model names the served system answers to: the role, its model's name, its id."""
        return list(self._handle.names)

    def tokenizer(self, system_id: str | None) -> Any:
        """The tokenizer of ``system_id``'s model (served now, or kept for its sessions), if it names tokens."""
        with self._lock:
            h = self._handle if system_id in (None, self._handle.system_id) else self._others.get(system_id)
        return None if h is None else h.tokenizer

    # ------------------------------------------------------------------ HTTP

    def start(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> HTTPGateway:
        """Answer HTTP on a daemon thread: the gateway with one route, this run's model (no trace
        store: calls go to ``serve/calls.jsonl``); ``api_key`` defaults to ``$EVOLVE_SERVE_API_KEY``."""
        from evolve.gateway.app import Gateway, HTTPGateway

        if self.server is not None:
            raise RuntimeError("this ServeApp is serving already")
        key = api_key if api_key is not None else os.environ.get("EVOLVE_SERVE_API_KEY") or None
        check_bind(host, key)
        need_http("evolve serve")
        route = Route("local", [], LocalUpstream.of(self))
        gateway = Gateway([route], None, api_key=key or None, log=log or self.log, loopback=is_loopback(host))
        self.server = HTTPGateway(gateway, host, port, "evolve serve").start()
        return self.server

    def close(self) -> None:
        """Stop the follower and the server, close the model (after running requests) and the archive."""
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=30)
        if self.server is not None:
            self.server.close()
        self._release(self._acquire_for_close())
        with self._lock:
            others = list(self._others.values())
            self._others.clear()
            idle = []
            for h in others:
                h.retired = True
                if h.refs == 0:
                    idle.append(h)
        for h in idle:
            self._close_handle(h)
        self.archive.close()
        self._log.close()

    def _acquire_for_close(self) -> _Handle:
        with self._lock:
            h = self._handle
            h.retired = True
            h.refs += 1
            return h

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["CALLS_FILE", "LocalUpstream", "RolesUpstream", "ServeApp"]
