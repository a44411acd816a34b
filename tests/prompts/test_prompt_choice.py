"""The prompt_choice operator and the SQL world's template component (schema renderings)."""

from __future__ import annotations

import json

import pytest
import yaml

from evolve.prompts.choices import PromptChoice
from evolve.types import System
from evolve.worlds.sql import messages_for
from evolve.worlds.sql.render import (
    DEFAULT_TEMPLATE,
    TemplateError,
    as_ddl,
    fill,
    linked,
    pruned,
)
from tests.helpers import DATA
from tests.prompts.test_prompts import make_ctx, oplog

SCHEMA = "schema: owner(id,name,city) pet(id,name,age,owner_id) toy(id,color,pet_id)"


# ----------------------------------------------------------------------------- SQL renderings


def test_schema_sql_lays_the_tables_out_as_create_table_statements_sqlite_accepts():
    import sqlite3

    ddl = as_ddl(SCHEMA)
    assert ddl.splitlines() == [
        "CREATE TABLE owner (id, name, city);",
        "CREATE TABLE pet (id, name, age, owner_id);",
        "CREATE TABLE toy (id, color, pet_id);",
    ]
    conn = sqlite3.connect(":memory:")
    conn.executescript(ddl)  # the layout is real DDL, not a look-alike
    assert [r[0] for r in conn.execute("select name from sqlite_master order by name")] == ["owner", "pet", "toy"]
    text = fill("{schema_sql}\n\nQuestion: {question}", SCHEMA, "how many pet are there?")
    assert text == ddl + "\n\nQuestion: how many pet are there?"
    # the few-shot demos read the question back from this layout too
    from evolve.worlds.sql.fewshot import render_line

    assert (
        render_line({"input": text, "output": "select count(*) from pet"}, "full")
        == "e: how many pet are there? = select count(*) from pet\n"
    )


def test_schema_sql_pruned_is_the_pruned_tables_as_ddl():
    q = "list the city for each pet"
    assert (
        fill("{schema_sql_pruned}\n\nQuestion: {question}", SCHEMA, q)
        == "CREATE TABLE owner (id, name, city);\nCREATE TABLE pet (id, name, age, owner_id);\n\nQuestion: " + q
    )
    # a question that names no table keeps them all, like {schema_pruned}
    assert fill("{schema_sql_pruned}", SCHEMA, "nothing named here") == as_ddl(SCHEMA)


def test_linked_puts_the_tables_the_question_names_first_and_keeps_the_rest_in_order():
    assert (
        linked(SCHEMA, "how many pet are older than 3?")
        == "schema: pet(id,name,age,owner_id) owner(id,name,city) toy(id,color,pet_id)"
    )
    assert (
        linked(SCHEMA, "list the toy of each owner")
        == "schema: owner(id,name,city) toy(id,color,pet_id) pet(id,name,age,owner_id)"
    )
    assert linked(SCHEMA, "nothing named here") == SCHEMA


def test_pruned_keeps_the_named_tables_a_parent_whose_column_is_asked_for_and_the_join_between():
    assert pruned(SCHEMA, "how many pet are older than 3?") == "schema: pet(id,name,age,owner_id)"
    # the question names pet and owner's column city, not owner: pet points to owner, so owner stays
    assert pruned(SCHEMA, "list the city for each pet") == "schema: owner(id,name,city) pet(id,name,age,owner_id)"
    # toy and owner are named; pet is the table that joins them
    assert pruned(SCHEMA, "list the color of each toy whose owner is bob") == SCHEMA
    assert pruned(SCHEMA, "which rows have color red") == "schema: toy(id,color,pet_id)"  # by a column
    assert pruned(SCHEMA, "nothing named here") == SCHEMA


def test_renderings_keep_what_surrounds_the_tables_and_read_names_case_blind():
    assert linked("owner(id,name) pet(id,owner_id)", "list each pet") == "pet(id,owner_id) owner(id,name)"
    text = "schema: owner(id,name) pet(id,owner_id)\nfk: pet.owner_id -> owner.id"
    assert linked(text, "each pet") == "schema: pet(id,owner_id) owner(id,name)\nfk: pet.owner_id -> owner.id"
    assert (
        linked("schema: Owner(id,Name) Pet(id,owner_id)", "list each pet") == "schema: Pet(id,owner_id) Owner(id,Name)"
    )
    assert (
        pruned("schema: owner(id, name, city) pet(id, age, owner_id)", "the city of every one")
        == "schema: owner(id, name, city)"
    )


def test_the_default_template_sends_exactly_the_message_every_cold_start_was_trained_on():
    task = {"schema": SCHEMA, "question": "how many pet are older than 3?"}
    plain = messages_for(task)
    assert plain[-1].content == f"{SCHEMA}\nq: how many pet are older than 3?"
    assert messages_for(task, template=DEFAULT_TEMPLATE) == plain
    got = messages_for(task, template="{schema_linked}\nq: {question}")[-1].content
    assert got.startswith("schema: pet(") and got.endswith("\nq: how many pet are older than 3?")


