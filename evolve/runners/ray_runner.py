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
        model_server: {num_gpus: 1}   # local models served by one actor per base (evolve.cluster.model_server),
                                      # or per role: {servers: per_role, roles: {solver: {resources: {a: 1}}}}
        train: {num_gpus: 1}      # weight operators and the SFT cold start train with these (evolve.cluster.training)

Each actor builds a :class:`~evolve.runners.base.Worker` from the run's
:class:`~evolve.runners.base.WorkerSpec` (import paths: every node must be able to import the agent
and the reward, installed or through ``runtime_env``) and holds one job at a time. The driver
keeps one ``execute`` call in flight per actor and yields ``(job, trajectory)`` as they complete
(:func:`~evolve.runners.schedule.schedule`, the loop every runner shares).

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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from evolve.cluster.ray_base import cause, ray_module, resources_text
from evolve.errors import ConfigError, EvolveError, InfraError, UserError
from evolve.runners.base import RolloutJob, Worker, WorkerSpec, as_import_path, failed_trajectory
from evolve.runners.schedule import Finished, Slot, schedule
from evolve.types import Trajectory

ARTIFACTS = ("shared", "ship")


class RoleWorker(Worker):
    """A :class:`~evolve.runners.base.Worker` that asks its :class:`~evolve.cluster.model_server.RemoteCache` for each role's
    own server (``servers: per_role``): the same spec in two roles is two models, each answered
    where its role's server is. Other models (not local, or without base weights) as usual."""

    def llm(self, system: Any, role: str) -> Any:
        spec = system.models.get(role)
        cache: Any = self._cache  # a RemoteCache: serving_worker builds it
        remote = cache.for_role(role, spec) if spec is not None else None
        return remote if remote is not None else super().llm(system, role)


def serving_worker(spec: Any, model_server: dict[str, Any], namespace: str) -> Worker:
    """A rollout actor's :class:`~evolve.runners.base.Worker` whose local models are answered by
    the run's model servers: per base (:class:`~evolve.cluster.model_server.RemoteCache`), or per role (a :class:`RoleWorker`)."""
    root = spec.artifacts_root

    from evolve.cluster.model_server import RemoteCache, per_role

    def llms(cache: Any) -> Any:
        return RemoteCache(cache, root, model_server, namespace)

    cls = RoleWorker if per_role(model_server) else Worker
    return cls(spec, own_process=True, llms=llms)


class RayWorker:
    """The body of a Ray actor: a :class:`Worker`, and (``ship``) a node-local artifact cache."""

    def __init__(
        self, spec: WorkerSpec, ship: bool, model_server: dict[str, Any] | None = None, namespace: str = "evolvekit"
    ) -> None:
        if ship:
            cache = Path(tempfile.gettempdir()) / "evolvekit-ray-artifacts"
            cache.mkdir(parents=True, exist_ok=True)
            spec = WorkerSpec(
                agent=spec.agent, reward=spec.reward, artifacts_root=str(cache), search_path=spec.search_path
            )
        elif not Path(spec.artifacts_root).is_dir():
            import socket

            raise UserError(
                f"the run's artifact folder {spec.artifacts_root} is not visible on node "
                f"{socket.gethostname()}; put the run directory on storage every node mounts at "
                "the same path, or set runner.params.artifacts: ship"
            )
        if model_server is not None:
            self.worker = serving_worker(spec, model_server, namespace)
        else:
            self.worker = Worker(spec, own_process=True)

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


class _Actor(Slot):
    def __init__(self, handle: Any) -> None:
        super().__init__()
        self.handle = handle
        self.ready_ref = handle.ready.remote()
        self.ref: Any = None  # the execute call in flight
        self.systems: set[str] = set()  # systems whose models this actor has built
        self.shas: set[str] = set()  # artifacts shipped to it


