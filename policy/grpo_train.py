"""From recorded trajectories to GRPO updates of a LoRA adapter.

:func:`pack` turns one multi-turn trajectory into training sequences without re-tokenising
anything: each recorded :class:`~evolve.types.LLMCall` carries the prompt ids the model saw and
the ids it sampled. When a call's prompt extends the previous call's prompt + completion (the
usual chat transcript), the turns are merged into one sequence, and the text between them
(tool results, environment feedback, user messages) goes in with mask 0; otherwise the call
starts a new sequence. Only the model's own sampled tokens have mask 1.

:class:`Learner` owns a PeftModel (base frozen and never merged; the reference policy is the
same model with the adapter disabled), an AdamW optimiser that persists across generation
batches, and one :meth:`Learner.update` per batch of rollouts: old log-probs (stored once per
batch when ``num_iterations > 1`` or the batch is split into several optimiser steps), the
reference log-probs when ``beta > 0``, then ``num_iterations`` passes of ``minibatches``
optimiser steps over length-sorted micro-batches. :class:`HostedLearner` builds one from files
and trades only data, so that GRPO can keep it in a Ray actor where the GPUs are.
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.policy.rl import LossConfig, policy_loss
from evolve.policy.train import head_logits
from evolve.types import LLMCall, Trajectory


@dataclass
class Packed:
    """One training sequence: ``ids`` and, per position, whether it is a sampled token (``mask``)
    and the sampler's log-prob there (``sampler_logp``, NaN where ``mask`` is 0)."""

    ids: list[int]
    mask: list[int]
    sampler_logp: list[float]
    temperature: float
    truncated: bool = False
    advantage: float = 0.0
    group: str = ""
    reward: float = 0.0
    traj: int = -1  # which trajectory it came from (its sequences form one sample); -1: its own
    traj_tokens: int = 0  # trained tokens of that whole trajectory (0: this sequence's)

    @property
    def n_trained(self) -> int:
        return sum(self.mask)


def pack(
    traj: Trajectory, role: str = "policy", max_len: int | None = None, context_only: Collection[int] = ()
) -> list[Packed]:
    """Training sequences of the calls of ``role`` in ``traj`` (calls without token ids are skipped).
    The sampled tokens of the steps at the indices in ``context_only`` stay context (mask 0)."""
    out: list[Packed] = []
    cur: Packed | None = None
    for i, s in enumerate(traj.steps):
        if not isinstance(s, LLMCall) or s.role != role or s.prompt_token_ids is None or not s.token_ids:
            continue
        prompt, toks = list(s.prompt_token_ids), list(s.token_ids)
        lps = list(s.logprobs) if s.logprobs is not None and len(s.logprobs) == len(toks) else [math.nan] * len(toks)
        temp = float(s.temperature) if s.temperature else 1.0
        n = len(cur.ids) if cur is not None else 0
        fits = max_len is None or len(prompt) + len(toks) <= max_len
        if cur is not None and cur.temperature == temp and fits and len(prompt) >= n and prompt[:n] == cur.ids:
            gap = prompt[n:]  # tool output / feedback / user text between the turns: context only
            cur.ids += gap
            cur.mask += [0] * len(gap)
            cur.sampler_logp += [math.nan] * len(gap)
        else:
            cur = Packed(ids=prompt, mask=[0] * len(prompt), sampler_logp=[math.nan] * len(prompt), temperature=temp)
            out.append(cur)
        cur.ids += toks
        cur.mask += [0 if i in context_only else 1] * len(toks)
        cur.sampler_logp += lps
        cur.truncated = cur.truncated or s.finish_reason == "length"
    total = sum(p.n_trained for p in out)
    for p in out:
        p.traj_tokens = total
    return out


