"""Pretrained Hugging Face checkpoints as local bases: chat templates, the archived manifest,
sampling that agrees with the trainer, and GRPO training a LoRA adapter on one, end to end."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.errors import ConfigError  # noqa: E402
from evolve.policy import sampling  # noqa: E402
from evolve.policy.hf import check_manifest, load_pretrained, manifest, read_manifest, resolve_checkpoint  # noqa: E402
from evolve.policy.rl import token_logprobs  # noqa: E402
from evolve.policy.train import examples_from_chat  # noqa: E402
from evolve.policy.weights import load_base  # noqa: E402
from evolve.task.taskfile import load_task  # noqa: E402
from evolve.types import Message  # noqa: E402
from tests.helpers.hf_checkpoint import make_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CHAT = [
    Message(role="system", content="be brief"),
    Message(role="user", content="select name"),
    Message(role="assistant", content="aa ee"),
    Message(role="tool", content="error: no such column"),
    Message(role="assistant", content="select age"),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("hf") / "qwen-tiny")


def _digest(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_chats_render_with_the_checkpoints_template_and_turns_end_with_its_end_of_turn(ckpt):
    _, tok = load_pretrained(ckpt, device="cpu")
    text = tok.tok.apply_chat_template(
        [m.model_dump(include={"role", "content"}) for m in CHAT[:4]], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>tool\nerror: no such column<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.render_chat(CHAT[:4])
    assert tok.tok.decode(ids) == text and ids.count(tok.eos_id) == 4  # <|im_end|> is one id, not its characters
    full = tok.render_chat(CHAT, add_generation_prompt=False)
    examples = examples_from_chat(tok, CHAT)
    assert len(examples) == 2
    for ex in examples:  # every example is the template's own rendering, cut after the turn's end
        assert ex.completion_ids[-1] == tok.eos_id
        seq = list(ex.prompt_ids + ex.completion_ids)
        assert full[: len(seq)] == seq
    assert tok.decode(examples[1].completion_ids) == "select age"
    assert set(tok.eos_ids) == {tok.tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}


def test_a_tokenizer_without_a_chat_template_is_refused_with_the_fix(tmp_path, ckpt):
    bare = shutil.copytree(ckpt, tmp_path / "bare")
    (bare / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match="no chat template.*chat_template"):
        load_pretrained(bare, device="cpu")


def test_the_archive_keeps_a_manifest_that_refuses_a_changed_checkpoint(tmp_path, ckpt):
    copy = shutil.copytree(ckpt, tmp_path / "ck")
    m = read_manifest_bytes(tmp_path, manifest(copy))
    assert m["path"] == str(copy) and "model.safetensors" in m["files"]
    model, tok, cfg = load_base(tmp_path / "base.json", device="cpu")
    assert cfg is None and tok.eos_ids and next(model.parameters()).device.type == "cpu"
    with open(copy / "model.safetensors", "ab") as f:  # the weights changed under the archived system
        f.write(b"\0")
    with pytest.raises(ConfigError, match="model.safetensors is missing or changed"):
        check_manifest(m)
    shutil.rmtree(copy)
    with pytest.raises(ConfigError, match="is gone"):
        load_base(tmp_path / "base.json")
    with pytest.raises(ConfigError, match="without config.json"):
        resolve_checkpoint(str(tmp_path))
    with pytest.raises(ConfigError, match="not a Hugging Face model in the local cache.*hf download"):
        resolve_checkpoint("no-such-org/no-such-model")
    assert resolve_checkpoint("weights/base.safetensors", tmp_path) is None  # a missing file, said by the caller


def test_a_hub_id_fetches_only_what_loading_needs_and_only_when_online(tmp_path, ckpt, monkeypatch):
    import huggingface_hub

    calls = []

    def fake(repo_id, **kw):
        calls.append((repo_id, kw))
        return str(ckpt)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_checkpoint("Qwen/Qwen2.5-0.5B-Instruct") == ckpt
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    resolve_checkpoint("Qwen/Qwen2.5-0.5B-Instruct")
    assert [kw["local_files_only"] for _, kw in calls] == [True, False]
    patterns = calls[0][1]["allow_patterns"]
    assert "*.safetensors" in patterns and "*.json" in patterns and not any("bin" in p or "onnx" in p for p in patterns)


def read_manifest_bytes(tmp_path, data: bytes) -> dict:
    (tmp_path / "base.json").write_bytes(data)
    m = read_manifest(tmp_path / "base.json")
    assert m is not None
    return m


def test_sampled_logprobs_match_the_trainers_and_any_end_of_turn_id_stops(ckpt, monkeypatch):
    model, tok = load_pretrained(ckpt, device="cpu")
    prompts = [tok.render_chat(CHAT[:2]), tok.render_chat(CHAT[:4])]
    kw = dict(eos_id=tok.eos_ids, pad_id=tok.pad_id, temperatures=[0.7, 1.3], max_tokens=24, seeds=[11, 12])
    samples = sampling.sample(model, prompts, **kw)
    for p, s, t in zip(prompts, samples, (0.7, 1.3)):
        ids = torch.tensor([p + s.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[:, len(p) - 1 : -1].float()
        lp = token_logprobs(logits / t, ids[:, len(p) :])[0]
        assert torch.allclose(lp, torch.tensor(s.logprobs), atol=1e-4)
        assert s.finish_reason == "length" or s.token_ids[-1] in tok.eos_ids
    # drawing each row's noise a step at a time (large vocabularies) gives the same samples
    monkeypatch.setattr(sampling, "NOISE_AT_ONCE", 0)
    again = sampling.sample(model, prompts, **kw)
    assert [s.token_ids for s in again] == [s.token_ids for s in samples]
    # a model that only ever says <|endoftext|> stops at once on it, though eos_id names <|im_end|> first
    eot = tok.tok.convert_tokens_to_ids("<|endoftext|>")

    def only_eot(_module, _inputs, logits):
        out = torch.full_like(logits, -1e4)
        out[..., eot] = 0.0
        return out

    hook = model.lm_head.register_forward_hook(only_eot)
    out = sampling.sample(model, prompts[:1], **kw)[0]
    hook.remove()
    assert out.token_ids == [eot] and out.finish_reason == "stop"


def _task(ckpt, **params):
    return {
        "name": "vowels-hf",
        "seed": 0,
        "agent": "tests.helpers.agents:vowel_agent",
        "reward": "tests.helpers.agents:vowel_reward",
        "models": {
            "policy": {
                "backend": "local",
                "name": "qwen-tiny",
                "params": {"weights": str(ckpt), "device": "cpu", "temperature": 0.0, "max_tokens": 4},
            }
        },
        "dataset": {"source": "tests.helpers.agents:vowel_dataset"},
        "operators": [
            {
                "name": "grpo",
                "params": {
                    "steps": 4,
                    "tasks_per_step": 4,
                    "group_size": 8,
                    "lr": 0.02,
                    "r": 8,
                    "dev_tasks": 0,
                    **params,
                },
            }
        ],
        "runner": {"name": "thread", "workers": 16, "timeout": 60},
        "budget": {"generations": 1},
        "engine": {"minibatch": 8},
    }


@pytest.mark.slow
def test_grpo_trains_a_lora_adapter_on_a_pretrained_checkpoint_and_never_writes_it(tmp_path, ckpt):
    before = _digest(ckpt)
    task = _task(ckpt)
    # float32 training and sampling: the sampler's and the trainer's log-probs agree to 1e-4 below
    # (bf16's gap: tests/policy/test_precision.py; dtype: auto samples in bf16 on a CPU with it)
    task["models"]["policy"]["params"].update(precision="fp32", dtype="float32")
    evolve.run(task, out=tmp_path / "run")
    assert _digest(ckpt) == before  # the base checkpoint is never written
    a = Archive(tmp_path / "run", create=False)
    base_ref = a.get_system(a.get_state("baseline")).models["policy"].base
    m = read_manifest(a.artifacts.path(base_ref))
    assert m is not None and m["path"] == str(ckpt.resolve())
    assert a.artifacts.path(base_ref).stat().st_size < 2000  # a manifest, not a copy of the weights
    kids = [r for r in a.records() if r.operator == "grpo"]
    assert len(kids) == 1
    curve = kids[0].info["curve"]
    assert len(curve) == 4 and all(
        r["mismatch"] < 1e-4 and r["trained_tokens"] > 0 for r in curve
    )  # sampler and trainer agree
    child = a.get_system(kids[0].id)
    assert child.models["policy"].base == base_ref and child.models["policy"].adapter is not None
    from evolve.policy.weights import read_adapter

    names = list(read_adapter(a.artifacts.path(child.models["policy"].adapter)).weights)
    assert any("q_proj" in n for n in names) and not any("lm_head" in n for n in names)  # the head is tied
    trajs = [t for t in a.trajectories(split="train") if len(t.steps) == 2]
    assert trajs and all(s.token_ids and s.prompt_token_ids for t in trajs for s in t.steps)


@pytest.mark.slow
def test_a_cold_start_on_a_checkpoint_is_lora_sft_on_the_demos_cached_and_continued_by_grpo(
    tmp_path, ckpt, monkeypatch
):
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    before = _digest(ckpt)
    task = _task(ckpt)
    task["models"]["policy"]["cold_start"] = {
        "demos": "tests.helpers.agents:vowel_demos",
        "n_demos": 16,
        "epochs": 4,
        "lr": 0.01,
        "batch_size": 8,
        "eval_every": 4,
        "n_eval": 4,
    }
    task["operators"][0]["params"]["steps"] = 1
    report = evolve.run(task, out=tmp_path / "run")
    assert _digest(ckpt) == before
    a = Archive(tmp_path / "run", create=False)
    start = a.get_system(a.get_state("baseline")).models["policy"]
    assert read_manifest(a.artifacts.path(start.base)) is not None and start.adapter is not None
    _, tok = load_pretrained(ckpt, device="cpu")
    demos = json.loads(a.artifacts.path(start.params["sft_examples"]["sha256"]).read_text())
    assert len(demos) == 32 and all(c[-1] == tok.eos_id for _, c in demos)  # each turn ends with <|im_end|>
    assert tok.decode(demos[0][1]) == "aeio"
    assert report["baseline"]["val"]["score"] > 0.3  # the demos' behaviour was learnt (without the cold start: 0.0)
    kids = [r for r in a.records() if r.operator == "grpo"]
    assert kids and a.get_system(kids[0].id).models["policy"].adapter != start.adapter  # GRPO went on from it
    # the second run reuses the cached adapter: the same starting system
    evolve.run(task, out=tmp_path / "run2")
    b = Archive(tmp_path / "run2", create=False)
    assert b.get_state("baseline") == a.get_state("baseline")
    bad = _task(ckpt)
    bad["models"]["policy"]["cold_start"] = {"demos": "tests.helpers.agents:vowel_demos", "tiny": {"d_model": 32}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match="tiny describe.*remove tiny or params.weights"):
        load_task(path)
    del bad["models"]["policy"]["cold_start"]["tiny"]
    bad["models"]["policy"]["params"]["weights"] = str(tmp_path / "base.safetensors")
    with pytest.raises(ConfigError, match="is not a checkpoint directory or cached Hub id"):
        evolve.run(bad, out=tmp_path / "run3")


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_samples_in_bf16_only_where_the_cpu_has_it_and_the_trainers_copy_stays_float32(
    tmp_path, ckpt, monkeypatch, has_bf16
):
    from evolve.artifacts import ArtifactStore
    from evolve.policy import precision
    from evolve.policy.local import build
    from evolve.types import ModelSpec

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: has_bf16)
    store = ArtifactStore(tmp_path / "artifacts")
    base = store.put_bytes(manifest(ckpt), "base_weights")
    params = {"device": "cpu", "temperature": 0.0, "max_tokens": 6}
    auto = build(ModelSpec(name="q", base=base, params=params), store)
    f32 = build(ModelSpec(name="q", base=base, params={**params, "dtype": "float32"}), store)
    try:
        # the one that asked for float32 gets its own copy, not the bfloat16 one of the same base
        assert auto.server is not f32.server
        assert next(auto.server.base.parameters()).dtype == (torch.bfloat16 if has_bf16 else torch.float32)
        assert next(f32.server.base.parameters()).dtype == torch.float32
        msgs = [{"role": "user", "content": "select name"}]
        out = auto.complete(msgs)
        assert out.token_ids and len(out.logprobs) == len(out.token_ids)
    finally:
        auto.close()
        f32.close()
    # a trainer loads the same base in float32 on the CPU; its precision decides how it computes
    model, _, _ = load_base(store.path(base), device="cpu")
    assert next(model.parameters()).dtype == torch.float32


def test_evolve_serve_puts_a_pretrained_checkpoint_behind_the_openai_api(ckpt):
    openai = pytest.importorskip("openai")
    from evolve.gateway.local import serve_llm
    from evolve.policy.local import LocalLM

    model, tok = load_pretrained(ckpt, device="cpu")
    llm = LocalLM.from_model(model, tok, name="qwen-tiny", temperature=0.0, max_tokens=12)
    srv = serve_llm(llm, names=["qwen-tiny"], fingerprint="fp")
    try:
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "select name"}]
        want = llm.complete(msgs, temperature=0.0, max_tokens=12)
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="qwen-tiny", messages=msgs, temperature=0, max_tokens=12, logprobs=True)
        ch = r.choices[0]
        assert ch.message.content == want.text and ch.model_extra["token_ids"] == list(want.token_ids)
        assert r.model_extra["prompt_token_ids"] == tok.render_chat(msgs)  # the checkpoint's chat template
        assert [t.logprob for t in ch.logprobs.content] == pytest.approx(list(want.logprobs), abs=1e-5)
    finally:
        srv.close()
        llm.close()


@pytest.mark.slow
def test_the_pretrained_sql_task_file_runs_on_a_checkpoint_in_the_same_format(tmp_path, ckpt):
    """examples/sql_agent/grpo_pretrained.yaml with its checkpoint swapped for the small one and its
    sizes cut: LoRA SFT on SQL demos, multi-turn SQL episodes (execution results fed back as
    context) sampled through the checkpoint's chat template, a GRPO step on them. Plumbing only."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = "operators.0.params."
    evolve.run(
        root / "examples/sql_agent/grpo_pretrained.yaml",
        out=tmp_path / "run",
        overrides=[
            f"models.policy.params.weights={ckpt}",
            "models.policy.params.device=cpu",
            "models.policy.params.max_tokens=24",
            "models.policy.params.gradient_checkpointing=true",  # the cold start and GRPO train with it
            "workflow.max_tokens=24",
            "dataset.params.n_train=40",
            "dataset.params.n_val=4",
            "dataset.params.n_test=4",
            f"{p}steps=1",
            f"{p}tasks_per_step=4",
            f"{p}group_size=2",
            f"{p}dev_tasks=0",
            f"{p}dynamic_sampling=false",
            f"{p}ptx_coef=1.0",
            f"{p}ptx_batch=4",  # the random model fails every task: the demos' SFT term moves it
            "engine.minibatch=4",
            "runner.workers=8",
            "models.policy.cold_start.n_demos=8",
            "models.policy.cold_start.epochs=1",
            "models.policy.cold_start.n_eval=4",
        ],
    )
    a = Archive(tmp_path / "run", create=False)
    trajs = [t for t in a.trajectories(split="train") if t.steps]
    calls = [s for t in trajs for s in t.steps if getattr(s, "token_ids", None)]
    assert calls and all(s.prompt_token_ids[-3:] == tuple(calls[0].prompt_token_ids[-3:]) for s in calls)
    # failed queries are retried with the database's error in the context: multi-turn episodes
    assert any(sum(1 for s in t.steps if getattr(s, "token_ids", None)) > 1 for t in trajs)
    assert any(r.operator == "grpo" for r in a.records())


