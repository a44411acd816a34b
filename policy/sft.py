"""Stage 1: SFT cold start of a freshly built tiny model on a small demo set (cached).

The model is built from a :class:`~evolve.policy.tiny.TinyConfig` (no download), trained on
the assistant turns of ``n_demos`` demo transcripts drawn from the training split, and the
checkpoint with the best agent accuracy on ``n_eval`` validation tasks is kept (the baseline
is trained as well as its demo set allows). With ``params.weights`` naming a pretrained checkpoint
(:mod:`evolve.policy.hf`), the same demos train a LoRA adapter on it instead
(:func:`cold_start_adapter`). The training itself (:func:`fit_tiny`, :func:`fit_lora_cold_start`)
is data in, bytes out: with the ray runner's ``runner.params.train`` it runs in a Ray task with
those resources, its validation rollouts included. The result is cached under
``$EVOLVE_CACHE_DIR/sft/<key>`` (default ``~/.cache/evolvekit``), keyed by everything that
affects it, so a second run with the same settings reuses it in a second.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import ConfigError
from evolve.registry import import_path
from evolve.rollout import run_agent, score
from evolve.types import ModelSpec, System, Trajectory, content_hash

if TYPE_CHECKING:
    from evolve.scoring.session import Session
    from evolve.task.config import ModelConfig

# part of every cache key: bump when training changes numerically, so a cache never holds weights
# that a fresh machine would not reproduce (sft-2: the LM head runs on target positions alone)
SFT_VERSION = "sft-2"
WALL_CLOCK = ("seconds",)  # SFT stats kept in info.json beside the weights, never in the weights file
NOT_IN_WEIGHTS = (*WALL_CLOCK, "trained_in")  # nor where it trained (the driver, or a Ray node)


# How a model is served, not what is trained: the cold start validates with the model being trained,
# in this process (torch), whatever engine samples the system afterwards. Left out of the cold start's
# cache key, so switching ``engine`` (or its batching) reuses the cached weights instead of training again.
SERVING_PARAMS = frozenset({"engine", "compute_type", "max_batch", "batch_wait_ms", "max_wait_ms"})


def trained_params(params: dict[str, Any]) -> dict[str, Any]:
    """The model params that shape a cold start: ``params`` without :data:`SERVING_PARAMS` and the
    ``weights`` path (the base is keyed by its content)."""
    return {k: v for k, v in params.items() if k not in SERVING_PARAMS and k != "weights"}


def cache_dir() -> Path:
    root = os.environ.get("EVOLVE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "evolvekit"


def rollout_many(
    llm: Any,
    system: System,
    tasks: Sequence[dict],
    agent: Callable,
    reward: Callable,
    *,
    role: str = "policy",
    temperature: float | None = None,
    samples: int = 1,
    seed: int = 0,
    workers: int = 64,
) -> list[Trajectory]:
    """Run ``agent`` on each task with an in-memory LLM (threads feed its batcher); scored."""
    provider = lambda _system, _role: llm  # noqa: E731
    jobs = [(t, s) for t in tasks for s in range(samples)]

    def one(job: tuple[dict, int]) -> Trajectory:
        task, s = job
        traj = run_agent(
            agent,
            system,
            task,
            provider,
            seed=seed + hash(task["id"]) % 100_000 * 10 + s,
            sample=s,
            temperature=temperature,
        )
        return score(reward, task, traj)

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(one, jobs))


def _call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def _demos(session: Session, role: str, mc: ModelConfig) -> tuple[list, list, list, dict, dict]:
    """(picked training tasks, their demo chats, validation tasks, tools, memory) of a cold start."""
    cs, task = mc.cold_start, session.task
    assert cs is not None
    train_tasks, val_tasks = session.splits["train"], session.splits["val"][: cs.n_eval]
    picked = random.Random(f"{task.seed}/demos").sample(train_tasks, min(cs.n_demos, len(train_tasks)))
    tools, memory = session.initial_tools(), session.initial_memory()
    return picked, _demo_chats(session, role, mc, picked, tools, memory), val_tasks, tools, memory


def _demo_chats(session: Session, role: str, mc: ModelConfig, tasks: list, tools: dict, memory: dict) -> list:
    """The cold start's demos function (``models.<role>.cold_start.demos``) applied to ``tasks``."""
    cs, task = mc.cold_start, session.task
    assert cs is not None
    demos_fn = import_path(cs.demos, what=f"models.{role}.cold_start.demos", search=session.base_dir)
    return _call(
        demos_fn,
        tasks,
        instruction=task.prompts.get("instruction", ""),
        seed=task.seed,
        template=task.prompts.get("template", ""),
        augment=cs.augment,
        **({"tools": tools} if tools else {}),
        **({"memory": memory} if memory else {}),
    )


