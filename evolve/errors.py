"""The one exception tree of evolvekit.

    EvolveError                      root: catch this to catch everything evolvekit raises on purpose
    ├── UserError                    the user can fix it (CLI: one message, exit code 2, no traceback)
    │   ├── ConfigError              a task file or override is wrong; names the YAML path and the fix
    │   ├── RegistryError            an unknown operator/selector/runner/backend name (with "did you mean")
    │   ├── MissingDependency        an optional extra is not installed (says which `pip install`)
    │   └── RunDirError              a run directory is missing, foreign, or would be overwritten
    ├── BudgetExhausted              a run budget (rollouts, tokens, money, time) is spent
    ├── LLMError                     a model backend failed after its retries (says which model and why;
    │                                ``category`` tells the world failing from a request the agent got wrong)
    ├── InfraError                   the world failed under the agent and stayed failed (the model
    │                                unreachable, rate limits, auth, a dead sandbox): the run stops and
    │                                nothing it could not score is stored as a score (CLI: exit code 3)
    ├── RunFailed                    the run finished its work but too many of its rollouts failed
    │                                (the agent raised, timed out, or its reward failed) to trust it (exit 1)
    └── ArchiveError                 the archive is corrupt or asked for something it does not hold

The CLI's exit codes: 0 done; 1 the run failed (:class:`RunFailed`, or another evolvekit error);
2 a usage or configuration mistake (:class:`UserError`, click's usage errors); 3 the world failed
(:class:`InfraError`: fix it and continue with ``--resume``); 130 interrupted (Ctrl-C).

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


# Why a model call failed. All but "request" are the world failing under the agent (never a score);
# "request" is a call the agent got wrong (a prompt past the context window, a refused content), a
# legitimate failure of the agent's own. The first four are transient: worth retrying.
LLM_CATEGORIES = ("unreachable", "timeout", "rate_limit", "server", "auth", "not_found", "config", "backend", "request")
TRANSIENT = frozenset({"unreachable", "timeout", "rate_limit", "server"})


class LLMError(EvolveError):
    """A model backend failed after its retries.

    ``category`` is one of :data:`LLM_CATEGORIES` (default ``"backend"``: the backend itself
    failed); ``retryable`` says whether trying again later may succeed (transient categories)."""

    def __init__(self, message: str, *, category: str = "backend") -> None:
        if category not in LLM_CATEGORIES:
            raise ValueError(f"unknown LLMError category {category!r}; one of {LLM_CATEGORIES}")
        super().__init__(message)
        self.category = category

    @property
    def retryable(self) -> bool:
        return self.category in TRANSIENT

    def __reduce__(self):  # picklable with its category (process workers send errors back)
        return (_llm_error, (str(self), self.category))


def _llm_error(message: str, category: str) -> LLMError:
    return LLMError(message, category=category)


class InfraError(EvolveError):
    """The world failed under the agent and kept failing past the retry policy (or cannot be
    retried: a bad key, a missing model): the run stops without storing what it could not score.

    Raised inside a rollout (a world's own environment could not be built or reached), it marks
    the rollout's ``infra`` with ``category`` and ``retryable`` (:func:`evolve.failures.classify`)."""

    def __init__(self, message: str = "", *, category: str = "backend", retryable: bool = False) -> None:
        super().__init__(message)
        self.category, self.retryable = category, retryable

    def __reduce__(self):  # picklable with its category (process workers send errors back)
        return (_infra_error, (str(self), self.category, self.retryable))


def _infra_error(message: str, category: str, retryable: bool) -> InfraError:
    return InfraError(message, category=category, retryable=retryable)


class RolloutTimeout(Exception):
    """Raised inside an agent when its rollout is past its deadline (by every recorded model and tool
    call); the rollout is then the agent's failure, with a timeout error. Not an EvolveError: it
    travels through the agent's own code, which should not catch it."""


class RunFailed(EvolveError):
    """The run's rollouts failed (the agent's or the reward's own errors) above the configured share."""


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