def test_gradient_checkpointing_recomputes_layers_in_the_backward_pass_and_keeps_the_gradients(tmp_path, ckpt):
    from peft import LoraConfig, get_peft_model

    from evolve.policy.train import lora_targets, target_logits

    read_manifest_bytes(tmp_path, manifest(ckpt))
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    x = torch.randint(0, vocab, (3, 30), generator=torch.Generator().manual_seed(0))
    y = torch.full_like(x, -100)
    y[:, 20:] = x[:, 20:]
    grads, calls = [], []
    for on in (False, True):
        model, _, _ = load_base(tmp_path / "base.json", device="cpu", gradient_checkpointing=on)
        torch.manual_seed(0)
        lora = get_peft_model(
            model, LoraConfig(r=4, target_modules=lora_targets(model), init_lora_weights=False)
        ).train()
        n, mlp = [0], lora.get_base_model().model.layers[0].mlp
        mlp.forward = lambda *a, _f=mlp.forward, _n=n, **k: (_n.__setitem__(0, _n[0] + 1), _f(*a, **k))[
            1
        ]  # hooks skip recomputes
        logits, targets = target_logits(lora, x, y)
        loss = torch.nn.functional.cross_entropy(logits.float(), targets)
        grads.append(torch.autograd.grad(loss, [p for p in lora.parameters() if p.requires_grad]))
        calls.append(n[0])
        lora.eval()  # sampling: no recomputation, the KV cache as usual
        lora(input_ids=x[:, :5])
    assert calls == [1, 2]  # with checkpointing the layer ran again in the backward pass
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads)) and any(a.abs().sum() > 0 for a in grads[0])


