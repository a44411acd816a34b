"""What the code that talks to a Ray cluster shares (the ray runner,
:mod:`~evolve.runners.ray_runner`, and the cluster's model servers and training actors): importing
Ray on first use, and putting a cluster's resources and Ray's errors into words."""

from __future__ import annotations

from typing import Any

from evolve.errors import ConfigError

INSTALL = "the ray runner needs Ray: pip install 'evolvekit[ray]'"


def ray_module() -> Any:
    """The ``ray`` module, or a :class:`~evolve.errors.ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(INSTALL, path="runner.name") from None
    return ray


def resources_text(res: dict[str, Any]) -> str:
    """``{CPU: 2, GPU: 1, node2: 1}``: the resources that matter to a user, without Ray's own."""
    shown = {
        k: v for k, v in res.items() if v and not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"


def cause(e: BaseException) -> str:
    """The part of a Ray error that says why an actor or task died."""
    text = " ".join(str(e).split())
    for marker in ("The actor died because", "The actor is dead because", "cause:"):
        i = text.find(marker)
        if i >= 0:
            return text[i : i + 300]
    return f"{type(e).__name__}: {text[:300]}"


__all__ = ["INSTALL", "cause", "ray_module", "resources_text"]
