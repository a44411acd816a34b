"""The pointer tokenizer: rare words are copied by pointer, decoding restores them exactly."""

from evolve.policy.pointer import PointerTokenizer, tokenizer_from_dict
from evolve.policy.tiny import CharTokenizer
from evolve.policy.train import examples_from_chat
from evolve.types import Message

TOK = PointerTokenizer({"select", "from", "where", "count", "schema", "q", "how", "many", "have", "id"}, n_pointers=8)
CHAT = [
    Message(role="user", content="schema: zorb(id,flim,quax)\nq: how many zorb have flim > 3?"),
    Message(role="assistant", content="select count(*) from zorb where flim > 3"),
]


def test_rare_words_are_single_pointer_tokens_numbered_by_first_occurrence():
    ids = TOK.encode("zorb flim zorb quax")
    p = [i for i in ids if TOK.is_pointer(i)]
    assert len(p) == 4 and p[0] == p[2] and len({p[0], p[1], p[3]}) == 3
    assert TOK.decode(ids, context=[]) == "w0 w1 w0 w2"  # no context: pointers point nowhere
    assert TOK.decode(ids, context=[Message(role="user", content="zorb flim quax")]) == "zorb flim zorb quax"


def test_completion_round_trips_in_the_context_of_its_prompt():
    (ex,) = examples_from_chat(TOK, CHAT)
    assert TOK.decode(ex.completion_ids, context=CHAT[:1]) == CHAT[1].content
    full = TOK.render_chat(CHAT, add_generation_prompt=False)
    assert list(ex.prompt_ids) + list(ex.completion_ids) == full[: len(ex.prompt_ids) + len(ex.completion_ids)]
    # unseen names get the same pointer ids: held-out schemas look like training ones
    other = [
        Message(role="user", content="schema: blip(id,gorm,tazz)\nq: how many blip have gorm > 3?"),
        Message(role="assistant", content="select count(*) from blip where gorm > 3"),
    ]
    (ex2,) = examples_from_chat(TOK, other)
    assert ex2.completion_ids == ex.completion_ids


def test_fit_keeps_frequent_words_and_serialises():
    texts = [f"select count(*) from t{i} where c{i} > 1" for i in range(50)]
    tok = PointerTokenizer.fit(texts, min_share=0.5)
    assert {"select", "count", "from", "where"} <= tok.keep and "t1" not in tok.keep
    back = tokenizer_from_dict(tok.to_dict())
    assert back == tok and back.vocab_size == tok.vocab_size > CharTokenizer().vocab_size
    assert isinstance(tokenizer_from_dict(CharTokenizer().to_dict()), CharTokenizer)


def test_more_names_than_pointers_map_to_unk():
    ids = TOK.encode(" ".join(f"n{i}x" for i in range(10)))
    assert ids.count(TOK.unk_id) == 2


def test_fit_never_keeps_a_word_named_as_a_pointer():
    texts = [f"schema: pet(id,age) q: age of pet {i}? select age from pet" for i in range(50)]
    plain = PointerTokenizer.fit(texts, min_share=0.5)
    assert {"age", "pet", "select"} <= plain.keep
    tok = PointerTokenizer.fit(texts, min_share=0.5, pointers={"age", "pet"}, extra=["pet"])
    assert "age" not in tok.keep and "select" in tok.keep and "pet" in tok.keep  # extra still wins
    ids = tok.encode("select age from pet")
    assert sum(tok.is_pointer(i) for i in ids) == 1  # only "age" is a pointer
