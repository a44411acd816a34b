"""`evolve mcp` driven the way a coding agent drives it: the official `mcp` SDK's client, over stdio
and over streamable HTTP, runs a whole job on the toy world (init, validate, dry run, start, poll,
report, compare, rollback); a run outlives a killed server and resume_run finishes it; every bad
call is an error result and the server goes on answering; a blank token beyond loopback is refused."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from tests.helpers import ROOT, stored_rollouts
from tests.mcp.client import SERVER, call, http_server, http_session, ok, stdio_session, toy_task, until_done

TOOLS = {
    "init_task",
    "validate_task",
    "dry_run",
    "start_run",
    "resume_run",
    "run_status",
    "wait_run",
    "stop_run",
    "report",
    "compare_systems",
    "show_trajectory",
    "list_runs",
    "promote",
    "rollback",
    "deploy_status",
    "traces_summary",
}
TOY = {
    "name": "toy",
    "description": "Adds two numbers.\nThe scripted model answers; the reward checks the sum.",
    "agent": "evolve.worlds.toy:agent",
    "reward": "evolve.worlds.toy:reward",
    "models": {
        "policy": {"backend": "scripted", "name": "scripted-adder", "params": {"reply": "evolve.worlds.toy:reply"}}
    },
    "prompts": {"instruction": "multiply"},
    "dataset": {"source": "evolve.worlds.toy:dataset"},
    "operators": [
        {
            "name": "scripted",
            "params": {"component": "instruction", "choices": ["add", "add carefully", "subtract", "multiply"]},
        }
    ],
    "budget": {"generations": 2},
    "extra": {"runner": {"name": "thread", "workers": 4, "timeout": 10}, "engine": {"minibatch": 12}},
}


async def _ignore(done, total, message) -> None:
    pass


async def _job(s, root: Path) -> str:
    """init -> validate -> dry_run -> start -> poll until done -> report -> compare; the run id."""
    made = await ok(s, "init_task", {"path": "tasks/adder.yaml", **TOY})
    assert made["task_file"] == "tasks/adder.yaml" and (root / "tasks" / "adder.yaml").is_file()
    assert made["yaml"].startswith("# Adds two numbers.\n# The scripted model answers")
    assert not [p for p in (root / "tasks").iterdir() if "draft" in p.name]  # the draft does not linger

    summary = await ok(s, "validate_task", {"path": "tasks/adder.yaml"})
    assert summary["operators"] == ["scripted"] and summary["sizes"] == {"train": 40, "val": 20, "test": 20}

    est = await ok(
        s, "dry_run", {"path": "tasks/adder.yaml", "sets": ["budget.generations=1"]}, progress_callback=_ignore
    )  # a client asking for progress is answered the same
    assert est["total"]["rollouts"] > 0 and "rollouts" in est["summary"]
    assert not (root / "runs").exists()  # a dry run writes nothing

    started = await ok(s, "start_run", {"path": "tasks/adder.yaml"})
    rid = started["run_id"]
    assert rid == "runs/toy-seed0" and started["state"] in ("starting", "running", "finished")
    st = await until_done(s, rid)
    assert st["state"] == "finished" and st["generation"] == 2 and st["report_ready"], st
    assert st["baseline"]["id"] and st["best"]["id"]

    rep = await ok(s, "report", {"run_id": rid})
    assert rep["best"]["system_id"] and rep["paired"]
    assert any("interval" in line for line in rep["reading"]), rep["reading"]

    cmp = await ok(s, "compare_systems", {"run_id": rid, "a": "baseline", "b": "best"})
    assert cmp["a"]["id"] == st["baseline"]["id"] and cmp["b"]["id"] == st["best"]["id"]
    assert "prompts" in json.dumps(cmp["diff"]) and cmp["tasks"]

    page = await ok(s, "show_trajectory", {"run_id": rid, "system": "best", "limit": 3})
    seq = page["rows"][0]["seq"]
    one = await ok(s, "show_trajectory", {"run_id": rid, "seq": seq})
    assert one["trajectory"]
    runs = await ok(s, "list_runs")
    assert [r["run_id"] for r in runs["runs"]] == [rid] and runs["runs"][0]["state"] == "finished"
    return rid


def test_a_whole_job_over_stdio_and_deploying_is_refused_without_allow_deploy(root):
    async def main():
        async with stdio_session(root) as s:
            names = {t.name for t in (await s.list_tools()).tools}
            assert names == TOOLS
            for t in (await s.list_tools()).tools:  # each has a description and a typed schema
                assert t.description and t.input_schema["type"] == "object"
            uris = {str(r.uri) for r in (await s.list_resources()).resources}
            assert {"evolvekit://docs/task-file-reference", "evolvekit://docs/mcp", "evolvekit://docs/skill"} <= uris
            ref = await s.read_resource("evolvekit://docs/task-file-reference")
            assert "budget" in ref.contents[0].text

            rid = await _job(s, root)
            for tool, args in (("rollback", {"run_id": rid}), ("promote", {"path": "tasks/adder.yaml", "run_id": rid})):
                err, msg = await call(s, tool, args)
                assert err and "--allow-deploy" in msg, msg
            dep = await ok(s, "deploy_status", {"run_id": rid})
            assert [e for e in dep["trail"] if e.get("to") == "rolled_back"] == []

    anyio.run(main)


def test_a_whole_job_over_streamable_http_with_a_token_and_a_rollback(root):
    import httpx2

    with http_server(root, "--allow-deploy", "--token", "s3cret") as (proc, url):
        assert httpx2.post(url, json={}).status_code == 401  # no token
        assert httpx2.post(url, json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401

        async def main():
            async with http_session(url, token="s3cret") as s:
                assert {t.name for t in (await s.list_tools()).tools} == TOOLS
                rid = await _job(s, root)
                st = await ok(s, "run_status", {"run_id": rid})
                back = await ok(s, "rollback", {"run_id": rid, "system": "baseline", "why": "testing"})
                assert back["system"] == st["baseline"]["id"]
                dep = await ok(s, "deploy_status", {"run_id": rid})
                assert dep["active"] == st["baseline"]["id"] and dep["problems"] == []
                assert dep["trail"][-1]["by"] == "evolve-mcp"

        anyio.run(main)
        assert proc.poll() is None


SLOW_AGENT = """
import time
from pathlib import Path

