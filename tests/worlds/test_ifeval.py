"""world: ifeval: the checkers give the reference implementation's verdicts on Google's GPT-4
responses, generated training prompts never touch the 541 test prompts, and the reward, splits
and figures are what the benchmark defines."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from evolve.errors import ConfigError
from evolve.worlds.ifeval import dataset, read_prompts, reward, summary, verdicts
from evolve.worlds.ifeval.checks import CHECKS, LANGUAGES, loose_variants
from evolve.worlds.ifeval.generate import ORDINALS, WORDS, held_out

IFEVAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ifeval"


@pytest.fixture(scope="module")
def prompts() -> list[dict]:
    if not (IFEVAL / "input_data.jsonl").exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI has no IFEval data at {IFEVAL}")
        pytest.skip(f"IFEval's prompts are not at {IFEVAL} (the workspace's shared/data/ifeval)")
    return read_prompts(IFEVAL / "input_data.jsonl")


def _reference(mode: str) -> list[dict]:
    return [json.loads(line) for line in (IFEVAL / "reference" / f"reference_{mode}.jsonl").read_text().splitlines()]


def test_the_file_holds_all_25_instruction_types(prompts: list[dict]) -> None:
    assert len(prompts) == 541
    assert sum(len(p["instruction_id_list"]) for p in prompts) == 834
    assert {i for p in prompts for i in p["instruction_id_list"]} == set(CHECKS)


@pytest.mark.parametrize("mode", ["strict", "loose"])
def test_verdicts_agree_with_the_reference_on_every_prompt(prompts: list[dict], mode: str) -> None:
    by_prompt = {p["prompt"]: p for p in prompts}
    rows = _reference(mode)
    assert len(rows) == 540
    differ = []
    for ref in rows:
        p = by_prompt[ref["prompt"]]
        got = verdicts(ref["response"], p["instruction_id_list"], p["kwargs"], loose=mode == "loose")
        if got != ref["follow_instruction_list"]:
            differ.append(
                (
                    p["key"],
                    [i for i, a, b in zip(p["instruction_id_list"], got, ref["follow_instruction_list"]) if a != b],
                )
            )
    # the one known difference: the reference's older letter-frequency checker replaced some characters by a
    # random letter before counting (shared/data/ifeval/reference/SOURCE.md)
    allowed = [(1122, ["keywords:letter_frequency"])] if mode == "loose" else []
    assert differ == allowed


def test_strict_and_loose_rules() -> None:
    ids, kw = ["detectable_format:json_format"], [{}]
    assert verdicts('```json\n{"a": 1}\n```', ids, kw) == [True]
    assert verdicts('Here it is:\n{"a": 1}', ids, kw) == [False]
    assert verdicts('Here it is:\n{"a": 1}', ids, kw, loose=True) == [True]  # without the first line
    assert verdicts("", ["punctuation:no_comma"], [{}]) == [False]  # an empty reply follows nothing
    assert verdicts("*hello* there", ["startend:end_checker"], [{"end_phrase": "there"}]) == [True]
    assert len(loose_variants("a\n*b*\nc")) == 8
    words = ["length_constraints:number_words"]
    assert verdicts("one two three", words, [{"num_words": 3, "relation": "at least"}]) == [True]
    assert verdicts("one two three", words, [{"num_words": 3, "relation": "less than"}]) == [False]
    sentences = ["length_constraints:number_sentences"]
    assert verdicts("Dr. Smith came home. He slept.", sentences, [{"num_sentences": 2, "relation": "at least"}]) == [
        True
    ]
    assert verdicts("Dr. Smith came home. He slept.", sentences, [{"num_sentences": 3, "relation": "at least"}]) == [
        False
    ]
    caps = ["change_case:capital_word_frequency"]
    assert verdicts("THE CAT sat. OK.", caps, [{"capital_frequency": 3, "capital_relation": "at least"}]) == [True]
    with pytest.raises(ValueError, match="unknown IFEval instruction"):
        verdicts("x", ["no:such"], [{}])


def _shingles(text: str) -> set[tuple[str, ...]]:
    w = re.findall(r"\w+", text.lower())
    return {tuple(w[i : i + 3]) for i in range(len(w) - 2)}


def test_language_verdicts_do_not_depend_on_threads_racing_at_first_use(monkeypatch) -> None:
    """A run scores replies on many threads at once: the first language checks of a process, made
    together, get the verdicts one thread gets (langdetect loads its profiles on first use; threads
    that raced there saw no language or another one)."""
    import sys
    import threading

    from langdetect import detector_factory

    from evolve.worlds.ifeval import checks

    texts = [
        "\U0001f331" * 50 + "\ufffd",
        "This is an English sentence about gardens.",
        "Ceci est une phrase en français.",
    ]
    want = ["bn", "en", "fr"]  # langdetect's verdicts, one thread, seed 0 (the emoji reply is from a real run)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows every time without the fix
    try:
        for _ in range(3):
            monkeypatch.setattr(detector_factory, "_factory", None)
            checks._langdetect.cache_clear()
            out: list = [None] * 24
            start = threading.Barrier(24)

            def check(i: int, out: list, start: threading.Barrier) -> None:
                start.wait()
                out[i] = checks.language_of(texts[i % 3])

            threads = [threading.Thread(target=check, args=(i, out, start)) for i in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert out == [want[i % 3] for i in range(24)]
    finally:
        sys.setswitchinterval(before)
        checks._langdetect.cache_clear()


def test_generated_prompts_never_equal_or_nearly_duplicate_a_test_prompt(prompts: list[dict]) -> None:
    tests = [_shingles(p["prompt"]) for p in prompts]
    texts = {p["prompt"].strip().lower() for p in prompts}
    index: dict[tuple[str, ...], set[int]] = {}
    for i, s in enumerate(tests):
        for g in s:
            index.setdefault(g, set()).add(i)
    worst = 0.0
    for seed in (0, 1, 2):
        d = dataset(seed=seed, path=str(IFEVAL / "input_data.jsonl"), n_train=2000, n_val=200)
        assert len(d["test"]) == 541
        for task in d["train"] + d["val"]:
            assert task["prompt"].strip().lower() not in texts
            s = _shingles(task["prompt"])
            for i in set().union(*(index.get(g, set()) for g in s)):
                worst = max(worst, len(s & tests[i]) / len(s | tests[i]))
    # word-trigram Jaccard: the closest pair shares only the options a constrained response must quote
    assert worst < 0.5


def test_splits_are_seeded_disjoint_and_checkable(prompts: list[dict]) -> None:
    a = dataset(seed=0, path=str(IFEVAL / "input_data.jsonl"), n_train=300, n_val=50, n_test=100)
    b = dataset(seed=0, path=str(IFEVAL / "input_data.jsonl"), n_train=300, n_val=50, n_test=100)
    c = dataset(seed=1, path=str(IFEVAL / "input_data.jsonl"), n_train=300, n_val=50, n_test=100)
    assert a == b
    assert [t["prompt"] for t in a["train"]] != [t["prompt"] for t in c["train"]]
    assert a["test"] == c["test"]  # the test subset does not move with the run seed: rows on seeds are paired
    assert len(a["test"]) == 100 and len({t["id"] for t in a["test"]}) == 100
    assert not {t["prompt"] for t in a["train"]} & {t["prompt"] for t in a["val"]}
    for task in a["train"] + a["val"]:
        verdicts("A reply.", task["instruction_id_list"], task["kwargs"])  # every kwargs builds its checks


def test_unseen_parameters_are_held_out_of_training() -> None:
    d = dataset(seed=0, n_train=1500, n_val=0, n_test=300, test="unseen")

    def words(tasks: list[dict]) -> set[str]:
        out = set()
        for t in tasks:
            for kw in t["kwargs"]:
                out.update(w for w in kw.get("keywords", []) + kw.get("forbidden_words", []) if w in WORDS)
                out.update(v for k, v in kw.items() if k in ("keyword", "first_word"))
        return out

    assert words(d["train"]) and not any(held_out(w) for w in words(d["train"]))
    assert words(d["test"]) and all(held_out(w) for w in words(d["test"]))
    assert all(t["split"] == "unseen" for t in d["test"])


def test_the_unseen_split_beside_the_file_changes_no_other_split(prompts: list[dict]) -> None:
    path = str(IFEVAL / "input_data.jsonl")
    with_it = dataset(seed=3, path=path, n_train=400, n_val=60, n_unseen=120)
    without = dataset(seed=3, path=path, n_train=400, n_val=60, n_unseen=0)
    assert "unseen" not in without
    assert {k: with_it[k] for k in ("train", "val", "test")} == without  # a run made before it is the same run
    # the same prompts on every run seed, and as a run whose test split is the unseen one
    assert with_it["unseen"] == dataset(seed=4, path=path, n_train=400, n_val=60)["unseen"][:120]
    assert with_it["unseen"] == dataset(seed=3, n_train=0, n_val=0, n_test=120, test="unseen")["test"]
    assert all(t["split"] == "unseen" for t in with_it["unseen"])
    texts = {t["prompt"] for k in ("train", "val", "test") for t in with_it[k]}
    assert not texts & {t["prompt"] for t in with_it["unseen"]}
    assert "unseen" not in dataset(seed=3, n_train=10, n_val=0, n_test=20, test="unseen")


def test_dataset_errors_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dataset.params.path"):
        dataset(seed=0)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "x", "instruction_id_list": ["no:such"], "kwargs": [{}]}\n')
    with pytest.raises(ConfigError, match="line 1"):
        dataset(seed=0, path=str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        dataset(seed=0, path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="n_train"):
        dataset(seed=0, path=str(bad), n_train=-1)


TASK = {
    "id": "t",
    "split": "train",
    "prompt": "p",
    "instruction_id_list": ["punctuation:no_comma", "startend:end_checker"],
    "kwargs": [{}, {"end_phrase": "Bye."}],
}


def test_reward_components_and_feedback() -> None:
    r = reward(TASK, {"reply": "Hello, friend. Bye."})
    assert r.score == 0.5
    assert r.components["instructions"] == 2 and r.components["strict"] == 1 and r.components["prompt_strict"] == 0
    assert "punctuation:no_comma" in r.feedback
    assert reward(TASK, {"reply": "Hello friend. Bye."}).score == 1.0
    hidden = reward({**TASK, "split": "test"}, {"reply": "Hello, friend. Bye."})
    assert hidden.score == 0.5 and hidden.feedback == ""  # a test prompt's verdict is never fed back
    assert reward(TASK, None).score == 0.0


def test_summary_pools_instructions_as_the_reference_does() -> None:
    one = {**TASK, "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    tasks = [TASK, one, one]
    rewards = [reward(TASK, {"reply": "Hello, friend. Bye."}), reward(one, {"reply": "Hi"}), None]
    s = summary(tasks, rewards)
    f = s["figures"]
    assert s["n"] == 3
    assert f["prompt_strict"] == pytest.approx(1 / 3)
    assert f["inst_strict"] == pytest.approx(2 / 4)  # pooled: 2 of 4 instructions, not the mean of 1/2, 1, 0
    assert f["strict"] == pytest.approx((1 / 3 + 2 / 4) / 2)
    assert s["by_type"]["punctuation:no_comma"] == pytest.approx(1 / 3)
    lo, hi = s["intervals"]["strict"]
    assert lo <= f["strict"] <= hi
    assert not any("29.9" in line for line in s["lines"])  # generated prompts: the cards do not compare
    keyed = summary([{**t, "key": i} for i, t in enumerate(tasks)], rewards)
    assert any("SmolLM2-135M-Instruct 29.9" in line for line in keyed["lines"])


SMOKE = Path(__file__).resolve().parents[2] / "examples" / "ifeval" / "smoke.yaml"


def test_the_smoke_run_reports_the_four_figures_and_evolve_eval_prints_them(
    prompts: list[dict], tmp_path: Path
) -> None:
    import subprocess
    import sys

    import evolve

    report = evolve.run(str(SMOKE), out=tmp_path / "r")
    d = dataset(seed=0, path=str(IFEVAL / "input_data.jsonl"), n_train=40, n_val=20, n_test=60)
    # the scripted model echoes the prompt: the figures are the checkers' verdicts on the prompts themselves
    want = summary(d["test"], [reward(t, {"reply": t["prompt"]}) for t in d["test"]])
    got = report["world_summary"]["baseline"]["test"]
    assert got["n"] == 60 and got["figures"] == pytest.approx(want["figures"])
    assert 0 < got["figures"]["strict"] < 1
    assert got["echo"] == 1.0  # every reply repeats the prompt, and the summary says so
    assert report["baseline"]["test"]["score"] == pytest.approx(
        sum(reward(t, {"reply": t["prompt"]}).score for t in d["test"]) / 60, abs=1e-4
    )  # the report rounds to 4 places
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## The world's figures" in md and "SmolLM2-135M-Instruct 29.9" in md

    def evolve_eval(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "evolve.cli.commands", "eval", str(SMOKE), str(tmp_path / "r"), *args]
        return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)

    r = evolve_eval("--system", "baseline")
    assert r.returncode == 0, r.stderr
    assert f"average {100 * want['figures']['strict']:.1f}" in r.stdout
    assert f"prompt-level loose  {100 * want['figures']['prompt_loose']:.1f}" in r.stdout
    # the held-out parameters, scored after the run without a new one
    r = evolve_eval("--split", "unseen")
    assert r.returncode == 0, r.stderr
    unseen = d["unseen"]
    echo = summary(unseen, [reward(t, {"reply": t["prompt"]}) for t in unseen])
    assert f"average {100 * echo['figures']['strict']:.1f}" in r.stdout and f"n={len(unseen)}" in r.stdout
    assert "do not compare" in r.stdout and "29.9" not in r.stdout


def _scripted(tmp_path: Path, **changes) -> dict:
    """The smoke task on a scripted model that, asked to revise, writes its reply in lowercase
    without commas and otherwise repeats the prompt: what a revision step changes is known."""
    data = yaml.safe_load(SMOKE.read_text())
    data["dataset"]["params"]["path"] = str(IFEVAL / "input_data.jsonl")
    data["models"]["policy"]["params"] = {"reply": "tests.worlds.test_ifeval:lowercase_on_revision"}
    data.update(changes)
    return data


def lowercase_on_revision(messages, seed=None, temperature=None) -> str:
    last = messages[-1].content
    if "Read the request again" in last:
        return messages[-2].content.lower().replace(",", "")
    return last


def test_the_revise_agent_and_its_graph_measure_the_draft_and_rewrite_it(prompts: list[dict], tmp_path: Path) -> None:
    import evolve
    from evolve.archive import Archive
    from evolve.registry import node_types
    from evolve.topology.palette import Palette
    from evolve.worlds.ifeval.workflow import PALETTE, draft_measure_revise, single_step

    Palette.parse(PALETTE).check(node_types)
    plain = evolve.run(_scripted(tmp_path), out=tmp_path / "plain")
    agent = evolve.run(_scripted(tmp_path, agent="revise"), out=tmp_path / "agent")
    graph = evolve.run(
        _scripted(tmp_path, agent="evolve.topology:agent", workflow={"graph": draft_measure_revise()}),
        out=tmp_path / "graph",
    )
    one = evolve.run(
        _scripted(tmp_path, agent="evolve.topology:agent", workflow={"graph": single_step()}), out=tmp_path / "one"
    )
    assert one["baseline"]["test"]["score"] == plain["baseline"]["test"]["score"]
    assert (
        graph["baseline"]["test"]["score"] == agent["baseline"]["test"]["score"] != plain["baseline"]["test"]["score"]
    )
    d = dataset(seed=0, path=str(IFEVAL / "input_data.jsonl"), n_train=40, n_val=20, n_test=60)
    want = sum(reward(t, {"reply": t["prompt"].lower().replace(",", "")}).score for t in d["test"]) / 60
    assert agent["baseline"]["test"]["score"] == pytest.approx(want, abs=1e-4)
    steps = [s for t in Archive(tmp_path / "graph", create=False).trajectories(split="test") for s in t.steps]
    measured = [s for s in steps if getattr(s, "name", None) == "measure"]
    assert len(measured) == 60 and all("words: " in s.result for s in measured)


def _satisfying(iid: str, kw: dict, request: str) -> str:
    """A reply that follows one generated instruction, written from its kwargs alone."""
    body = "The garden is calm today. Birds sing near the gate. We rest in the shade"

    def rel_n(rel: str, n: int) -> int:  # a count that satisfies the relation
        return n if rel == "at least" else max(n - 1, 0)

    if iid == "keywords:existence":
        return body + ". " + " ".join(kw["keywords"]) + "."
    if iid == "keywords:frequency":
        return " ".join([kw["keyword"]] * rel_n(kw["relation"], kw["frequency"])) + " 1."
    if iid == "keywords:forbidden_words":
        return "Nothing here but plain words."
    if iid == "keywords:letter_frequency":
        return (kw["letter"] * rel_n(kw["let_relation"], kw["let_frequency"])) + " 1"
    if iid == "language:response_language":
        return {
            "es": "Hola, esto es una respuesta escrita completamente en español para ti.",
            "fr": "Bonjour, ceci est une réponse écrite entièrement en français pour vous.",
        }.get(kw["language"], "")
    if iid == "length_constraints:number_sentences":
        return " ".join(["This is one sentence."] * max(rel_n(kw["relation"], kw["num_sentences"]), 1))
    if iid == "length_constraints:number_paragraphs":
        return "\n***\n".join(["A short paragraph."] * kw["num_paragraphs"])
    if iid == "length_constraints:number_words":
        return " ".join(["word"] * max(rel_n(kw["relation"], kw["num_words"]), 1))
    if iid == "length_constraints:nth_paragraph_first_word":
        paras = ["Some text here."] * kw["num_paragraphs"]
        paras[kw["nth_paragraph"] - 1] = f"{kw['first_word'].capitalize()} starts this one."
        return "\n\n".join(paras)
    if iid == "detectable_content:number_placeholders":
        return " ".join(f"[field{i}]" for i in range(kw["num_placeholders"]))
    if iid == "detectable_content:postscript":
        return f"{body}.\n\n{kw['postscript_marker']} See you soon."
    if iid == "detectable_format:number_bullet_lists":
        return "\n".join(f"* point {i}" for i in range(kw["num_bullets"]))
    if iid == "detectable_format:constrained_response":
        return "My answer is maybe."
    if iid == "detectable_format:number_highlighted_sections":
        return " ".join(f"*part {i}*" for i in range(kw["num_highlights"]))
    if iid == "detectable_format:multiple_sections":
        return "\n".join(f"{kw['section_spliter']} {i}\ntext" for i in range(1, kw["num_sections"] + 1))
    if iid == "detectable_format:json_format":
        return '{"reply": "text"}'
    if iid == "detectable_format:title":
        return "<<A title>>\n" + body
    if iid == "combination:two_responses":
        return "First answer.\n******\nSecond answer."
    if iid == "combination:repeat_prompt":
        return kw["prompt_to_repeat"] + " Here is my answer."
    if iid == "startend:end_checker":
        return body + ". " + kw["end_phrase"]
    if iid == "change_case:capital_word_frequency":
        return " ".join(["BIG"] * rel_n(kw["capital_relation"], kw["capital_frequency"])) + " end"
    if iid == "change_case:english_capital":
        return "THIS IS A REPLY WRITTEN IN ENGLISH WITH CAPITAL LETTERS ONLY AND NOTHING ELSE AT ALL."
    if iid == "change_case:english_lowercase":
        return "this is a reply written in english with lowercase letters only and nothing else at all."
    if iid == "punctuation:no_comma":
        return body + "."
    if iid == "startend:quotation":
        return f'"{body}."'
    raise AssertionError(iid)


def test_every_generated_instruction_is_satisfiable_and_its_parameters_are_in_the_prompt() -> None:
    d = dataset(seed=0, n_train=3000, n_val=0, n_test=0, test="unseen")
    single = [t for t in d["train"] if len(t["instruction_id_list"]) == 1]
    assert {t["instruction_id_list"][0] for t in single} == set(CHECKS)
    for t in single:
        iid, kw = t["instruction_id_list"][0], t["kwargs"][0]
        if iid == "language:response_language" and kw["language"] not in ("es", "fr"):
            continue
        request = t["prompt"].split(". ")[0]
        assert verdicts(_satisfying(iid, kw, request), [iid], [kw]) == [True], (t["prompt"], kw)
        for key, value in kw.items():  # what the checker holds the reply to is what the prompt says
            if key == "language":
                assert LANGUAGES[value] in t["prompt"]
            if key in ("relation", "let_relation", "capital_relation", "prompt_to_repeat", "language"):
                continue
            for v in value if isinstance(value, list) else [value]:
                said = (str(v), ORDINALS[v]) if key == "nth_paragraph" else (str(v),)
                assert any(x in t["prompt"] for x in said), (key, v, t["prompt"])
        if "relation" in kw or "let_relation" in kw or "capital_relation" in kw:
            rel = kw.get("relation") or kw.get("let_relation") or kw.get("capital_relation")
            assert ("at least" in t["prompt"]) == (rel == "at least"), t["prompt"]


def test_paired_figures_resample_the_same_prompts_for_both_systems(prompts: list[dict]) -> None:
    from evolve.worlds.ifeval.scoring import paired

    tasks = [{**p, "id": str(p["key"]), "split": "test"} for p in prompts[:80]]
    echo = [reward(t, {"reply": t["prompt"]}).components for t in tasks]
    empty = [reward(t, {"reply": ""}).components for t in tasks]
    same = paired(echo, echo)
    assert same["strict"]["difference"] == 0 and same["strict"]["interval"] == (0.0, 0.0)
    assert same["a_better"] == same["b_better"] == 0
    up = paired(empty, echo)  # the echo follows some instructions; the empty reply none
    want = summary(tasks, [reward(t, {"reply": t["prompt"]}) for t in tasks])["figures"]
    assert up["strict"]["difference"] == pytest.approx(want["strict"])
    lo, hi = up["strict"]["interval"]
    assert 0 < lo < want["strict"] < hi
    assert up["b_better"] > 0 and up["a_better"] == 0
    with pytest.raises(ValueError, match="same prompts"):
        paired(echo, echo[:-1])


def test_the_grpo_example_loads_and_spends_about_stars_samples() -> None:
    """examples/ifeval/grpo.yaml is a valid task file whose GRPO settings validate, and its sampling
    budget is STaR's (examples/ifeval/star.yaml), so the two rows compare at about the same samples."""
    from types import SimpleNamespace

    from evolve.policy.grpo import GRPO
    from evolve.task.taskfile import load_task

    root = Path(__file__).resolve().parents[2] / "examples" / "ifeval"
    grpo_cfg, _ = load_task(root / "grpo.yaml")
    star_cfg, _ = load_task(root / "star.yaml")
    op = GRPO(**grpo_cfg.operators[0].params)
    assert op.p.truncated_reward == 0.0 and op.p.dev_tasks == 0
    rollouts = op.estimate(SimpleNamespace(train=1000))["rollouts"]
    star = star_cfg.operators[0].params
    assert abs(rollouts - star["tasks"] * star["samples"]) <= 0.1 * rollouts
    assert grpo_cfg.models == star_cfg.models and grpo_cfg.workflow == star_cfg.workflow
