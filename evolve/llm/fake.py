"""A scripted fake LM for plumbing tests (in the spirit of DSPy's ``DummyLM``).

It ships in the package so that the engine, the runners and the benchmarks can be exercised
without a model. Nothing it produces is a result: it answers what it is told to answer.

What it answers (``responses``):

* ``None`` — echo the last user message back;
* a list — replayed in call order. By default the list **cycles** when it is exhausted
  (``cycle=True``); with ``cycle=False`` the call after the last response raises
  :class:`~evolve.errors.LLMError`. Under concurrent rollouts "call order" is the order the
  threads happen to call in, so for reproducible runs use ``by_seed=True`` (the reply is
  ``responses[seed % len(responses)]``), a dict or a callable;
* a dict — maps a substring of the last user message to a reply; the first key (in the
  dict's order) found in the message wins; the key ``"default"`` is the fallback. No match
  and no ``default`` raises :class:`~evolve.errors.LLMError`;
* a callable — ``fn(messages)`` returning the reply (a ``str``, or a full
  :class:`~evolve.llm.base.Completion`). If its signature accepts any of the keyword
  arguments ``seed``, ``temperature``, ``max_tokens``, ``stop`` (or ``**kwargs``) they are
  passed, so its output can depend on the seed and temperature: seeded runs are then
  reproducible and "sampling" at several seeds gives different answers.

The completion carries fake token ids (the UTF-8 bytes of the text, and of the rendered
prompt) with zero log-probs when ``token_ids=True``, usage counts of ``ceil(chars / 4)``,
``finish_reason`` (``"stop"``, or ``"length"`` when ``max_tokens`` cut the text — a "token"
is one byte here), and ``cost_per_call`` as the cost when it is set. ``delay`` sleeps that
many seconds per call to simulate latency. It is thread-safe and cheap (a few µs per call).

Fault injection (``faults={"rate": 0.3, "kinds": ["unreachable", "timeout", "rate_limit"],
"seed": 0}``): that share of calls raises :class:`~evolve.errors.LLMError` of one of those
categories, as a flaky model server would (the world failing, which the engine retries and
never scores). Whether a call fails depends only on the fault seed, the call (messages and
seed) and how many times that same call was made before, not on thread timing, so a run
with faults is reproducible and a retried call can succeed. ``rate: 1`` is a server that is down.

From a task file (``backend: scripted``), :func:`build` reads ``spec.params``::

    params: {reply: "evolve.worlds.toy:reply"}      # an import path to a callable
    params: {responses: ["a", "b"], by_seed: true}  # a list (or a dict)
    params: {echo: true}                            # echo the last user message
    # optional: delay, cost_per_call, token_ids, cycle, by_seed, faults
"""

from __future__ import annotations

import hashlib
import inspect
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from evolve.errors import ConfigError, LLMError
from evolve.llm.base import Completion, as_messages
from evolve.types import Message

Reply = Callable[..., "str | Completion"]

_CALL_KWARGS = ("seed", "temperature", "max_tokens", "stop")


def _ntokens(n_chars: int) -> int:
    return (n_chars + 3) // 4


def _accepted_kwargs(fn: Callable) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return _CALL_KWARGS
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return tuple(k for k in _CALL_KWARGS if k in names)


