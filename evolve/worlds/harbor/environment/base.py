"""What every backend of a Harbor task's environment is (:class:`Environment`), and what both share
(:class:`PhasedEnvironment`): the task's phases, the verifier, the oracle and a step's start, run as
Harbor runs them (:mod:`.phases`) over the backend's own commands and file operations.

A backend gives the commands (``run``: the episode's persistent shell; ``exec``/``sh``: a one-shot
command, as a user), the file operations the phases use (``reset``, ``upload``, ``executable``,
``fetch``), ``close``, and ``denied``: the phases it runs without the network Harbor's default
(``public``) would give them, whose verdict then says so (:attr:`PhasedEnvironment.offline`)."""

from __future__ import annotations

from typing import Any, Protocol

from evolve.worlds.harbor.environment import phases


class Environment(Protocol):
    backend: str
    workdir: str
    task: dict

    def run(self, command: str, *, timeout: float | None, user: str | None = None) -> Any: ...
    def exec(self, command: str, *, timeout: float | None, env: dict | None = None) -> Any: ...
    def sh(
        self,
        command: str,
        *,
        timeout: float | None,
        env: dict | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> Any: ...
    def verify(self, step: dict | None = None) -> dict: ...
    def solve(self, step: dict | None = None) -> Any: ...
    def start_step(self, step: dict, first: bool) -> dict | None: ...
    def reset(self, paths: list[str]) -> None: ...
    def upload(self, folder: str, inside: str, *, replace: bool = True, kind: str = "RuntimeError") -> None: ...
    def executable(self, inside: str) -> None: ...
    def fetch(self, inside: str, *, limit: int | None = None, tail_bytes: int | None = None) -> bytes | None: ...
    def close(self) -> None: ...


class PhasedEnvironment:
    """The phases of :class:`Environment`, the same on every backend (:mod:`.phases`); a backend
    subclasses it and gives the rest. ``offline``: what the verdict of a verifier that ran without
    the network says about this backend."""

    task: dict
    denied: list[str]
    offline = "none: the task leaves network_mode at Harbor's default (public), and this backend has no network"

    def verify(self, step: dict | None = None) -> dict:
        out = phases.verify(self, step)
        if "verifier" in self.denied:
            out["network"] = self.offline
        return out

    def solve(self, step: dict | None = None) -> Any:
        return phases.solve(self, step)

    def start_step(self, step: dict, first: bool) -> dict | None:
        return phases.start_step(self, step, first)


__all__ = ["Environment", "PhasedEnvironment"]
