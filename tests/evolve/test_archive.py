"""The archive: systems & lineage, trajectories, scores, pointer, state, export, diff, crash safety."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from evolve.archive import SCHEMA_VERSION, Archive, SystemRecord, diff, find_artifact_refs, load_export
from evolve.errors import ArchiveError, RunDirError, UserError
from evolve.types import Candidate, LLMCall, Message, ModelSpec, Reward, System, Trajectory

REPO = Path(__file__).resolve().parents[2]


def make_system(instruction: str = "Answer the question.", **kw) -> System:
    return System(
        models={"policy": ModelSpec(backend="scripted", name="x")}, prompts={"instruction": instruction}, **kw
    )


def make_traj(
    system_id: str,
    task: str = "t0",
    score: float | None = 0.5,
    *,
    sample: int = 0,
    tokens: int = 10,
    cost: float = 0.01,
    error: str | None = None,
    big: bool = False,
) -> Trajectory:
    steps = ()
    if big:
        steps = (
            LLMCall(
                role="policy",
                model="m",
                messages=(
                    Message(role="system", content="Be careful. " * 100),
                    Message(role="user", content=f"task {task}"),
                ),
                output="SELECT 1;",
                token_ids=tuple(range(50)),
                logprobs=tuple(-i / 7 for i in range(50)),
            ),
        )
    return Trajectory(
        task_id=task,
        system_id=system_id,
        steps=steps,
        output="42",
        error=error,
        reward=None if score is None else Reward(score=score, feedback=f"fb {task}"),
        tokens=tokens,
        cost=cost,
        sample=sample,
    )


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "run") as a:
        yield a


# ----------------------------------------------------------------------------- open / schema


def test_create_and_reopen(tmp_path):
    run = tmp_path / "run"
    with Archive(run) as a:
        sid = a.add_system(make_system())
        assert a.artifacts.root == run / "artifacts"
    assert (run / "archive.sqlite").is_file() and (run / "artifacts").is_dir()
    with Archive(run, create=False) as a:
        assert a.get_system(sid) == make_system()
        c = sqlite3.connect(run / "archive.sqlite")
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        c.close()


def test_missing_run_dir(tmp_path):
    with pytest.raises(RunDirError, match="not an evolvekit run directory.*no archive.sqlite"):
        Archive(tmp_path / "nope", create=False)
    assert not (tmp_path / "nope").exists()
    assert issubclass(RunDirError, UserError)


def test_foreign_or_newer_db(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "archive.sqlite").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(RunDirError, match="not an evolvekit archive"):
        Archive(tmp_path / "a", create=False)
    with Archive(tmp_path / "b"):
        pass
    c = sqlite3.connect(tmp_path / "b" / "archive.sqlite")
    c.execute("INSERT INTO schema_version VALUES (99, 0)")
    c.commit()
    c.close()
    with pytest.raises(ArchiveError, match="newer"):
        Archive(tmp_path / "b")


def test_closed(tmp_path):
    a = Archive(tmp_path / "r")
    a.close()
    a.close()
    with pytest.raises(ArchiveError, match="closed"):
        a.records()


# ----------------------------------------------------------------------------- systems & lineage


def test_add_system_idempotent_and_records(archive):
    s0, s1, s2 = make_system("a"), make_system("b"), make_system("c")
    i0 = archive.add_system(s0, info={"note": 1})
    assert i0 == s0.id
    assert archive.add_system(s0) == i0  # no-op
    i1 = archive.add_system(s1, parents=[i0], operator="reflect", rationale="why", generation=1)
    i2 = archive.add_candidate(Candidate(system=s2, parents=(i1, i0), operator="merge", info={"k": [1]}), generation=2)
    assert archive.add_system(s1, parents=[i0], operator="reflect") == i1
    recs = archive.records()
    assert [r.id for r in recs] == [i0, i1, i2]
    assert recs[0] == SystemRecord(i0, (), "init", "", 0, recs[0].created_at, {"note": 1})
    assert recs[1].parents == (i0,) and recs[1].operator == "reflect" and recs[1].rationale == "why"
    assert recs[2].parents == (i1, i0) and recs[2].generation == 2 and recs[2].info == {"k": [1]}
    assert archive.rediscoveries() == []
    assert archive.system_count() == 3 and archive.has_system(i2) and not archive.has_system("x")
    assert archive.record(i2[:6]) == recs[2]
    assert archive.children(i0) == [i1, i2]


def test_rediscovery_keeps_first_record(archive):
    i0 = archive.add_system(make_system("a"))
    i1 = archive.add_system(make_system("b"), parents=[i0], operator="mutate")
    # an operator on i1 produced i0's content again: no cycle, the record stands, it is noted
    assert archive.add_system(make_system("a"), parents=[i1], operator="revert", generation=3) == i0
    assert archive.record(i0).parents == ()
    assert archive.lineage(i0) == [i0]
    (r,) = archive.rediscoveries(i0)
    assert r["parents"] == [i1] and r["operator"] == "revert" and r["generation"] == 3


def test_unknown_parent_rejected(archive):
    with pytest.raises(ArchiveError, match="unknown parent"):
        archive.add_system(make_system(), parents=["deadbeef"])
    assert archive.records() == []
    with pytest.raises(TypeError):
        archive.add_system(make_system(), parents="abc")


def test_lineage_and_ancestors(archive):
    ids = [archive.add_system(make_system("root"))]
    for i in range(5):
        ids.append(archive.add_system(make_system(f"g{i}"), parents=[ids[-1]], generation=i + 1))
    other = archive.add_system(make_system("other"))
    merged = archive.add_system(make_system("merged"), parents=[ids[-1], other], operator="merge")
    assert archive.lineage(merged) == [merged, *reversed(ids)]
    assert archive.lineage(ids[0]) == [ids[0]]
    anc = archive.ancestors(merged)
    assert set(anc) == set(ids) | {other} and anc[0] in (ids[-1], other)


def test_get_system_prefix(archive):
    ids = [archive.add_system(make_system(f"p{i}")) for i in range(40)]
    sid = ids[7]
    assert archive.get_system(sid).id == sid
    assert archive.get_system(sid[:10].upper()).id == sid
    # 40 hex ids: some one-character prefix is shared by two of them
    first = [i[0] for i in ids]
    shared = next(c for c in first if first.count(c) > 1)
    with pytest.raises(ArchiveError, match="ambiguous") as e:
        archive.get_system(shared)
    assert sum(i in str(e.value) for i in ids if i[0] == shared) >= 2
    with pytest.raises(ArchiveError, match="no system"):
        archive.get_system("zzzz")
    with pytest.raises(ArchiveError):
        archive.get_system("")


def test_resolve_words(archive):
    with pytest.raises(ArchiveError, match="no current"):
        archive.resolve("current")
    with pytest.raises(ArchiveError, match="val score"):
        archive.resolve("best")
    with pytest.raises(ArchiveError, match="no system"):
        archive.resolve("baseline")
    i0 = archive.add_system(make_system("a"))
    i1 = archive.add_system(make_system("b"), parents=[i0], generation=1)
    i2 = archive.add_system(make_system("c"), parents=[i0], generation=1)
    archive.add_trajectories(
        [
            ("k0", "val", "eval", 0, make_traj(i0, score=0.2)),
            ("k1", "val", "eval", 1, make_traj(i1, score=0.9)),
            ("k2", "val", "eval", 1, make_traj(i2, score=0.5)),
            ("k3", "test", "eval", 1, make_traj(i2, score=1.0)),
            ("k4", "val", "train", 1, make_traj(i2, score=1.0)),
        ]
    )
    archive.set_current(i2)
    assert archive.resolve("baseline") == i0
    assert archive.resolve("best") == archive.best() == i1
    assert archive.resolve("Current") == i2
    assert archive.get_system("best").id == i1


# ----------------------------------------------------------------------------- trajectories & scores


def test_trajectories_roundtrip_and_dedup(archive):
    sid = archive.add_system(make_system())
    small = make_traj(sid, "t1")
    big = make_traj(sid, "t2", big=True, error="boom")
    noreward = make_traj(sid, "t3", score=None)
    assert (
        archive.add_trajectories(
            [
                ("a", "val", "eval", 0, small),
                ("b", "val", "eval", 0, big),
                ("c", "train", "rollout", 0, noreward),
                ("a", "val", "eval", 0, big),
            ]
        )
        == 3
    )
    assert archive.add_trajectories([("a", "val", "eval", 0, small), ("b", "val", "eval", 0, big)]) == 0
    assert archive.add_trajectories([]) == 0
    got = archive.get_trajectories(["a", "b", "c", "missing", "a"])
    assert got == {"a": small, "b": big, "c": noreward}
    assert archive.has_keys(["a", "x", "c"]) == {"a", "c"}
    assert archive.trajectories() == [small, big, noreward]
    assert archive.trajectories(sid, "val") == [small, big]
    assert archive.trajectories(phase="rollout") == [noreward]
    assert archive.trajectories(sid, limit=1) == [small]
    rows = archive.trajectory_rows(split="train")
    assert [(r.key, r.split, r.phase, r.generation) for r in rows] == [("c", "train", "rollout", 0)]
    c = sqlite3.connect(archive.path)
    assert c.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0] == 3
    assert c.execute("SELECT COUNT(*) FROM trajectory_data WHERE enc != 0").fetchone()[0] == 0  # raw by default
    c.close()
    with pytest.raises(TypeError):
        archive.add_trajectories([("d", "val", "eval", 0, {"not": "a trajectory"})])
    with pytest.raises(TypeError):
        archive.add_trajectories([("", "val", "eval", 0, small)])


def test_compressed_and_raw_blobs(tmp_path):
    big = make_traj(make_system().id, "big", big=True)
    small = make_traj(make_system().id, "small")
    with Archive(tmp_path / "r", compress=1) as a:
        sid = a.add_system(make_system("x" * 5000))
        a.add_trajectories([("z", "val", "eval", 0, big), ("s", "val", "eval", 0, small)])
    with Archive(tmp_path / "r") as a:
        a.add_trajectories([("r", "val", "eval", 0, big)])
        assert a.get_trajectories(["z", "r", "s"]) == {"z": big, "r": big, "s": small}
        assert a.get_system(sid) == make_system("x" * 5000)
    c = sqlite3.connect(tmp_path / "r" / "archive.sqlite")
    encs = dict(c.execute("SELECT t.key, d.enc FROM trajectories t JOIN trajectory_data d USING (seq)").fetchall())
    assert encs == {"z": 1, "s": 0, "r": 0}  # short blobs stay raw even when compressing
    size_z, size_r = (
        c.execute(
            "SELECT length(d.data) FROM trajectories t JOIN trajectory_data d USING (seq) WHERE key = ?", (k,)
        ).fetchone()[0]
        for k in ("z", "r")
    )
    assert size_z < size_r / 2
    assert c.execute("SELECT enc FROM systems").fetchone()[0] == 1
    c.close()


def test_many_keys_chunked(archive):
    sid = archive.add_system(make_system())
    rows = [(f"k{i}", "val", "eval", 0, make_traj(sid, f"t{i % 7}", score=(i % 4) / 4)) for i in range(1200)]
    assert archive.add_trajectories(rows) == 1200
    keys = [r[0] for r in rows] + ["nope"]
    assert archive.has_keys(keys) == set(keys[:-1])
    assert len(archive.get_trajectories(keys)) == 1200


def test_scores(archive):
    sid = archive.add_system(make_system())
    archive.add_trajectories(
        [
            ("1", "val", "eval", 0, make_traj(sid, "a", 1.0, sample=0)),
            ("2", "val", "eval", 0, make_traj(sid, "a", 0.0, sample=1)),
            ("3", "val", "eval", 0, make_traj(sid, "b", 0.5)),
            ("4", "val", "eval", 0, make_traj(sid, "c", None, error="crash")),  # no reward counts 0
            ("5", "test", "eval", 0, make_traj(sid, "a", 0.25)),
            ("6", "val", "train", 0, make_traj(sid, "a", 1.0)),
        ]
    )
    assert archive.score(sid, "val") == pytest.approx((1.5 / 4, 4))
    assert archive.score(sid, "val", "train") == (1.0, 1)
    assert archive.score(sid, "nope") is None
    assert archive.score("other", "val") is None
    assert archive.task_scores(sid, "val") == {"a": 0.5, "b": 0.5, "c": 0.0}
    assert archive.scores(sid) == {"test": (0.25, 1), "val": (pytest.approx(0.375), 4)}
    assert archive.all_scores("val") == {sid: (pytest.approx(0.375), 4)}
    assert [x[:2] for x in archive.score_summary(sid)] == [("test", "eval"), ("val", "eval"), ("val", "train")]


def test_usage_counts_and_cache(tmp_path):
    with Archive(tmp_path / "r") as a:
        assert a.usage() == {"rollouts": 0, "tokens": 0, "cost": 0.0, "calls": 0}
        a.add_trajectories(
            [(f"k{i}", "val", "eval", 0, make_traj("s", tokens=100, cost=0.5, big=True)) for i in range(3)]
        )
        assert a.usage() == {"rollouts": 3, "tokens": 300, "cost": 1.5, "calls": 3}  # one LLMCall step each
        a.add_trajectories(
            [
                ("k0", "val", "eval", 0, make_traj("s", tokens=100, cost=0.5)),
                ("k9", "val", "eval", 0, make_traj("s", tokens=1, cost=0.25)),
            ]
        )
        assert a.usage() == {"rollouts": 4, "tokens": 301, "cost": 1.75, "calls": 3}
        with Archive(tmp_path / "r") as other:  # another connection writes: the cache notices
            other.add_trajectories([("o", "val", "eval", 0, make_traj("s", tokens=9, cost=0.0, big=True))])
        assert a.usage() == {"rollouts": 5, "tokens": 310, "cost": 1.75, "calls": 4}
        with pytest.raises(RuntimeError):
            with a.transaction():
                a.add_trajectories([("t", "val", "eval", 0, make_traj("s", tokens=1000, big=True))])
                assert a.usage()["tokens"] == 1310 and a.usage()["calls"] == 5
                raise RuntimeError
        assert a.usage() == {"rollouts": 5, "tokens": 310, "cost": 1.75, "calls": 4}
        # test-split rollouts (the final scoring) are left out of what budgets see: incrementally...
        a.add_trajectories([("x", "test", "eval", 0, make_traj("s", tokens=7, cost=0.125, big=True))])
        assert a.usage() == {"rollouts": 6, "tokens": 317, "cost": 1.875, "calls": 5}
        assert a.usage(test=False) == {"rollouts": 5, "tokens": 310, "cost": 1.75, "calls": 4}
        a._usage = None  # ...and when recomputed from the table
        assert a.usage(test=False) == {"rollouts": 5, "tokens": 310, "cost": 1.75, "calls": 4}
        assert a.usage()["rollouts"] == 6
        assert a.max_calls() == 1
        assert a.rollout_metrics("s", "val") == {
            "cost": pytest.approx(1.75 / 5),
            "calls": pytest.approx(4 / 5),
            "latency": 0.0,
        }
        assert a.rollout_metrics("nobody", "val") == {}


# ----------------------------------------------------------------------------- pointer, state, events


def test_pointer_and_rollback(archive):
    i0 = archive.add_system(make_system("a"))
    i1 = archive.add_system(make_system("b"), parents=[i0])
    assert archive.current() is None
    archive.set_current(i0, "init")
    archive.set_current(i1)
    assert archive.current() == i1
    assert archive.rollback(i0[:5]) == i0
    assert archive.current() == i0
    assert [(s, r) for s, r, _ in archive.pointer_history()] == [(i0, "init"), (i1, "promote"), (i0, "rollback")]
    with pytest.raises(ArchiveError):
        archive.rollback("ffffffffffffffffff")
    with pytest.raises(ArchiveError):
        archive.set_current("nope")
    assert archive.current() == i0
    assert archive.has_system(i1)  # rollback deletes nothing


def test_append_only(archive):
    sid = archive.add_system(make_system())
    archive.add_trajectories([("k", "val", "eval", 0, make_traj(sid))])
    archive.set_current(sid)
    c = sqlite3.connect(archive.path)
    for stmt in (
        "UPDATE trajectories SET score = 1",
        "DELETE FROM trajectories",
        "DELETE FROM systems",
        "UPDATE pointer SET reason = 'x'",
        "DELETE FROM trajectory_data",
    ):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            c.execute(stmt)
    c.close()


def test_state_and_events(archive):
    assert archive.get_state("gen", 7) == 7
    archive.put_state("gen", 1)
    archive.put_state("gen", {"n": 2, "ids": ["a"]})
    archive.put_state("engine.seed", 3)
    assert archive.get_state("gen") == {"n": 2, "ids": ["a"]}
    assert archive.state_items("engine.") == {"engine.seed": 3}
    s1 = archive.log_event("generation_start", {"gen": 1})
    archive.log_event("promote", {"id": "x"})
    archive.log_event("generation_start", {"gen": 2})
    ev = archive.events()
    assert [e["kind"] for e in ev] == ["generation_start", "promote", "generation_start"]
    assert [e["gen"] for e in archive.events("generation_start")] == [1, 2]
    assert [e["kind"] for e in archive.events(since=s1)] == ["promote", "generation_start"]
    assert ev[1] == {"id": "x", "seq": ev[1]["seq"], "kind": "promote", "created_at": ev[1]["created_at"]}
    with pytest.raises(ValueError, match="reserved"):
        archive.log_event("bad", {"kind": "x"})
    with pytest.raises((TypeError, ValueError)):
        archive.put_state("bad", object())


def test_transaction_groups_writes(archive):
    sid = archive.add_system(make_system())
    with pytest.raises(KeyError):
        with archive.transaction():
            archive.add_trajectories([("k1", "val", "eval", 0, make_traj(sid))])
            archive.put_state("done", True)
            raise KeyError("x")
    assert archive.has_keys(["k1"]) == set() and archive.get_state("done") is None
    with archive.transaction():
        archive.add_trajectories([("k1", "val", "eval", 0, make_traj(sid))])
        try:  # a failed nested write rolls back to its savepoint only
            archive.add_system(make_system("orphan"), parents=["nope"])
        except ArchiveError:
            pass
        archive.put_state("done", True)
    assert archive.has_keys(["k1"]) == {"k1"} and archive.get_state("done") is True
    assert archive.system_count() == 1


def test_threads_share_one_archive(archive):
    sid = archive.add_system(make_system())
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for b in range(10):
                rows = [(f"{t}-{b}-{i}", "val", "eval", 0, make_traj(sid, f"t{i}")) for i in range(8)]
                archive.add_trajectories(rows)
                archive.add_trajectories(rows[:3])
                archive.score(sid, "val")
                archive.log_event("batch", {"t": t})
        except BaseException as e:  # noqa: BLE001  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert archive.usage()["rollouts"] == 6 * 10 * 8
    assert len(archive.events("batch")) == 60


# ----------------------------------------------------------------------------- export & diff


def test_export_with_artifacts(archive, tmp_path):
    adapter = archive.artifacts.put_bytes(b"lora weights" * 10, "adapter")
    tool = archive.artifacts.put_bytes(b"def f(): return 1\n", "tool_code")
    base = make_system()
    i0 = archive.add_system(base)
    s1 = System(
        models={"policy": ModelSpec(backend="local", name="tiny", adapter=adapter)},
        prompts={"instruction": "x"},
        tools={"f": {"code": tool.model_dump(mode="json"), "doc": "f"}},
    )
    i1 = archive.add_system(s1, parents=[i0], operator="sft", generation=1)
    archive.add_trajectories([("k", "val", "eval", 1, make_traj(i1, score=0.75))])
    archive.set_current(i1)
    dest = archive.export(i1[:8], tmp_path / "out" / "best")
    doc = json.loads((dest / "system.json").read_text())
    assert doc["id"] == i1 and doc["system"] == s1.model_dump(mode="json")
    assert doc["lineage"] == [i1, i0] and doc["record"]["operator"] == "sft" and doc["current"] is True
    assert doc["scores"]["val/eval"]["score"] == 0.75 and doc["scores"]["val/eval"]["n"] == 1
    assert {a["sha256"] for a in doc["artifacts"]} == {adapter.sha256, tool.sha256}
    system, store = load_export(dest)
    assert system == s1
    assert store.path(adapter).read_bytes() == b"lora weights" * 10
    assert store.path(tool) == dest / "artifacts" / tool.sha256[:2] / tool.sha256
    assert [p.name for p in dest.parent.iterdir()] == ["best"]  # no temp folder left
    # refuses to overwrite; an empty folder is fine
    with pytest.raises(RunDirError, match="refusing to overwrite"):
        archive.export(i1, dest)
    (tmp_path / "empty").mkdir()
    assert archive.export(i0, tmp_path / "empty") == tmp_path / "empty"
    assert load_export(tmp_path / "empty")[0] == base
    with pytest.raises(RunDirError):
        load_export(tmp_path / "nothing")


def test_export_missing_artifact_leaves_nothing(archive, tmp_path):
    s = make_system(memory={"snapshot": {"sha256": "ab" * 32, "kind": "memory_snapshot"}})
    sid = archive.add_system(s)
    with pytest.raises(ArchiveError, match="incomplete"):
        archive.export(sid, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == [tmp_path / "run"]


def test_find_artifact_refs():
    v = {
        "a": {"sha256": "x", "kind": "k", "size": 3},
        "b": [{"sha256": "y", "kind": "k2"}, {"sha256": "x", "kind": "k"}],
        "c": {"sha256": "z"},
    }
    assert [(r.sha256, r.kind, r.size) for r in find_artifact_refs(v)] == [("x", "k", 3), ("y", "k2", 0)]


def test_diff():
    a = make_system("one\ntwo", workflow={"topology": "single", "k": 1, "list": [1, 2]})
    b = System(
        models={"policy": ModelSpec(backend="scripted", name="x", adapter={"sha256": "abc", "kind": "adapter"})},
        prompts={"instruction": "one\nthree", "extra": "new"},
        workflow={"topology": "single", "k": 1.0, "list": [1, 3]},
    )
    d = diff(a, b)
    paths = [p for p, _, _ in d]
    assert paths == ["workflow.k", "workflow.list", "models.policy.adapter", "prompts.instruction", "prompts.extra"]
    assert d[0] == ("workflow.k", 1, 1.0)
    assert d[3] == ("prompts.instruction", "one\ntwo", "one\nthree")
    assert d[4] == ("prompts.extra", None, "new")
    assert diff(a, a) == []
    c = b.replace(
        models={"policy": ModelSpec(backend="scripted", name="x", adapter={"sha256": "def", "kind": "adapter"})}
    )
    assert diff(b, c) == [("models.policy.adapter.sha256", "abc", "def")]


# ----------------------------------------------------------------------------- crash safety

_WRITER = textwrap.dedent(
    """
    import sys
    import evolve.archive
    from evolve.archive import Archive
    evolve.archive._CKPT_BYTES = 64 << 10  # checkpoint often, so kills land in checkpoints too
    from evolve.types import Reward, System, ModelSpec, Trajectory, LLMCall, Message
    run, tag = sys.argv[1], sys.argv[2]
    a = Archive(run)
    root = a.add_system(System(prompts={"i": "root"}))
    step = LLMCall(role="policy", model="m", messages=(Message(role="user", content="x" * 3000),), output="y")
    b = 0
    while True:
        # overlapping keys: every batch replays half of the previous one
        rows = [(f"k{(b * 16 + i) // 2}-{i % 2}", "val", "eval", b, Trajectory(task_id=f"t{i}", system_id=root,
                 steps=(step,), reward=Reward(score=i / 16), tokens=1)) for i in range(32)]
        with a.transaction():
            a.add_trajectories(rows)
            a.add_system(System(prompts={"i": f"{tag}-{b}"}), parents=[root], generation=b)
            a.put_state("last_batch", b)
            a.log_event("batch", {"b": b})
        if b == 3:
            print("ready", flush=True)
        b += 1
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX only")
def test_sigkill_leaves_whole_transactions(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for round_, delay in enumerate((0.0, 0.05, 0.12, 0.3)):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, str(run), f"r{round_}"], stdout=subprocess.PIPE, env=env)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        assert p.returncode == -signal.SIGKILL

        c = sqlite3.connect(run / "archive.sqlite")
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("SELECT COUNT(*) - COUNT(DISTINCT key) FROM trajectories").fetchone()[0] == 0
        n_traj = c.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
        assert c.execute("SELECT COUNT(*) FROM trajectory_data").fetchone()[0] == n_traj
        assert (
            c.execute(
                "SELECT COUNT(*) FROM trajectories t LEFT JOIN trajectory_data d USING (seq) WHERE d.seq IS NULL"
            ).fetchone()[0]
            == 0
        )
        c.close()
        with Archive(run, create=False) as a:
            # each batch is one transaction: its system, state and event are all there or none
            events = a.events("batch")
            last = a.get_state("last_batch")
            assert events and events[-1]["b"] == last
            mine = [r for r in a.records() if r.generation == last and r.operator == "init" and r.parents]
            assert mine
            # the last batch's 32 rows (keys k{8b}..k{8b+15} x {0,1}) are all present
            keys = [f"k{(last * 16 + i) // 2}-{i % 2}" for i in range(32)]
            assert a.has_keys(keys) == set(keys)
            assert a.usage()["rollouts"] == n_traj
            got = a.get_trajectories(keys[:4])
            assert all(t.reward is not None for t in got.values())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_forked_child_cannot_use_parent_archive(archive):
    sid = archive.add_system(make_system())
    pid = os.fork()
    if pid == 0:  # child: every use refuses, close() leaves the parent's connection alone
        code = 0
        try:
            archive.records()
            code = 1
        except ArchiveError:
            pass
        except BaseException:  # noqa: BLE001 - any other failure is the exit code the parent checks
            code = 2
        archive.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    archive.add_trajectories([("k", "val", "eval", 0, make_traj(sid))])
    assert archive.has_keys(["k"]) == {"k"}