from evolve.worlds.toy import agent as toy_agent


def agent(task, ctx):
    if (Path(__file__).parent / "SLOW").exists():
        time.sleep(0.25)
    return toy_agent(task, ctx)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_killing_the_server_leaves_the_run_unharmed_and_resume_run_finishes_it(root):
    (root / "slow_toy.py").write_text(SLOW_AGENT)
    (root / "SLOW").touch()
    toy_task(
        root,
        "slow.yaml",
        agent="slow_toy:agent",
        runner={"name": "thread", "workers": 2, "timeout": 30},
        budget={"generations": 1},
    )
    run = root / "runs" / "toy-seed0"

    with http_server(root) as (proc, url):

        async def start():
            async with http_session(url) as s:
                return (await ok(s, "start_run", {"path": "slow.yaml"}))["run_id"]

        rid = anyio.run(start)
        deadline = time.monotonic() + 60
        while stored_rollouts(run) < 2:
            assert time.monotonic() < deadline, (run / "mcp" / "run.log").read_text()
            time.sleep(0.1)
        proc.kill()  # the server dies (-9) in the middle of the run
        proc.wait()
    pid = json.loads((run / "mcp" / "job.json").read_text())["pid"]
    before = stored_rollouts(run)
    deadline = time.monotonic() + 30
    while stored_rollouts(run) <= before:  # the run goes on without its server
        assert _alive(pid) and time.monotonic() < deadline
        time.sleep(0.1)
    assert _alive(pid)

    with http_server(root) as (proc, url):  # a new server finds it, stops it, and resume_run finishes it

        async def finish():
            async with http_session(url) as s:
                st = await ok(s, "run_status", {"run_id": rid})
                assert st["state"] == "running" and st["pid"] == pid
                err, msg = await call(s, "resume_run", {"run_id": rid})
                assert err and "running already" in msg
                stopped = await ok(s, "stop_run", {"run_id": rid, "timeout_s": 20})
                assert stopped["state"] == "stopped" and stopped["signal"] == "SIGINT", stopped
                kept = stored_rollouts(run)
                (root / "SLOW").unlink()
                resumed = await ok(s, "resume_run", {"run_id": rid})
                assert resumed["attempts"] == 2
                progress = []

                async def note(done, total, message):
                    progress.append(message)

                st = await ok(s, "wait_run", {"run_id": rid, "timeout_s": 60, "poll_s": 0.2}, progress_callback=note)
                assert st["state"] == "finished" and st["report_ready"], st
                assert progress and progress[0].startswith("generation")
                rep = await ok(s, "report", {"run_id": rid})
                assert rep["stop_reason"] == "generations done"
                return kept

        kept = anyio.run(finish)
    assert not _alive(pid) and stored_rollouts(run) >= kept