@dataclass
class ValEval:
    """The cold start's checkpoint score: greedy agent accuracy on the validation tasks. Data (the
    agent and reward as import paths when it runs in a Ray task), so it goes where training goes."""

    agent: Any  # a callable, or an import path
    reward: Any
    search: str | None
    probe: System
    tasks: list[dict]
    name: str
    role: str
    max_tokens: int
    seed: int

    def __call__(self, model: Any, tok: Any, say: Callable[[str], None]) -> float:
        from evolve.policy.local import LocalLM

        search = Path(self.search) if self.search else None
        agent = import_path(self.agent, what="agent", search=search) if isinstance(self.agent, str) else self.agent
        reward = import_path(self.reward, what="reward", search=search) if isinstance(self.reward, str) else self.reward
        llm = LocalLM.from_model(model, tok, name=self.name, temperature=0.0, max_tokens=self.max_tokens)
        try:
            trajs = rollout_many(
                llm, self.probe, self.tasks, agent, reward, role=self.role, temperature=0.0, seed=self.seed
            )
        finally:
            llm.close()
        acc = sum(t.score for t in trajs) / len(trajs)
        say(f"cold start: val accuracy {acc:.3f}")
        return acc


def _reply(text: str) -> str:
    return " ".join(text.split()).lower()


@dataclass
class DemoEval:
    """The cold start's checkpoint score under ``pick_by: demos``: the share of held-out demo chats
    (the demos function's, made from the validation tasks) whose last reply the model writes,
    greedily, as the demo does (case and spacing aside). For a judge whose demos give each task a
    right and a wrong answer this is its balanced accuracy, where the team's score would say little
    about one role. When the demos' replies take few values (a verdict's yes and no), each value's
    hit rate is said too, so a judge that always says yes shows as one. Data, like :class:`ValEval`."""

    chats: list[list[dict]]
    name: str
    max_tokens: int

    def __call__(self, model: Any, tok: Any, say: Callable[[str], None]) -> float:
        from evolve.policy.local import LocalLM

        llm = LocalLM.from_model(model, tok, name=self.name, temperature=0.0, max_tokens=self.max_tokens)
        try:
            futures = [llm.submit(chat[:-1], temperature=0.0, logprobs=False) for chat in self.chats]
            said = [_reply(f.result().text) for f in futures]
        finally:
            llm.close()
        wanted = [_reply(chat[-1]["content"]) for chat in self.chats]
        hit = Counter(w for s, w in zip(said, wanted, strict=True) if s == w)
        acc = sum(hit.values()) / len(wanted)
        asked = Counter(wanted)
        each = ", ".join(f"{v}: {hit[v]}/{asked[v]}" for v in sorted(asked))
        say(f"cold start: held-out demo accuracy {acc:.3f}" + (f" ({each})" if len(asked) <= 4 else ""))
        return acc


def _val_eval(
    session: Session, role: str, mc: ModelConfig, val_tasks: list, tools: dict, memory: dict, remote: bool
) -> ValEval | DemoEval:
    from evolve.runners.base import as_import_path

    task = session.task
    cs = mc.cold_start
    if cs is not None and cs.pick_by == "demos":
        chats = [c for c in _demo_chats(session, role, mc, list(val_tasks), tools, memory) if _held_out(c)]
        if not chats:
            raise ConfigError(
                f"models.{role}.cold_start.pick_by is demos, but {cs.demos} made no chat ending in an assistant "
                "reply from the validation tasks; set pick_by: agent or give the validation tasks gold answers"
            )
        return DemoEval(chats=chats, name=mc.name, max_tokens=int(mc.params.get("max_tokens", 160)))
    params = {k: v for k, v in mc.params.items() if k != "weights"}
    # the model being trained serves every role of the workflow (rollout_many's provider), so a team
    # whose roles share this base is validated as the team; the probe names them all
    spec = ModelSpec(backend="local", name=mc.name, params=params)
    probe = System(
        workflow=dict(task.workflow),
        prompts=dict(task.prompts),
        tools=tools,
        memory=memory,
        models={**dict.fromkeys(task.models, spec), role: spec},
    )
    agent, reward = (
        (as_import_path(session.spec.agent, "agent"), as_import_path(session.spec.reward, "reward"))
        if remote
        else (session.agent, session.reward)
    )
    return ValEval(
        agent=agent,
        reward=reward,
        search=str(session.base_dir),
        probe=probe,
        tasks=list(val_tasks),
        name=mc.name,
        role=role,
        max_tokens=int(mc.params.get("max_tokens", 160)),
        seed=task.seed,
    )


