"""The prompt layer: components, PromptBreeder mutation, GEPA reflection, demo bootstrap,
crossover, the per-task Pareto front — all with the scripted LM."""

import json
import random
from types import SimpleNamespace

import pytest
import yaml

from evolve.artifacts import ArtifactStore
from evolve.errors import ConfigError
from evolve.llm.fake import ScriptedLM
from evolve.loop.operators import OperatorContext
from evolve.loop.pareto import best_counts, pareto_front, sample_from_front
from evolve.prompts import components as C
from evolve.prompts.bootstrap import DemoBootstrap, select
from evolve.prompts.crossover import Crossover
from evolve.prompts.mutation import MUTATION_PROMPTS, PromptMutation
from evolve.prompts.reflective import ReflectiveMutation
from evolve.registry import llm_backends
from evolve.types import LLMCall, Message, ModelSpec, Reward, System, Trajectory
from tests.helpers import DATA

# ----------------------------------------------------------------------------- helpers

LMS: dict[str, ScriptedLM] = {}
llm_backends.register("prompt-test", lambda spec, artifacts=None: LMS[spec.name])


def scripted(name, fn):
    """A scripted LM (backend ``prompt-test``) that records every message list it receives."""
    seen = []

    def reply(messages):
        seen.append(messages)
        return fn(messages[-1].content) if callable(fn) else fn

    LMS[name] = ScriptedLM(name, reply)
    return {"backend": "prompt-test", "name": name}, seen


def make_ctx(tmp_path, trajectories=(), train=(), rollouts=None, extra=None, seed=0, generation=1):
    logs = []
    ctx = OperatorContext(
        generation=generation,
        seed=seed,
        rng=random.Random(seed),
        train=list(train),
        trajectories=list(trajectories),
        artifacts=ArtifactStore(tmp_path / "artifacts"),
        workdir=tmp_path / "work",
        rollouts=rollouts or (lambda *a, **k: []),
        log=logs.append,
        extra=extra or {},
    )
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    return ctx, logs


def traj(task_id, user, output, score, feedback="", error=None, role="policy"):
    call = LLMCall(
        role=role,
        model="m",
        messages=(Message(role="system", content="sys"), Message(role="user", content=user)),
        output=output,
    )
    return Trajectory(
        task_id=task_id,
        system_id="s",
        steps=(call,),
        output=output,
        error=error,
        reward=Reward(score=score, feedback=feedback),
    )


def oplog(ctx, name):
    return json.loads((ctx.workdir / f"{name}.json").read_text())


# ----------------------------------------------------------------------------- components


def test_components_round_trip_and_step_convention():
    s = System(prompts={"instruction": "add", "planner.instruction": "plan", "format": "a number"})
    comps = C.components(s)
    assert {(c.step, c.kind) for c in comps.values()} == {
        ("policy", "instruction"),
        ("planner", "instruction"),
        ("policy", "format"),
    }
    demos = [{"input": "1 2", "output": "3"}, {"input": "5 5", "output": "10"}]
    s2 = C.set_demos(s, demos)
    assert isinstance(s2, System) and s2.prompts["instruction"] == "add" and s.prompts.get("demos") is None
    assert C.get_demos(s2) == demos and C.components(s2)["demos"].data == demos
    s3 = C.set_demos(s2, demos[:1], step="planner")
    assert C.get_demos(s3, "planner") == demos[:1] and "planner.demos" in s3.prompts
    # the two spellings of the default step name one component, and a setter keeps the stored key
    d = C.set_instruction({"policy.instruction": "old"}, "new")
    assert d == {"policy.instruction": "new"} and C.get_instruction(d) == "new"
    m = C.set_mutators({}, ["Rewrite it.", "Shorten it."])
    assert C.get_mutators(m) == ["Rewrite it.", "Shorten it."] and C.get_mutators({}) is None
    assert C.render_demos(demos) == "Example 1\nInput: 1 2\nOutput: 3\n\nExample 2\nInput: 5 5\nOutput: 10"
    assert C.render_demos([{"question": "q?", "answer": "a"}]) == "Example 1\nQuestion: q?\nAnswer: a"