class ScriptedLM:
    """A deterministic fake LLM; see the module docstring for what it answers."""

    def __init__(
        self,
        name: str = "scripted",
        responses: Sequence[str] | Mapping[str, str] | Reply | None = None,
        *,
        token_ids: bool = True,
        delay: float = 0.0,
        cost_per_call: float | None = None,
        cycle: bool = True,
        by_seed: bool = False,
        faults: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self._faults = _check_faults(faults)
        self._seen: dict[str, int] = {}  # call -> times made (fault injection)
        self.faults_injected = 0
        self.token_ids = token_ids
        self.delay = float(delay)
        self.cost_per_call = cost_per_call
        self.cycle = cycle
        self.by_seed = by_seed
        self.calls = 0  # how many completions were served (thread-safe counter)
        self.closed = False
        self._lock = threading.Lock()
        self._fn: Reply | None = None
        self._fn_kwargs: tuple[str, ...] = ()
        self._list: tuple[str, ...] | None = None
        self._dict: dict[str, str] | None = None
        if responses is None:
            pass  # echo
        elif isinstance(responses, Mapping):
            self._dict = {str(k): str(v) for k, v in responses.items()}
        elif callable(responses):
            self._fn = responses
            self._fn_kwargs = _accepted_kwargs(responses)
        elif isinstance(responses, (str, bytes)):
            raise TypeError(
                "ScriptedLM responses must be a list of strings, a dict, or a callable; got one string "
                "(wrap it in a list)"
            )
        else:
            self._list = tuple(str(r) for r in responses)
            if not self._list:
                raise ValueError("ScriptedLM needs at least one response in its list")

    # ------------------------------------------------------------------ protocol

    def complete(
        self,
        messages: Sequence[Message | dict],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> Completion:
        msgs = as_messages(messages)
        if self.delay:
            time.sleep(self.delay)
        if self._faults is not None:
            self._maybe_fail(msgs, seed)
        with self._lock:
            call_index = self.calls
            self.calls += 1
        reply = self._reply(msgs, call_index, temperature=temperature, max_tokens=max_tokens, stop=stop, seed=seed)
        if isinstance(reply, Completion):
            return reply
        if not isinstance(reply, str):
            raise LLMError(
                f"ScriptedLM {self.name!r}: its reply function returned {type(reply).__name__}, "
                "expected str or Completion",
                category="config",
            )
        return self._completion(msgs, reply, max_tokens=max_tokens, stop=stop)

    def close(self) -> None:
        self.closed = True

    # ------------------------------------------------------------------ internals

    def _maybe_fail(self, msgs: tuple[Message, ...], seed: int | None) -> None:
        assert self._faults is not None  # called only when faults are set
        rate, kinds, fseed = self._faults
        call = hashlib.sha256(repr((seed, [(m.role, m.content) for m in msgs])).encode()).hexdigest()
        with self._lock:
            n = self._seen.get(call, 0)
            self._seen[call] = n + 1
        h = hashlib.sha256(f"{fseed}/{call}/{n}".encode()).digest()
        if int.from_bytes(h[:8], "big") / 2**64 < rate:
            kind = kinds[h[8] % len(kinds)]
            with self._lock:
                self.faults_injected += 1
            raise LLMError(
                f"ScriptedLM {self.name!r}: injected fault ({kind}; attempt {n + 1} of this call)", category=kind
            )

    def _reply(self, msgs: tuple[Message, ...], call_index: int, **kw: Any) -> str | Completion:
        if self._fn is not None:
            return self._fn(msgs, **{k: kw[k] for k in self._fn_kwargs})
        if self._list is not None:
            n = len(self._list)
            if self.by_seed:
                return self._list[(kw["seed"] or 0) % n]
            if call_index >= n and not self.cycle:
                raise LLMError(
                    f"ScriptedLM {self.name!r} ran out of its {n} scripted responses (call {call_index + 1}); "
                    "give more responses, or cycle=True",
                    category="config",
                )
            return self._list[call_index % n]
        last = _last_user(msgs)
        if self._dict is not None:
            for key, value in self._dict.items():
                if key != "default" and key in last:
                    return value
            if "default" in self._dict:
                return self._dict["default"]
            raise LLMError(
                f"ScriptedLM {self.name!r}: no scripted key is a substring of the last user message "
                f"{last[:80]!r}; keys: {list(self._dict)[:10]} (add a 'default' key)",
                category="config",
            )
        return last  # echo

    def _completion(
        self, msgs: tuple[Message, ...], text: str, *, max_tokens: int | None, stop: Sequence[str] | None
    ) -> Completion:
        finish = "stop"
        if stop:
            cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
            if cut >= 0:
                text = text[:cut]
        ids = text.encode()
        if max_tokens is not None and len(ids) > max_tokens:
            ids = ids[:max_tokens]
            text = ids.decode(errors="ignore")
            ids = text.encode()
            finish = "length"
        prompt_chars = sum(len(m.content) for m in msgs)
        token_ids = prompt_ids = logprobs = None
        if self.token_ids:
            token_ids = tuple(ids)
            logprobs = (0.0,) * len(token_ids)
            prompt_ids = tuple("".join(f"{m.role}: {m.content}\n" for m in msgs).encode())
        return Completion(
            text=text,
            model=self.name,
            token_ids=token_ids,
            prompt_token_ids=prompt_ids,
            logprobs=logprobs,
            finish_reason=finish,
            prompt_tokens=_ntokens(prompt_chars),
            completion_tokens=_ntokens(len(text)),
            cost=self.cost_per_call,
        )

    def __repr__(self) -> str:
        kind = (
            "callable"
            if self._fn is not None
            else "list"
            if self._list is not None
            else "dict"
            if self._dict is not None
            else "echo"
        )
        return f"ScriptedLM(name={self.name!r}, {kind})"


FAULT_KINDS = ("unreachable", "timeout", "rate_limit", "server")


def _check_faults(faults: Mapping[str, Any] | None) -> tuple[float, tuple[str, ...], int] | None:
    if faults is None:
        return None
    if not isinstance(faults, Mapping):
        raise ConfigError(f"ScriptedLM faults must be a mapping {{rate, kinds, seed}}; got {faults!r}")
    unknown = sorted(set(faults) - {"rate", "kinds", "seed"})
    if unknown:
        from evolve.registry import did_you_mean

        raise ConfigError(
            f"ScriptedLM faults: unknown key(s) {unknown}; {did_you_mean(unknown[0], ['rate', 'kinds', 'seed'])}"
        )
    try:
        rate = float(faults.get("rate", 0.0))
    except (TypeError, ValueError):
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"ScriptedLM faults.rate must be a share in [0, 1]; got {faults.get('rate')!r}")
    kinds = tuple(faults.get("kinds") or ("unreachable", "timeout", "rate_limit"))
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad or not kinds:
        raise ConfigError(
            f"ScriptedLM faults.kinds: {bad or kinds} are not fault kinds; choose from {list(FAULT_KINDS)}"
        )
    return rate, kinds, int(faults.get("seed", 0))


def _last_user(msgs: Sequence[Message]) -> str:
    for m in reversed(msgs):
        if m.role == "user":
            return m.content
    return msgs[-1].content if msgs else ""


# sampling keys that role defaults carry (applied by the rollout, not by this backend)
SAMPLING_PARAMS = {"temperature", "max_tokens", "top_p", "top_k", "stop", "seed", "logprobs", "n"}
OWN_PARAMS = {"responses", "reply", "echo", "delay", "cost_per_call", "token_ids", "cycle", "by_seed", "faults"}


def build(spec: Any, artifacts: Any = None) -> ScriptedLM:
    """Build a :class:`ScriptedLM` from a :class:`~evolve.types.ModelSpec` (``backend: scripted``)."""
    from evolve.registry import did_you_mean, import_path

    params = dict(spec.params or {})
    where = f"model {spec.name!r} (backend scripted): "
    unknown = sorted(set(params) - SAMPLING_PARAMS - OWN_PARAMS)
    if unknown:
        raise ConfigError(f"{where}unknown parameter(s) {unknown}; {did_you_mean(unknown[0], sorted(OWN_PARAMS))}")
    given = [k for k in ("responses", "reply", "echo") if params.get(k) not in (None, False)]
    if len(given) > 1:
        raise ConfigError(f"{where}give one of responses, reply or echo, not {given}")
    responses: Any = None
    if "reply" in given:
        responses = import_path(str(params["reply"]), what="scripted reply function")
        if not callable(responses):
            raise ConfigError(f"{where}reply {params['reply']!r} is not callable")
    elif "responses" in given:
        responses = params["responses"]
        if not isinstance(responses, (list, tuple, dict)):
            raise ConfigError(f"{where}responses must be a list of strings or a mapping substring -> reply")
    return ScriptedLM(
        spec.name,
        responses,
        token_ids=bool(params.get("token_ids", True)),
        delay=float(params.get("delay", 0.0)),
        cost_per_call=params.get("cost_per_call"),
        cycle=bool(params.get("cycle", True)),
        by_seed=bool(params.get("by_seed", False)),
        faults=params.get("faults"),
    )


__all__ = ["ScriptedLM", "build"]
