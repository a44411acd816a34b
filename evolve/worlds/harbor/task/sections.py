"""``task.toml``'s sections as the harbor world runs them, by Harbor's own rules
(``harbor/models/task/config.py`` of Harbor 0.26): users, ``${VAR}`` env values, the network policy
of each phase, the verifier's environment, multi-step ``[[steps]]``, and what the world does not
run yet (refused by name, never ignored) or runs without enforcing (a note on the task).

* **env** (``[environment]``, ``[verifier]``, ``[solution]``, each step's ``[steps.verifier]``): a
  value that is exactly ``${VAR}`` or ``${VAR:-default}`` comes from the host's environment when the
  environment is opened, and only for a variable the user allowed (:mod:`.hostenv`; never stored in
  the task, so a secret never reaches a run's files); any other value is literal, as in Harbor.
* **network_mode** (``no-network`` | ``public``; ``allow_internet``, the older key, maps to them;
  Harbor's default is ``public``): each phase (agent, verifier) takes its own ``network_mode`` or
  the environment's. ``allowlist`` is refused (no egress filter here).
* **timeouts**: ``[agent] timeout_sec`` unset is no limit (Harbor's default), ``[verifier]`` 600 s,
  the build 600 s; a step's verifier 600 s unless its own says otherwise (Harbor's StepConfig).
* **a step's healthcheck** (``[steps.healthcheck]``, Harbor's HealthcheckConfig): ``command``
  (required), ``interval_sec`` 5, ``timeout_sec`` 30, ``start_period_sec`` 0, ``start_interval_sec``
  5, ``retries`` 3 (Harbor's defaults); run by :func:`evolve.worlds.harbor.environment.phases.healthcheck`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

NETWORK_MODES = ("no-network", "public", "allowlist")
STEP_KEYS = {"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"}


def env_table(data: dict, section: str, folder: Path, errors: Any) -> dict[str, str]:
    """``[section] env`` as written (templates kept: which host variables a task may read, and
    when, is :mod:`.hostenv`'s)."""
    table = data.get("env") or {}
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in table.items()
    ):
        raise errors.invalid(folder, f'task.toml: [{section}] env must be a table of strings, e.g. env = {{ A = "1" }}')
    return {k: str(v) for k, v in table.items()}


def user(data: dict, section: str, folder: Path, errors: Any) -> str | None:
    value = data.get("user")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise errors.invalid(folder, f"task.toml: [{section}] user must be a user name or a uid, got {value!r}")
    return str(value)


def _mode(table: dict, section: str, folder: Path, errors: Any, default: str | None) -> tuple[str | None, bool]:
    """(network mode, whether task.toml set it) of one section."""
    if table.get("allowed_hosts") or table.get("network_mode") == "allowlist":
        raise errors.unsupported(
            folder,
            f"task.toml: [{section}] network_mode = 'allowlist' (allowed_hosts): the "
            "harbor world has no egress filter to let only some hosts through yet",
        )
    mode = table.get("network_mode")
    if mode is not None and mode not in NETWORK_MODES:
        raise errors.invalid(folder, f"task.toml: [{section}] network_mode = {mode!r}; use 'no-network' or 'public'")
    if mode is None and isinstance(table.get("allow_internet"), bool):  # the older key, as Harbor maps it
        mode = "public" if table["allow_internet"] else "no-network"
    return (mode or default), mode is not None


def network(data: dict, folder: Path, errors: Any) -> dict[str, Any]:
    """``{"agent", "verifier"}``: each phase's mode, and ``declared``: the phases whose mode
    task.toml states (a phase left at Harbor's default ``public`` is not declared)."""
    base, base_set = _mode(data.get("environment") or {}, "environment", folder, errors, "public")
    out: dict[str, Any] = {"declared": []}
    for phase in ("agent", "verifier"):
        mode, own = _mode(data.get(phase) or {}, phase, folder, errors, None)
        out[phase] = mode or base
        if own or base_set:
            out["declared"].append(phase)
    venv = (data.get("verifier") or {}).get("environment") or {}
    if isinstance(venv, dict) and ("network_mode" in venv or "allow_internet" in venv or "allowed_hosts" in venv):
        mode, _ = _mode(venv, "verifier.environment", folder, errors, "public")
        out["verifier"] = mode
        out["declared"].append("verifier")
    return out


def refusals(data: dict, folder: Path, errors: Any) -> list[str]:
    """Refuse what the world does not run yet (``errors.unsupported``, naming the key); return the
    notes on what it runs without enforcing."""
    env = data.get("environment") or {}
    ver = data.get("verifier") or {}
    for key, what in (
        ("healthcheck", "a readiness healthcheck"),
        ("mcp_servers", "MCP servers for the agent"),
        ("tpu", "a TPU"),
        ("gpus", "GPUs"),
    ):
        if env.get(key):
            raise errors.unsupported(
                folder, f"task.toml: [environment] {key}: {what}, which the harbor world does not provide yet"
            )
    if ver.get("collect"):
        raise errors.unsupported(
            folder,
            "task.toml: [[verifier.collect]] hooks (commands in compose services), which "
            "the harbor world does not run yet",
        )
    notes = []
    for key, v in (("storage_mb", env.get("storage_mb")), ("storage", env.get("storage"))):
        if v is not None:
            notes.append(f"[environment] {key} = {v!r} is not enforced (no disk quota here)")
    if env.get("gpu_types"):
        notes.append("[environment] gpu_types has no effect without gpus")
    if env.get("skills_dir"):
        notes.append(
            f"[environment] skills_dir = {env['skills_dir']!r} is not read: it is for Harbor's installed "
            "agents, and the harbor world's agents do not load skills"
        )
    return notes


