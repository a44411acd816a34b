"""Model servers as Ray actors: with ``runner.params.model_server``, the ray runner's rollout actors
do not each load the local model. One server actor per base model (by its artifact's sha256; the
roles and systems that share a base share its server) holds the weights once, loads each LoRA
adapter once, and batches the requests of every rollout actor together (the local backend's
dynamic batching, see :mod:`evolve.policy.local`), on a GPU when it asks for one::

    runner:
      name: ray
      params: {model_server: {num_gpus: 1, num_cpus: 2, max_concurrency: 256}}

A rollout actor's ``ctx.llm(role)`` for a ``local`` model is then a :class:`RemoteLLM`: the same
``complete`` (token ids, log-probs, seeds and all), answered by the server. Other backends
(litellm: a hosted model, or the user's vLLM / any OpenAI-compatible server) are called from the
rollout actors directly, as in every runner. Servers are named actors of the runner's namespace,
found (or started) by the first rollout actor that needs one and killed when the runner closes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PREFIX = "evolvekit-model-"


class ModelServer:
    """The body of a server actor: an LLM cache over the run's artifacts (local backend)."""

    def __init__(self, artifacts_root: str) -> None:
        from evolve.artifacts import ArtifactStore
        from evolve.llm.cache import LLMCache

        self._cache = LLMCache(ArtifactStore(artifacts_root))
        self.calls = 0

    def complete(self, spec_json: str, messages: list[dict], kwargs: dict[str, Any]) -> Any:
        from evolve.types import ModelSpec

        self.calls += 1
        llm = self._cache.get(ModelSpec.model_validate_json(spec_json))
        return llm.complete(messages, **kwargs)

    def stats(self) -> dict[str, Any]:
        import os

        return {"calls": self.calls, "pid": os.getpid(), "models": len(self._cache)}

    def close(self) -> None:
        self._cache.close()


class RemoteLLM:
    """The LLM protocol, answered by a :class:`ModelServer` actor. A server that died is the world
    failing (an :class:`~evolve.errors.LLMError` of category ``server``: the rollout is retried, never
    scored), and the next call finds or starts a fresh server."""

    def __init__(self, find: Any, spec: Any) -> None:
        self._find, self.spec = find, spec
        self.server = find()
        self.name = spec.name
        self._json = spec.model_dump_json()

    def complete(self, messages: Sequence[Any], *, temperature: float | None = None, max_tokens: int | None = None,
                 stop: Sequence[str] | None = None, seed: int | None = None, logprobs: bool = True,
                 top_logprobs: int = 0) -> Any:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        from evolve.errors import LLMError

        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
        kw = {"temperature": temperature, "max_tokens": max_tokens, "stop": list(stop) if stop else None, "seed": seed,
              **({} if logprobs else {"logprobs": False}),  # the servers hold local models, which take them
              **({"top_logprobs": int(top_logprobs)} if top_logprobs else {})}
        try:
            return ray.get(self.server.complete.remote(self._json, msgs, kw))
        except RayTaskError as e:  # the model itself raised: the backend's own error, as a local model's would
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else LLMError(str(e)[:500])) from None
        except RayActorError as e:
            self.server = self._find()
            raise LLMError(f"the model server of {self.name!r} died: {' '.join(str(e).split())[:300]}",
                           category="server") from None

    def close(self) -> None:  # the server outlives its callers
        pass


class RemoteCache:
    """What a rollout actor's :class:`~evolve.runners.base.Worker` builds LLMs with when model
    servers are on (its ``llms`` wrapper): local models through their base's server, the others as
    usual."""

    def __init__(self, inner: Any, artifacts_root: str, options: dict[str, Any], namespace: str) -> None:
        self.inner, self.root, self.options, self.namespace = inner, artifacts_root, options, namespace
        self._remote: dict[str, RemoteLLM] = {}

    def _server(self, sha: str) -> Any:
        import ray

        opts = {"num_cpus": float(self.options.get("num_cpus", 1)), "num_gpus": float(self.options.get("num_gpus", 0)),
                "resources": dict(self.options.get("resources") or {}),
                "max_concurrency": int(self.options.get("max_concurrency", 256))}
        cls = ray.remote(ModelServer)
        return cls.options(name=server_name(self.root, sha), namespace=self.namespace, get_if_exists=True,
                           lifetime=None, **opts).remote(self.root)

    def peek(self, spec: Any) -> Any:
        if spec.backend == "local":
            return self._remote.get(spec.model_dump_json())
        return self.inner.peek(spec)

    def get(self, spec: Any) -> Any:
        if spec.backend != "local" or spec.base is None:
            return self.inner.get(spec)
        key = spec.model_dump_json()
        if key not in self._remote:
            sha = spec.base.sha256
            self._remote[key] = RemoteLLM(lambda: self._server(sha), spec)
        return self._remote[key]

    def close(self) -> None:
        self._remote.clear()
        self.inner.close()

    def __len__(self) -> int:
        return len(self._remote) + len(self.inner)


def server_name(artifacts_root: str, sha: str) -> str:
    """A run's server for a base: the run's artifact folder is part of the name, so two runs on one
    cluster never share (or kill) each other's servers."""
    import hashlib

    return f"{PREFIX}{hashlib.sha256(str(artifacts_root).encode()).hexdigest()[:10]}-{sha[:20]}"


def kill_servers(namespace: str, artifacts_root: str) -> int:
    """Kill this run's model servers (named actors of ``namespace``); how many."""
    import ray
    from ray.util import list_named_actors

    mine = server_name(artifacts_root, "")
    n = 0
    for entry in list_named_actors(all_namespaces=True):
        name = entry["name"] if isinstance(entry, dict) else entry
        ns = entry.get("namespace") if isinstance(entry, dict) else namespace
        if ns == namespace and str(name).startswith(mine):
            try:
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
                n += 1
            except Exception:  # noqa: BLE001 - already gone
                pass
    return n


__all__ = ["ModelServer", "RemoteCache", "RemoteLLM", "kill_servers", "server_name"]
