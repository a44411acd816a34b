"""Deprecated: the agent contract (:class:`RolloutContext`, :func:`run_agent`, :func:`score`) is
:mod:`evolve.rollout` now, below the runners and the layers that use it. Import it from there; this
module warns and will be removed."""

import warnings

from evolve.rollout import *  # noqa: F403
from evolve.rollout import __all__  # noqa: F401

warnings.warn("evolve.scoring.rollout is deprecated: import from evolve.rollout", DeprecationWarning, stacklevel=2)
