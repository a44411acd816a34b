"""world: ifeval's ``star.repair``: the model's reply to a generated prompt, edited until the
reference checkers pass it on every instruction, its content kept, and never for a test prompt."""

from __future__ import annotations

import re

import pytest

from evolve.worlds.ifeval import dataset, verdicts
from evolve.worlds.ifeval.repair import EDITS, repair, unloop

# sixteen sentences with no capital word but each sentence's first, no comma and no list
REPLY = (
    "A garden needs patience more than anything else. The soil must be turned before the first seeds go in. "
    "Water them early in the morning so the leaves dry by noon. Weeds grow faster than most vegetables do. "
    "Pull them while they are small and the roots come out easily. Tomatoes like warm days and plenty of sun. "
    "Beans climb any fence you give them. Carrots prefer loose soil without stones. "
    "Mulch keeps the ground cool and holds the water in. Birds will eat the berries unless you cover them. "
    "A small pond brings frogs that eat the slugs. Compost turns kitchen scraps into rich dark earth. "
    "Most herbs grow slowly in spring and need little care. Flowers between the rows bring the bees. "
    "Harvest in the evening when the plants are full of water. Next year the garden will be better still."
)


def task(iid: str, kw: dict, split: str = "train") -> dict:
    return {
        "id": f"t-{iid}",
        "split": split,
        "prompt": "Write about a garden.",
        "instruction_id_list": [iid],
        "kwargs": [kw],
    }


def test_unloop_cuts_the_loop_and_an_unfinished_end() -> None:
    looped = "A cat sat. It was warm today in the sun. It was warm today in the sun. It was warm"
    assert unloop(looped) == "A cat sat. It was warm today in the sun."
    # a loop inside one sentence: a run of seven words written twice
    inner = "First words here. one two three four five six seven and one two three four five six seven"
    assert unloop(inner, ended=False) == "First words here."
    assert unloop("Done. Cut in the mid", ended=False) == "Done."
    assert unloop("Ends well.\n\n* a list line") == "Ends well.\n\n* a list line"


@pytest.mark.parametrize(
    ("iid", "kw"),
    [
        ("change_case:english_lowercase", {}),
        ("change_case:english_capital", {}),
        ("change_case:capital_word_frequency", {"capital_relation": "at least", "capital_frequency": 5}),
        ("change_case:capital_word_frequency", {"capital_relation": "less than", "capital_frequency": 3}),
        ("combination:repeat_prompt", {"prompt_to_repeat": "Write about a garden."}),
        ("combination:two_responses", {}),
        ("detectable_content:number_placeholders", {"num_placeholders": 3}),
        ("detectable_content:postscript", {"postscript_marker": "P.P.S"}),
        ("detectable_format:constrained_response", {}),
        ("detectable_format:json_format", {}),
        ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 4}),
        ("detectable_format:number_bullet_lists", {"num_bullets": 3}),
        ("detectable_format:number_highlighted_sections", {"num_highlights": 2}),
        ("detectable_format:title", {}),
        ("keywords:existence", {"keywords": ["lantern", "harbor"]}),
        ("keywords:forbidden_words", {"forbidden_words": ["garden", "spring"]}),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "bees"},
        ),
        ("length_constraints:number_paragraphs", {"num_paragraphs": 4}),
        ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3}),
        ("length_constraints:number_words", {"relation": "less than", "num_words": 20}),
        ("punctuation:no_comma", {}),
        ("startend:end_checker", {"end_phrase": "Any other questions?"}),
        ("startend:quotation", {}),
    ],
)
def test_each_edited_instruction_is_met_and_the_content_kept(iid: str, kw: dict) -> None:
    assert iid in EDITS
    t = task(iid, kw)
    reply = (
        REPLY.replace("garden", "GARDEN").replace("soil", "SOIL")
        if "less than" in str(kw) and "capital" in iid
        else REPLY
    )
    fixed = repair(t, reply)
    assert fixed is not None
    assert verdicts(fixed, [iid], [kw]) == [True]
    if "less than" in str(kw) and "capital" not in iid:  # cut: the reply's first sentences
        assert REPLY.startswith(fixed)
    elif iid not in ("detectable_format:constrained_response", "keywords:forbidden_words"):
        assert "slowly" in fixed.lower()  # the model's own words stay


def test_several_instructions_together_and_a_looping_reply() -> None:
    ids = ["detectable_format:title", "change_case:english_lowercase", "startend:end_checker", "punctuation:no_comma"]
    kws = [{}, {}, {"end_phrase": "Is there anything else I can help with?"}, {}]
    t = {"id": "x", "split": "train", "prompt": "p", "instruction_id_list": ids, "kwargs": kws}
    reply = "Gardens, Like People, need care. " + "Water them every day and they grow. " * 30
    fixed = repair(t, reply, ended=False)
    assert fixed is not None and all(verdicts(fixed, ids, kws))
    assert fixed.count("water them every day") == 1 and "," not in fixed
    assert re.match(r"<<[^\n]+>>\n\n", fixed)


def test_what_edits_cannot_give_is_not_made_up() -> None:
    assert repair(task("language:response_language", {"language": "fr"}), REPLY) is None
    assert repair(task("length_constraints:number_words", {"relation": "at least", "num_words": 500}), REPLY) is None
    assert repair(task("detectable_format:number_bullet_lists", {"num_bullets": 40}), REPLY) is None
    assert repair(task("startend:quotation", {}), "") is None


def test_a_test_prompt_is_never_repaired() -> None:
    assert repair(task("startend:quotation", {}), REPLY) is not None
    assert repair(task("startend:quotation", {}, split="test"), REPLY) is None
    assert repair({**task("startend:quotation", {}), "key": 1000}, REPLY) is None


def test_most_generated_training_prompts_can_be_repaired_from_a_plain_reply() -> None:
    """On the generated training prompts, a plain reply of twenty sentences is repaired for most;
    the rest ask for what no edit gives (a language, a letter's count, more words)."""
    tasks = dataset(seed=0, n_train=300, n_val=0, n_test=0, test="unseen")["train"]
    fixed = [repair(t, REPLY) for t in tasks]
    assert sum(f is not None for f in fixed) >= 0.75 * len(tasks)  # 83% when written
    for t, f in zip(tasks, fixed):
        if f is not None:
            assert all(verdicts(f, t["instruction_id_list"], t["kwargs"]))


def test_the_world_gives_star_its_repair_unless_the_task_file_says_otherwise() -> None:
    from pathlib import Path

    from evolve.task.taskfile import load_task

    star = Path(__file__).resolve().parents[2] / "examples" / "ifeval" / "star.yaml"
    cfg, _ = load_task(star)
    assert cfg.operators[0].params["repair"] == "evolve.worlds.ifeval.repair:repair"
    cfg, _ = load_task(star, ["operators.0.params.repair=null"])
    assert cfg.operators[0].params["repair"] is None
