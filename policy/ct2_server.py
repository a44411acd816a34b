"""The local backend's server with CTranslate2 sampling (``params.engine: ctranslate2``; :mod:`evolve.policy.ct2`).

:class:`CT2Server` is a :class:`~evolve.policy.local_server.LocalServer` (the same queue, dynamic
batching and one worker thread, batches grouped by adapter) whose batches run through
``ctranslate2.Generator.generate_batch`` instead of our torch loop: one call per temperature and
per run of similar prompt lengths (:func:`length_groups`; CTranslate2 has no left padding). Each "adapter" is a whole
converted system (base + that LoRA adapter merged; ``None``: the bare base), loaded on first use;
at most ``max_loaded`` stay in memory (the least recently used is unloaded, and loaded again
from the cache when asked for).

What a completion holds is what the torch sampler gives, except for the seed and for log-probs that
no one asked for:

* ``token_ids``: the ids drawn, the final end-of-turn id included when one was drawn
  (``finish_reason="stop"``); stop strings and ``max_tokens`` end a row from the per-token
  callback (``finish_reason`` ``"stop"`` / ``"length"``);
* ``logprobs[i]`` is ``log_softmax(logits / T)[token_ids[i]]`` (untempered for ``T == 0``), of
  the logits the token was drawn from: CTranslate2's own step log-prob at ``T`` of 0 or 1; at
  another ``T`` (its step log-prob is untempered) the call also returns each step's logits
  (``return_logits_vocab``), which :func:`drawn_log_probs` reads. On SmolLM2 in int8 at T 0.4,
  sampling with them ran at 83% and 94% of the speed without (batch 8 and 64), where a forward
  pass over prompt and reply that recomputed them left 58% and 66%; and in int8 that pass's logits
  are another computation (0.18 to 0.21 nats from the drawn ones a token on average), not the ones
  sampled from (bench/sampling/ct2_logprobs.py). A request that does not want them
  (``logprobs=False``, e.g. STaR's samples) gets None there, and a call none of whose rows want
  them returns no logits. A request asking ``top_logprobs=k`` gets each step's k likeliest ids from
  the same logits, at any temperature. A call holds its logits until it ends, so a call returning them takes at
  most :data:`LOGITS_BYTES` of them (more rows go to further calls). The step callback's logits
  cannot be used: CTranslate2 4.8 hands the whole batch's logits to one row's callback and none
  to the others, in an order that is not the rows';
* greedy (``T == 0``) is deterministic; in float32 it is the torch sampler's output;
* sampling (``T > 0``) draws from the full distribution at ``T`` with CTranslate2's own
  generator: the request's ``seed`` is not used (CTranslate2 has no per-request seed; its random
  state lives in its worker threads and carries on from call to call), so a seeded request does
  not reproduce its sample, and never reproduces the torch sampler's draws.
"""

from __future__ import annotations

import atexit
import json
import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError, LLMError, MissingDependency
from evolve.policy.ct2 import (
    INSTALL,
    BaseInfo,
    NotConvertible,
    Plan,
    converted,
    describe,
    engine_of,
    keep_heap,
    require,
    say,
)
from evolve.policy.ct2 import plan as make_plan
from evolve.policy.local_server import LocalServer
from evolve.policy.sampling import Sample

_LIVE: weakref.WeakSet[CT2Server] = weakref.WeakSet()
_AT_EXIT = threading.Lock()
_hooked = False


def _close_all() -> None:
    # a Generator still alive while the interpreter tears down can abort the process (CTranslate2 4.8)
    for server in list(_LIVE):
        server.close()


def token(i: int) -> str:
    return f"<{i}>"