def test_component_errors_name_the_component_and_the_fix():
    with pytest.raises(C.ComponentError, match=r"'planner.instrucion'.*did you mean planner.instruction"):
        C.components({"planner.instrucion": "x"})
    with pytest.raises(C.ComponentError, match=r"'demos' is not valid JSON.*set_demos"):
        C.components({"demos": "[{'input': 1}]"})
    with pytest.raises(C.ComponentError, match=r"'policy.mutator' must be a JSON list of non-empty strings"):
        C.components({"policy.mutator": "[1, 2]"})
    with pytest.raises(C.ComponentError, match=r"'demos' and 'policy.demos' name the same component"):
        C.components({"demos": "[]", "policy.demos": "[]"})
    with pytest.raises(C.ComponentError, match="not valid JSON"):
        C.set_text(System(), "demos", "{oops")


def test_diff_prompts_one_unified_diff_per_changed_component():
    a = {"instruction": "add the numbers\nanswer with a number", "format": "digits", "task": "sum"}
    b = C.set_demos(
        {**a, "instruction": "add the numbers carefully\nanswer with a number"}, [{"input": "1 1", "output": "2"}]
    )
    diffs = C.diff_prompts(a, System(prompts=b))
    assert len(diffs) == 2  # demos (added) and instruction (changed); format and task unchanged
    demos_diff, instr_diff = diffs
    assert demos_diff.startswith("--- /dev/null\n+++ b/demos") and '+{"input": "1 1", "output": "2"}' in demos_diff
    assert "--- a/instruction\n+++ b/instruction" in instr_diff
    assert "-add the numbers\n+add the numbers carefully\n answer with a number" in instr_diff
    assert C.diff_prompts(a, dict(a)) == []


# ----------------------------------------------------------------------------- pareto


def test_pareto_keeps_a_task_specialist_and_drops_a_dominated_one():
    per_task = {
        "A": {"t1": 1.0, "t2": 1.0, "t3": 0.0},
        "B": {"t1": 0.0, "t2": 0.0, "t3": 1.0},  # best on exactly one task
        "C": {"t1": 1.0, "t2": 0.5, "t3": 0.0},  # tied best on t1, dominated by A
        "D": {"t1": 0.9, "t2": 0.9, "t3": 0.9},  # dominated by nobody, best on nothing: out (GEPA)
    }
    assert pareto_front(per_task) == ["A", "B"]
    assert best_counts(per_task) == {"A": 2, "B": 1, "C": 1, "D": 0}
    # a missing task score counts as the worst
    assert pareto_front({"A": {"t1": 1.0}, "E": {"t1": 1.0, "t2": 0.0}}) == ["E"]


def test_pareto_extra_objectives_are_minimised():
    per_task = {"A": {"t1": 1.0, "t2": 1.0}, "F": {"t1": 1.0, "t2": 1.0}, "G": {"t1": 0.5, "t2": 0.5}}
    assert pareto_front(per_task) == ["A", "F"]  # identical scores: neither dominates
    cost = {"A": {"cost": 2.0}, "F": {"cost": 1.0}, "G": {"cost": 0.1}}
    assert pareto_front(per_task, cost) == ["F", "G"]  # F dominates A; G is the cheapest


def fixed_rng(x):
    return SimpleNamespace(random=lambda: x)


def test_sample_from_front_is_weighted_by_tasks_won():
    per_task = {"A": {"t1": 1, "t2": 1, "t3": 0}, "B": {"t1": 0, "t2": 0, "t3": 1}}
    front = pareto_front(per_task)
    # weights 2 (A) and 1 (B): A owns [0, 2/3), B [2/3, 1)
    assert [sample_from_front(front, per_task, fixed_rng(x)) for x in (0.0, 0.6, 0.7, 0.99)] == ["A", "A", "B", "B"]
    draws = [sample_from_front(front, per_task, random.Random(i)) for i in range(3000)]
    assert 0.62 < draws.count("A") / len(draws) < 0.71
    with pytest.raises(ValueError, match="empty"):
        sample_from_front([], per_task, random.Random(0))


# ----------------------------------------------------------------------------- PromptBreeder