def test_a_bad_template_names_the_field_and_the_ones_the_agent_fills():
    with pytest.raises(TemplateError, match=r"names qestion; the SQL agent fills \{schema\}"):
        fill("{schema}\nq: {qestion}", SCHEMA, "q")
    with pytest.raises(TemplateError, match="not a format string"):
        fill("{schema\nq", SCHEMA, "q")
    for fancy in ("{schema!r}\nq: {question}", "{schema:{x}}\nq: {question}"):
        with pytest.raises(TemplateError, match="plainly"):
            fill(fancy, SCHEMA, "q")


def test_the_sql_agent_reads_the_template_component_of_its_system():
    from evolve.llm.fake import ScriptedLM
    from evolve.worlds.sql import agent

    seen = []
    lm = ScriptedLM("m", lambda messages: seen.append(messages[-1].content) or "select 1")

    class Ctx:
        system = System(prompts={"template": "{schema_pruned}\nq: {question}"}, workflow={"max_turns": 1})

        def llm(self, role):
            return lm

        def tool(self, name, fn, **kw):
            return fn(**kw)

    task = {"schema": SCHEMA, "question": "how many pet are there", "db": ":memory:"}
    agent(task, Ctx())
    assert seen == ["schema: pet(id,name,age,owner_id)\nq: how many pet are there"]


# ----------------------------------------------------------------------------- the operator


def parent_with(**prompts):
    return System(prompts=prompts)


def test_children_each_change_one_component_to_an_alternative_other_than_the_parents(tmp_path):
    op = PromptChoice(
        choices={"template": ["A {question}", "B {question}", "C {question}"], "instruction": ["", "be brief"]},
        children=10,
    )
    parent = parent_with(template="A {question}", instruction="")
    ctx, _ = make_ctx(tmp_path)
    kids = op.propose(parent, ctx)
    changes = sorted((c.info["component"], c.system.prompts[c.info["component"]]) for c in kids)
    assert changes == [("instruction", "be brief"), ("template", "B {question}"), ("template", "C {question}")]
    for c in kids:  # exactly one component differs from the parent's
        assert sum(c.system.prompts.get(k) != parent.prompts.get(k) for k in ("template", "instruction")) == 1
        assert c.parents == (parent.id,) and c.operator == "prompt_choice"
    assert len(oplog(ctx, "prompt_choice")["children"]) == 3