def _held_out(chat: Any) -> bool:
    """A demo chat :class:`DemoEval` can score: messages before a last assistant reply."""
    return (
        isinstance(chat, list)
        and len(chat) >= 2
        and isinstance(chat[-1], dict)
        and chat[-1].get("role") == "assistant"
        and isinstance(chat[-1].get("content"), str)
    )


def _here() -> dict[str, Any]:
    """Where this process is: its pid, its torch thread count (CPU weights depend on it), and its
    Ray node's address inside a Ray worker."""
    import sys

    import torch

    out: dict[str, Any] = {"pid": os.getpid(), "threads": torch.get_num_threads()}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        with contextlib.suppress(Exception):
            out["ip"] = ray.util.get_node_ip_address()
    return out


class _Said(list):
    """The cold start's messages: shown at once through ``say`` here, kept to be shown by the
    driver when the training ran in a Ray task."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        super().__init__()
        self._say = say

    def __call__(self, text: str) -> None:
        self.append(text)
        if self._say is not None:
            self._say(text)


def fit_tiny(
    tiny: dict,
    tok: Any,
    examples: list,
    *,
    demos: int,
    seed: int,
    epochs: float,
    lr: float,
    batch_size: int,
    eval_every: int | None,
    val: ValEval | DemoEval,
    progress: Any = None,
    say: Callable[[str], None] | None = None,
) -> tuple[bytes, dict, list[str]]:
    """Build the tiny model and SFT it on ``examples``, keeping the best validation checkpoint:
    (the base weights file's bytes, the info, the messages). Pure: data in, bytes out, so it runs
    here or in a Ray task where the GPUs are (``runner.params.train``)."""
    import tempfile

    import torch

    from evolve.policy.tiny import TinyConfig, build_model, count_params
    from evolve.policy.train import train
    from evolve.policy.weights import save_base

    said = _Said(say)
    cfg = TinyConfig(**tiny)
    torch.manual_seed(seed)
    model = build_model(cfg, seed=seed, tokenizer=tok)
    said(
        f"cold start: tiny model with {count_params(model) / 1e6:.2f}M parameters, "
        f"SFT on {demos} demos ({len(examples)} assistant turns)"
    )
    stats = train(
        model,
        examples,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        eval_fn=lambda m: val(m, tok, said),
        eval_every=eval_every,
        pad_id=tok.pad_id,
        log=progress(len(examples), epochs, batch_size) if progress else None,
    )
    info = {
        "demos": demos,
        "examples": len(examples),
        "best_val": stats.get("best_score"),
        "best_step": stats.get("best_step"),
        "steps": stats.get("steps"),
        "seconds": stats.get("seconds"),
        "trained_in": _here(),
    }
    said(f"cold start: kept step {info['best_step']} (val {info['best_val']}), {info['seconds']:.0f}s")
    # the file's sha256 names the base, and so the systems built on it and the seeds of their rollouts:
    # the wall time (or where it trained) would give the same weights a new name, and new samples
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "base.safetensors"
        save_base(model, tok, cfg, path, info={k: v for k, v in info.items() if k not in NOT_IN_WEIGHTS})
        return path.read_bytes(), info, list(said)


def fit_lora_cold_start(
    checkpoint: str,
    demos: list,
    *,
    device: Any,
    dtype: Any,
    gradient_checkpointing: bool,
    seed: int,
    epochs: float,
    lr: float,
    batch_size: int,
    eval_every: int | None,
    val: ValEval | DemoEval,
    progress: Any = None,
    say: Callable[[str], None] | None = None,
    precision: str = "auto",
) -> tuple[bytes, list, dict, list[str]]:
    """LoRA SFT of the pretrained ``checkpoint`` on the demo chats: (the adapter file's bytes, the
    examples' token ids, the info, the messages). Pure, like :func:`fit_tiny`. ``precision``:
    :mod:`evolve.policy.precision` (the validation samples in float32 either way)."""
    import tempfile

    from evolve.policy.hf import load_pretrained
    from evolve.policy.train import examples_from_chat, train_lora
    from evolve.policy.weights import checkpoint_activations

    said = _Said(say)
    model, tok = load_pretrained(Path(checkpoint), device=device, dtype=dtype)
    if gradient_checkpointing:
        checkpoint_activations(model)
    examples = [ex for chat in demos for ex in examples_from_chat(tok, chat)]
    said(f"cold start: LoRA SFT of {Path(checkpoint).name} on {len(demos)} demos ({len(examples)} turns)")
    adapter = train_lora(
        model,
        examples,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        eval_fn=lambda m: val(m, tok, said),
        eval_every=eval_every,
        pad_id=tok.pad_id,
        log=progress(len(examples), epochs, batch_size) if progress else None,
        precision=precision,
    )
    st = adapter.stats
    info = {
        "demos": len(demos),
        "examples": len(examples),
        "best_val": st.get("best_score"),
        "best_step": st.get("best_step"),
        "steps": st.get("steps"),
        "seconds": st.get("seconds"),
        "trained_in": _here(),
        "precision": st.get("precision"),
    }
    said(f"cold start: kept step {info['best_step']} (val {info['best_val']}), {st.get('precision')}")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "adapter.safetensors"
        adapter.save(path)
        data = path.read_bytes()
    return data, [[list(e.prompt_ids), list(e.completion_ids)] for e in examples], info, list(said)


def _fit(session: Session, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn`` here (with the progress bar and live messages), or in a Ray task with the ray runner's
    ``runner.params.train`` resources (its messages shown when it is back)."""
    trainer = getattr(session.runner, "trainer", None)
    if trainer is None:
        return fn(
            *args, progress=lambda n, epochs, bs: _progress(session, n, epochs, bs), say=session.obs.message, **kwargs
        )
    session.obs.message(f"cold start: training in a Ray task ({_fmt_train(trainer)})")
    out = trainer(fn, *args, **kwargs)
    for text in out[-1]:
        session.obs.message(text)
    return out


def _progress(session: Session, n_examples: int, epochs: float, batch_size: int) -> Callable[[dict], None]:
    session.obs.phase("cold start SFT", int(epochs * max(1, -(-n_examples // batch_size))))
    last = [0]

    def log(row: dict) -> None:
        session.obs.advance(row["step"] - last[0])
        last[0] = row["step"]

    return log


def _fmt_train(trainer: Any) -> str:
    o = {**getattr(trainer, "options", {}), "threads": getattr(trainer, "threads", None)}
    return ", ".join(f"{k}={v}" for k, v in o.items() if v and k != "runtime_env") or "runner.params.train"


def cold_start_adapter(session: Session, role: str, mc: ModelConfig, checkpoint: Path, base_manifest: bytes) -> Path:
    """SFT of a pretrained checkpoint on the demos, as a LoRA adapter (the checkpoint is not
    written); cached like the tiny cold start, keyed by the checkpoint's manifest
    (:func:`evolve.policy.hf.manifest`). Returns the adapter file; ``sft_examples.json`` (the
    demos' token ids, for STaR's replay and GRPO's PPO-ptx) lies beside it. With the ray runner's
    ``runner.params.train`` the training runs in a Ray task with those resources (the checkpoint on
    storage that node sees)."""
    from evolve.policy.hf import resolve_device
    from evolve.policy.precision import resolve_precision

    cs = mc.cold_start
    assert cs is not None
    task = session.task
    _, demos, val_tasks, tools, memory = _demos(session, role, mc)
    params = trained_params(mc.params)
    # what precision: auto resolves to is part of what was trained (float32 keeps the keys made before it)
    precision = resolve_precision(mc.params.get("precision", "auto"), resolve_device(mc.params.get("device")))
    key = content_hash(
        {
            "v": SFT_VERSION + "/lora",
            "base": base_manifest.decode(),
            "seed": task.seed,
            "cs": cs.model_dump(mode="json", exclude_none=True),
            "demos": demos,
            "val": [t["id"] for t in val_tasks],
            "prompts": task.prompts,
            "workflow": task.workflow,
            "agent": task.agent,
            "params": params,
            **({"tools": tools} if tools else {}),
            **({"memory": memory} if memory else {}),
            **({"precision": precision} if precision != "fp32" else {}),
        }
    )
    out = cache_dir() / "sft" / key / "adapter.safetensors"
    if out.exists():
        session.obs.message(f"cold start: reusing cached SFT adapter {out}")
        return out
    remote = getattr(session.runner, "trainer", None) is not None
    data, examples, info, _ = _fit(
        session,
        fit_lora_cold_start,
        str(checkpoint),
        demos,
        device=mc.params.get("device"),
        dtype=mc.params.get("dtype"),
        gradient_checkpointing=bool(mc.params.get("gradient_checkpointing")),
        seed=task.seed,
        epochs=cs.epochs,
        lr=cs.lr,
        batch_size=cs.batch_size,
        eval_every=cs.eval_every,
        val=_val_eval(session, role, mc, val_tasks, tools, memory, remote),
        precision=str(mc.params.get("precision", "auto")),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "sft_examples.json").write_text(json.dumps(examples))
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    (out.parent / "info.json").write_text(json.dumps(info, indent=1))
    return out


def cold_start_weights(session: Session, role: str, mc: ModelConfig) -> Path:
    """Build + SFT the tiny model for ``role`` (or reuse the cached result); return the weights file.
    With the ray runner's ``runner.params.train`` the training (and its validation checkpoints) runs
    in a Ray task with those resources and the weights come back as bytes."""
    from evolve.policy.tiny import CharTokenizer, TinyConfig
    from evolve.policy.train import examples_from_chat
    from evolve.policy.weights import drop_base_info

    cs = mc.cold_start
    assert cs is not None
    task = session.task
    seed = task.seed
    tiny = TinyConfig(**cs.tiny)
    picked, demos, val_tasks, tools, memory = _demos(session, role, mc)
    if cs.tokenizer == "pointer":
        from evolve.policy.pointer import PointerTokenizer

        pointers: set[str] = set()
        if cs.pointer_words:
            words_fn = import_path(
                cs.pointer_words, what=f"models.{role}.cold_start.pointer_words", search=session.base_dir
            )
            pointers = set(words_fn(picked))
        # tool names are vocabulary: a pointer would hide which tool the model names
        tok = PointerTokenizer.fit(
            [" ".join(m["content"] for m in chat) for chat in demos],
            min_share=cs.keep_share,
            extra=tools,
            pointers=pointers,
        )
    else:
        tok = CharTokenizer()
    key = content_hash(
        {
            # exclude_none: an option left unset (pointer_words) keeps the keys, and the caches, made before it existed
            "v": SFT_VERSION,
            "tiny": tiny.model_dump(mode="json"),
            "cs": cs.model_dump(mode="json", exclude_none=True),
            "seed": seed,
            "demos": demos,
            "val": [t["id"] for t in val_tasks],
            "prompts": task.prompts,
            "workflow": task.workflow,
            "agent": task.agent,
            "params": trained_params(mc.params),
            "tokenizer": tok.to_dict(),
            **({"tools": tools} if tools else {}),
            **({"memory": memory} if memory else {}),
        }
    )
    out = cache_dir() / "sft" / key / "base.safetensors"
    if out.exists():
        session.obs.message(f"cold start: reusing cached SFT weights {out}")
        # caches written before 2026-12-01 kept the SFT's wall time in the file (see below)
        drop_base_info(out, WALL_CLOCK)
        return out

    examples = [ex for chat in demos for ex in examples_from_chat(tok, chat)]
    remote = getattr(session.runner, "trainer", None) is not None
    data, info, _ = _fit(
        session,
        fit_tiny,
        tiny.model_dump(mode="json"),
        tok,
        examples,
        demos=len(demos),
        seed=seed,
        epochs=cs.epochs,
        lr=cs.lr,
        batch_size=cs.batch_size,
        eval_every=cs.eval_every,
        val=_val_eval(session, role, mc, val_tasks, tools, memory, remote),
    )
    # the demo examples go next to the weights: STaR replays them so self-training does not forget
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "sft_examples.json").write_text(
        json.dumps([[list(e.prompt_ids), list(e.completion_ids)] for e in examples])
    )
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    (out.parent / "info.json").write_text(json.dumps(info, indent=1))
    return out


def trainable_spec(parent: System, role: str, log: Callable[[str], None], operator: str) -> ModelSpec | None:
    """The parent's model spec for ``role`` when a weight operator can train it (a local model
    with base weights); otherwise ``None``, after saying why through ``log``."""
    spec = parent.models.get(role)
    if spec is None or spec.backend != "local" or spec.base is None:
        log(f"{operator}: role {role!r} is not a local model with base weights; nothing to train")
        return None
    return spec


def cold_start_examples(spec: ModelSpec, artifacts: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The (prompt ids, completion ids) of the cold-start demos stored beside the base weights
    (``spec.params["sft_examples"]``); empty when the model was not cold-started here."""
    ref = spec.params.get("sft_examples")
    if not ref:
        return []
    return [(tuple(a), tuple(b)) for a, b in json.loads(artifacts.path(ref["sha256"]).read_text())]
