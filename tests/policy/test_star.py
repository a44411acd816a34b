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


def test_repaired_attempts_are_learned_as_the_model_s_turn(monkeypatch, tmp_path):
    """With ``repair`` (the world's ``star.repair`` hook), an attempt that failed, or passed but was cut
    at its cap, is learned as its repaired reply: its prompt ids, the context, the edited text."""
    import random
    from types import SimpleNamespace

    import evolve.policy.star as star_mod
    from evolve.types import ArtifactRef, ModelSpec, System

    t0 = {"id": "t0", "split": "train", "prompt": "p", "instruction_id_list": ["startend:quotation"], "kwargs": [{}]}
    t1 = {**t0, "id": "t1"}

    def attempt(task_id, text, reason, score):
        c = LLMCall(
            role="policy",
            model="m",
            messages=M,
            output=text,
            prompt_token_ids=(1, 2),
            token_ids=(5,),
            finish_reason=reason,
        )
        return Trajectory(task_id=task_id, system_id="s", steps=(c,), reward=Reward(score=score))

    trajs = [
        attempt("t0", "Plain words. Cut in the mid", "length", 0.0),  # failed, cut: repaired
        attempt("t1", '"Already quoted."', "stop", 1.0),  # passed and ended: learned as sampled
        attempt("t1", "Hola. Hola. Hola. Hola.", "length", 0.0),
    ]
    trained = {}

    def fake_train(parent, specs, per_role, ctx, p):
        trained.update(per_role)
        return parent, {"policy": {}}, {r: len(x) for r, x in per_role.items()}

    monkeypatch.setattr(star_mod, "train_roles", fake_train)
    said: list[str] = []
    parent = System(
        models={"policy": ModelSpec(backend="local", name="m", base=ArtifactRef(sha256="0" * 64, kind="base_weights"))}
    )
    ctx = SimpleNamespace(
        train=[t0, t1], rng=random.Random(0), log=said.append, rollouts=lambda *a, **k: trajs, generation=1
    )
    op = STaR(tasks=2, samples=1, finished_only=True, min_examples=1, repair="evolve.worlds.ifeval.repair:repair")
    [child] = op.propose(parent, ctx)
    ex = trained["policy"]
    assert ((1, 2), (5,)) in ex  # the one that passed, its sampled ids
    repaired = [e for e in ex if len(e) == 3]
    prompt_ids, context, text = repaired[0]
    assert prompt_ids == (1, 2) and text == '"Plain words."'  # cut at its last finished sentence, quoted
    assert [(m["role"], m["content"]) for m in context] == [("user", "q")]
    assert child.info["repaired"] == len(repaired) == 2  # "Hola." quoted passes too
    assert any("learned as repaired" in m for m in said)
    assert "trained on 3 turns (2 of them repaired)" in child.rationale
    assert STaR(tasks=1).p.repair is None  # off unless the world or the task file names one


def test_a_written_turn_ends_as_the_chat_template_ends_a_turn(tmp_path):
    from evolve.policy.hf import load_pretrained
    from evolve.policy.star import written_turn
    from tests.helpers.hf_checkpoint import make_checkpoint

    _, tok = load_pretrained(make_checkpoint(tmp_path / "ckpt"), device="cpu", dtype="float32")
    context = [{"role": "user", "content": "the quick brown fox"}]
    prompt = tuple(tok.render_chat(context))
    p, c = written_turn(tok, prompt, context, "select name from users")
    assert p == prompt
    whole = tok.render_chat(
        [*context, {"role": "assistant", "content": "select name from users"}], add_generation_prompt=False
    )
    assert list(p + c) == whole[: len(p) + len(c)] and c[-1] in tok.eos_ids
