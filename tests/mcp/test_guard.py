"""What an MCP client's task may make the server's user run or touch (docs/mcp.md, evolve/mcp/guard.py):
over the SDK's client, an import path in every kind of task-file field that names code outside the
--root folders (os:system, subprocess, evolvekit code no registry holds, a stdlib function reached
through the task's own module) is refused before it runs, naming the field; a path-bearing field
(a tracker's sqlite:/// or file: URI, a memory store, a dataset file, an out folder, ...) that leads
out of the roots is refused too; the task's own code and evolvekit's registered parts still work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import yaml

from tests.mcp.client import call, http_server, http_session, ok, stdio_session, toy_task

HELPERS = """
import os
from subprocess import run


def agent(task, ctx):
    from evolve.worlds.toy import agent as toy_agent

    return toy_agent(task, ctx)
"""


def _task(root: Path, name: str, change: Any) -> str:
    """The toy task with ``change`` (a function of its dict) applied, written as ``name``."""
    path = toy_task(root, name)
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return name


def _set(dotted: str, value: Any) -> Any:
    def change(data: dict) -> None:
        node = data
        keys = dotted.split(".")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[keys[-1]] = value

    return change


def _by_world(data: dict) -> None:
    for key in ("agent", "reward", "dataset"):
        data.pop(key)
    data["world"] = "toy"


def _code_cases(marker: Path) -> list[tuple[str, Any, str]]:
    """(field named in the message, change, a part of the message) for an import path in each kind of field."""
    shell = {"command": f"touch {marker}"}
    foreign = "not the task's own code"
    return [
        ("dataset.source", lambda d: d.update(dataset={"source": "os:system", "params": shell}), foreign),
        ("agent", _set("agent", "os:system"), foreign),
        ("reward", _set("reward", "subprocess:run"), foreign),
        ("world", _set("world", "os:system"), foreign),
        ("operators.0.name", _set("operators", [{"name": "os:system"}]), foreign),
        (
            "operators.0.params.extract",
            _set("operators", [{"name": "memory", "params": {"extract": "os:system"}}]),
            foreign,
        ),
        (
            "operators.0.params.model.params.reply",
            _set(
                "operators",
                [
                    {
                        "name": "prompt_mutation",
                        "params": {"model": {"backend": "scripted", "name": "m", "params": {"reply": "os:system"}}},
                    }
                ],
            ),
            foreign,
        ),
        ("models.policy.params.reply", _set("models.policy.params.reply", "os:system"), foreign),
        ("models.policy.cold_start.demos", _set("models.policy.cold_start", {"demos": "os:system"}), foreign),
        (
            "dataset.params.server",
            lambda d: d.update(dataset={"source": "evolve.worlds.env:dataset", "params": {"server": "os:system"}}),
            foreign,
        ),
        ("track.0.name", _set("track", [{"name": "subprocess:run"}]), foreign),
        ("runner.name", _set("runner.name", "os:system"), foreign),
        ("engine.stopping", _set("engine.stopping", "os:system"), foreign),
        ("deploy.regression.reward", _set("deploy", {"regression": {"reward": "os:system"}}), foreign),
        ("agent", _set("agent", "evolve.cli.commands:main"), "evolvekit code"),  # registered nowhere
        ("dataset.source", _set("dataset.source", "evolve.worlds.sql:build"), "evolvekit code"),  # not a dataset
        ("runner.params.runtime_env", _set("runner.params", {"runtime_env": {"pip": ["evil"]}}), "installs"),
        # the task's own module is imported, but what the path reaches through it is not the task's code
        ("agent", _set("agent", "helpers:os.system"), "reaches into the module 'os'"),
        ("agent", _set("agent", "helpers:os.environ"), "reaches into the module 'os'"),
        (
            "dataset.source",
            lambda d: d.update(dataset={"source": "helpers:run", "params": {"args": ["touch", str(marker)]}}),
            "subprocess",
        ),
    ]


def test_an_import_path_in_any_field_may_name_only_the_tasks_own_code_or_evolvekits_registered_parts(root):
    marker = root.parent / "PWNED"
    (root / "helpers.py").write_text(HELPERS)
    cases = _code_cases(marker)

    async def main():
        async with stdio_session(root) as s:
            failures = []
            for i, (field, change, part) in enumerate(cases):
                name = _task(root, f"code{i}.yaml", change)
                err, msg = await call(s, "validate_task", {"path": name})
                if not (err and field in msg and part in msg and "Traceback" not in msg):
                    failures.append((field, err, str(msg)[:400]))
            assert not failures, failures
            err, msg = await call(s, "validate_task", {"path": "toy.yaml", "sets": ["agent=os:system"]})
            assert err and "agent" in msg and "not the task's own code" in msg  # an override is checked too
            err, msg = await call(s, "start_run", {"path": "code0.yaml"})
            assert err and "dataset.source" in msg and not (root / "runs").exists()
            # what is allowed still works: the task's own function, evolvekit's registered world parts
            mine = _task(root, "mine.yaml", _set("agent", "helpers:agent"))
            assert (await ok(s, "validate_task", {"path": mine}))["agent"] == "helpers:agent"
            world = _task(root, "world.yaml", _by_world)
            assert (await ok(s, "validate_task", {"path": world}))["agent"] == "evolve.worlds.toy:agent"
        assert not marker.exists(), "a client's task ran a command"

    anyio.run(main)


def test_init_task_naming_os_system_runs_nothing_over_http(root):
    marker = root.parent / "PWNED"
    args = {
        "path": "evil.yaml",
        "name": "evil",
        "description": "d",
        "agent": "evolve.worlds.toy:agent",
        "reward": "evolve.worlds.toy:reward",
        "models": {"policy": {"backend": "scripted", "name": "m"}},
        "dataset": {"source": "os:system", "params": {"command": f"touch {marker}"}},
    }
    with http_server(root) as (proc, url):

        async def main():
            async with http_session(url) as s:
                err, msg = await call(s, "init_task", args)
                assert err and "dataset.source" in msg and "'os'" in msg, msg

        anyio.run(main)
    assert not marker.exists() and not (root / "evil.yaml").exists()


def _path_cases(out: Path) -> list[tuple[str, Any]]:
    """(field, change) for a path-bearing field that leads out of the roots."""
    mlflow = lambda uri: _set("track", [{"name": "mlflow", "params": {"tracking_uri": uri}}])  # noqa: E731
    return [
        ("track.0.params.tracking_uri", mlflow(f"sqlite:///{out}/mlflow.db")),
        ("track.0.params.tracking_uri", mlflow(f"file://{out}/mlruns")),
        ("track.0.params.tracking_uri", mlflow(str(out / "mlruns"))),
        ("track.0.params.tracking_uri", mlflow("postgresql://db.example/mlflow")),
        ("track.0.params.dir", _set("track", [{"name": "wandb", "params": {"dir": str(out)}}])),
        ("memory.store", _set("memory", {"store": str(out / "memory")})),
        (
            "operators.0.params.store",
            _set(
                "operators",
                [
                    {
                        "name": "memory",
                        "params": {"extract": "evolve.worlds.sql:experiences", "store": str(out / "memory")},
                    }
                ],
            ),
        ),
        ("tools", _set("tools", str(out / "tools.json"))),
        ("out", _set("out", str(out / "run"))),
        ("dataset.train", lambda d: d.update(dataset={"train": "link_out/train.jsonl", "val": "val.jsonl"})),
        ("dataset.params.root", lambda d: d.update(world="sql", dataset={"params": {"root": "../../elsewhere"}})),
        ("deploy.regression.tasks", _set("deploy", {"regression": {"tasks": str(out / "suite.jsonl")}})),
        (
            "models.policy.params.weights",
            _set("models.policy", {"backend": "local", "name": "m", "params": {"weights": str(out / "base.pt")}}),
        ),
    ]


def test_a_path_bearing_field_must_stay_in_the_roots(root, tmp_path):
    out = tmp_path / "outside"
    out.mkdir()
    (out / "train.jsonl").write_text('{"id": "a", "a": 1, "b": 2, "answer": 3}\n')
    (root / "val.jsonl").write_text('{"id": "v", "a": 1, "b": 2, "answer": 3}\n')
    (root / "link_out").symlink_to(out, target_is_directory=True)
    cases = _path_cases(out)

    async def main():
        async with stdio_session(root) as s:
            failures = []
            for i, (field, change) in enumerate(cases):
                name = _task(root, f"path{i}.yaml", change)
                err, msg = await call(s, "validate_task", {"path": name})
                if not (err and field in msg and ("outside" in msg or "tracking URI" in msg)):
                    failures.append((field, err, str(msg)[:400]))
            assert not failures, failures
            inside = _task(
                root,
                "inside.yaml",
                _set("track", [{"name": "mlflow", "params": {"tracking_uri": "sqlite:///mlflow.db"}}]),
            )  # relative to the run's folder: the first root
            err, msg = await call(s, "validate_task", {"path": inside})
            assert not err or "tracking_uri" not in msg, msg
        assert sorted(p.name for p in out.iterdir()) == ["train.jsonl"]

    anyio.run(main)
