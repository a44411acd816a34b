"""The runner protocol and what every runner shares: the job and worker-spec data, and the
:class:`Worker` that turns one job into one scored trajectory."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evolve.artifacts import ArtifactStore
from evolve.errors import UserError
from evolve.llm.cache import LLMCache
from evolve.rollout import check_reward_signature, run_agent, score
from evolve.types import InfraFailure, ModelSpec, System, Trajectory

# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: pure data, picklable."""

    key: str  # unique key of this rollout in the archive
    system: System
    task: dict
    seed: int = 0
    sample: int = 0
    temperature: float | None = None
    timeout: float | None = None
    logprobs: bool = True  # False: no one reads the rollout's log-probs (e.g. STaR's samples; see RolloutContext)
    max_tokens: int | None = None  # caps every model call's new tokens (see RolloutContext)


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker builds its environment; picklable when agent and reward are import paths."""

    agent: str | Callable  # "pkg.mod:fn" or a callable (the thread runner accepts callables)
    reward: str | Callable
    artifacts_root: str  # the run's artifact store folder (LLM backends load weights from it)
    search_path: str | None = None  # folder put on sys.path for import paths (the task file's folder)


@runtime_checkable
class Runner(Protocol):
    def run(self, spec: WorkerSpec, jobs: Sequence[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        """Yield one scored trajectory per job, as they complete (any order)."""
        ...

    def close(self) -> None: ...


def as_import_path(obj: str | Callable, what: str) -> str:
    """An import path for ``obj`` (kept when it is one; derived for a module-level function)."""
    if isinstance(obj, str):
        return obj
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if mod and qual and mod != "__main__" and "<" not in qual:
        from evolve.registry import import_path

        path = f"{mod}:{qual}"
        with contextlib.suppress(Exception):
            if import_path(path, what=what) is obj:
                return path
    raise UserError(
        f"a runner of worker processes needs the {what} as an import path ('package.module:function') so that each "
        f"worker process can import it; {obj!r} cannot be imported by path (a lambda, a nested function, or "
        "defined in __main__). Move it into a module, or use the thread runner."
    )


# ----------------------------------------------------------------------------- worker


def _never_called(task: Any, output: Any) -> float:  # the reward of a failed rollout is not computed
    return 0.0


def failed_trajectory(
    job: RolloutJob, error: str, duration: float = 0.0, *, infra: InfraFailure | None = None
) -> Trajectory:
    """A scored failed trajectory for ``job`` (score 0, ``error`` set) built outside the agent;
    with ``infra``, one the world failed under (see :mod:`evolve.failures`)."""
    task_id = job.task.get("id", job.key) if isinstance(job.task, dict) else job.key
    t = Trajectory(
        task_id=str(task_id),
        system_id=job.system.id,
        error=error,
        duration=duration,
        sample=job.sample,
        temperature=job.temperature,
        infra=infra,
    )
    return score(_never_called, job.task if isinstance(job.task, dict) else {}, t)


@contextlib.contextmanager
def _on_sys_path(folder: str | None) -> Iterator[None]:
    if not folder or folder in sys.path:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


class Worker:
    """Builds the agent, the reward and the LLMs once; ``execute(job)`` runs and scores one rollout.

    Thread-safe: the thread runner calls ``execute`` from many threads at once. LLMs are built
    on first use through :data:`evolve.registry.llm_backends` and cached per model spec (its
    canonical JSON); :meth:`close` closes them. ``llms`` wraps that cache (a runner whose models
    are served elsewhere).
    """

    def __init__(
        self, spec: WorkerSpec, *, own_process: bool = False, llms: Callable[[Any], Any] | None = None
    ) -> None:
        from evolve.registry import import_path

        self.spec = spec
        self._own_process = own_process
        search = Path(spec.search_path) if spec.search_path else None
        if own_process and spec.search_path and spec.search_path not in sys.path:
            sys.path.insert(0, spec.search_path)
        self.agent = import_path(spec.agent, what="agent", search=search) if isinstance(spec.agent, str) else spec.agent
        self.reward = (
            import_path(spec.reward, what="reward", search=search) if isinstance(spec.reward, str) else spec.reward
        )
        if not callable(self.agent):
            raise UserError(f"the agent {spec.agent!r} is not callable; an agent is a function agent(task, ctx)")
        try:
            check_reward_signature(self.reward)
        except TypeError as e:
            raise UserError(str(e)) from None
        self.artifacts = ArtifactStore(spec.artifacts_root)
        self._cache = LLMCache(self.artifacts)
        if llms is not None:  # e.g. the ray runner's model servers (evolve.cluster.model_server.RemoteCache)
            self._cache = llms(self._cache)
        self._by_id: dict[int, tuple[ModelSpec, Any]] = {}
        self._build_lock = threading.Lock()  # sys.path is changed while a backend builds: one at a time
        self.closed = False

    # ------------------------------------------------------------------ LLMs

    def llm(self, system: System, role: str) -> Any:
        """The LLM for ``role`` of ``system``, built once per distinct model spec."""
        spec = system.models.get(role)
        if spec is None:
            raise KeyError(f"the system has no model role {role!r}; it has {sorted(system.models)}")
        hit = self._by_id.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        llm = self._cache.peek(spec)
        if llm is None:
            with (
                self._build_lock,
                contextlib.nullcontext() if self._own_process else _on_sys_path(self.spec.search_path),
            ):
                llm = self._cache.get(spec)  # built once per distinct spec
        if len(self._by_id) > 4096:
            self._by_id.clear()
        self._by_id[id(spec)] = (spec, llm)  # keeps spec alive, so its id is not reused
        return llm

    def _preload(self, system: System) -> None:
        """Build the system's LLMs before the rollout's clock starts (a failure is left for the
        agent to meet, and record, when it calls that model)."""
        for role in system.models:
            try:
                self.llm(system, role)
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ rollouts

    def execute(self, job: RolloutJob, on_start: Callable[[], None] | None = None) -> Trajectory:
        """Run and score one job; never raises for the agent's, the reward's or a backend's failure.
        ``on_start`` is called when the LLMs are built and the rollout itself starts."""
        t0 = time.monotonic()
        try:
            self._preload(job.system)
            if on_start is not None:
                on_start()
            traj = run_agent(
                self.agent,
                job.system,
                job.task,
                self.llm,
                seed=job.seed,
                sample=job.sample,
                temperature=job.temperature,
                timeout=job.timeout,
                logprobs=job.logprobs,
                max_tokens=job.max_tokens,
            )
            return score(self.reward, job.task, traj)
        except Exception as e:  # noqa: BLE001 - e.g. a task without "id"
            return failed_trajectory(job, f"runner: {type(e).__name__}: {e}", time.monotonic() - t0)

    def close(self) -> None:
        """Close every LLM built (errors are ignored: closing must not fail a run)."""
        self.closed = True
        self._by_id.clear()
        self._cache.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
