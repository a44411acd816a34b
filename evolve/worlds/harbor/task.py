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
key, a timeout that is not a positive number of seconds, or a feature evolvekit does not run
(multi-step tasks, Windows images) is a :class:`~evolve.errors.ConfigError` naming the task folder.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError, MissingDependency

# Harbor 0.25's TaskConfig (harbor/models/task/config.py); "version" and environment.memory/storage are
# the older schema's, still found in published tasks.
_NETWORK = {"network_mode", "allowed_hosts"}
KNOWN: dict[str, set[str] | None] = {
    "": {"schema_version", "version", "task", "metadata", "verifier", "agent", "environment", "solution", "source",
         "multi_step_reward_strategy", "steps", "artifacts"},
    "task": {"name", "version", "description", "authors", "keywords"},
    "metadata": None,  # free-form
    "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment", "collect", *_NETWORK},
    "agent": {"timeout_sec", "user", *_NETWORK},
    "environment": {"build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "gpus",
                    "gpu_types", "tpu", "mcp_servers", "env", "skills_dir", "healthcheck", "workdir",
                    "allow_internet", "memory", "storage", *_NETWORK},
    "solution": {"env"},
}
DEFAULTS = {"agent": 600.0, "verifier": 600.0, "build": 600.0}  # Harbor's defaults, seconds
MAX_TIMEOUT = 24 * 3600.0
_UNITS = {"": 1, "b": 1 / 2**20, "k": 1 / 1024, "kb": 1 / 1024, "m": 1, "mb": 1, "g": 1024, "gb": 1024}


class TaskError(ConfigError):
    """A folder that is not a valid Harbor task; the message names the folder and the fix."""

    def __init__(self, folder: Path | str, message: str) -> None:
        self.folder = str(folder)
        super().__init__(f"Harbor task {folder}: {message}")


def _toml(text: str, where: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise MissingDependency("reading task.toml on Python 3.10 needs tomli: pip install tomli") from None
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
            raise TaskError(folder, f"task.toml: unknown key {unknown[0]!r} at the {where}"
                            f"({did_you_mean(unknown[0], sorted(known))}); Harbor's schema has {sorted(known)}")


def _seconds(data: dict, section: str, key: str, default: float, folder: Path) -> float:
    value = (data.get(section) or {}).get(key, default)
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
            return max(1, int(float(num) * _UNITS[text[len(num):]]))
        except (ValueError, KeyError):
            raise TaskError(folder, f"task.toml: [environment] memory = {env['memory']!r}: write e.g. '2G' or use "
                            "memory_mb = 2048") from None
    return None


def _env_table(data: dict, section: str, folder: Path) -> dict[str, str]:
    table = (data.get(section) or {}).get("env") or {}
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                              for k, v in table.items()):
        raise TaskError(folder, f"task.toml: [{section}] env must be a table of strings, e.g. env = {{ A = \"1\" }}")
    if any("${" in str(v) for v in table.values()):
        raise TaskError(folder, f"task.toml: [{section}] env takes values from the host's environment (${{...}}); "
                        "evolvekit never passes host variables into a task: give the values")
    return {k: str(v) for k, v in table.items()}


def digest(folder: Path) -> str:
    """A hash of everything in the task folder (names and bytes), so a changed task is a new one."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def load_task(folder: str | Path) -> dict[str, Any]:
    """The task in ``folder`` as a JSON dict (``id, path, instruction, agent_timeout,
    verifier_timeout, build_timeout, memory_mb, workdir, docker_image, verifier_env, metadata,
    has_solution, digest``); :class:`TaskError` when it is not a valid Harbor task."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise TaskError(folder, "not a folder")
    missing = [n for n in ("instruction.md", "tests/test.sh") if not (folder / n).is_file()]
    if missing:
        raise TaskError(folder, f"not a Harbor task: no {' and no '.join(missing)} (a task folder holds "
                        "instruction.md, task.toml, environment/ and tests/test.sh)")
    instruction = (folder / "instruction.md").read_text(errors="replace").strip()
    if not instruction:
        raise TaskError(folder, "instruction.md is empty: write what the agent must do")
    cfg_file = folder / "task.toml"
    data = _toml(cfg_file.read_text(errors="replace"), folder) if cfg_file.is_file() else {}
    _check_keys(data, folder)
    if data.get("steps"):
        raise TaskError(folder, "multi-step tasks ([[steps]]) are not run by evolvekit yet; split it into one task "
                        "per step")
    env = data.get("environment") or {}
    if str(env.get("os", "linux")).lower() != "linux":
        raise TaskError(folder, f"[environment] os = {env.get('os')!r}: only Linux environments run here")
    if env.get("gpus"):
        raise TaskError(folder, "[environment] gpus: GPU tasks are not run by the harbor world yet")
    if not (folder / "environment").is_dir() and not env.get("docker_image"):
        raise TaskError(folder, "no environment/ folder (with a Dockerfile) and no [environment] docker_image")
    task_info = data.get("task") or {}
    name = str(task_info.get("name") or folder.name)
    return {
        "id": folder.name,
        "name": name,
        "path": str(folder),
        "instruction": instruction,
        "agent_timeout": _seconds(data, "agent", "timeout_sec", DEFAULTS["agent"], folder),
        "verifier_timeout": _seconds(data, "verifier", "timeout_sec", DEFAULTS["verifier"], folder),
        "build_timeout": _seconds(data, "environment", "build_timeout_sec", DEFAULTS["build"], folder),
        "memory_mb": _memory_mb(env, folder),
        "workdir": env.get("workdir"),
        "docker_image": env.get("docker_image"),
        "verifier_env": _env_table(data, "verifier", folder),
        "environment_env": _env_table(data, "environment", folder),
        "metadata": {k: v for k, v in (data.get("metadata") or {}).items() if isinstance(v, (str, int, float, bool, list))},
        "has_solution": (folder / "solution" / "solve.sh").is_file(),
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
            raise ConfigError(f"{s}: no such folder; give a Harbor task folder or a folder of them", path="dataset.source")
        if (p / "instruction.md").exists() or (p / "tests").is_dir():
            out.append(p)
            continue
        subs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith((".", "_")))
        tasks = [d for d in subs if (d / "instruction.md").exists() or (d / "task.toml").exists() or (d / "tests").is_dir()]
        if not tasks:
            raise ConfigError(f"{p} holds no Harbor task folders (each with instruction.md, task.toml, environment/ "
                              "and tests/test.sh)", path="dataset.source")
        out.extend(tasks)
    seen: dict[str, Path] = {}
    for p in out:
        if p.name in seen and seen[p.name] != p:
            raise ConfigError(f"two task folders are named {p.name!r} ({seen[p.name]} and {p}); a task's id is its "
                              "folder name: rename one", path="dataset.source")
        seen[p.name] = p
    return list(seen.values())


__all__ = ["KNOWN", "TaskError", "digest", "find_tasks", "load_task"]
