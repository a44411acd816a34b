"""Pretrained Hugging Face causal LMs as local bases (Qwen, Llama, Mistral, SmolLM, ...).

The tiny models of :mod:`evolve.policy.tiny` are what CI can train; users train real checkpoints.
A task file points a local model at a checkpoint directory (or a Hub id already in the local
Hugging Face cache) instead of a cold start::

    models:
      policy:
        backend: local
        name: qwen2.5-0.5b
        params: {weights: /models/Qwen2.5-0.5B-Instruct, device: auto, dtype: auto}

The archive does not copy the checkpoint: the base artifact is a small JSON manifest
(:func:`manifest`) naming the directory and the size and sha256 of each file in it, so the
system id changes when the weights do, and a moved or edited checkpoint is refused at load
(sizes are checked at every load; hashing a multi-GB checkpoint again would cost seconds). LoRA adapters are trained and stored
exactly as for the tiny models (:mod:`evolve.policy.weights`); the base is never written.

:class:`HFTokenizer` gives a ``transformers`` tokenizer the interface the rest of the toolkit uses
(``render_chat``, ``encode``, ``decode``, ``eos_id``, ...). Chats are rendered with the
checkpoint's own chat template; a turn's completion ids for SFT are cut from the template's
rendering of the whole chat (:meth:`HFTokenizer.assistant_ids`), so training sees the tokens the
model is asked to produce, end-of-turn marker included. Generation stops on any of the
checkpoint's end-of-turn ids (``generation_config.eos_token_id`` plus the tokenizer's EOS).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import ConfigError
from evolve.types import Message, canonical_json

if TYPE_CHECKING:  # pragma: no cover
    import torch

HF_FORMAT = "evolvekit.hf-base/1"
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json")
# what a Hub id fetches: config, safetensors weights, tokenizer and chat template; not the .bin,
# ONNX or GGUF copies many repositories also carry
HUB_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken")


class HFTokenizer:
    """A ``transformers`` tokenizer with a chat template, behind the toolkit's tokenizer interface."""

    def __init__(self, tokenizer: Any, *, eos_ids: Sequence[int] = (), source: str = "") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"{source or 'tokenizer'}: the tokenizer has no chat template; use an instruct/chat "
                "checkpoint, or set tokenizer.chat_template (a Jinja string) and save it with "
                "tokenizer.save_pretrained"
            )
        self.tok = tokenizer
        self.source = source
        ids = [int(i) for i in eos_ids if i is not None]
        if tokenizer.eos_token_id is not None and int(tokenizer.eos_token_id) not in ids:
            ids.append(int(tokenizer.eos_token_id))
        if not ids:
            raise ConfigError(
                f"{source or 'tokenizer'}: no end-of-sequence token (tokenizer.eos_token_id and "
                "generation_config.eos_token_id are both unset), so generation could not stop"
            )
        self.eos_ids: tuple[int, ...] = tuple(ids)
        self.eos_id = self.eos_ids[0]
        self.pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else self.eos_id
        self.bos_id = tokenizer.bos_token_id
        self._special = frozenset(int(i) for i in tokenizer.all_special_ids)

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    def __len__(self) -> int:
        return self.vocab_size

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special

    def encode(self, text: str, context: Sequence[Any] = ()) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int], context: Sequence[Any] = ()) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.decode((token_id,))

    def _text(self, messages: Sequence[Message | dict], add_generation_prompt: bool) -> str:
        conv = [
            {"role": m.role, "content": m.content}
            if isinstance(m, Message)
            else {"role": m["role"], "content": m["content"]}
            for m in messages
        ]
        try:
            return self.tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
        except Exception as e:  # a template that rejects a role or an order (e.g. no system role)
            roles = [c["role"] for c in conv]
            raise ConfigError(
                f"{self.source or 'tokenizer'}: its chat template cannot render roles {roles}: {type(e).__name__}: {e}"
            ) from e

    def render_chat(self, messages: Sequence[Message | dict], add_generation_prompt: bool = True) -> list[int]:
        """The chat template's rendering, tokenised (special-token strings in it become their ids)."""
        return list(self.tok(self._text(messages, add_generation_prompt), add_special_tokens=False)["input_ids"])

    def assistant_ids(self, context: Sequence[Message | dict], content: str) -> list[int]:
        """The ids of an assistant turn with ``content`` after ``context``, end-of-turn included:
        the template's rendering of the chat with the turn, past the rendering of the prompt, up to
        and including the first end-of-turn id. Where the template does not extend the prompt that
        way (some re-render earlier turns), the turn's own tokens plus ``eos_id``."""
        prompt = self.render_chat(context, add_generation_prompt=True)
        full = self.render_chat([*context, Message(role="assistant", content=content)], add_generation_prompt=False)
        if full[: len(prompt)] == prompt and len(full) > len(prompt):
            rest = full[len(prompt) :]
            end = next((i for i, t in enumerate(rest) if t in self.eos_ids), None)
            if end is not None:
                return rest[: end + 1]
        return self.encode(content) + [self.eos_id]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "hf", "source": self.source, "vocab_size": self.vocab_size, "eos_ids": list(self.eos_ids)}

    def __repr__(self) -> str:
        return f"HFTokenizer({self.source!r}, vocab={self.vocab_size}, eos={list(self.eos_ids)})"


# ----------------------------------------------------------------------------- where the checkpoint is


