"""The local backend: a tiny causal LM (plus LoRA adapters) served with dynamic batching.

One :class:`LocalServer` (:mod:`evolve.policy.local_server`) holds one base model in memory and any
number of LoRA adapters (attached through peft, never merged: the base tensors are not changed).
Many rollout threads call :meth:`LocalLM.complete` at once; a single worker thread gathers pending
requests (up to ``max_batch``, waiting ``batch_wait`` seconds for more), groups them by adapter, and
runs one batched generation: left padding, attention mask, position ids, a KV cache and our own
sampling loop (:func:`evolve.policy.sampling.sample`, not ``generate``), so temperature and log-probs
are exact:

* ``token_ids`` are exactly the ids the sampler drew, the final EOS included when it was drawn
  (``finish_reason="stop"``); ``text`` is their decoding without specials, cut before any
  ``stop`` string; ``finish_reason="length"`` when ``max_tokens`` (or the context) ran out.
* ``logprobs[i]`` is ``log_softmax(logits / T)[token_ids[i]]`` (untempered for ``T == 0``, greedy).
* with a ``seed``, each request draws its Gumbel noise from its own ``torch.Generator``, so the
  sample does not depend on which other requests share the batch.

``params.engine: ctranslate2`` (or ``auto``) samples with CTranslate2 instead
(:mod:`evolve.policy.ct2`, :mod:`evolve.policy.ct2_server`): the same batching and the same
completions, except that a seed does not reproduce a sample there (``extra["seed"]`` is None).

``build(spec, artifacts)`` is the registry factory: ``spec.base`` (an ArtifactRef of a file
written by :func:`evolve.policy.weights.save_base`) and the optional ``spec.adapter``; bases are
shared across ``build`` calls by sha256 (and engine, device and dtype), adapters are loaded once per
sha256 into that server.
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from evolve.errors import ConfigError, LLMError
from evolve.llm.base import Completion, as_messages
from evolve.policy.ct2 import engine_of
from evolve.policy.local_server import LocalServer
from evolve.policy.sampling import Sample, sample
from evolve.types import ArtifactRef, Message, ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    from evolve.policy.tiny import CharTokenizer


class ArtifactPaths(Protocol):
    """What :func:`build` needs from the artifact store: the local file of an artifact."""

    def path(self, ref: ArtifactRef) -> Path: ...


# ----------------------------------------------------------------------------- the LLM


class LocalLM:
    """The :class:`~evolve.llm.base.LLM` protocol over a :class:`LocalServer` and one adapter.

    ``LocalLM.from_model(model, tok)`` serves a model directly (its own server, closed with
    it); :func:`build` makes ones that share a server per base artifact.
    """

    def __init__(
        self,
        server: LocalServer,
        *,
        name: str = "local",
        adapter: str | None = None,
        temperature: float = 1.0,
        max_tokens: int = 256,
        timeout: float | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.server = server
        self.name = name
        self.adapter = adapter
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.timeout = timeout
        self._on_close = on_close
        self._closed = False

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: CharTokenizer,
        *,
        name: str = "local",
        adapter: Any = ...,
        temperature: float = 1.0,
        max_tokens: int = 256,
        **server_kw: Any,
    ) -> LocalLM:
        """Serve an in-memory model with its own server (closed with this LLM). By default the
        model runs as given: a PeftModel with its active adapter; ``adapter=None`` for the bare
        base, or an adapter name. Handy for ``eval_fn`` during training."""
        server = LocalServer(model, tokenizer, name=name, **server_kw)
        if adapter is ...:
            adapter = server.peft.active_adapter if server.peft is not None else None
        return cls(
            server, name=name, adapter=adapter, temperature=temperature, max_tokens=max_tokens, on_close=server.close
        )

    @property
    def tokenizer(self) -> CharTokenizer:
        return self.server.tok

    def submit(
        self,
        messages: Sequence[Message | dict],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        logprobs: bool = True,
        top_logprobs: int = 0,
    ) -> cf.Future[Completion]:
        """Non-blocking :meth:`complete`: a future of the Completion."""
        msgs = as_messages(messages)
        prompt = self.server.tok.render_chat(msgs, add_generation_prompt=True)
        temp = self.temperature if temperature is None else float(temperature)
        seed = int(seed) if seed is not None else random.getrandbits(63)
        fut = self.server.submit(
            prompt,
            adapter=self.adapter,
            temperature=temp,
            max_tokens=self.max_tokens if max_tokens is None else max_tokens,
            stop=stop,
            seed=seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
        )
        out: cf.Future[Completion] = cf.Future()

        def done(f: cf.Future[Sample]) -> None:
            try:
                out.set_result(self._completion(prompt, f.result(), temp, seed, msgs))
            except BaseException as e:  # noqa: BLE001 - the caller's future raises it
                out.set_exception(e)

        fut.add_done_callback(done)
        return out

    def complete(
        self,
        messages: Sequence[Message | dict],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        logprobs: bool = True,
        top_logprobs: int = 0,
    ) -> Completion:
        """Render the chat, sample a reply (batched with concurrent callers), return it.

        ``token_ids``/``logprobs`` cover every sampled token (the final EOS included when
        ``finish_reason == "stop"`` by EOS). ``logprobs=False`` says the caller reads none: an
        engine that pays extra for them (CTranslate2 at a temperature other than 0 or 1) then
        returns ``logprobs=None``; torch's come free and are always there. ``top_logprobs=k``: each
        token also comes with the k likeliest ids at its step and their log-probs (``top_logprobs``,
        under the distribution it was drawn from, as ``logprobs``). ``extra`` has ``seed``
        (to reproduce the sample; None under CTranslate2, which has no per-request seed),
        ``adapter``, ``stop`` (the stop string that ended it, if any) and, when it is not torch,
        ``engine``.
        """
        fut = self.submit(
            messages,
            temperature=temperature,
            max_tokens=max_tokens,
            stop=stop,
            seed=seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
        )
        try:
            return fut.result(timeout=self.timeout)
        except cf.TimeoutError:
            raise LLMError(
                f"local model {self.name!r}: no answer within {self.timeout} s", category="timeout"
            ) from None

    def _completion(
        self, prompt: list[int], s: Sample, temperature: float, seed: int, context: Sequence[Message] = ()
    ) -> Completion:
        text = self.server.tok.decode(s.token_ids, context=context)
        torch = self.server.engine == "torch"
        if s.stop is not None and s.stop in text:
            text = text[: text.index(s.stop)]
        return Completion(
            text=text,
            model=self.name,
            token_ids=tuple(s.token_ids),
            prompt_token_ids=tuple(prompt),
            logprobs=tuple(s.logprobs) if s.logprobs is not None else None,
            finish_reason=s.finish_reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(s.token_ids),
            cost=None,
            top_logprobs=None
            if s.top_logprobs is None
            else tuple(tuple((int(t), float(v)) for t, v in step) for step in s.top_logprobs),
            extra={
                "seed": seed if torch else None,
                "adapter": self.adapter,
                "stop": s.stop,
                "temperature": temperature,
                **({} if torch else {"engine": self.server.engine}),
            },
        )

    def close(self) -> None:
        """Release this handle (a shared server closes when its last handle does)."""
        if not self._closed:
            self._closed = True
            if self._on_close is not None:
                self._on_close()


# ----------------------------------------------------------------------------- factory

_SERVERS: dict[str, LocalServer] = {}
_SERVERS_LOCK = threading.Lock()


def _release(key: str, server: LocalServer, adapter: str | None) -> None:
    with _SERVERS_LOCK:
        if adapter is not None:
            n = server.adapter_refs.get(adapter, 0) - 1
            if n <= 0:
                server.adapter_refs.pop(adapter, None)
                server.remove_adapter(adapter)
            else:
                server.adapter_refs[adapter] = n
        server.refs -= 1
        last = server.refs <= 0
        if last and _SERVERS.get(key) is server:
            del _SERVERS[key]
    if last:
        server.close()  # outside the lock: it waits for a running batch


def build(spec: ModelSpec, artifacts: ArtifactPaths) -> LocalLM:
    """The registry factory of the ``local`` backend.

    ``spec.base``: the base weights artifact (a :func:`~evolve.policy.weights.save_base` file);
    ``spec.adapter``: an optional LoRA adapter artifact (:func:`~evolve.policy.weights.save_adapter`).
    ``spec.params``: ``temperature`` (default 1.0) and ``max_tokens`` (default 256) for calls
    that do not give them; ``max_batch`` (64), ``batch_wait_ms`` (3), ``max_wait_ms`` (50), ``threads`` for the server;
    ``device`` and ``dtype`` (a pretrained checkpoint: ``auto``, the GPU when there is one, in
    bfloat16 there and on a CPU with AMX or AVX512-BF16, else float32; a tiny base: the CPU in
    float32 unless given). The base may be a tiny base file or the manifest
    of a pretrained checkpoint (:mod:`evolve.policy.hf`). ``engine`` (``torch``, ``ctranslate2``
    or ``auto``) and ``compute_type``: who samples (:mod:`evolve.policy.ct2`).
    One server (one base in memory, one worker) is shared by every LLM built on the same base
    sha256 (and engine, device and dtype) until the last of them is closed; adapters are loaded once per sha256.
    """
    if spec.base is None:
        raise ConfigError(f"model {spec.name!r}: the local backend needs base weights (spec.base)")
    params = dict(spec.params)
    sha = spec.base.sha256
    with _SERVERS_LOCK:
        opened = None
        if engine_of(params, spec.name) != "torch":
            from evolve.policy.ct2_server import open_server

            opened = open_server(spec, artifacts, _SERVERS)
        if opened is not None:
            key, server = opened
            adapter = spec.adapter.sha256 if spec.adapter is not None else None
        else:
            key = _torch_key(sha, params)
            server, adapter = _torch_server(key, spec, params, artifacts)
        if adapter is not None:
            server.adapter_refs[adapter] = server.adapter_refs.get(adapter, 0) + 1
        server.refs += 1
    return LocalLM(
        server,
        name=spec.name,
        adapter=adapter,
        temperature=float(params.get("temperature", 1.0)),
        max_tokens=int(params.get("max_tokens", 256)),
        on_close=lambda: _release(key, server, adapter),
    )


def _torch_key(sha: str, params: dict[str, Any]) -> str:
    """The shared torch server's key: the base and where and in which type it runs (a system asking
    for float32 is not served by a bfloat16 copy of the same base)."""
    return f"{sha}|torch|{params.get('device') or 'auto'}|{params.get('dtype') or 'auto'}"


def _torch_server(
    key: str, spec: ModelSpec, params: dict[str, Any], artifacts: ArtifactPaths
) -> tuple[LocalServer, str | None]:
    """The shared torch server ``key`` of ``spec``'s base with its adapter attached (under the lock)."""
    server = _SERVERS.get(key)
    if server is None or server.closed or server.refs <= 0:
        from evolve.policy.weights import load_base

        model, tok, _cfg = load_base(
            artifacts.path(spec.base),  # type: ignore[arg-type]
            device=params.get("device"),
            dtype=params.get("dtype"),
            sampling=True,
        )
        server = LocalServer(
            model,
            tok,
            name=spec.name,
            max_batch=int(params.get("max_batch", 64)),
            batch_wait=float(params.get("batch_wait_ms", 3)) / 1000.0,
            max_wait=float(params.get("max_wait_ms", 50)) / 1000.0,
            threads=int(params["threads"]) if params.get("threads") else None,
        )
        _SERVERS[key] = server
    adapter = None
    if spec.adapter is not None:
        adapter = spec.adapter.sha256
        if adapter not in server.adapters():
            try:
                server.add_adapter(adapter, artifacts.path(spec.adapter))
            except Exception:
                if server.refs == 0:
                    server.close()
                    del _SERVERS[key]
                raise
    return server, adapter


def shutdown_all() -> None:
    """Close every shared server (tests, process exit)."""
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for s in servers:
        s.close()


__all__ = ["ArtifactPaths", "LocalLM", "LocalServer", "Sample", "build", "sample", "shutdown_all"]
