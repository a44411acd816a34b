"""Recorded traffic as data: sessions from the gateway's trace store as tasks, a candidate
replaying them, and from_traces training on the served model's own token ids."""

from __future__ import annotations

import json
import re

import pytest

from evolve.errors import ConfigError
from evolve.gateway.traces import CallRecord, TraceStore

pytest.importorskip("starlette")


def _store(tmp_path, n=10):
    st = TraceStore(tmp_path / "traces")
    for i in range(n):
        sid = f"s{i}"
        call = CallRecord(
            session_id=sid,
            api="openai",
            route="sql" if i % 2 == 0 else "other",
            messages=[{"role": "user", "content": f"q{i}"}],
            output=f"a{i}",
            request={"messages": [{"role": "user", "content": f"q{i}"}]},
            prompt_token_ids=[1, i],
            token_ids=[i, 2],
            system_id="sysA",
            params={"served_by": {"base": "B" if i != 5 else "other", "adapter": None}},
        )
        st.record(call)
        if i < 8:
            st.feedback(session_id=sid, score=1.0 if i % 4 else 0.0, text=f"note {i}")
    st.record(
        CallRecord(
            session_id="failed",
            api="openai",
            messages=[{"role": "user", "content": "x"}],
            status="error",
            error="502: upstream",
        )
    )
    return st


def test_sessions_become_tasks_split_by_session_and_filtered(tmp_path):
    from evolve.gateway.dataset import sessions

    _store(tmp_path)
    got = sessions("traces", base_dir=tmp_path, val=0.3, seed=0)
    ids = sorted(t["id"] for split in got.values() for t in split)
    assert ids == [f"s{i}" for i in range(8)]  # scored ones only; the failed session has no ok call
    again = sessions(str(tmp_path / "traces"), val=0.3, seed=0)
    assert {k: [t["id"] for t in v] for k, v in got.items()} == {k: [t["id"] for t in v] for k, v in again.items()}
    t = next(t for split in got.values() for t in split if t["id"] == "s1")
    assert t["score"] == 1.0 and t["feedback_text"] == "note 1" and t["answer"]["output"] == "a1"
    assert t["calls"][0]["token_ids"] == [1, 2] and t["calls"][0]["base"] == "B"
    assert t["request_messages"] == [{"role": "user", "content": "q1"}]
    pos = sessions("traces", base_dir=tmp_path, feedback="positive", route="sql", val=0.0)
    assert sorted(t["id"] for t in pos["train"]) == ["s2", "s6"]
    assert sorted(t["id"] for t in sessions("traces", base_dir=tmp_path, feedback="unscored", val=0.0)["train"]) == [
        "s8",
        "s9",
    ]
    with pytest.raises(ConfigError, match="no session that passes"):
        sessions("traces", base_dir=tmp_path, route="nowhere")
    with pytest.raises(ConfigError, match="feedback must be one of"):
        sessions("traces", base_dir=tmp_path, feedback="good")
    with pytest.raises(Exception, match="no trace store"):
        sessions("missing", base_dir=tmp_path)


def test_from_traces_learns_only_successful_sessions_answered_by_the_parents_base(tmp_path):
    from evolve.gateway.dataset import sessions
    from evolve.policy.from_traces import FromTraces

    _store(tmp_path)
    tasks = sessions("traces", base_dir=tmp_path, val=0.0)["train"]
    examples, counts = FromTraces(min_score=1.0).examples(tasks, "B")
    # scored 1: s1 s2 s3 s5 s6 s7 (s0 and s4 scored 0); s5 was answered by another base
    assert sorted(examples) == sorted(((1, i), (i, 2)) for i in (1, 2, 3, 6, 7))
    assert counts == {"sessions": 8, "successes": 6, "other_base": 1, "no_tokens": 0}
    assert FromTraces().estimate(None)["rollouts"] == 0


