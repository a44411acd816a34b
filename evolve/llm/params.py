"""Which ``params`` each model backend takes, checked when the task file loads (without importing
the backend: torch and litellm stay unloaded), and what must be true before a run starts.

An unknown key is refused with did-you-mean like every other field of the task file. A plugin
backend says which keys it takes by giving its factory an ``accepted_params`` attribute (a set
of names); without one its params are not checked here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError

# keys every backend takes: the rollout applies them as the role's defaults
GENERIC = frozenset({"temperature", "max_tokens"})

LOCAL = GENERIC | {
    "weights",  # a Hugging Face checkpoint (directory or cached Hub id) or a tiny base file
    "device",
    "dtype",
    "max_batch",
    "batch_wait_ms",
    "max_wait_ms",
    "threads",
    "gradient_checkpointing",
    "precision",  # training: auto | bf16 | fp32 (evolve.policy.precision)
    "engine",
    "compute_type",  # who samples: torch | ctranslate2 | auto (evolve.policy.ct2)
    "sft_examples",  # set by the cold start (an artifact), not by hand
}
LOCAL_ENGINES = ("torch", "ctranslate2", "auto")
LOCAL_PRECISIONS = ("auto", "bf16", "fp32")  # training precision (evolve.policy.precision)
PRECISION_ALIASES = {"bfloat16": "bf16", "float32": "fp32"}


def check_precision(value: Any, path: str = "params.precision", source: str | None = None) -> str:
    """The canonical name of a training precision setting (``auto``, ``bf16``, ``fp32``), or a ConfigError."""
    v = PRECISION_ALIASES.get(str(value), str(value)) if value is not None else "auto"
    if v not in LOCAL_PRECISIONS:
        raise ConfigError(
            f"{value!r} is not a training precision; use one of {', '.join(LOCAL_PRECISIONS)} "
            "(auto: bf16 where the hardware has it)",
            path=path,
            source=source,
        )
    return v


# evolvekit's own litellm keys, then the keyword arguments of litellm.completion that a task file
# may sensibly fix (model, messages, stream and tools are the agent's); `extra` passes anything else
LITELLM_OWN = frozenset({"api_base", "api_key_env", "timeout", "max_retries", "backoff", "logprobs", "name", "extra"})
LITELLM = (
    GENERIC
    | LITELLM_OWN
    | {
        "top_p",
        "n",
        "stop",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "user",
        "reasoning_effort",
        "verbosity",
        "response_format",
        "seed",
        "top_logprobs",
        "extra_headers",
        "extra_body",
        "api_version",
        "thinking",
        "service_tier",
        "deployment_id",
        "modalities",
        "parallel_tool_calls",
        "tool_choice",
        "top_k",
        "safety_identifier",
        "prompt_cache_key",
        "store",
    }
)


def _scripted() -> frozenset[str]:
    from evolve.llm.fake import OWN_PARAMS, SAMPLING_PARAMS

    return frozenset(SAMPLING_PARAMS | OWN_PARAMS)


def accepted(backend: str) -> frozenset[str] | None:
    """The params ``backend`` takes, or None when it does not say (a plugin without ``accepted_params``)."""
    if backend == "local":
        return LOCAL
    if backend == "litellm":
        return LITELLM
    if backend == "scripted":
        return _scripted()
    from evolve.registry import llm_backends

    try:
        factory = llm_backends.get(backend)
    except Exception:  # noqa: BLE001 - an unknown backend is reported by the caller
        return None
    names = getattr(factory, "accepted_params", None)
    return frozenset(names) | GENERIC if names is not None else None


def check_keys(role: str, backend: str, params: dict[str, Any], source: str = "task") -> None:
    """Refuse a key ``backend`` does not take, naming its YAML path and the closest accepted one."""
    from evolve.registry import did_you_mean

    names = accepted(backend)
    if names is None:
        return
    for key in params:
        if key not in names:
            hint = did_you_mean(key, sorted(names))
            extra = (
                " (to pass a provider's own parameter to litellm as it is, put it under params.extra)"
                if backend == "litellm"
                else ""
            )
            raise ConfigError(
                f"unknown parameter for backend {backend}; {hint}{extra}",
                path=f"models.{role}.params.{key}",
                source=source,
            )
    if backend == "local" and str(params.get("engine", "torch")) not in LOCAL_ENGINES:
        raise ConfigError(
            f"{params['engine']!r} is not an engine; use one of {', '.join(LOCAL_ENGINES)}",
            path=f"models.{role}.params.engine",
            source=source,
        )
    if backend == "local" and "precision" in params:
        check_precision(params["precision"], path=f"models.{role}.params.precision", source=source)
    if backend == "litellm" and "extra" in params and not isinstance(params["extra"], dict):
        raise ConfigError(
            "params.extra must be a mapping of keyword arguments for litellm.completion",
            path=f"models.{role}.params.extra",
            source=source,
        )


def check_ready(role: str, backend: str, params: dict[str, Any], base_dir: Path, source: str = "task") -> None:
    """What a run needs before it starts, checked before it writes anything: a litellm model's
    ``api_key_env`` is set; a local model's ``engine: ctranslate2`` is installed; a scripted
    model's ``reply`` function imports."""
    if backend == "litellm":
        env = params.get("api_key_env")
        if env and not os.environ.get(str(env)):
            raise ConfigError(
                f"the environment variable {env!r} (api_key_env) is not set; export it, or remove "
                "api_key_env for a server that needs no key",
                path=f"models.{role}.params.api_key_env",
                source=source,
            )
    elif backend == "local" and params.get("engine") == "ctranslate2":
        import importlib.util

        try:
            found = importlib.util.find_spec("ctranslate2") is not None
        except (ImportError, ValueError):  # a broken or blocked installation
            found = False
        if not found:
            from evolve.errors import MissingDependency

            raise MissingDependency(
                f"{source}: models.{role}.params.engine: ctranslate2 needs the package ctranslate2, "
                "which is not installed; install it with: pip install 'evolvekit[ctranslate2]' "
                "(or use engine: auto, which falls back to torch)"
            )
    elif backend == "scripted" and params.get("reply"):
        from evolve.errors import UserError
        from evolve.registry import import_path

        try:
            fn = import_path(str(params["reply"]), what="scripted reply function", search=base_dir)
        except UserError as e:
            raise ConfigError(str(e), path=f"models.{role}.params.reply", source=source) from None
        if not callable(fn):
            raise ConfigError(f"{params['reply']!r} is not callable", path=f"models.{role}.params.reply", source=source)


__all__ = [
    "GENERIC",
    "LITELLM",
    "LOCAL",
    "LOCAL_PRECISIONS",
    "accepted",
    "check_keys",
    "check_precision",
    "check_ready",
]