class _Actors:
    """The ray runner's pool (:class:`~evolve.runners.schedule.Pool`): :class:`RayWorker` actors,
    one ``execute`` call in flight each, ``ray.wait`` on them. They live across runs."""

    noun, verb, aftermath = "ray worker", "killed", "the ray worker was replaced"
    reports_start = False  # an actor does not say when a rollout starts: its first of a system may build models

    def __init__(
        self,
        options: dict[str, Any],
        ship: bool,
        model_server: dict[str, Any] | None,
        namespace: str,
        start_timeout: float,
    ) -> None:
        self.options, self.ship, self.model_server, self.namespace = options, ship, model_server, namespace
        self.start_timeout = start_timeout
        self.cls: Any = None  # ray.remote(RayWorker), once connected
        self.spec: WorkerSpec | None = None
        self.slots: list[_Actor] = []
        self.replaced = 0
        self.lost = 0  # actors lost before they were ready, in a row
        self.puts: dict[str, Any] = {}  # sha -> ObjectRef of a shipped artifact

    def start(self) -> _Actor:
        a = _Actor(self.cls.options(**self.options).remote(self.spec, self.ship, self.model_server, self.namespace))
        self.slots.append(a)
        return a

    def submit(self, a: _Actor, job: RolloutJob) -> bool:
        a.ref = a.handle.execute.remote(job, self._shipped(a, job))
        if job.system.id in a.systems:  # its models are built: the rollout's clock starts now
            a.started_at = a.sent_at
        return True

    def wait(self, timeout: float) -> list[Finished[_Actor]]:
        ray = ray_module()
        from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

        refs = [a.ref for a in self.slots if a.job is not None] + [a.ready_ref for a in self.slots if not a.ready]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        done = set(ready)
        if ready:  # take whatever else is finished too
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done |= set(more)
        out: list[Finished[_Actor]] = []
        for a in list(self.slots):
            if not a.ready and a.ready_ref in done:
                try:
                    ray.get(a.ready_ref)
                    a.ready = True
                    self.lost = 0
                except (RayActorError, RayTaskError) as e:
                    self.kill(a)
                    if "creation task" in str(e) or isinstance(e, RayTaskError) or self.lost >= 3:
                        raise _start_failure(e) from None  # its constructor raised: the user's to fix
                    self.lost += 1  # its node went away before it was ready: another one starts
            if a.job is not None and a.ref in done:
                try:
                    data = ray.get(a.ref, timeout=30)
                except (RayActorError, RayTaskError, GetTimeoutError, RayError) as e:
                    self.kill(a)
                    out.append(Finished(a, None, f"ray worker died ({cause(e)})"))
                    continue
                a.ref = None
                a.systems.add(a.job.system.id)
                out.append(Finished(a, Trajectory.model_validate_json(data)))
        return out

    def kill(self, a: _Actor) -> None:
        with contextlib.suppress(Exception):
            ray_module().kill(a.handle, no_restart=True)
        if a in self.slots:
            self.slots.remove(a)

    def not_ready(self, a: _Actor) -> EvolveError:
        err = self._placement_error()
        self.shutdown()
        return err

    def shutdown(self) -> None:
        """Close idle actors, kill the rest, and kill this run's model servers."""
        if self.cls is None:
            return
        ray = ray_module()
        idle = [a for a in self.slots if a.ready and a.job is None]
        closing = [a.handle.close.remote() for a in idle]
        if closing:
            with contextlib.suppress(Exception):
                ray.wait(closing, num_returns=len(closing), timeout=5)
        for a in list(self.slots):
            self.kill(a)
        self.slots = []
        if self.model_server is not None:
            from evolve.cluster.model_server import kill_servers

            with contextlib.suppress(Exception):
                if self.spec is not None:
                    kill_servers(self.namespace, self.spec.artifacts_root)

    def _shipped(self, a: _Actor, job: RolloutJob) -> dict[str, Any]:
        if not self.ship or self.spec is None:
            return {}
        from evolve.archive.export import find_artifact_refs
        from evolve.artifacts import ArtifactStore

        store = ArtifactStore(self.spec.artifacts_root)
        out = {}
        for ref in find_artifact_refs(job.system):
            if ref.sha256 in a.shas or not store.has(ref.sha256):
                continue
            if ref.sha256 not in self.puts:
                self.puts[ref.sha256] = ray_module().put(store.path(ref).read_bytes())
            out[ref.sha256] = self.puts[ref.sha256]
            a.shas.add(ref.sha256)
        return out

    def _placement_error(self) -> UserError:
        ray = ray_module()
        o = self.options
        asks = {"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]}
        wanted = resources_text(asks)
        with contextlib.suppress(Exception):
            free = ray.available_resources()
            have, total = resources_text(free), resources_text(ray.cluster_resources())
            if all(free.get(k, 0) >= v for k, v in asks.items() if v):  # room, but it did not come up in time
                n = sum(not x.ready for x in self.slots)
                return UserError(
                    f"a ray worker asking for {wanted} did not start within {self.start_timeout:g}s "
                    f"although the cluster has room for it ({have} free of {total}); {n} workers were "
                    "still starting: the nodes start processes too slowly for this many workers. Raise "
                    "runner.params.start_timeout, or lower runner.workers"
                )
            return UserError(
                f"no Ray node could start a worker asking for {wanted} within "
                f"{self.start_timeout:g}s; the cluster has {total} ({have} free). "
                "Lower runner.params (num_cpus, num_gpus, resources), or add nodes"
            )
        return UserError(f"no Ray node could start a worker asking for {wanted} within {self.start_timeout:g}s")


class RayRunner:
    """``workers`` Ray actors; see the module docstring for the task file's ``params``."""

    def __init__(
        self,
        workers: int = 2,
        *,
        address: str | None = None,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: dict[str, float] | None = None,
        artifacts: str = "shared",
        runtime_env: dict[str, Any] | None = None,
        namespace: str = "evolvekit",
        node_ip_address: str | None = None,
        model_server: dict[str, Any] | bool | None = None,
        train: dict[str, Any] | None = None,
        grace: float = 5.0,
        start_timeout: float = 120.0,
    ) -> None:
        if workers < 1:
            raise UserError(f"a runner needs at least one worker; got workers={workers}")
        if artifacts not in ARTIFACTS:
            raise ConfigError(f"must be one of {list(ARTIFACTS)}, got {artifacts!r}", path="runner.params.artifacts")
        for name, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus), *((resources or {}).items())):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {v!r}", path="runner.params")
        self.workers = int(workers)
        self.address, self.namespace, self.runtime_env = address, namespace, dict(runtime_env or {})
        self.node_ip_address = node_ip_address
        self.options = {
            "num_cpus": float(num_cpus),
            "num_gpus": float(num_gpus),
            "resources": dict(resources or {}),
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        self.ship = artifacts == "ship"
        self.model_server = ({} if model_server is True else dict(model_server)) if model_server else None
        if self.model_server is not None:
            from evolve.cluster.model_server import check_model_server

            check_model_server(self.model_server)
        if self.model_server is not None and self.ship:
            raise ConfigError(
                "the model server reads the weights from the run's artifact folder: it needs "
                "artifacts: shared (storage every node mounts)",
                path="runner.params.model_server",
            )
        self.grace, self.start_timeout = float(grace), float(start_timeout)
        self.train = dict(train) if train else None
        if self.train is not None:
            from evolve.cluster.training import check_train

            check_train(self.train)
        if self.train is not None and self.ship:
            raise ConfigError(
                "training reads the base weights from the run's artifact folder: it needs artifacts: "
                "shared (storage every node mounts)",
                path="runner.params.train",
            )
        self._pool = _Actors(self.options, self.ship, self.model_server, namespace, self.start_timeout)
        self._token = 0
        self._connected_here = False
        self._trainer: Any = None

    @property
    def restarts(self) -> int:
        """Actors replaced after a kill or a death mid-job, over the runner's life."""
        return self._pool.replaced

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
                raise InfraError(
                    f"cannot reach the Ray cluster at {self.address!r}: {e} (is it up? If its nodes use "
                    "token authentication, this machine needs RAY_AUTH_MODE=token and the same token; "
                    "see docs/cluster.md)"
                ) from None
            self._connected_here = True
        if self._pool.cls is None:
            self._pool.cls = ray.remote(RayWorker)
        return ray

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

    def run(self, spec: WorkerSpec, jobs: Sequence[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        spec = WorkerSpec(
            agent=as_import_path(spec.agent, "agent"),
            reward=as_import_path(spec.reward, "reward"),
            artifacts_root=str(Path(spec.artifacts_root).resolve()),
            search_path=spec.search_path,
        )
        ray = self._connect()
        if self.model_server is not None:
            from evolve.cluster.model_server import check_servers

            check_servers(ray, self.model_server, list({id(j.system): j.system for j in jobs}.values()))
        pool = self._pool
        if spec != pool.spec:
            pool.shutdown()
            pool.spec = spec
            pool.puts.clear()
        self._token += 1
        pool.lost = 0
        return schedule(
            pool, list(jobs), run=self._token, workers=self.workers, grace=self.grace, start_timeout=self.start_timeout
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pool.shutdown()
        self._pool.spec = None
        self._pool.puts.clear()
        if self._connected_here:
            with contextlib.suppress(Exception):
                ray_module().shutdown()
            self._connected_here = False
            self._pool.cls = None

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _start_failure(e: BaseException) -> EvolveError:
    text = " ".join(str(e).split())
    if "UserError" in text or "is not visible on node" in text:
        i = text.find("UserError")
        return UserError(
            "a ray worker could not start: " + text[i + len("UserError: ") :][:600] if i >= 0 else text[:600]
        )
    return EvolveError(f"a ray worker could not start: {text[:800]}")


__all__ = ["RayRunner", "RayWorker"]