def test_large_vocabularies_sample_by_inverse_cdf_exactly_and_independently_of_the_batch(ckpt, monkeypatch):
    """Above INVERSE_CDF_VOCAB a row draws one uniform per step (Gumbel noise would cost V draws):
    log-probs still match the trainer's, a seed's sample does not depend on its batch, and the
    first token's frequencies over many seeds follow the model's distribution."""
    monkeypatch.setattr(sampling, "INVERSE_CDF_VOCAB", 0)
    model, tok = load_pretrained(ckpt, device="cpu")
    prompts = [tok.render_chat(CHAT[:2]), tok.render_chat(CHAT[:4]), tok.render_chat(CHAT[:1])]
    kw = dict(eos_id=tok.eos_ids, pad_id=tok.pad_id, max_tokens=16)
    batch = sampling.sample(model, prompts, temperatures=[1.0, 0.0, 0.7], seeds=[5, 6, 7], **kw)
    alone = sampling.sample(model, prompts[:1], temperatures=1.0, seeds=[5], **kw)
    assert alone[0].token_ids == batch[0].token_ids
    greedy = sampling.sample(model, prompts[1:2], temperatures=0.0, **kw)[0]
    assert batch[1].token_ids == greedy.token_ids
    p = prompts[0]
    ids = torch.tensor([p + batch[0].token_ids])
    with torch.no_grad():
        logits = model(ids).logits[:, len(p) - 1 : -1].float()
    assert torch.allclose(token_logprobs(logits, ids[:, len(p) :])[0], torch.tensor(batch[0].logprobs), atol=1e-4)
    n = 3000
    firsts = sampling.sample(
        model, [p] * n, temperatures=1.0, seeds=list(range(n)), eos_id=tok.eos_ids, pad_id=tok.pad_id, max_tokens=1
    )
    with torch.no_grad():
        probs = model(torch.tensor([p])).logits[0, -1].float().softmax(-1)
    counts = torch.bincount(torch.tensor([s.token_ids[0] for s in firsts]), minlength=len(probs)).float()
    top = probs.topk(5).indices
    # each of the five likeliest tokens within 4.5 binomial standard deviations of its expected count
    sd = (n * probs[top] * (1 - probs[top])).sqrt()
    assert ((counts[top] - n * probs[top]).abs() <= 4.5 * sd + 1).all(), (counts[top], n * probs[top])


@pytest.mark.slow
def test_star_trains_a_lora_adapter_on_a_pretrained_checkpoint(tmp_path, ckpt):
    from evolve.policy.weights import read_adapter

    before = _digest(ckpt)
    task = _task(ckpt)
    task["operators"] = [
        {
            "name": "star",
            "params": {
                "tasks": 8,
                "samples": 4,
                "threshold": 0.125,
                "min_examples": 1,
                "epochs": 1,
                "batch_size": 8,
                "r": 8,
            },
        }
    ]
    evolve.run(task, out=tmp_path / "run")
    assert _digest(ckpt) == before
    a = Archive(tmp_path / "run", create=False)
    kids = [r for r in a.records() if r.operator == "star"]
    assert len(kids) == 1
    adapter = a.get_system(kids[0].id).models["policy"].adapter
    names = list(read_adapter(a.artifacts.path(adapter)).weights)
    assert any("down_proj" in n for n in names) and not any("lm_head" in n for n in names)
    curve = kids[0].info["curve"]  # the loss every 10 steps, which the dashboard draws
    steps = [p["step"] for p in curve]
    assert steps and steps == sorted(set(steps)) and all(p["loss"] > 0 for p in curve)
