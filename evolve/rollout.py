"""One rollout: run an agent on one task under a system, record every step, score it (the agent contract).

An *agent* is any callable ``agent(task, ctx) -> output``. Through ``ctx`` it reaches the
system's models (``ctx.llm("policy").complete(messages)``) and calls tools
(``ctx.tool("name", fn, **args)``); both are recorded as steps of the trajectory.
A *reward* is any callable ``reward(task, output)`` or ``reward(task, output, trajectory)``
returning a float, a :class:`~evolve.types.Reward`, or a dict with ``score``.

Nothing an agent or a reward does can crash a run: exceptions and timeouts become a failed
trajectory (``error`` set, score 0) or a failed reward (``reward.error`` set, score 0). A reward
must be a finite real number (numpy scalars and bools are converted); NaN, inf, a string or
``None`` is a failed reward, never a crash.

The world failing under a rollout is another matter (:mod:`evolve.failures`): a model call that
fails because the model is unreachable, rate-limited, misconfigured or gone marks the
trajectory's ``infra`` (even when the agent caught the error and went on), and so does such an
exception raised by the agent's own model client or by the reward. Such a trajectory is not a
result: the engine retries it or stops, and never stores it as a score.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import numbers
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from evolve.errors import LLMError, RolloutTimeout
from evolve.failures import classify, infra
from evolve.llm.base import LLM, Completion, as_messages, takes
from evolve.types import InfraFailure, LLMCall, Message, Reward, System, ToolCall, Trajectory

Task = dict[str, Any]


class LLMProvider(Protocol):
    def __call__(self, system: System, role: str) -> LLM: ...


class RecordedLLM:
    """An LLM handle bound to one rollout: applies the role's defaults and records each call."""

    def __init__(self, ctx: RolloutContext, role: str, llm: LLM) -> None:
        self._ctx, self.role, self._llm = ctx, role, llm
        spec = ctx.system.models.get(role)
        self._defaults = dict(spec.params) if spec is not None else {}
        self.name = getattr(llm, "name", role)

    def backend_takes(self, name: str) -> bool:
        """Whether the backend's ``complete`` takes the keyword ``name`` (e.g. ``top_logprobs``)."""
        return takes(self._llm, name)

    def complete(
        self,
        messages: Sequence[Message | dict],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int = 0,
    ) -> Completion:
        """One call of the role's model, recorded. ``logprobs``: True when the caller reads them
        (an agent's OpenAI request asking for them); None leaves it to the rollout
        (:attr:`RolloutContext.logprobs`). ``top_logprobs`` > 0: passed on to a backend that takes it
        (:meth:`backend_takes`), else an :class:`~evolve.errors.LLMError` before any call."""
        ctx = self._ctx
        ctx.check_deadline()
        msgs = as_messages(messages)
        if temperature is None:
            temperature = ctx.temperature if ctx.temperature is not None else self._defaults.get("temperature", 0.0)
        if max_tokens is None:
            max_tokens = self._defaults.get("max_tokens")
        if ctx.max_tokens is not None:  # an exploration rollout's cap wins over a longer request
            max_tokens = ctx.max_tokens if max_tokens is None else min(int(max_tokens), ctx.max_tokens)
        seed = ctx.seed * 1000 + len(ctx.steps)
        wanted = ctx.logprobs if logprobs is None else logprobs
        extra: dict = {"logprobs": False} if not wanted and takes(self._llm, "logprobs") else {}
        if top_logprobs:
            if not takes(self._llm, "top_logprobs"):
                raise LLMError(
                    f"the model of role {self.role!r} ({self.name}) does not give top_logprobs: its "
                    f"complete() takes no top_logprobs",
                    category="request",
                )
            extra["top_logprobs"] = int(top_logprobs)
        t0 = time.perf_counter()
        try:
            out = self._llm.complete(
                msgs, temperature=temperature, max_tokens=max_tokens, stop=stop, seed=seed, **extra
            )
        except Exception as e:
            ctx.note_failure(e)  # the world failing is recorded even if the agent catches it
            raise
        ctx.add_step(
            LLMCall(
                role=self.role,
                model=out.model,
                messages=msgs,
                output=out.text,
                prompt_token_ids=out.prompt_token_ids,
                token_ids=out.token_ids,
                logprobs=out.logprobs,
                temperature=temperature,
                finish_reason=out.finish_reason,
                prompt_tokens=out.prompt_tokens,
                completion_tokens=out.completion_tokens,
                cost=out.cost,
                duration=time.perf_counter() - t0,
            )
        )
        return out