def test_hyper_mutation_changes_the_mutation_prompts_the_child_carries(tmp_path):
    spec, seen = scripted(
        "breeder",
        lambda text: "```\nM-improved\n```" if "Mutation prompt:" in text else "```\nadd both numbers with care\n```",
    )
    parent = C.set_mutators(System(prompts={"instruction": "add"}), ["M-one", "M-two"])
    ctx, _ = make_ctx(tmp_path)
    [child] = PromptMutation(model=spec, hyper_rate=1.0, zero_order_rate=0.0).propose(parent, ctx)
    mutators = C.get_mutators(child.system)
    assert "M-improved" in mutators and len(mutators) == 2 and set(mutators) & {"M-one", "M-two"}
    assert child.info["hyper"]["new"] == "M-improved" and child.info["hyper"]["old"] in ("M-one", "M-two")
    assert C.get_instruction(child.system) == "add both numbers with care"
    hyper_msg, mutate_msg = (m[-1].content for m in seen)
    assert child.info["hyper"]["old"] in hyper_msg
    assert mutate_msg.startswith("M-improved") and "```\nadd\n```" in mutate_msg  # the improved prompt was applied
    assert C.get_mutators(parent) == ["M-one", "M-two"]
    assert [c["purpose"] for c in oplog(ctx, "prompt_mutation")["calls"]] == [
        "child 0: hyper-mutation",
        "child 0: first_order",
    ]
    # without hyper-mutation the child carries the parent's mutation prompts unchanged
    ctx2, _ = make_ctx(tmp_path / "b")
    [plain] = PromptMutation(model=spec, hyper_rate=0.0, zero_order_rate=0.0).propose(parent, ctx2)
    assert C.get_mutators(plain.system) == ["M-one", "M-two"] and plain.info["hyper"] is None


def test_zero_order_generates_from_the_task_description(tmp_path):
    spec, seen = scripted("zero", "```\nAdd the two numbers and answer with digits only.\n```")
    parent = System(prompts={"task": "Given two numbers 'a b', answer a + b."})  # no instruction yet
    ctx, _ = make_ctx(tmp_path)
    [child] = PromptMutation(model=spec).propose(parent, ctx)
    sent = seen[0][-1].content
    assert "Given two numbers 'a b', answer a + b." in sent and "Current instruction" not in sent
    assert child.info["mode"] == "zero_order"
    assert C.get_instruction(child.system) == "Add the two numbers and answer with digits only."
    assert C.get_mutators(child.system) == list(MUTATION_PROMPTS)  # seeded, so they evolve from here on
    # zero_order_rate=1 uses the task_description param even when an instruction exists
    ctx2, _ = make_ctx(tmp_path / "b")
    [again] = PromptMutation(model=spec, zero_order_rate=1.0, task_description="Sum two integers.").propose(
        System(prompts={"instruction": "add"}), ctx2
    )
    assert again.info["mode"] == "zero_order" and "Sum two integers." in seen[-1][-1].content


def test_prompt_mutation_rejects_and_records_bad_answers(tmp_path):
    spec, _ = scripted("lazy", "```\nadd\n```")  # the current text back
    ctx, _ = make_ctx(tmp_path)
    assert (
        PromptMutation(model=spec, children=2, zero_order_rate=0.0).propose(System(prompts={"instruction": "add"}), ctx)
        == []
    )
    rejected = oplog(ctx, "prompt_mutation")["rejected"]
    assert len(rejected) == 2 and all("identical" in r["reason"] and r["raw"] == "```\nadd\n```" for r in rejected)


def test_prompt_mutation_is_deterministic_given_the_rng(tmp_path):
    spec, _ = scripted("det", lambda text: "```\n" + text.splitlines()[0] + " (v2)\n```")
    parent = System(prompts={"instruction": "add", "task": "sum two numbers"})
    op = PromptMutation(model=spec, children=3, hyper_rate=0.5, zero_order_rate=0.3)
    runs = [[c.system.id for c in op.propose(parent, make_ctx(tmp_path / str(i), seed=7)[0])] for i in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) >= 2


