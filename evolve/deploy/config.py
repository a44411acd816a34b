"""Deprecated: the task file's ``deploy:`` section is :mod:`evolve.task.deploy` now, beside the rest of
the task file's schema. Import it from there; this module warns and will be removed."""

import warnings

from evolve.task.deploy import Canary, DeployConfig, Guard, Regression, Suite

warnings.warn("evolve.deploy.config is deprecated: import from evolve.task.deploy", DeprecationWarning, stacklevel=2)

__all__ = ["Canary", "DeployConfig", "Guard", "Regression", "Suite"]
