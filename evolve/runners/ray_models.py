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

from typing import Any, Sequence

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
    """The LLM protocol, answered by a :class:`ModelServer` actor."""

    def __init__(self, server: Any, spec: Any) -> None:
        self.server, self.spec = server, spec
        self.name = spec.name
        self._json = spec.model_dump_json()

    def complete(self, messages: Sequence[Any], *, temperature: float | None = None, max_tokens: int | None = None,
                 stop: Sequence[str] | None = None, seed: int | None = None) -> Any:
        import ray

        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
        kw = {"temperature": temperature, "max_tokens": max_tokens, "stop": list(stop) if stop else None, "seed": seed}
        return ray.get(self.server.complete.remote(self._json, msgs, kw))

    def close(self) -> None:  # the server outlives its callers
        pass


class RemoteCache:
    """What a rollout actor's :class:`~evolve.runners.base.Worker` builds LLMs with when model
    servers are on: local models through their base's server, the others as usual."""

    def __init__(self, inner: Any, artifacts_root: str, options: dict[str, Any], namespace: str) -> None:
        self.inner, self.root, self.options, self.namespace = inner, artifacts_root, options, namespace
        self._remote: dict[str, RemoteLLM] = {}

    def _server(self, sha: str) -> Any:
        import ray

        opts = {"num_cpus": float(self.options.get("num_cpus", 1)), "num_gpus": float(self.options.get("num_gpus", 0)),
                "resources": dict(self.options.get("resources") or {}),
                "max_concurrency": int(self.options.get("max_concurrency", 256))}
        cls = ray.remote(ModelServer)
        return cls.options(name=PREFIX + sha[:24], namespace=self.namespace, get_if_exists=True, lifetime=None,
                           **opts).remote(self.root)

    def peek(self, spec: Any) -> Any:
        if spec.backend == "local":
            return self._remote.get(spec.model_dump_json())
        return self.inner.peek(spec)

    def get(self, spec: Any) -> Any:
        if spec.backend != "local" or spec.base is None:
            return self.inner.get(spec)
        key = spec.model_dump_json()
        if key not in self._remote:
            self._remote[key] = RemoteLLM(self._server(spec.base.sha256), spec)
        return self._remote[key]

    def close(self) -> None:
        self._remote.clear()
        self.inner.close()

    def __len__(self) -> int:
        return len(self._remote) + len(self.inner)


def kill_servers(namespace: str) -> int:
    """Kill the runner's model servers (named actors of ``namespace``); how many."""
    import ray
    from ray.util import list_named_actors

    n = 0
    for entry in list_named_actors(all_namespaces=True):
        name = entry["name"] if isinstance(entry, dict) else entry
        ns = entry.get("namespace") if isinstance(entry, dict) else namespace
        if ns == namespace and str(name).startswith(PREFIX):
            try:
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
                n += 1
            except Exception:  # noqa: BLE001 - already gone
                pass
    return n


__all__ = ["ModelServer", "RemoteCache", "RemoteLLM", "kill_servers"]