@dataclass
class RolloutContext:
    """What an agent sees during one rollout."""

    system: System
    task: Task
    llm_provider: LLMProvider
    seed: int = 0
    temperature: float | None = None  # overrides the model's default (exploration rollouts)
    max_tokens: int | None = None  # caps every call's new tokens (exploration rollouts: e.g. STaR's samples)
    logprobs: bool = True  # False: whoever reads the rollout reads no log-probs (a backend may skip them)
    deadline: float | None = None  # time.monotonic() value
    steps: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _gateway: dict = field(default_factory=dict, repr=False)  # role -> token (evolve.gateway.rollout_route)
    infra: InfraFailure | None = None  # the first time the world failed under this rollout

    def llm(self, role: str = "policy") -> RecordedLLM:
        if role not in self.system.models:
            raise KeyError(f"the system has no model role {role!r}; it has {sorted(self.system.models)}")
        try:
            llm = self.llm_provider(self.system, role)
        except Exception as e:  # the model could not be built (a bad key, a missing file, ...): the world's
            self.note_failure(e, building=f"building the model of role {role!r}")
            raise
        return RecordedLLM(self, role, llm)

    def note_failure(self, e: BaseException, building: str | None = None) -> None:
        """Record ``e`` as the world failing under this rollout when it is one (see
        :func:`evolve.failures.classify`); while ``building`` a model, every failure is."""
        if self.infra is not None:
            return
        found = classify(e)
        if found is None and building is not None:
            from evolve.errors import UserError

            found = infra("config" if isinstance(e, UserError) else "backend", f"{building}: {type(e).__name__}: {e}")
        if found is not None:
            self.infra = found

    def openai_base_url(self, role: str = "policy") -> str:
        """A loopback OpenAI-compatible base URL (``http://127.0.0.1:PORT/r/TOKEN/v1``) for this
        rollout only: chat completions sent there are ``self.llm(role).complete`` calls, recorded
        in the trajectory with token ids and log-probs. Any model name and API key are accepted;
        the URL stops working when the rollout ends. An exploration rollout's temperature wins
        over the request's (see :mod:`evolve.gateway.rollout_route`)."""
        from evolve.gateway.rollout_route import register

        return register(self, role)

    def openai_env(self, role: str = "policy") -> dict[str, str]:
        """``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` for an agent configured by its environment
        (e.g. a subprocess: ``env={**os.environ, **ctx.openai_env()}``)."""
        url = self.openai_base_url(role)
        return {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": self._gateway[role]}

    def tool(self, name: str, fn: Callable[..., Any], /, **args: Any) -> Any:
        """Call ``fn(**args)`` and record it; re-raises ``fn``'s exception after recording it."""
        self.check_deadline()
        t0 = time.perf_counter()
        try:
            result = fn(**args)
        except Exception as e:
            self.add_step(
                ToolCall(
                    name=name, args=jsonable(args), error=f"{type(e).__name__}: {e}", duration=time.perf_counter() - t0
                )
            )
            raise
        self.add_step(
            ToolCall(name=name, args=jsonable(args), result=jsonable(result), duration=time.perf_counter() - t0)
        )
        return result

    def add_step(self, step: LLMCall | ToolCall) -> None:
        with self._lock:
            self.steps.append(step)

    def fork(self, branch: int) -> RolloutContext:
        """A sub-context for one of several branches run at the same time (a vote's samples): a
        copy of this context (a subclass keeps what it adds, e.g. Reflexion's lessons) with its
        own steps, no OpenAI gateway URLs, and a seed that depends only on where the fork
        happened and on ``branch`` (not on thread timing), so concurrent branches sample
        deterministically. Add its steps back with :meth:`join`."""
        fork = copy.copy(self)
        fork.seed = ((self.seed * 1000 + len(self.steps)) * 64 + branch + 1) % (1 << 31)
        fork.steps, fork._lock, fork._gateway = [], threading.Lock(), {}
        return fork

    def join(self, forks: Sequence[RolloutContext]) -> None:
        """Append the forks' steps, branch after branch, in the order given, and drop any gateway
        URL a fork registered (its calls are recorded; the URL must not outlive the branch). The
        world failing under a fork failed it under this rollout too."""
        with self._lock:
            for f in forks:
                self.steps.extend(f.steps)
                if self.infra is None and f.infra is not None:
                    self.infra = f.infra
        for f in forks:
            if f._gateway:
                from evolve.gateway.rollout_route import unregister

                unregister(f)

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise RolloutTimeout("rollout timed out")


def jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)


