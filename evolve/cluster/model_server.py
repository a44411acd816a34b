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

With ``servers: per_role``, each model role has a server actor of its own instead (one per role,
whatever its base), so that the roles of a team can sit on different machines: ``roles`` gives a
role its own actor resources (the keys it names replace the shared ones), e.g. a custom resource
that only one node has::

    runner:
      name: ray
      params:
        model_server:
          servers: per_role        # default per_base: one server per base, shared by the roles on it
          num_cpus: 1              # every role's server...
          roles:                   # ...but these keys, for these roles
            solver: {num_gpus: 1, resources: {big_gpu: 1}}
            verifier: {resources: {small_node: 1}}

A rollout actor then routes each role's calls to its role's server (:class:`evolve.runners.ray_runner.RoleWorker`); each
server loads the base it serves, so two roles on one base hold it twice (once per server). A
role listed under ``roles`` must be a role of the run's systems, and a server's resources must
fit one node of the cluster: both are refused before any rollout starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.errors import ConfigError, UserError

PREFIX = "evolvekit-model-"
SERVER_KEYS = ("num_cpus", "num_gpus", "resources", "max_concurrency")
MODEL_SERVER_KEYS = (*SERVER_KEYS, "servers", "roles")
SERVERS = ("per_base", "per_role")
PATH = "runner.params.model_server"


def check_model_server(ms: dict[str, Any]) -> None:
    """Refuse a ``runner.params.model_server`` the servers cannot honour, before the run starts."""
    unknown = sorted(set(ms) - set(MODEL_SERVER_KEYS))
    if unknown:
        raise ConfigError(
            f"takes no key {', '.join(map(repr, unknown))}; it takes {', '.join(MODEL_SERVER_KEYS)}", path=PATH
        )
    servers = ms.get("servers", "per_base")
    if servers not in SERVERS:
        raise ConfigError(f"must be one of {list(SERVERS)}, got {servers!r}", path=f"{PATH}.servers")
    _check_resources(ms, PATH)
    roles = ms.get("roles")
    if roles is None:
        return
    if not isinstance(roles, dict):
        raise ConfigError(f"must be a mapping of role names to server settings, got {roles!r}", path=f"{PATH}.roles")
    if servers != "per_role":
        raise ConfigError(
            "sets each role's own server: it needs servers: per_role (with per_base, the roles on "
            "a base share its server)",
            path=f"{PATH}.roles",
        )
    for role, entry in roles.items():
        where = f"{PATH}.roles.{role}"
        if not isinstance(entry, dict):
            raise ConfigError(
                f"must be a mapping of server settings ({', '.join(SERVER_KEYS)}), got {entry!r}", path=where
            )
        bad = sorted(set(entry) - set(SERVER_KEYS))
        if bad:
            raise ConfigError(
                f"takes no key {', '.join(map(repr, bad))}; a role's server takes {', '.join(SERVER_KEYS)}", path=where
            )
        _check_resources(entry, where)


def _check_resources(entry: dict[str, Any], where: str) -> None:
    res = entry.get("resources") or {}
    if not isinstance(res, dict):
        raise ConfigError(f"resources must be a mapping of resource names to amounts, got {res!r}", path=where)
    for name, v in (*((k, entry[k]) for k in ("num_cpus", "num_gpus") if k in entry), *res.items()):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"{name} must be a number >= 0, got {v!r}", path=where)
    c = entry.get("max_concurrency")
    if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 1):
        raise ConfigError(f"max_concurrency must be a whole number >= 1, got {c!r}", path=where)


def per_role(ms: dict[str, Any] | None) -> bool:
    """Whether ``model_server`` asks for one server per role (``servers: per_role``)."""
    return ms is not None and ms.get("servers") == "per_role"


def server_options(ms: dict[str, Any], role: str | None = None) -> dict[str, Any]:
    """The Ray actor options of a server: ``ms``'s, with ``role``'s own keys in their place."""
    o = {**{k: ms[k] for k in SERVER_KEYS if k in ms}, **((ms.get("roles") or {}).get(role) or {})}
    return {
        "num_cpus": float(o.get("num_cpus", 1)),
        "num_gpus": float(o.get("num_gpus", 0)),
        "resources": dict(o.get("resources") or {}),
        "max_concurrency": int(o.get("max_concurrency", 256)),
    }