def test_background_checkpoint_keeps_wal_bounded(tmp_path, monkeypatch):
    import evolve.archive as archive_mod

    monkeypatch.setattr(archive_mod, "_CKPT_BYTES", 256 << 10)
    before = set(threading.enumerate())
    with Archive(tmp_path / "r") as a:
        sid = a.add_system(make_system())
        db = a.path
        size0 = db.stat().st_size
        for b in range(8):  # ~8 x 16 x 4 KiB pages: well past the 256 KiB threshold
            a.add_trajectories([(f"{b}-{i}", "val", "eval", 0, make_traj(sid, big=True)) for i in range(16)])
        deadline = time.time() + 10
        while db.stat().st_size <= size0 + (256 << 10) and time.time() < deadline:
            a.log_event("tick", {})  # each commit wakes the checkpointer
            time.sleep(0.05)
        assert db.stat().st_size > size0 + (256 << 10)  # pages were copied into the main file
        threads = [t for t in set(threading.enumerate()) - before if t.name.startswith("evolve-archive-checkpoint")]
        assert threads
    assert not any(t.is_alive() for t in threads)  # close() stops it
    assert not (tmp_path / "r" / "archive.sqlite-wal").exists()


def test_a_reader_never_sees_an_archive_without_its_schema(tmp_path, monkeypatch):
    """A run creating its archive while run_status (MCP) polls it: the reader sees no archive
    ("starting") or a whole one, never "not an evolvekit archive (no such table: schema_version)"."""
    import evolve.archive.store as store
    from evolve.mcp import views

    seen: list[dict] = []
    real = store.split_sql

    def midway(sql):
        for i, stmt in enumerate(real(sql)):
            if i == 1:  # the schema half written: what does a reader see now?
                seen.append(views.status(tmp_path / "run", "run", None, ""))
            yield stmt

    monkeypatch.setattr(store, "split_sql", midway)
    with Archive(tmp_path / "run"):
        seen.append(views.status(tmp_path / "run", "run", None, ""))
    assert seen[0]["state"] == "starting" and seen[0]["generation"] is None
    assert seen[1]["state"] != "starting" and "systems" in seen[1]
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")) == []
