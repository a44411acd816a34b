"""Curators. LLMCurator: good answers are applied with the model's numbers mapped back to
real ids; bad answers (malformed JSON, unknown numbers, deleting everything, ...) change nothing
and are recorded. HeuristicCurator: ExpeL-style counters and similarity thresholds."""

from __future__ import annotations

import json
import re
import sys

import pytest

pytest.importorskip("chromadb")

from evolve.llm.fake import ScriptedLM
from evolve.memory import (
    Evidence,
    HashingEmbedder,
    HeuristicCurator,
    LLMCurator,
    LogError,
    MemoryStore,
    Op,
    apply,
)
from evolve.types import Message


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(tmp_path / "mem", embedder=HashingEmbedder())
    yield s
    s.close()


def _numbers(messages) -> dict[str, int]:
    """text -> the number the prompt shows it under."""
    user = [m for m in messages if m.role == "user"][-1].content
    return {m.group(2): int(m.group(1)) for m in re.finditer(r"^\[(\d+)\] \([^)]*\) (.*)$", user, re.MULTILINE)}


def _seed(store):
    return [
        store.add("check the schema before writing SQL"),
        store.add("inspect table columns before writing SQL"),
        store.add("SQL dates compare as ISO strings", "fact"),
    ]


def test_llm_curator_applies_a_good_answer_with_ids_mapped_back(store):
    a, b, c = _seed(store)
    seen = []

    def reply(messages):
        seen.append(messages)
        num = _numbers(messages)
        return (
            "```json\n"
            + json.dumps(
                {
                    "ops": [
                        {
                            "op": "MERGE",
                            "ids": [
                                num["check the schema before writing SQL"],
                                num["inspect table columns before writing SQL"],
                            ],
                            "text": "inspect the schema and columns before writing SQL",
                        },
                        {"op": "STRENGTHEN", "id": num["SQL dates compare as ISO strings"]},
                        {"op": "ADD", "text": "quote identifiers that clash with SQL keywords", "kind": "lesson"},
                        {"op": "NOOP"},
                    ]
                }
            )
            + "\n```"
        )

    curator = LLMCurator(ScriptedLM(responses=reply), k=5)
    ops = curator.decide(store, [Evidence("check the schema and the columns before writing SQL")])
    assert [o.op for o in ops] == ["MERGE", "STRENGTHEN", "ADD"]
    assert set(ops[0].ids) == {a, b} and ops[1].id == c
    prompt = "\n".join(m.content for m in seen[0])
    assert all(isinstance(m, Message) for m in seen[0])
    assert not re.search(r"\bm\d+\b", prompt)  # real ids never reach the model
    merged, _, added = apply(store, ops)
    assert set(store.view()) == {merged, c, added}
    assert store.get(a).links["merged_into"] == merged and store.get(c).strength == 2.0
    assert store.rejections() == []


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("sure! I would merge them", "no JSON"),
        ('{"ops": [{"op": "ADD", "text": "x"', "malformed JSON"),
        ('{"ops": [{"op": "DELETE", "id": 9, "reason": "stale"}]}', "unknown memory [9]"),
        ('{"ops": [{"op": "DELETE", "id": "m1", "reason": "stale"}]}', "not a number"),
        (
            '{"ops": [{"op": "DELETE", "id": 1}, {"op": "DELETE", "id": 2}, {"op": "DELETE", "id": 3}]}',
            "would delete 3",
        ),
        ('{"ops": [{"op": "DELETE", "id": 1}, {"op": "DELETE", "id": 2}]}', "would delete 2"),  # > half
        ('{"ops": [{"op": "FORGET", "id": 1}]}', "unknown op"),
        ('{"ops": [{"op": "ADD", "text": "  "}]}', "without a text"),
        ('{"ops": [{"op": "MERGE", "ids": [1, 2], "text": "x"}, {"op": "DELETE", "id": 2}]}', "conflicting"),
        ('{"ops": [{"op": "ADD", "text": "x", "kind": "opinion"}]}', "unknown kind"),
        ('{"ops": {"op": "NOOP"}}', "expected"),
    ],
)
def test_llm_curator_rejects_bad_answers_changes_nothing_and_records_them(store, answer, reason):
    _seed(store)
    before, version = store.view(), store.version
    curator = LLMCurator(ScriptedLM(responses=[answer]), k=5, max_delete_fraction=0.5)
    ops = curator.decide(store, [Evidence("SQL lessons")])
    assert ops == [] and reason in curator.last_rejection
    apply(store, ops)
    assert store.view() == before and store.version == version
    (rec,) = store.rejections()
    assert rec["source"] == "LLMCurator" and reason in rec["reason"] and rec["raw"] == answer
    assert sorted(rec["context"]["shown"].values()) == ["m1", "m2", "m3"]


