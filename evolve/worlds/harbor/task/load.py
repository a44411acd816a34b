"""Reading one Harbor task folder, strictly: what a folder must hold, which ``task.toml`` keys
exist, and the task as a plain JSON dict the engine can ship to any worker.

A Harbor task (https://harborframework.com/docs/tasks; the format Terminal-Bench 2.0 ships in)::

    my-task/
    ├── instruction.md        what the agent is told
    ├── task.toml             timeouts, resources, metadata
    ├── environment/          Dockerfile and the files it copies
    ├── tests/test.sh         the verifier: exit 0 and/or /logs/verifier/reward.txt (or reward.json)
    └── solution/solve.sh     optional reference solution (never shown to the agent)

Keys are checked against Harbor's schema (``[metadata]`` is free-form, as in Harbor); an unknown
key or a timeout that is not a positive number of seconds is a :class:`TaskError` (the task is
*invalid*), a feature evolvekit does not run yet (Windows or GPU images, the environment's healthcheck, an egress
allowlist; :mod:`.sections` names them) or a ``${VAR}`` whose host variable the user did not allow
or is not set (:mod:`.hostenv`) an :class:`UnsupportedTask`; both name the task folder, and the dataset leaves that task out with the
reason while the others run. What runs but is not enforced (``storage_mb``) is a note on the task.

A multi-step task (``[[steps]]``) has ``steps/<name>/instruction.md`` for each step, and its tests
in ``steps/<name>/tests/`` (merged over ``tests/``, whose ``test.sh`` stands in for a step without
one); its solution in ``steps/<name>/solution/`` or ``solution/``; ``steps/<name>/workdir/`` is
copied into the working directory before the step, and its ``setup.sh`` run there then; its
``[steps.healthcheck]`` (:func:`.sections.healthcheck`) runs after that, before the step's agent.

A task folder is someone else's: its files are read without following links
(:mod:`evolve.sandbox.beneath`), so an ``instruction.md`` or a ``task.toml`` that is a link to a
host file is refused, never read. Links deeper in ``environment/``, ``tests/`` and ``solution/``
are copied as links into the task's environment, as Docker copies them.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError

# Harbor 0.25's TaskConfig (harbor/models/task/config.py); "version" and environment.memory/storage are
# the older schema's, still found in published tasks.
_NETWORK = {"network_mode", "allowed_hosts"}
KNOWN: dict[str, set[str] | None] = {
    "": {
        "schema_version",
        "version",
        "task",
        "metadata",
        "verifier",
        "agent",
        "environment",
        "solution",
        "source",
        "multi_step_reward_strategy",
        "steps",
        "artifacts",
    },
    "task": {"name", "version", "description", "authors", "keywords"},
    "metadata": None,  # free-form
    "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment", "collect", *_NETWORK},
    "agent": {"timeout_sec", "user", *_NETWORK},
    "environment": {
        "build_timeout_sec",
        "docker_image",
        "os",
        "cpus",
        "memory_mb",
        "storage_mb",
        "gpus",
        "gpu_types",
        "tpu",
        "mcp_servers",
        "env",
        "skills_dir",
        "healthcheck",
        "workdir",
        "allow_internet",
        "memory",
        "storage",
        *_NETWORK,
    },
    "solution": {"env"},
}
DEFAULTS = {"agent": None, "verifier": 600.0, "build": 600.0}  # Harbor's defaults, seconds (agent: no limit)
MAX_TIMEOUT = 24 * 3600.0
TEXT_LIMIT = 4 << 20  # bytes of instruction.md, task.toml, solve.sh read at most
_UNITS = {"": 1, "b": 1 / 2**20, "k": 1 / 1024, "kb": 1 / 1024, "m": 1, "mb": 1, "g": 1024, "gb": 1024}


class TaskError(ConfigError):
    """A folder that is not a valid Harbor task; the message names the folder and the fix.
    ``reason`` is the message without the folder, ``status`` ``invalid``."""

    status = "invalid"

    def __init__(self, folder: Path | str, message: str) -> None:
        self.folder, self.reason = str(folder), message
        super().__init__(f"Harbor task {folder}: {message}")

    def __reduce__(self):
        return (type(self), (self.folder, self.reason))


class UnsupportedTask(TaskError):
    """A valid Harbor task using a feature evolvekit does not run yet (the message names it)."""

    status = "unsupported"


def _read(folder: Path, rel: str) -> str | None:
    """A task file's text (None when absent), read without following links."""
    from evolve.sandbox.beneath import Refused, read

    try:
        data = read(folder, rel, limit=TEXT_LIMIT)
    except Refused as e:
        raise TaskError(
            folder, f"{e}: a task's files are read without following links; put the file itself there"
        ) from None
    return None if data is None else data.decode("utf-8", "replace")


