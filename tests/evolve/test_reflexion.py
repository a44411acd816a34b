"""Reflexion mode: lessons from failed attempts reach the next attempt of an unmodified agent,
bad reflections and failing evaluators never crash it, memory carries lessons across tasks, and
the engine can run it as one rollout (the SQL world's ready agent included)."""

from __future__ import annotations

import time

import pytest

from evolve.llm.fake import ScriptedLM
from evolve.reflexion import (
    HEADER,
    Reflexion,
    ReflexionResult,
    clean_reflection,
    format_lessons,
    inject,
    reflexion_agent,
)
from evolve.rollout import run_agent, score
from evolve.types import LLMCall, Message, ModelSpec, Reward, System, ToolCall

LESSON = "Answer with digits, not words."
TASK = {"id": "t1", "question": "what is two plus two?", "answer": "4"}


def make_system(workflow: dict | None = None, **roles: str) -> System:
    names = roles or {"policy": "scripted"}
    return System(
        workflow=workflow or {},
        models={r: ModelSpec(backend=b, name=r, params={"temperature": 0.0}) for r, b in names.items()},
    )


def qa_agent(task: dict, ctx) -> str:
    """Knows nothing of Reflexion: one call with its own system message."""
    msgs = [Message(role="system", content="You answer questions."), Message(role="user", content=task["question"])]
    return ctx.llm("policy").complete(msgs).text.strip()


def exact(task: dict, output) -> Reward:
    ok = output == task["answer"]
    return Reward(score=float(ok), feedback="correct" if ok else f"the answer {output!r} is not in digits")


def policy_lm(seen: list | None = None) -> ScriptedLM:
    """Answers "4" only when the lesson is in its prompt."""

    def reply(messages, seed=None, temperature=None):
        if seen is not None:
            seen.append((seed, temperature))
        return "4" if any(LESSON in m.content for m in messages) else "four"

    return ScriptedLM("policy", reply)


def provider(**lms):
    return lambda system, role: lms[role]


def llm_calls(traj) -> list[LLMCall]:
    return [s for s in traj.steps if isinstance(s, LLMCall)]


# ----------------------------------------------------------------------------- injection


def test_inject_merges_into_a_system_message_or_adds_one_or_goes_to_the_user():
    block = format_lessons(["a", "b"])
    assert block == f"{HEADER}\n- a\n- b"
    sys_user = [Message(role="system", content="Be brief."), {"role": "user", "content": "hi"}]
    out = inject(sys_user, ["a", "b"])
    assert [m.role for m in out] == ["system", "user"] and out[0].content == f"Be brief.\n\n{block}"
    out = inject([Message(role="user", content="hi")], ["a", "b"])
    assert [m.role for m in out] == ["system", "user"] and out[0].content == block
    out = inject(sys_user, ["a", "b"], "user")
    assert out[0].content == "Be brief." and out[1].content == f"hi\n\n{block}"
    assert inject(out, ["a", "b"], "user") == out  # never twice
    assert inject(sys_user, [], "system") == tuple(inject(sys_user, []))  # no lessons: unchanged
    assert inject([Message(role="system", content="s")], ["a"], "user")[0].content == f"s\n\n{HEADER}\n- a"


# ----------------------------------------------------------------------------- the loop


