"""Training prompts that never touch IFEval's: new base requests with IFEval's instruction types
and new parameters, made offline the way Tülu 3 made its verifiable-constraint data (a request,
then one to three constraints a checker can verify).

A generated task is a prompt of the test file's shape (``prompt``, ``instruction_id_list``,
``kwargs``), so the same checkers score it. Constraints are phrased here in words of this
project's own (two or three phrasings a type), and their parameters come from pools of this
project's own: keywords, end phrases, letters, languages and counts.

Every pool is cut in two by a fixed rule (a value's CRC-32 modulo 5; the fifth with remainder 0 is
held out): ``unseen=False`` draws from the rest (the training and validation prompts),
``unseen=True`` only from the held-out values, so that a system can be scored on constraint
parameters it never trained on. Instructions that conflict (two case rules, JSON with a layout,
...) are never drawn together.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from evolve.worlds.ifeval.checks import (
    CHECKS,
    CONSTRAINED_RESPONSES,
    LANGUAGES,
    RELATIONS,
)
from evolve.worlds.ifeval.requests import request

WORDS = (
    "harbor",
    "lantern",
    "velvet",
    "compass",
    "meadow",
    "orbit",
    "pepper",
    "quartz",
    "ribbon",
    "saddle",
    "thimble",
    "umbrella",
    "walnut",
    "anchor",
    "blossom",
    "canyon",
    "dolphin",
    "ember",
    "falcon",
    "glimmer",
    "hammock",
    "island",
    "jigsaw",
    "kettle",
    "ladder",
    "marble",
    "nectar",
    "oyster",
    "pebble",
    "quiver",
    "rocket",
    "silver",
    "tulip",
    "violet",
    "whistle",
    "yonder",
    "zephyr",
    "basket",
    "cobalt",
    "drizzle",
    "feather",
    "garnet",
    "horizon",
    "ivory",
    "juniper",
    "kernel",
    "lemon",
    "mosaic",
    "noodle",
    "orchard",
)
END_PHRASES = (
    "That is all for now.",
    "Thanks for reading.",
    "Let me know what you think.",
    "Have a wonderful day!",
    "Hope this helps.",
    "Until next time.",
    "I look forward to your reply.",
    "Stay curious.",
    "The end.",
    "Feel free to ask more.",
)
TITLE_EXAMPLES = ("a day at the fair", "notes from the garden", "the quiet harbor", "small wonders", "morning light")
SECTION_WORDS = ("Section", "SECTION", "Part", "PART", "Step", "Chapter")
ORDINALS = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}
LETTERS = tuple("abcdefghijklmnoprstuwy")
NON_ENGLISH = tuple(code for code in LANGUAGES if code != "en")


def held_out(value: Any) -> bool:
    """Whether a parameter value is in the held-out fifth of its pool (see the module docstring)."""
    return zlib.crc32(repr(value).encode()) % 5 == 0


class Picker:
    """Draws a parameter from a pool's training part or its held-out part."""

    def __init__(self, rng: random.Random, unseen: bool) -> None:
        self.rng, self.unseen = rng, unseen
        self.held = False  # whether a held-out value was drawn

    def part(self, values: Sequence[Any]) -> list[Any]:
        part = [v for v in values if held_out(v) == self.unseen]
        self.held = self.held or (self.unseen and bool(part))
        return part or list(values)

    def __call__(self, values: Sequence[Any]) -> Any:
        return self.rng.choice(self.part(values))

    def some(self, values: Sequence[Any], most: int) -> list[Any]:
        """One to ``most`` distinct values, sorted (the reference sorts keyword lists)."""
        return sorted(self.rng.sample(self.part(values), self.rng.randint(1, most)))

    def phrase(self, *options: str) -> str:
        return self.rng.choice(options)


Built = tuple[str, dict[str, Any]]


def _relation_count(p: Picker, counts: Sequence[int]) -> tuple[str, int]:
    return p.rng.choice(RELATIONS), p(counts)


def _rel_words(relation: str, n: int, unit: str) -> str:
    return f"at least {n} {unit}" if relation == "at least" else f"fewer than {n} {unit}"


