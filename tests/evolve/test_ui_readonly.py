"""Browsing leaves what it reads as it was: no ``-wal``/``-shm`` beside a gateway's trace store or a
run's memory store (closed or still being written), no server path in what the page is told, and a
split that is not one is refused, not answered as an empty one."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from evolve.gateway.traces import CallRecord, TraceStore  # noqa: E402
from evolve.ui.app import Sources, build_app  # noqa: E402
from tests.helpers.ui_runs import big_archive, layered_run  # noqa: E402


def client(*paths: Path) -> TestClient:
    return TestClient(build_app(Sources(list(paths)), hosts=["testserver"]))


def _beside(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir() if p.name.startswith(db.name + "-"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _store(folder: Path, n: int = 3) -> TraceStore:
    st = TraceStore(folder)
    for i in range(n):
        st.record(
            CallRecord(
                session_id=f"s{i}",
                api="openai",
                messages=[{"role": "user", "content": f"q{i}"}],
                model="m",
                route="r",
                output=f"a{i}",
                status="ok",
                system_id="sys1",
            )
        )
    st.feedback(session_id="s1", score=1.0, text="good")
    return st


def _browse_traffic(c: TestClient, tid: str) -> None:
    assert c.get("/api/runs").status_code == 200
    assert c.get(f"/api/traffic/{tid}").json()["sessions"] == 3
    assert c.get(f"/api/traffic/{tid}/version").status_code == 200
    assert c.get(f"/api/traffic/{tid}/sessions").json()["total"] == 3
    assert c.get(f"/api/traffic/{tid}/sessions/s1").json()["feedback"][0]["text"] == "good"


def test_browsing_a_closed_trace_store_creates_no_file_beside_it(tmp_path):
    _store(tmp_path / "traces").close()
    db = tmp_path / "traces" / "traces.sqlite"
    assert _beside(db) == []
    before = _sha(db)
    c = client(tmp_path / "traces")
    _browse_traffic(c, "traces")
    assert _beside(db) == [] and _sha(db) == before


def test_a_gateway_that_ends_while_the_dashboard_watches_removes_its_files(tmp_path):
    st = _store(tmp_path / "traces")  # a gateway at work: its -wal and -shm are there
    db = tmp_path / "traces" / "traces.sqlite"
    assert "traces.sqlite-wal" in _beside(db)
    c = client(tmp_path / "traces")
    _browse_traffic(c, "traces")
    # the page polls from the server's worker threads; each lets go after its read
    done = []
    t = threading.Thread(target=lambda: done.append(c.get("/api/traffic/traces/sessions").json()["total"]))
    t.start()
    t.join()
    assert done == [3]
    st.close()  # the last connection: the gateway removes its files, as it does alone
    assert _beside(db) == []
    _browse_traffic(c, "traces")  # and reading on creates none
    assert _beside(db) == []


def test_browsing_a_systems_memory_leaves_its_store_as_it_was(tmp_path):
    run, parent, child, _ = layered_run(tmp_path)
    db = tmp_path / "mem" / "memory.db"
    assert _beside(db) == []
    before = _sha(db)
    c = client(run)
    got = c.get(f"/api/runs/{run.name}/systems/{child.id}/memory").json()
    assert {i["text"] for i in got["items"]} >= {"join on the _id column"}
    assert c.get(f"/api/runs/{run.name}/systems/{parent.id}/memory").status_code == 200
    assert _beside(db) == [] and _sha(db) == before


def test_the_page_is_never_told_the_servers_paths(tmp_path):
    runs = tmp_path / "secret-home" / "runs"
    run, _ = big_archive(runs / "r1", accepted=2, rejected_each=0)
    _store(runs / "gw").close()
    (runs / "broken").mkdir()
    (runs / "broken" / "archive.sqlite").write_text("not a database")
    c = client(runs)
    listed = c.get("/api/runs")
    assert str(tmp_path) not in listed.text and "secret-home" not in listed.text
    data = listed.json()
    assert [r["dir"] for r in data["runs"]] == [f"runs/{run.name}"]
    assert [t["dir"] for t in data["traffic"]] == ["runs/gw"]
    assert [p["path"] for p in data["problems"]] == ["runs/broken"]
    for path in (f"/api/runs/{run.name}/summary", "/api/traffic/gw", "/api/traffic/gw/sessions/nope"):
        r = c.get(path)
        assert str(tmp_path) not in r.text, path


@pytest.mark.parametrize("split", ["../../x", "trian", "VAL", "val;"])
def test_a_split_that_is_not_one_is_refused_naming_the_splits(tmp_path, split):
    run, chain = big_archive(tmp_path / "r", accepted=2, rejected_each=0)
    c = client(run)
    for path in (
        f"/api/runs/{run.name}/matrix?split={split}",
        f"/api/runs/{run.name}/systems/{chain[0]}/rollouts?split={split}",
    ):
        r = c.get(path, params=None)
        assert r.status_code == 400, (path, r.status_code)
        assert r.json()["error"] == f"split must be one of train, val, test, gate, got {split!r}"
    assert c.get(f"/api/runs/{run.name}/matrix?split=test").status_code == 200
    assert c.get(f"/api/runs/{run.name}/systems/{chain[0]}/rollouts").status_code == 200


def test_a_split_the_world_added_can_be_shown(tmp_path):
    from evolve.archive import Archive
    from evolve.types import Reward, Trajectory

    run, chain = big_archive(tmp_path / "r", accepted=2, rejected_each=0)
    c = client(run)
    assert c.get(f"/api/runs/{run.name}/systems/{chain[0]}/rollouts?split=unseen").status_code == 400
    with Archive(run) as a:  # IFEval's unseen prompts, scored by evolve eval --split unseen
        done = Trajectory(task_id="ifeval-unseen-00000", system_id=chain[0], reward=Reward(score=0.5))
        a.add_trajectories([("eval:unseen/x", "unseen", "eval", 0, done)])
    page = c.get(f"/api/runs/{run.name}/systems/{chain[0]}/rollouts?split=unseen").json()
    assert [t["task_id"] for t in page["rows"]] == ["ifeval-unseen-00000"]
    detail = c.get(f"/api/runs/{run.name}/systems/{chain[0]}").json()
    assert detail["splits"] == ["train", "val", "test", "unseen"] and detail["scores"]["unseen"]["mean"] == 0.5
    assert c.get(f"/api/runs/{run.name}/matrix?split=unseen").json()["splits"][-1] == "unseen"
    r = c.get(f"/api/runs/{run.name}/matrix?split=unsen")
    assert (
        r.status_code == 400 and r.json()["error"] == "split must be one of train, val, test, gate, unseen, got 'unsen'"
    )
