"""What a call may ask of `evolve mcp`, over the SDK's client: every tool has a title, a described
argument each and a schema that admits nothing else, and a misnamed argument is refused with the
right name (it used to be dropped: dry_run(overrides=...) answered the full budget); a run folder is
never a --root folder or one holding a root, and fresh=true moves aside only a run folder."""

from __future__ import annotations

import anyio

from evolve.archive import Archive
from tests.mcp.client import call, ok, stdio_session, toy_task


def test_every_tool_has_a_title_and_described_arguments_and_an_unknown_argument_is_refused(root):
    async def main():
        async with stdio_session(root) as s:
            tools = (await s.list_tools()).tools
            assert len(tools) == 16
            for t in tools:
                assert t.title and t.annotations.title == t.title, t.name
                schema = t.input_schema
                assert schema.get("additionalProperties") is False, t.name
                bare = [k for k, v in schema["properties"].items() if not v.get("description")]
                assert not bare, (t.name, bare)

            err, msg = await call(s, "dry_run", {"path": "toy.yaml", "overrides": ["budget.generations=1"]})
            assert err and "no argument 'overrides'" in msg and "did you mean 'sets'?" in msg, msg
            err, msg = await call(s, "start_run", {"path": "toy.yaml", "set": ["budget.generations=0"]})
            assert err and "did you mean 'sets'?" in msg, msg
            assert not (root / "runs").exists()  # nothing started with the full budget
            err, msg = await call(s, "run_status", {"run_id": "runs/x", "runid": "runs/y"})
            assert err and "did you mean 'run_id'?" in msg, msg
            err, msg = await call(s, "wait_run", {"run_id": "runs/x", "timeout": 5})
            assert err and "did you mean 'timeout_s'?" in msg, msg
            err, msg = await call(s, "list_runs", {"colour": "blue"})
            assert err and "'colour'" in msg and "list_runs takes folder" in msg, msg

            est = await ok(s, "dry_run", {"path": "toy.yaml", "sets": ["budget.generations=1"]})
            full = await ok(s, "dry_run", {"path": "toy.yaml"})
            assert est["total"]["rollouts"] < full["total"]["rollouts"]

    anyio.run(main)


def test_a_run_folder_is_never_a_root_or_above_one_and_fresh_moves_only_a_run_folder(root):
    inner = root / "inner"
    inner.mkdir()
    toy_task(inner)
    notes = root / "notes"
    notes.mkdir()
    (notes / "archive.sqlite").write_text("the user's own file, not an evolvekit archive")
    (notes / "keep.txt").write_text("mine")
    before = sorted(p.name for p in root.iterdir())
    go = {"path": "toy.yaml", "sets": ["budget.generations=0"]}

    async def main():
        async with stdio_session(root, "--root", str(inner)) as s:
            for out in (".", str(root), "inner", str(inner)):
                for fresh in (False, True):
                    err, msg = await call(s, "start_run", {**go, "out": out, "fresh": fresh})
                    assert err and "--root folder" in msg, (out, fresh, msg)
            err, msg = await call(s, "start_run", {**go, "out": "notes", "fresh": True})
            assert err and "not an evolvekit archive" in msg, msg
            with Archive(inner):  # a run someone started in a root with `evolve run --out .`
                pass
            err, msg = await call(s, "resume_run", {"run_id": str(inner), "path": "toy.yaml"})
            assert err and "--root folder" in msg, msg
            rid = (await ok(s, "start_run", {**go, "out": "runs/ok"}))["run_id"]  # a folder of its own is fine
            assert rid == "runs/ok"

    anyio.run(main)
    assert sorted(p.name for p in root.iterdir()) == sorted([*before, "runs"])
    assert sorted(p.name for p in notes.iterdir()) == ["archive.sqlite", "keep.txt"]
    assert not (inner / "mcp").exists()


def test_list_runs_shows_a_run_as_soon_as_it_is_started(root):
    """start_run answers before the run's archive exists; list_runs lists it at once (it used to
    omit it until the archive was written)."""

    async def main():
        async with stdio_session(root) as s:
            started = await ok(s, "start_run", {"path": "toy.yaml", "sets": ["budget.generations=1"]})
            listed = await ok(s, "list_runs")
            rows = {r["run_id"]: r for r in listed["runs"]}
            assert started["run_id"] in rows, listed
            assert rows[started["run_id"]]["state"] in ("starting", "running", "finished"), rows
            await ok(s, "stop_run", {"run_id": started["run_id"], "timeout_s": 10})

    anyio.run(main)


def test_an_override_that_looks_like_a_flag_is_refused_by_name_and_values_are_never_read_as_flags(root):
    async def main():
        async with stdio_session(root) as s:
            for tool in ("validate_task", "dry_run", "start_run"):
                err, msg = await call(s, tool, {"path": "toy.yaml", "sets": ["--out=/x"]})
                assert err and "'--out=/x' is a command-line flag" in msg and "usage:" not in msg.lower(), (tool, msg)
            assert not (root / "runs").exists() and not __import__("pathlib").Path("/x").exists()
            summary = await ok(s, "validate_task", {"path": "toy.yaml", "sets": ["name=--help"]})
            assert summary["name"] == "--help"  # a value that looks like a flag is the value

    anyio.run(main)
