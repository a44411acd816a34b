"""The store never loses data: a crash between the log and the index is repaired on open, a crash
inside a transaction leaves nothing half-written, and threads and processes writing the same
store lose no event."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("chromadb")

from evolve.memory import HashingEmbedder, MemoryStore


def _open(path, **kw):
    return MemoryStore(path, embedder=HashingEmbedder(), **kw)


def _raw(path):
    """(events in the log, the index watermark), read with plain sqlite3."""
    c = sqlite3.connect(path / "memory.db")
    try:
        n = c.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        w = c.execute("SELECT value FROM meta WHERE key = 'indexed'").fetchone()
        return n, int(w[0]) if w else 0
    finally:
        c.close()


def _run(code: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _abandon(store):
    """Drop a store the way a dying process does: no flush, no close."""
    store.live.close()
    store.log.close()


def test_index_failure_after_the_log_commit_is_repaired_on_open(tmp_path, monkeypatch):
    path = tmp_path / "mem"
    s = _open(path, index_lag=0)  # every write goes to the index before it returns
    s.add("written before the failure")

    def crash(*a, **k):
        raise RuntimeError("injected: the index write failed")

    monkeypatch.setattr(s.live.chroma, "add", crash)
    with pytest.raises(RuntimeError, match="injected"):
        s.add("written to the log, not to the index")
    assert _raw(path) == (2, 1)  # the log has it (the truth), the index does not
    _abandon(s)
    monkeypatch.undo()

    s = _open(path)  # reopen: the events past the watermark are applied
    assert _raw(path) == (2, 2)
    report = s.check()
    assert report["ok"], report
    assert s.search("not to the index", 1)[0].text == "written to the log, not to the index"
    assert s.add("written to the log, not to the index") == "m2"  # a retry is a no-op: same id
    s.close()


@pytest.mark.parametrize("lag", [0, 64])
def test_killed_between_log_and_index_loses_nothing(tmp_path, lag):
    path = tmp_path / "mem"
    r = _run(
        """
        import os, sys
        from evolve.memory import HashingEmbedder, MemoryStore
        from evolve.memory.index import ChromaIndex
        s = MemoryStore(sys.argv[1], embedder=HashingEmbedder(), index_lag=int(sys.argv[2]))
        s.add("before the crash")
        s.sync()
        ChromaIndex.add = lambda *a, **k: os._exit(9)  # die hard at the index write after the log commit
        s.add("committed, then the process was killed")
        os._exit(9)  # with a lag there was no index write yet: die before any flush
    """,
        str(path),
        str(lag),
    )
    assert r.returncode == 9, r.stderr
    assert _raw(path) == (2, 1)
    s = _open(path)
    assert s.check()["ok"] and len(s) == 2
    assert s.search("process was killed", 1)[0].text == "committed, then the process was killed"
    s.close()


def test_killed_after_the_index_write_before_the_watermark_reapplies_cleanly(tmp_path):
    path = tmp_path / "mem"
    r = _run(
        """
        import os, sys
        from evolve.memory import HashingEmbedder, MemoryStore
        from evolve.memory.index import LiveIndex
        s = MemoryStore(sys.argv[1], embedder=HashingEmbedder())
        s.add_many([("fact", f"fact {i}") for i in range(10)])
        s.sync()
        LiveIndex._set_watermark = lambda self, v: os._exit(9)  # the vectors are in chroma, the mark is not
        s.add_many([("fact", f"late fact {i}") for i in range(5)])
        s.sync()
    """,
        str(path),
    )
    assert r.returncode == 9, r.stderr
    assert _raw(path) == (15, 10)
    s = _open(path)  # the 5 vectors are added again: chroma keeps one of each
    report = s.check()
    assert report["ok"] and report["watermark"] == 15 and s.live.chroma.count() == 15, report
    s.close()


def test_killed_inside_a_transaction_writes_nothing(tmp_path):
    path = tmp_path / "mem"
    r = _run(
        """
        import os, sys
        from evolve.memory import HashingEmbedder, MemoryStore
        from evolve.memory.log import EventLog
        s = MemoryStore(sys.argv[1], embedder=HashingEmbedder())
        s.add("kept")
        real, calls = EventLog.append, []
        def append(self, *a, **k):
            calls.append(1)
            if len(calls) == 2:
                os._exit(9)  # the second event of the batch: the first is written but not committed
            return real(self, *a, **k)
        EventLog.append = append
        s.add_many([("lesson", "first of the batch"), ("lesson", "second of the batch")])
    """,
        str(path),
    )
    assert r.returncode == 9, r.stderr
    s = _open(path)
    assert [it.text for it in s.items()] == ["kept"] and s.version == 1 and s.check()["ok"]
    s.close()


def test_writes_may_wait_for_the_index_and_searches_stay_exact(tmp_path):
    path = tmp_path / "mem"
    s = _open(path, index_lag=8)
    for i in range(8):
        s.add(f"waiting item {i} code{i}x")
    assert _raw(path) == (8, 0) and s.live.chroma.count() == 0  # all 8 in the log, none in chroma yet
    assert s.search("code5x", 1, alpha=1.0)[0].text == "waiting item 5 code5x"  # exact, from the log's vectors
    s.add("the ninth write passes the lag")
    assert _raw(path) == (9, 9) and s.live.chroma.count() == 9
    s.add("waits again")
    s.close()  # close flushes
    assert _raw(path) == (10, 10)
    s = _open(path)
    assert s.check()["ok"]
    s.close()


def test_lost_index_folder_is_rebuilt_from_the_log(tmp_path):
    path = tmp_path / "mem"
    s = _open(path)
    s.add_many([("fact", f"fact number {i}") for i in range(20)])
    s.close()
    shutil.rmtree(path / "chroma")
    s = _open(path)
    assert s.check()["ok"] and s.search("number 7", 1)[0].text == "fact number 7"
    s.close()


def test_threads_lose_no_event(tmp_path):
    path = tmp_path / "mem"
    shared = _open(path)
    errors = []

    def work(t: int, own: bool) -> None:
        try:
            s = _open(path) if own else shared
            for i in range(50):
                s.add(f"thread {t} item {i} text", "experience", {"thread": t})
            if own:
                s.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t, t >= 2)) for t in range(4)]  # 2 share, 2 open their own
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert shared.version == 200 and len(shared) == 200
    assert sorted(e.seq for e in shared.events()) == list(range(1, 201))
    report = shared.check()
    assert report["ok"], report
    assert len(shared.search("item 7", 10, where={"thread": 3})) == 10
    shared.close()


def test_processes_lose_no_event_and_see_each_other(tmp_path):
    path = tmp_path / "mem"
    parent = _open(path)
    parent.add("written by the parent first")
    parent.search("parent")  # the parent's chroma client is loaded now; the children write behind it
    code = """
        import sys
        from evolve.memory import HashingEmbedder, MemoryStore
        p = int(sys.argv[2])
        s = MemoryStore(sys.argv[1], embedder=HashingEmbedder())
        for i in range(50):
            s.add(f"process {p} wrote item {i} zz{p}x{i}", "fact", {"proc": p})
        s.close()
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(path), str(p)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(3)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    assert parent.version == 151 and len(parent) == 151
    assert sorted(e.seq for e in parent.events()) == list(range(1, 152))
    # the parent's chroma client predates the children's vectors: they are found all the same
    parent.search("anything")  # catch up with the log
    # not visible to the parent's chroma client: the children's items, and the parent's own first
    # item too (it was still waiting for the index when a child opened the store and indexed it)
    assert len(parent.live._tail()) == 151
    assert parent.search("zz2x17", 1, alpha=1.0)[0].text == "process 2 wrote item 17 zz2x17"
    assert {h.item.metadata["proc"] for h in parent.search("process wrote item", 60, alpha=1.0)} == {0, 1, 2}
    parent.live.tail_limit = 10  # too many foreign vectors: the parent reloads its index
    assert parent.search("zz1x3", 1, alpha=1.0)[0].text == "process 1 wrote item 3 zz1x3"
    assert parent.live.fresh == 151
    report = parent.check()
    assert report["ok"], report
    parent.close()
