"""Deprecated import path: this module moved to :mod:`evolve.cluster.model_server` (cluster code, not a
runner). Import it from there; this alias will be removed."""

from __future__ import annotations

import warnings

from evolve.cluster.model_server import PREFIX, ModelServer, RemoteCache, RemoteLLM, kill_servers, server_name

warnings.warn(
    "evolve.runners.ray_models moved to evolve.cluster.model_server; import it from there",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["PREFIX", "ModelServer", "RemoteCache", "RemoteLLM", "kill_servers", "server_name"]