def _kind(folder: Path, rel: str) -> str | None:
    from evolve.sandbox.beneath import Refused, kind

    try:
        return kind(folder, rel)
    except Refused as e:
        raise TaskError(folder, f"{e}: a task's files are read without following links") from None


def _toml(text: str, where: Path) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(where, f"task.toml is not valid TOML: {e}") from None


def _check_keys(data: dict, folder: Path) -> None:
    from evolve.registry import did_you_mean

    for section, known in KNOWN.items():
        table = data if section == "" else data.get(section)
        if table is None or known is None:
            continue
        if not isinstance(table, dict):
            raise TaskError(folder, f"task.toml: [{section}] must be a table, got {type(table).__name__}")
        unknown = sorted(set(table) - known)
        if unknown:
            where = f"[{section}] " if section else "top level "
            raise TaskError(
                folder,
                f"task.toml: unknown key {unknown[0]!r} at the {where}"
                f"({did_you_mean(unknown[0], sorted(known))}); Harbor's schema has {sorted(known)}",
            )


def _seconds(data: dict, section: str, key: str, default: float | None, folder: Path) -> float | None:
    value = (data.get(section) or {}).get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TaskError(folder, f"task.toml: [{section}] {key} must be a positive number of seconds, got {value!r}")
    if value > MAX_TIMEOUT:
        raise TaskError(folder, f"task.toml: [{section}] {key} = {value} is over a day; give seconds, e.g. 600")
    return float(value)


def _memory_mb(env: dict, folder: Path) -> int | None:
    if "memory_mb" in env:
        v = env["memory_mb"]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise TaskError(folder, f"task.toml: [environment] memory_mb must be a positive integer, got {v!r}")
        return v
    if "memory" in env:  # the older schema: "4G", "512M"
        text = str(env["memory"]).strip().lower()
        num = text.rstrip("bgkm")
        try:
            return max(1, int(float(num) * _UNITS[text[len(num) :]]))
        except (ValueError, KeyError):
            raise TaskError(
                folder, f"task.toml: [environment] memory = {env['memory']!r}: write e.g. '2G' or use memory_mb = 2048"
            ) from None
    return None


def digest(folder: Path) -> str:
    """A hash of everything in the task folder (names and bytes, a link's target), so a changed
    task is a new one; walked without following links."""
    from evolve.sandbox.beneath import files, readlink, stream

    h = hashlib.sha256()
    for rel, k in files(folder, skip=("__pycache__",)):
        if k == "file":
            h.update(rel.encode() + b"\0")
            for chunk in stream(folder, rel):
                h.update(chunk)
            h.update(b"\0")
        elif k == "link":
            h.update(rel.encode() + b"\0L" + readlink(folder, rel).encode(errors="surrogateescape") + b"\0")
    return h.hexdigest()[:16]


class _Errors:
    """What :mod:`.sections` raises: an invalid task, or one using what is not run yet."""

    invalid = TaskError
    unsupported = UnsupportedTask


_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


def strip_canary(text: str) -> str:
    """The instruction without its leading canary lines (a benchmark's provenance marker, never
    shown to the agent, as Harbor strips them) and the blank lines after them."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def load_task(folder: str | Path, allow_env: Iterable[str] = ()) -> dict[str, Any]:
    """The task in ``folder`` as a JSON dict (``id, path, instruction, agent_timeout (None: no
    limit), verifier_timeout, build_timeout, memory_mb, cpus, workdir, docker_image, agent_user,
    verifier_user, environment_env, verifier_env, solution_env (``${VAR}`` kept, resolved when an
    environment opens), network, verifier_mode, verifier_image, artifacts, steps (None, or one dict
    per step), multi_step_reward_strategy, notes, metadata, has_solution, digest, host_env (the
    host variables its ``${VAR}`` values read), allow_env (those of them in ``allow_env``, the
    only ones it gets: :mod:`.hostenv`)``); :class:`TaskError` when it is not a valid Harbor task,
    :class:`UnsupportedTask` when it uses what evolvekit does not run yet or reads a host variable
    it may not."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise TaskError(folder, "not a folder")
    try:
        task = _load(folder)
    except OSError as e:  # unreadable files: the task is left out with the reason
        raise TaskError(folder, f"cannot read the task: {type(e).__name__}: {e}") from None
    from evolve.worlds.harbor.task.hostenv import admit

    got = admit(task, folder, allow_env, _Errors)
    return {**task, "allow_env": got["allow_env"], "host_env": got["host_env"], "notes": task["notes"] + got["notes"]}


def _instruction(folder: Path, rel: str) -> str:
    text = _read(folder, rel)
    if text is None:
        raise TaskError(
            folder,
            f"not a Harbor task: no {rel} (a task folder holds instruction.md, task.toml, "
            "environment/ and tests/test.sh)",
        )
    text = strip_canary(text).strip()
    if not text:
        raise TaskError(folder, f"{rel} is empty: write what the agent must do")
    return text


