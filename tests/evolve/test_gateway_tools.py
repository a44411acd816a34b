"""Tool mining from recorded traffic: the tool calls of gateway sessions (with the results the agent
sent back) become trajectory steps, the toolforge operator mines tools from them, and a route
following the run serves the admitted tools, run by the gateway in the sandbox."""

from __future__ import annotations

import json
import sqlite3

import pytest

from evolve.gateway.traces import CallRecord, TraceStore

pytest.importorskip("starlette")

SQL_TOOL = {
    "type": "function",
    "function": {
        "name": "execute_sql",
        "description": "run SQL on a database",
        "parameters": {"type": "object", "properties": {"db": {"type": "string"}, "sql": {"type": "string"}}},
    },
}


def _db(path) -> str:
    conn = sqlite3.connect(path)
    conn.execute("create table singer (name text, age int, country text)")
    conn.executemany(
        "insert into singer values (?, ?, ?)",
        [("Ann", 30, "France"), ("Bo", 41, "France"), ("Cy", 25, "Peru"), ("Di", 52, "Chile"), ("Ed", 33, "Peru")],
    )
    conn.commit()
    conn.close()
    return str(path)


def _session(st: TraceStore, sid: str, db: str, country: str, score: float) -> None:
    """What the gateway records for an agent that runs its own execute_sql tool: a call that asks
    for the tool, and the next call, whose messages carry the tool's result."""
    user = {"role": "user", "content": f"how many singers from {country}?"}
    sql = f"select count(*) from singer where country = '{country}'"
    tc = {
        "id": f"call_{sid}",
        "type": "function",
        "function": {"name": "execute_sql", "arguments": json.dumps({"db": db, "sql": sql})},
    }
    rows = sqlite3.connect(db).execute(sql).fetchall()
    st.record(
        CallRecord(
            session_id=sid,
            api="openai",
            messages=[user],
            tools=[SQL_TOOL],
            tool_calls=[tc],
            request={"messages": [user]},
            finish_reason="tool_calls",
        )
    )
    st.record(
        CallRecord(
            session_id=sid,
            api="openai",
            tools=[SQL_TOOL],
            output=str(rows[0][0]),
            messages=[
                user,
                {"role": "assistant", "content": None, "tool_calls": [tc]},
                {"role": "tool", "tool_call_id": tc["id"], "content": json.dumps(rows)},
            ],
        )
    )
    st.feedback(session_id=sid, score=score)


def test_recorded_tool_calls_become_steps_with_what_came_back(tmp_path):
    from evolve.gateway.dataset import recorded_trajectories, sessions
    from evolve.types import ToolCall

    db = _db(tmp_path / "music.db")
    st = TraceStore(tmp_path / "traces")
    _session(st, "s0", db, "France", 1.0)
    asked = {"id": "c9", "type": "function", "function": {"name": "execute_sql", "arguments": '{"sql": "x"}'}}
    failed = {"id": "c8", "type": "function", "function": {"name": "execute_sql", "arguments": '{"sql": "bad"}'}}
    st.record(
        CallRecord(
            session_id="s1", api="openai", messages=[{"role": "user", "content": "q"}], tool_calls=[failed, asked]
        )
    )
    st.record(
        CallRecord(
            session_id="s1",
            api="openai",
            output="sorry",
            messages=[
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [failed]},
                {"role": "tool", "tool_call_id": "c8", "content": "[tool error] no such column: bad"},
            ],
        )
    )
    st.feedback(session_id="s1", score=0.0)
    st.close()
    trajs = {t.task_id: t for t in recorded_trajectories(sessions(str(tmp_path / "traces"), val=0.0)["train"])}
    (ok,) = [s for s in trajs["s0"].steps if isinstance(s, ToolCall)]
    assert ok.name == "execute_sql" and ok.args["db"] == db and ok.result == [[2]] and ok.error is None
    assert [type(s).__name__ for s in trajs["s0"].steps] == ["LLMCall", "ToolCall", "LLMCall"]
    (bad,) = [s for s in trajs["s1"].steps if isinstance(s, ToolCall)]  # c9's result never came back
    assert bad.error == "no such column: bad" and bad.result is None


