"""Deprecated import path: this module moved to :mod:`evolve.cluster.training` (cluster code, not a
runner). Import it from there; this alias will be removed."""

from __future__ import annotations

import warnings

from evolve.cluster.training import DAY, TRAIN_KEYS, HostedActor, RayTrainer, check_train, driver_threads

warnings.warn(
    "evolve.runners.ray_train moved to evolve.cluster.training; import it from there", DeprecationWarning, stacklevel=2
)

__all__ = ["DAY", "TRAIN_KEYS", "HostedActor", "RayTrainer", "check_train", "driver_threads"]