def test_the_reflection_in_context_makes_the_second_attempt_succeed():
    seen, events = [], []
    reflector = ScriptedLM("reflector", [LESSON])
    rx = Reflexion(
        qa_agent,
        make_system(policy="scripted", reflector="scripted"),
        reward=exact,
        reflector_role="reflector",
        temperature=0.8,
        seed=5,
        on_attempt=events.append,
        llm_provider=provider(policy=policy_lm(seen), reflector=reflector),
    )
    res = rx.solve(TASK)
    assert isinstance(res, ReflexionResult)
    assert res.success and res.output == "4" and [t.score for t in res.attempts] == [0.0, 1.0]
    assert res.reflections == [LESSON] and res.records[0].source == "model" and res.records[0].reason is None
    first, second = llm_calls(res.attempts[0])[0], llm_calls(res.attempts[1])[0]
    assert first.messages[0].content == "You answer questions."  # nothing to inject yet
    # the recorded call shows the lesson, merged into the agent's own system message
    assert second.messages[0].content == f"You answer questions.\n\n{HEADER}\n- {LESSON}"
    assert [m.role for m in second.messages] == ["system", "user"]
    # the reflection call is recorded, and saw the task, the answer and the feedback
    (call,) = res.reflection_calls
    assert call.role == "reflector" and call.output == LESSON
    prompt = call.messages[-1].content
    assert "what is two plus two?" in prompt and "four" in prompt and "not in digits" in prompt
    # attempt i runs at seed base + i; the retry samples at the given temperature
    assert seen == [(5000, 0.0), (6000, 0.8)] and (first.temperature, second.temperature) == (0.0, 0.8)
    assert [(e.index, e.success, e.lessons) for e in events] == [(0, False, ()), (1, True, (LESSON,))]
    assert res.summary().startswith("task t1: solved on attempt 2 (score 1.00); 1 reflection (1 model)")
    # one attempt only: it fails, and no reflection is written (nobody would read it)
    reflector.calls = 0
    one = Reflexion(
        qa_agent,
        make_system(policy="scripted", reflector="scripted"),
        reward=exact,
        max_attempts=1,
        reflector_role="reflector",
        llm_provider=provider(policy=policy_lm(), reflector=reflector),
    )
    res1 = one.solve(TASK)
    assert not res1.success and res1.output == "four" and res1.reflections == [] and reflector.calls == 0
    assert "failed after 1 attempt " in res1.summary()


def test_user_injection_for_models_without_system_messages():
    def agent(task, ctx):
        return ctx.llm().complete([{"role": "user", "content": task["question"]}]).text

    rx = Reflexion(
        agent,
        make_system(),
        reward=exact,
        inject="user",
        reflect="feedback",
        llm_provider=provider(policy=ScriptedLM("p", ["four", "4"])),
    )
    res = rx.solve(TASK)
    assert res.success
    (msg,) = llm_calls(res.attempts[1])[0].messages
    assert (
        msg.role == "user" and msg.content == f"what is two plus two?\n\n{HEADER}\n- the answer 'four' is not in digits"
    )


def test_turns_injection_shows_the_earlier_answer_and_the_lesson_as_a_repair_turn():
    def agent(task, ctx):
        return ctx.llm().complete([{"role": "user", "content": task["question"]}]).text

    rx = Reflexion(
        agent,
        make_system(),
        reward=exact,
        inject="turns",
        reflect="feedback",
        lesson_template="error: {feedback}",
        llm_provider=provider(policy=ScriptedLM("p", ["four", "4"])),
    )
    res = rx.solve(TASK)
    assert res.success
    msgs = llm_calls(res.attempts[1])[0].messages
    assert [(m.role, m.content) for m in msgs] == [
        ("user", "what is two plus two?"),
        ("assistant", "four"),
        ("tool", "error: the answer 'four' is not in digits"),
    ]


def test_only_the_last_max_reflections_stay_in_context():
    def judge(task, output, trajectory):
        return {"score": 0.0, "feedback": f"mistake number {trajectory.sample}"}

    lm = ScriptedLM("p", ["x"])
    rx = Reflexion(
        qa_agent,
        make_system(),
        evaluator=judge,
        reflect="feedback",
        max_attempts=4,
        max_reflections=2,
        llm_provider=provider(policy=lm),
    )
    res = rx.solve(TASK)
    assert not res.success and len(res.attempts) == 4
    assert res.reflections == ["mistake number 0", "mistake number 1", "mistake number 2"]
    last = llm_calls(res.attempts[3])[0].messages[0].content
    assert "mistake number 1" in last and "mistake number 2" in last and "mistake number 0" not in last
    assert "mistake number 0" in llm_calls(res.attempts[1])[0].messages[0].content