def test_children_are_capped_drawn_by_the_rng_and_deterministic(tmp_path):
    op = PromptChoice(choices={"template": [f"{i} {{question}}" for i in range(6)]}, children=2)
    parent = parent_with(template="0 {question}")
    runs = [[c.system.id for c in op.propose(parent, make_ctx(tmp_path / str(i), seed=3)[0])] for i in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 2
    firsts = {
        op.propose(parent, make_ctx(tmp_path / f"s{k}", seed=k)[0])[0].system.prompts["template"] for k in range(12)
    }
    assert len(firsts) >= 3  # the order is the rng's, not the list's
    assert op.estimate(None)["children"] == 2


def test_a_child_the_archive_already_holds_is_skipped_for_the_next_alternative(tmp_path):
    op = PromptChoice(choices={"template": ["A", "B", "C"]}, children=1)
    parent = parent_with(template="A")
    first = op.propose(parent, make_ctx(tmp_path / "a", seed=0)[0])[0]
    ctx, _ = make_ctx(tmp_path / "b", seed=0, extra={"known": lambda sid: sid == first.system.id})
    [second] = op.propose(parent, ctx)
    assert second.system.id != first.system.id and second.system.prompts["template"] in {"B", "C"}
    assert "already in the archive" in oplog(ctx, "prompt_choice")["rejected"][0]["reason"]
    ctx, _ = make_ctx(tmp_path / "c", seed=0, extra={"known": lambda sid: True})
    assert op.propose(parent, ctx) == []
    assert "judged before" in oplog(ctx, "prompt_choice")["notes"][0]["note"]


def test_json_components_take_structured_alternatives_and_bad_params_are_named():
    op = PromptChoice(choices={"demos": [[], [{"input": "1+1", "output": "2"}]]})
    assert op.p.choices["demos"][0] == ""  # no demos is the component left out
    assert json.loads(op.p.choices["demos"][1]) == [{"input": "1+1", "output": "2"}]
    with pytest.raises(ValueError, match="the same alternative twice"):  # the same demos, as text and as YAML
        PromptChoice(choices={"demos": ['[{"input": "1+1", "output": "2"}]', [{"input": "1+1", "output": "2"}]]})
    with pytest.raises(ValueError, match="one component twice: 'template' and 'policy.template'"):
        PromptChoice(choices={"template": ["A"], "policy.template": ["B"]})
    with pytest.raises(ValueError, match="refuses the alternative '{schema}.nq: {qestion}'"):
        PromptChoice(
            choices={"template": ["", "{schema}\nq: {qestion}"]},
            checks={"template": "evolve.worlds.sql.render:check_template"},
        )
    with pytest.raises(ValueError, match="checks names 'format', which has no choices"):
        PromptChoice(choices={"template": ["A"]}, checks={"format": "evolve.worlds.sql.render:check_template"})
    with pytest.raises(ValueError, match="unknown kind 'instructon'"):
        PromptChoice(choices={"instructon": ["a"]})
    with pytest.raises(ValueError, match="the same alternative twice"):
        PromptChoice(choices={"instruction": ["a", "a"]})
    with pytest.raises(ValueError, match="must be text"):
        PromptChoice(choices={"instruction": [3]})
    with pytest.raises(ValueError, match="at least one component"):
        PromptChoice(choices={})
    with pytest.raises(ValueError, match="demos"):
        PromptChoice(choices={"demos": ["not json"]})


def test_the_engine_promotes_the_alternative_that_scores_best(tmp_path):
    import evolve

    task = yaml.safe_load((DATA / "toy.yaml").read_text())
    task.update(
        operators=[
            {
                "name": "prompt_choice",
                "params": {"choices": {"instruction": ["multiply", "subtract", "add carefully"]}, "children": 2},
            }
        ],
        budget={"generations": 2},
        engine={"minibatch": 6},
    )
    task["dataset"]["params"] = {"n_train": 12, "n_val": 6, "n_test": 6}
    report = evolve.run(task, out=tmp_path / "run", base_dir=DATA)
    assert evolve.load(tmp_path / "run").system.prompts["instruction"] == "add carefully"
    assert report["best"]["test"]["score"] == 1.0 > report["baseline"]["test"]["score"]
    assert "prompt_choice" in json.dumps(evolve.dry_run(task, base_dir=DATA), default=str)


def test_an_empty_alternative_leaves_the_component_out_so_the_start_is_recognised(tmp_path):
    op = PromptChoice(choices={"template": ["", "{schema_linked}\nq: {question}"]}, children=5)
    start = parent_with(instruction="")
    [child] = op.propose(start, make_ctx(tmp_path / "a")[0])
    assert child.system.prompts["template"] == "{schema_linked}\nq: {question}"
    [back] = op.propose(child.system, make_ctx(tmp_path / "b")[0])
    assert back.system.id == start.id and "template" not in back.system.prompts


def test_the_engine_gives_operators_a_known_test_backed_by_the_archive(tmp_path):
    import evolve
    from evolve.registry import operators

    seen = []

    class Probe:
        name = "known_probe"

        def propose(self, parent, ctx):
            known = ctx.extra["known"]
            seen.append((known(parent.id), known("0" * 16)))
            return []

    operators.register("known_probe", Probe)
    task = yaml.safe_load((DATA / "toy.yaml").read_text())
    task.update(operators=[{"name": "known_probe"}], budget={"generations": 1}, engine={"minibatch": 4})
    task["dataset"]["params"] = {"n_train": 8, "n_val": 4, "n_test": 4}
    evolve.run(task, out=tmp_path / "run", base_dir=DATA)
    assert seen == [(True, False)]


def test_a_workflow_graphs_write_step_lays_out_the_prompt_by_the_template_as_the_agent_does(tmp_path):
    from evolve.api import LoadedSystem
    from evolve.types import ModelSpec
    from evolve.worlds.sql.workflow import single_step
    from tests.prompts.test_prompts import scripted

    spec, seen = scripted("graph-writer", "select 1")
    system = System(
        prompts={"template": "{schema_linked}\nq: {question}"},
        workflow={"graph": single_step()},
        models={"policy": ModelSpec(**spec)},
    )
    loaded = LoadedSystem(system, tmp_path, "evolve.topology.runtime:agent")
    try:
        loaded.run({"id": "t", "schema": SCHEMA, "question": "how many toy are red", "db": ":memory:"})
    finally:
        loaded.close()
    assert (
        seen[0][-1].content == "schema: toy(id,color,pet_id) owner(id,name,city) pet(id,name,age,owner_id)\n"
        "q: how many toy are red"
    )


@pytest.mark.parametrize("path", sorted((DATA.parent.parent / "examples").glob("*/*.yaml")), ids=lambda p: p.name)
def test_every_example_task_file_loads(path):
    from evolve.task.taskfile import load_task

    cfg, _ = load_task(path, [])
    if path.name == "star_layout.yaml":  # task.yaml's pipeline plus the layout search
        assert [o.name for o in cfg.operators] == ["star", "prompt_choice"]