# ----------------------------------------------------------------------------- GEPA reflection


def _mixed_trajectories():
    return [
        traj("ok1", "2 3", "5", 1.0, "correct"),
        traj("bad1", "4 8", "32", 0.0, "expected 12, got 32: you multiplied"),
        traj("ok2", "1 1", "2", 1.0, "correct"),
        traj("bad2", "9 9", "80", 0.0, "expected 18, got 80"),
        traj("ok3", "0 7", "7", 1.0, "correct"),
    ]


def test_reflective_mutation_shows_failures_and_their_feedback(tmp_path):
    spec, seen = scripted("reflector", "Looking at the feedback...\n```text\nAdd the two numbers; never multiply.\n```")
    parent = System(prompts={"instruction": "multiply"})
    ctx, _ = make_ctx(tmp_path, trajectories=_mixed_trajectories())
    [child] = ReflectiveMutation(model=spec, minibatch=2).propose(parent, ctx)
    sent = seen[0][-1].content
    assert "expected 12, got 32: you multiplied" in sent and "expected 18, got 80" in sent
    assert "Input:\n4 8" in sent and "Model output:\n32" in sent and "Score: 0" in sent
    assert "```\nmultiply\n```" in sent
    assert "2 3" not in sent and "correct" not in sent  # the minibatch of 2 is all failures
    assert C.get_instruction(child.system) == "Add the two numbers; never multiply."
    assert sorted(child.info["examples"]) == ["bad1", "bad2"] and child.parents == (parent.id,)


def test_reflective_mutation_rejects_and_records_malformed_answers(tmp_path):
    long = "```\n" + "x" * 200 + "\n```"
    answers = [
        "You should add the numbers.",
        "```\n\n```",
        "```\nmultiply\n```",
        long,
        "```\nadd them",
        "```\nAdd the numbers.\n```",
    ]
    LMS["sloppy"] = ScriptedLM("sloppy", answers, cycle=False)  # replayed in call order
    spec = {"backend": "prompt-test", "name": "sloppy"}
    ctx, _ = make_ctx(tmp_path, trajectories=_mixed_trajectories())
    out = ReflectiveMutation(model=spec, children=6, max_chars=100).propose(
        System(prompts={"instruction": "multiply"}), ctx
    )
    assert [C.get_instruction(c.system) for c in out] == ["Add the numbers."]
    rejected = oplog(ctx, "reflective")["rejected"]
    reasons = [r["reason"] for r in rejected]
    assert len(rejected) == 5
    assert "no ``` fenced block" in reasons[0] and rejected[0]["raw"] == "You should add the numbers."
    assert "empty" in reasons[1] and "identical" in reasons[2] and "over max_chars=100" in reasons[3]
    assert "never closed" in reasons[4] and rejected[3]["raw"] == long


def test_reflective_uses_the_parent_role_and_skips_a_perfect_minibatch(tmp_path):
    parent = System(
        prompts={"instruction": "multiply"},
        models={"policy": ModelSpec(backend="scripted", name="self", params={"responses": ["```\nadd\n```"]})},
    )
    ctx, _ = make_ctx(tmp_path, trajectories=_mixed_trajectories())
    [child] = ReflectiveMutation().propose(parent, ctx)
    assert C.get_instruction(child.system) == "add"
    perfect = [t for t in _mixed_trajectories() if t.score == 1.0]
    ctx2, logs2 = make_ctx(tmp_path / "b", trajectories=perfect)
    assert ReflectiveMutation().propose(parent, ctx2) == [] and "skip_perfect" in logs2[-1]
    with pytest.raises(ConfigError, match="no model role 'critic'"):
        ReflectiveMutation(role="critic").propose(parent, ctx)


# ----------------------------------------------------------------------------- demo bootstrap