def test_llm_curator_allows_a_delete_within_the_fraction_and_supersedes(store):
    a, b, c = _seed(store)

    def reply(messages):
        num = _numbers(messages)
        return json.dumps(
            {
                "ops": [
                    {"op": "DELETE", "id": num["inspect table columns before writing SQL"], "reason": "redundant"},
                    {
                        "op": "SUPERSEDE",
                        "id": num["SQL dates compare as ISO strings"],
                        "text": "SQL dates compare as timestamps",
                        "reason": "contradicted",
                    },
                ]
            }
        )

    ids = LLMCurator(ScriptedLM(responses=reply)).update(store, ["SQL dates are timestamps now"])
    assert store.get(b).status == "deleted" and store.get(c).links["superseded_by"] == ids[1]
    assert set(store.view()) == {a, ids[1]}


def test_apply_of_a_stale_decision_changes_nothing_and_is_recorded(store):
    a, b, _ = _seed(store)
    store.delete(b, "gone before the decision was applied")
    before, version = store.view(), store.version
    with pytest.raises(LogError):
        apply(store, [Op.add("a new lesson"), Op.merge([a, b], "merged")])
    assert store.view() == before and store.version == version
    assert "apply failed" in store.rejections()[-1]["reason"]


def test_heuristic_curator_strengthens_merges_or_adds_by_similarity(store):
    base = store.add("Check the schema before writing the SQL query")
    curator = HeuristicCurator(same=0.9, similar=0.8)
    assert [(o.op, o.id) for o in curator.decide(store, ["Check the schema before writing an SQL query"])] == [
        ("STRENGTHEN", base)
    ]  # cosine 0.93: the same lesson again
    assert [(o.op, o.id) for o in curator.decide(store, ["check the schema before writing the sql query"])] == [
        ("STRENGTHEN", base)
    ]  # exact duplicate: rediscovered
    longer = "Check the schema before writing the SQL query for joins and filters"
    ops = curator.decide(store, [longer])  # cosine 0.87: merged, the longer text kept
    assert [(o.op, o.ids, o.text) for o in ops] == [("MERGE", (base,), longer)]
    ops = curator.decide(
        store, ["Always inspect the table schema before you write the SQL query for joins", "Bake bread in a hot oven"]
    )
    assert [o.op for o in ops] == ["ADD", "ADD"]
    ops = curator.decide(store, ["Check the schema before writing an SQL query", longer])  # both in one decision
    assert [o.op for o in ops] == ["STRENGTHEN", "MERGE"]
    (merged,) = [i for i in apply(store, ops) if i != base]
    assert store.get(merged).strength == 2.0 and store.get(base).status == "merged"  # the strengthen carried over


def test_heuristic_curator_supersedes_only_on_explicit_evidence(store):
    old = store.add("orders.amount is stored in cents", "fact")
    curator = HeuristicCurator()
    ops = curator.decide(store, [Evidence("orders.amount is stored in euros", kind="fact")])
    assert [o.op for o in ops] in (["ADD"], ["MERGE"]) and all(o.op not in ("SUPERSEDE", "DELETE") for o in ops)
    ops = curator.decide(store, [Evidence("orders.amount is stored in euros", kind="fact", supersedes=old)])
    assert [(o.op, o.id) for o in ops] == [("SUPERSEDE", old)]
    (new,) = apply(store, ops)
    assert store.get(old).status == "superseded" and store.get(new).links["supersedes"] == old


def test_heuristic_curator_never_deletes_on_one_decision(store):
    lesson = store.add("always use LIMIT 1")
    curator = HeuristicCurator(min_weakens=2)
    bad = [Evidence(about=lesson, helpful=False), Evidence(about=lesson, helpful=False)]
    ops = curator.decide(store, bad)  # two failures, one decision: weakened (to -1), not deleted
    assert [(o.op, o.by) for o in ops] == [("WEAKEN", 2.0)]
    apply(store, ops)
    assert store.get(lesson).active and store.get(lesson).strength == -1.0
    ops = curator.decide(store, [Evidence(about=lesson, helpful=False)])  # a second decision: now removed
    assert [o.op for o in ops] == ["WEAKEN", "DELETE"]
    apply(store, ops)
    it = store.get(lesson)
    assert it.status == "deleted" and "2 weakening decisions" in it.reason
    store.undelete(lesson)  # a tombstone, not a loss
    assert store.get(lesson).active
    good = curator.decide(store, [Evidence(about=lesson, helpful=True)])
    assert [(o.op, o.id) for o in good] == [("STRENGTHEN", lesson)]


def test_the_old_policy_names_still_resolve_with_a_deprecation_warning():
    import importlib

    import evolve.memory as memory
    from evolve.memory import base

    with pytest.warns(DeprecationWarning, match="HeuristicCurator"):
        assert memory.HeuristicPolicy is HeuristicCurator
    with pytest.warns(DeprecationWarning, match="LLMCurator"):
        assert memory.LLMPolicy is LLMCurator
    with pytest.warns(DeprecationWarning, match="Curator"):
        assert base.Policy is base.Curator
    for old, name, new in [
        ("evolve.memory.policy", "HeuristicPolicy", HeuristicCurator),
        ("evolve.memory.llm_policy", "LLMPolicy", LLMCurator),
    ]:
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=old):
            assert getattr(importlib.import_module(old), name) is new
