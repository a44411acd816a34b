"""The data model: JSON round-trips exactly; a system's id is the hash of its content."""

import pytest
from pydantic import ValidationError

from evolve.types import ArtifactRef, Candidate, LLMCall, Message, ModelSpec, Reward, System, ToolCall, Trajectory


def _system(**kw):
    return System(
        workflow={"max_turns": 3, "nested": {"a": [1, 2.5, None, True]}},
        models={
            "policy": ModelSpec(
                backend="local",
                name="tiny",
                base=ArtifactRef(sha256="ab" * 32, kind="base_weights", size=10),
                adapter=None,
                params={"temperature": 0.0},
            )
        },
        prompts={"instruction": "Write SQL. ünïcödé ✓"},
        **kw,
    )


def test_system_round_trip_and_id():
    s = _system()
    back = System.model_validate_json(s.model_dump_json())
    assert back == s and back.id == s.id
    assert len(s.id) == 16
    assert _system().id == s.id  # same content, same id
    assert s.replace(prompts={"instruction": "other"}).id != s.id


def test_system_is_immutable_and_strict():
    s = _system()
    with pytest.raises(ValidationError):
        s.prompts = {}
    with pytest.raises(ValidationError):
        System(promts={})


def test_replace_keeps_model_specs_typed():
    s = _system()
    ref = ArtifactRef(sha256="cd" * 32, kind="adapter")
    child = s.replace(models={**s.models, "policy": s.models["policy"].model_copy(update={"adapter": ref})})
    assert isinstance(child.models["policy"], ModelSpec) and child.models["policy"].adapter == ref
    assert s.models["policy"].adapter is None


def test_trajectory_round_trip_with_both_step_kinds():
    t = Trajectory(
        task_id="t1",
        system_id="abc",
        steps=(
            LLMCall(
                role="policy",
                model="tiny",
                messages=(Message(role="user", content="q"),),
                output="select 1",
                prompt_token_ids=(1, 5, 6),
                token_ids=(40, 41, 2),
                logprobs=(-0.1, -1e-9, -3.25),
                temperature=1.0,
                finish_reason="stop",
                prompt_tokens=3,
                completion_tokens=3,
                cost=None,
                duration=0.01,
            ),
            ToolCall(name="execute_sql", args={"sql": "select 1"}, result=[[1]], duration=0.002),
            ToolCall(name="execute_sql", args={"sql": "x"}, error="SQLError: near x"),
        ),
        output={"sql": "select 1", "rows": [[1]]},
        reward=Reward(score=1.0, components={"parses": 1.0, "matches": 1.0}, feedback="correct"),
        tokens=6,
        cost=0.0,
        duration=0.5,
        sample=2,
        temperature=1.0,
    )
    back = Trajectory.model_validate_json(t.model_dump_json())
    assert back == t
    assert isinstance(back.steps[0], LLMCall) and isinstance(back.steps[1], ToolCall)
    assert back.steps[0].logprobs == (-0.1, -1e-9, -3.25)
    assert back.score == 1.0 and back.ok


def test_candidate_round_trip():
    s = _system()
    c = Candidate(system=s, parents=("p1", "p2"), operator="star", rationale="why", info={"examples": 12})
    back = Candidate.model_validate_json(c.model_dump_json())
    assert back == c and back.system.id == s.id