def test_an_evaluator_that_raises_fails_the_attempt_and_the_next_one_runs():
    def judge(task, output, trajectory):
        if trajectory.sample == 0:
            raise RuntimeError("checker down")
        return True

    rx = Reflexion(qa_agent, make_system(), evaluator=judge, llm_provider=provider(policy=policy_lm()))
    res = rx.solve(TASK)
    assert res.success and len(res.attempts) == 2
    assert res.attempts[0].reward.error == "reward raised RuntimeError: checker down"
    assert res.errors == ["attempt 1: reward raised RuntimeError: checker down"] and res.records == []

    def always(task, output):
        raise ValueError("nope")

    res = Reflexion(qa_agent, make_system(), evaluator=always, llm_provider=provider(policy=policy_lm())).solve(TASK)
    assert not res.success and len(res.attempts) == 3 and len(res.errors) == 3 and res.score == 0.0


def _raise(messages):
    raise ConnectionError("reflector offline")


@pytest.mark.parametrize(
    "reply, reason",
    [
        ([""], "empty reflection"),
        (["x" * 5000], "reflection too long (cut at reflection_max_tokens=256)"),
        (["This lesson is long. " * 5], "reflection too long (104 chars > 60)"),
        (["@#$%^ 12 !! ~~"], "reflection looks like garbage"),
        (_raise, "the reflector failed: ConnectionError: reflector offline"),
    ],
)
def test_a_bad_reflection_is_replaced_by_the_feedback_with_the_reason(reply, reason):
    rx = Reflexion(
        qa_agent,
        make_system(policy="scripted", reflector="scripted"),
        reward=exact,
        reflector_role="reflector",
        max_attempts=2,
        max_reflection_chars=60,
        llm_provider=provider(policy=ScriptedLM("p", ["four"]), reflector=ScriptedLM("r", reply)),
    )
    res = rx.solve(TASK)
    (rec,) = res.records
    assert rec.source == "feedback" and rec.text == "the answer 'four' is not in digits"
    assert rec.reason.startswith(reason)
    assert (rec.call is None) == (reply is _raise)  # a call that came back is recorded
    assert rec.text in llm_calls(res.attempts[1])[0].messages[0].content


def test_clean_reflection_strips_prefixes_and_accepts_plain_lessons():
    assert clean_reflection("Lesson: Check the schema first.", 600) == ("Check the schema first.", None)
    assert clean_reflection(None, 600)[0] is None


def test_a_crashing_and_a_hanging_agent_are_failed_attempts():
    def crash(task, ctx):
        raise KeyError("boom")

    res = Reflexion(
        crash,
        make_system(),
        reward=exact,
        reflect="feedback",
        max_attempts=2,
        llm_provider=provider(policy=ScriptedLM("p")),
    ).solve(TASK)
    assert not res.success and res.reflections == ["agent raised KeyError: 'boom'"]

    def slow(task, ctx):
        time.sleep(0.06)
        return ctx.llm().complete([Message(role="user", content="hi")]).text

    res = Reflexion(
        slow,
        make_system(),
        reward=exact,
        reflect="feedback",
        max_attempts=2,
        timeout=0.02,
        llm_provider=provider(policy=ScriptedLM("p")),
    ).solve(TASK)
    assert [t.error.split(":")[0] for t in res.attempts] == ["timeout", "timeout"]
    assert res.reflections[0].startswith("timeout")


def test_options_are_checked_up_front():
    with pytest.raises(ValueError, match="evaluator or the task's reward"):
        Reflexion(qa_agent, make_system())
    with pytest.raises(ValueError, match="no model role 'reflector'"):
        Reflexion(qa_agent, make_system(), reward=exact, reflector_role="reflector")
    with pytest.raises(ValueError, match="inject"):
        Reflexion(qa_agent, make_system(), reward=exact, inject="prompt")
    with pytest.raises(TypeError, match="set by the rollout"):
        reflexion_agent(qa_agent, exact, timeout=3)


# ----------------------------------------------------------------------------- memory


