"""A team on one base, an adapter per role (evolve.policy.roles, evolve.archive.roles): each role's
adapter stored, loaded and served from one base; a child that trains one role keeps the other's by
reference; rollback per role; a verifier's credit is whether its verdict matched the truth; the
roles setting and its errors."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from evolve.archive import Archive  # noqa: E402
from evolve.archive.roles import role_history, rollback_role  # noqa: E402
from evolve.artifacts import ArtifactStore  # noqa: E402
from evolve.errors import ArchiveError, ConfigError  # noqa: E402
from evolve.policy.grpo import GRPO  # noqa: E402
from evolve.policy.local import build, shutdown_all  # noqa: E402
from evolve.policy.roles import (  # noqa: E402
    RoleParams,
    accepted,
    check_roles,
    default_credit,
    trained_roles,
    verdict,
    verdict_turns,
)
from evolve.policy.star import STaR  # noqa: E402
from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model  # noqa: E402
from evolve.policy.weights import save_base  # noqa: E402
from evolve.types import ArtifactRef, LLMCall, Message, ModelSpec, Reward, System, Trajectory  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CFG = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=128, init_std=0.3)
TOK = CharTokenizer()
SOLVE = [Message(role="user", content="spell cat backward")]
VERIFY = [Message(role="user", content="cat -> tac. right?")]


@pytest.fixture(autouse=True)
def _close_servers():
    yield
    shutdown_all()


@pytest.fixture
def team(tmp_path):
    """A store with one tiny base, and a system whose solver and verifier are both that base, no adapters."""
    save_base(build_model(CFG, seed=0), TOK, CFG, tmp_path / "base.st")
    store = ArtifactStore(tmp_path / "artifacts")
    base = store.put_file(tmp_path / "base.st", "base_weights")
    spec = ModelSpec(name="tiny", base=base, params={"temperature": 0.0, "max_tokens": 12, "threads": 1})
    return store, System(models={"solver": spec, "verifier": spec})


@pytest.fixture
def fake_fit(tmp_path, monkeypatch):
    """STaR's training replaced by a random LoRA adapter (a new one per call, non-zero, no optimizer
    step), so the plumbing is tested fast; the slow test below trains for real."""
    import copy
    import warnings

    from peft import LoraConfig, get_peft_model

    from evolve.policy import star
    from evolve.policy.weights import adapter_from_model

    made: list[tuple[str | None, int]] = []

    def fit(base, init, examples, **kw):
        torch.manual_seed(len(made) + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            pm = get_peft_model(
                copy.deepcopy(build_model(CFG, seed=0)),
                LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "up_proj"]),
            )
        with torch.no_grad():
            for n, w in pm.named_parameters():
                if "lora_B" in n:
                    w.normal_(0, 0.3)
        path = tmp_path / f"fit-{len(made)}.st"
        adapter_from_model(pm).save(path)
        made.append((init, len(examples)))
        return path.read_bytes(), {"loss": 0.0}

    monkeypatch.setattr(star, "fit_adapter", fit)
    return made


def reply(system: System, store: ArtifactStore, role: str, messages=VERIFY) -> str:
    llm = build(system.models[role], store)
    try:
        return llm.complete(messages).text
    finally:
        llm.close()


def call(role: str, messages, out: str, text: str | None = None) -> LLMCall:
    """A recorded call whose sampled ids are ``out`` (EOS appended) after the rendered chat."""
    return LLMCall(
        role=role,
        model="tiny",
        messages=tuple(messages),
        output=out if text is None else text,
        prompt_token_ids=tuple(TOK.render_chat(messages, add_generation_prompt=True)),
        token_ids=tuple(TOK.encode(out)) + (TOK.eos_id,),
    )


def rollout(task: str, answer: str, verdict_text: str, score: float, sample: int = 0) -> Trajectory:
    return Trajectory(
        task_id=task,
        system_id="s",
        sample=sample,
        output={"reply": answer},
        steps=(call("solver", SOLVE, answer), call("verifier", VERIFY, verdict_text)),
        reward=Reward(score=score),
    )


def ctx_for(store: ArtifactStore, tmp_path: Path, trajs: list[Trajectory], generation: int = 0):
    return SimpleNamespace(
        train=[{"id": f"t{i}"} for i in range(4)],
        rng=random.Random(0),
        log=lambda m: None,
        rollouts=lambda *a, **k: trajs,
        artifacts=store,
        workdir=tmp_path,
        extra={},
        generation=generation,
        seed=0,
    )


TRAIN = dict(tasks=4, samples=1, min_examples=1, lr=0.02, epochs=40, batch_size=4, r=4, alpha=8, replay=0.0)


# ----------------------------------------------------------------------------- adapters per role


def test_a_child_that_trains_the_verifier_keeps_the_solvers_adapter_and_one_base_serves_each_its_own(
    team, tmp_path, fake_fit
):
    store, parent = team
    base_reply = reply(parent, store, "solver")
    assert reply(parent, store, "verifier") == base_reply  # one base, no adapters: the same replies
    trajs = [rollout(f"t{i}", "Answer: tac", "correct", 1.0, i) for i in range(4)]
    child = STaR(roles="verifier", **TRAIN).propose(parent, ctx_for(store, tmp_path, trajs))[0].system
    assert fake_fit == [(None, 1)]  # one role trained, on its one distinct right verdict
    assert child.models["solver"] == parent.models["solver"]  # untouched: the same spec, the same (no) adapter
    assert child.models["verifier"].adapter is not None and store.has(child.models["verifier"].adapter.sha256)
    assert child.models["verifier"].base == child.models["solver"].base  # one base artifact

    solver, verifier = build(child.models["solver"], store), build(child.models["verifier"], store)
    try:
        assert solver.server is verifier.server  # one base in memory, the verifier's adapter attached to it
        assert solver.server.adapters() == [verifier.adapter] and solver.adapter is None
        assert verifier.complete(VERIFY).text != base_reply  # its own adapter's reply
        assert solver.complete(VERIFY).text == base_reply  # the solver is still the base
    finally:
        solver.close(), verifier.close()

    # the solver trained next: both roles' adapters, the verifier's kept by reference
    grand = STaR(roles=["solver"], **TRAIN).propose(child, ctx_for(store, tmp_path, trajs))[0].system
    assert grand.models["verifier"].adapter == child.models["verifier"].adapter
    assert grand.models["solver"].adapter not in (None, child.models["verifier"].adapter)
    assert System.model_validate_json(grand.model_dump_json()) == grand  # both adapters: parts of one system
    solver, verifier = build(grand.models["solver"], store), build(grand.models["verifier"], store)
    try:
        assert solver.server is verifier.server and sorted(solver.server.adapters()) == sorted(
            [solver.adapter, verifier.adapter]
        )
        assert verifier.complete(VERIFY).text == reply(child, store, "verifier")  # the same adapter, the same reply
        assert solver.complete(VERIFY).text not in (base_reply, verifier.complete(VERIFY).text)
    finally:
        solver.close(), verifier.close()


@pytest.mark.slow
def test_star_teaches_the_verifier_its_verdict_and_leaves_the_solver_as_it_was(team, tmp_path):
    store, parent = team
    before = reply(parent, store, "solver")
    trajs = [rollout(f"t{i}", "Answer: tac", "correct", 1.0, i) for i in range(4)]
    child = STaR(roles="verifier", **TRAIN).propose(parent, ctx_for(store, tmp_path, trajs))[0].system
    assert reply(child, store, "verifier") == "correct" and reply(child, store, "solver") == before


def test_ctranslate2_serves_each_role_from_one_server_with_an_entry_per_adapter(team, tmp_path, monkeypatch, fake_fit):
    pytest.importorskip("ctranslate2")
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    store, parent = team
    trajs = [rollout(f"t{i}", "Answer: tac", "correct", 1.0, i) for i in range(4)]
    child = STaR(roles="verifier", **TRAIN).propose(parent, ctx_for(store, tmp_path, trajs))[0].system
    ct2 = {
        r: s.model_copy(update={"params": {**s.params, "engine": "ctranslate2", "compute_type": "float32"}})
        for r, s in child.models.items()
    }
    solver, verifier = build(ct2["solver"], store), build(ct2["verifier"], store)
    try:
        assert solver.server is verifier.server and solver.server.engine == "ctranslate2"
        assert verifier.complete(VERIFY).text == reply(child, store, "verifier")  # torch's reply, its adapter
        assert solver.complete(VERIFY).text == reply(parent, store, "solver")
        assert len([p for p in (tmp_path / "cache" / "ct2").iterdir() if p.is_dir()]) == 2  # base, base+verifier
    finally:
        solver.close(), verifier.close()


def test_joint_trains_every_role_in_one_child_and_alternate_one_role_per_generation(team, tmp_path, fake_fit):
    store, parent = team
    trajs = [rollout(f"t{i}", "Answer: tac", "correct", 1.0, i) for i in range(4)]
    quick = TRAIN
    joint = STaR(roles="all", **quick).propose(parent, ctx_for(store, tmp_path, trajs))[0]
    assert all(joint.system.models[r].adapter is not None for r in ("solver", "verifier"))
    assert set(joint.info["roles"]) == {"solver", "verifier"}
    assert joint.info["roles"]["verifier"]["verdicts"]["right"] == 4
    for gen, role in [(1, "solver"), (2, "verifier"), (3, "solver")]:  # the engine's generations count from 1
        got = STaR(roles="all", schedule="alternate", **quick).propose(parent, ctx_for(store, tmp_path, trajs, gen))[0]
        assert [r for r in ("solver", "verifier") if got.system.models[r].adapter is not None] == [role]


# ----------------------------------------------------------------------------- rollback per role


def test_rollback_of_one_role_restores_its_adapter_and_keeps_the_others(tmp_path):
    def spec(adapter: str | None) -> ModelSpec:
        ref = ArtifactRef(sha256=adapter * 64, kind="adapter") if adapter else None
        return ModelSpec(name="tiny", base=ArtifactRef(sha256="b" * 64, kind="base_weights"), adapter=ref)

    root = System(models={"solver": spec(None), "verifier": spec(None)})
    g1 = root.replace(models={**root.models, "verifier": spec("1")})  # the verifier trained
    g2 = g1.replace(models={**g1.models, "solver": spec("2")})  # then the solver
    g3 = g2.replace(models={**g2.models, "verifier": spec("3")})  # then the verifier again
    with Archive(tmp_path / "run") as archive:
        archive.add_system(root)
        for child, parent, gen in [(g1, root, 1), (g2, g1, 2), (g3, g2, 3)]:
            archive.add_system(child, parents=[parent.id], operator="star", generation=gen)
        archive.set_current(g3.id)
        history = role_history(archive, g3.id, "verifier")
        assert [(h["system"], h["adapter"]) for h in history] == [(root.id, None), (g1.id, "1" * 64), (g3.id, "3" * 64)]
        assert [h["system"] for h in role_history(archive, g3.id, "solver")] == [root.id, g2.id]

        back = rollback_role(archive, g3.id, "verifier", to=root.id)  # the verifier untrained, the solver kept
        assert back.models["verifier"] == root.models["verifier"] and back.models["solver"] == g3.models["solver"]
        assert archive.current() == back.id and archive.record(back.id).parents == (g3.id, root.id)
        assert archive.record(back.id).operator == "rollback_role" and archive.has_system(g3.id)  # nothing deleted
        assert rollback_role(archive, g3.id, "verifier", to=g1.id) == g2  # that pair is an archived system already
        assert archive.current() == g2.id
        with pytest.raises(ArchiveError, match="no role 'judge'; its roles are solver, verifier"):
            rollback_role(archive, g3.id, "judge", to=g1.id)


# ----------------------------------------------------------------------------- verifier credit


def test_a_verifier_that_always_says_correct_is_rewarded_only_where_the_answer_was_right():
    trajs = [
        rollout("a", "Answer: tac", "correct", 1.0),
        rollout("a", "Answer: cat", "correct", 0.0, 1),
        rollout("b", "Answer: god", "Correct.", 1.0),
        rollout("b", "Answer: dgo", "correct", 0.0, 1),
    ]
    turns = verdict_turns(trajs, "verifier")
    assert [(v.verdict, v.truth, v.reward) for v in turns] == [
        (True, True, 1.0),
        (True, False, 0.0),
        (True, True, 1.0),
        (True, False, 0.0),
    ]
    honest = [rollout("a", "Answer: tac", "correct", 1.0), rollout("a", "Answer: cat", "incorrect", 0.0, 1)]
    assert [v.reward for v in verdict_turns(honest, "verifier")] == [1.0, 1.0]


def test_a_verdict_on_a_rejected_answer_gets_its_truth_from_a_rollout_that_submitted_it_else_none():
    retry = Trajectory(
        task_id="a",
        system_id="s",
        output={"reply": "Answer: tac"},
        reward=Reward(score=1.0),
        steps=(
            call("solver", SOLVE, "Answer: cat"),
            call("verifier", VERIFY, "incorrect"),  # rejected a wrong answer
            call("solver", SOLVE, "Answer: tac"),
            call("verifier", VERIFY, "correct"),
        ),
    )  # accepted the right one
    other = rollout("a", "Answer: cat", "correct", 0.0, 1)  # another rollout submitted "cat": it scored 0
    turns = verdict_turns([retry, other], "verifier")
    assert [(v.step, v.truth, v.reward) for v in turns] == [(1, False, 1.0), (3, True, 1.0), (1, False, 0.0)]
    alone = verdict_turns([retry], "verifier")
    assert [(v.truth, v.reward) for v in alone] == [(None, 0.0), (True, 1.0)]  # "cat" never scored: unjudged


def test_grpo_gives_a_verifier_the_advantages_of_its_verdicts_credit_per_task_group():
    from evolve.policy.rl import group_advantages

    trajs = [
        rollout("a", "Answer: tac", "correct", 1.0),
        rollout("a", "Answer: cat", "correct", 0.0, 1),
        rollout("a", "Answer: ca", "incorrect", 0.0, 2),
    ]
    seqs, info = GRPO()._batch(trajs, 128, role="verifier")
    want = group_advantages(torch.tensor([1.0, 0.0, 1.0]), ["a"] * 3, "grpo")[0].tolist()
    assert [s.advantage for s in seqs] == pytest.approx(want)
    assert [s.reward for s in seqs] == [1.0, 0.0, 1.0] and info["verdicts_right"] == 2
    assert all(sum(s.mask) == len(trajs[k].steps[1].token_ids) for k, s in enumerate(seqs))  # its own turn only
    solver, _ = GRPO()._batch(trajs, 128, role="solver")  # the solver takes the team's outcome
    assert [s.reward for s in solver] == [1.0, 0.0, 0.0]


def test_verdicts_are_read_from_the_first_accepting_or_rejecting_word():
    assert [verdict(t) for t in ("correct", "Incorrect.", "Not correct", "yes, it is right", "wrong", "", "tac")] == [
        True,
        False,
        False,
        True,
        False,
        None,
        None,
    ]
    assert accepted({"verdict": "correct"}) == (True, "")
    assert accepted({"verdict": "no"}) == (False, "A checker rejected the answer: no")
    assert [default_credit(r) for r in ("solver", "verifier", "code-reviewer", "judge_2", "writer")] == [
        "outcome",
        "verdict",
        "verdict",
        "verdict",
        "outcome",
    ]


# ----------------------------------------------------------------------------- the roles setting


def test_roles_settings_and_their_errors_name_the_roles_that_exist():
    local = SimpleNamespace(backend="local", base="x")
    models = {"solver": local, "verifier": local, "judge": SimpleNamespace(backend="litellm", base=None)}
    assert trained_roles(RoleParams(roles="all"), models, 0) == ["solver", "verifier"]
    assert trained_roles(RoleParams(roles=["verifier", "solver"], schedule="alternate"), models, 1) == ["verifier"]
    assert trained_roles(RoleParams(roles=["verifier", "solver"], schedule="alternate"), models, 2) == ["solver"]
    assert trained_roles(RoleParams(), {"policy": models["solver"]}, 3) == ["policy"]
    with pytest.raises(ConfigError, match="unknown role 'critic'; the system's roles are judge, solver, verifier"):
        check_roles(RoleParams(roles=["solver", "critic"]), models)
    with pytest.raises(ConfigError, match="'judge' is a litellm model.*local roles are solver, verifier"):
        check_roles(RoleParams(roles="judge"), models)
    with pytest.raises(ConfigError, match="credit: unknown role 'critic'"):
        check_roles(RoleParams(roles="all", credit={"critic": "verdict"}), models)
    for bad, message in [
        ({"roles": []}, "roles is empty"),
        ({"roles": ["a", "a"]}, "'a' more than once"),
        ({"roles": ["all", "a"]}, "'all' stands alone"),
        ({"role": "a", "roles": "b"}, "not both"),
        ({"schedule": "turns"}, "joint"),
        ({"credit": {"a": "vibes"}}, "outcome"),
    ]:
        with pytest.raises(ValueError, match=message):
            STaR(**bad)


def test_a_task_file_naming_an_unknown_role_is_refused_at_load_with_the_path_and_the_roles():
    from evolve.task.taskfile import validate_task

    data = {
        "name": "t",
        "agent": "evolve.topology:agent",
        "reward": "evolve.worlds.toy:reward",
        "dataset": {"source": "evolve.worlds.toy:dataset"},
        "models": {
            r: {"backend": "local", "name": "tiny", "params": {"weights": "base.st"}} for r in ("solver", "verifier")
        },
        "operators": [{"name": "grpo", "params": {"roles": ["solver", "checker"]}}],
    }
    with pytest.raises(
        ConfigError,
        match=r"operators\.0\.params.*unknown role 'checker'; the system's roles are "
        r"solver, verifier",
    ):
        validate_task(data)
    data["operators"][0]["params"]["roles"] = "all"
    assert validate_task(data).operators[0].params["roles"] == "all"


def test_a_cold_starts_validation_probe_names_every_role_so_a_teams_graph_runs_on_the_model_in_training():
    from evolve.policy.sft import _val_eval

    task = SimpleNamespace(workflow={}, prompts={}, seed=0, models={"solver": None, "verifier": None})
    session = SimpleNamespace(task=task, agent=print, reward=print, base_dir=Path("."))
    mc = SimpleNamespace(name="tiny", params={"max_tokens": 8}, cold_start=None)
    val = _val_eval(session, "verifier", mc, [], {}, {}, False)
    assert sorted(val.probe.models) == ["solver", "verifier"] and val.role == "verifier"


def test_a_cold_start_picked_by_its_demos_scores_the_exact_replies_and_says_each_verdicts_hits():
    """``pick_by: demos``: the checkpoint's score is the share of the validation tasks' demos whose last reply
    the model writes greedily; a verdict's yes and no are counted apart, so always-yes shows."""
    pytest.importorskip("torch")
    from evolve.policy.local import LocalLM
    from evolve.policy.sft import DemoEval
    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model

    tok = CharTokenizer()
    model = build_model(TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=96), seed=0, tokenizer=tok)
    asks = [[{"role": "user", "content": f"is {w} right?"}] for w in ("cat", "dog", "owl", "bee")]
    llm = LocalLM.from_model(model, tok, temperature=0.0, max_tokens=6)
    try:
        says = [llm.complete(ask, temperature=0.0).text for ask in asks]
    finally:
        llm.close()
    # the first two demos ask for what the model writes (spacing and case aside), the last two for something else
    wanted = [f"  {says[0].upper()} ", says[1], says[2] + "zz", "zz" + says[3]]
    chats = [[*ask, {"role": "assistant", "content": w}] for ask, w in zip(asks, wanted)]
    said: list[str] = []
    score = DemoEval(chats=chats, name="tiny", max_tokens=6)(model, tok, said.append)
    assert score == 0.5
    assert said[-1].startswith("cold start: held-out demo accuracy 0.500 (")
    each = dict(part.rsplit(": ", 1) for part in said[-1].split(" (", 1)[1].rstrip(")").split(", "))
    assert {v for k, v in each.items() if "zz" in k} == {"0/1"}  # each reply's hits, the wrong ones apart
    assert sum(int(v.split("/")[0]) for k, v in each.items() if "zz" not in k) == 2


