"""The gateway's config file (``gateway.yaml``), or the same thing built from command-line flags.

.. code-block:: yaml

    host: 127.0.0.1          # beyond loopback, an API key is required (api_key_env)
    port: 4000
    store: traces            # the trace store's folder
    api_key_env: null        # the variable holding the key agents must send
    allow_origins: []        # web pages allowed to call it from a browser (none by default)
    otel: null               # {endpoint: http://127.0.0.1:4317}: each call as an OpenTelemetry gen_ai span
    routes:
      - name: default
        match: ["*"]         # model names (or globs) this route answers, first match wins
        upstream:
          model: openai/*    # a litellm model; '*' is the name the agent asked for
          api_base: http://127.0.0.1:8000/v1
          api_key_env: null  # the upstream's key, read at each call, never recorded
          timeout: 120       # seconds for the whole answer, retries included (then 504)
          max_retries: 2     # at most 1 + max_retries requests; only transient failures are retried
          params: {}         # defaults for every request (the agent's own params win)
        system: null         # the label recorded as the system that answered
      - name: mine
        match: ["sql-agent"]
        local: {run: runs/sql, role: policy}   # a run's current system's local model (followed)
      - name: team           # no match: the model names below (a name the agent sends -> a role)
        local: {run: runs/team, roles: {writer-model: writer, reviewer-model: reviewer}}  # or [writer, reviewer], all
      - name: support
        match: ["gpt-4o*"]
        upstream: {model: "openai/*"}
        evolve:                               # a run's evolved prompts, applied to each request
          run: runs/support
          apply: [{component: policy.instruction, how: block, message: system}]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evolve.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UpstreamConfig(_Strict):
    model: str = Field(
        description="a litellm model name (openai/gpt-4o-mini, hosted_vllm/..., anthropic/...); "
        "'*' stands for the model the agent asked for"
    )
    api_base: str | None = Field(
        None, description="the upstream's base URL (a vLLM, Ollama or other OpenAI-compatible server)"
    )
    api_key_env: str | None = Field(None, description="the environment variable holding the upstream's key")
    timeout: float = Field(
        120.0,
        gt=0,
        description="seconds the gateway waits for the upstream's answer (a stream: "
        "its start), retries included; then the agent gets a 504",
    )
    max_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="retries of a transient upstream failure (429, 5xx, "
        "a connection error): at most 1 + max_retries requests; "
        "a refusal (400, 401, 403, 404, 422) is never retried",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="default request params")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a litellm model, e.g. openai/gpt-4o-mini")
        return v


class LocalConfig(_Strict):
    run: Path = Field(
        description="a run directory: its current system's model answers (followed as the archive "
        "promotes or rolls back)"
    )
    role: str = Field("policy", description="the system's model role to serve")
    roles: dict[str, str] | list[str] | Literal["all"] | None = Field(
        None,
        description=(
            "serve several roles of the system (a team: one adapter per role on one base), each under its own model "
            "name: a list of roles or 'all' (each answers to its role's name), or {model name: role}; calls are "
            "recorded under the role that answered"
        ),
    )
    system: str | None = Field(None, description="pin a system (id prefix, best, baseline) instead of following")
    poll: float = Field(1.0, gt=0, description="seconds between checks of the archive's current pointer")

    @field_validator("roles")
    @classmethod
    def _roles(cls, v: dict[str, str] | list[str] | str | None) -> dict[str, str] | list[str] | str | None:
        if isinstance(v, list):
            if not v:
                raise ValueError("roles is empty: give a list of roles, 'all', or {model name: role}")
            dup = sorted({r for r in v if v.count(r) > 1})
            if dup:
                raise ValueError(f"roles lists {', '.join(map(repr, dup))} more than once")
        if isinstance(v, dict) and not v:
            raise ValueError("roles is empty: give {model name: role}, a list of roles, or 'all'")
        return v

    @model_validator(mode="after")
    def _one_spelling(self) -> LocalConfig:
        if self.roles is not None and "role" in self.model_fields_set:
            raise ValueError("give 'role' (one role) or 'roles' (several, each under its own model name), not both")
        return self


class RuleConfig(_Strict):
    component: str = Field(description="a key of the system's prompts, e.g. policy.instruction")
    how: Literal["block", "prepend", "append", "replace", "demos"] = Field(
        "block",
        description="block: replace {{evolve:<component>}} in the message; or prepend, append, replace; "
        "demos: the component's few-shot demos as message pairs before the last user message",
    )
    message: Literal["system", "last_user"] = Field("system", description="the message it goes into")


class RecallConfig(_Strict):
    message: Literal["system", "last_user"] = Field("system", description="the message the memories go into")
    how: Literal["prepend", "append"] = "append"
    header: str = "Relevant past experience:"
    format: str = Field("- {text}", description="one line per item: {text} and the item's metadata keys")


class ToolsConfig(_Strict):
    serve: list[str] | Literal["all"] = Field("all", description="which of the system's admitted tools are offered")
    max_rounds: int = Field(
        4, ge=1, le=32, description="model calls per request at most; the last offers none of the served tools"
    )
    read_roots: list[Path] = Field(
        default_factory=list,
        description="folders a tool's file parameters may point "
        "into (mounted read-only in the sandbox); none: tools that read files are refused",
    )
    sandbox: Literal["process", "docker"] = "process"
    limits: dict[str, Any] = Field(default_factory=dict, description="sandbox limits per tool call")


class EvolveConfig(_Strict):
    run: Path = Field(
        description="the run whose current system's prompts apply (followed as the archive promotes or rolls back)"
    )
    system: str | None = Field(None, description="pin a system (id prefix, best, baseline) instead of following")
    poll: float = Field(1.0, gt=0, description="seconds between checks of the archive's current pointer")
    apply: list[RuleConfig] = Field(default_factory=list, description="which prompt components go where")
    recall: RecallConfig | None = Field(
        None, description="insert what the system's memory recalls for the last user message"
    )
    tools: ToolsConfig | None = Field(
        None, description="serve the system's admitted tools, run by the gateway in the sandbox"
    )

    @model_validator(mode="after")
    def _something(self) -> EvolveConfig:
        if not self.apply and self.recall is None and self.tools is None:
            raise ValueError(
                "give 'apply' rules, 'recall', 'tools', or some of them: what of the evolved system goes into requests"
            )
        return self


class RouteConfig(_Strict):
    name: str = "default"
    match: list[str] | None = Field(
        None,
        min_length=1,
        description=(
            "model names or globs this route answers; unset: every name ('*'), or on a local route with 'roles' the "
            "roles' model names"
        ),
    )
    upstream: UpstreamConfig | None = Field(None, description="a model through litellm")
    local: LocalConfig | None = Field(None, description="the project's local model, from a run's archive")
    system: str | None = Field(None, description="the label recorded as the system that answered (upstream routes)")
    evolve: EvolveConfig | None = Field(None, description="apply a run's evolved prompt components to each request")
    sticky: bool = Field(
        True,
        description="a session stays with the system that answered its first call (routes "
        "that follow a run); false: every call goes to the current system",
    )

    @model_validator(mode="after")
    def _one(self) -> RouteConfig:
        if self.match is None and (self.local is None or self.local.roles is None):
            object.__setattr__(self, "match", ["*"])  # the default: every model name
        if (self.upstream is None) == (self.local is None):
            raise ValueError(
                f"route {self.name!r} needs exactly one of 'upstream' (a model through litellm) or "
                "'local' (a run's local model)"
            )
        if self.evolve is not None and self.system is not None:
            raise ValueError(
                f"route {self.name!r}: 'system' labels an upstream route that follows no run; with "
                "'evolve' the run's current system id is recorded"
            )
        return self


class OtelConfig(_Strict):
    endpoint: str = Field(description="the OTLP/gRPC collector, e.g. http://127.0.0.1:4317")
    capture_content: bool = Field(False, description="also send messages and answers (gen_ai.input/output.messages)")
    service: str = Field("evolve-gateway", description="service.name of the spans")


class GatewayConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(4000, ge=0, le=65535)
    store: Path = Path("traces")
    api_key_env: str | None = Field(
        None, description="the variable holding the key agents must send (required beyond loopback)"
    )
    routes: list[RouteConfig] = Field(min_length=1)
    otel: OtelConfig | None = Field(None, description="export each call as an OpenTelemetry gen_ai span")
    allow_origins: list[str] = Field(
        default_factory=list,
        description="web origins (scheme://host:port) allowed to call the gateway from a browser; none by default",
    )

    @field_validator("routes")
    @classmethod
    def _unique(cls, v: list[RouteConfig]) -> list[RouteConfig]:
        names = [r.name for r in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"route names must be unique; repeated: {dup}")
        return v

    def api_key(self) -> str | None:
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"the environment variable {self.api_key_env!r} (api_key_env) is not set; export the "
                "key agents must send, or remove api_key_env on loopback"
            )
        if not key.strip():
            raise ConfigError(
                f"the environment variable {self.api_key_env!r} (api_key_env) holds only whitespace; "
                "export the key agents must send, or remove api_key_env on loopback"
            )
        return key

    def check_upstream_keys(self) -> None:
        for r in self.routes:
            env = r.upstream.api_key_env if r.upstream is not None else None
            if env and not os.environ.get(env):
                raise ConfigError(
                    f"route {r.name!r}: the environment variable {env!r} (upstream.api_key_env) is not "
                    "set; export the upstream's key"
                )


def load_config(path: str | Path) -> GatewayConfig:
    """Read and check a gateway.yaml; a ConfigError naming what is wrong. ``store`` is taken
    relative to the file's folder."""
    from evolve.task.taskfile import format_validation_error, read_task_file

    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"no gateway config file {str(p)!r}; write one (see docs/gateway.md), or start with "
            "evolve gateway --upstream MODEL"
        )
    data = read_task_file(p)
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(p), GatewayConfig)) from None
    data = cfg.model_dump()
    if not cfg.store.is_absolute():
        data["store"] = p.parent / cfg.store
    for r in data["routes"]:
        for key in ("local", "evolve"):
            if r[key] is not None and not Path(r[key]["run"]).is_absolute():
                r[key]["run"] = p.parent / r[key]["run"]
        tools = (r["evolve"] or {}).get("tools")
        if tools:
            tools["read_roots"] = [x if Path(x).is_absolute() else p.parent / x for x in tools["read_roots"]]
    return GatewayConfig.model_validate(data)


