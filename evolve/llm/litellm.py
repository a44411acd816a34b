"""The litellm backend: every hosted or served model (OpenAI, Anthropic, vLLM, Ollama, ...).

``litellm`` is imported lazily, on the first call, never by ``import evolve``. Before it is
imported, ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and ``LITELLM_OFFLINE_MODE=true`` are set
(unless the environment already sets them) so that importing it does not fetch the price
map or anything else from the internet, and its telemetry and debug banners are turned off.

Behaviour of :meth:`LiteLLM.complete`:

* one request = ``litellm.completion(model, messages, temperature, max_tokens, stop, seed,
  timeout, api_base, api_key, drop_params=True, max_retries=0)``; the retries are ours;
* transient errors — rate limits (429), timeouts (408), 409/425, server errors (5xx),
  connection errors, and bodies that are not JSON (litellm reports them as a 500) — are
  retried ``max_retries`` times with exponential backoff ``backoff * 2**k`` seconds times a
  jitter in [0.5, 1.5) (capped at 30 s; a ``Retry-After`` header, when given, is honoured up
  to 60 s);
* other errors — authentication (401), permission (403), bad request (400, context window),
  not found (404), missing credentials — fail at once;
* either way the failure is an :class:`~evolve.errors.LLMError` that names the model, the
  api_base, the number of attempts and the underlying error's class and message (the API
  key is redacted from it), with its ``category`` (:func:`evolve.failures.category_of`):
  every category but ``request`` (a bad request: the agent's own failure) is the world
  failing, which the engine retries or stops on and never scores;
* a response with no ``choices`` is an ``LLMError`` (not retried); a choice whose content
  is ``None`` (e.g. a content filter, or tool calls only) gives **empty text** with the
  response's ``finish_reason`` kept, because a model may legitimately say nothing;
* usage gives ``prompt_tokens``/``completion_tokens``; the cost is
  ``litellm.completion_cost(response)`` when litellm knows the model's price and ``None``
  otherwise (an unknown price never fails a call);
* with ``logprobs=True`` the request asks for log-probs and the returned per-token
  log-probs are parsed into ``Completion.logprobs`` (token ids are not available from
  hosted APIs, so ``token_ids`` stays ``None``; the tokens' strings are in
  ``Completion.extra["tokens"]``).

From a task file::

    models:
      policy:
        backend: litellm
        name: openai/gpt-4o-mini            # any litellm model string
        params: {temperature: 0.7, max_tokens: 512, api_key_env: OPENAI_API_KEY,
                 api_base: null, timeout: 60, max_retries: 3, backoff: 0.5, logprobs: false}

The key sent is the value of ``api_key_env``. A model named with an ``api_base`` (a server of your
own, or anyone's) and no ``api_key_env`` is sent the placeholder key ``EMPTY``: a key from the
environment (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ...) never reaches a server named by
address. Without ``api_base``, litellm sends the provider's own key to the provider's own endpoint.

Other keys in ``params`` (``top_p``, ``seed``, ``reasoning_effort``, ...: the list is
:data:`evolve.llm.params.LITELLM`; an unknown key is refused when the task file loads) are
passed to ``litellm.completion`` as they are, and so is everything under ``params.extra``
(a provider's own parameters).
"""

from __future__ import annotations

import os
import random
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

from evolve.errors import TRANSIENT, ConfigError, LLMError, MissingDependency
from evolve.failures import category_of
from evolve.llm.base import Completion, as_messages
from evolve.types import Message

_import_lock = threading.Lock()
_litellm: Any = None


def import_litellm() -> Any:
    """Import litellm offline and quietly (once); MissingDependency when it is not installed."""
    global _litellm
    if _litellm is not None:
        return _litellm
    with _import_lock:
        if _litellm is not None:
            return _litellm
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
        os.environ.setdefault("LITELLM_LOCAL_BLOG_POSTS", "true")
        os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "true")
        os.environ.setdefault("LITELLM_TELEMETRY", "False")
        os.environ.setdefault("LITELLM_LOG", "ERROR")
        try:
            with warnings.catch_warnings():  # its import is noisy (pydantic warnings)
                warnings.simplefilter("ignore")
                import litellm  # noqa: PLC0415
        except ImportError:
            raise MissingDependency(
                "the litellm backend needs the Python package 'litellm', which is not installed; "
                "install it with: pip install 'evolvekit[litellm]'"
            ) from None
        # litellm's lazily imported modules trip this pydantic warning on the first call
        warnings.filterwarnings("ignore", message=r".*`ReadOnly` qualifier.*", category=UserWarning)
        for attr, value in (
            ("telemetry", False),
            ("suppress_debug_info", True),
            ("set_verbose", False),
            ("disable_hf_tokenizer_download", True),
        ):
            try:
                setattr(litellm, attr, value)
            except Exception:  # noqa: BLE001  # pragma: no cover - attribute missing in some versions
                pass
        _litellm = litellm
        return litellm


def is_retryable(e: BaseException) -> bool:
    """Transient (rate limit, timeout, 5xx, connection) → True; auth/bad request/not found → False
    (:func:`evolve.failures.category_of` on an exception of the model client)."""
    return category_of(e, client=True) in TRANSIENT


