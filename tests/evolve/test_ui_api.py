"""The dashboard's JSON API (evolve.ui) against runs it must describe exactly: a finished SQL-world
run with the scripted SQL model (real databases and tool calls), a large synthetic lineage, a
system with memory, tools and a workflow graph, a local model's sampled tokens, a trace store
and a deployment. Every figure is checked against the archive read directly."""

from __future__ import annotations

import hashlib
import math
import re
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.types import LLMCall, Message, Reward, System, Trajectory  # noqa: E402
from evolve.ui.app import Sources, build_app  # noqa: E402
from tests.helpers import sql_scripted  # noqa: E402
from tests.helpers.ui_runs import big_archive, layered_run  # noqa: E402


def client(*paths: Path, **kw) -> TestClient:
    return TestClient(build_app(Sources(list(paths)), hosts=["testserver"], **kw))


@pytest.fixture(scope="module")
def sql_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ui") / "sql-run"
    evolve.run(sql_scripted.task(budget={"generations": 4}), out=out)
    return out


def test_the_runs_page_says_what_the_archive_holds(sql_run):
    got = client(sql_run).get("/api/runs").json()["runs"]
    assert len(got) == 1
    r = got[0]
    with Archive(sql_run, create=False) as a:
        used = a.usage(test=False)
        assert (r["used"]["rollouts"], r["used"]["calls"], r["used"]["tokens"]) == (
            used["rollouts"],
            used["calls"],
            used["tokens"],
        )
        assert r["systems"] == len(a.records()) and r["status"] == "finished" and r["world"] == "sql"
        base, best = a.get_state("baseline"), a.get_state("best")
        assert r["baseline"]["id"] == base and r["best"]["id"] == best
        for which, sid in (("baseline", base), ("best", best)):
            for split in ("val", "test"):  # over tasks (a task's samples averaged first)
                per_task = a.task_scores(sid, split)
                assert r[which][split]["n"] == len(per_task)
                assert r[which][split]["mean"] == pytest.approx(sum(per_task.values()) / len(per_task))
        assert r["generation"] == 4 and r["budget"] == {"generations": 4}
    v = r["best"]["val"]  # its 95% interval (Wilson), never beyond [0, 1]
    assert 0.0 <= v["low"] < v["mean"] and v["mean"] <= v["high"] <= 1.0


def test_the_curves_have_a_row_per_generation_with_what_it_spent(sql_run):
    s = client(sql_run).get(f"/api/runs/{sql_run.name}/summary").json()
    with Archive(sql_run, create=False) as a:
        rows = a.get_state("generations")
    assert [g["index"] for g in s["generations"]] == [g["index"] for g in rows] == [0, 1, 2, 3, 4]
    assert [g["calls"] for g in s["generations"]] == [g["calls"] for g in rows]
    assert s["generations"][0]["median_val"] == pytest.approx(s["baseline"]["val"]["mean"])


def test_the_lineage_of_a_small_run_has_every_system_with_its_decision(sql_run):
    pic = client(sql_run).get(f"/api/runs/{sql_run.name}/lineage").json()
    with Archive(sql_run, create=False) as a:
        records = a.records()
        decided = {e["child"]: e["accepted"] for e in a.events("decision")}
        edges = sum(len(r.parents) for r in records)
    assert pic["view"] == "whole" and len(pic["nodes"]) == len(records) and len(pic["edges"]) == edges
    for n in pic["nodes"]:
        assert n["accepted"] == decided.get(n["id"], True if not n["parents"] else None)
    assert len({(n["x"], n["y"]) for n in pic["nodes"]}) == len(pic["nodes"])  # no two in one place
    assert "best" in next(n for n in pic["nodes"] if n["id"] == pic["marks"]["best"])["marks"]


def test_a_large_lineage_is_collapsed_to_the_accepted_systems_and_opens_on_request(tmp_path):
    run, chain = big_archive(tmp_path / "big")
    c = client(run)
    pic = c.get("/api/runs/big/lineage").json()
    assert pic["total"] == 20 + 19 * 24 and pic["view"] == "collapsed"
    assert [n["id"] for n in pic["nodes"]] == chain  # accepted only, in order
    assert sum(n["hidden"] for n in pic["nodes"]) == 19 * 24
    opened = c.get(f"/api/runs/big/lineage?expand={chain[3]}").json()
    assert len(opened["nodes"]) == 20 + 24
    assert next(n for n in opened["nodes"] if n["id"] == chain[3])["hidden"] == 0
    assert len(c.get("/api/runs/big/lineage?view=all").json()["nodes"]) == pic["total"]