def _keywords(p: Picker, req: str) -> Built:
    words = p.some(WORDS, 2)
    shown = " and ".join(f'"{w}"' for w in words)
    return p.phrase(f"Somewhere in your reply, use the word(s) {shown}.", f"Make sure your answer mentions {shown}."), {
        "keywords": words
    }


def _frequency(p: Picker, req: str) -> Built:
    word = p(WORDS)
    relation, n = _relation_count(p, range(1, 7))
    times = _rel_words(relation, n, "times")
    return p.phrase(f'Use the word "{word}" {times}.', f'The word "{word}" must occur {times} in your text.'), {
        "keyword": word,
        "frequency": n,
        "relation": relation,
    }


def _forbidden(p: Picker, req: str) -> Built:
    words = p.some(WORDS, 3)
    shown = ", ".join(f'"{w}"' for w in words)
    return p.phrase(
        f"Never write the word(s) {shown} anywhere in the answer.", f"Avoid these words completely: {shown}."
    ), {"forbidden_words": words}


def _letter(p: Picker, req: str) -> Built:
    letter = p(LETTERS)
    relation, n = _relation_count(p, range(2, 16))
    times = _rel_words(relation, n, "times")
    return p.phrase(
        f'The letter "{letter}" should appear {times} in your reply.',
        f'Count your letters: "{letter}" must be used {times}.',
    ), {"letter": letter, "let_frequency": n, "let_relation": relation}


def _language(p: Picker, req: str) -> Built:
    code = p(NON_ENGLISH)
    return p.phrase(
        f"Reply only in {LANGUAGES[code]}; do not use any other language.",
        f"Write the whole answer in the {LANGUAGES[code]} language and nothing else.",
    ), {"language": code}


def _sentences(p: Picker, req: str) -> Built:
    relation, n = _relation_count(p, range(2, 16))
    return p.phrase(
        f"Your answer should be {_rel_words(relation, n, 'sentences')} long.",
        f"Use {_rel_words(relation, n, 'sentences')} in total.",
    ), {"num_sentences": n, "relation": relation}


def _paragraphs(p: Picker, req: str) -> Built:
    n = p(range(2, 7))
    return p.phrase(
        f"Split your answer into exactly {n} paragraphs, with the markdown divider *** between them.",
        f"Write {n} paragraphs and put a line with *** between each pair of paragraphs.",
    ), {"num_paragraphs": n}


def _words(p: Picker, req: str) -> Built:
    relation, n = _relation_count(p, range(20, 420, 20))
    return p.phrase(
        f"Keep the answer to {_rel_words(relation, n, 'words')}.",
        f"The reply must contain {_rel_words(relation, n, 'words')}.",
    ), {"num_words": n, "relation": relation}


def _first_word(p: Picker, req: str) -> Built:
    n = p(range(2, 6))
    nth = p.rng.randint(1, n)
    word = p(WORDS)
    return p.phrase(
        f"Write {n} paragraphs separated by one blank line each (two newlines). The {ORDINALS[nth]} "
        f'paragraph has to begin with the word "{word}".',
        f"Your answer needs {n} paragraphs, divided by empty lines, and paragraph number {nth} must "
        f'start with "{word}".',
    ), {"num_paragraphs": n, "nth_paragraph": nth, "first_word": word}


def _placeholders(p: Picker, req: str) -> Built:
    n = p(range(1, 7))
    return p.phrase(
        f"Leave at least {n} placeholder(s) in square brackets for the reader to fill in, like [date].",
        f"Include {n} or more fill-in fields written in square brackets, for example [city].",
    ), {"num_placeholders": n}


def _postscript(p: Picker, req: str) -> Built:
    marker = p(("P.S.", "P.P.S"))
    return p.phrase(
        f"Close with a postscript that begins with {marker}", f"After the main text, add a note starting with {marker}"
    ), {"postscript_marker": marker}


