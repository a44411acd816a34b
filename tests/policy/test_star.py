"""STaR: which turns of which trajectories become training examples."""

from evolve.policy.star import STaR
from evolve.types import LLMCall, Message, Reward, ToolCall, Trajectory

M = (Message(role="user", content="q"),)


def call(prompt, out, role="policy"):
    return LLMCall(role=role, model="tiny", messages=M, output="x", prompt_token_ids=prompt, token_ids=out)


def traj(*steps, score=1.0):
    return Trajectory(task_id="t", system_id="s", steps=steps, reward=Reward(score=score))


def test_final_turn_only_skips_rejected_attempts():
    t = traj(call((1, 2), (10, 11)), ToolCall(name="execute_sql", error="SQLError: no such column"),
             call((1, 2, 10, 11, 3), (12, 13)), ToolCall(name="execute_sql", result=[[1]]))
    assert STaR()._examples([t]) == [((1, 2, 10, 11, 3), (12, 13))]
    both = STaR(turns="all")._examples([t])
    assert both == [((1, 2), (10, 11)), ((1, 2, 10, 11, 3), (12, 13))]


def test_other_roles_missing_ids_and_duplicates_are_left_out():
    a = traj(call((1,), (5,)), ToolCall(name="execute_sql", result=[]))
    b = traj(call((1,), (5,)), ToolCall(name="execute_sql", result=[]))
    c = traj(call((2,), (6,), role="judge"))
    d = traj(LLMCall(role="policy", model="m", messages=M, output="no ids"))
    assert STaR()._examples([a, b, c, d]) == [((1,), (5,))]
    assert len(STaR(dedupe=False)._examples([a, b])) == 2


def test_final_turn_whose_tool_failed_is_not_learned():
    t = traj(call((1,), (5,)), ToolCall(name="execute_sql", error="boom"))
    assert STaR()._examples([t]) == []