def _tasks_better_and_worse(a: Archive, parent: str, child: str, split: str) -> tuple[int, int]:
    p, ch = a.task_scores(parent, split), a.task_scores(child, split)
    common = set(p) & set(ch)
    return sum(ch[t] > p[t] for t in common), sum(ch[t] < p[t] for t in common)


def test_a_system_shows_its_diff_decision_evidence_and_task_wins(sql_run):
    c = client(sql_run)
    d = c.get(f"/api/runs/{sql_run.name}/systems/best").json()
    with Archive(sql_run, create=False) as a:
        parent = a.record(d["id"]).parents[0]
        assert d["parents"] == [parent]
        assert d["diff"] == [
            {
                "path": "prompts.instruction",
                "before": a.get_system(parent).prompts["instruction"],
                "after": a.get_system(d["id"]).prompts["instruction"],
            }
        ]
        event = next(e for e in a.events("decision") if e["child"] == d["id"])
        assert d["decision"]["why"] == event["why"] and d["decision"]["accepted"] is True
        fixed, broke = _tasks_better_and_worse(a, parent, d["id"], "val")
    assert (d["vs_parent"]["val"]["n_fixed"], d["vs_parent"]["val"]["n_broke"]) == (fixed, broke)
    assert len(d["vs_parent"]["val"]["fixed"]) == fixed
    # the evidence is what the decision was taken on: the same minibatch means as its text says
    child_mb, parent_mb = map(float, re.search(r"minibatch ([\d.]+) vs ([\d.]+)", event["why"]).groups())
    mb = d["evidence"]["minibatch"]
    assert (round(mb["b"], 3), round(mb["a"], 3)) == (child_mb, parent_mb)
    assert d["scores"]["val"]["n"] == 24


def test_the_task_matrix_counts_match_the_archive(sql_run):
    m = client(sql_run).get(f"/api/runs/{sql_run.name}/matrix?split=val").json()
    with Archive(sql_run, create=False) as a:
        accepted = [x["system_id"] for x in a.get_state("accepted")]
        assert [r["id"] for r in m["rows"]] == accepted
        for r in m["rows"][1:]:
            assert (r["fixed"], r["broke"]) == _tasks_better_and_worse(a, r["parent"], r["id"], "val")
            assert r["tasks"] == len(a.task_scores(r["id"], "val"))
    assert len(m["grid"]["tasks"]) == 24 and len(m["grid"]["scores"]) == len(m["rows"])


def test_a_rollout_has_its_messages_tool_calls_and_reward(sql_run):
    c = client(sql_run)
    with sqlite3.connect(f"file:{sql_run / 'archive.sqlite'}?mode=ro", uri=True) as db:
        ((seq, key),) = db.execute("SELECT seq, key FROM trajectories WHERE calls > 1 ORDER BY seq LIMIT 1").fetchall()
    with Archive(sql_run, create=False) as a:
        stored = a.get_trajectories([key])[key]
    t = c.get(f"/api/runs/{sql_run.name}/rollouts/{seq}").json()
    assert t["row"]["key"] == key
    tools = [s for s in t["trajectory"]["steps"] if s["kind"] == "tool"]
    assert tools[0]["name"] == "execute_sql" and tools[0]["error"] and tools[-1]["result"] is not None
    assert t["trajectory"]["reward"]["components"] == stored.reward.components
    page = c.get(f"/api/runs/{sql_run.name}/systems/{stored.system_id}/rollouts?split=val&limit=5").json()
    assert page["total"] == 24 and len(page["rows"]) == 5
    assert c.get(f"/api/runs/{sql_run.name}/systems/baseline/rollouts?failed=1").json()["total"] == 0
    assert c.get(f"/api/runs/{sql_run.name}/rollouts/999999").status_code == 404


def test_two_systems_compare_side_by_side(sql_run):
    r = client(sql_run).get(f"/api/compare?a={sql_run.name}:baseline&b={sql_run.name}:best").json()
    with Archive(sql_run, create=False) as a:
        base, best = a.get_state("baseline"), a.get_state("best")
        assert (r["a"]["id"], r["b"]["id"]) == (base, best)
        assert (r["tasks"]["test"]["n_fixed"], r["tasks"]["test"]["n_broke"]) == _tasks_better_and_worse(
            a, base, best, "test"
        )
    assert [d["path"] for d in r["diff"]] == ["prompts.instruction"]