def check_servers(ray: Any, ms: dict[str, Any], systems: Sequence[Any]) -> None:
    """Before a batch with per-role servers: every role named under ``roles`` is a role of the
    batch's systems, and every role server's resources fit one live node (else it would wait
    forever, and every rollout with it)."""
    if not per_role(ms):
        return
    have = sorted({r for s in systems for r in s.models})
    for role in ms.get("roles") or {}:
        if have and role not in have:
            raise ConfigError(f"unknown role {role!r}; the system's roles are {', '.join(have)}", path=f"{PATH}.roles")
    from evolve.cluster.ray_base import resources_text

    nodes = [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]
    local = sorted({r for s in systems for r, m in s.models.items() if m.backend == "local" and m.base is not None})
    for role in local:
        o = server_options(ms, role)
        asks = {"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]}
        if not any(all(res.get(k, 0) >= v for k, v in asks.items() if v) for res in nodes):
            biggest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
            raise UserError(
                f"{PATH}: the server of role {role!r} asks for {resources_text(asks)}, which no node of "
                f"the cluster has (the largest has {resources_text(biggest)}); lower it, or add a node "
                "that has it"
            )


class ModelServer:
    """The body of a server actor: an LLM cache over the run's artifacts (local backend)."""

    def __init__(self, artifacts_root: str, role: str | None = None) -> None:
        from evolve.artifacts import ArtifactStore
        from evolve.llm.cache import LLMCache

        self._cache = LLMCache(ArtifactStore(artifacts_root))
        self.role = role  # the role it serves (servers: per_role), else None: every role on its base
        self.calls = 0
        self.by_role: dict[str, int] = {}

    def complete(self, spec_json: str, messages: list[dict], kwargs: dict[str, Any], role: str | None = None) -> Any:
        from evolve.types import ModelSpec

        self.calls += 1
        if role is not None:
            self.by_role[role] = self.by_role.get(role, 0) + 1
        llm = self._cache.get(ModelSpec.model_validate_json(spec_json))
        return llm.complete(messages, **kwargs)

    def stats(self) -> dict[str, Any]:
        """Its calls (``by_role``: those whose caller named the role), process, node and models."""
        import os

        import ray

        return {
            "calls": self.calls,
            "pid": os.getpid(),
            "models": len(self._cache),
            "role": self.role,
            "by_role": dict(self.by_role),
            "ip": ray.util.get_node_ip_address(),
            "node": ray.get_runtime_context().get_node_id(),
        }

    def close(self) -> None:
        self._cache.close()


class RemoteLLM:
    """The LLM protocol, answered by a :class:`ModelServer` actor. A server that died is the world
    failing (an :class:`~evolve.errors.LLMError` of category ``server``: the rollout is retried, never
    scored), and the next call finds or starts a fresh server."""

    def __init__(self, find: Any, spec: Any, role: str | None = None) -> None:
        self._find, self.spec, self.role = find, spec, role
        self.server = find()
        self.name = spec.name
        self._json = spec.model_dump_json()

    def complete(
        self,
        messages: Sequence[Any],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        logprobs: bool = True,
        top_logprobs: int = 0,
    ) -> Any:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        from evolve.errors import LLMError

        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
        kw = {
            "temperature": temperature,
            "max_tokens": max_tokens,
            "stop": list(stop) if stop else None,
            "seed": seed,
            **({} if logprobs else {"logprobs": False}),  # the servers hold local models, which take them
            **({"top_logprobs": int(top_logprobs)} if top_logprobs else {}),
        }
        try:
            ref = (
                self.server.complete.remote(self._json, msgs, kw)
                if self.role is None
                else self.server.complete.remote(self._json, msgs, kw, self.role)
            )
            return ray.get(ref)
        except RayTaskError as e:  # the model itself raised: the backend's own error, as a local model's would
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else LLMError(str(e)[:500])) from None
        except RayActorError as e:
            self.server = self._find()
            whose = self.name if self.role is None else f"role {self.role!r}"
            raise LLMError(
                f"the model server of {whose} died: {' '.join(str(e).split())[:300]}", category="server"
            ) from None

    def close(self) -> None:  # the server outlives its callers
        pass


class RemoteCache:
    """What a rollout actor's :class:`~evolve.runners.base.Worker` builds LLMs with when model
    servers are on (its ``llms`` wrapper): local models through their base's server, the others as
    usual; with ``servers: per_role``, :meth:`for_role` gives a role's local model through the
    role's own server."""

    def __init__(self, inner: Any, artifacts_root: str, options: dict[str, Any], namespace: str) -> None:
        self.inner, self.root, self.options, self.namespace = inner, artifacts_root, options, namespace
        self._remote: dict[str, RemoteLLM] = {}
        self._by_role: dict[tuple[str, str], RemoteLLM] = {}

    def _server(self, sha: str) -> Any:
        import ray

        cls = ray.remote(ModelServer)
        return cls.options(
            name=server_name(self.root, sha),
            namespace=self.namespace,
            get_if_exists=True,
            lifetime=None,
            **server_options(self.options),
        ).remote(self.root)

    def _role_server(self, role: str) -> Any:
        import ray

        cls = ray.remote(ModelServer)
        return cls.options(
            name=role_server_name(self.root, role),
            namespace=self.namespace,
            get_if_exists=True,
            lifetime=None,
            **server_options(self.options, role),
        ).remote(self.root, role)

    def for_role(self, role: str, spec: Any) -> RemoteLLM | None:
        """``role``'s local model answered by the role's own server (``servers: per_role``); None
        when the servers are per base or the model is not a local one with base weights."""
        if not per_role(self.options) or spec.backend != "local" or spec.base is None:
            return None
        key = (role, spec.model_dump_json())
        if key not in self._by_role:
            self._by_role[key] = RemoteLLM(lambda: self._role_server(role), spec, role)
        return self._by_role[key]

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
        self._by_role.clear()
        self.inner.close()

    def __len__(self) -> int:
        return len(self._remote) + len(self._by_role) + len(self.inner)


def server_name(artifacts_root: str, sha: str) -> str:
    """A run's server for a base: the run's artifact folder is part of the name, so two runs on one
    cluster never share (or kill) each other's servers."""
    import hashlib

    return f"{PREFIX}{hashlib.sha256(str(artifacts_root).encode()).hexdigest()[:10]}-{sha[:20]}"


def role_server_name(artifacts_root: str, role: str) -> str:
    """A run's server for a role (``servers: per_role``): under the run's prefix, as the base servers."""
    return f"{server_name(artifacts_root, '')}role-{role}"


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


__all__ = [
    "ModelServer",
    "RemoteCache",
    "RemoteLLM",
    "check_model_server",
    "check_servers",
    "kill_servers",
    "per_role",
    "role_server_name",
    "server_name",
    "server_options",
]
