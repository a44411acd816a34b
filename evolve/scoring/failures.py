"""Deprecated: the failure classification is :mod:`evolve.failures` now (a foundation module, so the
archive, the backends and the runners read it without depending on scoring). Import it from there;
this module warns and will be removed."""

import warnings

from evolve.failures import *  # noqa: F403
from evolve.failures import __all__  # noqa: F401

warnings.warn("evolve.scoring.failures is deprecated: import from evolve.failures", DeprecationWarning, stacklevel=2)