def _bullets(p: Picker, req: str) -> Built:
    n = p(range(2, 8))
    return p.phrase(
        f"Present it as exactly {n} markdown bullet points, each line starting with * like this:\n"
        "* first point\n* second point",
        f"Use precisely {n} bullets in markdown (lines that start with *), no more and no fewer.",
    ), {"num_bullets": n}


def _constrained(p: Picker, req: str) -> Built:
    options = ", ".join(f'"{c}"' for c in CONSTRAINED_RESPONSES)
    return p.phrase(
        f"Reply with one of these exact options: {options}", f"Your answer must be one of the following: {options}"
    ), {}


def _highlights(p: Picker, req: str) -> Built:
    n = p(range(1, 7))
    return p.phrase(
        f"Mark at least {n} part(s) of the answer as highlighted with markdown italics, e.g. *key idea*.",
        f"Emphasize {n} or more sections using asterisks, such as *important part*.",
    ), {"num_highlights": n}


def _sections(p: Picker, req: str) -> Built:
    word, n = p(SECTION_WORDS), p(range(2, 6))
    return p.phrase(
        f"Organize the reply into {n} sections, each starting with a heading line {word} 1, {word} 2, and so on.",
        f"Use {n} sections, labelled {word} 1 to {word} {n}.",
    ), {"section_spliter": word, "num_sections": n}


def _json(p: Picker, req: str) -> Built:
    return p.phrase(
        "Format the whole reply as valid JSON (markdown code fences are fine).",
        "The entire output must be a JSON object; you may put it in a ``` block.",
    ), {}


def _title(p: Picker, req: str) -> Built:
    example = p(TITLE_EXAMPLES)
    return p.phrase(
        f"Start with a title enclosed in double angle brackets, for example <<{example}>>.",
        f"Give the answer a title between << and >>, like <<{example}>>.",
    ), {}


def _two(p: Picker, req: str) -> Built:
    return p.phrase(
        "Write two different answers and separate them with a line of six asterisks (******).",
        "Provide two distinct versions, divided by ****** and nothing else.",
    ), {}


def _repeat(p: Picker, req: str) -> Built:
    return (
        "Before answering, copy the request above exactly as written; write nothing before the copy, and do "
        "not copy this sentence or the ones after it."
    ), {"prompt_to_repeat": req}


def _end(p: Picker, req: str) -> Built:
    phrase = p(END_PHRASES)
    return p.phrase(
        f'The very last words of your reply must be "{phrase}" with nothing after them.',
        f'End with exactly this sentence: "{phrase}"',
    ), {"end_phrase": phrase}


def _capital_words(p: Picker, req: str) -> Built:
    relation, n = _relation_count(p, range(2, 26))
    return p.phrase(
        f"Use {_rel_words(relation, n, 'words')} written entirely in CAPITAL letters.",
        f"Fully capitalized words (LIKE THIS) should appear {_rel_words(relation, n, 'times')}.",
    ), {"capital_frequency": n, "capital_relation": relation}


def _capital(p: Picker, req: str) -> Built:
    return p.phrase(
        "Write everything in English using only CAPITAL LETTERS.",
        "The whole reply must be English in upper case, no lowercase letters at all.",
    ), {}


def _lowercase(p: Picker, req: str) -> Built:
    return p.phrase(
        "Write everything in English using only lowercase letters; no capitals anywhere.",
        "Use lower case English only, without a single capital letter.",
    ), {}


def _no_comma(p: Picker, req: str) -> Built:
    return p.phrase("Do not put a single comma in the reply.", "Commas are not allowed anywhere in your answer."), {}


def _quotation(p: Picker, req: str) -> Built:
    return p.phrase(
        "Put the entire reply inside one pair of double quotes.",
        'Begin and end your answer with a double quotation mark (").',
    ), {}