def test_a_cold_start_picked_by_demos_needs_demos_that_end_in_a_reply():
    from evolve.errors import ConfigError
    from evolve.policy.sft import _val_eval
    from evolve.task.config import ColdStart

    task = SimpleNamespace(workflow={}, prompts={}, seed=0, models={"verifier": None})
    session = SimpleNamespace(
        task=task, agent=print, reward=print, base_dir=Path("."), initial_tools=dict, initial_memory=dict
    )
    cs = ColdStart(demos="copy:copy", pick_by="demos")  # the tasks themselves: dicts, not chats
    mc = SimpleNamespace(name="tiny", params={}, cold_start=cs)
    with pytest.raises(ConfigError, match=r"models.verifier.cold_start.pick_by is demos.*set pick_by: agent"):
        _val_eval(session, "verifier", mc, [{"id": "v0"}], {}, {}, False)


def test_grpo_joint_updates_a_learner_per_role_on_its_own_turns_and_the_child_carries_both_adapters(
    team, tmp_path, monkeypatch
):
    store, parent = team
    parent = parent.replace(models={r: s.model_copy(update={"name": r}) for r, s in parent.models.items()})
    learners: dict[str, SimpleNamespace] = {}

    def learner(self, spec, ctx):
        role = spec.name
        got = SimpleNamespace(
            seen=[],
            max_len=lambda: 128,
            close=lambda: None,
            replay=lambda wins: len(wins),
            adapter_bytes=lambda: f"{role}-{len(got.seen)}".encode(),
        )
        got.update = lambda seqs: (
            got.seen.append(seqs)
            or SimpleNamespace(
                sequences=len(seqs),
                trained_tokens=1,
                loss=0.0,
                kl=0.0,
                clip_low=0.0,
                clip_high=0.0,
                mismatch=0.0,
                extra={},
                seconds=1.0,
                tokens=1,
            )
        )
        learners[role] = got
        return got

    monkeypatch.setattr(GRPO, "_learner", learner)
    batch = [rollout("t1", "Answer: tac", "yes", 1.0), rollout("t1", "Answer: cat", "yes", 0.0, 1)]

    def rollouts(system, tasks, samples=1, temperature=None, tag="", **kw):
        if tag == "grpo-dev":  # the trained system scores better on the held-out task
            return [Trajectory(task_id="t0", system_id=system.id, reward=Reward(score=float(system != parent)))]
        return batch

    ctx = SimpleNamespace(**{**vars(ctx_for(store, tmp_path, batch)), "rollouts": rollouts})
    cand = GRPO(roles="all", steps=1, tasks_per_step=1, group_size=2, dev_tasks=1, eval_every=1).propose(parent, ctx)[0]
    assert sorted(learners) == ["solver", "verifier"] and cand.info["roles"] == ["solver", "verifier"]
    solver_seqs, verifier_seqs = learners["solver"].seen[0], learners["verifier"].seen[0]
    assert [s.reward for s in solver_seqs] == [1.0, 0.0]  # the team's outcome
    assert [s.reward for s in verifier_seqs] == [1.0, 0.0]  # yes on the right answer: 1; yes on the wrong one: 0
    assert (
        solver_seqs[0].ids[-1] == verifier_seqs[0].ids[-1] == TOK.eos_id and solver_seqs[0].ids != verifier_seqs[0].ids
    )
    for role in ("solver", "verifier"):
        assert store.path(cand.system.models[role].adapter).read_bytes() == f"{role}-1".encode()
    learners.clear()
    GRPO(roles="all", schedule="alternate", steps=1, tasks_per_step=1, group_size=2, dev_tasks=1, eval_every=1).propose(
        parent, SimpleNamespace(**{**vars(ctx), "generation": 2})
    )
    assert list(learners) == ["verifier"]
