"""Training where the GPUs are: with ``runner.params.train``, the ray runner's :attr:`trainer`
runs the weight operators' training on the cluster, with those resources::

    runner:
      name: ray
      params: {train: {num_gpus: 1, num_cpus: 4, resources: {}, timeout: 86400, threads: 4}}

A :class:`RayTrainer` is what the engine hands operators as ``ctx.extra["remote"]`` (and what the
SFT cold start finds on ``session.runner.trainer``); ``None`` there means "train here", in the
driver. It does two things:

* ``trainer(fn, *args, **kwargs)``: one call, in a Ray actor that ends with it (STaR,
  ``from_traces``, the cold start: paths in, bytes back);
* ``trainer.actor(cls, *args, **kwargs)``: an object built in a Ray actor and kept there (GRPO's
  learner: its model is loaded once, each ``update`` and ``adapter_bytes`` is a remote call). The
  :class:`HostedActor` proxy calls its methods by name; :meth:`HostedActor.close` ends it.

CPU training gives the same weights for the same seed only with the same threads: torch splits
its sums by thread (1 and 2 threads sum in another order), and a process started with
``OMP_NUM_THREADS=1`` (what Ray gives an actor of ``num_cpus: 1``) trains other weights than one
started with 2, even after ``torch.set_num_threads(2)`` (seen here). A training actor therefore
starts with ``OMP_NUM_THREADS`` set to ``threads``, by default the driver's own
(``torch.get_num_threads()``): the weights a node trains are the driver's, byte for byte. Set
``threads`` to use more of a larger node's cores, at the price of other weights.

Arguments and results are data: paths on the run's shared artifact folder, token ids, statistics,
file bytes. A request that no node of the cluster has (``num_gpus: 1`` on a cluster without GPUs)
is an error naming what the cluster has, before anything is started; a training actor that a node
could hold but none frees room for within ``start_timeout`` (the rollout actors keep theirs between
batches) is an error too, not a wait. A call past ``timeout`` is cancelled (the actor killed); an
actor that dies with its node is an
:class:`~evolve.errors.InfraError` (the world failing: the run stops, and ``--resume`` proposes
again from the saved state).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from evolve.cluster.ray_base import cause, resources_text
from evolve.errors import InfraError, UserError

DAY = 24 * 3600.0
TRAIN_KEYS = ("num_cpus", "num_gpus", "resources", "timeout", "threads")


def check_train(train: dict[str, Any]) -> None:
    """Refuse a ``runner.params.train`` the trainer cannot honour, before the run starts."""
    from evolve.errors import ConfigError

    unknown = sorted(set(train) - set(TRAIN_KEYS))
    if unknown:
        raise ConfigError(
            f"takes no key {', '.join(map(repr, unknown))}; it takes {', '.join(TRAIN_KEYS)}",
            path="runner.params.train",
        )
    res = train.get("resources") or {}
    if not isinstance(res, dict):
        raise ConfigError(
            f"resources must be a mapping of resource names to amounts, got {res!r}",
            path="runner.params.train.resources",
        )
    for name, v in (*((k, train[k]) for k in ("num_cpus", "num_gpus", "timeout") if k in train), *res.items()):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (name == "timeout" and v == 0):
            raise ConfigError(
                f"{name} must be a number {'> 0' if name == 'timeout' else '>= 0'}, got {v!r}",
                path="runner.params.train",
            )
    t = train.get("threads")
    if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
        raise ConfigError(
            f"threads must be a whole number >= 1 (torch's intra-op threads), got {t!r}",
            path="runner.params.train.threads",
        )


def driver_threads() -> int | None:
    """The driver's torch intra-op thread count, which training actors use by default (``None``
    where torch is not installed here: the actor keeps its own)."""
    try:
        import torch
    except ImportError:
        return None
    return int(torch.get_num_threads())


class _Host:
    """The body of a training actor: ``cls(*args, **kwargs)`` built in it once placed (so that
    placing it and building it have their own time limits), its methods called by name."""

    def __init__(self) -> None:
        self.obj: Any = None

    def build(self, cls: type, args: tuple, kwargs: dict) -> None:
        self.obj = cls(*args, **kwargs)

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.obj, name)(*args, **kwargs)


class _Call:
    """What a one-call training actor holds: nothing but the call."""

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


class RayTrainer:
    """Runs training calls with ``train``'s resources (see the module docstring). ``connect``
    returns the ``ray`` module, connected to the runner's cluster."""

    def __init__(self, train: dict[str, Any], connect: Callable[[], Any], start_timeout: float = 120.0) -> None:
        self.train, self._connect, self.start_timeout = dict(train), connect, float(start_timeout)
        self.timeout = float(self.train.get("timeout", DAY))
        self.threads = int(self.train["threads"]) if self.train.get("threads") else driver_threads()
        self.options: dict[str, Any] = {
            "num_cpus": float(self.train.get("num_cpus", 1)),
            "num_gpus": float(self.train.get("num_gpus", 0)),
            "resources": dict(self.train.get("resources") or {}),
        }
        if self.threads:  # set when the actor's process starts (merged with the job's runtime_env)
            self.options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(self.threads)}}

    def _fits(self, ray: Any) -> None:
        """Refuse a request that no live node of the cluster has in total (it would wait forever)."""
        o = self.options
        asks = {"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]}
        nodes = [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]
        if not any(all(res.get(k, 0) >= v for k, v in asks.items() if v) for res in nodes):
            biggest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
            raise UserError(
                f"runner.params.train asks for {resources_text(asks)}, which no node of the cluster has "
                f"(the largest has {resources_text(biggest)}); lower it, or add a node that has it"
            )

    def _get(self, ray: Any, ref: Any, what: str, timeout: float, on_timeout: Callable[[], None]) -> Any:
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            on_timeout()
            raise InfraError(
                f"{what} did not finish within {timeout:g} s (runner.params.train.timeout); it was cancelled"
            ) from None
        except ray.exceptions.RayTaskError as e:  # the training itself raised: its own error, as here
            raise (e.cause if isinstance(getattr(e, "cause", None), Exception) else e) from None
        except ray.exceptions.RayError as e:
            raise InfraError(f"{what} died on the cluster: {cause(e)}") from None

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the ``train`` resources, in a Ray actor of its own that ends
        with the call (an actor rather than a task: one that cannot be placed is an error after
        ``start_timeout``, not a wait); its result."""
        hosted = self.actor(_Call)
        try:
            return hosted.run(fn, *args, **kwargs)
        finally:
            hosted.close()

    def actor(self, cls: type, *args: Any, **kwargs: Any) -> HostedActor:
        """``cls(*args, **kwargs)`` built in a Ray actor with the ``train`` resources, kept there."""
        ray = self._connect()
        self._fits(ray)
        handle = ray.remote(_Host).options(**self.options, max_restarts=0, max_task_retries=0).remote()
        hosted = HostedActor(self, handle, cls.__name__)
        try:
            hosted.where = ray.get(handle.where.remote(), timeout=self.start_timeout)
        except ray.exceptions.GetTimeoutError:
            hosted.close()
            raise UserError(self._unplaced(ray)) from None
        except ray.exceptions.RayError as e:
            hosted.close()
            raise InfraError(f"the training actor died before it started: {cause(e)}") from None
        try:
            hosted._call_ref(handle.build.remote(cls, args, kwargs), "__init__", self.timeout)
        except BaseException:
            hosted.close()
            raise
        return hosted

    def _unplaced(self, ray: Any) -> str:
        o = self.options
        asks = resources_text({"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]})
        have = ""
        with contextlib.suppress(Exception):
            total, free = resources_text(ray.cluster_resources()), resources_text(ray.available_resources())
            have = f"; the cluster has {total} ({free} free)"
        return (
            f"no Ray node could start the training actor asking for {asks} (runner.params.train) within "
            f"{self.start_timeout:g}s{have}: the rollout actors and model servers may hold what it needs. Lower "
            "runner.params.train or the rollout actors' num_cpus / workers, or add nodes"
        )


class HostedActor:
    """An object living in a training actor: ``proxy.method(*args)`` calls it there and returns
    the result. ``where``: the node IP and process that hold it."""

    def __init__(self, trainer: RayTrainer, handle: Any, name: str) -> None:
        self._trainer, self._handle, self._name = trainer, handle, name
        self.where: dict[str, Any] = {}

    def _call_ref(self, ref: Any, method: str, timeout: float) -> Any:
        ray = self._trainer._connect()
        return self._trainer._get(ray, ref, f"the training actor's {self._name}.{method}", timeout, self.close)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call_ref(self._handle.call.remote(method, args, kwargs), method, self._trainer.timeout)

        return call

    def close(self) -> None:
        """End the actor (its resources go back to the cluster); closing twice is harmless."""
        with contextlib.suppress(Exception):
            self._trainer._connect().kill(self._handle, no_restart=True)


__all__ = ["HostedActor", "RayTrainer", "check_train"]
