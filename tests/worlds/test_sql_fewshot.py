"""Few-shot demos in the SQL world: masked rendering, the agent reading the ``demos`` component,
the few-shot cold-start data (no training), and the DSPy adapter sending the same messages."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from evolve.llm.fake import ScriptedLM
from evolve.prompts.components import set_demos
from evolve.rollout import run_agent
from evolve.types import LLMCall, Message, ModelSpec, System
from evolve.worlds.sql import agent, messages_for, prompt_text
from evolve.worlds.sql.coldstart import fewshot_demos
from evolve.worlds.sql.fewshot import mask, render, render_line
from evolve.worlds.sql.prompt import fewshot_messages

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sql_agent"


def _task(
    i: int,
    template: str,
    db: str = "",
    question: str = "how many pet are there?",
    sql: str = "select count(*) from pet",
) -> dict:
    return {
        "id": f"t{i}",
        "db": db or f"/db/{i}.sqlite",
        "template": template,
        "schema": f"schema: pet(id,name,age) s{i}(id)",
        "question": question,
        "gold_sql": sql,
    }


def test_messages_without_demos_are_unchanged():
    t = _task(0, "count")
    plain = [Message(role="user", content=prompt_text(t["schema"], t["question"]))]
    assert messages_for(t) == plain
    assert messages_for(t, demos=[]) == plain and messages_for(t, demos=None) == plain
    assert messages_for(t, "be brief") == [Message(role="system", content="be brief"), *plain]
    assert messages_for(t, examples=[{"question": "q?", "sql": "select 1"}]) == [
        Message(role="user", content="e: q? = select 1\n" + plain[0].content)
    ]


def test_mask_replaces_names_and_values_in_question_and_sql():
    q, s = mask("what are the name of pet whose age is above 13.", "select name from pet where age > 13")
    assert (q, s) == ("what are the c0 of t0 whose c1 is above v0.", "select c0 from t0 where c1 > v0")
    q, s = mask("list the name of pet with city = 'oslo'", "select name from pet where city = 'oslo'")
    assert (q, s) == ("list the c0 of t0 with c1 = v0", "select c0 from t0 where c1 = v0")
    q, s = mask(
        "count the pet whose owner has age 9.",
        "select count(*) from pet a join owner b on a.owner_id = b.id where b.age = 9",
    )
    assert s == "select count(*) from t0 a join t1 b on a.c0 = b.c1 where b.c2 = v0"
    assert q == "count the t0 whose t1 has c2 v0."
    assert mask("no sql here", "") == ("no sql here", "")


def test_render_reads_every_demo_shape():
    sql = "select count(*) from pet"
    harvested = {"input": "e: old one = select 1\nschema: pet(id)\nq: how many pet are there?", "output": sql + ";"}
    dspy_like = {"question": "how many pet are there?", "schema": "schema: pet(id)", "gold_sql": sql}
    line = "e: how many t0 are there? = select count(*) from t0\n"
    assert (
        render_line(harvested)
        == render_line(dspy_like)
        == render_line({"question": dspy_like["question"], "sql": sql})
        == line
    )
    assert render_line(dspy_like, "full") == f"e: how many pet are there? = {sql}\n"
    assert render([]) == "" and render(None) == ""


def _db(tmp_path: Path) -> str:
    path = tmp_path / "pets.sqlite"
    con = sqlite3.connect(path)
    con.executescript("create table pet(id integer, name text, age integer); insert into pet values (1, 'rex', 3);")
    con.commit()
    con.close()
    return str(path)


def test_the_agent_puts_the_systems_demos_before_the_prompt(tmp_path):
    t = _task(0, "count", db=_db(tmp_path))
    seen = []
    lm = ScriptedLM("fake", lambda msgs: (seen.append(msgs), "select count(*) from pet")[1])
    system = System(models={"policy": ModelSpec(backend="scripted", name="fake")}, workflow={"max_turns": 1})
    demo = {
        "input": "schema: dog(id,age)\nq: how many dog have age > 2?",
        "output": "select count(*) from dog where age > 2",
    }
    head_demo = "e: how many t0 have c0 > v0? = select count(*) from t0 where c0 > v0\n"
    for sys_, head in ((system, ""), (set_demos(system, [demo]), head_demo)):
        seen.clear()
        traj = run_agent(agent, sys_, t, lambda s, r: lm)
        assert traj.error is None and traj.output["rows"] == [[1]]
        assert seen[0][-1].content == head + prompt_text(t["schema"], t["question"])
        call = next(s for s in traj.steps if isinstance(s, LLMCall))
        assert [m.content for m in call.messages] == [m.content for m in fewshot_messages(t, [demo] if head else [])]


def test_fewshot_cold_start_data():
    templates = {
        "count": "select count(*) from pet where age > {i}",
        "filter": "select name from pet where age > {i}",
        "max": "select max(age) from pet where id > {i}",
        "sum": "select sum(age) from pet where id < {i}",
    }
    masked = {k: mask("", v.format(i=1))[1] for k, v in templates.items()}
    tasks = [
        _task(i, name, db=f"/db/{i // 2}.sqlite", question=f"what about pet with age > {i}?", sql=sql.format(i=i))
        for i in range(80)
        for name, sql in [list(templates.items())[i % 4]]
    ]
    by_prompt = {prompt_text(t["schema"], t["question"]): t for t in tasks}
    chats = fewshot_demos(tasks, seed=3, max_k=3, match=0.5)
    assert chats == fewshot_demos(tasks, seed=3, max_k=3, match=0.5)  # deterministic
    assert len(chats) == len(tasks)  # retry_frac=0: one chat per task
    ks, matched = [], 0
    for chat in chats:
        assert [m["role"] for m in chat] == ["user", "assistant"]
        user = chat[0]["content"]
        prompt = user[user.index("schema: ") :]
        task = by_prompt[prompt]
        assert chat[1]["content"] == task["gold_sql"]
        lines = user[: user.index("schema: ")].splitlines()
        assert all(line.startswith("e: ") and " = select " in line for line in lines)
        assert "pet" not in "".join(lines)  # masked: the demos name nothing
        ks.append(len(lines))
        own = sum(line.endswith(" = " + masked[task["template"]]) for line in lines)
        assert own <= 1  # at most one demo of the task's own template
        matched += own
    assert set(ks) == {0, 1, 2, 3}
    with_demos = sum(1 for k in ks if k)
    assert 0.3 * with_demos < matched < 0.7 * with_demos  # about half see a demo of their own template
    none = fewshot_demos(tasks, seed=3, max_k=0)
    assert [c[0]["content"] for c in none] == [prompt_text(t["schema"], t["question"]) for t in tasks]


def test_fewshot_demos_never_come_from_the_tasks_database():
    tasks = [
        _task(
            i,
            "count" if i % 2 else "filter",
            db=f"/db/{i % 3}.sqlite",
            question=f"how many s{i} are there?",
            sql=f"select count(*) from s{i}",
        )
        for i in range(30)
    ]
    for chat in fewshot_demos(tasks, seed=0, max_k=4, match=1.0, style="full"):
        user = chat[0]["content"]
        own = next(t for t in tasks if user.endswith(prompt_text(t["schema"], t["question"])))
        shown = [int(w[1:]) for w in user[: user.index("schema: ")].split() if w.startswith("s") and w[1:].isdigit()]
        assert all(tasks[i]["db"] != own["db"] for i in shown)


def test_the_dspy_adapter_sends_the_native_agents_messages():
    pytest.importorskip("dspy")
    from tests.helpers import script

    program = script("examples/sql_agent/sql_program.py", "sql_program")
    OUTPUT, SQLAdapter, WriteSQL = program.OUTPUT, program.SQLAdapter, program.WriteSQL
    t = _task(0, "count")
    demos = [
        {
            "question": "how many dog have age > 2?",
            "db_schema": "schema: dog(id,age)",
            "gold_sql": "select count(*) from dog where age > 2",
        }
    ]
    ad = SQLAdapter()
    got = ad.format(WriteSQL, demos, {"question": t["question"], "db_schema": t["schema"]})
    want = fewshot_messages(t, demos)
    assert got == [{"role": m.role, "content": m.content} for m in want]
    assert ad.format(WriteSQL, [], {"question": t["question"], "db_schema": t["schema"]}) == [
        {"role": "user", "content": prompt_text(t["schema"], t["question"])}
    ]
    assert ad.parse(WriteSQL, "```sql\nselect 1;\n```") == {OUTPUT: "select 1"}
    import dspy

    other = dspy.Signature("topic -> summary")
    assert ad.parse(other, "not in the chat format") == {"summary": "not in the chat format"}


def test_prompts_yaml_loads():
    from evolve.task.taskfile import load_task

    cfg, _ = load_task(EXAMPLES / "prompts.yaml", [])
    assert cfg.models["policy"].cold_start.demos == "evolve.worlds.sql:fewshot_demos"
    assert [o.name for o in cfg.operators] == ["prompt_choice", "bootstrap_demos"] and cfg.engine.selector == "pareto"
    from evolve.prompts.choices import PromptChoice
    from evolve.worlds.sql.render import check_template

    for t in PromptChoice(**cfg.operators[0].params).p.choices["template"]:  # every layout is one the agent fills
        check_template(t)
    assert json.dumps(cfg.workflow) == json.dumps({"max_turns": 1, "max_tokens": 96})
