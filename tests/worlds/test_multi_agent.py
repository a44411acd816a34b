"""examples/multi_agent: the solver–verifier team on reasoning-gym (team.py, task.yaml, tiny.yaml).
Scripted solver and verifiers run the team's graph fast; the slow test runs the tiny variant."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("reasoning_gym")

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.policy.roles import verdict, verdict_turns  # noqa: E402
from evolve.task.taskfile import load_task  # noqa: E402
from evolve.types import LLMCall  # noqa: E402

HERE = Path(__file__).parents[2] / "examples" / "multi_agent"
sys.path.insert(0, str(HERE))
import team  # noqa: E402

SOLVER = {
    "backend": "scripted",
    "name": "rg-scripted",
    "params": {"reply": "evolve.worlds.reasoning_gym.scripted:reply"},
}
WORDS = {
    "name": "spell_backward",
    "levels": [{"min_word_len": 3, "max_word_len": 4}, {"min_word_len": 8, "max_word_len": 9}],
}


def test_the_task_files_graphs_are_the_teams_and_they_load_with_every_role_trained():
    for name, graph in [
        ("task.yaml", team.workflow(max_tokens=48, stop=["\n\n"])),
        ("tiny.yaml", team.workflow(verdict_tokens=6)),
    ]:
        data = yaml.safe_load((HERE / name).read_text())
        assert data["workflow"]["graph"] == graph, name
        task, _ = load_task(HERE / name)
        assert list(task.models) == ["solver", "verifier"]
        assert task.operators[0].params["roles"] == "all"
    smollm = yaml.safe_load((HERE / "task.yaml").read_text())["models"]
    assert smollm["solver"]["params"] == smollm["verifier"]["params"]  # one base: the same weights


def test_the_verifiers_demos_are_the_verify_steps_message_with_yes_on_gold_answers_and_no_on_others():
    tasks = [
        {
            "question": f"Spell this word backward (example: sun -> nus): {w}",
            "answer": w[::-1],
            "answer_format": "answer_line",
        }
        for w in ("cat", "dog", "owl", "bee")
    ]
    demos = team.verifier_demos(tasks, seed=0)
    assert sorted(d[1]["content"] for d in demos) == ["no", "no", "yes", "yes"]
    for user, said in demos:
        q = next(t for t in tasks if t["question"] in user["content"])
        right = user["content"] == team.VERIFY.format(question=q["question"], reply=f"Answer: {q['answer']}")
        assert right == (said["content"] == "yes") and verdict(said["content"]) is right


def test_the_verifiers_pairs_judge_every_task_twice_its_gold_answer_yes_and_a_near_miss_of_it_no():
    golds = ["cat", "Zion", "7", "-12", "0", "3/4"]
    tasks = [{"question": f"Q{i}: give {g}", "answer": g, "answer_format": "answer_line"} for i, g in enumerate(golds)]
    demos = team.verifier_pairs(tasks, seed=0)
    assert len(demos) == 2 * len(tasks)
    for task in tasks:
        mine = [d for d in demos if f"Question: {task['question']}\n" in d[0]["content"]]
        replies = {d[1]["content"]: d[0]["content"].split("Reply: Answer: ")[1].split("\n")[0] for d in mine}
        assert sorted(replies) == ["no", "yes"] and replies["yes"] == task["answer"] != replies["no"]
        wrong = replies["no"]
        if task["answer"].lstrip("-").isdigit():
            assert wrong.lstrip("-").isdigit()  # a number for a number
        elif task["answer"].isalpha():
            assert wrong.isalpha() and abs(len(wrong) - len(task["answer"])) <= 1  # one edit away, or reversed
        else:
            assert wrong in golds  # no near miss of a fraction: another task's answer
    rng = random.Random(1)
    assert all(team.near_miss(g, rng) not in (g, None) for g in golds[:5] for _ in range(50))
    assert team.near_miss("3/4", rng) is None and team.near_miss("two words", rng) is None


def test_retry_outcomes_tell_a_retry_that_fixed_a_wrong_answer_from_one_that_broke_a_right_one():
    from evolve.types import Message, Reward, Trajectory

    tasks = words_test_tasks()
    (a, ta), (b, tb) = list(tasks.items())[:2]

    def call(role: str, said: str) -> LLMCall:
        return LLMCall(role=role, model="m", messages=(Message(role="user", content="q"),), output=said)

    def rollout(tid: str, replies: list[str], final: float) -> Trajectory:
        steps = [s for r in replies for s in (call("solver", f"Answer: {r}"), call("verifier", "no"))]
        return Trajectory(task_id=tid, system_id="s", steps=tuple(steps), reward=Reward(score=final))

    trajs = [
        rollout(a, [ta["answer"] + "x", ta["answer"]], 1.0),  # wrong, rejected, then right
        rollout(b, [tb["answer"], tb["answer"] + "x"], 0.0),  # right, rejected, then wrong
        rollout(a, [ta["answer"]], 1.0),  # no retry
    ]
    assert team.retry_outcomes(trajs, tasks) == {
        "kept": 1,
        "fixed": 1,
        "broken": 1,
        "stayed_wrong": 0,
        "stayed_right": 0,
    }
    rates = team.judge_rates(trajs, tasks)
    assert (rates["right"], rates["wrong"], rates["accept_right"], rates["accept_wrong"]) == (3, 2, 0.0, 0.0)


def words_test_tasks() -> dict[str, dict]:
    """run_team's test tasks, made as the world makes them."""
    from evolve.worlds.reasoning_gym.dataset import dataset

    return {t["id"]: t for t in dataset(seed=0, generators=[WORDS], n_train=20, n_val=8, n_test=16)["test"]}


