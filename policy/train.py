"""Supervised training for tiny causal LMs: full fine-tuning and LoRA (used by SFT cold start and STaR).

Data is a list of :class:`Example` = (prompt_ids, completion_ids); the loss is on completion
tokens only (the model's own tokens; prompt, user text and tool outputs are masked). Chat demos
give one Example per assistant turn (:func:`examples_from_chat`); recorded rollouts give the
exact ids the sampler drew (:func:`examples_from_trajectory`), never re-tokenised.

    stats = train(model, examples, steps=300, lr=3e-3, eval_fn=score, eval_every=50)
    adapter = train_lora(base, examples, steps=200)      # base untouched; adapter.save(path)
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evolve.policy.tiny import CharTokenizer
from evolve.types import LLMCall, Message, Trajectory

if TYPE_CHECKING:  # pragma: no cover
    from evolve.policy.weights import Adapter

LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def lora_targets(model: Any) -> list[str]:
    """The :data:`LORA_TARGETS` ``model`` has. ``lm_head`` is left out when it is tied to the input
    embeddings (pretrained checkpoints such as Qwen2.5-0.5B): the untied tiny models need it (see
    :func:`train_lora`), a pretrained head does not, and peft cannot keep a tied pair tied."""
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    out = [t for t in LORA_TARGETS if t in names and not (tied and t == "lm_head")]
    if not out:
        raise ValueError(
            f"{type(model).__name__} has none of the LoRA target modules {list(LORA_TARGETS)}; "
            "pass target_modules with the names of its linear layers"
        )
    return out


@dataclass(frozen=True)
class Example:
    """One training sequence: ``prompt_ids`` (context, not learned) then ``completion_ids`` (learned)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(i) for i in self.prompt_ids))
        object.__setattr__(self, "completion_ids", tuple(int(i) for i in self.completion_ids))


ExampleLike = Example | tuple


def as_example(x: ExampleLike) -> Example:
    return x if isinstance(x, Example) else Example(tuple(x[0]), tuple(x[1]))


def _messages(messages: Sequence[Message | dict]) -> list[Message]:
    return [m if isinstance(m, Message) else Message(role=m["role"], content=m["content"]) for m in messages]


def turn_ids(tok: CharTokenizer, context: Sequence[Message | dict], content: str) -> list[int]:
    """The ids of an assistant turn with ``content`` after ``context``, its end included: a chat
    template's own end-of-turn (:mod:`evolve.policy.hf`), else the text's tokens and EOS."""
    msgs = _messages(context)
    turn = getattr(tok, "assistant_ids", None)
    return list(turn(msgs, content)) if turn else tok.encode(content, context=msgs) + [tok.eos_id]


def examples_from_chat(tok: CharTokenizer, messages: Sequence[Message | dict]) -> list[Example]:
    """One Example per assistant turn: prompt = the chat before it (with the generation prompt),
    completion = its text + EOS. ``prompt + completion`` is a prefix of ``render_chat(messages)``."""
    msgs = _messages(messages)
    out = []
    for i, m in enumerate(msgs):
        if m.role == "assistant":
            prompt = tok.render_chat(msgs[:i], add_generation_prompt=True)
            out.append(Example(tuple(prompt), tuple(turn_ids(tok, msgs[:i], m.content))))
    return out


def examples_from_trajectory(traj: Trajectory | Iterable[Any], role: str | None = None) -> list[Example]:
    """One Example per recorded LLM call that has token ids (optionally only calls of ``role``):
    exactly the ids the model saw and sampled."""
    steps = traj.steps if isinstance(traj, Trajectory) else traj
    out = []
    for s in steps:
        if isinstance(s, LLMCall) and (role is None or s.role == role):
            if s.prompt_token_ids is not None and s.token_ids:
                out.append(Example(s.prompt_token_ids, s.token_ids))
    return out


# ----------------------------------------------------------------------------- batching


def truncated_sequence(ex: Example, max_len: int) -> tuple[list[int], int]:
    """prompt + completion cut to ``max_len`` (prompt trimmed from the left) and the prompt length."""
    p, c = list(ex.prompt_ids), list(ex.completion_ids)
    c = c[: max_len - 1] if len(c) >= max_len else c
    room = max_len - len(c)
    p = p[-room:] if room > 0 else []
    if not p:  # nothing to predict the first token from: drop it from the targets
        return c, 1
    return p + c, len(p)


