"""The local backend's server: one base model, LoRA adapters by name, one batching worker thread.

:class:`LocalServer` gathers pending requests (up to ``max_batch``, waiting ``batch_wait``
seconds for more), groups them by adapter and decodes them as one batch with our own sampling
loop (:class:`evolve.policy.sampling.Decoder`), taking waiting requests into the running batch as
its rows end (continuous batching). :mod:`evolve.policy.local` wraps it in the LLM protocol.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import random
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import LLMError
from evolve.policy.sampling import Decoder, Row, Sample

if TYPE_CHECKING:  # pragma: no cover
    from evolve.policy.tiny import CharTokenizer
    from evolve.policy.weights import Adapter


@dataclass
class _Request:
    prompt: list[int]
    adapter: str | None
    temperature: float
    max_tokens: int
    stop: tuple[str, ...]
    seed: int
    logprobs: bool = True  # False: an engine that pays extra for them may leave them out (None)
    top_logprobs: int = 0  # k > 0: each token's k likeliest ids with their log-probs (Sample.top_logprobs)
    future: cf.Future[Sample] = field(default_factory=cf.Future)
    t0: float = field(default_factory=time.monotonic)


class LocalServer:
    """One base model in memory, any number of LoRA adapters, one batching worker thread.

    ``submit`` is thread-safe and returns a future; the worker takes the oldest pending
    request and, while the batch is not full, keeps waiting as long as new requests arrive
    less than ``batch_wait`` seconds apart (at most ``max_wait`` after the oldest), then runs
    every pending request with the same adapter (up to ``max_batch``, oldest first) as one
    batch, which requests for that adapter join as its rows end (see :meth:`_admit`).
    Adapters are attached with peft and selected per batch; ``adapter=None`` runs the
    bare base (adapters disabled). Base tensors are never written.
    """

    engine = "torch"  # what samples (evolve.policy.ct2_server.CT2Server: "ctranslate2")

    def __init__(
        self,
        model: Any,
        tokenizer: CharTokenizer,
        *,
        max_batch: int = 64,
        batch_wait: float = 0.003,
        max_wait: float = 0.05,
        threads: int | None = None,
        name: str = "local",
    ) -> None:
        is_peft = hasattr(model, "peft_config") and hasattr(model, "get_base_model")  # no peft import needed
        self.peft = model if is_peft else None
        self.base = model.get_base_model() if self.peft is not None else model
        self.base.eval()
        self._threads = threads
        self._start(
            tokenizer,
            int(self.base.config.max_position_embeddings),
            name=name,
            max_batch=max_batch,
            batch_wait=batch_wait,
            max_wait=max_wait,
        )

    def _start(
        self, tokenizer: Any, max_len: int, *, name: str, max_batch: int, batch_wait: float, max_wait: float
    ) -> None:
        """The queue and the worker thread (shared with the engines' servers, e.g. :mod:`evolve.policy.ct2_server`)."""
        self.tok = tokenizer
        self.name = name
        self.max_len = int(max_len)
        self.max_batch = max(1, int(max_batch))
        self.batch_wait = float(batch_wait)
        self.max_wait = max(float(max_wait), self.batch_wait)
        self.refs = 0  # LocalLM handles sharing this server (see build)
        self.adapter_refs: dict[str, int] = {}
        self.stats: dict[str, float] = {"batches": 0, "requests": 0, "tokens": 0, "busy_s": 0.0}
        self.closed = False
        self._pending: list[_Request] = []
        self._cond = threading.Condition()
        self._model_lock = threading.RLock()
        self._model_waiters = 0  # threads waiting to change the model (add or remove an adapter)
        self._worker = threading.Thread(target=self._run, name=f"evolve-local-lm-{name}", daemon=True)
        self._worker.start()

    # -- adapters

    def adapters(self) -> list[str]:
        return list(self.peft.peft_config) if self.peft is not None else []

    def add_adapter(self, name: str, adapter: Adapter | str | Path) -> None:
        """Attach an adapter (an :class:`~evolve.policy.weights.Adapter` or its file) as ``name``;
        a no-op when one with that name is loaded already."""
        from evolve.policy.weights import Adapter, attach_adapter, read_adapter

        with self._changing_model():
            if name in self.adapters():
                return
            value = adapter if isinstance(adapter, Adapter) else read_adapter(adapter)
            self.peft = attach_adapter(self.peft if self.peft is not None else self.base, value, name, activate=False)

    def remove_adapter(self, name: str) -> None:
        """Drop an adapter (peft cannot drop its last one: that one stays loaded, unused)."""
        with self._changing_model():
            if self.peft is not None and name in self.peft.peft_config and len(self.peft.peft_config) > 1:
                self.peft.delete_adapter(name)

    # -- requests

    def submit(
        self,
        prompt_ids: Sequence[int],
        *,
        adapter: str | None = None,
        temperature: float = 1.0,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        logprobs: bool = True,
        top_logprobs: int = 0,
    ) -> cf.Future[Sample]:
        """Queue one generation; the future resolves to a :class:`Sample`. The completion is
        cut to fit the context (``max_len`` of the model): ``finish_reason="length"``. With
        ``logprobs=False`` an engine for which they cost extra work leaves them out (None); with
        ``top_logprobs=k`` each token comes with the k likeliest ids at its step."""
        prompt = list(prompt_ids)
        if not prompt:
            raise LLMError(f"local model {self.name!r}: empty prompt", category="request")
        if len(prompt) >= self.max_len:
            raise LLMError(
                f"local model {self.name!r}: the prompt has {len(prompt)} tokens; the context holds {self.max_len}",
                category="request",
            )
        if adapter is not None and adapter not in self.adapters():
            raise LLMError(f"local model {self.name!r}: no adapter {adapter!r} is loaded")
        req = _Request(
            prompt=prompt,
            adapter=adapter,
            temperature=max(0.0, float(temperature)),
            max_tokens=max(0, min(int(max_tokens), self.max_len - len(prompt))),
            stop=tuple(s for s in (stop or ()) if s),
            seed=int(seed) if seed is not None else random.getrandbits(63),
            logprobs=bool(logprobs),
            top_logprobs=max(0, int(top_logprobs)),
        )
        with self._cond:
            if self.closed:
                raise LLMError(f"local model {self.name!r}: the server is closed")
            self._pending.append(req)
            self._cond.notify_all()
        return req.future

    def _take(self) -> list[_Request]:
        adapter = self._pending[0].adapter
        batch: list[_Request] = []
        rest: list[_Request] = []
        for r in self._pending:
            (batch if r.adapter == adapter and len(batch) < self.max_batch else rest).append(r)
        self._pending = rest
        return batch

    def _run(self) -> None:
        if self._threads:
            import torch

            torch.set_num_threads(int(self._threads))
        while True:
            with self._cond:
                while not self._pending and not self.closed:
                    self._cond.wait()
                if self.closed:
                    pending, self._pending = self._pending, []
                    for r in pending:
                        r.future.set_exception(LLMError(f"local model {self.name!r}: the server was closed"))
                    return
                start = self._pending[0].t0
                while len(self._pending) < self.max_batch and not self.closed:
                    # wait while requests keep coming (gaps under batch_wait), at most max_wait
                    deadline = min(start + self.max_wait, max(start, self._pending[-1].t0) + self.batch_wait)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._take()
            self._serve(batch)

    def _serve(self, batch: list[_Request]) -> None:
        """Decode ``batch`` (one adapter), and keep admitting pending requests for that adapter
        into the running batch as its rows end (continuous batching), until it runs dry. A
        request waits for the running batch while it is full or decodes another adapter."""
        t0 = time.perf_counter()
        adapter, inflight = batch[0].adapter, list(batch)
        try:
            with self._model_lock, self._keep_requires_grad(), self._adapter(adapter):
                dec = Decoder(
                    self.base,
                    eos_id=getattr(self.tok, "eos_ids", self.tok.eos_id),
                    pad_id=self.tok.pad_id,
                    decode=self.tok.token_text,
                )
                self._finish(dec.add(batch))
                self.stats["batches"] += 1
                while dec.live:
                    self._finish(dec.step())
                    if self.closed:
                        raise LLMError(f"local model {self.name!r}: the server was closed")
                    more = self._admit(adapter, dec.live) if dec.live and dec.joinable else []
                    if more:
                        inflight += more
                        self._finish(dec.add(more))
        except BaseException as e:  # noqa: BLE001 - the worker must survive: fail these requests, keep serving
            err = self._failure(e)
            for r in inflight:
                if not r.future.done():
                    r.future.set_exception(err)
        finally:
            self.stats["busy_s"] += time.perf_counter() - t0

    def _failure(self, e: BaseException) -> LLMError:
        """What the callers of a failed generation get: ``e`` itself when it is an LLMError."""
        if isinstance(e, LLMError):
            return e
        err = LLMError(f"local model {self.name!r}: generation failed: {type(e).__name__}: {e}")
        err.__cause__ = e
        return err

    def _admit(self, adapter: str | None, live: int) -> list[_Request]:
        """Pending requests to join a running batch of ``live`` rows: from the head of the queue
        while they are for ``adapter`` and there is room. A join copies the batch's cache, so
        requests join a quarter of the batch at a time, or all together once every one that can
        join fits and the oldest has waited ``max_wait``; none join while someone waits to change
        the model."""
        with self._cond:
            room = self.max_batch - live
            if room <= 0 or self._model_waiters or not self._pending:
                return []
            run = 0  # the head of the queue that is for this adapter
            for r in self._pending:
                if r.adapter != adapter:
                    break
                run += 1
            n = min(run, room)
            quarter = max(1, self.max_batch // 4)
            if n == 0 or (n < quarter and not (n == run and time.monotonic() - self._pending[0].t0 >= self.max_wait)):
                return []
            taken, self._pending = self._pending[:n], self._pending[n:]
            return taken

    def _finish(self, rows: list[Row]) -> None:
        for row in rows:
            if row.done is None:
                continue
            self.stats["requests"] += 1
            self.stats["tokens"] += len(row.done.token_ids)
            fut = row.spec.future
            if not fut.done():
                fut.set_result(row.done)

    @contextlib.contextmanager
    def _adapter(self, adapter: str | None) -> Iterator[None]:
        """The model as ``adapter`` (None: the bare base, adapters disabled); the model lock is held."""
        if adapter is None:
            with self.peft.disable_adapter() if self.peft is not None else contextlib.nullcontext():
                yield
            return
        if self.peft is None or adapter not in self.peft.peft_config:
            raise LLMError(f"local model {self.name!r}: adapter {adapter!r} is not loaded")
        if self.peft.active_adapter != adapter:
            self.peft.set_adapter(adapter)
        yield

    @contextlib.contextmanager
    def _changing_model(self) -> Iterator[None]:
        """The model lock, for a change of adapters: running batches stop admitting until it is taken."""
        with self._cond:
            self._model_waiters += 1
        try:
            with self._model_lock:
                yield
        finally:
            with self._cond:
                self._model_waiters -= 1

    @contextlib.contextmanager
    def _keep_requires_grad(self) -> Iterator[None]:
        """peft's adapter switching/disabling flips ``requires_grad``; put the flags back, so a
        model served while it is being trained (an ``eval_fn``) keeps training the same tensors."""
        if self.peft is None:
            yield
            return
        flags = [(p, p.requires_grad) for p in self.peft.parameters()]
        try:
            yield
        finally:
            for p, flag in flags:
                if p.requires_grad != flag:
                    p.requires_grad_(flag)

    def close(self) -> None:
        """Stop the worker; pending requests fail with LLMError."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout=60)
