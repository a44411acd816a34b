"""The local backend: tokenizer, sampler, batching server, adapters, weights files, build()."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from evolve.errors import ConfigError, LLMError  # noqa: E402
from evolve.llm.base import LLM  # noqa: E402
from evolve.policy import sampling  # noqa: E402
from evolve.policy.local import LocalLM, LocalServer, build, shutdown_all  # noqa: E402
from evolve.policy.sampling import Ask, Decoder  # noqa: E402
from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model, count_params, sample  # noqa: E402
from evolve.policy.weights import (  # noqa: E402
    Adapter,
    adapter_from_model,
    file_sha256,
    load_adapter,
    load_base,
    read_adapter,
    save_adapter,
    save_base,
)
from evolve.types import ArtifactRef, Message, ModelSpec  # noqa: E402

CFG = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=128, init_std=0.05)
TOK = CharTokenizer()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, seed=0)


def chat(text: str) -> list[Message]:
    return [Message(role="system", content="be brief"), Message(role="user", content=text)]


def random_adapter(model, seed: int, r: int = 4) -> Adapter:
    """A LoRA adapter with random (non-zero) weights, made on a copy of the model."""
    import copy
    import warnings

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        pm = get_peft_model(copy.deepcopy(model), cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    return adapter_from_model(pm)


def base_state(m) -> dict[str, torch.Tensor]:
    """Base tensors of a model, with or without injected LoRA layers."""
    out = {}
    for k, v in m.state_dict().items():
        if "lora_" not in k:
            out[k.replace("base_model.model.", "", 1).replace(".base_layer.", ".")] = v
    return out


def snapshot(m) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in base_state(m).items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- tokenizer / model


def test_tokenizer_round_trip_and_chat():
    text = "Hello, world!\n  {x: 1} ~"
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text and len(ids) == len(text)
    assert TOK.encode("é") == [TOK.unk_id] and TOK.decode([TOK.unk_id, TOK.eos_id]) == ""
    msgs = [
        Message(role="system", content="s"),
        Message(role="user", content="hi"),
        Message(role="assistant", content="yo"),
    ]
    ids = TOK.render_chat(msgs)
    r = TOK.role_ids
    assert ids == [
        TOK.bos_id,
        r["system"],
        *TOK.encode("s"),
        TOK.eos_id,
        r["user"],
        *TOK.encode("hi"),
        TOK.eos_id,
        r["assistant"],
        *TOK.encode("yo"),
        TOK.eos_id,
        r["assistant"],
    ]
    assert TOK.render_chat(msgs, add_generation_prompt=False) == ids[:-1]
    prefix = TOK.render_chat(msgs[:2])
    assert prefix + TOK.encode("yo") + [TOK.eos_id] == ids[:-1]  # prefix-stable
    assert TOK.render_chat([{"role": "user", "content": "hi"}]) == TOK.render_chat(msgs[1:2])
    assert CharTokenizer.from_dict(TOK.to_dict()) == TOK and TOK.vocab_size == 104


def test_default_config_size():
    n = count_params(build_model(TinyConfig(), seed=1))
    assert 1_000_000 < n < 3_000_000


# ----------------------------------------------------------------------------- sampler


def recompute(model, prompt, ids, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(ids)])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)]
    t = temperature if temperature > 0 else 1.0
    lp = torch.log_softmax(logits / t, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    return lp, logits.argmax(-1)


def test_logprobs_match_a_forward_pass(model):
    llm = LocalLM.from_model(model, TOK, max_tokens=24)
    try:
        temps = [0.7, 1.0, 1.5, 0.0]
        futs = [llm.submit(chat("x" * (3 + 7 * i)), temperature=t, seed=i) for i, t in enumerate(temps)]
        for i, (t, f) in enumerate(zip(temps, futs)):
            c = f.result()
            assert len(c.token_ids) == len(c.logprobs) == c.completion_tokens > 0
            assert c.prompt_token_ids == tuple(TOK.render_chat(chat("x" * (3 + 7 * i)))) and c.prompt_tokens > 0
            lp, argmax = recompute(model, c.prompt_token_ids, c.token_ids, t)
            assert torch.allclose(lp, torch.tensor(c.logprobs), atol=1e-4)
            if t == 0:
                assert argmax.tolist() == list(c.token_ids)
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == TOK.eos_id
            assert c.text == TOK.decode(c.token_ids) and c.cost is None
    finally:
        llm.close()


def test_top_logprobs_are_the_likeliest_tokens_at_each_step(model):
    """``top_logprobs=k``: at each step the k likeliest ids of the distribution the token was drawn
    from (tempered at T, untempered greedy), likeliest first, as a forward pass gives them; a row
    that did not ask in the same batch gets None."""
    llm = LocalLM.from_model(model, TOK, max_tokens=12, batch_wait=0.05)
    try:
        futs = [
            llm.submit(chat("hi" * (i + 1)), temperature=t, seed=i, top_logprobs=k)
            for i, (t, k) in enumerate([(0.7, 3), (0.0, 5), (1.0, 0)])
        ]
        outs = [f.result() for f in futs]
        assert outs[2].top_logprobs is None
        for c, t, k in zip(outs[:2], (0.7, 0.0), (3, 5)):
            assert len(c.top_logprobs) == len(c.token_ids) and all(len(step) == k for step in c.top_logprobs)
            with torch.no_grad():
                logits = model(torch.tensor([list(c.prompt_token_ids) + list(c.token_ids)])).logits[0].float()
            n = len(c.prompt_token_ids)
            full = torch.log_softmax(logits[n - 1 : n - 1 + len(c.token_ids)] / (t if t > 0 else 1.0), -1)
            for step, row in zip(c.top_logprobs, full):
                v, i = row.topk(k)
                assert [tid for tid, _ in step] == i.tolist()
                assert torch.allclose(torch.tensor([lp for _, lp in step]), v, atol=1e-4)
            if t == 0:
                assert [step[0][0] for step in c.top_logprobs] == list(c.token_ids)
    finally:
        llm.close()


def test_seeded_sampling_is_independent_of_the_batch(model):
    prompts = [TOK.render_chat(chat(w)) for w in ("a", "hello there", "zz" * 20, "q")]
    kw = dict(eos_id=TOK.eos_id, temperatures=1.0, max_tokens=20)
    alone = [sample(model, [p], seeds=[100 + i], **kw)[0] for i, p in enumerate(prompts)]
    together = sample(model, prompts, seeds=[100 + i for i in range(4)], **kw)
    reordered = sample(model, prompts[::-1] + prompts[:2], seeds=[103, 102, 101, 100, 55, 56], **kw)[:4][::-1]
    for a, b, c in zip(alone, together, reordered):
        assert a.token_ids == b.token_ids == c.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    other = sample(model, prompts[:1], seeds=[999], **kw)[0]
    assert other.token_ids != alone[0].token_ids


@pytest.mark.parametrize("slack", [64, 0])
def test_rows_joining_a_running_batch_decode_as_they_would_alone(model, slack, monkeypatch):
    """Continuous batching: rows added to a running :class:`Decoder` (prompts longer and shorter
    than its columns, sampled and greedy, stop strings, top log-probs) give the tokens and
    log-probs they give alone, and rows that end leave the batch and its columns; also when each
    cohort of rows reads the cache from its own first column (``GROUP_SLACK`` 0)."""
    monkeypatch.setattr(sampling, "GROUP_SLACK", slack)
    prompts = [TOK.render_chat(chat(w)) for w in ("a", "hello there", "zz" * 20, "q", "mid" * 4, "x")]
    asks = [
        Ask(prompts[0], 1.0, 40, 100),
        Ask(prompts[1], 0.0, 6, None),
        Ask(prompts[2], 0.8, 30, 102, top_logprobs=3),
        Ask(prompts[3], 0.0, 25, None, stop=("e",)),
        Ask(prompts[4], 1.2, 12, 104),
        Ask(prompts[5], 1.0, 0, 105),
    ]

    def alone(a: Ask):
        return sample(
            model,
            [a.prompt],
            eos_id=TOK.eos_id,
            temperatures=a.temperature,
            max_tokens=a.max_tokens,
            seeds=[a.seed],
            stops=[a.stop],
            decode=TOK.token_text,
            top_logprobs=a.top_logprobs,
        )[0]

    dec = Decoder(model, eos_id=TOK.eos_id, decode=TOK.token_text)
    rows = dec.add(asks[:2])
    widths = [dec.mask.shape[1]]
    for _ in range(8):  # the greedy row ends after 6 tokens; the batch prunes it
        dec.step()
    assert rows[1].done is not None and len(dec.rows) == 1
    rows += dec.add(asks[2:4])  # a longer prompt than the batch's columns, then a shorter one
    widths.append(dec.mask.shape[1])
    for _ in range(3):
        dec.step()
    rows += dec.add(asks[4:])  # a row with nothing to generate is done at once and never joins
    assert dec.grouped and len(dec.groups) == (3 if slack == 0 else 0)
    assert rows[5].done is not None and rows[5].done.token_ids == [] and rows[5] not in dec.rows
    assert len(dec.rows) == dec.live  # rows that had ended left the batch when the others joined
    while dec.live:
        widths.append(dec.mask.shape[1])
        dec.step()
    assert dec.rows == [] and dec.cache is None
    assert max(widths) > widths[-1]  # columns of the rows that ended were dropped
    for a, r in zip(asks, rows):
        want = alone(a)
        got = r.done
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason and got.stop == want.stop
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4)
        if a.top_logprobs:
            assert [[i for i, _ in s] for s in got.top_logprobs] == [[i for i, _ in s] for s in want.top_logprobs]
        else:
            assert got.top_logprobs is None


def test_the_server_admits_requests_into_its_running_batch(model):
    """A request for the running batch's adapter joins it as rows end (one batch serves all);
    one for another adapter, or one that comes while an adapter is being added, waits for the
    batch to end. Every reply is the one it gets alone."""
    m = build_model(CFG, seed=0)
    server = LocalServer(m, TOK, max_batch=4, batch_wait=0.001, max_wait=0.001)
    llm = LocalLM(server, max_tokens=30, on_close=server.close)
    gate, steps = threading.Event(), []

    def hold(_module, _inputs):  # the running batch waits at its 3rd forward pass for the test
        steps.append(1)
        if len(steps) == 3:
            assert gate.wait(30)

    try:
        prompts = [chat("w" * (1 + 5 * i)) for i in range(6)]
        solo = LocalLM.from_model(build_model(CFG, seed=0), TOK, max_tokens=30)
        expected = [solo.complete(p, seed=i, temperature=0.9) for i, p in enumerate(prompts)]
        solo.close()
        hook = m.register_forward_pre_hook(hold)
        first = llm.submit(prompts[0], seed=0, temperature=0.9)
        while len(steps) < 3:
            time.sleep(0.005)
        later = [llm.submit(prompts[i], seed=i, temperature=0.9) for i in (1, 2)]
        time.sleep(0.05)
        batches = server.stats["batches"]
        gate.set()
        got = [f.result(timeout=60) for f in [first, *later]]
        assert server.stats["batches"] == batches == 1  # the later two joined the running batch
        for g, e in zip(got, expected):
            assert g.token_ids == e.token_ids
        # an adapter being added: the running batch stops admitting and lets it in
        steps.clear()
        gate.clear()
        first = llm.submit(prompts[3], seed=3, temperature=0.9)
        while len(steps) < 3:
            time.sleep(0.005)
        adding = threading.Thread(target=server.add_adapter, args=("one", random_adapter(model, 1)))
        adding.start()
        while not server._model_waiters:
            time.sleep(0.005)
        later = [llm.submit(prompts[i], seed=i, temperature=0.9) for i in (4, 5)]
        time.sleep(0.05)
        gate.set()
        got = [f.result(timeout=60) for f in [first, *later]]
        adding.join(timeout=60)
        assert not adding.is_alive() and "one" in server.adapters()
        assert server.stats["batches"] == 3  # the later two waited for the adapter, then ran together
        for g, e in zip(got, expected[3:]):
            assert g.token_ids == e.token_ids
        hook.remove()
    finally:
        gate.set()
        llm.close()


def test_greedy_is_deterministic_and_stops(model):
    llm = LocalLM.from_model(model, TOK, temperature=0.0, max_tokens=12)
    try:
        a, b = llm.complete(chat("same")), llm.complete(chat("same"), seed=5)
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
        c = llm.complete(chat("same"), max_tokens=3)
        assert c.finish_reason == "length" and c.token_ids == a.token_ids[:3]
        assert llm.complete(chat("same"), max_tokens=0).token_ids == ()
        # a stop string made of the greedy output's own text ends it there
        full = llm.complete(chat("same"), max_tokens=12)
        if len(full.text) >= 4:
            stop = full.text[2:4]
            d = llm.complete(chat("same"), stop=[stop])
            assert d.finish_reason == "stop" and d.extra["stop"] == stop and stop not in d.text
            assert d.text == full.text[: full.text.index(stop)]
    finally:
        llm.close()


def test_concurrent_callers_are_batched_and_correct(model):
    server = LocalServer(model, TOK, max_batch=64, batch_wait=0.05)
    llm = LocalLM(server, max_tokens=16, on_close=server.close)
    try:
        assert isinstance(llm, LLM)
        prompts = [chat("w" * (1 + 3 * i)) for i in range(16)]
        solo = LocalLM.from_model(build_model(CFG, seed=0), TOK, max_tokens=16)
        expected = [solo.complete(p, seed=i, temperature=0.9) for i, p in enumerate(prompts)]
        solo.close()
        batches_before = server.stats["batches"]
        results: list = [None] * 16
        barrier = threading.Barrier(16)

        def call(i: int) -> None:
            barrier.wait()
            results[i] = llm.complete(prompts[i], seed=i, temperature=0.9)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e, r in zip(expected, results):
            assert r.token_ids == e.token_ids and r.prompt_token_ids == e.prompt_token_ids
        assert server.stats["batches"] - batches_before < 16  # they shared batches
        # a failing batch fails its callers with LLMError; the worker keeps serving
        with pytest.raises(LLMError, match="generation failed"):
            server.submit([TOK.bos_id, 10**6]).result()
        assert llm.complete(prompts[0], seed=0, temperature=0.9).token_ids == expected[0].token_ids
        with pytest.raises(LLMError):
            llm.complete([Message(role="user", content="x" * CFG.max_len)])  # longer than the context
    finally:
        llm.close()
    with pytest.raises(LLMError):
        llm.complete(prompts[0])


# ----------------------------------------------------------------------------- adapters and files


def test_adapters_swap_without_touching_the_base(model, tmp_path: Path):
    before = snapshot(model)
    a1, a2 = random_adapter(model, 1), random_adapter(model, 2)
    m = build_model(CFG, seed=0)  # a private copy: the server wraps it in place
    server = LocalServer(m, TOK, batch_wait=0.01)
    bare = LocalLM(server, temperature=0.0, max_tokens=10)
    try:
        p = chat("adapter test")
        out0 = bare.complete(p)
        server.add_adapter("one", a1)
        server.add_adapter("two", a2)
        one = LocalLM(server, adapter="one", temperature=0.0, max_tokens=10)
        two = LocalLM(server, adapter="two", temperature=0.0, max_tokens=10)
        futs = [llm.submit(p) for llm in (one, bare, two, one, bare)]
        r = [f.result() for f in futs]
        assert r[1].token_ids == out0.token_ids == r[4].token_ids  # adapter None = the bare base
        assert r[0].token_ids == r[3].token_ids
        assert r[0].logprobs != r[1].logprobs and r[2].logprobs != r[0].logprobs
        server.remove_adapter("one")
        assert bare.complete(p).token_ids == out0.token_ids and two.complete(p).token_ids == r[2].token_ids
        assert same_state(snapshot(server.base), before)
        assert same_state(snapshot(model), before)
        # saving the served model writes the bare base, byte for byte
        sha = save_base(model, TOK, CFG, tmp_path / "a.st")
        assert (
            save_base(server.peft, TOK, CFG, tmp_path / "b.st")
            == sha
            == save_base(server.base, TOK, CFG, tmp_path / "c.st")
        )
    finally:
        server.close()


def test_base_save_load_round_trip(model, tmp_path: Path):
    sha = save_base(model, TOK, CFG, tmp_path / "a.safetensors")
    assert save_base(model, TOK, CFG, tmp_path / "b.safetensors") == sha == file_sha256(tmp_path / "a.safetensors")
    m2, tok2, cfg2 = load_base(tmp_path / "a.safetensors")
    assert tok2 == TOK and cfg2 == CFG
    assert same_state(base_state(m2), base_state(model))
    x = torch.tensor([TOK.render_chat(chat("round trip"))])
    with torch.no_grad():
        assert torch.equal(m2(x).logits, model(x).logits)


def test_adapter_save_load_round_trip_is_exact(model, tmp_path: Path):
    from peft import PeftModel

    ad = random_adapter(model, 3)
    pm = load_adapter(build_model(CFG, seed=0), _write(ad, tmp_path / "x.safetensors"))
    assert isinstance(pm, PeftModel)
    sha = save_adapter(pm, "default", tmp_path / "y.safetensors")
    assert sha == file_sha256(tmp_path / "x.safetensors")  # same weights, same bytes
    back = read_adapter(tmp_path / "y.safetensors")
    assert back.config == ad.config and all(torch.equal(back.weights[k], ad.weights[k]) for k in ad.weights)
    pm2 = load_adapter(build_model(CFG, seed=0), tmp_path / "y.safetensors", adapter_name="other")
    x = torch.tensor([TOK.render_chat(chat("exact"))])
    with torch.no_grad():
        assert torch.equal(pm(x).logits, pm2(x).logits)
        assert not torch.equal(pm(x).logits, model(x).logits)


def _write(ad: Adapter, path: Path) -> Path:
    ad.save(path)
    return path


class DirStore:
    """The bit of an artifact store that build() needs."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, src: Path, kind: str) -> ArtifactRef:
        sha = file_sha256(src)
        dst = self.root / sha
        dst.write_bytes(src.read_bytes())
        return ArtifactRef(sha256=sha, kind=kind, size=dst.stat().st_size)

    def path(self, ref: ArtifactRef) -> Path:
        return self.root / ref.sha256