def _steps(data: dict, folder: Path) -> list[dict] | None:
    """Each ``[[steps]]`` entry as the world runs it (see the module docstring)."""
    from evolve.worlds.harbor.task import sections as S

    raw = data.get("steps")
    if not raw:
        return None
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        raise TaskError(folder, "task.toml: steps must be [[steps]] tables")
    out, seen = [], set()
    shared_test = _kind(folder, "tests/test.sh") == "file"
    for i, st in enumerate(raw, 1):
        name = st.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
            raise TaskError(
                folder, f"task.toml: step {i} needs a name usable as a folder name (steps/<name>/), got {name!r}"
            )
        if name.casefold() in seen:
            raise TaskError(folder, f"task.toml: two steps are named {name!r}")
        seen.add(name.casefold())
        where = f"[[steps]] {name!r}"
        unknown = sorted(set(st) - S.STEP_KEYS)
        if unknown:
            raise TaskError(
                folder, f"task.toml: {where}: unknown key {unknown[0]!r}; Harbor's steps have {sorted(S.STEP_KEYS)}"
            )
        agent, ver = st.get("agent") or {}, st.get("verifier") or {}
        if not isinstance(agent, dict) or not isinstance(ver, dict):
            raise TaskError(folder, f"task.toml: {where}: agent and verifier must be tables")
        for key in ("environment", "environment_mode", "collect", "network_mode", "allowed_hosts"):
            if ver.get(key) or (key in ("network_mode", "allowed_hosts") and agent.get(key)):
                raise UnsupportedTask(
                    folder,
                    f"task.toml: {where} {key} (a step's own verifier environment or network "
                    "policy), which the harbor world does not run yet",
                )
        base = f"steps/{name}"
        for sub in ("tests", "solution", "workdir"):
            if _kind(folder, f"{base}/{sub}") not in (None, "dir"):
                raise TaskError(folder, f"{base}/{sub} is not a folder (a symbolic link or a file)")
        own_test = _kind(folder, f"{base}/tests/test.sh") == "file"
        if not own_test and not shared_test:
            raise TaskError(folder, f"step {name!r} has no test: write {base}/tests/test.sh or tests/test.sh")
        own_solution = _kind(folder, f"{base}/solution") == "dir"
        if own_solution and _kind(folder, f"{base}/solution/solve.sh") != "file":
            raise TaskError(folder, f"{base}/solution/ has no solve.sh")
        out.append(
            {
                "name": name,
                "instruction": _instruction(folder, f"{base}/instruction.md"),
                "agent_timeout": _seconds({f"{where} agent": agent}, f"{where} agent", "timeout_sec", None, folder),
                "verifier_timeout": _seconds(
                    {f"{where} verifier": ver}, f"{where} verifier", "timeout_sec", DEFAULTS["verifier"], folder
                ),
                "agent_user": S.user(agent, f"{where} agent", folder, _Errors),
                "verifier_user": S.user(ver, f"{where} verifier", folder, _Errors),
                "verifier_env": S.env_table(ver, f"{where} verifier", folder, _Errors),
                "min_reward": S.min_reward(st.get("min_reward"), where, folder, _Errors),
                "test_dirs": [d for d in ("tests", f"{base}/tests") if _kind(folder, d) == "dir"],
                "test": f"{base}/tests/test.sh" if own_test else "tests/test.sh",
                "solution": f"{base}/solution"
                if own_solution
                else ("solution" if _kind(folder, "solution/solve.sh") == "file" else None),
                "workdir": f"{base}/workdir" if _kind(folder, f"{base}/workdir") == "dir" else None,
                "healthcheck": S.healthcheck(st.get("healthcheck"), where, folder, _Errors),
            }
        )
    return out


