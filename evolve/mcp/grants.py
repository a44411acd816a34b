"""What the person who started ``evolve mcp`` let a client's task reach: :class:`Grants`.

The server's environment holds that person's keys, and a client writes the task file. A model's
``params.api_key_env`` names a variable whose value is sent as a bearer token to the model's
``params.api_base``; a Harbor task's ``${VAR}`` reads a variable into a container someone else's
code runs in. So over MCP a task may name only

* **keys** the server was started with (``--allow-key NAME``): a model's ``api_key_env`` anywhere in
  the task (its models, an operator's or a deploy suite's model), and ``dataset.params.allow_env``;
  a litellm model must name its key (``api_key_env``) or its server (``api_base``): without either,
  litellm would take the provider's key from the server's environment by itself;
* **hosts** the server was started with (``--allow-host HOST`` or ``HOST:PORT``): a model's
  ``api_base`` (or ``base_url``) anywhere in the task, which must be an ``http(s)://`` URL, and a
  tracker's server (``track.N.params``: MLflow's ``tracking_uri`` / ``registry_uri`` over http(s),
  W&B's ``base_url``, an OpenTelemetry ``endpoint``), to which the tracker's client sends the
  server's own credentials (``MLFLOW_TRACKING_TOKEN``, ``WANDB_API_KEY``,
  ``OTEL_EXPORTER_OTLP_HEADERS``);

and never ``dataset.params.build_network: host`` (a Harbor build on the machine's own network) or
``dataset.params.capabilities: docker``.
Each refusal is a :class:`~evolve.errors.ConfigError` naming the field and the setting that would
allow it. The server hands its grants to its children in ``$EVOLVE_MCP_GRANTS``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from evolve.errors import ConfigError

ENV = "EVOLVE_MCP_GRANTS"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:\d{1,5})?")
HOST_KEYS = ("api_base", "base_url")
TRACKER_HOSTS = ("tracking_uri", "registry_uri", "endpoint")  # http(s) URIs (an endpoint: also HOST:PORT)


@dataclass(frozen=True)
class Grants:
    """The variables (``keys``) and hosts (``hosts``: ``host`` or ``host:port``, lower case) a client's task may name."""

    keys: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def of(cls, keys: Iterable[str] = (), hosts: Iterable[str] = ()) -> Grants:
        """Grants from the command line's values; a ConfigError naming a malformed one."""
        keys, hosts = list(keys), [h.strip().lower() for h in hosts]
        for k in keys:
            if not _NAME.fullmatch(k):
                raise ConfigError(
                    f"evolve mcp: --allow-key {k!r} is not an environment variable name (e.g. OPENAI_API_KEY)"
                )
        for h in hosts:
            if not _HOST.fullmatch(h):
                raise ConfigError(
                    f"evolve mcp: --allow-host {h!r}: give a host name or address, optionally with its "
                    "port (api.openai.com, 127.0.0.1:8000), without a scheme or path"
                )
        return cls(frozenset(keys), frozenset(hosts))

    @classmethod
    def from_env(cls) -> Grants:
        """The grants in ``$EVOLVE_MCP_GRANTS`` (none when it is unset)."""
        data = json.loads(os.environ.get(ENV) or "{}")
        return cls(frozenset(data.get("keys", ())), frozenset(data.get("hosts", ())))

    def env(self) -> dict[str, str]:
        """What a child process needs in its environment to apply these grants."""
        return {ENV: json.dumps({"keys": sorted(self.keys), "hosts": sorted(self.hosts)})}

    def describe(self) -> str:
        keys = ", ".join(sorted(self.keys)) or "none"
        hosts = ", ".join(sorted(self.hosts)) or "none"
        return f"keys allowed: {keys}; hosts allowed: {hosts}"

    def host_allowed(self, url: str) -> bool:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        if ":" in host:
            host = f"[{host}]"
        return host in self.hosts or f"{host}:{port}" in self.hosts


def _walk(value: Any, path: str) -> Iterator[tuple[str, dict]]:
    """``(field, mapping)`` of every mapping in ``value``, depth first."""
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}.{i}" if path else str(i))