def collate(seqs: Sequence[Packed], pad_id: int) -> dict[str, Any]:
    """Right-padded tensors: inputs ``ids[:-1]``, targets ``ids[1:]`` and the target-aligned mask."""
    import torch

    L = max(len(s.ids) for s in seqs) - 1
    B = len(seqs)
    x = torch.full((B, L), pad_id, dtype=torch.long)
    y = torch.full((B, L), pad_id, dtype=torch.long)
    m = torch.zeros((B, L), dtype=torch.float32)
    att = torch.zeros((B, L), dtype=torch.long)
    slp = torch.full((B, L), math.nan, dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s.ids) - 1
        x[i, :n] = torch.tensor(s.ids[:-1])
        y[i, :n] = torch.tensor(s.ids[1:])
        m[i, :n] = torch.tensor(s.mask[1:], dtype=torch.float32)
        att[i, :n] = 1
        slp[i, :n] = torch.tensor(s.sampler_logp[1:], dtype=torch.float32)
    return {
        "input_ids": x,
        "targets": y,
        "mask": m,
        "attention_mask": att,
        "sampler_logp": slp,
        "temperature": torch.tensor([s.temperature for s in seqs], dtype=torch.float32),
        "advantages": torch.tensor([s.advantage for s in seqs], dtype=torch.float32),
        "seq_weights": torch.tensor([1.0 / max(s.traj_tokens or s.n_trained, 1) for s in seqs], dtype=torch.float32),
    }


def sequence_logprobs(model: Any, batch: dict[str, Any]) -> Any:
    """Per-token log-probs ``[B, T]`` of the targets, each row at its own sampling temperature.

    Only positions with ``mask > 0`` are computed (0 elsewhere; the rows right-padded, as
    :func:`collate` makes them): the backbone runs on the whole sequence, but the LM head and the log-softmax run on the sampled tokens alone, so prompts and
    tool output cost no vocabulary-sized logits (TRL's fused LM head saves the same work).
    """
    import torch

    ids = batch["input_ids"]
    sel = batch["mask"].to(ids.device) > 0
    rows = sel.nonzero()[:, 0]
    # no attention mask: the rows are right-padded (:func:`collate`), so under the causal mask no
    # trained position sees a pad, and the model takes its causal attention path instead of
    # building a padding mask (the same log-probs bit for bit on SmolLM2; 18% faster there)
    logits = head_logits(model, ids, sel).float()
    logits = logits / batch["temperature"].to(ids.device).clamp(min=1e-6)[rows, None]
    lp = logits.log_softmax(-1).gather(-1, batch["targets"].to(ids.device)[sel][:, None])[:, 0]
    out = torch.zeros(ids.shape, dtype=lp.dtype, device=ids.device)
    return out.masked_scatter(sel, lp)