def test_memory_tools_and_workflow_of_a_system(tmp_path):
    run, parent, child, (v1, v2) = layered_run(tmp_path)
    c = client(run)
    m = c.get(f"/api/runs/layers/systems/{child.id}/memory").json()
    assert m["active"] == 2 and {i["status"] for i in m["items"]} == {"active", "superseded"}
    assert [e["op"] for e in m["changes"]] == ["SUPERSEDE", "ADD"] and m["since"] == v1
    assert [v["version"] for v in m["versions"]] == [v1, v2]
    t = c.get(f"/api/runs/layers/systems/{child.id}/tools").json()
    assert t["tools"][0]["name"] == "count_where" and t["tools"][0]["uses"] == 3
    assert [(v["verdict"], v["generation"]) for v in t["verdicts"]] == [("admitted", 1), ("rejected", 1)]
    w = c.get(f"/api/runs/layers/systems/{child.id}/workflow").json()
    assert w["settings"] == {"max_turns": 3}
    assert {n["id"] for n in w["graph"]["nodes"]} == {"write", "run", "fix", "answer"}
    assert next(n for n in w["graph"]["nodes"] if n["id"] == "write")["model"] is True
    assert any(e["back"] for e in w["graph"]["edges"])  # fix -> run closes the repair loop


@pytest.mark.slow  # builds a tiny model and samples from it
def test_a_local_models_sampled_tokens_come_with_their_text(tmp_path):
    from evolve.policy.local import build
    from tests.helpers import two_system_run

    run, a_sys, _ = two_system_run(tmp_path)
    with Archive(run) as archive:
        llm = build(
            a_sys.models["policy"].model_copy(update={"params": {**a_sys.models["policy"].params, "temperature": 1.0}}),
            archive.artifacts,
        )
        try:
            msgs = [Message(role="user", content="hi")]
            out = llm.complete(msgs, max_tokens=12)
        finally:
            getattr(llm, "close", lambda: None)()
        step = LLMCall(
            role="policy",
            model="tiny",
            messages=tuple(msgs),
            output=out.text,
            token_ids=out.token_ids,
            logprobs=out.logprobs,
        )
        archive.add_trajectories(
            [
                (
                    "k",
                    "val",
                    "eval",
                    0,
                    Trajectory(
                        task_id="t", system_id=a_sys.id, steps=(step,), output=out.text, reward=Reward(score=0.0)
                    ),
                )
            ]
        )
        seq = archive.trajectory_rows()[0]
    t = client(run).get("/api/runs/run/rollouts/1").json()
    llm_step = t["trajectory"]["steps"][0]
    assert len(llm_step["token_texts"]) == len(out.token_ids) == len(llm_step["logprobs"])
    assert "".join(llm_step["token_texts"]) == out.text
    assert seq.key == "k"


def test_a_trace_store_and_a_deployment(tmp_path):
    from evolve.deploy.lifecycle import Deployment
    from evolve.gateway.traces import CallRecord, TraceStore

    st = TraceStore(tmp_path / "traces")
    for i in range(3):
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
    st.close()
    run, chain = big_archive(tmp_path / "dep", accepted=3, rejected_each=1)
    with Archive(run) as a:
        Deployment(a).propose(chain[1], by="engine", why="better on val")
    c = client(tmp_path / "traces", run)
    listed = c.get("/api/runs").json()
    assert [t["id"] for t in listed["traffic"]] == ["traces"] and listed["traffic"][0]["sessions"] == 3
    sessions = c.get("/api/traffic/traces/sessions").json()
    assert sessions["total"] == 3 and {r["id"]: r["score"] for r in sessions["rows"]}["s1"] == 1.0
    one = c.get("/api/traffic/traces/sessions/s1").json()
    assert one["calls"][0]["output"] == "a1" and one["feedback"][0]["text"] == "good"
    d = c.get("/api/runs/dep/deploy").json()
    assert d["states"][chain[1]] == "proposed" and d["trail"][0]["why"] == "better on val"
    nodes = {n["id"]: n for n in c.get("/api/runs/dep/lineage").json()["nodes"]}
    assert nodes[chain[1]]["deploy"] == "proposed"


