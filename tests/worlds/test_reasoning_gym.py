"""world: reasoning_gym (evolve.worlds.reasoning_gym): reasoning-gym's generators named in the task file,
splits from disjoint seed ranges, the package's own scorer on the answer read from the reply, feedback
without the gold answer, and the hooks the layers use. The model is the scripted solver of fixed skill
(evolve/worlds/reasoning_gym/scripted.py); nothing here trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("reasoning_gym")

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.errors import ConfigError  # noqa: E402
from evolve.task.taskfile import validate_task  # noqa: E402
from evolve.worlds import reasoning_gym as rg  # noqa: E402
from evolve.worlds.reasoning_gym.answer import AnswerFormatError  # noqa: E402
from evolve.worlds.reasoning_gym.dataset import LEVEL_STRIDE, SPLIT_STRIDE  # noqa: E402
from evolve.worlds.reasoning_gym.scripted import reply  # noqa: E402

SMOKE = Path(__file__).parents[2] / "examples" / "reasoning_gym" / "smoke.yaml"
SUMS = {
    "name": "basic_arithmetic",
    "config": {"max_digits": 1, "allow_parentheses": False, "operators": ["+", "-"]},
    "levels": [{"min_terms": 2, "max_terms": 2}, {"min_terms": 5, "max_terms": 5}],
}
WORDS = {"name": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 5}, "weight": 2}
ANSWER = "Solve it. End with one line: Answer: <answer>"


def splits(**kw):
    return rg.dataset(**{"seed": 0, "generators": [SUMS, WORDS], "n_train": 60, "n_val": 12, "n_test": 24, **kw})


def test_splits_come_from_disjoint_seed_ranges_and_val_and_test_do_not_depend_on_n_train():
    data = splits()
    seeds = {s: {t["seed"] + t["index"] for t in tasks} for s, tasks in data.items()}
    assert not (seeds["train"] & seeds["val"] or seeds["train"] & seeds["test"] or seeds["val"] & seeds["test"])
    for s, k in (("train", 0), ("val", 1), ("test", 2)):  # the documented formula: item seed ranges per split
        assert all(SPLIT_STRIDE * k <= t["seed"] < SPLIT_STRIDE * (k + 1) for t in data[s])
        assert all(t["seed"] == SPLIT_STRIDE * k + LEVEL_STRIDE * t["level"] for t in data[s])
    questions = [t["question"] for tasks in data.values() for t in tasks]
    assert len(set(questions)) == len(questions)  # no question in two splits (nor twice in one)
    # sizes: by weight (1:2), then evenly over levels; ids unique
    train = data["train"]
    assert sum(t["generator"] == "spell_backward" for t in train) == 40
    assert [sum(t["generator"] == "basic_arithmetic" and t["level"] == lv for t in train) for lv in (0, 1)] == [10, 10]
    assert len({t["id"] for tasks in data.values() for t in tasks}) == 96
    more = splits(n_train=90)
    assert more["val"] == data["val"] and more["test"] == data["test"]
    assert splits() == data and splits(seed=1)["test"] != data["test"]  # the seed decides, and only it


def test_every_task_is_what_the_package_makes_from_its_seed_and_the_gold_answer_scores_one():
    import reasoning_gym

    for t in splits()["test"]:
        entry = reasoning_gym.create_dataset(t["generator"], seed=t["seed"], size=t["size"], **t["config"])[t["index"]]
        assert (entry["question"], entry["answer"]) == (t["question"], t["answer"])
        assert rg.reward(t, {"answer": t["answer"]}).score == 1.0


@pytest.mark.parametrize(
    "generators, message",
    [
        (None, "name the generators"),
        ([{"name": "spel_backward"}], "no generator 'spel_backward'; did you mean 'spell_backward'"),
        (
            [{"name": "spell_backward", "config": {"max_len": 4}}],
            "spell_backward has no setting 'max_len'; its settings",
        ),
        ([{"name": "spell_backward", "config": {"seed": 4}}], r"\['seed'\] are set by the world"),
        (
            [{"name": "spell_backward", "config": {"min_word_len": 9, "max_word_len": 4}}],
            "spell_backward refuses this config",
        ),
        (
            [{"name": "spell_backward"}, {"name": "spell_backward"}],
            "named twice; give it once, with its configs as levels",
        ),
        ([{"name": "spell_backward", "weight": 0}], "weight must be a positive number"),
        ([{"name": "spell_backward", "levels": {"max_word_len": 4}}], "levels a list"),
    ],
)
def test_a_bad_generator_entry_is_a_config_error_that_names_where(generators, message):
    with pytest.raises(ConfigError, match=message) as e:
        rg.dataset(generators=generators, n_train=4, n_val=2, n_test=2)
    assert "dataset.params" in str(e.value)
    with pytest.raises(ConfigError, match="answer_format 'line' is not one of"):
        rg.dataset(generators=["spell_backward"], answer_format="line")


def test_answers_are_read_in_the_tasks_format_and_a_missing_one_says_what_was_missing():
    assert rg.extract("2 + 3 is 5.\nAnswer: 5") == "5"
    assert rg.extract("**Final answer:** 5") == rg.extract("**Answer: 5**") == rg.extract("answer: `5`") == "5"
    assert rg.extract("Answer: 4\nwait, no.\nAnswer: 5") == "5"  # the last one counts
    assert rg.extract("think <answer>4</answer> then <answer> 5 </answer>", "answer_tag") == "5"
    assert rg.extract("\nnus\nbecause", "first_line") == "nus" and rg.extract("so:\n5\n\n", "last_line") == "5"
    for text, fmt, why in (
        ("The answer is 5", "answer_line", "no 'Answer: ...' line"),
        ("Answer:  ", "answer_line", "'Answer:' line is empty"),
        ("5", "answer_tag", "no <answer>"),
        ("  ", "last_line", "empty"),
    ):
        with pytest.raises(AnswerFormatError, match=why):
            rg.extract(text, fmt)
    assert [rg.written("5", f) for f in rg.FORMATS] == ["Answer: 5", "<answer>5</answer>", "5", "5"]


def test_the_reward_is_the_packages_score_and_its_feedback_never_holds_the_gold_answer():
    tasks = splits()["test"]
    word = next(t for t in tasks if t["generator"] == "spell_backward")
    right = rg.reward(word, f"Let me see.\nAnswer: {word['answer']}")
    assert (right.score, right.components, right.feedback) == (
        1.0,
        {"extracted": 1.0, "correct": 1.0},
        f"correct: answered {word['answer']!r}",
    )
    none = rg.reward(word, "It is spelt backward, obviously.")
    assert (none.score, none.components["extracted"]) == (0.0, 0.0)
    assert none.feedback == "no answer could be read: no 'Answer: ...' line in the reply"
    assert (
        rg.reward(word, {"reply": "x", "answer": None, "extract_error": "the reply is empty"}).feedback
        == "no answer could be read: the reply is empty"
    )
    for t in tasks:
        wrong = rg.reward(t, "Answer: 123456789")
        assert wrong.score < 1 and t["answer"] not in wrong.feedback.replace("123456789", "")
        assert wrong.feedback.startswith("wrong: answered '123456789'") and "the expected answer is" in wrong.feedback
    # the reward scores against the package's own entry, regenerated, never the task's stored gold
    forged = dict(word, answer="forged")
    assert (
        rg.reward(forged, "Answer: forged").score == 0.0 and rg.reward(forged, f"Answer: {word['answer']}").score == 1
    )
    broken = rg.reward(dict(word, question="Spell this word backward: abc"), "Answer: cba")
    assert broken.score == 0.0 and "not what spell_backward generates" in broken.error


def test_the_agent_asks_once_under_the_instruction_and_returns_the_answer_it_read():
    task = next(t for t in splits()["test"] if t["generator"] == "spell_backward")
    msgs = rg.messages_for(task)
    assert [m.role for m in msgs] == ["system", "user"] and msgs[1].content == task["question"]
    assert msgs[0].content == rg.INSTRUCTIONS["answer_line"]  # no instruction component: the format's default
    demos = json.dumps([{"question": "Spell this word backward (example: sun -> nus): cat", "answer": "tac"}])
    msgs = rg.messages_for(task, {"instruction": ANSWER, "demos": demos, "template": "Q: {question}\nA:"})
    assert (
        msgs[0].content.startswith(ANSWER + "\n\nExamples:\n\nExample 1\nQuestion: Spell")
        and "Answer: tac" in msgs[0].content
    )
    assert msgs[1].content == f"Q: {task['question']}\nA:"
    out = reply(tuple(rg.messages_for(task, {"instruction": ANSWER})))
    assert out == f"Answer: {task['answer']}"  # the scripted solver knows short words


def test_cold_start_demos_are_the_agents_messages_with_the_gold_answer_in_the_format():
    tasks = splits()["train"][:20]
    chats = rg.demos(tasks, instruction=ANSWER, seed=0)
    assert len(chats) == 20
    by_question = {t["question"]: t for t in tasks}
    for chat in chats:
        task = by_question[chat[1]["content"]]
        assert chat[:2] == [m.model_dump() for m in rg.messages_for(task, {"instruction": ANSWER})]
        assert chat[2] == {"role": "assistant", "content": f"Answer: {task['answer']}"}
    tagged = rg.dataset(generators=[WORDS], n_train=4, n_val=0, n_test=0, answer_format="answer_tag")["train"]
    assert rg.demos(tagged)[0][2]["content"].startswith("<answer>")


def test_a_task_file_naming_the_world_gets_agent_reward_dataset_and_hooks():
    cfg = validate_task(
        {
            "world": "reasoning_gym",
            "models": {"policy": {"backend": "local", "cold_start": {}}},
            "dataset": {"params": {"generators": ["spell_backward"]}},
            "operators": [{"name": "memory", "params": {"embedder": "hashing"}}, {"name": "topology"}],
        }
    )
    assert (cfg.agent, cfg.reward, cfg.dataset.source) == (
        "evolve.worlds.reasoning_gym:agent",
        "evolve.worlds.reasoning_gym:reward",
        "evolve.worlds.reasoning_gym:dataset",
    )
    assert cfg.models["policy"].cold_start.demos == "evolve.worlds.reasoning_gym:demos"
    assert cfg.operators[0].params["extract"] == "evolve.worlds.reasoning_gym:experiences"
    assert cfg.operators[1].params["palette"] == "evolve.worlds.reasoning_gym.workflow:PALETTE"


def test_the_smoke_task_runs_end_to_end_and_its_report_shows_the_curriculum(tmp_path):
    report = evolve.run(str(SMOKE), out=tmp_path / "r")
    assert report["baseline"]["test"]["score"] == 0.0  # the scripted solver explains: nothing can be read
    assert report["best"]["test"]["score"] > 0.5 and report["best"]["test"]["n"] == 48
    levels = [g["levels"] for g in report["curriculum"]["generations"]]
    assert levels[0] == {"basic_arithmetic": 0, "spell_backward": 0} and max(lv["spell_backward"] for lv in levels) >= 1
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Curriculum (kept in a success band of 20-80%)" in md and "| 4 | L1, 50% (up; 6/6 at L0)" in md


def test_memory_recalls_solved_training_tasks_and_never_the_task_itself(tmp_path):
    pytest.importorskip("chromadb")
    data = yaml.safe_load(SMOKE.read_text())
    data["prompts"]["instruction"] = ANSWER
    data["engine"].pop("curriculum")
    data["budget"]["generations"] = 2
    data["operators"] = [{"name": "memory", "params": {"embedder": "hashing", "k": 2}}]
    evolve.run(data, out=tmp_path / "m", base_dir=SMOKE.parent)
    archive = Archive(tmp_path / "m", create=False)
    with_memory = [s for s in (archive.get_system(r.id) for r in archive.records()) if s.memory]
    assert with_memory, "the memory operator proposed no child"
    recalled = [
        (t.task_id, step.result)
        for t in archive.trajectories(with_memory[0].id)
        for step in t.steps
        if getattr(step, "name", None) == "recall_memory"
    ]
    assert recalled and any(r for _, r in recalled)
    assert all(item["answer"] and item["question"] for _, r in recalled for item in r)
    assert not any(item["task_id"] == tid for tid, r in recalled for item in r)


def test_the_agent_as_a_graph_scores_as_the_agent_does_and_the_palette_loads(tmp_path):
    from evolve.registry import node_types
    from evolve.topology.palette import Palette
    from evolve.worlds.reasoning_gym.workflow import PALETTE, single_step

    Palette.parse(PALETTE).check(node_types)
    data = yaml.safe_load(SMOKE.read_text())
    data.update(
        agent="evolve.topology:agent",
        prompts={"instruction": ANSWER},
        workflow={"graph": single_step()},
        operators=[],
        budget={"generations": 0},
    )
    data["engine"].pop("curriculum")
    graph = evolve.run(data, out=tmp_path / "g", base_dir=SMOKE.parent)
    data.update(agent="evolve.worlds.reasoning_gym:agent", workflow={})
    plain = evolve.run(data, out=tmp_path / "p", base_dir=SMOKE.parent)
    assert graph["baseline"]["test"]["score"] == plain["baseline"]["test"]["score"] > 0.5


def test_generators_without_one_gold_answer_give_no_demos_and_their_feedback_says_so():
    mixed = rg.dataset(generators=[WORDS, "propositional_logic"], n_train=6, n_val=0, n_test=0)["train"]
    logic = [t for t in mixed if t["generator"] == "propositional_logic"]
    assert logic and all(t["answer"] is None for t in logic)  # checked by the package, not compared
    assert {c[1]["content"] for c in rg.demos(mixed)} == {t["question"] for t in mixed if t["answer"] is not None}
    with pytest.raises(ValueError, match=r"no cold-start demos: the scorer of \['propositional_logic'\]"):
        rg.demos(logic)
    assert rg.reward(logic[0], "Answer: P").feedback.endswith("checks answers rather than compare them)")


@pytest.mark.slow
def test_the_tiny_variant_learns_from_the_gold_demos_and_star_under_the_curriculum(tmp_path, one_torch_thread):
    report = evolve.run(str(SMOKE.parent / "tiny.yaml"), out=tmp_path / "t")
    assert report["baseline"]["val"]["score"] > 0.3  # the cold start taught the format and some of the task
    assert report["best"]["test"]["score"] >= report["baseline"]["test"]["score"]
    assert [g["levels"] for g in report["curriculum"]["generations"]][0] == {"spell_backward": 0}


def test_the_topology_search_finds_the_reformat_loop_for_a_model_that_explains(tmp_path):
    from evolve.worlds.reasoning_gym.workflow import single_step

    data = yaml.safe_load(SMOKE.read_text())
    data["engine"].pop("curriculum")
    data.update(
        agent="evolve.topology:agent",
        workflow={"graph": single_step()},
        budget={"generations": 1},
        prompts={"instruction": "Solve the problem and explain. End with: Answer: <answer>"},
        operators=[{"name": "topology", "params": {"max_evals": 6, "search_tasks": 12}}],
    )
    report = evolve.run(data, out=tmp_path / "t", base_dir=SMOKE.parent)
    assert report["baseline"]["test"]["score"] == 0.0 and report["best"]["test"]["score"] > 0.5
    best = Archive(tmp_path / "t", create=False).get_system(report["best"]["system_id"])
    assert any(n["id"].startswith("reformat") for n in best.workflow["graph"]["nodes"])


def test_reflexion_retries_on_the_feedback_which_never_tells_the_gold_answer(tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    data["engine"].pop("curriculum")
    data.update(
        agent="evolve.worlds.reasoning_gym:reflexion_agent",
        prompts={"instruction": ANSWER},
        operators=[],
        budget={"generations": 0},
    )
    report = evolve.run(data, out=tmp_path / "x", base_dir=SMOKE.parent)
    archive = Archive(tmp_path / "x", create=False)
    tasks = {t["id"]: t for t in rg.dataset(**data["dataset"]["params"])["test"]}
    lessons = [
        (t.task_id, s.result)
        for t in archive.trajectories(report["baseline"]["system_id"], split="test")
        for s in t.steps
        if getattr(s, "name", None) == "reflexion"
    ]
    assert lessons, "no attempt failed: the scripted solver is wrong on long sums and words"
    assert all(str(lesson).startswith("wrong: answered") for _, lesson in lessons)  # the next attempt's lesson
    assert all(tasks[tid]["answer"] not in str(lesson) for tid, lesson in lessons)


def test_the_package_is_imported_only_when_tasks_are_built_and_its_absence_says_how_to_install(monkeypatch):
    import subprocess
    import sys

    code = "import sys, evolve.worlds.reasoning_gym; assert 'reasoning_gym' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    from evolve.errors import MissingDependency
    from evolve.worlds.reasoning_gym import generators

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if it were not installed
    with pytest.raises(MissingDependency, match=r"pip install 'evolvekit\[reasoning_gym\]'"):
        generators.package()


@pytest.mark.parametrize("name", ["smoke.yaml", "tiny.yaml", "task.yaml"])
def test_every_example_task_files_dataset_builds(name):
    """The examples' generators, levels and split sizes make the tasks they ask for (a config that
    cannot would stop `evolve run` before its first rollout)."""
    data = yaml.safe_load((SMOKE.parent / name).read_text())
    got = rg.dataset(seed=data.get("seed", 0), **data["dataset"]["params"])
    for split in ("train", "val", "test"):
        assert len(got[split]) == data["dataset"]["params"][f"n_{split}"], split


def test_every_rg_layers_row_is_a_valid_task_and_the_vote_row_is_the_palettes_vote() -> None:
    # bench/layers/rg_layers.py runs rows of tens of minutes: an override that does not load would only show
    # there. The bench is asked for its rows as a command, as a user runs it (a test imports no bench script).
    import subprocess
    import sys

    from evolve.task.taskfile import load_task
    from evolve.worlds.reasoning_gym.workflow import PALETTE, single_step

    bench = Path(__file__).resolve().parents[2] / "bench" / "layers" / "rg_layers.py"
    out = subprocess.run([sys.executable, str(bench), "--rows-json"], capture_output=True, text=True, check=True)
    layers = json.loads(out.stdout)
    cfgs = {row: load_task(Path(r["task"]), ["seed=1", *r["sets"]])[0] for row, r in layers["rows"].items()}
    assert all(c.seed == 1 for c in cfgs.values())
    assert set(cfgs["team"].models) == {"solver", "verifier"} and set(cfgs["star"].models) == {"policy"}
    # self-consistency at the team's calls: the single step wrapped by the palette's own vote, sampled at once
    vote = cfgs["sft_vote"]
    assert vote.budget.generations == 0 and vote.models["policy"].cold_start is not None
    graph = vote.workflow["graph"]
    (node,) = [n for n in graph["nodes"] if n["type"] == "vote"]
    (item,) = [it for it in PALETTE if it["name"] == "vote"]
    assert node["params"]["chain"] == ["solve", "read"] and node["params"]["n"] == node["params"]["parallel"] >= 2
    assert {k: node["params"][k] for k in item["params"]} == item["params"]
    steps = {n["id"]: n for n in single_step()["nodes"]}
    assert all(n == steps[n["id"]] for n in graph["nodes"] if n["id"] in steps)
    for row, other in [*layers["continues"].items(), *layers["versus"].items()]:
        assert row in layers["rows"] and other.split(":")[0] in layers["rows"], (row, other)