@dataclass
class UpdateStats:
    sequences: int = 0
    tokens: int = 0  # every token the model ran on (prompts included)
    trained_tokens: int = 0
    optimizer_steps: int = 0
    loss: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    kl: float = 0.0
    mismatch: float = 0.0  # mean |sampler log-prob - trainer log-prob| on sampled tokens (same weights)
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class Learner:
    """GRPO updates of one LoRA adapter on a frozen base (see the module docstring).

    ``model``: a plain causal LM (the base; never modified) — it is wrapped with a fresh LoRA
    adapter (``init`` continues an existing :class:`~evolve.policy.weights.Adapter` instead).
    ``precision``: ``fp32`` (exact, the default), ``bf16`` or ``auto``
    (:mod:`evolve.policy.precision`); in bf16 the base's frozen weights are cast to bfloat16 in
    place for the learner's lifetime, so give it a base nothing else samples from.
    """

    def __init__(
        self,
        model: Any,
        *,
        cfg: LossConfig | None = None,
        r: int = 16,
        alpha: float = 32,
        target_modules: Sequence[str] | None = None,
        init: Any = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        num_iterations: int = 1,
        minibatches: int = 1,
        micro_batch: int = 64,
        micro_batch_tokens: int | None = None,
        pad_id: int = 0,
        seed: int = 0,
        ptx: Sequence[Any] = (),
        ptx_coef: float = 0.0,
        ptx_batch: int = 16,
        warmup: int = 0,
        precision: str = "fp32",
    ) -> None:
        import torch
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        from evolve.policy.precision import BF16Base, resolve_precision
        from evolve.policy.train import lora_targets

        config = (
            init.lora_config()
            if init is not None
            else LoraConfig(
                r=r,
                lora_alpha=alpha,  # type: ignore[arg-type]  # peft says int; a float alpha scales as well
                lora_dropout=0.0,
                target_modules=list(target_modules or lora_targets(model)),
                bias="none",
            )
        )
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.manual_seed(seed)
            self.model = get_peft_model(model, config)
        if init is not None:
            set_peft_model_state_dict(self.model, init.weights)
        # the model's device (CPU, or CUDA when the caller moved the base there): batches follow it
        self.device = next(model.parameters()).device
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=lr, betas=betas, weight_decay=weight_decay)
        # linear warmup over the first ``warmup`` optimiser steps (of all updates together): Adam's
        # first step moves every parameter by about lr whatever the gradient's size, which on a
        # noisy policy gradient is a jump, not a step (bench/training/grpo_kl_probe.py on the SQL world, lr
        # 3e-3, no PPO-ptx: per-token KL to the base 0.03 after one step, 4.8 after two)
        self.warmup = int(warmup)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda k: min(1.0, (k + 1) / self.warmup) if self.warmup else 1.0
        )
        self.cfg, self.grad_clip, self.pad_id = cfg or LossConfig(), grad_clip, pad_id
        self.num_iterations, self.minibatches, self.micro_batch = (
            int(num_iterations),
            int(minibatches),
            int(micro_batch),
        )
        # the backbone keeps every layer's activations of a forward pass for the backward: one pass of
        # ~40 SQL prompts on SmolLM2-135M (micro_batch alone) was killed for memory on 24 GiB. A
        # padded-token budget keeps long prompts in small passes and short ones in big ones; None:
        # estimated from the model's shape, 0: no cap
        self.micro_batch_tokens = (
            auto_micro_tokens(model) if micro_batch_tokens is None else int(micro_batch_tokens) or None
        )
        self.max_len = int(model.config.max_position_embeddings)
        # PPO-ptx (InstructGPT): an SFT term on the cold-start demos in every optimiser step keeps
        # the policy from drifting away from what it was taught while RL moves it
        self.ptx = list(ptx) if ptx_coef > 0 else []
        self.ptx_coef, self.ptx_batch = float(ptx_coef), int(ptx_batch)
        self._rng = random.Random(seed)
        # bf16 (evolve.policy.precision): the frozen base cast once, for the learner's lifetime;
        # the LoRA factors, the optimiser and every log-prob stay float32
        self.precision = resolve_precision(precision, self.device)
        self.mixed = BF16Base(self.model, enabled=self.precision == "bf16")
        if self.mixed.enabled:
            self.mixed.cast()
        self.model.train()

    def replay(self, examples: Sequence[Any]) -> int:
        """Add (prompt ids, completion ids) examples to the PPO-ptx pool (self-imitation); its size."""
        if self.ptx_coef > 0:
            self.ptx += list(examples)
        return len(self.ptx)

    def adapter(self) -> Any:
        from evolve.policy.weights import adapter_from_model

        return adapter_from_model(self.model, "default")

    def _micro(self, seqs: list[Packed]) -> list[dict[str, Any]]:
        """Length-sorted micro-batches of at most ``micro_batch`` sequences and ``micro_batch_tokens``
        padded tokens (a longer sequence alone). Memory only: the loss is normalised over the whole
        optimiser step, so the gradient is the same however the sequences are split."""
        out: list[list[Packed]] = []
        cur: list[Packed] = []
        for i in sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids)):
            if cur and (
                len(cur) == self.micro_batch
                or (self.micro_batch_tokens and (len(cur) + 1) * len(seqs[i].ids) > self.micro_batch_tokens)
            ):
                out.append(cur)
                cur = []
            cur.append(seqs[i])
        if cur:
            out.append(cur)
        return [{k: v.to(self.device) for k, v in collate(b, self.pad_id).items()} for b in out]

    def _ptx_backward(self) -> float:
        """Add ``ptx_coef`` × the mean NLL of a random batch of demo completions to the gradient."""
        import torch.nn.functional as F

        from evolve.policy.train import as_example, collate, target_logits, truncated_sequence

        batch = self._rng.sample(self.ptx, min(self.ptx_batch, len(self.ptx)))
        x, y = collate([truncated_sequence(as_example(e), self.max_len) for e in batch], self.pad_id)
        with self.mixed.autocast():
            logits, targets = target_logits(self.model, x.to(self.device), y.to(self.device))
        nll = F.cross_entropy(logits.float(), targets)
        (self.ptx_coef * nll).backward()
        return float(nll.detach())

    def _logprobs(self, b: dict[str, Any]) -> Any:
        """:func:`sequence_logprobs` of the model, its forward in the learner's precision."""
        with self.mixed.autocast():
            return sequence_logprobs(self.model, b)

    def update(self, seqs: Sequence[Packed], max_completion_length: int | None = None) -> UpdateStats:
        """One generation batch: ``num_iterations`` × ``minibatches`` optimiser steps."""
        import torch

        t0 = time.perf_counter()
        st = UpdateStats(sequences=len(seqs))
        seqs = [s for s in seqs if s.n_trained > 0]
        if not seqs:
            return st
        cfg = self.cfg
        if cfg.loss_type == "dr_grpo" and cfg.max_completion_length is None:
            from dataclasses import replace

            cfg = replace(cfg, max_completion_length=max_completion_length or max(s.n_trained for s in seqs))
        samples: dict[int, list[Packed]] = {}  # a trajectory's sequences stay in one optimiser step
        for i, s in enumerate(seqs):
            samples.setdefault(s.traj if s.traj >= 0 else -1 - i, []).append(s)
        groups = list(samples.values())
        chunks = [
            [s for g in groups[i :: self.minibatches] for s in g] for i in range(min(self.minibatches, len(groups)))
        ]
        n_samples = [len(groups[i :: self.minibatches]) for i in range(len(chunks))]
        batches = [self._micro(c) for c in chunks]
        stored = self.num_iterations > 1 or len(chunks) > 1
        n_mismatch, mismatch = 0, 0.0

        def measure(lp: Any, b: dict[str, Any]) -> None:  # trainer vs sampler log-probs, same weights
            nonlocal n_mismatch, mismatch
            ok = (b["mask"] > 0) & ~torch.isnan(b["sampler_logp"])
            mismatch += float((lp.detach() - b["sampler_logp"]).abs()[ok].sum())
            n_mismatch += int(ok.sum())

        if stored or cfg.beta > 0:
            with torch.no_grad():  # old (and reference) log-probs, once per generation batch
                for mbs in batches:
                    for b in mbs:
                        if stored:
                            b["old_logp"] = self._logprobs(b)
                            measure(b["old_logp"], b)
                        if cfg.beta > 0:
                            with self.model.disable_adapter():
                                b["ref_logp"] = self._logprobs(b)
        losses: list[float] = []
        agg = {"clip_low": 0.0, "clip_high": 0.0, "kl": 0.0}
        n_stats = 0
        norms = {"pg": 0.0, "total": 0.0}
        for _ in range(self.num_iterations):
            for mbs, n_seqs in zip(batches, n_samples):
                n_tok = float(sum(float(b["mask"].sum()) for b in mbs))
                self.opt.zero_grad(set_to_none=True)
                total = 0.0
                for b in mbs:
                    lp = self._logprobs(b)
                    if "old_logp" in b:
                        old = b["old_logp"]
                    else:  # fully on-policy: the first forward is the old policy
                        old = lp.detach()
                        measure(old, b)
                    loss, s = policy_loss(
                        lp,
                        old,
                        b["advantages"],
                        b["mask"],
                        cfg,
                        ref_logp=b.get("ref_logp"),
                        num_seqs=n_seqs,
                        num_tokens=n_tok,
                        seq_weights=b["seq_weights"],
                    )
                    if cfg.loss_type == "bnpo":
                        loss = loss * (float(b["mask"].sum()) / max(n_tok, 1.0))  # token-weighted over micro-batches
                    loss.backward()
                    total += float(loss.detach())
                    for k in agg:
                        agg[k] += s[k]
                    n_stats += 1
                    st.tokens += int(b["attention_mask"].sum())
                    st.trained_tokens += int(b["mask"].sum())
                if self.ptx:
                    norms["pg"] += _grad_norm(self.params)  # the policy-gradient term's share, before PPO-ptx
                    st.extra["ptx_nll"] = self._ptx_backward()
                # clipping returns the norm it measured before clipping
                norms["total"] += float(
                    torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
                    if self.grad_clip
                    else _grad_norm(self.params)
                )
                self.opt.step()
                self.sched.step()
                st.optimizer_steps += 1
                losses.append(total)
        self.opt.zero_grad(set_to_none=True)
        st.loss = sum(losses) / max(len(losses), 1)
        st.clip_low, st.clip_high, st.kl = (agg[k] / max(n_stats, 1) for k in ("clip_low", "clip_high", "kl"))
        st.mismatch = mismatch / max(n_mismatch, 1)
        st.extra["lr"] = float(self.sched.get_last_lr()[0])
        # mean gradient norms before clipping: when PPO-ptx is on, how much of the step each term drives
        st.extra["grad_norm"] = norms["total"] / max(st.optimizer_steps, 1)
        if self.ptx:
            st.extra["pg_grad_norm"] = norms["pg"] / max(st.optimizer_steps, 1)
        st.seconds = time.perf_counter() - t0
        return st


