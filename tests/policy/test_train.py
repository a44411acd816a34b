"""SFT and LoRA training of tiny models: masking, learning, determinism, best checkpoint, base untouched."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from evolve.policy.local import LocalLM  # noqa: E402
from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model, sample  # noqa: E402
from evolve.policy.train import (  # noqa: E402
    Example,
    collate,
    completion_loss,
    examples_from_chat,
    examples_from_trajectory,
    train,
    train_lora,
    truncated_sequence,
)
from evolve.policy.weights import attach_adapter, read_adapter  # noqa: E402
from evolve.types import LLMCall, Message, ToolCall, Trajectory  # noqa: E402

TOK = CharTokenizer()


pytestmark = pytest.mark.usefixtures("one_torch_thread")
SMALL = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=96)


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def greedy(model, texts: list[str], max_tokens: int = 8) -> list[str]:
    prompts = [TOK.render_chat([Message(role="user", content=t)]) for t in texts]
    out = sample(model, prompts, eos_id=TOK.eos_id, temperatures=0.0, max_tokens=max_tokens)
    return [TOK.decode(s.token_ids) for s in out]


def test_examples_from_chat_and_masking():
    msgs = [
        Message(role="system", content="sys"),
        Message(role="user", content="q1"),
        Message(role="assistant", content="a1"),
        Message(role="tool", content="result"),
        Message(role="assistant", content="a2"),
    ]
    exs = examples_from_chat(TOK, msgs)
    full = TOK.render_chat(msgs, add_generation_prompt=False)
    assert len(exs) == 2
    for ex, text in zip(exs, ("a1", "a2")):
        seq = list(ex.prompt_ids) + list(ex.completion_ids)
        assert seq == full[: len(seq)] and ex.completion_ids == tuple(TOK.encode(text) + [TOK.eos_id])
    x, y = collate([truncated_sequence(e, 96) for e in exs], TOK.pad_id)
    for i, ex in enumerate(exs):  # labels: exactly the completion tokens, at the positions that predict them
        targets = y[i][y[i] != -100].tolist()
        assert targets == list(ex.completion_ids)
        n = len(ex.prompt_ids)
        assert x[i, n - 1].item() == ex.prompt_ids[-1] and y[i, n - 1].item() == ex.completion_ids[0]
    # a too-long example keeps its completion and the end of its prompt
    seq, n_prompt = truncated_sequence(Example(tuple(range(8, 100)), (9, 10, 2)), 20)
    assert len(seq) == 20 and seq[-3:] == [9, 10, 2] and n_prompt == 17


def test_examples_from_trajectory_keep_the_sampled_ids():
    call = LLMCall(
        role="policy",
        model="m",
        messages=(Message(role="user", content="x"),),
        output="ab",
        prompt_token_ids=(1, 5, 50, 2, 6),
        token_ids=(60, 61, 2),
        logprobs=(-1.0, -1.0, -0.5),
    )
    other = LLMCall(role="critic", model="m", messages=(), output="", prompt_token_ids=(1,), token_ids=(2,))
    traj = Trajectory(task_id="t", system_id="s", steps=(call, ToolCall(name="sql"), other))
    assert examples_from_trajectory(traj) == [Example((1, 5, 50, 2, 6), (60, 61, 2)), Example((1,), (2,))]
    assert examples_from_trajectory(traj, role="policy") == [Example((1, 5, 50, 2, 6), (60, 61, 2))]


def copy_data(n_train: int, n_test: int, lengths: tuple[int, int], seed: int = 0):
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def word() -> str:
        return "".join(rng.choice(letters) for _ in range(rng.randint(*lengths)))

    train_words: set[str] = set()
    while len(train_words) < n_train:
        train_words.add(word())
    held: list[str] = []
    while len(held) < n_test:
        w = word()
        if w not in train_words and w not in held:
            held.append(w)
    return sorted(train_words), held


def run_copy_task(lengths: tuple[int, int], cfg: TinyConfig, steps: int, lr: float):
    """Train 'copy the word after w:' on random words; return (accuracy on unseen words, stats, logs)."""
    train_words, held = copy_data(2000, 120, lengths)
    val, test = held[:20], held[20:]
    exs = [
        e
        for w in train_words
        for e in examples_from_chat(TOK, [Message(role="user", content="w:" + w), Message(role="assistant", content=w)])
    ]
    model = build_model(cfg, seed=0)

    def accuracy(m, words) -> float:
        return sum(o == w for o, w in zip(greedy(m, ["w:" + w for w in words]), words)) / len(words)

    logs: list[dict] = []
    stats = train(
        model,
        exs,
        steps=steps,
        lr=lr,
        batch_size=32,
        seed=0,
        eval_fn=lambda m: accuracy(m, val),
        eval_every=steps // 4,
        log=logs.append,
    )
    return accuracy(model, test), stats, logs


@pytest.mark.slow
def test_sft_learns_to_copy_unseen_strings():
    """~2 s of SFT: a 2-layer model copies unseen 4-letter words exactly (chance: 26**-4)."""
    acc, stats, logs = run_copy_task(
        (4, 4), TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64), steps=100, lr=5e-3
    )
    assert acc >= 0.8, (acc, stats)
    assert stats["loss"] < stats["first_loss"] / 4 and stats["tokens_per_sec"] > 0
    assert stats["best_score"] == max(s for _, s in stats["evals"]) and len(stats["evals"]) == 4
    assert any("loss" in r for r in logs) and any("eval" in r for r in logs)


@pytest.mark.slow
def test_sft_learns_to_copy_words_of_varying_length():
    """Varying lengths need an induction-style copy (~200 steps, ~6 s of CPU)."""
    acc, stats, _ = run_copy_task(
        (3, 5), TinyConfig(d_model=96, n_layers=2, n_heads=4, d_ff=192, max_len=64), steps=200, lr=3e-3
    )
    assert acc >= 0.6, (acc, stats)


def toy_examples(n: int = 48, reply: str = "ok!") -> list[Example]:
    rng = random.Random(1)
    chats = [
        [
            Message(role="user", content="".join(rng.choice("abcxyz") for _ in range(rng.randint(1, 10)))),
            Message(role="assistant", content=reply),
        ]
        for _ in range(n)
    ]
    return [e for c in chats for e in examples_from_chat(TOK, c)]


@pytest.mark.slow
def test_train_is_deterministic_given_the_seed():
    exs = toy_examples(24)
    runs = []
    for seed in (0, 0, 1):
        m = build_model(SMALL, seed=3)
        train(m, exs, steps=4, batch_size=8, seed=seed)
        runs.append(params(m))
    assert same(runs[0], runs[1]) and not same(runs[0], runs[2])


@pytest.mark.slow
def test_best_checkpoint_is_restored():
    exs = toy_examples(24)
    m = build_model(SMALL, seed=3)
    seen: list[dict] = []

    def eval_fn(model) -> float:  # the first evaluation scores best
        seen.append(params(model))
        return -len(seen)

    stats = train(m, exs, steps=6, batch_size=8, lr=1e-2, eval_fn=eval_fn, eval_every=2)
    assert stats["best_step"] == 2 and [s for s, _ in stats["evals"]] == [2, 4, 6]
    assert same(params(m), seen[0]) and not same(seen[0], seen[-1])


@pytest.mark.slow
def test_train_lora_learns_and_leaves_the_base_alone(tmp_path):
    base = build_model(SMALL, seed=5)
    before = params(base)
    exs = toy_examples()
    val = toy_examples(16)
    assert greedy(base, ["zzz"])[0] != "ok!"
    seen: list[tuple[list[str], dict]] = []

    def eval_fn(m) -> float:  # serves the model under training (its active adapter) mid-run
        llm = LocalLM.from_model(m, TOK, temperature=0.0, max_tokens=6)
        try:
            outs = [llm.complete([Message(role="user", content=w)]).text for w in ("zzz", "cab")]
        finally:
            llm.close()
        seen.append((outs, {k: v.detach().clone() for k, v in m.named_parameters() if "lora_" in k}))
        return len(seen) - completion_loss(m, val)  # later is better: the final weights are kept

    adapter = train_lora(base, exs, steps=40, batch_size=16, seed=0, eval_fn=eval_fn, eval_every=20)
    assert same(params(base), before)  # the model given is not touched (trained on a copy)
    assert adapter.stats["loss"] < adapter.stats["first_loss"] / 4
    assert len(seen) == 2 and not same(seen[0][1], seen[1][1])  # serving it mid-run did not freeze it
    assert seen[-1][0] == ["ok!", "ok!"]
    adapter.save(tmp_path / "a.safetensors")
    tuned = attach_adapter(build_model(SMALL, seed=5), read_adapter(tmp_path / "a.safetensors"))
    assert greedy(tuned, ["zzz", "cab"]) == ["ok!", "ok!"]  # learned, on unseen prompts
    x = torch.tensor([TOK.render_chat([Message(role="user", content="abc")])])
    with torch.no_grad():
        assert not torch.allclose(tuned(x).logits, base(x).logits)
    tuned_base = {
        k.replace("base_model.model.", "", 1).replace(".base_layer.", "."): v
        for k, v in params(tuned).items()
        if "lora_" not in k
    }
    assert same(tuned_base, before)  # attaching never merges into the base
    # continue training from the saved adapter on a new reply
    again = train_lora(tuned, toy_examples(reply="no"), init=tmp_path / "a.safetensors", steps=30, batch_size=16)
    assert again.config == adapter.config and same(params(base), before)
    assert greedy(attach_adapter(build_model(SMALL, seed=5), again), ["zzz"]) == ["no"]


def test_a_base_file_is_named_by_its_weights_not_by_how_long_training_took(tmp_path):
    from evolve.policy.weights import drop_base_info, file_sha256, load_base, save_base

    model = build_model(SMALL, seed=2)
    clean = save_base(model, TOK, SMALL, tmp_path / "clean.safetensors", info={"best_step": 3})
    old = save_base(model, TOK, SMALL, tmp_path / "old.safetensors", info={"best_step": 3, "seconds": 12.5})
    assert old != clean  # what caches written before the fix hold: the wall time changed the name
    assert (
        drop_base_info(tmp_path / "old.safetensors", ["seconds"]) == clean == file_sha256(tmp_path / "old.safetensors")
    )
    assert drop_base_info(tmp_path / "old.safetensors", ["seconds"]) is None  # nothing left to drop
    assert same(params(load_base(tmp_path / "old.safetensors")[0]), params(model))


def test_the_lm_head_runs_only_where_there_is_a_target_and_the_loss_is_the_full_logits_loss():
    """SFT, PPO-ptx and validation loss put the LM head on target positions alone (with a
    150k-token vocabulary the rest would be most of a step's memory); the loss and gradients are
    those of full logits."""
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model

    from evolve.policy.train import target_logits

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, TOK.vocab_size, (4, 40), generator=g)
    y = torch.full_like(x, -100)
    y[0, 30:35], y[2, 10:39], y[3, 39] = x[0, 31:36], x[2, 11:40], 7  # row 1: no target at all
    n = int((y != -100).sum())
    lora = get_peft_model(build_model(SMALL, seed=1), LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    for model in (build_model(SMALL, seed=1).train(), lora.train()):
        rows = []
        head = model.get_base_model().lm_head if hasattr(model, "get_base_model") else model.lm_head
        hook = head.register_forward_hook(lambda m, i, o, rows=rows: rows.append(i[0].shape[0]))
        logits, targets = target_logits(model, x, y)
        hook.remove()
        assert rows == [n] and logits.shape == (n, TOK.vocab_size) and torch.equal(targets, y[y != -100])
        sel = F.cross_entropy(logits, targets, reduction="sum")
        grads_sel = torch.autograd.grad(sel, [p for p in model.parameters() if p.requires_grad])
        full_logits = model(input_ids=x).logits
        full = F.cross_entropy(full_logits.reshape(-1, full_logits.shape[-1]), y.reshape(-1), reduction="sum")
        grads_full = torch.autograd.grad(full, [p for p in model.parameters() if p.requires_grad])
        assert torch.allclose(sel, full, rtol=1e-6)
        assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(grads_sel, grads_full))