def check(data: dict, grants: Grants, source: str | None = None) -> None:
    """Refuse ``data`` (a task file's mapping, overrides applied) if it names a key or a host the
    server was not started with, or asks for the host network (see the module docstring)."""

    def fail(field: str, message: str) -> None:
        raise ConfigError(
            f"{message} ({grants.describe()}; docs/mcp.md, what a client can make the server do)",
            path=field,
            source=source,
        )

    for field, mapping in _walk(data, ""):
        where = f"{field}." if field else ""
        key_env = mapping.get("api_key_env")
        if key_env is not None and key_env not in grants.keys:
            fail(
                f"{where}api_key_env",
                f"{key_env!r} names a variable of the server's environment, whose value would "
                "be sent to the model's server; through evolve mcp a task may name only the keys the server was "
                f"started with: ask the user to restart it with --allow-key {key_env} if the task may use it",
            )
        for hk in HOST_KEYS:
            url = mapping.get(hk)
            if url is None:
                continue
            if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
                fail(f"{where}{hk}", f"{url!r} is not an http(s):// URL")
            if not grants.host_allowed(url):
                host = urlsplit(url).netloc.rsplit("@", 1)[-1].lower()
                fail(
                    f"{where}{hk}",
                    f"{url!r}: through evolve mcp a task's models may reach only the hosts the "
                    f"server was started with: ask the user to restart it with --allow-host {host} if the task may "
                    "send its requests (and any key) there",
                )
        if mapping.get("backend") == "litellm":
            given = mapping.get("params")
            params = given if isinstance(given, dict) else {}
            given = params.get("extra")
            extra = given if isinstance(given, dict) else {}
            if not any(params.get(k) or extra.get(k) for k in ("api_key_env", *HOST_KEYS)):
                fail(
                    f"{where}params.api_key_env",
                    f"the litellm model {mapping.get('name')!r} names neither its key "
                    "(api_key_env) nor its server (api_base), so litellm would take the provider's key from the "
                    "server's environment by itself; name the key with params.api_key_env (the server must be "
                    "started with --allow-key NAME)",
                )
    tracks = data.get("track")
    for i, t in enumerate(tracks if isinstance(tracks, list) else []):
        given = t.get("params") if isinstance(t, dict) else None
        tp = given if isinstance(given, dict) else {}
        for key in TRACKER_HOSTS:
            url = tp.get(key)
            if not isinstance(url, str):
                continue
            if key == "endpoint" and "://" not in url:
                url = "http://" + url  # an OTLP/gRPC HOST:PORT
            if urlsplit(url).scheme in ("http", "https") and not grants.host_allowed(url):
                fail(
                    f"track.{i}.params.{key}",
                    f"{tp[key]!r}: a tracker sends the server's own credentials to its "
                    "server; through evolve mcp it may reach only the hosts the server was started with: ask the "
                    f"user to restart it with --allow-host {urlsplit(url).netloc.rsplit('@', 1)[-1].lower()}",
                )
    params = ((data.get("dataset") or {}).get("params") or {}) if isinstance(data.get("dataset"), dict) else {}
    if not isinstance(params, dict):
        return
    if params.get("capabilities") == "docker":
        fail(
            "dataset.params.capabilities",
            "'docker' gives a Harbor task's containers Docker's default capabilities "
            "(raw sockets among them); only the user may choose it, never a client of evolve mcp",
        )
    if params.get("build_network") == "host":
        fail(
            "dataset.params.build_network",
            "'host' builds a Harbor task on this machine's own network, with its "
            "loopback services in reach; only the user may choose it (in their own task file or with evolve harbor "
            "check --build-network host), never a client of evolve mcp",
        )
    names = params.get("allow_env")
    for i, name in enumerate(names if isinstance(names, list) else []):
        if name not in grants.keys:
            fail(
                f"dataset.params.allow_env.{i}",
                f"{name!r} would hand a variable of the server's environment to a "
                "task's environment; through evolve mcp only the keys the server was started with may be: ask the "
                f"user to restart it with --allow-key {name} if the task may read it",
            )


__all__ = ["ENV", "Grants", "check"]