@pytest.mark.slow
def test_an_offline_job_on_recorded_gateway_traffic_trains_on_the_served_token_ids(tmp_path_factory, tmp_path):
    """Serve a tiny local model through the gateway, record sessions with feedback, then run
    evolve on the traces: from_traces trains an adapter on exactly the recorded turns."""
    import openai

    import evolve
    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags
    from evolve.gateway.dataset import sessions
    from tests.helpers import two_system_run

    path, a, _ = two_system_run(tmp_path_factory.mktemp("offline"))
    questions = [f"question number {i}?" for i in range(16)]
    with GatewayServer(from_flags(local=path, store=tmp_path / "traces", port=0)) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        for i, q in enumerate(questions):
            r = client.chat.completions.create(
                model="sql-agent",
                messages=[{"role": "user", "content": q}],
                temperature=0.0,
                max_tokens=12,
                user=f"user-{i}",
            )
            gw.gateway.store.feedback(session_id=f"user-{i}", score=1.0 if i % 4 else 0.0)
            assert r.system_fingerprint == a.id
    task = {
        "name": "offline",
        "seed": 0,
        "agent": "evolve.gateway.dataset:replay",
        "reward": "tests.evolve.test_gateway_dataset:agrees",
        "models": {
            "policy": {
                "backend": "local",
                "name": "tiny",
                "params": {"weights": str(path.parent / "base.st"), "temperature": 0.0, "max_tokens": 12},
            }
        },
        "dataset": {
            "source": "evolve.gateway.dataset:sessions",
            "params": {"store": str(tmp_path / "traces"), "val": 0.25},
        },
        "operators": [{"name": "from_traces", "params": {"min_examples": 2, "epochs": 1, "r": 4, "replay": 0}}],
        "budget": {"generations": 1},
    }
    report = evolve.run(task, base_dir=tmp_path, out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as archive:
        kids = [r for r in archive.records() if r.operator == "from_traces"]
    assert kids, report
    train_ids = {t["id"] for t in sessions(str(tmp_path / "traces"), val=0.25)["train"]}
    n_pos = sum(1 for i in range(16) if i % 4 and f"user-{i}" in train_ids)
    assert n_pos >= 4 and kids[0].info["examples"] == n_pos and kids[0].info["other_base"] == 0


def agrees(task: dict, output) -> float:
    """The replayed answer agrees with what was served (the recorded answer)."""
    text = output if isinstance(output, str) else json.dumps(output)
    return 1.0 if text == (task["answer"]["output"] or "") else 0.0


def length_reward(task: dict, output) -> float:
    if task["id"] == "s3":
        raise ValueError("cannot judge this one")
    return float(len(output) == 2)


def test_a_reward_run_offline_over_sessions_becomes_their_feedback_once(tmp_path, capsys):
    from evolve.cli.commands import main
    from evolve.gateway.dataset import score_sessions

    st = _store(tmp_path)
    reward = "tests.evolve.test_gateway_dataset:length_reward"
    c = score_sessions(tmp_path / "traces", reward)
    assert c == {"sessions": 11, "scored": 9, "skipped": 1, "failed": 1}  # "failed" has no answer; s3 raised
    fb = [f for f in st.feedback_of(session_id="s9") if f.source == f"reward:{reward}"]
    assert [f.score for f in fb] == [1.0]
    again = score_sessions(tmp_path / "traces", reward)  # each session once: only s3 is tried again, and fails
    assert again == {"sessions": 11, "scored": 0, "skipped": 10, "failed": 1}
    assert len(score_sessions(tmp_path / "traces", reward, rescore=True)) == 4
    assert [f.score for f in st.feedback_of(session_id="s9") if f.source == f"reward:{reward}"] == [1.0, 1.0]
    main(["traces", "score", str(tmp_path / "traces"), reward, "--route", "sql"])
    assert "0 sessions scored" in capsys.readouterr().out


def test_rewarded_sessions_become_memories_that_the_gateway_recalls_into_requests(tmp_path):
    """The memory operator with the traces' extract learns experiences from recorded sessions (no
    rollouts of the agent needed); a gateway route following that run recalls them into requests."""
    import openai

    import evolve
    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import GatewayConfig
    from evolve.gateway.dataset import experiences, sessions
    from tests.helpers.upstream import ScriptedUpstream

    st = TraceStore(tmp_path / "traces")
    for i, (q, a) in enumerate(
        [
            ("how many singers are there", "select count(*) from singer"),
            ("list the concert names", "select name from concert"),
            ("oldest singer age", "select max(age) from singer"),
        ]
    ):
        st.record(CallRecord(session_id=f"s{i}", api="openai", messages=[{"role": "user", "content": q}], output=a))
        st.feedback(session_id=f"s{i}", score=1.0 if i < 2 else 0.0)
    tasks = sessions(str(tmp_path / "traces"), val=0.0)["train"]
    got = experiences([], {t["id"]: t for t in tasks})
    assert sorted(e["text"] for e in got) == ["how many singers are there", "list the concert names"]
    assert {e["metadata"]["answer"] for e in got} == {"select count(*) from singer", "select name from concert"}

    task = {
        "name": "mem",
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
                "name": "memory",
                "params": {
                    "extract": "evolve.gateway.dataset:experiences",
                    "embedder": "hashing",
                    "k": 1,
                    "feedback": False,
                },
            }
        ],
        "budget": {"generations": 1},
        "engine": {"acceptance": "val_only", "min_gain": -1},
    }
    evolve.run(task, base_dir=tmp_path, out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as archive:
        (kid,) = [r for r in archive.records() if r.operator == "memory"]
        archive.set_current(kid.id)  # served: as a promotion would
        memory = archive.get_system(kid.id).memory
    assert memory["version"] >= 1 and memory["k"] == 1

    with ScriptedUpstream() as up:
        cfg = GatewayConfig.model_validate(
            {
                "port": 0,
                "store": tmp_path / "served",
                "routes": [
                    {
                        "upstream": {"model": "openai/*", "api_base": up.url},
                        "evolve": {"run": tmp_path / "run", "recall": {"format": "- {text} => {answer}"}},
                    }
                ],
            }
        )
        with GatewayServer(cfg) as gw:
            openai.OpenAI(base_url=gw.url, api_key="unused").chat.completions.create(
                model="m",
                messages=[
                    {"role": "system", "content": "You write SQL."},
                    {"role": "user", "content": "how many singers do we have"},
                ],
            )
            (call,) = gw.gateway.store.calls()
        system = up.requests[-1]["messages"][0]["content"]
    assert system == (
        "You write SQL.\n\nRelevant past experience:\n- how many singers are there => select count(*) from singer"
    )
    assert len(call.params["memory_recalled"]) == 1 and call.system_id == kid.id


SEEN_REFLECTIONS: list[str] = []


def reflect_reply(messages) -> str:
    SEEN_REFLECTIONS.append(messages[-1].content)
    return "```\nAnswer with the exact column names of the schema.\n```"


def test_the_reflective_operator_rewrites_a_prompt_from_the_users_feedback_on_recorded_sessions(tmp_path):
    import evolve
    from evolve.archive import Archive

    st = TraceStore(tmp_path / "traces")
    for i, (q, a, score, text) in enumerate(
        [
            ("names of singers", "select nam from singer", 0.0, "column 'nam' does not exist; it is 'name'"),
            ("count concerts", "select count(*) from concert", 1.0, "right"),
            ("ages of singers", "select ag from singer", 0.0, "use the real column: age"),
        ]
    ):
        st.record(CallRecord(session_id=f"s{i}", api="openai", messages=[{"role": "user", "content": q}], output=a))
        st.feedback(session_id=f"s{i}", score=score, text=text)
    SEEN_REFLECTIONS.clear()
    task = {
        "name": "reflect",
        "seed": 0,
        "agent": "evolve.gateway.dataset:replay",
        "reward": "tests.evolve.test_gateway_dataset:agrees",
        "models": {"policy": {"backend": "scripted", "name": "s", "params": {"echo": True}}},
        "prompts": {"instruction": "Write SQL."},
        "dataset": {
            "source": "evolve.gateway.dataset:sessions",
            "params": {"store": str(tmp_path / "traces"), "val": 0.0},
        },
        "operators": [
            {
                "name": "reflective",
                "params": {
                    "traces": True,
                    "minibatch": 3,
                    "model": {
                        "backend": "scripted",
                        "name": "reflector",
                        "params": {"reply": "tests.evolve.test_gateway_dataset:reflect_reply"},
                    },
                },
            }
        ],
        "budget": {"generations": 1},
    }
    evolve.run(task, base_dir=tmp_path, out=tmp_path / "run")
    (prompt,) = SEEN_REFLECTIONS
    assert "column 'nam' does not exist; it is 'name'" in prompt and "use the real column: age" in prompt
    assert "select nam from singer" in prompt and "Input:\nnames of singers" in prompt
    with Archive(tmp_path / "run", create=False) as archive:
        (kid,) = [r for r in archive.records() if r.operator == "reflective"]
        assert archive.get_system(kid.id).prompts["instruction"] == "Answer with the exact column names of the schema."


JUDGE_PROMPTS: list[str] = []


def judge_reply(messages) -> str:
    prompt = messages[-1].content
    JUDGE_PROMPTS.append(prompt)
    nonce = re.search(r'"nonce": "([0-9a-f]+)"', prompt).group(1)  # the judge echoes the call's nonce
    n = prompt.count(f"</answer-{nonce}>")
    if "garbage" in prompt:
        return "I like them all"
    return json.dumps(
        {
            "nonce": nonce,
            "scores": [{"answer": i + 1, "score": 1.0 if i == 0 else 0.25, "reason": f"r{i + 1}"} for i in range(n)],
        }
    )


def test_the_llm_judge_ranks_answers_against_what_was_served_and_the_users_feedback():
    from evolve.gateway.judge import LLMJudge

    judge = LLMJudge(
        {"backend": "scripted", "name": "judge", "params": {"reply": "tests.evolve.test_gateway_dataset:judge_reply"}},
        rubric="correct SQL",
    )
    task = {
        "id": "s1",
        "messages": [{"role": "user", "content": "names of singers"}],
        "answer": {"output": "select nam from singer", "tool_calls": None},
        "score": 0.0,
        "feedback_text": "the column is name",
    }
    JUDGE_PROMPTS.clear()
    got = judge.rank(task, ["select name from singer", "select nam from singer"])
    assert [(r.score, r.feedback) for r in got] == [(1.0, "r1"), (0.25, "r2")]
    (prompt,) = JUDGE_PROMPTS
    assert "the column is name" in prompt and "select nam from singer" in prompt and "correct SQL" in prompt
    assert judge(task, "select name from singer").score == 1.0
    with pytest.raises(ValueError, match="did not answer with the JSON"):
        judge({**task, "feedback_text": "garbage"}, "x")