def test_lessons_are_remembered_and_recalled_for_a_similar_task(tmp_path):
    from evolve.memory import HashingEmbedder, MemoryStore

    store = MemoryStore(tmp_path / "mem", embedder=HashingEmbedder())
    lesson = "Count the rows with count(*), do not sum the ages."

    def agent(task, ctx):
        return ctx.llm().complete([Message(role="user", content=task["question"])]).text

    def reply(messages):
        return "right" if any(lesson in m.content for m in messages) else "wrong"

    def judge(task, output):
        return {"score": float(output == "right"), "feedback": "wrong count"}

    llms = provider(policy=ScriptedLM("p", reply), reflector=ScriptedLM("r", [lesson]))
    rx = Reflexion(
        agent,
        make_system(policy="scripted", reflector="scripted"),
        evaluator=judge,
        memory=store,
        reflector_role="reflector",
        llm_provider=llms,
    )
    a = rx.solve({"id": "A", "question": "how many pets are older than 3?"})
    assert a.success and len(a.attempts) == 2 and a.recalled == [] and len(a.lessons_written) == 1
    item = store.get(a.lessons_written[0])
    assert item.kind == "lesson" and item.metadata["task_id"] == "A" and item.metadata["lesson"] == lesson
    assert item.metadata["attempt"] == 0 and item.metadata["solved"] is True
    # a similar task: the lesson is in context before its first attempt, which then succeeds
    b = rx.solve({"id": "B", "question": "how many pets are older than 5?"})
    assert b.recalled == [lesson] and b.recalled_ids == a.lessons_written
    assert b.success and len(b.attempts) == 1
    assert lesson in llm_calls(b.attempts[0])[0].messages[0].content
    assert store.get(b.recalled_ids[0]).uses == 1 and store.get(b.recalled_ids[0]).strength > item.strength
    # the same lesson on the same task again adds nothing
    n = len(store)
    again = Reflexion(
        agent,
        make_system(policy="scripted", reflector="scripted"),
        evaluator=judge,
        memory=store,
        reflector_role="reflector",
        recall_k=0,
        llm_provider=llms,
    )
    a2 = again.solve({"id": "A", "question": "how many pets are older than 3?"})
    assert a2.lessons_written == a.lessons_written and len(store) == n
    # an unrelated task recalls nothing
    c = rx.solve({"id": "C", "question": "translate the poem into French"})
    assert c.recalled == []
    store.close()


# ----------------------------------------------------------------------------- inside a rollout


def test_reflexion_agent_runs_every_attempt_inside_one_rollout():
    lm = policy_lm()
    refl = ScriptedLM("r", [LESSON])
    agent = reflexion_agent(qa_agent, exact, reflector_role="reflector", max_attempts=3, temperature=0.7)
    assert agent.__name__ == "reflexion_qa_agent"
    system = make_system(policy="scripted", reflector="scripted")
    traj = run_agent(agent, system, TASK, provider(policy=lm, reflector=refl), seed=2)
    assert traj.error is None and traj.output == "4" and score(exact, TASK, traj).score == 1.0
    calls = llm_calls(traj)
    assert [c.role for c in calls] == ["policy", "reflector", "policy"]
    assert [c.temperature for c in calls] == [0.0, 0.0, 0.7]
    assert HEADER not in calls[0].messages[0].content and LESSON in calls[2].messages[0].content
    (step,) = [s for s in traj.steps if isinstance(s, ToolCall)]
    assert step.name == "reflexion" and step.result == LESSON and step.args["source"] == "model"
    # the system's workflow sets the number of attempts
    one = run_agent(
        agent,
        make_system({"reflexion_attempts": 1}, policy="scripted", reflector="scripted"),
        TASK,
        provider(policy=lm, reflector=refl),
    )
    assert one.output == "four" and len(llm_calls(one)) == 1