def _bad_calls(rid: str, outside: Path) -> list[tuple[str, dict, str]]:
    """(tool, arguments, a part of the message) for calls that must each be refused."""
    init = {k: TOY[k] for k in ("name", "description", "models")}
    return [
        ("run_status", {"run_id": "no/such/run"}, "unknown run"),
        ("run_status", {}, "run_id"),
        ("run_status", {"run_id": 7}, "string"),
        ("run_status", {"run_id": None}, "run_id"),
        ("run_status", {"run_id": "../../etc"}, "climbs"),
        ("run_status", {"run_id": "/etc"}, "outside"),
        ("run_status", {"run_id": "x" * 100_000}, "run_id"),  # a huge argument
        ("run_status", {"run_id": "toy.yaml"}, "not a folder"),
        ("report", {"run_id": "."}, "no run"),
        ("run_status", {"run_id": "broken_run"}, "not a database"),  # a corrupt archive
        ("validate_task", {"path": str(outside / "task.yaml")}, "outside"),
        ("validate_task", {"path": "link_out/task.yaml"}, "outside"),  # a symlink that leads out
        ("validate_task", {"path": "broken.yaml"}, "broken.yaml"),  # not YAML
        ("validate_task", {"path": "typo.yaml"}, "budgit"),
        ("validate_task", {"path": "missing.yaml"}, "does not exist"),
        ("validate_task", {"path": "runs"}, "folder"),
        ("validate_task", {"path": "toy.yaml\x00.py"}, "NUL"),
        ("validate_task", {"path": "~/toy.yaml"}, "~"),
        ("validate_task", {"path": ""}, "path"),
        ("validate_task", {"path": "toy.yaml", "sets": ["no_equals_sign"]}, "sets"),
        ("validate_task", {"path": "toy.yaml", "sets": "budget.generations=2"}, "list"),
        ("validate_task", {"path": "toy.yaml", "sets": ["budget.generations=lots"]}, "generations"),
        ("validate_task", {"path": "toy.yaml", "sets": ["seed=1"] * 1000}, "sets"),
        ("dry_run", {"path": "broken.yaml"}, "broken.yaml"),
        ("dry_run", {"path": 3.5}, "string"),
        ("init_task", {"path": str(outside / "new.yaml"), **init}, "outside"),
        ("init_task", {"path": "new.txt", **init}, ".yaml"),
        ("init_task", {"path": "toy.yaml", **init}, "exists"),
        ("init_task", {"path": "new.yaml", **init, "name": "bad name; rm -rf /"}, "name"),
        ("init_task", {"path": "new.yaml", **init, "models": "gpt-4o"}, "models"),
        ("init_task", {"path": "new.yaml", **init, "description": "x" * 1_000_000}, "description"),
        ("init_task", {"path": "new.yaml", **init, "extra": {"name": "other"}}, "extra repeats"),
        (
            "init_task",
            {
                "path": "new.yaml",
                **init,
                "agent": "no_such_module:agent",
                "reward": "evolve.worlds.toy:reward",
                "dataset": {"source": "evolve.worlds.toy:dataset"},
            },
            "no_such_module",
        ),
        ("init_task", {"path": "new.yaml", **init, "models": {"policy": {"name": "m", "bogus": 1}}}, "bogus"),
        ("start_run", {"path": "toy.yaml", "out": str(outside / "run")}, "outside"),
        ("start_run", {"path": "toy.yaml", "out": rid}, "already holds a run"),
        ("start_run", {"path": "broken.yaml"}, "broken.yaml"),
        ("resume_run", {"run_id": "nope"}, "unknown run"),
        ("resume_run", {"run_id": rid, "sets": ["budget.generations"]}, "sets"),
        ("stop_run", {"run_id": "nope"}, "unknown run"),
        ("stop_run", {"run_id": rid, "timeout_s": "soon"}, "timeout_s"),
        ("wait_run", {"run_id": rid, "timeout_s": 0}, "timeout_s"),
        ("compare_systems", {"run_id": rid, "a": "zzzz"}, "zzzz"),
        ("compare_systems", {"run_id": rid, "b": "x; rm -rf /"}, "b"),
        ("compare_systems", {"run_id": rid, "other_run_id": "elsewhere"}, "unknown run"),
        ("show_trajectory", {"run_id": rid, "seq": 10**15}, "10"),
        ("show_trajectory", {"run_id": rid, "seq": -1}, "seq"),
        ("show_trajectory", {"run_id": rid, "split": "prod"}, "split"),
        ("show_trajectory", {"run_id": rid, "limit": 10**6}, "limit"),
        ("list_runs", {"folder": "/"}, "outside"),
        ("promote", {"path": "toy.yaml", "run_id": rid}, "--allow-deploy"),
        ("rollback", {"run_id": rid}, "--allow-deploy"),
        ("deploy_status", {"run_id": rid, "traces": "nowhere"}, "does not exist"),
        ("traces_summary", {"store": "."}, "trace store"),
        ("traces_summary", {"store": "toy.yaml"}, "not a folder"),
        ("traces_summary", {"store": "runs", "sessions": 10**9}, "sessions"),
    ]