class CT2Server(LocalServer):
    """A :class:`LocalServer` sampling with CTranslate2 (see the module docstring)."""

    engine = "ctranslate2"

    def __init__(
        self,
        base: Path,
        base_sha: str,
        info: BaseInfo,
        plan: Plan,
        *,
        name: str = "local",
        max_batch: int = 64,
        batch_wait: float = 0.003,
        max_wait: float = 0.05,
        max_loaded: int = 4,
    ) -> None:
        global _hooked
        self.ct2 = require()
        self.peft = None
        self._threads = None  # torch's; CTranslate2 takes plan.threads
        self.base_path, self.base_sha, self.plan = Path(base), base_sha, plan
        self.max_loaded = max(1, int(max_loaded))
        self._systems: dict[str | None, Path | None] = {}  # adapter name -> its file (None: the bare base)
        self._entries: dict[str | None, Path] = {}  # adapter name -> its converted model
        self._loaded: OrderedDict[str | None, Any] = OrderedDict()
        self.vocab = 0  # the model's vocabulary size, read from the first system loaded
        if plan.keep_heap:
            keep_heap()
        self._start(
            info.tokenizer, info.max_len, name=name, max_batch=max_batch, batch_wait=batch_wait, max_wait=max_wait
        )
        with _AT_EXIT:
            _LIVE.add(self)
            if not _hooked:
                atexit.register(_close_all)
                _hooked = True

    # -- systems

    def adapters(self) -> list[str]:
        return [k for k in self._systems if k is not None]

    def _convert(self, adapter: Path | None, name: str | None) -> Path:
        return converted(self.base_path, self.base_sha, adapter, name, self.plan.quantization)

    def add_base(self) -> None:
        """Convert (or find in the cache) the bare base, for requests without an adapter."""
        if None not in self._systems:
            entry = self._convert(None, None)
            with self._model_lock:
                self._entries[None], self._systems[None] = entry, None

    def add_adapter(self, name: str, adapter: Any) -> None:
        """Convert (or find in the cache) the base with the adapter file ``adapter`` merged, as
        ``name`` (the adapter's sha256: the cache key); a no-op when ``name`` is loaded already."""
        if name in self._systems:
            return
        if not isinstance(adapter, (str, Path)):
            raise TypeError("CT2Server.add_adapter takes the adapter's file (it converts base + adapter from files)")
        entry = self._convert(Path(adapter), name)
        with self._model_lock:
            self._entries[name], self._systems[name] = entry, Path(adapter)

    def remove_adapter(self, name: str) -> None:
        with self._model_lock:
            self._systems.pop(name, None)
            self._entries.pop(name, None)
            self._loaded.pop(name, None)

    def generator(self, name: str | None) -> Any:
        """The loaded ``ctranslate2.Generator`` of a system (loaded now if it is not; its cache
        entry checked first and converted again if it went bad)."""
        with self._model_lock:
            g = self._loaded.get(name)
            if g is not None:
                self._loaded.move_to_end(name)
                return g
            if name not in self._systems:
                if name is not None:
                    raise LLMError(f"local model {self.name!r}: adapter {name!r} is not loaded")
                self.add_base()
            entry = self._entries[name] = self._convert(self._systems[name], name)
            p = self.plan
            g = self.ct2.Generator(
                str(entry),
                device=p.device,
                device_index=p.device_index,
                compute_type=p.compute_type,
                intra_threads=p.threads,
                inter_threads=p.parallel,
            )
            self._loaded[name] = g
            if not self.vocab:  # every system of a base has its vocabulary
                self.vocab = len(json.loads((entry / "vocabulary.json").read_text()))
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
            return g

    # -- generation and scoring

    def _serve(self, batch: list[Any]) -> None:
        """One batch to its end (CTranslate2 generates whole batches)."""
        t0 = time.perf_counter()
        try:
            with self._model_lock:
                results = self._generate(batch)
        except BaseException as e:  # noqa: BLE001 - the worker must survive: fail this batch, keep serving
            err = self._failure(e)
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(err)
            return
        self.stats["batches"] += 1
        self.stats["requests"] += len(batch)
        self.stats["tokens"] += sum(len(s.token_ids) for s in results)
        self.stats["busy_s"] += time.perf_counter() - t0
        for r, s in zip(batch, results):
            if not r.future.done():
                r.future.set_result(s)

    def _generate(self, batch: list[Any]) -> list[Sample]:
        eos = list(getattr(self.tok, "eos_ids", (self.tok.eos_id,)))
        g = self.generator(batch[0].adapter)
        return generate(g, batch, eos, self.tok.token_text, parallel=self.plan.parallel, vocab=self.vocab)

    def score(self, sequences: Sequence[Sequence[int]], adapter: str | None = None) -> list[list[float]]:
        """``log P(ids[k] | ids[:k])`` for ``k >= 1`` of each sequence (untempered; CTranslate2's
        ``score_batch``), with the system of ``adapter``."""
        with self._model_lock:
            out = self.generator(adapter).score_batch([[token(i) for i in s] for s in sequences], max_input_length=0)
        return [list(r.log_probs) for r in out]

    def close(self) -> None:
        super().close()
        with self._model_lock:
            self._loaded.clear()


