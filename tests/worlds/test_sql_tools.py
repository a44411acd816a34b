"""The SQL world with tools: mined query tools, called by the agent, run in the sandbox, scored
like the SQL they stand for; demos that teach them; a task file's tool library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolve.errors import ConfigError
from evolve.llm.fake import ScriptedLM
from evolve.rollout import run_agent, score
from evolve.toolforge import ToolLibrary, check
from evolve.toolforge.tool import load_library, save_library
from evolve.types import Reward, System, ToolCall, Trajectory
from evolve.worlds import sql
from evolve.worlds.sql.abstract import call_text, mine_sql, shape_of
from evolve.worlds.sql.coldstart import tool_demos
from evolve.worlds.sql.tools import expand_sql


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return sql.build(tmp_path_factory.mktemp("sqlt"), seed=0, n_train=80, n_val=10, n_test=40)


@pytest.fixture(scope="module")
def library(data) -> ToolLibrary:
    from evolve.sandbox import SandboxUnavailable, get_sandbox

    try:
        box = get_sandbox("process")
    except SandboxUnavailable as e:  # pragma: no cover
        pytest.skip(str(e))
    trajs = []
    for t in data["train"]:  # what a perfect agent would have recorded
        call = ToolCall(
            name="execute_sql", args={"db": t["db"], "sql": t["gold_sql"]}, result=sql.execute(t["db"], t["gold_sql"])
        )
        trajs.append(Trajectory(task_id=t["id"], system_id="s", steps=(call,), reward=Reward(score=1.0)))
    tools = mine_sql(trajs, min_support=3)
    assert len(tools) >= 5
    admitted = [t for t in tools if check(t, box, min_recorded=len(t.tests)).admitted]
    assert len(admitted) == len(tools)  # gold SQL always reproduces itself
    return ToolLibrary({t.name: t for t in admitted})


def _covered(data, library, split="test"):
    by_tpl = {t.meta["template"]: t for t in library}
    for task in data[split]:
        got = shape_of(task["gold_sql"])
        if got and got[0] in by_tpl:
            yield task, by_tpl[got[0]], got[3]


def _run(task, system, replies):
    llm = ScriptedLM(responses=replies, cycle=False)
    traj = run_agent(sql.agent, system, task, lambda s, role: llm)
    return score(sql.reward, task, traj)


def test_a_tool_call_runs_in_the_sandbox_and_scores_like_its_sql(data, library):
    system = library.apply_to(
        System(workflow={"max_turns": 2}, models={"policy": {"backend": "scripted", "name": "x"}})
    )
    n = 0
    for task, tool, kwargs in list(_covered(data, library))[:6]:
        said = call_text(tool, kwargs)
        traj = _run(task, system, [said])
        assert traj.error is None and traj.score == 1.0, (said, traj.reward)
        (step,) = [s for s in traj.steps if isinstance(s, ToolCall)]
        assert step.name == tool.name and step.args["db"] == task["db"] and step.error is None
        assert sql.reward(task, expand_sql(tool, kwargs)).score == 1.0
        n += 1
    assert n >= 3


def test_a_bad_call_is_an_error_the_model_sees_then_sql_still_works(data, library):
    system = library.apply_to(
        System(workflow={"max_turns": 3}, models={"policy": {"backend": "scripted", "name": "x"}})
    )
    task, tool, kwargs = next(iter(_covered(data, library)))
    too_few = f"{tool.name}({next(iter(kwargs.values()))})"
    first = tool.meta["idents"][0]
    injected = call_text(tool, {**kwargs, first: "@@"}).replace("@@", "'x from t; --'")  # a quoted "name"
    traj = _run(task, system, [too_few, injected, task["gold_sql"]])
    assert traj.score == 1.0
    calls = [s for s in traj.steps if isinstance(s, ToolCall)]
    assert [c.name for c in calls] == [tool.name, "execute_sql"]
    assert "plain SQL name" in calls[0].error  # the tool refused the injected name, in the sandbox
    last_prompt = [s for s in traj.steps if getattr(s, "kind", "") == "llm"][-1].messages
    errors = [m.content for m in last_prompt if m.role == "tool"]
    assert "takes" in errors[0] and "arguments" in errors[0] and "plain SQL name" in errors[1]


def test_tool_docs_tell_a_model_that_reads_of_each_tool_and_the_tiny_models_prompt_is_unchanged(data, library):
    task, tool, kwargs = next(iter(_covered(data, library)))

    def first_prompt(workflow, prompts=None):
        system = library.apply_to(
            System(workflow=workflow, prompts=prompts or {}, models={"policy": {"backend": "scripted", "name": "x"}})
        )
        traj = _run(task, system, [call_text(tool, kwargs)])
        assert traj.score == 1.0  # the call still runs and scores as its SQL
        return [s for s in traj.steps if getattr(s, "kind", "") == "llm"][0].messages

    plain = first_prompt({"max_turns": 1})
    assert [m.role for m in plain] == ["user"]
    told = first_prompt({"max_turns": 1, "tool_docs": True})
    assert [m.role for m in told] == ["system", "user"] and told[1].content == plain[0].content
    readable = tool.meta["template"].replace("{", "<").replace("}", ">").replace(" ( ", "(").replace(" )", ")")
    lines = told[0].content.splitlines()
    assert f"{tool.name}({', '.join(p for p in tool.params if p != 'db')}) = {readable.replace(' ,', ',')}" in lines
    assert len(lines) == 1 + len(library)  # the sentence, then one line per tool
    # an instruction stays first; the tools follow it in the same system message
    both = first_prompt({"max_turns": 1, "tool_docs": True}, {"instruction": "Answer in SQL."})
    assert both[0].content.startswith("Answer in SQL.\n\nInstead of SQL you may answer") and len(both) == 2


def test_tool_demos_teach_the_calls_and_leave_the_rest(data, library):
    tasks = data["train"][:40]
    plain = sql.demos(tasks, seed=0)
    taught = tool_demos(tasks, tools=library.to_json(), seed=0)
    assert len(plain) == len(taught)
    changed = 0
    for a, b in zip(plain, taught):
        assert a[:-1] == b[:-1]  # same prompts, same repair turns
        if a[-1] != b[-1]:
            changed += 1
            name = b[-1]["content"].split("(")[0]
            assert name in library
    assert 0 < changed <= len(plain)


def test_a_task_files_tool_library_is_checked_and_given_to_the_starting_system(data, library, tmp_path):
    path = save_library(library, tmp_path / "tools.json")
    assert load_library(path).to_json() == library.to_json()
    with pytest.raises(ConfigError, match="no file"):
        load_library(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_library(tmp_path / "bad.json")
    broken = json.loads(path.read_text())
    name = next(iter(broken))
    broken[name]["name"] = "not an identifier"
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ConfigError, match=f"tool '{name}'.*name"):
        load_library(tmp_path / "broken.json")
    from evolve.scoring.session import Session
    from evolve.task.taskfile import validate_task

    cfg = validate_task(
        {
            "agent": "evolve.worlds.sql:agent",
            "reward": "evolve.worlds.sql:reward",
            "tools": str(path),
            "models": {"policy": {"backend": "scripted", "name": "x"}},
            "dataset": {"source": "evolve.worlds.toy:dataset"},
            "budget": {"generations": 0},
        }
    )
    session = Session(cfg, base_dir=Path.cwd(), run_dir=tmp_path / "run")
    assert ToolLibrary.from_system(session.baseline()).to_json() == library.to_json()
