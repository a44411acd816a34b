"""The otel tracker: each rollout a trace of gen_ai spans at a real OTLP/gRPC receiver on loopback,
live, after a collector outage, and afterwards (evolve track)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import evolve
from evolve.archive import Archive
from tests.helpers.otlp import Collector
from tests.trackers.conftest import Messages, toy

pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")


def _add(a: int, b: int) -> int:
    return a + b


def _lookup(key: str) -> str:
    raise KeyError(key)


def agent_with_tools(task: dict, ctx) -> str:
    """The toy agent, with a tool call before the model's and a failing one on some tasks."""
    ctx.tool("add", _add, a=task["a"], b=task["b"])
    if task["a"] % 5 == 0:
        try:
            ctx.tool("lookup", _lookup, key=f"k{task['a']}")
        except KeyError:
            pass
    from evolve.worlds.toy import agent

    return agent(task, ctx)


def _roots(col: Collector) -> list:
    return [s for s in col.spans if not s.parent_span_id]


def test_each_rollout_is_a_trace_of_gen_ai_spans_with_its_model_and_tool_calls(tmp_path):
    with Collector() as col:
        task = toy(
            name="otel-toy",
            agent=agent_with_tools,
            budget={"generations": 2},
            track=[{"name": "otel", "params": {"endpoint": col.endpoint, "capture_content": True}}],
        )
        report = evolve.run(task, out=tmp_path / "run")
        with Archive(tmp_path / "run", create=False) as a:
            stored = {r.key: r for r in a.trajectory_rows()}
        col.wait_for(len(stored))
        roots = _roots(col)
        keys = Counter(Collector.attrs(s)["evolve.scoring.rollout.key"] for s in roots)
        assert set(keys) == set(stored) and max(keys.values()) == 1, "every stored rollout once, nothing else"
        children: dict[bytes, list] = {}
        for s in col.spans:
            if s.parent_span_id:
                children.setdefault(s.parent_span_id, []).append(s)
        for root in roots:
            a = Collector.attrs(root)
            row = stored[a["evolve.scoring.rollout.key"]]
            t = row.trajectory
            assert root.name == "invoke_agent otel-toy" and a["gen_ai.operation.name"] == "invoke_agent"
            assert a["gen_ai.agent.name"] == "otel-toy" and a["evolve.system.id"] == t.system_id
            assert a["evolve.task.id"] == t.task_id and a["evolve.split"] == row.split
            assert a["evolve.generation"] == row.generation and a["evolve.score"] == t.score
            assert json.loads(a["evolve.output"]) == t.output
            kids = sorted(children[root.span_id], key=lambda s: s.start_time_unix_nano)
            assert [k.name for k in kids] == [
                ("chat scripted-adder" if st.kind == "llm" else f"execute_tool {st.name}") for st in t.steps
            ]
            for k, st in zip(kids, t.steps):
                ka = Collector.attrs(k)
                assert k.trace_id == root.trace_id
                assert (
                    root.start_time_unix_nano
                    <= k.start_time_unix_nano
                    <= k.end_time_unix_nano
                    <= root.end_time_unix_nano
                )
                if st.kind == "llm":
                    assert ka["gen_ai.operation.name"] == "chat" and ka["gen_ai.provider.name"] == "evolve"
                    assert ka["gen_ai.request.model"] == "scripted-adder"
                    assert ka["gen_ai.usage.input_tokens"] == st.prompt_tokens
                    assert ka["gen_ai.usage.output_tokens"] == st.completion_tokens
                    assert json.loads(ka["gen_ai.output.messages"])[0]["content"] == st.output
                    assert json.loads(ka["gen_ai.input.messages"])[-1]["content"] == st.messages[-1].content
                else:
                    assert ka["gen_ai.operation.name"] == "execute_tool" and ka["gen_ai.tool.name"] == st.name
                    assert json.loads(ka["gen_ai.tool.call.arguments"]) == st.args
                    if st.error:
                        assert ka["error.type"] == "KeyError" and k.status.code == 2
                    else:
                        assert json.loads(ka["gen_ai.tool.call.result"]) == st.result
        failing_tools = [s for s in col.spans if s.name == "execute_tool lookup"]
        assert failing_tools and all(s.status.code == 2 for s in failing_tools)
        assert report["best"]["test"]["score"] == 1.0  # the run itself is the toy run's


def test_contents_stay_home_unless_asked(tmp_path):
    with Collector() as col:
        evolve.run(
            toy(budget={"generations": 0}, track=[{"name": "otel", "params": {"endpoint": col.endpoint}}]),
            out=tmp_path / "run",
        )
        col.wait_for(1)
        for s in col.spans:
            a = Collector.attrs(s)
            assert not {"gen_ai.input.messages", "gen_ai.output.messages", "evolve.output"} & set(a)


def test_a_collector_outage_mid_run_is_a_warning_and_the_next_generation_catches_up(tmp_path):
    """The collector refuses every export from the end of generation 1 to the end of generation 3
    (by then a send of generation 2's rollouts has failed): the run's results are those of a run
    without tracking, and every rollout arrives exactly once."""
    import time

    def outage(row: dict) -> None:
        if row["index"] == 1:
            col.refusing = True
        elif row["index"] == 3:
            deadline = time.time() + 60
            while not obs.about("failed to send") and time.time() < deadline:
                time.sleep(0.05)
            col.refusing = False

    obs = Messages(on_generation=outage)
    with Collector() as col:
        task = toy(track=[{"name": "otel", "params": {"endpoint": col.endpoint, "timeout": 2}}])
        report = evolve.run(task, out=tmp_path / "run", observer=obs)
        plain = evolve.run(toy(), out=tmp_path / "plain")
        with Archive(tmp_path / "run", create=False) as a:
            stored = {r.key for r in a.trajectory_rows()}
            lineage = [(r.id, r.parents, r.operator) for r in a.records()]
        with Archive(tmp_path / "plain", create=False) as a:
            assert lineage == [(r.id, r.parents, r.operator) for r in a.records()]
        assert report["best"] == plain["best"] and report["baseline"] == plain["baseline"]
        col.wait_for(len(stored))
        keys = Counter(Collector.attrs(s)["evolve.scoring.rollout.key"] for s in _roots(col))
        assert col.refused > 0 and set(keys) == stored and max(keys.values()) == 1
        failed = obs.about("failed to send")
        assert len(failed) == 1 and "the run goes on" in failed[0] and col.endpoint in failed[0], obs.lines
        assert obs.about("caught up") and not obs.about("could not send everything"), obs.lines


def test_evolve_track_sends_a_finished_run_afterwards_and_only_what_is_missing(tmp_path, capsys):
    from evolve.cli.commands import main

    evolve.run(toy(budget={"generations": 1}), out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        n = len(a.trajectory_rows())
    with Collector() as col:
        main(["track", str(tmp_path / "run"), "--to", "otel", "--param", f"endpoint={col.endpoint}"])
        assert f"{n} rollouts" in capsys.readouterr().out
        col.wait_for(n)
        assert len(_roots(col)) == n
        main(["track", str(tmp_path / "run"), "--to", "otel", "--param", f"endpoint={col.endpoint}"])
        assert "0 rollouts" in capsys.readouterr().out and len(_roots(col)) == n
