"""Deprecated import path: this module moved to :mod:`evolve.cluster.ray_base` (cluster code, not a
runner). Import it from there; this alias will be removed."""

from __future__ import annotations

import warnings

from evolve.cluster.ray_base import INSTALL, cause, ray_module, resources_text

warnings.warn(
    "evolve.runners.ray_base moved to evolve.cluster.ray_base; import it from there", DeprecationWarning, stacklevel=2
)

__all__ = ["INSTALL", "cause", "ray_module", "resources_text"]