def run_agent(
    agent: Callable[[Task, RolloutContext], Any],
    system: System,
    task: Task,
    llm_provider: LLMProvider,
    *,
    seed: int = 0,
    sample: int = 0,
    temperature: float | None = None,
    timeout: float | None = None,
    logprobs: bool = True,
    max_tokens: int | None = None,
) -> Trajectory:
    """Run ``agent`` once; never raises for the agent's own failures."""
    t0 = time.monotonic()
    ctx = RolloutContext(
        system,
        task,
        llm_provider,
        seed=seed,
        temperature=temperature,
        max_tokens=max_tokens,
        logprobs=logprobs,
        deadline=t0 + timeout if timeout else None,
    )
    output, error = None, None
    try:
        output = agent(task, ctx)
        if timeout and time.monotonic() - t0 > timeout:
            error = f"timeout: the agent took {time.monotonic() - t0:.1f}s, over the {timeout:g}s limit"
    except RolloutTimeout:
        error = f"timeout: the agent ran past its {timeout:g}s limit"
    except Exception as e:  # noqa: BLE001 - whatever the agent raised is the trajectory's error
        error = f"agent raised {type(e).__name__}: {e}\n" + _short_tb(e)
        ctx.note_failure(e)  # its own model client's errors (openai, httpx, ...) speak for the world
    finally:
        if ctx._gateway:  # the rollout's OpenAI URLs stop working now
            from evolve.gateway.rollout_route import unregister

            unregister(ctx)
    if ctx.infra is not None and error is None:  # the agent caught the failure and went on
        error = f"the world failed under the rollout: {ctx.infra.message}"
    steps = tuple(ctx.steps)
    tokens = sum(s.prompt_tokens + s.completion_tokens for s in steps if isinstance(s, LLMCall))
    cost = sum((s.cost or 0.0) for s in steps if isinstance(s, LLMCall))
    return Trajectory(
        task_id=str(task["id"]),
        system_id=system.id,
        steps=steps,
        output=jsonable(output),
        error=error,
        infra=ctx.infra,
        tokens=tokens,
        cost=cost,
        duration=time.monotonic() - t0,
        sample=sample,
        temperature=temperature,
    )


def _short_tb(e: BaseException, limit: int = 6) -> str:
    return "".join(traceback.format_tb(e.__traceback__, limit=-limit)).rstrip()


@functools.lru_cache(maxsize=256)
def _reward_arity(fn: Callable) -> int:
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        has_var = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values())
        return 3 if has_var or len(params) >= 3 else len(params)
    except (TypeError, ValueError):
        return 3