def test_an_agent_on_the_openai_endpoint_sees_its_lessons():
    """An agent that only speaks the OpenAI API gets each attempt's lessons through its rollout's
    endpoint, as a native call would (the lesson handle takes what the endpoint passes on)."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("starlette")

    def api_agent(task: dict, ctx) -> str:
        client = openai.OpenAI(base_url=ctx.openai_base_url(), api_key="unused", max_retries=0, timeout=30)
        r = client.chat.completions.create(
            model="m",
            messages=[
                {"role": "system", "content": "You answer questions."},
                {"role": "user", "content": task["question"]},
            ],
        )
        return r.choices[0].message.content.strip()

    agent = reflexion_agent(api_agent, exact, reflector_role="reflector", max_attempts=2)
    traj = run_agent(
        agent,
        make_system(policy="scripted", reflector="scripted"),
        TASK,
        provider(policy=policy_lm(), reflector=ScriptedLM("r", [LESSON])),
        seed=2,
    )
    assert traj.error is None and traj.output == "4"
    calls = llm_calls(traj)
    assert [c.role for c in calls] == ["policy", "reflector", "policy"] and LESSON in calls[2].messages[0].content


def test_the_sql_ready_agent_retries_with_the_feedback(tmp_path):
    from evolve.registry import import_path
    from evolve.worlds import sql

    sql_agent = sql.reflexion_agent
    assert import_path("evolve.worlds.sql:reflexion_agent") is sql_agent and sql_agent.__name__ == "reflexion_agent"
    tasks = sql.build(tmp_path / "sql", seed=0, n_train=3, n_val=0, n_test=0)["train"]
    gold = {t["question"]: t["gold_sql"] for t in tasks}

    def reply(messages):
        prompt = next(m.content for m in messages if m.role == "user")
        fixed = any(HEADER in m.content and "expected" in m.content for m in messages)
        return next(g for q, g in gold.items() if q in prompt) if fixed else "select 12345"

    lm = ScriptedLM("sql", reply)
    for attempts, want in ((2, 1.0), (1, 0.0)):
        system = make_system({"reflexion_attempts": attempts})
        for task in tasks:
            traj = score(sql.reward, task, run_agent(sql_agent, system, task, provider(policy=lm)))
            assert traj.error is None and traj.score == want, (task["question"], traj.reward)
            calls = llm_calls(traj)
            assert len(calls) == attempts
            if attempts == 2:
                assert calls[0].output == "select 12345" and "expected" in calls[1].messages[0].content
                assert [s.name for s in traj.steps if isinstance(s, ToolCall)] == [
                    "execute_sql",
                    "reflexion",
                    "execute_sql",
                ]


# ----------------------------------------------------------------------------- a real (tiny) local model


def test_the_wrapper_runs_on_the_local_backend(one_torch_thread):
    from tests.helpers import make_tiny_llm

    tiny = make_tiny_llm(temperature=1.0)
    try:

        def agent(task, ctx):
            return ctx.llm().complete([Message(role="user", content=task["question"])], max_tokens=8).text

        def judge(task, output):
            return Reward(score=0.0, feedback="say 4")

        rx = Reflexion(
            agent,
            make_system(policy="local", reflector="scripted"),
            evaluator=judge,
            max_attempts=3,
            reflector_role="reflector",
            temperature=1.0,
            llm_provider=provider(policy=tiny, reflector=ScriptedLM("r", ["Reply with the digit 4."])),
        )
        res = rx.solve({"id": "t", "question": "2+2?"})
        assert not res.success and len(res.attempts) == 3 and all(t.error is None for t in res.attempts)
        assert res.reflections[:2] == ["Reply with the digit 4."] * 2
        last = llm_calls(res.attempts[2])[0]
        assert last.model == "tiny" and last.token_ids is not None and len(last.prompt_token_ids) > 20
        assert last.messages[0].content == f"{HEADER}\n- Reply with the digit 4."
        # the tiny model as its own reflector: the reflection prompt does not fit its 128-token
        # context, so the backend raises; the feedback stands in and the run goes on
        rx2 = Reflexion(
            agent, make_system(policy="local"), evaluator=judge, max_attempts=2, llm_provider=provider(policy=tiny)
        )
        res2 = rx2.solve({"id": "t", "question": "2+2?"})
        (rec,) = res2.records
        assert len(res2.attempts) == 2 and rec.source == "feedback" and rec.text == "say 4"
        assert rec.reason.startswith("the reflector failed") and "context holds 128" in rec.reason
    finally:
        tiny.close()