def run_team(tmp_path, verifier_reply: str):
    data = {
        "name": "team",
        "seed": 0,
        "world": "reasoning_gym",
        "agent": "evolve.topology:agent",
        "models": {
            "solver": SOLVER,
            "verifier": {"backend": "scripted", "name": "always", "params": {"responses": {"Reply:": verifier_reply}}},
        },
        "prompts": {"instruction": "Solve it. End with one line: Answer: <answer>"},
        "workflow": {"graph": team.workflow()},
        "dataset": {"params": {"generators": [WORDS], "n_train": 20, "n_val": 8, "n_test": 16}},
        "operators": [],
        "budget": {"generations": 0},
        "runner": {"name": "thread", "workers": 4},
    }
    report = evolve.run(data, out=tmp_path / verifier_reply, base_dir=HERE)
    archive = Archive(tmp_path / verifier_reply, create=False)
    return report, archive.trajectories(report["baseline"]["system_id"], split="test")


def test_each_model_call_is_recorded_under_its_role_and_an_always_yes_verifier_earns_only_right_answers(tmp_path):
    report, trajs = run_team(tmp_path, "yes")
    assert 0 < report["baseline"]["test"]["score"] < 1  # the scripted solver is wrong on long words
    for t in trajs:
        assert [s.role for s in t.steps if isinstance(s, LLMCall)] == ["solver", "verifier"]  # accepted: no retry
    credit = {t.task_id: v.reward for v in verdict_turns(trajs, "verifier") for t in [trajs[v.traj]]}
    assert credit == {t.task_id: float(t.score >= 1.0) for t in trajs}  # rewarded exactly where the answer was right
    rates = team.judge_rates(trajs, words_test_tasks())
    right = sum(t.score >= 1.0 for t in trajs)
    assert rates == {
        "judged": len(trajs),
        "right": right,
        "wrong": len(trajs) - right,
        "accept_right": 1.0,
        "accept_wrong": 1.0,  # every mistake let through
        "accuracy": round(right / len(trajs), 3),
        "no_verdict": 0,
    }
    assert team.retry_outcomes(trajs, words_test_tasks()) == {
        "kept": len(trajs),
        "fixed": 0,
        "broken": 0,
        "stayed_wrong": 0,
        "stayed_right": 0,
    }


def test_a_rejection_makes_the_solver_retry_once_and_a_verifier_that_always_says_no_earns_the_wrong_answers(tmp_path):
    report, trajs = run_team(tmp_path, "no")
    for t in trajs:
        assert [s.role for s in t.steps if isinstance(s, LLMCall)] == ["solver", "verifier", "solver", "verifier"]
        retry = [s for s in t.steps if isinstance(s, LLMCall)][2]
        assert "judged wrong" in retry.messages[-1].content
    final = [
        v
        for v in verdict_turns(trajs, "verifier")
        if v.step == max(i for i, s in enumerate(trajs[v.traj].steps) if isinstance(s, LLMCall))
    ]
    assert [v.reward for v in final] == [float(trajs[v.traj].score < 1.0) for v in final]
    rates = team.judge_rates(trajs, words_test_tasks())
    assert rates["judged"] == 2 * len(trajs) and rates["accept_right"] == rates["accept_wrong"] == 0.0
    assert 0 < rates["right"] < rates["judged"] and rates["accuracy"] == round(rates["wrong"] / rates["judged"], 3)
    # the scripted solver answers the same again: every retry leaves a right answer right and a wrong one wrong
    right = sum(t.score >= 1.0 for t in trajs)
    assert team.retry_outcomes(trajs, words_test_tasks()) == {
        "kept": 0,
        "fixed": 0,
        "broken": 0,
        "stayed_wrong": len(trajs) - right,
        "stayed_right": right,
    }
    assert any(v.reward == 1.0 for v in final) and any(v.reward == 0.0 for v in final)


@pytest.mark.slow
def test_the_tiny_team_starts_both_roles_from_one_base_and_each_generation_trains_one_role(tmp_path, one_torch_thread):
    report = evolve.run(str(HERE / "tiny.yaml"), out=tmp_path / "t")
    archive = Archive(tmp_path / "t", create=False)
    base = archive.get_system(report["baseline"]["system_id"])
    assert base.models["solver"].base == base.models["verifier"].base  # one cached cold start, one base
    children = [r for r in archive.records() if r.operator == "star"]
    assert [r.generation for r in children] == [1, 2]  # the solver's generation, then the verifier's
    for rec, role in zip(children, ["solver", "verifier"]):
        child, parent = archive.get_system(rec.id), archive.get_system(rec.parents[0])
        assert [r for r in child.models if child.models[r] != parent.models[r]] == [role]
    assert report["baseline"]["val"]["score"] > 0.3  # the cold start taught both steps some of the task


def test_the_solvers_demos_teach_the_retry_step_the_gold_answer_after_a_wrong_reply():
    from evolve.worlds import reasoning_gym as rg

    tasks = rg.dataset(seed=0, generators=[WORDS], n_train=6, n_val=2, n_test=2)["train"]
    demos = team.solver_demos(tasks, instruction="Answer:", seed=0)
    retries = [d for d in demos if "judged wrong" in d[1]["content"]]
    assert len(demos) == 9 and len(retries) == 3
    for system, user, said in retries:
        q = next(t for t in tasks if t["question"] in user["content"])
        assert system["content"] == "Answer:" and said["content"] == f"Answer: {q['answer']}"
        assert f"Answer: {q['answer']}\n" not in user["content"]  # the reply shown is a wrong one
