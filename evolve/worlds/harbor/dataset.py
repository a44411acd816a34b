"""The harbor world's dataset: every Harbor task under ``source``, checked, split by folder name.

Splits are a function of each task's folder name alone (a hash), so a task stays in its split
across runs, seeds and machines, and adding a task moves no other; ``[metadata] split`` in a
task's ``task.toml`` (``train``/``val``/``test``) or the ``splits`` parameter pins one. Before the
run every task is checked (:mod:`.check`, cached per task content): a task whose own solution does
not pass, or whose tests pass untouched, is *broken*.

One bad task never stops a run: a folder that is not a valid task (*invalid*), one that uses a
feature not run yet or that the backend cannot carry out (*unsupported*), and a *broken* one are
each left out, never scored, and reported once on stderr with the task's id and the reason
(:func:`report_excluded`); the rest run.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError

SPLITS = ("train", "val", "test")
LEFT_OUT = ("invalid", "unsupported", "broken")  # check statuses of a task that is not run


def split_of(task_id: str, val: float, test: float, salt: str = "") -> str:
    """``test`` for the first ``test`` share of the hash line, then ``val``, else ``train``."""
    x = int(hashlib.sha256(f"harbor-split:{salt}:{task_id}".encode()).hexdigest()[:12], 16) / float(16**12)
    return "test" if x < test else "val" if x < test + val else "train"


def _resolve(source: Any, base_dir: Path | None) -> list[str]:
    items = source if isinstance(source, (list, tuple)) else [source]
    out = []
    for s in items:
        p = Path(str(s)).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = Path(base_dir) / p
        out.append(str(p))
    return out


def dataset(
    seed: int = 0,
    source: Any = None,
    base_dir: Path | None = None,
    val: float = 0.25,
    test: float = 0.25,
    environment: str = "auto",
    check: bool = True,
    splits: dict | None = None,
    split_salt: str = "",
    images: dict | None = None,
    build_network: str = "auto",
    allow_env: list[str] | None = None,
    capabilities: str = "reduced",
) -> dict[str, list[dict]]:
    """``{"train", "val", "test"}`` lists of task dicts (:func:`.task.load_task`, plus ``split`` and
    ``backend``). ``source``: a task folder, a folder of them or a list (relative to the task file);
    ``val``/``test``: shares of the hash line; ``environment``: ``auto`` | ``sandbox`` | ``docker``;
    ``check``: run each task's solution first and leave out broken ones; ``splits``: ``{split:
    [task ids]}`` pinning tasks; ``images``: the image map for the docker backend (``{"ubuntu:24.04":
    "a-local-image"}``: a base the engine cannot pull, built on a local stand-in, :mod:`.environment.build`);
    ``build_network``: the network builds use (``auto``: the engine's bridge network, none where it has
    none; ``host`` only as this explicit choice, :mod:`.environment.build`); ``allow_env``: the host's environment
    variables a task's ``${VAR}`` may read (none by default, :mod:`.task.hostenv`); ``capabilities``:
    ``reduced`` (the default) or ``docker`` (the engine's default capabilities in the containers).
    ``seed`` does not move tasks between splits."""
    from evolve.worlds.harbor.environment import check_backend
    from evolve.worlds.harbor.task import TaskError, find_tasks, load_task

    if source is None:
        raise ConfigError(
            "the harbor world needs its tasks: dataset: {source: path/to/tasks} (a Harbor task "
            "folder, a folder of them, or a list)",
            path="dataset.source",
        )
    check_backend(environment)
    from evolve.worlds.harbor.environment.build import check_build_network
    from evolve.worlds.harbor.environment.docker import CAPABILITIES
    from evolve.worlds.harbor.task.hostenv import check_names

    check_build_network(build_network)
    _report_host(build_network, [])  # before anything is built
    allowed = check_names(allow_env, "dataset.params.allow_env")
    if capabilities not in CAPABILITIES:
        raise ConfigError(
            f"capabilities {capabilities!r}: use reduced (the default: the capabilities published "
            "tasks need) or docker (the engine's defaults)",
            path="dataset.params.capabilities",
        )
    if not isinstance(images or {}, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in (images or {}).items()
    ):
        raise ConfigError(
            f"dataset.params.images must map image names to local images, e.g. {{'ubuntu:24.04': "
            f"'my-ubuntu:24.04'}}, got {images!r}",
            path="dataset.params.images",
        )
    if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
        raise ConfigError(
            f"dataset.params val={val} and test={test} must be shares in [0, 1) summing below 1", path="dataset.params"
        )
    pinned: dict[str, str] = {}
    for name, ids in (splits or {}).items():
        if name not in SPLITS or not isinstance(ids, list):
            raise ConfigError(
                f"dataset.params.splits: {name!r} must be one of {SPLITS} mapping to a list of task ids",
                path="dataset.params.splits",
            )
        pinned.update({str(i): name for i in ids})
    tasks, excluded = [], []  # excluded: (task id, status, reason)
    for folder in find_tasks(_resolve(source, base_dir)):
        try:
            tasks.append(
                {
                    **load_task(folder, allow_env=allowed),
                    "images": dict(images or {}),
                    "build_network": build_network,
                    "capabilities": capabilities,
                }
            )
        except TaskError as e:
            excluded.append((folder.name, e.status, e.reason))
    known = {t["id"] for t in tasks} | {tid for tid, _, _ in excluded}
    unknown = sorted(set(pinned) - known)
    if unknown:
        from evolve.registry import did_you_mean

        raise ConfigError(
            f"dataset.params.splits names task {unknown[0]!r}, which is not under the source "
            f"({did_you_mean(unknown[0], sorted(known))})",
            path="dataset.params.splits",
        )
    if environment in ("auto", "sandbox") and tasks:
        _need_sandbox(environment)
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for t in tasks:
        meta_split = t["metadata"].get("split")  # one of SPLITS: load_task checked it
        if check:
            from evolve.worlds.harbor.check import check_task

            verdict = check_task(t, environment)
            t["checked"] = verdict["status"]
            if verdict["status"] in LEFT_OUT:
                excluded.append((t["id"], verdict["status"], verdict["why"]))
                continue
        t["split"] = pinned.get(t["id"]) or meta_split or split_of(t["id"], val, test, split_salt)
        t["backend"] = environment
        out[t["split"]].append(t)
    report_excluded(excluded)
    _report_host("", [f"{t['id']}: {n}" for t in tasks for n in t.get("notes") or [] if "is not passed to tasks" in n])
    if not out["train"] or not out["val"]:
        counts = {s: len(v) for s, v in out.items()}
        raise ConfigError(
            f"the Harbor tasks split into {counts} (after {len(excluded)} left out); a run needs "
            "train and val tasks: add tasks, change dataset.params val/test, or pin some with "
            "dataset.params.splits",
            path="dataset.params",
        )
    return out


_REPORTED: set[tuple[str, str, str]] = set()


def report_excluded(excluded: list[tuple[str, str, str]]) -> None:
    """Each left-out task on stderr with its status and reason, once per process (the dataset is
    loaded more than once in a run)."""
    new = [x for x in excluded if x not in _REPORTED]
    _REPORTED.update(new)
    if new:
        print(f"harbor: {len(new)} task(s) left out (not scored):", file=sys.stderr)
        for tid, status, why in new:
            print(f"  - {tid} ({status}): {why}", file=sys.stderr)


def _report_host(build_network: str, notes: list[str]) -> None:
    """Once per process on stderr: builds on the host network (the user's opt-in), and each host
    variable a task wanted and did not get."""
    lines = [f"harbor: {n}" for n in notes]
    if build_network == "host":
        lines.insert(
            0,
            "harbor: WARNING: tasks' builds run on the HOST network (dataset.params.build_network: host): "
            "their Dockerfiles' RUN lines run as root with every service on this machine's loopback in reach",
        )
    new = [x for x in lines if ("", "", x) not in _REPORTED]
    _REPORTED.update(("", "", x) for x in new)
    for line in new:
        print(line, file=sys.stderr)


def _need_sandbox(environment: str) -> None:
    from evolve.worlds.harbor.environment import resolve_backend

    if resolve_backend(environment) == "docker":
        return
    from evolve.sandbox.shell import available

    why = available()
    if why is not None:
        from evolve.errors import MissingDependency

        raise MissingDependency(
            f"the harbor world's sandbox backend cannot run here: {why}. Install bubblewrap "
            "(apt install bubblewrap) or run a Docker engine (dataset.params.environment: docker)"
        )


__all__ = ["LEFT_OUT", "SPLITS", "dataset", "report_excluded", "split_of"]