BUILDERS: dict[str, Callable[[Picker, str], Built]] = {
    "keywords:existence": _keywords,
    "keywords:frequency": _frequency,
    "keywords:forbidden_words": _forbidden,
    "keywords:letter_frequency": _letter,
    "language:response_language": _language,
    "length_constraints:number_sentences": _sentences,
    "length_constraints:number_paragraphs": _paragraphs,
    "length_constraints:number_words": _words,
    "length_constraints:nth_paragraph_first_word": _first_word,
    "detectable_content:number_placeholders": _placeholders,
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": _bullets,
    "detectable_format:constrained_response": _constrained,
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:json_format": _json,
    "detectable_format:title": _title,
    "combination:two_responses": _two,
    "combination:repeat_prompt": _repeat,
    "startend:end_checker": _end,
    "change_case:capital_word_frequency": _capital_words,
    "change_case:english_capital": _capital,
    "change_case:english_lowercase": _lowercase,
    "punctuation:no_comma": _no_comma,
    "startend:quotation": _quotation,
}
assert set(BUILDERS) == set(CHECKS), "a builder for every checker"

_LAYOUT = {
    "detectable_format:json_format",
    "combination:two_responses",
    "startend:quotation",
    "detectable_format:title",
    "detectable_format:number_bullet_lists",
    "detectable_format:multiple_sections",
    "length_constraints:number_paragraphs",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:postscript",
    "startend:end_checker",
    "detectable_format:number_highlighted_sections",
    "combination:repeat_prompt",
    "detectable_format:constrained_response",
}
_CASE = {"change_case:english_capital", "change_case:english_lowercase", "change_case:capital_word_frequency"}
_ENGLISH = _CASE | {
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "startend:end_checker",
    "detectable_format:multiple_sections",
    "length_constraints:nth_paragraph_first_word",
    "keywords:letter_frequency",
    "detectable_format:constrained_response",
    "combination:repeat_prompt",
}
_ALONE = {"detectable_format:constrained_response": {"punctuation:no_comma", "detectable_format:title"}}


def conflicts(a: str, b: str) -> bool:
    """Whether instructions ``a`` and ``b`` are never drawn for one prompt."""
    if a == b:
        return True
    pair = {a, b}
    if len(pair & _CASE) == 2:
        return True
    if "language:response_language" in pair and pair & _ENGLISH:
        return True
    for json_like in ("detectable_format:json_format", "combination:two_responses"):
        if json_like in pair and pair & _LAYOUT:
            return True
    for lone, allowed in _ALONE.items():
        if lone in pair and not (pair - {lone}) <= allowed:
            return True
    if pair == {"length_constraints:number_paragraphs", "length_constraints:nth_paragraph_first_word"}:
        return True
    if "startend:quotation" in pair and pair & {"combination:repeat_prompt", "detectable_format:title"}:
        return True
    return pair == {"change_case:english_lowercase", "detectable_format:multiple_sections"}


SIZES = (1, 1, 1, 1, 1, 2, 2, 2, 3, 3)  # instructions per prompt: about IFEval's 834 over 541 (1.54)


def generated_prompt(rng: random.Random, *, unseen: bool = False) -> dict[str, Any]:
    """One generated prompt: ``{"prompt", "instruction_id_list", "kwargs"}``; with ``unseen``, one
    with at least one held-out parameter (a prompt whose instructions take none, such as repeating
    the request, tests nothing unseen and could equal a training prompt)."""
    while True:
        pick = Picker(rng, unseen)
        p = _prompt(rng, pick)
        if pick.held or not unseen:
            return p


def _prompt(rng: random.Random, pick: Picker) -> dict[str, Any]:
    ids: list[str] = []
    for _ in range(rng.choice(SIZES)):
        options = [i for i in sorted(BUILDERS) if not any(conflicts(i, j) for j in ids)]
        if options:
            ids.append(rng.choice(options))
    ids.sort(key=lambda i: i != "combination:repeat_prompt")  # the copy asked for is of the request alone
    req = request(rng, question="detectable_format:constrained_response" in ids)
    parts, kwargs = [], []
    for iid in ids:
        text, kw = BUILDERS[iid](pick, req)
        parts.append(text)
        kwargs.append(kw)
    return {"prompt": " ".join([req, *parts]), "instruction_id_list": ids, "kwargs": kwargs}


__all__ = ["BUILDERS", "END_PHRASES", "SIZES", "WORDS", "Picker", "conflicts", "generated_prompt", "held_out"]