def _batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Length-bucketed batches: shuffle, sort within chunks of 16 batches, shuffle the batches."""
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    chunk, out = batch_size * 16, []
    for c in range(0, len(idx), chunk):
        part = sorted(idx[c : c + chunk], key=lambda i: lengths[i])
        out += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
    rng.shuffle(out)
    return out


def collate(seqs: list[tuple[list[int], int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    L = max(len(s) for s, _ in seqs) - 1
    x = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    y = torch.full((len(seqs), L), -100, dtype=torch.long)
    for i, (s, n_prompt) in enumerate(seqs):
        t = torch.tensor(s, dtype=torch.long)
        x[i, : len(s) - 1] = t[:-1]
        y[i, n_prompt - 1 : len(s) - 1] = t[n_prompt:]
    return x, y


def split_head(model: Any) -> tuple[Any, Any] | None:
    """(backbone, lm_head) of a causal LM or of the model inside a PeftModel, if it has them."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone, head = getattr(inner, "model", None), getattr(inner, "lm_head", None)
    return (backbone, head) if backbone is not None and head is not None else None


def head_logits(model: Any, ids: Any, sel: Any, attention_mask: Any = None) -> Any:
    """Logits ``[N, V]`` at the N positions where the boolean ``sel`` ``[B, T]`` is true.

    The backbone runs on the whole batch; the LM head runs on those positions alone, so prompts
    and tool output cost no vocabulary-sized logits. With a pretrained vocabulary this is most of
    the memory of a step: Qwen2.5's 151,936 logits over a 16 x 600-token batch of SQL prompts are
    5.8 GB in float32, of which the completions need a few percent. Models without a separate
    ``lm_head`` get full logits, then the selection. No KV cache is built (training forwards).
    """
    parts = split_head(model)
    if parts is None:
        return model(input_ids=ids, attention_mask=attention_mask, use_cache=False).logits[sel]
    backbone, head = parts
    return head(backbone(input_ids=ids, attention_mask=attention_mask, use_cache=False).last_hidden_state[sel])


def target_logits(model: Any, x: Any, y: Any) -> tuple[Any, Any]:
    """``(logits [N, V], targets [N])`` at the N positions of ``y`` that have a target (not -100):
    :func:`head_logits` for SFT-style batches."""
    sel = y != -100
    return head_logits(model, x, sel), y[sel]


def completion_loss(model: Any, examples: Sequence[ExampleLike], *, batch_size: int = 32, pad_id: int = 0) -> float:
    """Mean cross-entropy per completion token (no gradient), e.g. for validation."""
    import torch
    import torch.nn.functional as F

    exs = [as_example(e) for e in examples]
    max_len = int(model.config.max_position_embeddings)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(exs), batch_size):
            x, y = collate([truncated_sequence(e, max_len) for e in exs[i : i + batch_size]], pad_id)
            x, y = x.to(device), y.to(device)
            logits, targets = target_logits(model, x, y)
            total += F.cross_entropy(logits.float(), targets, reduction="sum").item()
            count += len(targets)
    model.train(was_training)
    return total / max(count, 1)


# ----------------------------------------------------------------------------- training