def cpus(env: dict, folder: Path, errors: Any) -> float | None:
    v = env.get("cpus")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v > 1024:
        raise errors.invalid(folder, f"task.toml: [environment] cpus must be a positive number, got {v!r}")
    return float(v)


def verifier_mode(data: dict, folder: Path, kind: Any, errors: Any) -> tuple[str, str | None]:
    """("shared" | "separate", the separate verifier's image or None: the task's own, afresh)."""
    ver = data.get("verifier") or {}
    mode = ver.get("environment_mode")
    venv = ver.get("environment")
    if mode not in (None, "shared", "separate"):
        raise errors.invalid(folder, f"task.toml: [verifier] environment_mode = {mode!r}; use 'shared' or 'separate'")
    if venv is not None and not isinstance(venv, dict):
        raise errors.invalid(folder, "task.toml: [verifier] environment must be a table ([verifier.environment])")
    if mode == "shared" and venv is not None:
        raise errors.invalid(
            folder,
            "task.toml: [verifier] environment_mode = 'shared' with a [verifier.environment]; "
            "omit one (Harbor refuses this too)",
        )
    if mode is None:
        mode = "separate" if venv is not None else "shared"
    if mode == "shared":
        return mode, None
    if kind(folder, "tests/Dockerfile") is not None or kind(folder, "tests/docker-compose.yaml") is not None:
        raise errors.unsupported(
            folder,
            "a separate verifier built from tests/Dockerfile (or a compose file), which "
            "the harbor world does not build yet; give [verifier.environment] docker_image",
        )
    unknown = sorted(
        set(venv or {})
        - {"docker_image", "network_mode", "allow_internet", "cpus", "memory_mb", "build_timeout_sec", "os"}
    )
    if unknown:
        raise errors.unsupported(
            folder,
            f"task.toml: [verifier.environment] {unknown[0]}, which the harbor world's "
            "separate verifier does not carry out yet",
        )
    image = (venv or {}).get("docker_image")
    return mode, (str(image) if image else None)


def artifacts(data: dict, folder: Path, errors: Any) -> list[dict[str, str]]:
    """``artifacts`` as ``[{"source"}]`` (absolute paths in the agent's environment)."""
    out = []
    for a in data.get("artifacts") or []:
        src = a if isinstance(a, str) else a.get("source") if isinstance(a, dict) else None
        if isinstance(a, dict) and (a.get("service") not in (None, "main") or a.get("exclude")):
            raise errors.unsupported(
                folder,
                "task.toml: an artifact from another compose service or with exclude, "
                "which the harbor world does not collect yet",
            )
        if not isinstance(src, str) or not src.startswith("/") or ".." in src.split("/"):
            raise errors.invalid(folder, f"task.toml: artifact {a!r} must name an absolute path without '..'")
        out.append({"source": src.rstrip("/") or "/"})
    return out


def min_reward(value: Any, where: str, folder: Path, errors: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"reward": float(value)}
    if isinstance(value, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    raise errors.invalid(folder, f"task.toml: {where} min_reward must be a number or a table of numbers, got {value!r}")


HEALTHCHECK_DEFAULTS = {
    "interval_sec": 5.0,
    "timeout_sec": 30.0,
    "start_period_sec": 0.0,
    "start_interval_sec": 5.0,
    "retries": 3,
}


def healthcheck(value: Any, where: str, folder: Path, errors: Any) -> dict[str, Any] | None:
    """A step's ``[steps.healthcheck]`` as ``{"command", "interval_sec", "timeout_sec",
    "start_period_sec", "start_interval_sec", "retries"}`` (Harbor's defaults filled in), or None;
    ``errors.invalid`` naming the field when it is malformed."""
    if value is None:
        return None
    at = f"task.toml: {where} healthcheck"
    if not isinstance(value, dict):
        raise errors.invalid(folder, f'{at} must be a table ([steps.healthcheck] with command = "..."), got {value!r}')
    unknown = sorted(set(value) - {"command", *HEALTHCHECK_DEFAULTS})
    if unknown:
        raise errors.invalid(
            folder,
            f"{at}: unknown key {unknown[0]!r}; Harbor's healthcheck has {sorted(['command', *HEALTHCHECK_DEFAULTS])}",
        )
    command = value.get("command")
    if not isinstance(command, str) or not command.strip():
        raise errors.invalid(folder, f"{at}: command must be a shell command (exit 0 means healthy), got {command!r}")
    out: dict[str, Any] = {"command": command}
    for key, default in HEALTHCHECK_DEFAULTS.items():
        v = value.get(key, default)
        if key == "retries":
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1000:
                raise errors.invalid(folder, f"{at}: retries must be a whole number from 0 to 1000, got {v!r}")
            out[key] = v
            continue
        positive = key == "timeout_sec"
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or v < 0
            or (positive and v == 0)
            or v > 86400
        ):
            raise errors.invalid(
                folder,
                f"{at}: {key} must be a {'positive' if positive else 'non-negative'} "
                f"number of seconds up to a day (86400), got {v!r}",
            )
        out[key] = float(v)
    return out


__all__ = [
    "HEALTHCHECK_DEFAULTS",
    "NETWORK_MODES",
    "STEP_KEYS",
    "artifacts",
    "cpus",
    "env_table",
    "healthcheck",
    "min_reward",
    "network",
    "refusals",
    "user",
    "verifier_mode",
]
