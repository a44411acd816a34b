"""STaR: which turns of which trajectories become training examples."""

from evolve.policy.star import STaR
from evolve.types import LLMCall, Message, Reward, ToolCall, Trajectory

M = (Message(role="user", content="q"),)


def call(prompt, out, role="policy"):
    return LLMCall(role=role, model="tiny", messages=M, output="x", prompt_token_ids=prompt, token_ids=out)


def traj(*steps, score=1.0):
    return Trajectory(task_id="t", system_id="s", steps=steps, reward=Reward(score=score))


def test_final_turn_only_skips_rejected_attempts():
    t = traj(
        call((1, 2), (10, 11)),
        ToolCall(name="execute_sql", error="SQLError: no such column"),
        call((1, 2, 10, 11, 3), (12, 13)),
        ToolCall(name="execute_sql", result=[[1]]),
    )
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


def test_its_samples_ask_for_no_log_probs():
    """STaR reads token ids only, so its rollouts say so (logprobs=False): CTranslate2 then skips the
    forward pass that recomputes log-probs at the sampling temperature (tests/policy/test_ct2.py)."""
    import random
    from types import SimpleNamespace

    from evolve.types import ArtifactRef, ModelSpec, System

    asked: list[dict] = []
    parent = System(
        models={
            "policy": ModelSpec(backend="local", name="tiny", base=ArtifactRef(sha256="0" * 64, kind="base_weights"))
        }
    )
    ctx = SimpleNamespace(
        train=[{"id": f"t{i}"} for i in range(3)],
        rng=random.Random(0),
        log=lambda m: None,
        rollouts=lambda *a, **k: asked.append(k) or [],
    )
    assert STaR(tasks=2, samples=3, temperature=0.4).propose(parent, ctx) == []  # no successes: no child
    assert asked == [{"samples": 3, "temperature": 0.4, "tag": "star", "logprobs": False}]


def test_capped_samples_and_replies_cut_at_the_cap():
    """``max_tokens`` caps STaR's samples (their own tag, so uncapped samples are not reused);
    ``finished_only`` learns nothing from an attempt cut at its cap, even one the scorer passed."""
    import random
    from types import SimpleNamespace

    from evolve.policy.star import ended
    from evolve.types import ArtifactRef, ModelSpec, System

    def cut(reason):
        return LLMCall(
            role="policy",
            model="tiny",
            messages=M,
            output="x",
            prompt_token_ids=(1,),
            token_ids=(5,),
            finish_reason=reason,
        )

    passed = [traj(cut("length")), traj(cut("stop")), traj(cut(None))]
    assert [ended(t) for t in passed] == [False, True, True]
    asked: list[dict] = []
    said: list[str] = []
    parent = System(
        models={
            "policy": ModelSpec(backend="local", name="tiny", base=ArtifactRef(sha256="0" * 64, kind="base_weights"))
        }
    )
    ctx = SimpleNamespace(
        train=[{"id": f"t{i}"} for i in range(3)],
        rng=random.Random(0),
        log=said.append,
        rollouts=lambda *a, **k: asked.append(k) or passed,
    )
    star = STaR(tasks=2, samples=3, temperature=0.4, max_tokens=64, finished_only=True, min_examples=2)
    assert star.propose(parent, ctx) == []  # one distinct example left: under min_examples
    assert asked == [{"samples": 3, "temperature": 0.4, "tag": "star@64", "logprobs": False, "max_tokens": 64}]
    assert "star: 1 attempts that passed were cut at their token cap and are not learned from" in said
    assert any("2/3 samples succeeded" in m for m in said)