def test_every_bad_call_is_an_error_result_and_the_server_keeps_answering(root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    toy_task(outside, "task.yaml")
    (root / "link_out").symlink_to(outside, target_is_directory=True)
    (root / "broken.yaml").write_text("name: toy\nmodels: [unclosed\n  - : :\n")
    toy_task(root, "typo.yaml", budgit={"generations": 1})
    (root / "broken_run").mkdir()
    (root / "broken_run" / "archive.sqlite").write_bytes(b"not SQLite at all" * 100)

    async def main():
        async with stdio_session(root) as s:
            rid = (await ok(s, "start_run", {"path": "toy.yaml", "sets": ["budget.generations=0"]}))["run_id"]
            assert (await until_done(s, rid))["state"] == "finished"
            bad = _bad_calls(rid, outside)
            assert len(bad) >= 30
            failures = []
            for tool, args, part in bad:
                err, msg = await call(s, tool, args)
                if not (err and msg and part.lower() in msg.lower() and "Traceback" not in msg):
                    failures.append((tool, {k: str(v)[:60] for k, v in args.items()}, err, str(msg)[:300]))
                # the server answers the next call as before
                assert (await ok(s, "run_status", {"run_id": rid}))["state"] == "finished"
            assert not failures, failures
            try:  # an unknown tool: an error, whichever way the SDK reports it
                err, msg = await call(s, "rm_rf", {"path": "/"})
                assert err and "rm_rf" in msg
            except Exception as e:  # noqa: BLE001 - an MCP error response
                assert "rm_rf" in str(e)
            runs = {r["run_id"]: r for r in (await ok(s, "list_runs"))["runs"]}
            assert runs[rid]["state"] == "finished" and runs["broken_run"]["state"] == "unreadable"
            assert not (root / "new.yaml").exists() and not (outside / "new.yaml").exists()
            assert sorted(p.name for p in outside.iterdir()) == ["task.yaml"]

    anyio.run(main)


@pytest.mark.parametrize("token", ["", "   ", "\t", None])
def test_beyond_loopback_a_blank_or_missing_token_is_refused_at_startup(tmp_path, token):
    env = {k: v for k, v in os.environ.items() if k != "EVOLVE_MCP_TOKEN"}
    args = [*SERVER, "--root", str(tmp_path), "--http", "--host", "0.0.0.0", "--port", "0"]
    args += ["--token", token] if token is not None else []
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert ("token" in r.stderr and "blank" in r.stderr) if token is not None else "needs a token" in r.stderr


def test_a_blank_token_in_the_environment_is_refused_too(tmp_path):
    r = subprocess.run(
        [*SERVER, "--root", str(tmp_path), "--http", "--host", "0.0.0.0"],
        cwd=ROOT,
        env={**os.environ, "EVOLVE_MCP_TOKEN": "  "},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "blank" in r.stderr, r


def test_a_root_that_is_not_a_folder_is_refused_at_startup(tmp_path):
    r = subprocess.run(
        [*SERVER, "--root", str(tmp_path / "nothing")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and "not a folder" in r.stderr, r


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_on_loopback_other_host_headers_are_refused(root, host):
    """DNS rebinding: a page on evil.example that resolves to 127.0.0.1 cannot drive the server."""
    import httpx2

    with http_server(root, "--host", host) as (proc, url):
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        accept = {"Accept": "application/json, text/event-stream"}
        r = httpx2.post(url, json=init, headers={**accept, "Host": "evil.example:80"})
        assert r.status_code == 421 and "Invalid Host" in r.text
        r = httpx2.post(url, json=init, headers={**accept, "Origin": "http://evil.example"})
        assert r.status_code == 403
        assert url.startswith(f"http://{host}:")

        async def main():
            async with http_session(url) as s:
                assert (await ok(s, "list_runs"))["runs"] == []

        anyio.run(main)