def check_reward_signature(fn: Callable) -> None:
    """Raise TypeError naming the accepted signatures when ``fn`` cannot be a reward."""
    if not callable(fn):
        raise TypeError(f"the reward {fn!r} is not callable")
    if _reward_arity(fn) < 2:
        raise TypeError(
            f"the reward {getattr(fn, '__name__', fn)!r} takes too few arguments; accepted signatures are "
            "reward(task, output) and reward(task, output, trajectory)"
        )


def score(reward_fn: Callable, task: Task, trajectory: Trajectory) -> Trajectory:
    """Attach a Reward to ``trajectory``. A failed rollout scores 0; a raising reward, or one that
    returns anything but a finite real number, a Reward or a dict with ``score``, is recorded as a
    reward error (score 0); a reward that fails because the world failed under it (its judge model
    unreachable) marks the trajectory's ``infra``."""
    if trajectory.error is not None:
        r = Reward(score=0.0, feedback=trajectory.error.splitlines()[0], components={"failed": 1.0})
        return trajectory.model_copy(update={"reward": r})
    try:
        if _reward_arity(reward_fn) >= 3:
            value = reward_fn(task, trajectory.output, trajectory)
        else:
            value = reward_fn(task, trajectory.output)
    except Exception as e:  # noqa: BLE001 - a raising reward is recorded as a reward error (score 0)
        found = classify(e, source="reward")
        if found is not None:
            return trajectory.model_copy(
                update={
                    "infra": found,
                    "error": f"the reward failed: {found.message}",
                    "reward": Reward(score=0.0, error=found.message),
                }
            )
        r = Reward(
            score=0.0,
            error=f"reward raised {type(e).__name__}: {e}",
            feedback=f"the reward function failed: {type(e).__name__}: {e}",
        )
        return trajectory.model_copy(update={"reward": r})
    try:
        r = as_reward(value)
    except (TypeError, ValueError) as e:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:59] + "…"
        r = Reward(score=0.0, error=f"reward returned {shown}: {e}", feedback=f"the reward function returned {shown}")
    return trajectory.model_copy(update={"reward": r})


_ACCEPTED = "a finite real number (a float, an int, a bool or a numpy scalar), a Reward, or a dict with 'score'"


def as_real(value: Any, what: str = "a reward") -> float:
    """``value`` as a finite float: bools, ints, floats, numpy scalars and one-element arrays or
    tensors. Raises TypeError for other types, ValueError for NaN and infinities."""
    if not isinstance(value, (bool, numbers.Real)):
        item = getattr(value, "item", None)  # numpy scalars (np.bool_ is no numbers.Real), one-element arrays, tensors
        if callable(item):
            try:
                value = item()
            except Exception:  # noqa: BLE001 - more than one element (numpy: ValueError, torch: RuntimeError)
                pass
        if not isinstance(value, (bool, numbers.Real)):
            kinds = (
                _ACCEPTED if what == "a reward" else "a finite real number (a float, an int, a bool or a numpy scalar)"
            )
            raise TypeError(f"{what} must be {kinds}; got {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{what} must be a finite number; got {x}")
    return x


def as_reward(value: Any) -> Reward:
    """A :class:`Reward` from what a reward function returned (see :func:`as_real`)."""
    if isinstance(value, Reward):
        return value
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"a reward dict needs a 'score'; got keys {sorted(value)[:8]}")
        data = dict(value)
        data["score"] = as_real(value["score"], "the reward's score")
        comps = data.get("components")
        if isinstance(comps, dict):
            data["components"] = {str(k): as_real(v, f"reward component {k!r}") for k, v in comps.items()}
        return Reward.model_validate(data)
    return Reward(score=as_real(value))


__all__ = [
    "LLMProvider",
    "RecordedLLM",
    "RolloutContext",
    "RolloutTimeout",
    "Task",
    "as_real",
    "as_reward",
    "check_reward_signature",
    "jsonable",
    "run_agent",
    "score",
]
