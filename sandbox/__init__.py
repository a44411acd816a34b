"""A real security boundary for model-written code.

`get_sandbox("process")` (default) runs code in a fresh bubblewrap sandbox per call: Linux
namespaces (no network but its own loopback, no host files but the interpreter and the ro_paths you
name), hard rlimits, a seccomp denylist, the whole process tree killed at the wall-clock limit.
`get_sandbox("docker")` runs it in a locked-down container. Only JSON crosses back. The threat
model (what is covered and what is not) is docs/sandbox.md.

* ``base`` — the :class:`Sandbox` protocol and the part the backends share (run, call, batches,
  reading results back);
* backends — ``process`` (bubblewrap), ``docker_backend`` (the engine's API);
* inside — ``_bootstrap`` (what runs first in the sandbox: rlimits, the uid drop, the request),
  ``_seccomp`` (the syscall denylist), ``_protocol`` (the request and result lines), ``_runner``
  (collecting a sandboxed process's channels), ``_paths`` (vetting ro_paths), ``_types``
  (limits, results, errors).

    from evolve.sandbox import get_sandbox, Limits
    box = get_sandbox()
    res = box.call("def add(a, b):\\n    return a + b\\n", "add", {"a": 1, "b": 2}, limits=Limits(wall_s=2))
    assert res.ok and res.value == 3
"""

from __future__ import annotations

from ._types import VERDICTS, Limits, SandboxResult, SandboxUnavailable
from .base import Sandbox

BACKENDS = ("process", "docker")

__all__ = ["BACKENDS", "VERDICTS", "Limits", "Sandbox", "SandboxResult", "SandboxUnavailable", "get_sandbox"]


def get_sandbox(backend: str = "process", **options) -> Sandbox:
    """A sandbox backend by name: "process" (bubblewrap) or "docker". Raises SandboxUnavailable,
    saying why and what would work, when the backend cannot run here; ValueError for other names."""
    if backend == "process":
        from .process import ProcessSandbox

        return ProcessSandbox(**options)
    if backend == "docker":
        from .docker_backend import DockerSandbox

        return DockerSandbox(**options)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