def test_bootstrap_builds_demos_only_from_successes_and_proposes_distinct_selections(tmp_path):
    good = [traj(f"ok{i}", f"{i} {i + 1} plus", str(2 * i + 1), 1.0) for i in range(4)]
    bad = [traj("bad", "4 8 plus", "32", 0.0), traj("err", "1 2 plus", "", 0.0, error="agent raised")]
    ctx, _ = make_ctx(tmp_path, trajectories=bad[:1] + good[:2] + bad[1:] + good[2:])
    out = DemoBootstrap(k_choices=[0, 2, 4], children=6).propose(System(prompts={"instruction": "add"}), ctx)
    good_demos = {(t.steps[0].messages[1].content, t.output) for t in good}
    selections = [frozenset((d["input"], d["output"]) for d in C.get_demos(c.system)) for c in out]
    assert len(out) >= 3 and len(set(selections)) == len(selections)
    assert all(sel and sel <= good_demos for sel in selections)  # k=0 equals the parent's (no demos): skipped
    assert {c.info["k"] for c in out} == {2, 4}
    rejected = [r["reason"] for r in oplog(ctx, "bootstrap_demos")["rejected"]]
    assert any("task bad: score 0 below threshold 1" in r for r in rejected)
    assert any("task err: the rollout failed: agent raised" in r for r in rejected)
    # a parent that carries demos gets a k=0 child that drops them
    ctx2, _ = make_ctx(tmp_path / "b", trajectories=good)
    with_demos = C.set_demos(System(), [{"input": "0 1 plus", "output": "1"}])
    kids = DemoBootstrap(k_choices=[0], children=3).propose(with_demos, ctx2)
    assert [C.get_demos(c.system) for c in kids] == [[]]


def test_bootstrap_rolls_out_training_tasks_when_too_few_successes(tmp_path):
    asked = []

    def rollouts(system, tasks, samples=1, temperature=None, tag="explore", logprobs=True):
        asked.append([t["id"] for t in tasks])
        return [traj(t["id"], f"q {t['id']}", f"a {t['id']}", 1.0) for t in tasks]

    train = [{"id": f"t{i}"} for i in range(10)]
    ctx, _ = make_ctx(tmp_path, trajectories=[traj("t0", "q t0", "a t0", 1.0)], train=train, rollouts=rollouts)
    [child] = DemoBootstrap(k_choices=[3], strategies=["recent"], max_rollouts=2).propose(System(), ctx)
    assert len(asked) == 1 and len(asked[0]) == 2 and "t0" not in asked[0]
    assert [d["input"] for d in C.get_demos(child.system)] == ["q t0"] + [f"q {i}" for i in asked[0]]
    assert child.info["rollouts"] == 2


def test_diverse_selection_spreads_over_inputs():
    pool = [
        {"input": "add 1 and 2", "output": "3"},
        {"input": "add 1 and 3", "output": "4"},
        {"input": "what is the capital of France", "output": "Paris"},
    ]
    for seed in range(6):
        picked = select(pool, 2, "diverse", random.Random(seed))
        assert pool[2] in picked and len(picked) == 2
    assert select(pool, 2, "recent", random.Random(0)) == pool[1:]


# ----------------------------------------------------------------------------- crossover


def _pool_entry(system, score, per_task=None):
    return {"system": system, "score": score, "per_task": per_task}


def test_crossover_takes_each_component_from_the_better_parent(tmp_path):
    parent = System(
        prompts={"instruction": "p-instr", "format": "p-fmt", "planner.instruction": "plan first", "task": "sum"}
    )
    demos = C.dump_json([{"input": "1 1", "output": "2"}])
    mate = System(prompts={"instruction": "m-instr", "format": "m-fmt", "demos": demos, "task": "sum"})
    weak = System(prompts={"instruction": "w-instr"})
    twin = parent.replace(workflow={"variant": 2})  # same prompts: not another lineage
    pt_p, pt_m = {"t1": 1.0, "t2": 0.0, "t3": 1.0}, {"t1": 1.0, "t2": 1.0, "t3": 0.0, "t4": 1.0}
    pool = [
        _pool_entry(parent, 0.5, pt_p),
        _pool_entry(weak, 0.2),
        _pool_entry(twin, 0.9),
        _pool_entry(mate, 0.6, pt_m),
    ]
    # t2 and t3 differ; the mate wins t2, the parent t3: a tie, so make the mate win t3 too
    pool[3]["per_task"] = {**pt_m, "t3": 1.0}
    ctx, _ = make_ctx(tmp_path, extra={"pool": pool})
    [child] = Crossover().propose(parent, ctx)
    assert child.parents == (parent.id, mate.id)
    assert child.system.prompts == {
        "instruction": "m-instr",
        "format": "m-fmt",
        "demos": demos,
        "planner.instruction": "plan first",
        "task": "sum",
    }
    # the parent better where they differ: its texts win, each lineage's additions are kept
    pool[0]["per_task"] = {"t1": 1.0, "t2": 1.0, "t3": 1.0}
    pool[3]["per_task"] = {"t1": 1.0, "t2": 0.0, "t3": 1.0}
    ctx2, _ = make_ctx(tmp_path / "b", extra={"pool": pool})
    [child2] = Crossover().propose(parent, ctx2)
    assert child2.system.prompts == {
        "instruction": "p-instr",
        "format": "p-fmt",
        "demos": demos,
        "planner.instruction": "plan first",
        "task": "sum",
    }
    assert "parent scored better" in child2.info["basis"]