def test_build_shares_one_base_per_sha(model, tmp_path: Path):
    store = DirStore(tmp_path)
    save_base(model, TOK, CFG, tmp_path / "base.st")
    random_adapter(model, 4).save(tmp_path / "ad.st")
    base, adapter = store.put(tmp_path / "base.st", "base_weights"), store.put(tmp_path / "ad.st", "adapter")
    params = {"temperature": 0.0, "max_tokens": 8}
    a = build(ModelSpec(name="tiny", base=base, params=params), store)
    b = build(ModelSpec(name="tiny-ad", base=base, adapter=adapter, params=params), store)
    c = build(ModelSpec(name="tiny-ad2", base=base, adapter=adapter, params=params), store)
    try:
        assert a.server is b.server is c.server
        ra, rb, rc = a.complete(chat("hi")), b.complete(chat("hi")), c.complete(chat("hi"))
        assert len(ra.token_ids) <= 8 and ra.model == "tiny"
        assert rb.token_ids == rc.token_ids and rb.logprobs != ra.logprobs
        b.close()
        assert c.complete(chat("hi")).token_ids == rb.token_ids  # still loaded for c
    finally:
        for llm in (a, b, c):
            llm.close()
        assert a.server.closed
        shutdown_all()
    with pytest.raises(ConfigError, match="needs base weights"):
        build(ModelSpec(name="nobase"), store)