def _load(folder: Path) -> dict[str, Any]:
    from evolve.worlds.harbor.task import sections as S

    toml = _read(folder, "task.toml")
    data = _toml(toml, folder) if toml is not None else {}
    _check_keys(data, folder)
    for sub in ("environment", "tests", "solution", "steps"):
        if _kind(folder, sub) not in (None, "dir"):
            raise TaskError(
                folder,
                f"{sub} is not a folder (a symbolic link or a file); a task's files are read without following links",
            )
    steps = _steps(data, folder)
    if steps is None:
        instruction = _instruction(folder, "instruction.md")
        if _kind(folder, "tests/test.sh") != "file":
            raise TaskError(
                folder,
                "not a Harbor task: no tests/test.sh (a task folder holds instruction.md, "
                "task.toml, environment/ and tests/test.sh)",
            )
    else:
        instruction = steps[0]["instruction"]
    env = data.get("environment") or {}
    if str(env.get("os", "linux")).lower() != "linux":
        raise UnsupportedTask(folder, f"[environment] os = {env.get('os')!r}: only Linux environments run here")
    notes = S.refusals(data, folder, _Errors)
    if _kind(folder, "environment") is None and not env.get("docker_image"):
        raise TaskError(folder, "no environment/ folder (with a Dockerfile) and no [environment] docker_image")
    split = (data.get("metadata") or {}).get("split")
    if split is not None and split not in ("train", "val", "test"):
        raise TaskError(folder, f"task.toml: [metadata] split = {split!r}; use one of train, val, test")
    strategy = data.get("multi_step_reward_strategy") or "mean"
    if strategy not in ("mean", "final"):
        raise TaskError(folder, f"task.toml: multi_step_reward_strategy = {strategy!r}; use 'mean' or 'final'")
    mode, verifier_image = S.verifier_mode(data, folder, _kind, _Errors)
    if mode == "separate" and steps is not None:
        raise UnsupportedTask(
            folder, "a multi-step task with a separate verifier environment, which the harbor world does not run yet"
        )
    arts = S.artifacts(data, folder, _Errors)
    if arts and mode == "shared":
        notes.append("artifacts are not collected: the verifier shares the agent's environment")
    names = [s["name"] for s in steps or []]
    for st in steps or []:
        if data["steps"][names.index(st["name"])].get("artifacts"):
            notes.append(f"step {st['name']!r} artifacts are not collected")
    task_info = data.get("task") or {}
    has_solution = (
        _kind(folder, "solution/solve.sh") == "file" if steps is None else all(st["solution"] for st in steps)
    )
    return {
        "id": folder.name,
        "name": str(task_info.get("name") or folder.name),
        "path": str(folder),
        "instruction": instruction,
        "agent_timeout": _seconds(data, "agent", "timeout_sec", DEFAULTS["agent"], folder),
        "verifier_timeout": _seconds(data, "verifier", "timeout_sec", DEFAULTS["verifier"], folder),
        "build_timeout": _seconds(data, "environment", "build_timeout_sec", DEFAULTS["build"], folder),
        "memory_mb": _memory_mb(env, folder),
        "cpus": S.cpus(env, folder, _Errors),
        "workdir": env.get("workdir"),
        "docker_image": env.get("docker_image"),
        "agent_user": S.user(data.get("agent") or {}, "agent", folder, _Errors),
        "verifier_user": S.user(data.get("verifier") or {}, "verifier", folder, _Errors),
        "verifier_env": S.env_table(data.get("verifier") or {}, "verifier", folder, _Errors),
        "environment_env": S.env_table(env, "environment", folder, _Errors),
        "solution_env": S.env_table(data.get("solution") or {}, "solution", folder, _Errors),
        "network": S.network(data, folder, _Errors),
        "verifier_mode": mode,
        "verifier_image": verifier_image,
        "artifacts": arts,
        "steps": steps,
        "multi_step_reward_strategy": strategy,
        "notes": notes,
        "metadata": {
            k: v for k, v in (data.get("metadata") or {}).items() if isinstance(v, (str, int, float, bool, list))
        },
        "has_solution": has_solution,
        "digest": digest(folder),
    }


def find_tasks(source: str | Path | list) -> list[Path]:
    """The task folders ``source`` names: a task folder, a folder of task folders, or a list of
    either. A folder that holds neither is an error naming it."""
    sources = source if isinstance(source, (list, tuple)) else [source]
    out: list[Path] = []
    for s in sources:
        p = Path(str(s)).expanduser().resolve()
        if not p.exists():
            raise ConfigError(
                f"{s}: no such folder; give a Harbor task folder or a folder of them", path="dataset.source"
            )
        if (p / "instruction.md").exists() or (p / "tests").is_dir() or (p / "task.toml").is_file():
            out.append(p)
            continue
        subs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith((".", "_")))
        tasks = [
            d for d in subs if (d / "instruction.md").exists() or (d / "task.toml").exists() or (d / "tests").is_dir()
        ]
        if not tasks:
            raise ConfigError(
                f"{p} holds no Harbor task folders (each with instruction.md, task.toml, environment/ "
                "and tests/test.sh)",
                path="dataset.source",
            )
        out.extend(tasks)
    seen: dict[str, Path] = {}
    for p in out:
        if p.name in seen and seen[p.name] != p:
            raise ConfigError(
                f"two task folders are named {p.name!r} ({seen[p.name]} and {p}); a task's id is its "
                "folder name: rename one",
                path="dataset.source",
            )
        seen[p.name] = p
    return list(seen.values())


__all__ = ["KNOWN", "TaskError", "UnsupportedTask", "digest", "find_tasks", "load_task"]
