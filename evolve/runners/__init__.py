"""Runners execute rollout jobs and hand back scored trajectories as they complete.

A :class:`RolloutJob` is pure, picklable data (a system, a task, a seed, ...). A
:class:`WorkerSpec` says how a worker builds its environment (the agent, the reward, the
artifact store). A :class:`Worker` builds the agent, the reward and the system's LLMs once
(LLMs are cached per model spec: local backends load weights) and turns one job into one
scored :class:`~evolve.types.Trajectory` (:func:`evolve.rollout.run_agent` then
:func:`evolve.rollout.score`). A runner feeds jobs to workers:

* :class:`ThreadRunner` — one in-process worker and a pool of threads. Fast (thousands of
  trivial rollouts per second) and the default. A rollout's ``timeout`` is enforced
  cooperatively by :func:`~evolve.rollout.run_agent` (every LLM and tool call checks the
  deadline); on top of that a watchdog records a job as failed ("timeout: …") when it has
  not returned ``timeout + grace`` seconds after it started, and goes on with the run.
  **Python threads cannot be killed**: the stuck thread is abandoned — it keeps running (and
  holding whatever it holds) in the background until its agent returns, and its result is
  dropped. Use :class:`ProcessRunner` for agents that may hang in code that does not check
  the deadline (``time.sleep``, a blocking socket, a C extension) or that are not trusted.
* :class:`ProcessRunner` — worker processes (``forkserver``, else ``spawn``), each in its
  own session/process group, each building its own worker from the spec (so the agent and
  the reward must be import paths). A job past ``timeout + grace`` gets its worker's whole
  process group SIGKILLed (the agent's subprocesses too) and a fresh worker started; a
  worker that dies (segfault, ``os._exit``) fails its in-flight job with the exit code and is
  replaced. Each worker has its own duplex pipe (rather than one shared queue) and holds one
  job at a time, so the runner always knows which job a dead or killed worker held. Jobs are
  pickled on the way in; only JSON (the trajectory) crosses back.

Both yield exactly one ``(job, trajectory)`` per job, in completion order. An agent that
raises gives a failed trajectory (``error`` set, score 0); a reward that raises gives
``reward.error``. Abandoning the iterator early cancels the jobs not started yet (the
process runner kills the workers still busy).

* :class:`~evolve.runners.ray_runner.RayRunner` (``runner: {name: ray}``, the ``ray`` extra) — a
  pool of Ray actors, each a :class:`Worker`, on a cluster: one job in flight per actor, ``ray.wait``
  yields them as they complete; a job past ``timeout + grace`` gets its actor killed and replaced;
  a dead actor or node fails its job as the world failing (retried). Local models can be served by
  one shared actor per base (:mod:`~evolve.cluster.model_server`), and the SFT cold start and the
  weight operators can train in a Ray task or actor (``runner.params.train``,
  :mod:`~evolve.cluster.training`). Imported only when named.

The three share one scheduling loop, :func:`~evolve.runners.schedule.schedule`: it keeps the
workers busy, one job each, and owns the deadlines, the timeouts, the failed trajectories of
dead workers and the cleanup of an abandoned iterator. Each runner supplies only its pool of
workers (:class:`~evolve.runners.schedule.Pool`: start, submit, wait, kill): threads, worker
processes or Ray actors.
"""

from __future__ import annotations

from evolve.runners.base import RolloutJob, Runner, Worker, WorkerSpec, failed_trajectory
from evolve.runners.process import ProcessRunner
from evolve.runners.thread import ThreadRunner

__all__ = [
    "ProcessRunner",
    "RolloutJob",
    "Runner",
    "ThreadRunner",
    "Worker",
    "WorkerSpec",
    "failed_trajectory",
]
