"""The memory operator and the SQL world's experience recall: solved trajectories become
experiences, the agent recalls them (never from its own database) into the prompt, recalled
items are strengthened or weakened by the outcome, and the child records the store version."""

from __future__ import annotations

import random

import pytest

from evolve.llm.fake import ScriptedLM
from evolve.loop.operators import OperatorContext
from evolve.rollout import run_agent, score
from evolve.types import Reward, System, ToolCall, Trajectory
from evolve.worlds import sql
from evolve.worlds.sql.coldstart import memory_demos
from evolve.worlds.sql.hooks import experiences
from evolve.worlds.sql.memory import recall

EXTRACT = "evolve.worlds.sql:experiences"  # what `world: sql` would fill in

pytest.importorskip("chromadb")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return sql.build(tmp_path_factory.mktemp("sqlm"), seed=1, n_train=60, n_val=6, n_test=20)


def solved(task) -> Trajectory:
    out = {"sql": task["gold_sql"], "rows": sql.execute(task["db"], task["gold_sql"]), "turns": 1}
    return Trajectory(task_id=task["id"], system_id="s", output=out, reward=Reward(score=1.0))


def ctx_for(data, tmp_path, trajs, gen=1) -> OperatorContext:
    work = tmp_path / "run" / "work" / f"g{gen}"
    work.mkdir(parents=True, exist_ok=True)
    return OperatorContext(
        generation=gen,
        seed=0,
        rng=random.Random(gen),
        train=data["train"],
        trajectories=trajs,
        artifacts=None,
        workdir=work,
        rollouts=lambda *a, **k: [],
        log=lambda m: None,
    )


def test_experiences_go_to_memory_and_are_recalled_into_the_prompt(data, tmp_path):
    from evolve.memory.operator import MemoryOperator

    op = MemoryOperator(extract=EXTRACT, embedder="hashing", k=1)
    parent = System(models={"policy": {"backend": "scripted", "name": "x"}})
    trajs = [solved(t) for t in data["train"][:30]] + [
        Trajectory(task_id=data["train"][40]["id"], system_id="s", reward=Reward(score=0.0))
    ]
    (cand,) = op.propose(parent, ctx_for(data, tmp_path, trajs))
    spec = cand.system.memory
    assert spec["k"] == 1 and spec["kinds"] == ["experience"] and spec["embedder"] == "hashing"
    assert cand.info["new"] == 30 and spec["store"].endswith("memory")
    # the same evidence again adds nothing (duplicates are no-ops) and so proposes nothing new
    assert op.propose(cand.system, ctx_for(data, tmp_path, trajs[:30], gen=2)) == []

    task = data["test"][0]
    got = recall(spec, task)
    assert len(got) == 1 and got[0]["sql"] and got[0]["question"]
    train_task = data["train"][0]
    got = recall({**spec, "k": 5}, train_task)
    assert len(got) == 5
    for e in got:  # never an example from the task's own database (nor the task itself)
        assert next(t["db"] for t in data["train"] if t["question"] == e["question"]) != train_task["db"]

    llm = ScriptedLM(responses=lambda msgs: task["gold_sql"])
    traj = score(sql.reward, task, run_agent(sql.agent, cand.system, task, lambda s, r: llm))
    assert traj.score == 1.0
    (rec,) = [s for s in traj.steps if isinstance(s, ToolCall) and s.name == "recall_memory"]
    prompt = traj.steps[1].messages[-1].content
    assert prompt.startswith("e: " + rec.result[0]["question"] + " = " + rec.result[0]["sql"] + "\n")
    assert prompt.endswith(sql.prompt_text(task["schema"], task["question"]))

    # outcome feedback: a failed task that recalled an item weakens it, twice -> a tombstone, undoable
    failed = traj.model_copy(update={"reward": Reward(score=0.0)})
    from evolve.memory import HashingEmbedder, MemoryStore

    item = rec.result[0]["id"]
    s1 = op.propose(cand.system, ctx_for(data, tmp_path, [failed], gen=3))[0].system
    s2 = op.propose(s1, ctx_for(data, tmp_path, [failed], gen=4))[0].system
    store = MemoryStore(spec["store"], embedder=HashingEmbedder())
    try:
        assert item in store.view(s1.memory["version"])  # one bad outcome never removes a memory
        assert item not in store.view(s2.memory["version"])  # the second one does: a tombstone
        assert item in store.view(spec["version"])  # the parent's version still has it: rollback restores it
        kinds = [e.op for e in store.history(item)]
        assert kinds.count("WEAKEN") == 2 and "DELETE" in kinds
        store.undelete(item)
        assert item in store.view()
    finally:
        store.close()