def train(
    model: Any,
    examples: Sequence[ExampleLike],
    *,
    steps: int | None = None,
    epochs: float | None = None,
    lr: float = 3e-3,
    batch_size: int = 32,
    warmup: int | float = 0.05,
    weight_decay: float = 0.01,
    min_lr_ratio: float = 0.1,
    grad_clip: float = 1.0,
    seed: int = 0,
    eval_fn: Callable[[Any], float] | None = None,
    eval_every: int | None = None,
    log: Callable[[dict], None] | None = None,
    log_every: int = 10,
    pad_id: int = 0,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Train the parameters of ``model`` that require grad on ``examples`` (completion tokens only).

    AdamW, linear warmup (``warmup`` steps, or a fraction of all steps when < 1) then cosine to
    ``min_lr_ratio * lr``, gradient clipping, length-bucketed right-padded batches. Give
    ``steps`` or ``epochs`` (default 1 epoch). With ``eval_fn(model) -> score`` (higher is better,
    run every ``eval_every`` steps and at the end, model in eval mode) the best-scoring
    parameters are restored at the end. Deterministic given ``seed``. The model is left in
    eval mode. Returns statistics: steps, epochs, loss (mean of the last 10 steps), first_loss,
    tokens (real, unpadded), seconds, eval_seconds, tokens_per_sec (training only), best_score,
    best_step, evals ([(step, score)]), precision. ``log`` gets ``{step, loss, lr, tokens_per_sec}`` every
    ``log_every`` steps and ``{step, eval, best}`` after each evaluation.

    ``precision``: ``fp32`` (exact, the default), ``bf16`` or ``auto``
    (:mod:`evolve.policy.precision`): in bf16 the frozen parameters are bfloat16 and the forward
    runs under autocast while training, the trained parameters and the loss stay float32;
    ``eval_fn`` sees the float32 model, and the model is float32 again when this returns.
    """
    import torch
    import torch.nn.functional as F

    from evolve.policy.precision import BF16Base, resolve_precision

    exs = [as_example(e) for e in examples if len(as_example(e).completion_ids) > 0]
    if not exs:
        raise ValueError("train: no examples with a completion")
    max_len = int(model.config.max_position_embeddings)
    seqs = [truncated_sequence(e, max_len) for e in exs]
    lengths = [len(s) for s, _ in seqs]
    per_epoch = math.ceil(len(exs) / batch_size)
    total = int(steps) if steps is not None else max(1, round((epochs if epochs is not None else 1.0) * per_epoch))
    n_warm = int(warmup * total) if isinstance(warmup, float) and warmup < 1 else int(warmup)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("train: the model has no trainable parameters")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )

    def lr_at(step: int) -> float:
        if step < n_warm:
            return (step + 1) / (n_warm + 1)
        frac = (step - n_warm) / max(1, total - n_warm)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    rng = random.Random(seed)
    best: dict[str, Any] = {"score": None, "step": None, "state": None}
    evals: list[tuple[int, float]] = []

    eval_time = [0.0]

    mixed = BF16Base(model, enabled=resolve_precision(precision, device) == "bf16")

    def evaluate(step: int) -> None:
        t = time.perf_counter()
        model.eval()
        with mixed.full_precision():
            score = float(eval_fn(model))  # type: ignore[misc]
        model.train()
        eval_time[0] += time.perf_counter() - t
        for p in params:  # whatever eval_fn did (e.g. peft adapter switching), keep training these
            p.requires_grad_(True)
        evals.append((step, score))
        if best["score"] is None or score > best["score"]:
            best.update(score=score, step=step, state={n: p.detach().clone() for n, p in trainable.items()})
        if log:
            log({"step": step, "eval": score, "best": best["score"]})

    t0, tokens, losses, step = time.perf_counter(), 0, [], 0
    curve: list[dict[str, Any]] = []  # the mean loss of each log_every steps: the training curve the dashboard draws
    model.train()
    with torch.random.fork_rng(devices=[]), mixed:
        torch.manual_seed(seed)
        queue: list[list[int]] = []
        while step < total:
            if not queue:
                queue = _batches(lengths, batch_size, rng)
            batch = queue.pop()
            x, y = collate([seqs[i] for i in batch], pad_id)
            x, y = x.to(device), y.to(device)
            with mixed.autocast():
                logits, targets = target_logits(model, x, y)
            loss = F.cross_entropy(logits.float(), targets, reduction="sum") / max(len(targets), 1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            sched.step()
            step += 1
            tokens += sum(lengths[i] - 1 for i in batch)  # real tokens, padding not counted
            losses.append(loss.item())
            if step % log_every == 0 or step == total:
                recent = sum(losses[-log_every:]) / len(losses[-log_every:])
                curve.append({"step": step, "loss": round(recent, 5)})
                if log:
                    dt = time.perf_counter() - t0 - eval_time[0]
                    log(
                        {
                            "step": step,
                            "loss": recent,
                            "lr": sched.get_last_lr()[0],
                            "tokens_per_sec": tokens / max(dt, 1e-9),
                        }
                    )
            if eval_fn is not None and eval_every and step % eval_every == 0 and step < total:
                evaluate(step)
        if eval_fn is not None:
            evaluate(step)
    if best["state"] is not None and best["step"] != step:
        with torch.no_grad():
            for n, p in trainable.items():
                p.copy_(best["state"][n])
    model.eval()
    dt = time.perf_counter() - t0
    tail = losses[-max(1, min(10, len(losses))) :]
    return {
        "steps": step,
        "epochs": step / per_epoch,
        "loss": sum(tail) / len(tail),
        "first_loss": losses[0],
        "tokens": tokens,
        "seconds": dt,
        "eval_seconds": eval_time[0],
        "tokens_per_sec": tokens / max(dt - eval_time[0], 1e-9),
        "best_score": best["score"],
        "best_step": best["step"],
        "evals": evals,
        "curve": curve,
        "precision": "bf16" if mixed.enabled else "fp32",
    }


def bare_copy(model: Any) -> Any:
    """A deep copy of ``model`` without any peft LoRA layers (never merged: the base weights as they are)."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    m = copy.deepcopy(model)
    if isinstance(m, PeftModel):
        m = m.get_base_model()
    for name, mod in list(m.named_modules()):
        if isinstance(mod, BaseTunerLayer) and name:
            parent_name, _, attr = name.rpartition(".")
            setattr(m.get_submodule(parent_name) if parent_name else m, attr, mod.get_base_layer())
    for attr in ("peft_config", "_hf_peft_config_loaded"):
        if attr in m.__dict__:
            delattr(m, attr)
    return m


def train_lora(
    base_model: Any,
    examples: Sequence[ExampleLike],
    *,
    r: int = 16,
    alpha: float = 32,
    dropout: float = 0.0,
    target_modules: Sequence[str] | None = None,
    init: Adapter | str | os.PathLike | None = None,
    lr: float = 5e-3,
    seed: int = 0,
    eval_fn: Callable[[Any], float] | None = None,
    **train_kwargs: Any,
) -> Adapter:
    """Train a LoRA adapter on ``examples`` and return it (:meth:`Adapter.save` / ``save_adapter`` write it).

    Works on a private copy of ``base_model`` (adapters stripped, never merged), so the model
    given, even one a server is using, is not touched. ``init`` (an Adapter or its file)
    continues training an existing adapter (its LoRA config wins over ``r``/``alpha``/...).
    ``eval_fn`` receives the PeftModel being trained. Other keywords go to :func:`train`; the
    statistics are in ``adapter.stats`` (not saved). Defaults (r=16, alpha=32, lr=5e-3, all
    projections plus ``lm_head`` unless it is tied: :func:`lora_targets`) are sized for tiny models: a random-init base has a tiny frozen
    ``lm_head``, and without LoRA on it the logits cannot sharpen (the loss stalls near 3.4 nats).
    """
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    from evolve.policy.weights import Adapter, adapter_from_model, read_adapter

    start = None if init is None else (init if isinstance(init, Adapter) else read_adapter(init))
    config = (
        start.lora_config()
        if start is not None
        else LoraConfig(
            r=r,
            lora_alpha=alpha,  # type: ignore[arg-type]  # peft says int; a float alpha scales as well
            lora_dropout=dropout,
            target_modules=list(target_modules or lora_targets(base_model)),
            bias="none",
        )
    )
    base = bare_copy(base_model)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation noise from inside peft
        torch.manual_seed(seed)
        model = get_peft_model(base, config)
    if start is not None:
        set_peft_model_state_dict(model, start.weights)
    stats = train(model, examples, lr=lr, seed=seed, eval_fn=eval_fn, **train_kwargs)
    adapter = adapter_from_model(model, "default")
    adapter.stats = stats
    return adapter


__all__ = [
    "Example",
    "LORA_TARGETS",
    "as_example",
    "bare_copy",
    "completion_loss",
    "examples_from_chat",
    "turn_ids",
    "examples_from_trajectory",
    "head_logits",
    "split_head",
    "target_logits",
    "train",
    "train_lora",
]