def test_the_dashboard_never_writes_a_run(sql_run):
    def digest() -> str:  # the database and its write-ahead log (the -shm index is every reader's to update)
        return hashlib.sha256(
            b"".join(p.read_bytes() for p in sorted(sql_run.glob("archive.sqlite*")) if not p.name.endswith("-shm"))
        ).hexdigest()

    before = digest()
    c = client(sql_run)
    rid = sql_run.name
    for path in (
        "/api/runs",
        f"/api/runs/{rid}/summary",
        f"/api/runs/{rid}/lineage?view=all",
        f"/api/runs/{rid}/matrix",
        f"/api/runs/{rid}/deploy",
        f"/api/runs/{rid}/systems/best",
        f"/api/runs/{rid}/systems/best/memory",
        f"/api/runs/{rid}/systems/best/tools",
        f"/api/runs/{rid}/systems/best/workflow",
        f"/api/runs/{rid}/rollouts/1",
    ):
        assert c.get(path).status_code == 200, path
    assert digest() == before
    view = Sources([sql_run]).run(rid)
    with pytest.raises(Exception, match="readonly"):
        view.archive.set_current(view.archive.current())


def test_the_lineage_layout_keeps_every_system_in_a_place_of_its_own():
    from evolve.ui.lineage import Node, picture

    # a parent and its child of the same generation (merges and traces can do that), a merge, a wide fan
    nodes = [Node("a", 0, (), 1), Node("b", 1, ("a",), 2), Node("c", 1, ("b",), 3), Node("d", 2, ("c", "a"), 4)]
    nodes += [Node(f"f{i}", 2, ("b",), 5 + i) for i in range(400)]
    pic = picture(nodes, {}, keep=["a", "b", "c", "d"], marked=["a", "d"], mode="all")
    at = {n["id"]: (n["x"], n["y"]) for n in pic["nodes"]}
    assert len(set(at.values())) == len(at) == 404
    assert at["c"][1] == at["b"][1] + 1 and at["d"][1] == at["c"][1] + 1  # a row lower than its parent
    assert ["a", "d", 1] in pic["edges"]  # the second parent
    # past the cap only the marked systems' lineages are drawn, unless the accepted ones are asked for
    small = picture(nodes, {}, keep=["a", "b", "c", "d"] + [f"f{i}" for i in range(300)], marked=["a", "d"], cap=50)
    assert small["view"] == "lineage" and {n["id"] for n in small["nodes"]} == {"a", "b", "c", "d"}
    assert picture(nodes, {}, keep=[f"f{i}" for i in range(300)], marked=["a"], cap=50, mode="accepted")["shown"] == 302
    with pytest.raises(ValueError, match="one of auto, accepted, all"):
        picture(nodes, {}, keep=[], marked=[], mode="everything")


def test_what_the_review_found_stays_fixed(tmp_path, monkeypatch):
    import evolve.ui.run as ui_run
    from evolve.memory.view import memory_view

    # a run with two samples of each val task (re-evaluation), a NaN in an operator's statistics
    base, child = System(prompts={"p": "a"}), System(prompts={"p": "b"})
    with Archive(tmp_path / "r") as a:
        a.add_system(base)
        a.add_system(
            child, parents=[base.id], operator="op", generation=1, info={"curve": [{"step": 1, "loss": math.nan}]}
        )
        a.put_state("baseline", base.id)
        a.add_trajectories(
            [
                (
                    f"k{t}{s}",
                    "val",
                    "eval",
                    0,
                    Trajectory(task_id=f"t{t}", system_id=base.id, sample=s, reward=Reward(score=float(s))),
                )
                for t in range(3)
                for s in range(2)
            ]
        )
    c = client(tmp_path / "r")
    r = c.get("/api/runs").json()["runs"][0]
    assert r["baseline"]["val"]["n"] == 3 and r["baseline"]["val"]["mean"] == 0.5  # three tasks, not six rollouts
    assert r["status"] == "running"
    monkeypatch.setattr(ui_run, "ACTIVE_S", 0.0)  # nothing written since: a killed run is stopped, unwritten
    assert c.get("/api/runs").json()["runs"][0]["status"] == "stopped"
    assert c.get(f"/api/runs/r/systems/{child.id}").json()["curve"] == [{"step": 1, "loss": None}]
    assert c.get("/api/runs/r/rollouts/99999999999999999999").status_code == 404
    assert c.get(f"/api/runs/r/systems/{base.id}/rollouts?offset=99999999999999999999").status_code == 400
    # a memory store whose folder name would break a file: URI is read, never created
    from evolve.memory.embed import HashingEmbedder
    from evolve.memory.store import MemoryStore

    odd = tmp_path / "q?x#y%20"
    with MemoryStore(odd, embedder=HashingEmbedder()) as store:
        store.add("an item", kind="experience")
        v = store.version
    assert [i["text"] for i in memory_view({"store": str(odd), "version": v})["items"]] == ["an item"]
    assert not (tmp_path / "q").exists()