def test_recall_settings_are_proposed_as_variants(data, tmp_path):
    from evolve.memory.operator import MemoryOperator

    op = MemoryOperator(extract=EXTRACT, embedder="hashing", variants=[{"k": 2}, {"render": "skeleton"}, {}])
    cands = op.propose(System(), ctx_for(data, tmp_path, [solved(t) for t in data["train"][:10]]))
    specs = [c.system.memory for c in cands]
    assert [(s["k"], s.get("render")) for s in specs] == [(1, None), (2, None), (1, "skeleton")]  # {} == the base
    assert len({s["version"] for s in specs}) == 1 and "recall k=2" in cands[1].rationale
    task = data["test"][0]
    assert len(recall(specs[1], task)) == 2


def test_random_recall_is_the_control_for_relevance(data, tmp_path):
    from evolve.memory.operator import MemoryOperator

    op = MemoryOperator(extract=EXTRACT, embedder="hashing", k=1)
    (cand,) = op.propose(System(), ctx_for(data, tmp_path, [solved(t) for t in data["train"][:40]]))
    spec = {**cand.system.memory, "recall": "random", "k": 3}
    by_question = {t["question"]: t for t in data["train"][:40]}
    picks = []
    for task in data["train"][40:60]:
        got = recall(spec, task)
        assert len(got) == 3 and got == recall(spec, task)  # seeded by the task: training and test see the same
        assert all(by_question[e["question"]]["db"] != task["db"] and e["similarity"] is None for e in got)
        picks.append(tuple(e["id"] for e in got))
    assert len(set(picks)) > 10  # not one fixed set for every task
    similar = [tuple(e["id"] for e in recall({**spec, "recall": "similar"}, t)) for t in data["train"][40:60]]
    assert similar != picks
    with pytest.raises(ValueError, match="'similar' .* or 'random'"):
        recall({**spec, "recall": "nearest"}, data["train"][40])


def test_memory_demos_carry_recalled_examples(data, tmp_path):
    from evolve.memory.operator import MemoryOperator

    op = MemoryOperator(extract=EXTRACT, embedder="hashing")
    (cand,) = op.propose(System(), ctx_for(data, tmp_path, [solved(t) for t in data["train"][:40]]))
    tasks = data["train"][40:50]
    chats = memory_demos(tasks, memory=cand.system.memory, seed=0)
    plain = sql.demos(tasks, seed=0)
    assert len(chats) == len(plain)
    for a, b in zip(plain, chats):
        assert b[0]["content"].startswith("e: ") and b[0]["content"].endswith(a[0]["content"])
        assert a[1:] == b[1:]
    assert (
        experiences([solved(data["train"][0])], {data["train"][0]["id"]: data["train"][0]})[0]["kind"] == "experience"
    )


def test_the_dry_run_estimate_counts_the_extra_rollouts_and_the_variants():
    from types import SimpleNamespace

    from evolve.memory.operator import MemoryOperator

    op = MemoryOperator(extract=EXTRACT, tasks=40, samples=2, variants=[{"k": 2}, {"k": 0}])
    assert op.estimate(SimpleNamespace(train=30)) == {"rollouts": 60, "llm_calls": 0, "children": 3}
    assert MemoryOperator(extract=EXTRACT).estimate(SimpleNamespace(train=30))["rollouts"] == 0  # the minibatch only