def test_tools_mined_from_recorded_sessions_are_served_and_run_by_the_gateway(tmp_path):
    import openai

    import evolve
    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import GatewayConfig
    from evolve.gateway.dataset import recorded_trajectories, sessions
    from evolve.toolforge import ToolLibrary
    from evolve.types import ToolCall
    from tests.helpers.upstream import ScriptedUpstream

    data = tmp_path / "data"
    data.mkdir()
    db = _db(data / "music.db")
    st = TraceStore(tmp_path / "traces")
    for i, country in enumerate(["France", "Peru", "Chile", "Spain"]):
        _session(st, f"s{i}", db, country, 1.0)
    st.close()
    task = {
        "name": "mine",
        "seed": 0,
        "agent": "evolve.gateway.dataset:replay",
        "reward": "tests.evolve.test_gateway_dataset:agrees",
        "models": {"policy": {"backend": "scripted", "name": "s", "params": {"echo": True}}},
        "dataset": {
            "source": "evolve.gateway.dataset:sessions",
            "params": {"store": str(tmp_path / "traces"), "val": 0.0},
        },
        "operators": [
            {
                "name": "toolforge",
                "params": {"traces": True, "miner": "evolve.worlds.sql.abstract:mine_sql", "min_support": 3},
            }
        ],
        "budget": {"generations": 1},
        "engine": {"acceptance": "val_only", "min_gain": -1},
    }
    evolve.run(task, base_dir=tmp_path, out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as archive:
        (kid,) = [r for r in archive.records() if r.operator == "toolforge"]
        archive.set_current(kid.id)
        (tool,) = ToolLibrary.from_system(archive.get_system(kid.id))
    assert tool.params == ("db", "t0", "c0", "v0") and len(tool.tests) == 4  # one recorded case per session

    args = {"db": db, "t0": "singer", "c0": "country", "v0": "Peru"}
    with ScriptedUpstream() as up:
        cfg = GatewayConfig.model_validate(
            {
                "port": 0,
                "store": tmp_path / "served",
                "routes": [
                    {
                        "upstream": {"model": "openai/*", "api_base": up.url},
                        "evolve": {"run": tmp_path / "run", "tools": {"read_roots": [data], "max_rounds": 2}},
                    }
                ],
            }
        )
        with GatewayServer(cfg) as gw:
            client = openai.OpenAI(base_url=gw.url, api_key="unused")
            r = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"call:{tool.name} {json.dumps(args)}"}],
                extra_headers={"X-Evolve-Session": "u1"},
            )
            assert r.choices[0].message.content == "the tool said: [[2]]" and not r.choices[0].message.tool_calls
            offered = [t["function"]["name"] for t in up.requests[-2]["tools"]]
            assert offered == [tool.name] and "tools" not in up.requests[-1]  # the last round offers none

            # streamed, with the agent's own tool beside: the served tool still runs here
            chunks = list(
                client.chat.completions.create(
                    model="m",
                    stream=True,
                    tools=[SQL_TOOL],
                    messages=[{"role": "user", "content": f"call:{tool.name} {json.dumps({**args, 'v0': 'France'})}"}],
                    extra_headers={"X-Evolve-Session": "u2"},
                )
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "the tool said: [[2]]"
            assert [t["function"]["name"] for t in up.requests[-1]["tools"]] == ["execute_sql"]

            # the Anthropic API, streamed: the same rounds, one stream at the end
            import anthropic

            ac = anthropic.Anthropic(base_url=gw.base, api_key="unused", max_retries=0)
            with ac.messages.stream(
                model="m",
                max_tokens=64,
                messages=[{"role": "user", "content": f"call:{tool.name} {json.dumps({**args, 'v0': 'Chile'})}"}],
                extra_headers={"X-Evolve-Session": "u5"},
            ) as stream:
                assert "".join(stream.text_stream) == "the tool said: [[1]]"
                assert stream.get_final_message().stop_reason == "end_turn"

            # a file parameter outside the read roots is refused, in words the model reads
            outside = _db(tmp_path / "other.db")
            r = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"call:{tool.name} {json.dumps({**args, 'db': outside})}"}],
                extra_headers={"X-Evolve-Session": "u3"},
            )
            assert (
                "[tool error] db=" in r.choices[0].message.content
                and "not under a path" in r.choices[0].message.content
            )

            # the agent's own tool is the agent's: passed back to it, not run here
            r = client.chat.completions.create(
                model="m",
                tools=[SQL_TOOL],
                messages=[{"role": "user", "content": 'call:execute_sql {"db": "x", "sql": "select 1"}'}],
                extra_headers={"X-Evolve-Session": "u4"},
            )
            assert r.choices[0].message.tool_calls[0].function.name == "execute_sql"
            store = gw.gateway.store
            by = {s: store.calls(s) for s in ("u1", "u2", "u3", "u4", "u5")}
            assert [len(c) for c in by.values()] == [2, 2, 2, 1, 2]
            assert by["u1"][0].params["gateway_tools"] == [tool.name] and by["u1"][0].system_id == kid.id
            assert by["u1"][1].messages[-1] == {
                "role": "tool",
                "tool_call_id": by["u1"][0].tool_calls[0]["id"],
                "content": "[[2]]",
            }
            for s in ("u1", "u2", "u3", "u4"):
                store.feedback(session_id=s, score=1.0)
            tasks = sessions(str(tmp_path / "served"), val=0.0)["train"]
    steps = [s for t in recorded_trajectories(tasks) if t.task_id == "u1" for s in t.steps if isinstance(s, ToolCall)]
    assert [(s.name, s.result) for s in steps] == [(tool.name, [[2]])]  # the served tool's use is on record