def from_flags(
    *,
    upstream: str | None = None,
    api_base: str | None = None,
    upstream_key_env: str | None = None,
    local: Path | None = None,
    role: str = "policy",
    roles: list[str] | str | None = None,
    store: Path = Path("traces"),
    host: str = "127.0.0.1",
    port: int = 4000,
    api_key_env: str | None = None,
    match: list[str] | None = None,
) -> GatewayConfig:
    """One route for every model: ``upstream`` (a litellm model) or ``local`` (a run directory: its
    ``role``, or ``roles``, each under its own name)."""
    try:
        names = {"match": match or ["*"]} if match or local is None or roles is None else {}  # roles: their names
        route = RouteConfig(
            **names,
            upstream=None
            if upstream is None
            else UpstreamConfig(model=upstream, api_base=api_base, api_key_env=upstream_key_env),
            local=None
            if local is None
            else (LocalConfig(run=local, role=role) if roles is None else LocalConfig(run=local, roles=roles)),
        )
        return GatewayConfig(host=host, port=port, store=store, api_key_env=api_key_env, routes=[route])
    except ValidationError as e:
        raise ConfigError(format_flags_error(e)) from None


def format_flags_error(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())


__all__ = [
    "EvolveConfig",
    "GatewayConfig",
    "LocalConfig",
    "OtelConfig",
    "RuleConfig",
    "RouteConfig",
    "UpstreamConfig",
    "from_flags",
    "load_config",
]