# the most logits (float32 bytes: rows x steps x vocabulary) one call that returns log-probs at a
# temperature other than 0 and 1 may hold: 1 GiB is 21 rows of 256 steps over SmolLM2's 49,152 ids
LOGITS_BYTES = 1 << 30
DRAWN_CHUNK = 64  # steps drawn_log_probs reads at once


def drawn_log_probs(
    steps: Sequence[Any], ids: Sequence[int], temperature: float, top: int = 0
) -> tuple[list[float], list[list[tuple[int, float]]] | None]:
    """``log_softmax(logits / T)[ids[k]]`` in float32 for the last ``len(ids)`` of a row's step
    logits (CTranslate2's ``return_logits_vocab``: one vector a step, untempered, in the compute
    type's float on the generator's device; the first ones are the steps that forwarded this row's
    prompt beyond its call's shortest), and with ``top`` > 0 each step's ``top`` likeliest ids
    and their log-probs, likeliest first (else None). ``temperature`` 0 reads them untempered."""
    import ctranslate2
    import numpy as np
    import torch

    if len(steps) < len(ids):
        raise RuntimeError(f"CTranslate2 returned {len(steps)} steps' logits for {len(ids)} tokens")

    def host(s: Any) -> Any:
        if s.dtype != ctranslate2.DataType.float32:  # float16 / bfloat16 (CUDA): numpy reads no bfloat16
            s = s.to(ctranslate2.DataType.float32)
        return np.asarray(s if s.device == "cpu" else s.to_device(ctranslate2.Device.cpu))

    lps: list[float] = []
    tops: list[list[tuple[int, float]]] = []
    mine = steps[len(steps) - len(ids) :]
    for at in range(0, len(ids), DRAWN_CHUNK):  # a chunk of steps at a time: its copies stay small
        z = torch.from_numpy(np.stack([host(s) for s in mine[at : at + DRAWN_CHUNK]]))
        if temperature > 0 and temperature != 1.0:
            z.div_(temperature)
        lse = torch.logsumexp(z, 1)
        chunk = torch.tensor(list(ids[at : at + DRAWN_CHUNK]))
        lps += (z.gather(1, chunk[:, None])[:, 0] - lse).tolist()
        if top > 0:
            v, i = z.topk(min(top, z.shape[1]), dim=1)
            tops += [list(zip(a, b)) for a, b in zip(i.tolist(), (v - lse[:, None]).tolist())]
    return lps, (tops if top > 0 else None)


def generate(
    generator: Any,
    batch: Sequence[Any],
    eos: Sequence[int],
    decode: Callable[[int], str],
    *,
    parallel: int = 1,
    vocab: int = 0,
) -> list[Sample]:
    """One :class:`Sample` per request (``.prompt``, ``.temperature``, ``.max_tokens``, ``.stop``, ``.logprobs``;
    see the module docstring): one ``generate_batch`` per temperature and run of similar prompt
    lengths (:func:`length_groups`), split into ``parallel`` parts that run at once (the
    generator's ``inter_threads``); per-row ``max_tokens`` and stop strings in the callback (called
    from each part's thread: each row's lists are its own). ``vocab``: the model's vocabulary size,
    for the :data:`LOGITS_BYTES` bound of a call that returns its logits (0: unbounded)."""
    results: list[Sample | None] = [None] * len(batch)
    groups: dict[float, list[int]] = {}
    for i, r in enumerate(batch):
        if r.max_tokens <= 0:
            results[i] = Sample([], [], "length")
        else:
            groups.setdefault(r.temperature, []).append(i)
    for temperature, rows in groups.items():
        for part in length_groups([len(batch[i].prompt) for i in rows], [batch[i].max_tokens for i in rows]):
            run = [rows[k] for k in part]
            logits = any(reads_logits(batch[i], temperature) for i in run)
            for call in logit_calls([batch[i] for i in run], vocab) if logits and vocab else [range(len(run))]:
                _group(generator, batch, [run[k] for k in call], temperature, set(eos), decode, results, parallel)
    return [s if s is not None else Sample([], [], "length") for s in results]


# A decoding step's fixed cost in rows' worth of work (SmolLM2-135M in int8 on 2 CPU cores: about
# 11 ms a step plus 3 ms a row), for the split below.
STEP_ROWS = 4