ACTIVATION_GIB = 4.0  # what one forward pass may keep for the backward when the budget is estimated


def auto_micro_tokens(model: Any, gib: float = ACTIVATION_GIB) -> int:
    """Padded tokens per forward pass that keep about ``gib`` of activations for the backward,
    estimated from the model's shape: layers x (16 x hidden + 10 x intermediate) values a token in
    the parameters' dtype. The constants are fitted to SmolLM2-135M in float32, which
    ``bench/training/grpo_memory.py`` measured at about 2.9 MB a token (peak 4.5 / 7.2 / 10.1 GiB at 1024 /
    2048 / 4096 tokens a pass); on the tiny models it allows far more tokens than a micro-batch holds."""
    c = model.config
    per_token = c.num_hidden_layers * (16 * c.hidden_size + 10 * getattr(c, "intermediate_size", 4 * c.hidden_size))
    return max(256, int(gib * 2**30 / (per_token * next(model.parameters()).element_size())))


class HostedLearner:
    """A :class:`Learner` built from files, with data in and out: what GRPO holds in the driver, or
    in a Ray actor where the GPUs are (``runner.params.train``, :mod:`evolve.cluster.training`),
    its model loaded there once and each :meth:`update` a call.

    ``base``: the base weights file (or a checkpoint's manifest); ``init``: the parent's adapter
    file or None; ``precision``: :mod:`evolve.policy.precision` (``auto`` keeps a tiny base in
    float32); ``learner``: :class:`Learner`'s keywords (``pad_id`` comes from the tokenizer)."""

    def __init__(
        self,
        base: str,
        init: str | None,
        *,
        device: str | None = None,
        dtype: str | None = None,
        gradient_checkpointing: bool = False,
        precision: str = "auto",
        **learner: Any,
    ) -> None:
        from evolve.policy.precision import resolve_precision
        from evolve.policy.weights import load_base, read_adapter

        model, tok, cfg = load_base(base, device=device, dtype=dtype, gradient_checkpointing=gradient_checkpointing)
        precision = resolve_precision(precision, next(model.parameters()).device, tiny=cfg is not None)
        self.learner = Learner(
            model,
            init=read_adapter(init) if init is not None else None,
            pad_id=tok.pad_id,
            precision=precision,
            **learner,
        )

    def max_len(self) -> int:
        return self.learner.max_len

    def update(self, seqs: Sequence[Packed]) -> UpdateStats:
        return self.learner.update(seqs)

    def replay(self, examples: Sequence[Any]) -> int:
        return self.learner.replay(examples)

    def adapter_bytes(self) -> bytes:
        """The current adapter as the bytes of its safetensors file."""
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "adapter.safetensors"
            self.learner.adapter().save(path)
            return path.read_bytes()

    def close(self) -> None:
        pass


def _grad_norm(params: Sequence[Any]) -> float:
    """The L2 norm of the gradients of ``params`` (those without one count 0)."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


__all__ = ["HostedLearner", "Learner", "Packed", "UpdateStats", "collate", "pack", "sequence_logprobs"]