def _retry_after(e: BaseException) -> float | None:
    headers = getattr(getattr(e, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        value = headers.get("retry-after")
        return min(float(value), 60.0) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def retry_delay(e: BaseException, attempt: int, backoff: float, rng: random.Random) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1, 2, ...): ``backoff * 2**(attempt - 1)``
    times a jitter in [0.5, 1.5), at most 30 s; longer when a ``Retry-After`` header asks (up to 60 s)."""
    delay = min(backoff * (2 ** (attempt - 1)) * (0.5 + rng.random()), 30.0)
    after = _retry_after(e)
    return delay if after is None else max(delay, after)


def api_key_for(api_base: str | None, api_key_env: str | None) -> str | None:
    """The key a request sends: the value of ``api_key_env``; else, to a server named by address
    (``api_base``), the placeholder ``EMPTY`` (clients refuse to send no key at all), never a
    provider key from the environment; else None, and litellm finds the provider's own key for
    the provider's own endpoint (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ...)."""
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        return key
    return "EMPTY" if api_base else None


class LiteLLM:
    """One litellm model behind the :class:`~evolve.llm.base.LLM` protocol (thread-safe)."""

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key_env: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        logprobs: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        name: str | None = None,
        **extra: Any,
    ) -> None:
        if not model:
            raise ConfigError("the litellm backend needs a model name, e.g. 'openai/gpt-4o-mini'")
        self.model = model
        self.name = name or model
        self.api_base = api_base
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.logprobs = bool(logprobs)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra = dict(extra)
        self.attempts = 0  # requests sent (all calls, retries included)
        self._lock = threading.Lock()
        self._rng = random.Random()
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise ConfigError(f"model {model!r}: the environment variable {api_key_env!r} (api_key_env) is not set")
        import_litellm()

    def complete(
        self,
        messages: Sequence[Message | dict],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> Completion:
        litellm = import_litellm()
        msgs = as_messages(messages)
        api_key = api_key_for(self.api_base, self.api_key_env)
        kwargs: dict[str, Any] = dict(self.extra)
        kwargs.update(
            model=self.model,
            messages=[{"role": m.role, "content": m.content} for m in msgs],
            timeout=self.timeout,
            max_retries=0,
            drop_params=True,
        )
        temperature = self.temperature if temperature is None else temperature
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        for key, value in (
            ("temperature", temperature),
            ("max_tokens", max_tokens),
            ("seed", seed),
            ("api_base", self.api_base),
            ("api_key", api_key),
        ):
            if value is not None:
                kwargs[key] = value
        if stop:
            kwargs["stop"] = list(stop)
        if self.logprobs:
            kwargs["logprobs"] = True
        attempts = 0
        t0 = time.monotonic()
        while True:
            attempts += 1
            with self._lock:
                self.attempts += 1
            try:
                response = litellm.completion(**kwargs)
                break
            except Exception as e:  # noqa: BLE001 - every backend failure becomes an LLMError
                retry = is_retryable(e) and attempts <= self.max_retries
                if not retry:
                    raise self._error(e, attempts, time.monotonic() - t0, api_key) from None
                time.sleep(retry_delay(e, attempts, self.backoff, self._rng))
        return self._parse(litellm, response, attempts)

    def _where(self) -> str:
        return f"model {self.model!r}" + (f" at {self.api_base}" if self.api_base else "")

    def _error(self, e: BaseException, attempts: int, elapsed: float, api_key: str | None) -> LLMError:
        msg = " ".join(str(e).split())
        if api_key and api_key != "EMPTY":
            msg = msg.replace(api_key, "***")
        if len(msg) > 500:
            msg = msg[:500] + "…"
        category = category_of(e, client=True) or "backend"
        kind = "retryable" if category in TRANSIENT else "not retryable"
        return LLMError(
            f"{self._where()}: failed after {attempts} attempt{'s' if attempts != 1 else ''} "
            f"in {elapsed:.1f}s ({kind}, {category}): {type(e).__name__}: {msg}",
            category=category,
        )

    def _parse(self, litellm: Any, response: Any, attempts: int) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices:
            raise LLMError(
                f"{self._where()}: the response has no choices (an empty or malformed reply); "
                f"got {str(response)[:200]!r}",
                category="server",
            )
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None)
        if text is None:
            text = ""
        elif not isinstance(text, str):
            text = str(text)
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        cost: float | None = None
        try:
            value = litellm.completion_cost(completion_response=response)
            cost = float(value) if value is not None else None
        except Exception:  # noqa: BLE001 - unknown price
            cost = None
        logprobs = tokens = None
        lp = getattr(choice, "logprobs", None)
        content = getattr(lp, "content", None) if lp is not None else None
        if content is None and isinstance(lp, dict):
            content = lp.get("content")
        if content:
            try:
                logprobs = tuple(float(_get(t, "logprob")) for t in content)
                tokens = [str(_get(t, "token")) for t in content]
            except (TypeError, ValueError):
                logprobs = tokens = None
        extra: dict[str, Any] = {"attempts": attempts}
        served = getattr(response, "model", None)
        if served:
            extra["served_model"] = served
        if tokens is not None:
            extra["tokens"] = tokens
        return Completion(
            text=text,
            model=self.name,
            logprobs=logprobs,
            finish_reason=getattr(choice, "finish_reason", None),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=cost,
            extra=extra,
        )

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LiteLLM({self.model!r}" + (f", api_base={self.api_base!r}" if self.api_base else "") + ")"


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key)


def build(spec: Any, artifacts: Any = None) -> LiteLLM:
    """Build a :class:`LiteLLM` from a :class:`~evolve.types.ModelSpec` (``backend: litellm``)."""
    params = dict(spec.params or {})
    params.pop("name", None)
    extra = params.pop("extra", None) or {}
    return LiteLLM(spec.name, **params, **extra)


__all__ = ["LiteLLM", "api_key_for", "build", "import_litellm", "is_retryable", "retry_delay"]