def length_groups(lengths: Sequence[int], max_tokens: Sequence[int]) -> list[list[int]]:
    """The rows (indices) split into runs of similar prompt length. CTranslate2 forwards a batch's
    prompts at once only up to the shortest one; every token a longer prompt has beyond that costs
    one decoding step of the whole batch. Of the splits of the rows sorted by length into runs, the
    one that minimises the sum over runs of (length spread + max_tokens) x (STEP_ROWS + rows)."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    n = len(order)
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        longest = 0
        for i in range(j - 1, -1, -1):  # the run order[i:j]
            longest = max(longest, max_tokens[order[i]])
            cost = best[i] + (lengths[order[j - 1]] - lengths[order[i]] + longest) * (STEP_ROWS + j - i)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], n
    while j > 0:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]


def reads_logits(request: Any, temperature: float) -> bool:
    """Whether a request's row needs its call to return the step logits: log-probs at a temperature
    other than 0 and 1 (CTranslate2's own are untempered), or ``top_logprobs`` at any."""
    return bool(temperature > 0 and temperature != 1.0 and request.logprobs) or getattr(request, "top_logprobs", 0) > 0


def logit_calls(requests: Sequence[Any], vocab: int) -> list[range]:
    """A run of requests (sorted by prompt length) cut into consecutive calls whose logits stay
    within :data:`LOGITS_BYTES`: a row holds one float32 vector of ``vocab`` a step, for its
    tokens and for its prompt's tokens beyond the call's shortest prompt (one row a call at least)."""
    calls, start = [], 0
    while start < len(requests):
        end, shortest, longest = start + 1, len(requests[start].prompt), requests[start].max_tokens
        while end < len(requests):
            longest = max(longest, requests[end].max_tokens)
            if (end + 1 - start) * (len(requests[end].prompt) - shortest + longest) * vocab * 4 > LOGITS_BYTES:
                break
            end += 1
        calls.append(range(start, end))
        start = end
    return calls


def _group(
    generator: Any,
    batch: Sequence[Any],
    rows: list[int],
    temperature: float,
    eos: set[int],
    decode: Callable[[int], str],
    results: list[Sample | None],
    parallel: int = 1,
) -> None:
    ids: list[list[int]] = [[] for _ in rows]
    lps: list[list[float]] = [[] for _ in rows]
    texts = [""] * len(rows)
    errors: list[BaseException] = []
    tempered = temperature > 0 and temperature != 1.0  # CTranslate2's log_prob is untempered
    read = {j for j, i in enumerate(rows) if reads_logits(batch[i], temperature)}

    def step(s: Any) -> bool:
        j = s.batch_id
        i = rows[j]
        if results[i] is not None:
            return True
        try:
            r, tk = batch[i], int(s.token_id)
            lp = float(s.log_prob)  # untempered; replaced after the batch when tempered
            ids[j].append(tk)
            lps[j].append(lp)
            if tk in eos:
                results[i] = Sample(ids[j], lps[j], "stop")
            elif r.stop:
                piece = decode(tk)
                texts[j] += piece
                hit = next((x for x in r.stop if x in texts[j][-(len(x) + len(piece)) :]), None)
                if hit is not None:
                    results[i] = Sample(ids[j], lps[j], "stop", stop=hit)
            if results[i] is None and len(ids[j]) >= r.max_tokens:
                results[i] = Sample(ids[j], lps[j], "length")
        except BaseException as e:  # noqa: BLE001 - an exception must not cross into CTranslate2's thread
            errors.append(e)
            results[i] = Sample(ids[j], lps[j], "length")
        return results[i] is not None

    out = generator.generate_batch(
        [[token(t) for t in batch[i].prompt] for i in rows],
        max_length=max(batch[i].max_tokens for i in rows),
        include_prompt_in_result=False,
        sampling_topk=1 if temperature <= 0 else 0,
        sampling_temperature=temperature if temperature > 0 else 1.0,
        end_token=sorted(eos),
        return_end_token=True,
        return_scores=True,
        return_logits_vocab=bool(read),
        max_batch_size=-(-len(rows) // parallel) if parallel > 1 and len(rows) > 1 else 0,
        callback=step,
    )
    if errors:
        raise errors[0]
    for j, i in enumerate(rows):
        if results[i] is None:
            results[i] = Sample(ids[j], lps[j], "length")
    for j, i in enumerate(rows):
        done = results[i]
        assert done is not None  # filled just above
        if j in read:  # its logits are here: log-probs and top ones from the same float32 softmax
            done.logprobs, done.top_logprobs = drawn_log_probs(
                out[j].logits[0], ids[j], temperature, getattr(batch[i], "top_logprobs", 0)
            )
        elif tempered:
            done.logprobs = None  # not asked for: the untempered ones are not what a completion's log-probs mean


# ----------------------------------------------------------------------------- the choice of engine

_REFUSED: dict[tuple, str] = {}  # (base, adapter, device and type params) -> why torch samples it (engine: auto)
_SAID: set[str] = set()  # the fallback lines printed (each once)


def open_server(spec: Any, artifacts: Any, servers: dict[str, LocalServer]) -> tuple[str, CT2Server] | None:
    """``(key, server)``: the shared CT2Server of ``spec``'s base (made, or found in ``servers``)
    with ``spec``'s adapter converted. With ``engine: auto``, None when CTranslate2 cannot run it
    (one line on stderr says why, once; a model that did not convert is not tried again); with
    ``engine: ctranslate2``, a ConfigError (or MissingDependency) saying why. Called under the backend's servers lock."""
    params = dict(spec.params)
    asked = engine_of(params, spec.name) == "ctranslate2"
    which = (
        spec.base.sha256,
        spec.adapter.sha256 if spec.adapter is not None else None,
        str(params.get("device")),
        str(params.get("compute_type")),
    )
    if not asked and which in _REFUSED:
        return None
    try:
        return _open(spec, params, artifacts, servers)
    except MissingDependency:
        if asked:
            raise
        why = f"ctranslate2 is not installed ({INSTALL})"
    except NotConvertible as e:
        if asked:
            raise refusal(spec, e) from None
        why = _REFUSED[which] = str(e)
    line = f"model {spec.name!r} samples with torch, not CTranslate2 (engine: auto): {why}"
    if line not in _SAID:
        _SAID.add(line)
        say(line)
    return None


def refusal(spec: Any, why: NotConvertible) -> ConfigError:
    return ConfigError(
        f"model {spec.name!r}: params.engine is ctranslate2, but {why}; use engine: torch "
        "(or auto, which falls back to torch)"
    )


def preflight(spec: Any, artifacts: Any) -> None:
    """Convert a starting system that asks for ``engine: ctranslate2`` (into the cache, where its
    first rollout finds it), so that a model CTranslate2 cannot run is refused before the run
    starts, with the reason, rather than failing its rollouts."""
    params = dict(spec.params)
    if engine_of(params, spec.name) != "ctranslate2" or spec.base is None:
        return
    try:
        base = Path(artifacts.path(spec.base))
        p = make_plan(params, tiny=describe(base).tiny)
        adapter = Path(artifacts.path(spec.adapter)) if spec.adapter is not None else None
        converted(base, spec.base.sha256, adapter, spec.adapter.sha256 if adapter else None, p.quantization)
    except NotConvertible as e:
        raise refusal(spec, e) from None


def _open(spec: Any, params: dict, artifacts: Any, servers: dict[str, LocalServer]) -> tuple[str, CT2Server]:
    base = Path(artifacts.path(spec.base))
    info = describe(base)
    p = make_plan(params, tiny=info.tiny)
    key = f"{spec.base.sha256}|ctranslate2|{p.key}"
    server = servers.get(key)
    fresh = server is None or server.closed or server.refs <= 0
    if fresh:
        server = CT2Server(
            base,
            spec.base.sha256,
            info,
            p,
            name=spec.name,
            max_batch=int(params.get("max_batch", 64)),
            batch_wait=float(params.get("batch_wait_ms", 3)) / 1000.0,
            max_wait=float(params.get("max_wait_ms", 50)) / 1000.0,
        )
    assert isinstance(server, CT2Server)
    try:
        if spec.adapter is None:
            server.add_base()
        else:
            server.add_adapter(spec.adapter.sha256, artifacts.path(spec.adapter))
    except BaseException:
        if fresh:
            server.close()
        raise
    servers[key] = server
    return key, server


__all__ = ["STEP_ROWS", "CT2Server", "generate", "length_groups", "open_server", "preflight", "refusal", "token"]