def test_crossover_children_differ_from_both_parents(tmp_path):
    parent = System(prompts={"instruction": "a", "format": "fa", "template": "ta"})
    mate = System(prompts={"instruction": "b", "format": "fb", "template": "tb"})
    ctx, _ = make_ctx(tmp_path, extra={"pool": [_pool_entry(mate, 0.7)]})
    out = Crossover(children=4).propose(parent, ctx)
    prompts = [c.system.prompts for c in out]
    assert len(out) >= 2 and all(p not in (parent.prompts, mate.prompts) for p in prompts)
    assert len({json.dumps(p, sort_keys=True) for p in prompts}) == len(prompts)
    assert "coin flips" in out[0].info["basis"]
    # one differing component: no merge can differ from both parents
    ctx2, _ = make_ctx(
        tmp_path / "b", extra={"pool": [_pool_entry(System(prompts={**parent.prompts, "instruction": "z"}), 0.9)]}
    )
    assert Crossover(children=3).propose(parent, ctx2) == []
    assert oplog(ctx2, "prompt_crossover")["rejected"]


def test_crossover_without_a_pool_proposes_nothing_and_says_why(tmp_path):
    ctx, logs = make_ctx(tmp_path)
    assert Crossover().propose(System(prompts={"instruction": "a"}), ctx) == []
    assert "ctx.extra['pool']" in oplog(ctx, "prompt_crossover")["notes"][0]["note"] and logs


# ----------------------------------------------------------------------------- end to end


def feedback_reward(task, output):
    ok = str(output) == str(task["answer"])
    return Reward(score=float(ok), feedback="correct" if ok else f"expected {task['answer']} (the sum), got {output}")


def test_engine_runs_the_reflective_operator_end_to_end(tmp_path):
    import evolve
    from evolve.archive import Archive
    from evolve.registry import operators

    operators.register("reflective", ReflectiveMutation)
    task = yaml.safe_load((DATA / "toy.yaml").read_text())
    reflector = {
        "backend": "scripted",
        "name": "reflector",
        "params": {"responses": {"(the sum)": "```\nadd carefully\n```", "default": "no idea"}},
    }
    task.update(
        operators=[{"name": "reflective", "params": {"model": reflector, "minibatch": 3}}],
        budget={"generations": 1},
        engine={"minibatch": 6},
    )
    task["dataset"]["params"] = {"n_train": 12, "n_val": 6, "n_test": 6}
    report = evolve.run(task, out=tmp_path / "run", reward=feedback_reward, base_dir=DATA)
    assert report["best"]["test"]["score"] == 1.0 and report["baseline"]["test"]["score"] < 0.5
    best = evolve.load(tmp_path / "run").system
    assert best.prompts["instruction"] == "add carefully"
    a = Archive(tmp_path / "run", create=False)
    assert any(r.operator == "reflective" for r in a.records())
    a.close()
    [log] = (tmp_path / "run" / "work").glob("g1-op0-*/reflective.json")
    asked = json.loads(log.read_text())["calls"][0]["messages"][0]["content"]
    assert "(the sum), got" in asked
