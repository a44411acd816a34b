"""The Ray runner: rollouts on a Ray cluster, one actor per worker (see :mod:`evolve.runners`).

In a task file::

    runner:
      name: ray
      workers: 64                 # actors
      timeout: 120
      params:
        address: auto             # or ray://head:10001, 10.0.0.1:6379; none: a local Ray instance
        num_cpus: 1               # per actor
        num_gpus: 0
        resources: {}             # custom resources per actor, e.g. {sql_db: 1}
        artifacts: shared         # or ship
        runtime_env: {}           # passed to ray.init (working_dir, pip, env_vars)
        model_server: {num_gpus: 1}   # local models served by one actor per base (evolve.cluster.model_server)
        train: {num_gpus: 1}      # weight operators and the SFT cold start train with these (evolve.cluster.training)

Each actor builds a :class:`~evolve.runners.base.Worker` from the run's
:class:`~evolve.runners.base.WorkerSpec` (import paths: every node must be able to import the agent
and the reward, installed or through ``runtime_env``) and holds one job at a time. The driver
keeps one ``execute`` call in flight per actor and yields ``(job, trajectory)`` as they complete.

* **Timeouts**: a job past ``timeout + grace`` (plus ``start_timeout`` while an actor builds a
  system's models for the first time) gets its actor killed (``ray.kill``) and a fresh one
  started; the job is a failed trajectory ("timeout: ...").
* **Deaths**: an actor that dies, or whose node dies, fails its job as the world failing (an
  :class:`~evolve.types.InfraFailure` of category ``worker``, with Ray's cause): the engine's retry
  runs it again, on the actors that are left or on fresh ones. An actor that cannot be placed
  within ``start_timeout`` (no node has the resources it asks for) stops the batch with the
  resources asked and those the cluster has, instead of hanging.
* **Artifacts** (base weights, adapters): ``shared`` (the default) reads them from the run's
  artifact folder, which must be on storage every node mounts at the same path (an actor on a
  node that cannot see it fails at once, saying so); ``ship`` sends each artifact a job needs
  through Ray's object store, once per actor, into a node-local cache. Shared storage is the
  default because weights are read by every actor and are large; shipping needs nothing mounted
  and costs one copy per actor.

``import evolve`` does not import Ray; this runner imports it when it first runs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from evolve.errors import ConfigError, EvolveError, InfraError, UserError
from evolve.failures import infra
from evolve.runners.base import RolloutJob, Worker, WorkerSpec, as_import_path, failed_trajectory
from evolve.cluster.ray_base import cause, ray_module, resources_text
from evolve.types import Trajectory

ARTIFACTS = ("shared", "ship")


class RayWorker:
    """The body of a Ray actor: a :class:`Worker`, and (``ship``) a node-local artifact cache."""

    def __init__(self, spec: WorkerSpec, ship: bool, model_server: dict[str, Any] | None = None,
                 namespace: str = "evolvekit") -> None:
        if ship:
            root = Path(tempfile.gettempdir()) / "evolvekit-ray-artifacts"
            root.mkdir(parents=True, exist_ok=True)
            spec = WorkerSpec(agent=spec.agent, reward=spec.reward, artifacts_root=str(root),
                              search_path=spec.search_path)
        elif not Path(spec.artifacts_root).is_dir():
            import socket

            raise UserError(f"the run's artifact folder {spec.artifacts_root} is not visible on node "
                            f"{socket.gethostname()}; put the run directory on storage every node mounts at "
                            "the same path, or set runner.params.artifacts: ship")
        llms = None
        if model_server is not None:
            from evolve.cluster.model_server import RemoteCache

            root = spec.artifacts_root

            def llms(cache: Any) -> Any:
                return RemoteCache(cache, root, model_server, namespace)
        self.worker = Worker(spec, own_process=True, llms=llms)

    def ready(self) -> dict[str, Any]:
        import socket

        return {"pid": os.getpid(), "host": socket.gethostname()}

    def execute(self, job: RolloutJob, shipped: dict[str, Any]) -> str:
        if shipped:
            ray = ray_module()
            store = self.worker.artifacts
            for sha, ref in shipped.items():
                if not store.has(sha):
                    data = ray.get(ref)
                    dest = store._dest(sha)  # noqa: SLF001 - the store's own layout, by content hash
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp = dest.with_name(dest.name + f".{os.getpid()}.tmp")
                    tmp.write_bytes(data)
                    os.replace(tmp, dest)
        try:
            traj = self.worker.execute(job)
        except BaseException as e:  # noqa: BLE001 - SystemExit in an agent: this actor goes on
            traj = failed_trajectory(job, f"agent raised {type(e).__name__}: {e}")
        return traj.model_dump_json()

    def close(self) -> None:
        self.worker.close()


@dataclass
class _Actor:
    handle: Any
    born: float
    ready_ref: Any
    ready: bool = False
    job: int | None = None
    ref: Any = None
    sent_at: float = 0.0
    systems: set[str] = field(default_factory=set)  # systems whose models this actor has built
    shas: set[str] = field(default_factory=set)  # artifacts shipped to it


class RayRunner:
    """``workers`` Ray actors; see the module docstring for the task file's ``params``."""

    def __init__(self, workers: int = 2, *, address: str | None = None, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, resources: dict[str, float] | None = None, artifacts: str = "shared",
                 runtime_env: dict[str, Any] | None = None, namespace: str = "evolvekit",
                 node_ip_address: str | None = None, model_server: dict[str, Any] | bool | None = None,
                 train: dict[str, Any] | None = None,
                 grace: float = 5.0, start_timeout: float = 120.0) -> None:
        if workers < 1:
            raise UserError(f"a runner needs at least one worker; got workers={workers}")
        if artifacts not in ARTIFACTS:
            raise ConfigError(f"must be one of {list(ARTIFACTS)}, got {artifacts!r}",
                              path="runner.params.artifacts")
        for name, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus), *((resources or {}).items())):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {v!r}", path="runner.params")
        self.workers = int(workers)
        self.address, self.namespace, self.runtime_env = address, namespace, dict(runtime_env or {})
        self.node_ip_address = node_ip_address
        self.options = {"num_cpus": float(num_cpus), "num_gpus": float(num_gpus), "resources": dict(resources or {}),
                        "max_restarts": 0, "max_task_retries": 0}
        self.ship = artifacts == "ship"
        self.model_server = ({} if model_server is True else dict(model_server)) if model_server else None
        if self.model_server is not None and self.ship:
            raise ConfigError("the model server reads the weights from the run's artifact folder: it needs "
                              "artifacts: shared (storage every node mounts)", path="runner.params.model_server")
        self.grace, self.start_timeout = float(grace), float(start_timeout)
        self.train = dict(train) if train else None
        if self.train is not None:
            from evolve.cluster.training import check_train

            check_train(self.train)
        if self.train is not None and self.ship:
            raise ConfigError("training reads the base weights from the run's artifact folder: it needs artifacts: "
                              "shared (storage every node mounts)", path="runner.params.train")
        self._actors: list[_Actor] = []
        self._spec: WorkerSpec | None = None
        self._cls: Any = None
        self._puts: dict[str, Any] = {}  # sha -> ObjectRef of a shipped artifact
        self._token = 0
        self.restarts = 0
        self._connected_here = False
        self._trainer: Any = None

    # ------------------------------------------------------------------ cluster

    def _connect(self) -> Any:
        ray = ray_module()
        if not ray.is_initialized():
            kw: dict[str, Any] = {"namespace": self.namespace, "log_to_driver": False, "ignore_reinit_error": True}
            if self.runtime_env:
                kw["runtime_env"] = self.runtime_env
            if self.node_ip_address:
                kw["_node_ip_address"] = self.node_ip_address
            if self.address is None:
                kw["include_dashboard"] = False
            try:
                ray.init(address=self.address, **kw)
            except ConnectionError as e:
                raise InfraError(f"cannot reach the Ray cluster at {self.address!r}: {e} (is it up? If its nodes use "
                                 "token authentication, this machine needs RAY_AUTH_MODE=token and the same token; "
                                 "see docs/cluster.md)") from None
            self._connected_here = True
        if self._cls is None:
            self._cls = ray.remote(RayWorker)
        return ray

    def _start(self) -> _Actor:
        handle = self._cls.options(**self.options).remote(self._spec, self.ship, self.model_server, self.namespace)
        a = _Actor(handle=handle, born=time.monotonic(), ready_ref=handle.ready.remote())
        self._actors.append(a)
        return a

    def _kill(self, a: _Actor) -> None:
        with contextlib.suppress(Exception):
            ray_module().kill(a.handle, no_restart=True)
        if a in self._actors:
            self._actors.remove(a)

    def _shutdown(self) -> None:
        """Close idle actors, kill the rest, and kill this run's model servers."""
        if self._cls is None:
            return
        ray = ray_module()
        idle = [a for a in self._actors if a.ready and a.job is None]
        closing = [a.handle.close.remote() for a in idle]
        if closing:
            with contextlib.suppress(Exception):
                ray.wait(closing, num_returns=len(closing), timeout=5)
        for a in list(self._actors):
            self._kill(a)
        self._actors = []
        if self.model_server is not None:
            from evolve.cluster.model_server import kill_servers

            with contextlib.suppress(Exception):
                if self._spec is not None:
                    kill_servers(self.namespace, self._spec.artifacts_root)

    def _shipped(self, a: _Actor, job: RolloutJob) -> dict[str, Any]:
        if not self.ship:
            return {}
        from evolve.archive.export import find_artifact_refs
        from evolve.artifacts import ArtifactStore

        store = ArtifactStore(self._spec.artifacts_root)
        out = {}
        for ref in find_artifact_refs(job.system):
            if ref.sha256 in a.shas or not store.has(ref.sha256):
                continue
            if ref.sha256 not in self._puts:
                self._puts[ref.sha256] = ray_module().put(store.path(ref).read_bytes())
            out[ref.sha256] = self._puts[ref.sha256]
            a.shas.add(ref.sha256)
        return out

    def _placement_error(self, a: _Actor) -> UserError:
        ray = ray_module()
        with contextlib.suppress(Exception):
            free = ray.available_resources()
            have, total = resources_text(free), resources_text(ray.cluster_resources())
            o = self.options
            asks = {"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]}
            if all(free.get(k, 0) >= v for k, v in asks.items() if v):  # room, but it did not come up in time
                n = sum(not x.ready for x in self._actors)
                return UserError(f"a ray worker asking for {self._asks()} did not start within {self.start_timeout:g}s "
                                 f"although the cluster has room for it ({have} free of {total}); {n} workers were "
                                 "still starting: the nodes start processes too slowly for this many workers. Raise "
                                 "runner.params.start_timeout, or lower runner.workers")
            return UserError(f"no Ray node could start a worker asking for {self._asks()} within "
                             f"{self.start_timeout:g}s; the cluster has {total} ({have} free). "
                             "Lower runner.params (num_cpus, num_gpus, resources), or add nodes")
        return UserError(f"no Ray node could start a worker asking for {self._asks()} within {self.start_timeout:g}s")

    def _asks(self) -> str:
        o = self.options
        return resources_text({"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]})

    @property
    def trainer(self) -> Any:
        """Where the weight operators train: a :class:`~evolve.cluster.training.RayTrainer` with the
        ``train`` resources when they are set, else None (on the driver)."""
        if self.train is None:
            return None
        if self._trainer is None:
            from evolve.cluster.training import RayTrainer

            self._trainer = RayTrainer(self.train, self._connect, self.start_timeout)
        return self._trainer

    # ------------------------------------------------------------------ run

    def run(self, spec: WorkerSpec, jobs: Sequence[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        spec = WorkerSpec(agent=as_import_path(spec.agent, "agent"), reward=as_import_path(spec.reward, "reward"),
                          artifacts_root=str(Path(spec.artifacts_root).resolve()), search_path=spec.search_path)
        self._connect()
        if spec != self._spec:
            self._shutdown()
            self._spec = spec
            self._puts.clear()
        self._token += 1
        return self._iter(list(jobs))

    def _iter(self, jobs: list[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        ray = ray_module()
        from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

        n = len(jobs)
        if n == 0:
            return
        lost = 0  # actors lost before they were ready, in a row
        todo = list(range(n))[::-1]  # popped from the end: in order
        emitted = [False] * n
        left = n
        out: list[tuple[RolloutJob, Trajectory]] = []

        def emit(idx: int, traj: Trajectory) -> None:
            nonlocal left
            if not emitted[idx]:
                emitted[idx] = True
                left -= 1
                out.append((jobs[idx], traj))

        def died(a: _Actor, reason: str) -> None:
            self._kill(a)
            if a.job is not None:
                self.restarts += 1
                why = f"ray worker died ({reason}) while running this rollout"
                emit(a.job, failed_trajectory(jobs[a.job], why, time.monotonic() - a.sent_at,
                                              infra=infra("worker", why, "runner")))

        try:
            while True:
                busy = sum(a.job is not None for a in self._actors)
                while len(self._actors) < min(self.workers, len(todo) + busy):
                    self._start()
                for a in self._actors:
                    if todo and a.ready and a.job is None:
                        idx = todo.pop()
                        job = jobs[idx]
                        try:
                            a.ref = a.handle.execute.remote(job, self._shipped(a, job))
                        except Exception as e:  # noqa: BLE001 - the job cannot be serialised
                            emit(idx, failed_trajectory(job, f"runner: cannot send the job to a ray worker: "
                                                        f"{type(e).__name__}: {e}"))
                            continue
                        a.job, a.sent_at = idx, time.monotonic()
                yield from out
                out.clear()
                if not left:
                    break

                now = time.monotonic()
                wake = 1.0
                for a in self._actors:
                    d = self._deadline(a, jobs)
                    if d is not None:
                        wake = min(wake, d - now)
                refs = [a.ref for a in self._actors if a.job is not None] + [
                    a.ready_ref for a in self._actors if not a.ready]
                done = set()
                if refs:
                    ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, wake))
                    done = set(ready)
                    if ready:  # take whatever else is finished too
                        more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                        done |= set(more)
                for a in list(self._actors):
                    if not a.ready and a.ready_ref in done:
                        try:
                            ray.get(a.ready_ref)
                            a.ready = True
                            lost = 0
                        except (RayActorError, RayTaskError) as e:
                            self._kill(a)
                            if "creation task" in str(e) or isinstance(e, RayTaskError) or lost >= 3:
                                raise _start_failure(e) from None  # its constructor raised: the user's to fix
                            lost += 1  # its node went away before it was ready: another one starts
                    if a.job is not None and a.ref in done:
                        idx = a.job
                        try:
                            data = ray.get(a.ref, timeout=30)
                        except RayActorError as e:
                            died(a, cause(e))
                            continue
                        except (RayTaskError, GetTimeoutError, RayError) as e:
                            died(a, cause(e))
                            continue
                        a.job, a.ref = None, None
                        a.systems.add(jobs[idx].system.id)
                        emit(idx, Trajectory.model_validate_json(data))

                now = time.monotonic()
                for a in list(self._actors):
                    if not a.ready and now - a.born > self.start_timeout:
                        err = self._placement_error(a)
                        self._shutdown()
                        raise err
                    d = self._deadline(a, jobs)
                    if a.job is not None and d is not None and now > d:
                        idx, limit = a.job, jobs[a.job].timeout or 0.0
                        elapsed = now - a.sent_at
                        self._kill(a)
                        self.restarts += 1
                        emit(idx, failed_trajectory(
                            jobs[idx], f"timeout: killed after {elapsed:.1f}s (limit {limit:g}s + {self.grace:g}s "
                            "grace); the ray worker was replaced", elapsed))
        finally:
            for a in list(self._actors):  # abandoned early or failed: actors still busy are killed
                if a.job is not None:
                    self._kill(a)

    def _deadline(self, a: _Actor, jobs: list[RolloutJob]) -> float | None:
        if a.job is None or not jobs[a.job].timeout:
            return None
        build = 0.0 if jobs[a.job].system.id in a.systems else self.start_timeout
        return a.sent_at + (jobs[a.job].timeout or 0.0) + self.grace + build

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._shutdown()
        self._spec = None
        self._puts.clear()
        if self._connected_here:
            with contextlib.suppress(Exception):
                ray_module().shutdown()
            self._connected_here = False
            self._cls = None

    def __enter__(self) -> "RayRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _start_failure(e: BaseException) -> EvolveError:
    text = " ".join(str(e).split())
    if "UserError" in text or "is not visible on node" in text:
        i = text.find("UserError")
        return UserError("a ray worker could not start: " + text[i + len("UserError: "):][:600] if i >= 0 else text[:600])
    return EvolveError(f"a ray worker could not start: {text[:800]}")


__all__ = ["RayRunner", "RayWorker"]
