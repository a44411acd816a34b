"""The one exception tree of evolvekit.

    EvolveError                      root: catch this to catch everything evolvekit raises on purpose
    ├── UserError                    the user can fix it (CLI: one message, exit code 2, no traceback)
    │   ├── ConfigError              a task file or override is wrong; names the YAML path and the fix
    │   ├── RegistryError            an unknown operator/selector/runner/backend name (with "did you mean")
    │   ├── MissingDependency        an optional extra is not installed (says which `pip install`)
    │   └── RunDirError              a run directory is missing, foreign, or would be overwritten
    ├── BudgetExhausted              a run budget (rollouts, tokens, money, time) is spent
    ├── LLMError                     a model backend failed after its retries (says which model and why)
    └── ArchiveError                 the archive is corrupt or asked for something it does not hold

Bugs are not wrapped: they keep their traceback.
"""

from __future__ import annotations


class EvolveError(Exception):
    """Root of every error evolvekit raises on purpose."""


class UserError(EvolveError):
    """Something the user can fix. The CLI prints the message alone and exits with code 2."""


class ConfigError(UserError):
    """A task file, an override or a config value is wrong."""

    def __init__(self, message: str, *, path: str | None = None, source: str | None = None) -> None:
        self.path = path
        self.source = source
        where = ""
        if source:
            where += f"{source}: "
        if path:
            where += f"{path}: "
        super().__init__(where + message)


class RegistryError(UserError):
    """An unknown registry name."""


class MissingDependency(UserError):
    """An optional dependency is not installed."""


class RunDirError(UserError):
    """A run directory cannot be used as asked."""


class BudgetExhausted(EvolveError):
    """A budget is spent; the engine stops cleanly and writes its report."""


class LLMError(EvolveError):
    """A model backend failed after its retries."""


class ArchiveError(EvolveError):
    """The archive does not hold what was asked for, or is damaged."""


def require(module: str, extra: str) -> None:
    """Raise MissingDependency with an install hint when ``module`` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingDependency(
            f"this feature needs the Python package {module!r}, which is not installed; "
            f"install it with: pip install 'evolvekit[{extra}]'"
        )