def resolve_checkpoint(name: str, base_dir: Path | None = None) -> Path | None:
    """A checkpoint directory for ``name``: a directory with a ``config.json`` (relative paths from
    ``base_dir``), or a Hub id (``org/name``) found in the local Hugging Face cache. None if
    ``name`` is neither (then it may be a tiny base file). A GGUF file (``pkg:DIST/PATH`` or a
    ``.gguf`` path) is converted once into the cache (:mod:`evolve.policy.gguf`) and its directory
    returned."""
    from evolve.policy.gguf import checkpoint, is_gguf

    if is_gguf(name):
        return checkpoint(name, base_dir)
    p = Path(name).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(
                f"{p}: a directory without config.json; give a Hugging Face checkpoint directory "
                "(config.json, *.safetensors and the tokenizer files, as save_pretrained writes)"
            )
        return p.resolve()
    if p.exists() or name.count("/") != 1 or name.startswith((".", "/", "~")) or name.endswith(_FILE_SUFFIXES):
        return None  # a file (a tiny base), or a path that is not there: the caller says so
    try:
        from huggingface_hub import snapshot_download

        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
        return Path(snapshot_download(name, local_files_only=offline, allow_patterns=list(HUB_FILES)))
    except Exception as e:  # noqa: BLE001 - not cached (offline), no such repo, no network
        raise ConfigError(
            f"{name!r}: not a directory here and not a Hugging Face model in the local cache "
            f"({type(e).__name__}: {e}); download it once (hf download {name}) "
            "or give the checkpoint's directory"
        ) from e


def _files(path: Path) -> list[Path]:
    return sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith("."))


def manifest(path: Path) -> bytes:
    """The base artifact of a checkpoint directory: its path and each file's size and sha256 (canonical JSON)."""
    from evolve.artifacts import file_sha256

    files = _files(path)
    if not any(f.name.endswith(_WEIGHT_SUFFIXES) for f in files):
        raise ConfigError(f"{path}: no weights (*.safetensors or *.bin) in the checkpoint directory")
    entries = {f.name: {"size": f.stat().st_size, "sha256": file_sha256(f)} for f in files}
    return canonical_json({"format": HF_FORMAT, "path": str(path), "files": entries}).encode()


def read_manifest(path: Path | str) -> dict[str, Any] | None:
    """The manifest in a base artifact file, or None when the file is a tiny base (safetensors)."""
    path = Path(path)
    if path.stat().st_size > (8 << 20):
        return None
    with open(path, "rb") as f:
        head = f.read(1)
        if head != b"{":
            return None
        try:
            data = json.loads(head + f.read())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
    return data if isinstance(data, dict) and data.get("format") == HF_FORMAT else None


def check_manifest(m: dict[str, Any]) -> Path:
    """The checkpoint directory of a manifest, after checking it still holds the same files."""
    root = Path(m["path"])
    if not root.is_dir():
        raise ConfigError(
            f"base checkpoint {root} is gone; the archived system was trained on it, so restore it "
            "there (or symlink it) to load the system"
        )
    for name, e in m["files"].items():
        f = root / name
        if not f.is_file() or f.stat().st_size != e["size"]:
            raise ConfigError(
                f"base checkpoint {root}: {name} is missing or changed since the run archived it; "
                "a system's adapter only fits the exact base it was trained on"
            )
    return root


# ----------------------------------------------------------------------------- loading


def resolve_device(device: str | None) -> str:
    """``auto`` (or None): cuda when available, else mps, else cpu; anything else as given."""
    import torch

    d = str(device or "auto")
    if d != "auto":
        if d.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(
                f"device {d!r}: torch sees no CUDA device here (torch {torch.__version__}); use device: auto or cpu"
            )
        return d
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"


def resolve_dtype(dtype: str | None, device: str, *, sampling: bool = False) -> torch.dtype:
    """``auto`` (or None): bfloat16 on a GPU that has it and, for a copy that only samples
    (``sampling``), on a CPU that does bfloat16 matmuls in hardware (AMX or AVX512-BF16,
    :func:`~evolve.policy.precision.cpu_has_bf16`); float32 elsewhere. A trainer's copy on a CPU
    loads in float32 and its ``precision`` decides how it computes. Or float32/bfloat16/float16."""
    import torch

    d = str(dtype or "auto")
    if d == "auto":
        if device.startswith("cuda") and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if sampling and device == "cpu":
            from evolve.policy.precision import cpu_has_bf16

            if cpu_has_bf16():
                return torch.bfloat16
        return torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if d not in table:
        raise ConfigError(f"dtype {d!r}: use auto, float32, bfloat16 or float16")
    return table[d]


def load_tokenizer(path: Path | str) -> HFTokenizer:
    """The tokenizer of a checkpoint directory, its end-of-turn ids from ``generation_config.json`` too."""
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(str(path))
    eos: list[int] = []
    try:
        gen = GenerationConfig.from_pretrained(str(path))
        e = gen.eos_token_id
        eos = [e] if isinstance(e, int) else list(e or [])
    except OSError:  # no generation_config.json
        pass
    return HFTokenizer(tok, eos_ids=eos, source=str(path))


def load_pretrained(
    path: Path | str, *, device: str | None = "auto", dtype: str | None = "auto", sampling: bool = False
) -> tuple[Any, HFTokenizer]:
    """``(model, tokenizer)`` from a checkpoint directory; the model in eval mode on ``device``
    (``sampling``: a copy that only samples, see :func:`resolve_dtype`)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load would break into the run's own progress display
    path = Path(path)
    dev = resolve_device(device)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype, dev, sampling=sampling))
    return model.to(dev).eval(), tok  # type: ignore[arg-type]  # transformers' wrapped .to() hides its device argument


__all__ = [
    "HF_FORMAT",
    "HFTokenizer",
    "check_manifest",
    "load_pretrained",
    "load_tokenizer",
    "manifest",
    "read_manifest",
    "resolve_checkpoint",
    "resolve_device",
    "resolve_dtype",
]
