"""The offline SQL world: generation, disjoint splits, safe execution, reward, agent, demos."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from evolve.types import Message, Reward, System
from evolve.worlds import sql
from evolve.worlds.sql.coldstart import corrupt
from evolve.worlds.sql.db import execute

SIZES = {"n_train": 80, "n_val": 20, "n_test": 40}
CHARSET = re.compile(r"^[a-z0-9 _,.()*=<>'?:;\-\n]+$")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return sql.build(tmp_path_factory.mktemp("sqlw"), seed=0, **SIZES)


def _relative(tasks: dict[str, list[dict]], root: Path) -> dict:
    return {s: [dict(t, db=str(Path(t["db"]).relative_to(root))) for t in ts] for s, ts in tasks.items()}


def _db_names(db: str) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        tables = [r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")]
        names = set(tables)
        for t in tables:
            names |= {r[1] for r in conn.execute(f"pragma table_info({t})")}
    finally:
        conn.close()
    return names - {"id"}


def test_sizes_fields_and_unique_ids(data: dict[str, list[dict]]) -> None:
    assert {s: len(ts) for s, ts in data.items()} == {"train": 80, "val": 20, "test": 40}
    ids = [t["id"] for ts in data.values() for t in ts]
    assert len(ids) == len(set(ids))
    for split, ts in data.items():
        for t in ts:
            assert {"id", "db", "schema", "question", "gold_sql", "template", "split", "domain"} <= set(t)
            assert t["split"] == split and Path(t["db"]).is_absolute() and Path(t["db"]).is_file()
    assert len({t["template"] for t in data["train"]}) >= 7


def test_deterministic_per_seed(tmp_path: Path, data: dict[str, list[dict]]) -> None:
    a = sql.build(tmp_path / "a", seed=0, **SIZES)
    b = sql.build(tmp_path / "b", seed=0, **SIZES)
    assert _relative(a, tmp_path / "a") == _relative(b, tmp_path / "b")
    for ta, tb in zip(a["test"][:10], b["test"][:10]):
        with sqlite3.connect(ta["db"]) as ca, sqlite3.connect(tb["db"]) as cb:
            assert list(ca.iterdump()) == list(cb.iterdump())
    c = sql.build(tmp_path / "c", seed=1, **SIZES)
    assert [t["question"] for t in c["train"]] != [t["question"] for t in a["train"]]


def test_reuse_and_rebuild(tmp_path: Path) -> None:
    first = sql.build(tmp_path, seed=3, n_train=10, n_val=5, n_test=5)
    t0 = time.perf_counter()
    again = sql.build(tmp_path, seed=3, n_train=10, n_val=5, n_test=5)
    assert again == first and time.perf_counter() - t0 < 0.5
    other = sql.build(tmp_path, seed=3, n_train=12, n_val=5, n_test=5)
    assert len(other["train"]) == 12
    builds = [p for p in tmp_path.iterdir() if (p / "tasks.json").is_file()]
    assert len(builds) == 1  # the stale build was dropped


def test_dataset_uses_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path))
    d = sql.dataset(seed=5, n_train=6, n_val=3, n_test=3)
    assert all(Path(t["db"]).is_relative_to(tmp_path / "sql_world") for ts in d.values() for t in ts)
    assert sql.dataset(seed=5, n_train=6, n_val=3, n_test=3) == d


def test_test_names_and_domains_disjoint(data: dict[str, list[dict]]) -> None:
    def names(tasks: list[dict]) -> set[str]:
        return set().union(*(_db_names(db) for db in {t["db"] for t in tasks}))

    seen, test = names(data["train"] + data["val"]), names(data["test"])
    assert seen and test and not (seen & test)
    assert len(seen) > 100  # wide variety of names in training
    assert not ({t["domain"] for t in data["train"] + data["val"]} & {t["domain"] for t in data["test"]})
    # the rendered schema shows exactly the database's names
    for t in data["test"][:10]:
        shown = set(re.findall(r"[a-z_]+", t["schema"].removeprefix("schema:"))) - {"id"}
        assert shown == _db_names(t["db"])


def test_val_from_held_out_domains_is_its_own_and_the_default_is_unchanged(
    tmp_path: Path, data: dict[str, list[dict]]
) -> None:
    other = sql.build(tmp_path / "v", seed=0, val_side="test", **SIZES)
    for split in ("train", "test"):  # the same tasks as the default build
        assert [t["gold_sql"] for t in other[split]] == [t["gold_sql"] for t in data[split]]
    train_domains = {t["domain"] for t in other["train"]}
    assert not ({t["domain"] for t in other["val"]} & train_domains)  # held-out domains...
    assert not ({t["db"] for t in other["val"]} & {t["db"] for t in other["test"]})  # ...not test's databases
    assert not {t["question"] for t in other["val"]} & {t["question"] for t in other["test"]}
    with pytest.raises(ValueError, match="val_side must be 'train'"):
        sql.build(tmp_path / "bad", seed=0, val_side="dev", **SIZES)


def test_gold_sql_runs_nonempty_and_scores_one(data: dict[str, list[dict]]) -> None:
    for ts in data.values():
        for t in ts:
            rows = execute(t["db"], t["gold_sql"])
            assert rows and all(v is not None for v in rows[0]), t
            r = sql.reward(t, {"sql": t["gold_sql"], "rows": rows, "turns": 1})
            assert isinstance(r, Reward) and r.score == 1.0, (t, r)
            assert r.components == {"parses": 1.0, "executes": 1.0, "matches": 1.0}


def test_lengths_and_charset(data: dict[str, list[dict]]) -> None:
    for ts in data.values():
        for t in ts:
            p = sql.prompt_text(t["schema"], t["question"])
            assert len(p) <= sql.MAX_PROMPT and len(t["gold_sql"]) <= sql.MAX_SQL
            assert CHARSET.match(p) and CHARSET.match(t["gold_sql"]), t
            assert t["gold_sql"] == " ".join(t["gold_sql"].split()) and t["gold_sql"] == t["gold_sql"].lower()


def test_reward_wrong_error_and_garbage(data: dict[str, list[dict]]) -> None:
    t = next(x for x in data["train"] if x["template"] == "count_where")
    table = re.search(r" from (\w+)", t["gold_sql"]).group(1)
    wrong = sql.reward(t, {"sql": f"select count(*) from {table} where 1 = 0"})
    assert wrong.score == 0.0 and wrong.components == {"parses": 1.0, "executes": 1.0, "matches": 0.0}
    assert "expected" in wrong.feedback
    bad = sql.reward(t, {"sql": f"select nosuchcol from {table}"})
    assert bad.score == 0.0 and bad.components["parses"] == 0.0 and "no such column" in bad.feedback
    assert sql.reward(t, t["gold_sql"] + ";").score == 1.0  # a bare string is accepted too
    for garbage in (None, 42, "", "!!", {}, {"sql": None}, {"sql": 7}, ["select 1"], {"sql": "drop table x"}):
        r = sql.reward(t, garbage)
        assert r.score == 0.0 and r.components["matches"] == 0.0
    r = sql.reward({"question": "?"}, {"sql": "select 1"})  # a broken task is reported, not raised
    assert r.score == 0.0 and r.error


def test_order_matters_only_with_order_by(data: dict[str, list[dict]]) -> None:
    checked = 0
    for t in (x for x in data["train"] if x["template"] == "order_limit"):
        c, tab, o, d, k = re.fullmatch(
            r"select (\w+) from (\w+) order by (\w+) (asc|desc) limit (\d+)", t["gold_sql"]
        ).groups()
        flip = "asc" if d == "desc" else "desc"
        rev = f"select {c} from (select {c}, {o} from {tab} order by {o} {d} limit {k}) order by {o} {flip}"
        gold = execute(t["db"], t["gold_sql"])
        if execute(t["db"], rev) != gold:
            r = sql.reward(t, {"sql": rev})
            assert r.score == 0.0 and "order" in r.feedback
            checked += 1
    assert checked
    g = next(x for x in data["train"] if x["template"] == "group_count")
    assert sql.reward(g, {"sql": g["gold_sql"] + " order by count(*) desc, 1 desc"}).score == 1.0


def test_execute_is_read_only_and_single_select(data: dict[str, list[dict]]) -> None:
    db = data["test"][0]["db"]
    table = re.findall(r"(\w+)\(", data["test"][0]["schema"])[0]
    before = execute(db, f"select count(*) from {table}")
    for bad in (
        f"drop table {table}",
        f"delete from {table}",
        f"insert into {table} (id) values (999)",
        f"select 1; drop table {table}",
        "select 1; select 2",
        "pragma writable_schema = 1",
        "attach database 'x.db' as x",
        f"select * from {table} where id in (select 1); update {table} set id = 0",
        "",
        None,
    ):
        with pytest.raises(sql.SQLError):
            execute(db, bad)  # type: ignore[arg-type]
    assert execute(db, f"select count(*) from {table}") == before
    assert execute(db, "select 'a;b'") == [["a;b"]]  # a semicolon inside a literal is fine
    assert len(execute(db, f"select * from {table} x, {table} y", max_rows=7)) == 7
    t0 = time.perf_counter()
    with pytest.raises(sql.SQLError, match="timed out"):
        execute(
            db, f"select count(*) from {table} a, {table} b, {table} c, {table} d, {table} e, {table} f", timeout=0.2
        )
    assert time.perf_counter() - t0 < 2.0


class FakeLLM:
    def __init__(self, outputs: list[str]) -> None:
        self.outputs, self.seen = list(outputs), []

    def complete(self, messages, max_tokens=None, stop=None, **_):  # noqa: ANN001
        self.seen.append(list(messages))
        return SimpleNamespace(text=self.outputs.pop(0))


class FakeCtx:
    def __init__(self, outputs: list[str], **system) -> None:  # noqa: ANN003
        self.system, self.policy, self.calls = System(**system), FakeLLM(outputs), []

    def llm(self, role: str) -> FakeLLM:
        assert role == "policy"
        return self.policy

    def tool(self, name, fn, **kwargs):  # noqa: ANN001
        try:
            result = fn(**kwargs)
        except Exception as e:
            self.calls.append((name, kwargs, None, str(e)))
            raise
        self.calls.append((name, kwargs, result, None))
        return result


def test_agent_recovers_from_an_error(data: dict[str, list[dict]]) -> None:
    t = next(x for x in data["test"] if x["template"] == "select_where")
    col = re.match(r"select (\w+)", t["gold_sql"]).group(1)
    typo = t["gold_sql"].replace(f"select {col}", f"select {col}x", 1)
    ctx = FakeCtx([typo, "  " + t["gold_sql"] + " ;\n"], prompts={"instruction": "write sqlite sql."})
    out = sql.agent(t, ctx)
    assert out["turns"] == 2 and out["sql"] == t["gold_sql"] and out["rows"] == execute(t["db"], t["gold_sql"])
    first, second = ctx.policy.seen
    assert [m.role for m in first] == ["system", "user"] and first[1].content == sql.prompt_text(
        t["schema"], t["question"]
    )
    assert [m.role for m in second] == ["system", "user", "assistant", "tool"]
    assert second[2].content == typo and second[3].content == f"error: no such column: {col}x"
    assert [c[0] for c in ctx.calls] == ["execute_sql", "execute_sql"] and ctx.calls[0][3]
    assert sql.reward(t, out).score == 1.0


def test_agent_gives_up_after_max_turns(data: dict[str, list[dict]]) -> None:
    t = data["train"][0]
    ctx = FakeCtx(["garbage", ""], workflow={"max_turns": 2})
    out = sql.agent(t, ctx)
    assert out == {"sql": "", "rows": None, "turns": 2}
    assert [m.role for m in ctx.policy.seen[0]] == ["user"]  # empty instruction: no system message
    assert ctx.policy.seen[1][-1] == Message(role="tool", content=ctx.policy.seen[1][-1].content)
    assert sql.reward(t, out).score == 0.0


def test_demos_format_and_repairs(data: dict[str, list[dict]]) -> None:
    tasks = data["train"][:40]
    ds = sql.demos(tasks, retry_frac=0.5, instruction="sql please")
    single = [d for d in ds if len(d) == 3]
    repairs = [d for d in ds if len(d) == 5]
    assert len(single) == len(tasks) and len(repairs) >= 8
    assert single[0][0] == {"role": "system", "content": "sql please"}
    for d in repairs:
        assert [m["role"] for m in d] == ["system", "user", "assistant", "tool", "assistant"]
        assert d[3]["content"].startswith("error: ") and d[2]["content"] != d[4]["content"]
    assert sql.demos(tasks[:3], retry_frac=0.0)[0][0]["role"] == "user"
    assert sql.demos(tasks, retry_frac=0.5) == sql.demos(tasks, retry_frac=0.5)  # deterministic


def test_demos_are_laid_out_in_the_systems_template(data: dict[str, list[dict]]) -> None:
    # a cold start teaches the layout the agent will ask in (task_smollm.yaml's CREATE TABLE lines)
    from evolve.worlds.sql.coldstart import fewshot_demos
    from evolve.worlds.sql.render import as_ddl

    tasks, template = data["train"][:6], "{schema_sql}\n\nQuestion: {question}"
    for chat, t in zip(sql.demos(tasks, retry_frac=0.0, template=template), tasks):
        assert chat[0] == {"role": "user", "content": as_ddl(t["schema"]) + "\n\nQuestion: " + t["question"]}
        assert sql.messages_for(t, template=template)[0].content == chat[0]["content"]  # what the agent sends
    # the few-shot heads still find their prompt in that layout
    chats = fewshot_demos(tasks, seed=1, max_k=2, match=1.0, style="full", template=template)
    assert all(
        c[0]["content"].endswith(as_ddl(t["schema"]) + "\n\nQuestion: " + t["question"]) for c, t in zip(chats, tasks)
    )
    assert any(c[0]["content"].startswith("e: ") for c in chats)
    # and the cold start hands the task file's template to the world's demos function
    from evolve.policy.sft import _demos

    task = SimpleNamespace(seed=0, prompts={"instruction": "sql please", "template": template})
    session = SimpleNamespace(
        task=task, splits={"train": tasks, "val": tasks}, base_dir=Path("."), initial_tools=dict, initial_memory=dict
    )
    cs = SimpleNamespace(n_demos=3, n_eval=2, demos="evolve.worlds.sql:demos", augment=0)
    picked, chats, *_ = _demos(session, "policy", SimpleNamespace(cold_start=cs))
    assert [c[1]["content"] for c in chats if len(c) == 3] == [
        sql.messages_for(t, template=template)[0].content for t in picked
    ]


def test_corrupt_makes_failing_queries(data: dict[str, list[dict]]) -> None:
    import random

    rng = random.Random(0)
    fails = 0
    for t in data["train"][:40]:
        bad = corrupt(rng, t)
        try:
            execute(t["db"], bad)
        except sql.SQLError:
            fails += 1
    assert fails >= 30


def test_name_words_are_the_schema_names_so_training_names_become_pointers(data):
    from evolve.policy.pointer import PointerTokenizer

    train = data["train"]
    words = sql.name_words(train)
    assert words == set().union(*(_db_names(t["db"]) for t in train))  # every table and column but id
    chats = sql.demos(train)
    texts = [" ".join(m["content"] for m in chat) for chat in chats]
    plain = PointerTokenizer.fit(texts, min_share=0.05)
    assert plain.keep & words, "frequent training names are spelled by default (what pointer_words fixes)"
    tok = PointerTokenizer.fit(texts, min_share=0.05, pointers=words)
    assert not tok.keep & words and {"select", "from", "id"} <= tok.keep


def test_workflow_stop_cuts_the_talk_after_the_query(data: dict[str, list[dict]]) -> None:
    from evolve.llm.fake import ScriptedLM
    from evolve.rollout import run_agent, score

    t = data["test"][0]
    said = t["gold_sql"] + "; This query returns the rows you asked for.\n\nIt works because..."

    def run(workflow: dict, agent=sql.agent):
        llm = ScriptedLM(responses=[said], cycle=False)
        system = System(workflow=workflow, models={"policy": {"backend": "scripted", "name": "x"}})
        return score(sql.reward, t, run_agent(agent, system, t, lambda s, role: llm))

    talked = run({"max_turns": 1})  # without stop strings the whole reply is the query: refused
    assert talked.score == 0.0 and talked.output["rows"] is None
    cut = run({"max_turns": 1, "stop": [";", "\n\n"]})
    assert cut.score == 1.0 and cut.output["sql"] == t["gold_sql"]
    (call,) = [s for s in cut.steps if getattr(s, "kind", "") == "llm"]
    assert call.output == t["gold_sql"]  # what the model said ends at the first stop string
    # the same system as a workflow graph (topology search's starting point) stops where the agent does
    from evolve.topology import agent as graph_agent
    from evolve.worlds.sql.workflow import single_step

    assert run({"graph": single_step()}, graph_agent).score == 0.0
    assert run({"graph": single_step(), "stop": [";", "\n\n"]}, graph_agent).score == 1.0


def test_every_smollm_layers_row_is_a_valid_task() -> None:
    # bench/layers/smollm_layers.py runs hour-long rows: an override that does not load would only show there.
    # The bench is asked for its rows as a command, as a user runs it (a test imports no bench script).
    import json
    import subprocess
    import sys

    from evolve.task.taskfile import load_task
    from evolve.worlds.sql.workflow import PALETTE

    root = Path(__file__).resolve().parents[2]
    bench = root / "bench" / "layers" / "smollm_layers.py"
    out = subprocess.run([sys.executable, str(bench), "--rows-json"], capture_output=True, text=True, check=True)
    layers = json.loads(out.stdout)
    cfgs = {row: load_task(Path(layers["task"]), sets)[0] for row, sets in layers["rows"].items()}
    for row, cfg in cfgs.items():
        assert (cfg.models["policy"].cold_start is not None) == row.startswith("sft"), row
    (op,) = cfgs["sft_topology"].operators
    palette = op.params["palette"]
    # the world's palette, with the vote's samples sent to the batched model server at once
    assert [
        {**it, "params": {k: v for k, v in it["params"].items() if k != "parallel"}} if it["name"] == "vote" else it
        for it in palette
    ] == PALETTE
    assert next(it for it in palette if it["name"] == "vote")["params"]["parallel"] == 8
    assert set(layers["score_child"]) <= set(layers["rows"]) and set(layers["against"].values()) <= set(layers["rows"])
